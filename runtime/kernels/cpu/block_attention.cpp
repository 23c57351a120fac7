// Block attention with the rows' log-sum-exp (ring attention's step, ../../ring.py), and
// its backward, for grouped-query heads without repeating K and V.
//
// q (B, H, Tq, D) is viewed as (B, Hkv, g·Tq, D): the g = H / Hkv query heads that read
// one kv head are consecutive, so stacking them along the rows makes every kv head one
// batched matmul against its own K, V (Tk, D), and dK, dV come out summed over the
// group by the same matmuls. "causal" (Tq == Tk) masks key j > query i of each head.
// Everything is computed in fp32 (fp64 for double) and returned in it: the caller
// merges partial outputs over key blocks by their lse, exactly (ring.py's merge).
#include "common.h"

#include <limits>

namespace parc {
namespace {

at::ScalarType stats_type(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// (B, H, T, X...) -> (B, Hkv, g·T, X...) in the stats dtype, contiguous.
at::Tensor grouped(const at::Tensor& t, int64_t kv_heads, at::ScalarType dtype) {
  auto shape = t.sizes().vec();
  shape[1] = kv_heads;
  shape[2] = t.size(2) * (t.size(1) / kv_heads);
  return t.to(dtype).contiguous().view(shape);
}

// q kᵀ · scale of the grouped rows, -inf where the causal mask hides a key.
at::Tensor scores(const at::Tensor& qg, const at::Tensor& k, int64_t Tq, bool causal, double scale) {
  auto s = at::matmul(qg, k.to(qg.scalar_type()).transpose(-1, -2)).mul_(scale);
  if (causal) {
    auto opts = qg.options().dtype(at::kLong);
    auto query = at::arange(qg.size(2), opts).remainder(Tq).unsqueeze(1);
    auto key = at::arange(k.size(2), opts).unsqueeze(0);
    s.masked_fill_(key > query, -std::numeric_limits<double>::infinity());
  }
  return s;
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(), "block_attention: q (B, H, Tq, D), k and v (B, Hkv, Tk, D)");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3) && q.size(1) % k.size(1) == 0,
              "block_attention: q and k disagree on batch, head_dim or head groups");
  TORCH_CHECK(!causal || q.size(2) == k.size(2), "block_attention: causal needs as many queries as keys");
}

}  // namespace

std::vector<at::Tensor> block_attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            bool causal, double scale) {
  check(q, k, v, causal);
  const auto dtype = stats_type(q);
  auto qg = grouped(q, k.size(1), dtype);
  auto p = scores(qg, k, q.size(2), causal, scale);
  auto lse = at::logsumexp(p, -1);
  p.sub_(lse.unsqueeze(-1)).exp_();  // the probabilities, in place of the scores
  auto out = at::matmul(p, v.to(dtype));
  return {out.view(q.sizes()), lse.view({q.size(0), q.size(1), q.size(2)})};
}

std::vector<at::Tensor> block_attention_bwd(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& lse, const at::Tensor& delta,
                                            bool causal, double scale) {
  check(q, k, v, causal);
  const auto dtype = stats_type(q);
  const int64_t kv_heads = k.size(1);
  auto qg = grouped(q, kv_heads, dtype);
  auto gg = grouped(grad, kv_heads, dtype);
  auto p = scores(qg, k, q.size(2), causal, scale);
  p.sub_(grouped(lse, kv_heads, dtype).unsqueeze(-1)).exp_();         // P = exp(s - lse)
  auto dv = at::matmul(p.transpose(-1, -2), gg);                      // Pᵀ grad, summed over the group
  auto ds = at::matmul(gg, v.to(dtype).transpose(-1, -2));            // grad vᵀ
  ds.sub_(grouped(delta, kv_heads, dtype).unsqueeze(-1)).mul_(p);     // dS = P (grad vᵀ − delta)
  auto dq = at::matmul(ds, k.to(dtype)).mul_(scale);
  auto dk = at::matmul(ds.transpose(-1, -2), qg).mul_(scale);
  return {dq.view(q.sizes()), dk, dv};
}

}  // namespace parc
