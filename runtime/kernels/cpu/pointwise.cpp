// Elementwise ops: bias + GeLU (tanh approximation, as GPT-2), SwiGLU and rotary
// positions, forward and backward.
//
// GeLU uses 1 + tanh(u) = 2·sigmoid(2u), so y = x·sigmoid(2u) with one exp and no
// cancellation for large negative x. Backward recomputes from the saved input.
// Rotary takes the (T, D/2) cos/sin tables (built in Python exactly as model.py's
// rotary() builds them) and rotates each head vector's two halves; backward is
// the same rotation with sin negated.
#include "common.h"
#include "math.h"

namespace parc {
namespace {

constexpr double kBeta = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kKappa = 0.044715;

}  // namespace

at::Tensor bias_gelu_fwd(const at::Tensor& input, const at::Tensor& bias) {
  auto x = rows_view(input);
  const int64_t N = x.size(0), C = x.size(1);
  const bool has_bias = bias.defined() && bias.numel() > 0;
  TORCH_CHECK(!has_bias || bias.numel() == C, "bias_gelu: bias size");
  // No bias: a zero one, so the inner loop has no branch and vectorizes.
  auto b = has_bias ? bias.contiguous().to(input.scalar_type()) : at::zeros({C}, x.options());
  auto y = empty_output(x);
  PARC_DISPATCH(input.scalar_type(), "parc_bias_gelu_fwd", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t *X = x.data_ptr<scalar_t>(), *B = b.data_ptr<scalar_t>();
    scalar_t* Y = y.data_ptr<scalar_t>();
    at::parallel_for(0, N, row_grain(C), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* xr = X + i * C;
        scalar_t* yr = Y + i * C;
        for (int64_t j = 0; j < C; ++j) {
          const A v = A(xr[j]) + A(B[j]);
          const A u2 = A(2 * kBeta) * (v + A(kKappa) * v * v * v);
          yr[j] = scalar_t(v / (A(1) + exp_acc(-u2)));
        }
      }
    });
  });
  return y.view(input.sizes());
}

std::vector<at::Tensor> bias_gelu_bwd(const at::Tensor& grad, const at::Tensor& input,
                                      const at::Tensor& bias) {
  auto x = rows_view(input);
  auto dy = rows_view(grad.to(input.scalar_type()));
  const int64_t N = x.size(0), C = x.size(1);
  const bool has_bias = bias.defined() && bias.numel() > 0;
  auto b = has_bias ? bias.contiguous().to(input.scalar_type()) : at::zeros({C}, x.options());
  auto dx = empty_output(x);
  at::Tensor db;
  PARC_DISPATCH(input.scalar_type(), "parc_bias_gelu_bwd", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t *X = x.data_ptr<scalar_t>(), *DY = dy.data_ptr<scalar_t>(), *B = b.data_ptr<scalar_t>();
    scalar_t* DX = dx.data_ptr<scalar_t>();
    // Always sums dbias (discarded without a bias): no branch in the inner loop.
    auto row = [&](int64_t i, A* __restrict dbp) {
      const scalar_t *xr = X + i * C, *dyr = DY + i * C;
      scalar_t* __restrict dxr = DX + i * C;
      for (int64_t j = 0; j < C; ++j) {
        const A v = A(xr[j]) + A(B[j]);
        const A v2 = v * v;
        const A s = A(1) / (A(1) + exp_acc(-A(2 * kBeta) * (v + A(kKappa) * v2 * v)));
        const A d = s + A(2 * kBeta) * v * s * (A(1) - s) * (A(1) + A(3 * kKappa) * v2);
        const A g = A(dyr[j]) * d;
        dxr[j] = scalar_t(g);
        dbp[j] += g;
      }
    };
    const int64_t rpb = rows_per_block(N, C), blocks = (N + rpb - 1) / rpb;
    auto parts = at::zeros({blocks, C}, x.options().dtype(c10::CppTypeToScalarType<A>::value));
    A* P = parts.data_ptr<A>();
    at::parallel_for(0, blocks, 1, [&](int64_t bbegin, int64_t bend) {  // a block is a grain (rows_per_block)
      for (int64_t blk = bbegin; blk < bend; ++blk)
        for (int64_t i = blk * rpb; i < std::min(N, (blk + 1) * rpb); ++i) row(i, P + blk * C);
    });
    db = parts.sum(0).to(input.scalar_type());
  });
  if (!has_bias) return {dx.view(input.sizes())};
  return {dx.view(input.sizes()), db};
}

at::Tensor swiglu_fwd(const at::Tensor& gate_in, const at::Tensor& up_in) {
  TORCH_CHECK(gate_in.sizes() == up_in.sizes(), "swiglu: gate and up differ in shape");
  auto gate = rows_view(gate_in);
  auto up = rows_view(up_in.to(gate_in.scalar_type()));
  const int64_t N = gate.size(0), C = gate.size(1);
  auto y = empty_output(gate);
  PARC_DISPATCH(gate_in.scalar_type(), "parc_swiglu_fwd", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t *G = gate.data_ptr<scalar_t>(), *U = up.data_ptr<scalar_t>();
    scalar_t* Y = y.data_ptr<scalar_t>();
    const int64_t total = N * C;
    at::parallel_for(0, total, kGrainElements, [&](int64_t begin, int64_t end) {
      const scalar_t *g = G + begin, *u = U + begin;
      scalar_t* y = Y + begin;
      for (int64_t k = 0; k < end - begin; ++k) {
        const A v = A(g[k]);
        y[k] = scalar_t(v / (A(1) + exp_acc(-v)) * A(u[k]));
      }
    });
  });
  return y.view(gate_in.sizes());
}

