// LayerNorm and RMSNorm over the last dimension, forward and backward.
//
// Forward saves per-row statistics (mean and 1/std, or 1/rms) in the accumulation
// type; backward recomputes x̂ from them and gives dx per row and dweight/dbias as
// column sums over fixed blocks of rows (see rows_per_block in common.h).
//
// The row loops live in norm_rows.h (add_norm.cpp uses them too).
#include "norm_rows.h"

namespace parc {
namespace {

template <bool RMS>
std::vector<at::Tensor> forward(const at::Tensor& input, const at::Tensor& weight,
                                const at::Tensor& bias, double eps) {
  auto x = rows_view(input);
  const int64_t N = x.size(0), C = x.size(1);
  TORCH_CHECK(weight.numel() == C && (RMS || bias.numel() == C), "parc norm: weight/bias size");
  auto w = weight.contiguous().to(input.scalar_type());
  auto b = RMS ? w : bias.contiguous().to(input.scalar_type());
  auto y = empty_output(x);
  auto mean = norm_stats_like(input), rstd = norm_stats_like(input);
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
  auto dx = empty_output(x);
  const int64_t rpb = rows_per_block(N, C), blocks = (N + rpb - 1) / rpb;
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
    at::parallel_for(0, blocks, 1, [&](int64_t bbegin, int64_t bend) {  // a block is a grain (rows_per_block)
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
