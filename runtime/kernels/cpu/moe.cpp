// Mixture-of-experts ops (runtime/moe.py): the row permutation that sends each routed
// (token, slot) to its expert's run, the weighted combine back into tokens, and the
// grouped GEMM (each expert's run of rows times its weight), forward and backward.
//
// permute:  out[i] = x[index[i]]                 backward: dx[index[i]] += grad[i]
// combine:  out[index[i]] += weight[i] · y[i]     backward: dy[i] = weight[i] · grad[index[i]],
//                                                           dweight[i] = <grad[index[i]], y[i]>
// The scatters (permute's backward, combine's forward) add rows in index order, one
// column block per task, so every sum is formed in the same order however many threads
// run (deterministic, as index_add_ on one thread). Sums are in fp32 (fp64 for double).
// grouped_mm: rows [start_e, start_e + counts[e]) of x times weight[e]ᵀ, one at::mm_out
// per expert into slices of one output (backward: dx slice = dy·W_e, dW_e = dyᵀ·x slice).
#include "common.h"

namespace parc {
namespace {

constexpr int64_t kColumnBlock = 64;

// out (N, C) = sum over i of scale(i) · src[i] into row index[i]; out starts at zero.
template <typename scalar_t, typename Scale>
void scatter_rows(const scalar_t* src, const int64_t* index, int64_t rows, int64_t C, scalar_t* out,
                  int64_t N, const Scale& scale) {
  using A = acc_t<scalar_t>;
  at::parallel_for(0, (C + kColumnBlock - 1) / kColumnBlock, grain_for(rows * kColumnBlock), [&](int64_t begin, int64_t end) {
    std::vector<A> acc;
    for (int64_t block = begin; block < end; ++block) {
      const int64_t c0 = block * kColumnBlock, c1 = std::min(C, c0 + kColumnBlock), w = c1 - c0;
      acc.assign(N * w, A(0));
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t r = index[i];
        const A s = scale(i);
        const scalar_t* in = src + i * C + c0;
        A* a = acc.data() + r * w;
        for (int64_t j = 0; j < w; ++j) a[j] += s * A(in[j]);
      }
      for (int64_t r = 0; r < N; ++r)
        for (int64_t j = 0; j < w; ++j) out[r * C + c0 + j] = scalar_t(acc[r * w + j]);
    }
  });
}

void check_index(const at::Tensor& index, int64_t rows, int64_t bound, const char* what) {
  TORCH_CHECK(index.dim() == 1 && index.numel() == rows && index.scalar_type() == at::kLong,
              what, ": index must be int64 with one entry per row");
  if (rows) {
    TORCH_CHECK(index.min().item<int64_t>() >= 0 && index.max().item<int64_t>() < bound, what,
                ": index out of range");
  }
}

}  // namespace

at::Tensor permute_rows_fwd(const at::Tensor& input, const at::Tensor& index) {
  auto x = input.contiguous();
  auto idx = index.contiguous();
  const int64_t N = x.size(0), C = x.size(1), R = idx.numel();
  check_index(idx, R, N, "permute_rows");
  auto out = at::empty({R, C}, x.options());
  advise_huge(out);  // Note [huge-page outputs]
  PARC_DISPATCH(x.scalar_type(), "parc_permute_rows_fwd", [&] {
    const scalar_t* X = x.data_ptr<scalar_t>();
    scalar_t* Y = out.data_ptr<scalar_t>();
    const int64_t* I = idx.data_ptr<int64_t>();
    at::parallel_for(0, R, row_grain(C), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) std::copy(X + I[i] * C, X + (I[i] + 1) * C, Y + i * C);
    });
  });
  return out;
}

at::Tensor permute_rows_bwd(const at::Tensor& grad, const at::Tensor& index, int64_t rows) {
  auto g = grad.contiguous();
  auto idx = index.contiguous();
  const int64_t R = g.size(0), C = g.size(1);
  check_index(idx, R, rows, "permute_rows_bwd");
  auto dx = at::empty({rows, C}, g.options());
  advise_huge(dx);
  PARC_DISPATCH(g.scalar_type(), "parc_permute_rows_bwd", [&] {
    scatter_rows<scalar_t>(g.data_ptr<scalar_t>(), idx.data_ptr<int64_t>(), R, C, dx.data_ptr<scalar_t>(), rows,
                           [](int64_t) { return acc_t<scalar_t>(1); });
  });
  return dx;
}

