// The row loops of LayerNorm and RMSNorm, shared by norms.cpp and add_norm.cpp (the
// residual add fused in front of the norm), so both normalize with the very same code
// and a fused trainer computes the same floats as an unfused one.
//
// The row loops are noinline functions of plain pointers: inlined into the
// parallel_for lambda (its captures behind a pointer), gcc vectorized them about
// half as well.
#pragma once

#include "common.h"

namespace parc {

inline at::Tensor norm_stats_like(const at::Tensor& x) {
  auto shape = x.sizes().vec();
  shape.pop_back();
  auto dtype = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return at::empty(shape, x.options().dtype(dtype));
}

// dst[c] = sum over blocks of parts[block][c], blocks in order.
template <typename scalar_t, typename A>
void sum_blocks(const A* parts, int64_t blocks, int64_t cols, scalar_t* dst) {
  at::parallel_for(0, cols, grain_for(blocks), [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      A total = 0;
      for (int64_t b = 0; b < blocks; ++b) total += parts[b * cols + c];
      dst[c] = static_cast<scalar_t>(total);
    }
  });
}

// Rows [begin, end) of the forward; B is null for RMSNorm.
template <typename scalar_t, bool RMS>
__attribute__((noinline)) void norm_rows(const scalar_t* X, const scalar_t* W, const scalar_t* B,
                                         scalar_t* Y, acc_t<scalar_t>* M, acc_t<scalar_t>* R,
                                         int64_t begin, int64_t end, int64_t C, double eps) {
  using A = acc_t<scalar_t>;
  for (int64_t i = begin; i < end; ++i) {
    const scalar_t* xr = X + i * C;
    scalar_t* __restrict yr = Y + i * C;
    const A m = RMS ? A(0) : lane_sum<A>(C, [&](int64_t j) { return A(xr[j]); }) / A(C);
    const A var = lane_sum<A>(C, [&](int64_t j) { A d = A(xr[j]) - m; return d * d; }) / A(C);
    const A rs = A(1) / std::sqrt(var + A(eps));
    if (RMS) {
      for (int64_t j = 0; j < C; ++j) yr[j] = scalar_t(A(xr[j]) * rs * A(W[j]));
    } else {
      for (int64_t j = 0; j < C; ++j) yr[j] = scalar_t((A(xr[j]) - m) * rs * A(W[j]) + A(B[j]));
      M[i] = m;
    }
    R[i] = rs;
  }
}

// Rows [begin, end) of the backward: dx, and dweight (dbias unless RMS) added into dwp (dbp).
template <typename scalar_t, bool RMS>
__attribute__((noinline)) void norm_grad_rows(
    const scalar_t* X, const scalar_t* DY, const scalar_t* W, const acc_t<scalar_t>* M,
    const acc_t<scalar_t>* R, scalar_t* DX, acc_t<scalar_t>* __restrict dwp,
    acc_t<scalar_t>* __restrict dbp, int64_t begin, int64_t end, int64_t C) {
  using A = acc_t<scalar_t>;
  for (int64_t i = begin; i < end; ++i) {
    const scalar_t *xr = X + i * C, *dyr = DY + i * C;
    scalar_t* __restrict dxr = DX + i * C;
    const A m = RMS ? A(0) : M[i], rs = R[i];
    const A mg = RMS ? A(0) : lane_sum<A>(C, [&](int64_t j) { return A(dyr[j]) * A(W[j]); }) / A(C);
    const A mgx = lane_sum<A>(C, [&](int64_t j) {
      return A(dyr[j]) * A(W[j]) * ((A(xr[j]) - m) * rs);
    }) / A(C);
    for (int64_t j = 0; j < C; ++j) {
      const A xhat = (A(xr[j]) - m) * rs, g = A(dyr[j]);
      dxr[j] = scalar_t(rs * (g * A(W[j]) - mg - xhat * mgx));
      dwp[j] += g * xhat;
      if (!RMS) dbp[j] += g;  // a constant condition: no branch in the loop
    }
  }
}

}  // namespace parc
