// LayerNorm and RMSNorm over the last dimension, forward and backward.
//
// Forward saves per-row statistics (mean and 1/std, or 1/rms) in the accumulation
// type; backward recomputes x̂ from them and gives dx per row and dweight/dbias as
// column sums over fixed blocks of rows (see rows_per_block in common.h).
//
// The row loops live in noinline functions of plain pointers: inlined into the
// parallel_for lambda (its captures behind a pointer), gcc vectorized them about
// half as well.
#include "common.h"

namespace parc {
namespace {

at::Tensor stats_like(const at::Tensor& x) {
  auto shape = x.sizes().vec();
  shape.pop_back();
  auto dtype = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return at::empty(shape, x.options().dtype(dtype));
}

// dst[c] = sum over blocks of parts[block][c], blocks in order.
template <typename scalar_t, typename A>
void sum_blocks(const A* parts, int64_t blocks, int64_t cols, scalar_t* dst) {
  at::parallel_for(0, cols, 4096, [&](int64_t begin, int64_t end) {
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

template <bool RMS>
std::vector<at::Tensor> forward(const at::Tensor& input, const at::Tensor& weight,
                                const at::Tensor& bias, double eps) {
  auto x = rows_view(input);
  const int64_t N = x.size(0), C = x.size(1);
  TORCH_CHECK(weight.numel() == C && (RMS || bias.numel() == C), "parc norm: weight/bias size");
  auto w = weight.contiguous().to(input.scalar_type());
  auto b = RMS ? w : bias.contiguous().to(input.scalar_type());
  auto y = at::empty_like(x);
  auto mean = stats_like(input), rstd = stats_like(input);
  PARC_DISPATCH(input.scalar_type(), "parc_norm_fwd", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t *X = x.data_ptr<scalar_t>(), *W = w.data_ptr<scalar_t>(), *B = b.data_ptr<scalar_t>();
    scalar_t* Y = y.data_ptr<scalar_t>();
    A *M = mean.data_ptr<A>(), *R = rstd.data_ptr<A>();
    at::parallel_for(0, N, row_grain(C), [&](int64_t begin, int64_t end) {
      norm_rows<scalar_t, RMS>(X, W, B, Y, M, R, begin, end, C, eps);
    });
  });
  if (RMS) return {y.view(input.sizes()), rstd};
  return {y.view(input.sizes()), mean, rstd};
}

template <bool RMS>
std::vector<at::Tensor> backward(const at::Tensor& grad, const at::Tensor& input,
                                 const at::Tensor& weight, const at::Tensor& mean,
                                 const at::Tensor& rstd) {
  auto x = rows_view(input);
  auto dy = rows_view(grad.to(input.scalar_type()));
  const int64_t N = x.size(0), C = x.size(1);
  auto w = weight.contiguous().to(input.scalar_type());
  auto mean_c = mean.contiguous(), rstd_c = rstd.contiguous();
  auto dx = at::empty_like(x);
  const int64_t rpb = rows_per_block(N), blocks = (N + rpb - 1) / rpb;
  auto dw = at::empty({C}, weight.options().dtype(input.scalar_type()));
  auto db = at::empty({C}, weight.options().dtype(input.scalar_type()));
  PARC_DISPATCH(input.scalar_type(), "parc_norm_bwd", [&] {
    using A = acc_t<scalar_t>;
    auto parts = at::zeros({2, blocks, C}, x.options().dtype(c10::CppTypeToScalarType<A>::value));
    A* DWP = parts.data_ptr<A>();
    A* DBP = DWP + blocks * C;
    const scalar_t *X = x.data_ptr<scalar_t>(), *DY = dy.data_ptr<scalar_t>(), *W = w.data_ptr<scalar_t>();
    const A *M = mean_c.data_ptr<A>(), *R = rstd_c.data_ptr<A>();
    scalar_t* DX = dx.data_ptr<scalar_t>();
    at::parallel_for(0, blocks, 1, [&](int64_t bbegin, int64_t bend) {
      for (int64_t blk = bbegin; blk < bend; ++blk) {
        norm_grad_rows<scalar_t, RMS>(X, DY, W, M, R, DX, DWP + blk * C, DBP + blk * C, blk * rpb,
                                      std::min(N, (blk + 1) * rpb), C);
      }
    });
    sum_blocks(DWP, blocks, C, dw.data_ptr<scalar_t>());
    if (!RMS) sum_blocks(DBP, blocks, C, db.data_ptr<scalar_t>());
  });
  if (RMS) return {dx.view(input.sizes()), dw};
  return {dx.view(input.sizes()), dw, db};
}

}  // namespace

std::vector<at::Tensor> layer_norm_fwd(const at::Tensor& input, const at::Tensor& weight,
                                       const at::Tensor& bias, double eps) {
  return forward<false>(input, weight, bias, eps);
}

std::vector<at::Tensor> layer_norm_bwd(const at::Tensor& grad, const at::Tensor& input,
                                       const at::Tensor& weight, const at::Tensor& mean,
                                       const at::Tensor& rstd) {
  return backward<false>(grad, input, weight, mean, rstd);
}

std::vector<at::Tensor> rms_norm_fwd(const at::Tensor& input, const at::Tensor& weight, double eps) {
  return forward<true>(input, weight, at::Tensor(), eps);
}

std::vector<at::Tensor> rms_norm_bwd(const at::Tensor& grad, const at::Tensor& input,
                                     const at::Tensor& weight, const at::Tensor& rstd) {
  return backward<true>(grad, input, weight, rstd, rstd);
}

}  // namespace parc
