// The residual add fused in front of LayerNorm / RMSNorm: h = x + residual (the new
// residual stream) and y = norm(h), forward and backward.
//
// Forward, per row: one sweep adds x and residual into h, rounded to the dtype as an
// unfused add stores it, then norm_rows (norm_rows.h, the unfused kernel's own row
// loop) normalizes that row while it is still in cache. Each tensor crosses memory
// once: x and residual read, h and y written; nothing reads h back from memory.
//
// Backward takes the gradients of both outputs: d = dnorm(dy) + dh is the gradient of
// x and of residual alike (one tensor, returned for both). Per row, norm_grad_rows
// gives dnorm into dx, and dh is added by a second sweep over that row in cache: a
// rounding of its own, as autograd's sum of the two gradients is unfused. Written as
// one expression, gcc would contract it into an fma and differ in the last bit; with
// the sweep a fused trainer computes the same floats as an unfused one. dweight and
// dbias are summed over the same fixed blocks of rows as norms.cpp's.
#include "norm_rows.h"

namespace parc {
namespace {

template <typename scalar_t>
__attribute__((noinline)) void add_row(const scalar_t* __restrict x, const scalar_t* __restrict r,
                                       scalar_t* __restrict h, int64_t C) {
  using A = acc_t<scalar_t>;
  for (int64_t j = 0; j < C; ++j) h[j] = scalar_t(A(x[j]) + A(r[j]));
}

template <typename scalar_t>
__attribute__((noinline)) void add_into(scalar_t* __restrict d, const scalar_t* __restrict g, int64_t C) {
  using A = acc_t<scalar_t>;
  for (int64_t j = 0; j < C; ++j) d[j] = scalar_t(A(d[j]) + A(g[j]));
}

template <bool RMS>
std::vector<at::Tensor> forward(const at::Tensor& input, const at::Tensor& residual,
                                const at::Tensor& weight, const at::Tensor& bias, double eps) {
  TORCH_CHECK(input.sizes() == residual.sizes() && input.scalar_type() == residual.scalar_type(),
              "parc add_norm: x and residual must have one shape and dtype");
  auto x = rows_view(input), r = rows_view(residual);
  const int64_t N = x.size(0), C = x.size(1);
  TORCH_CHECK(weight.numel() == C && (RMS || bias.numel() == C), "parc add_norm: weight/bias size");
  auto w = weight.contiguous().to(input.scalar_type());
  auto b = RMS ? w : bias.contiguous().to(input.scalar_type());
  auto y = empty_output(x), h = empty_output(x);
  auto mean = norm_stats_like(input), rstd = norm_stats_like(input);
  PARC_DISPATCH(input.scalar_type(), "parc_add_norm_fwd", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t *X = x.data_ptr<scalar_t>(), *Rs = r.data_ptr<scalar_t>();
    const scalar_t *W = w.data_ptr<scalar_t>(), *B = b.data_ptr<scalar_t>();
    scalar_t *Y = y.data_ptr<scalar_t>(), *H = h.data_ptr<scalar_t>();
    A *M = mean.data_ptr<A>(), *R = rstd.data_ptr<A>();
    at::parallel_for(0, N, row_grain(C), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        add_row(X + i * C, Rs + i * C, H + i * C, C);
        norm_rows<scalar_t, RMS>(H, W, B, Y, M, R, i, i + 1, C, eps);
      }
    });
  });
  if (RMS) return {y.view(input.sizes()), h.view(input.sizes()), rstd};
  return {y.view(input.sizes()), h.view(input.sizes()), mean, rstd};
}

// grad_h empty: h had no gradient (nothing downstream read it).
template <bool RMS>
std::vector<at::Tensor> backward(const at::Tensor& grad_y, const at::Tensor& grad_h,
                                 const at::Tensor& h_in, const at::Tensor& weight,
                                 const at::Tensor& mean, const at::Tensor& rstd) {
  auto h = rows_view(h_in);
  auto dy = rows_view(grad_y.to(h_in.scalar_type()));
  const bool add_dh = grad_h.numel() > 0;
  auto dh = add_dh ? rows_view(grad_h.to(h_in.scalar_type())) : dy;
  const int64_t N = h.size(0), C = h.size(1);
  auto w = weight.contiguous().to(h_in.scalar_type());
  auto mean_c = mean.contiguous(), rstd_c = rstd.contiguous();
  auto dx = empty_output(h);
  const int64_t rpb = rows_per_block(N, C), blocks = (N + rpb - 1) / rpb;
  auto dw = at::empty({C}, weight.options().dtype(h_in.scalar_type()));
  auto db = at::empty({C}, weight.options().dtype(h_in.scalar_type()));
  PARC_DISPATCH(h_in.scalar_type(), "parc_add_norm_bwd", [&] {
    using A = acc_t<scalar_t>;
    auto parts = at::zeros({2, blocks, C}, h.options().dtype(c10::CppTypeToScalarType<A>::value));
    A* DWP = parts.data_ptr<A>();
    A* DBP = DWP + blocks * C;
    const scalar_t *H = h.data_ptr<scalar_t>(), *DY = dy.data_ptr<scalar_t>(), *W = w.data_ptr<scalar_t>();
    const scalar_t* DH = dh.data_ptr<scalar_t>();
    const A *M = mean_c.data_ptr<A>(), *R = rstd_c.data_ptr<A>();
    scalar_t* DX = dx.data_ptr<scalar_t>();
    at::parallel_for(0, blocks, 1, [&](int64_t bbegin, int64_t bend) {  // a block is a grain (rows_per_block)
      for (int64_t blk = bbegin; blk < bend; ++blk) {
        for (int64_t i = blk * rpb, stop = std::min(N, (blk + 1) * rpb); i < stop; ++i) {
          norm_grad_rows<scalar_t, RMS>(H, DY, W, M, R, DX, DWP + blk * C, DBP + blk * C, i, i + 1, C);
          if (add_dh) add_into(DX + i * C, DH + i * C, C);
        }
      }
    });
    sum_blocks(DWP, blocks, C, dw.data_ptr<scalar_t>());
    if (!RMS) sum_blocks(DBP, blocks, C, db.data_ptr<scalar_t>());
  });
  if (RMS) return {dx.view(h_in.sizes()), dw};
  return {dx.view(h_in.sizes()), dw, db};
}

}  // namespace

std::vector<at::Tensor> add_layer_norm_fwd(const at::Tensor& x, const at::Tensor& residual,
                                           const at::Tensor& weight, const at::Tensor& bias, double eps) {
  return forward<false>(x, residual, weight, bias, eps);
}

std::vector<at::Tensor> add_layer_norm_bwd(const at::Tensor& grad_y, const at::Tensor& grad_h,
                                           const at::Tensor& h, const at::Tensor& weight,
                                           const at::Tensor& mean, const at::Tensor& rstd) {
  return backward<false>(grad_y, grad_h, h, weight, mean, rstd);
}

std::vector<at::Tensor> add_rms_norm_fwd(const at::Tensor& x, const at::Tensor& residual,
                                         const at::Tensor& weight, double eps) {
  return forward<true>(x, residual, weight, at::Tensor(), eps);
}

std::vector<at::Tensor> add_rms_norm_bwd(const at::Tensor& grad_y, const at::Tensor& grad_h,
                                         const at::Tensor& h, const at::Tensor& weight,
                                         const at::Tensor& rstd) {
  return backward<true>(grad_y, grad_h, h, weight, rstd, rstd);
}

}  // namespace parc