at::Tensor combine_rows_fwd(const at::Tensor& rows_in, const at::Tensor& index, const at::Tensor& weight,
                            int64_t tokens) {
  auto y = rows_in.contiguous();
  auto idx = index.contiguous();
  auto w = weight.contiguous().to(y.scalar_type());
  const int64_t R = y.size(0), C = y.size(1);
  check_index(idx, R, tokens, "combine_rows");
  TORCH_CHECK(w.numel() == R, "combine_rows: one weight per row");
  auto out = at::empty({tokens, C}, y.options());
  advise_huge(out);
  PARC_DISPATCH(y.scalar_type(), "parc_combine_rows_fwd", [&] {
    const scalar_t* W = w.data_ptr<scalar_t>();
    scatter_rows<scalar_t>(y.data_ptr<scalar_t>(), idx.data_ptr<int64_t>(), R, C, out.data_ptr<scalar_t>(), tokens,
                           [W](int64_t i) { return acc_t<scalar_t>(W[i]); });
  });
  return out;
}

std::vector<at::Tensor> combine_rows_bwd(const at::Tensor& grad, const at::Tensor& rows_in, const at::Tensor& index,
                                         const at::Tensor& weight) {
  auto g = grad.contiguous().to(rows_in.scalar_type());
  auto y = rows_in.contiguous();
  auto idx = index.contiguous();
  auto w = weight.contiguous().to(y.scalar_type());
  const int64_t R = y.size(0), C = y.size(1);
  check_index(idx, R, g.size(0), "combine_rows_bwd");
  auto dy = empty_output(y);
  auto dw = at::empty({R}, y.options());
  PARC_DISPATCH(y.scalar_type(), "parc_combine_rows_bwd", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t *G = g.data_ptr<scalar_t>(), *Y = y.data_ptr<scalar_t>(), *W = w.data_ptr<scalar_t>();
    const int64_t* I = idx.data_ptr<int64_t>();
    scalar_t *DY = dy.data_ptr<scalar_t>(), *DW = dw.data_ptr<scalar_t>();
    at::parallel_for(0, R, row_grain(C), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* gr = G + I[i] * C;
        const scalar_t* yr = Y + i * C;
        const A s = A(W[i]);
        for (int64_t j = 0; j < C; ++j) DY[i * C + j] = scalar_t(s * A(gr[j]));
        DW[i] = scalar_t(lane_sum<A>(C, [&](int64_t j) { return A(gr[j]) * A(yr[j]); }));
      }
    });
  });
  return {dy, dw};
}

at::Tensor grouped_mm_fwd(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& counts) {
  auto x = input.contiguous();
  const int64_t E = weight.size(0), O = weight.size(1);
  TORCH_CHECK(weight.size(2) == x.size(1), "grouped_mm: weight (E, out, in) against rows (N, in)");
  auto n = counts.to(at::kCPU, at::kLong).contiguous();
  TORCH_CHECK(n.numel() == E && n.sum().item<int64_t>() == x.size(0), "grouped_mm: counts must cover the rows");
  auto out = at::empty({x.size(0), O}, x.options());
  const int64_t* N = n.data_ptr<int64_t>();
  for (int64_t e = 0, start = 0; e < E; start += N[e], ++e) {
    if (N[e] == 0) continue;
    auto slice = out.narrow(0, start, N[e]);
    at::mm_out(slice, x.narrow(0, start, N[e]), weight[e].t());
  }
  return out;
}

std::vector<at::Tensor> grouped_mm_bwd(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& weight,
                                       const at::Tensor& counts) {
  auto g = grad.contiguous().to(input.scalar_type());
  auto x = input.contiguous();
  const int64_t E = weight.size(0);
  auto n = counts.to(at::kCPU, at::kLong).contiguous();
  auto dx = at::empty_like(x);
  auto dw = at::zeros_like(weight, at::MemoryFormat::Contiguous);
  const int64_t* N = n.data_ptr<int64_t>();
  for (int64_t e = 0, start = 0; e < E; start += N[e], ++e) {
    if (N[e] == 0) continue;
    auto dy = g.narrow(0, start, N[e]);
    auto dx_slice = dx.narrow(0, start, N[e]);
    at::mm_out(dx_slice, dy, weight[e]);
    auto dw_e = dw[e];
    at::mm_out(dw_e, dy.t(), x.narrow(0, start, N[e]));
  }
  return {dx, dw};
}

}  // namespace parc