std::vector<at::Tensor> swiglu_bwd(const at::Tensor& grad, const at::Tensor& gate_in,
                                   const at::Tensor& up_in) {
  auto gate = rows_view(gate_in);
  auto up = rows_view(up_in.to(gate_in.scalar_type()));
  auto dy = rows_view(grad.to(gate_in.scalar_type()));
  auto dgate = empty_output(gate), dup = empty_output(gate);
  PARC_DISPATCH(gate_in.scalar_type(), "parc_swiglu_bwd", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t *G = gate.data_ptr<scalar_t>(), *U = up.data_ptr<scalar_t>();
    const scalar_t* DY = dy.data_ptr<scalar_t>();
    scalar_t *DG = dgate.data_ptr<scalar_t>(), *DU = dup.data_ptr<scalar_t>();
    at::parallel_for(0, gate.numel(), kGrainElements, [&](int64_t begin, int64_t end) {
      const scalar_t *gp = G + begin, *up = U + begin, *dyp = DY + begin;
      scalar_t *dg = DG + begin, *du = DU + begin;
      for (int64_t k = 0; k < end - begin; ++k) {
        const A g = A(gp[k]), d = A(dyp[k]);
        const A s = A(1) / (A(1) + exp_acc(-g));
        dg[k] = scalar_t(d * A(up[k]) * s * (A(1) + g * (A(1) - s)));
        du[k] = scalar_t(d * g * s);
      }
    });
  });
  return {dgate.view(gate_in.sizes()), dup.view(gate_in.sizes())};
}

namespace {

// out[b, h, t] = rotate(x[b, h, t]) for (B, H, T, D) tensors with unit stride in D.
template <typename in_t, typename out_t>
void rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out,
            double sign) {
  using A = acc_t<out_t>;
  const int64_t H = x.size(1), T = x.size(2), D = x.size(3), half = D / 2;
  const in_t* X = x.data_ptr<in_t>();
  out_t* O = out.data_ptr<out_t>();
  const float *CS = cos.data_ptr<float>(), *SN = sin.data_ptr<float>();
  const auto xs = x.strides(), os = out.strides();
  // Rows in memory order: q and k arrive as (B, T, H, D) buffers viewed as (B, H, T, D),
  // so heads are adjacent in memory and positions H·D apart. Walking t innermost there
  // jumps H·D elements a row (a new page every row at H·D ≥ 1024), which defeats the
  // hardware prefetcher; heads innermost reads the buffer front to back.
  const bool heads_inner = xs[1] <= xs[2];
  at::parallel_for(0, x.size(0) * H * T, row_grain(D), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / (T * H);
      const int64_t h = heads_inner ? r % H : (r / T) % H, t = heads_inner ? (r / H) % T : r % T;
      const in_t* xr = X + b * xs[0] + h * xs[1] + t * xs[2];
      out_t* orow = O + b * os[0] + h * os[1] + t * os[2];
      const float *c = CS + t * half, *s = SN + t * half;
      for (int64_t j = 0; j < half; ++j) {
        const A x1 = A(xr[j]), x2 = A(xr[j + half]), cj = A(c[j]), sj = A(sign) * A(s[j]);
        orow[j] = out_t(x1 * cj + (-x2) * sj);
        orow[j + half] = out_t(x2 * cj + x1 * sj);
      }
    }
  });
}

}  // namespace

// out = rotary(x) (sign = 1) or its transpose (sign = -1); out is preallocated.
void rotary_apply(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin,
                  at::Tensor& out, double sign) {
  TORCH_CHECK(x_in.dim() == 4 && x_in.size(3) % 2 == 0, "rotary: expected (B, heads, T, D), D even");
  TORCH_CHECK(out.sizes() == x_in.sizes() && out.stride(3) == 1, "rotary: bad output");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous(),
              "rotary: tables must be contiguous fp32");
  auto x = x_in.stride(3) == 1 ? x_in : x_in.contiguous();
  advise_huge(out);  // fresh from torch.empty_like in ops.py, not yet touched
  const auto in = x.scalar_type(), o = out.scalar_type();
  if (in == o) {
    PARC_DISPATCH(in, "parc_rotary", [&] { rotate<scalar_t, scalar_t>(x, cos, sin, out, sign); });
  } else if (in == at::kBFloat16 && o == at::kFloat) {
    rotate<c10::BFloat16, float>(x, cos, sin, out, sign);
  } else if (in == at::kHalf && o == at::kFloat) {
    rotate<c10::Half, float>(x, cos, sin, out, sign);
  } else if (in == at::kFloat && o == at::kBFloat16) {
    rotate<float, c10::BFloat16>(x, cos, sin, out, sign);
  } else if (in == at::kFloat && o == at::kHalf) {
    rotate<float, c10::Half>(x, cos, sin, out, sign);
  } else {
    TORCH_CHECK(false, "rotary: unsupported dtypes ", in, " -> ", o);
  }
}

}  // namespace parc
