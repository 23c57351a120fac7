// Block attention with the rows' log-sum-exp (ring attention's step, ../../ring.py), and
// its backward, for grouped-query heads.
//
// Both run ATen's fused CPU flash attention (tiled, online softmax: no score matrix in
// memory), which returns the rows' lse and whose backward takes the final output and lse
// of the rows: given the output and lse merged over every key block, it yields exactly
// this block's share of dq, dk, dv (P = exp(s - lse), delta = Σ grad · out). The g = H /
// Hkv query heads that read one kv head are consecutive: K and V are expanded to them
// (a view) and dK, dV summed back over each group. "causal" (Tq == Tk) masks key j > query
// i. Inputs are computed in fp32 (fp64 for double) and results returned in it, so the
// caller merges partial outputs over key blocks by their lse exactly (ring.py's merge).
#include "common.h"

namespace parc {
namespace {

at::ScalarType stats_type(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// (B, Hkv, T, D) -> (B, H, T, D): each kv head repeated for its group of query heads.
at::Tensor per_query_head(const at::Tensor& t, int64_t heads, at::ScalarType dtype) {
  const int64_t B = t.size(0), Hkv = t.size(1), T = t.size(2), D = t.size(3);
  return t.to(dtype).unsqueeze(2).expand({B, Hkv, heads / Hkv, T, D}).reshape({B, heads, T, D});
}

// (B, H, T, D) -> (B, Hkv, T, D): summed over each kv head's group of query heads.
at::Tensor per_kv_head(const at::Tensor& t, int64_t kv_heads) {
  const int64_t B = t.size(0), H = t.size(1), T = t.size(2), D = t.size(3);
  return t.view({B, kv_heads, H / kv_heads, T, D}).sum(2);
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.sizes() == k.sizes(),
              "block_attention: q (B, H, Tq, D), k and v (B, Hkv, Tk, D)");
  TORCH_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3) && q.size(1) % k.size(1) == 0,
              "block_attention: q and k disagree on batch, head_dim or head groups");
  TORCH_CHECK(!causal || q.size(2) == k.size(2), "block_attention: causal needs as many queries as keys");
}

}  // namespace

std::vector<at::Tensor> block_attention_fwd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            bool causal, double scale) {
  check(q, k, v, causal);
  const auto dtype = stats_type(q);
  const int64_t H = q.size(1);
  auto result = at::_scaled_dot_product_flash_attention_for_cpu(
      q.to(dtype), per_query_head(k, H, dtype), per_query_head(v, H, dtype), 0.0, causal, std::nullopt, scale);
  return {std::get<0>(result), std::get<1>(result).to(dtype)};
}

std::vector<at::Tensor> block_attention_bwd(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                            bool causal, double scale) {
  check(q, k, v, causal);
  const auto dtype = stats_type(q);
  const int64_t H = q.size(1), Hkv = k.size(1);
  auto result = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad.to(dtype), q.to(dtype), per_query_head(k, H, dtype), per_query_head(v, H, dtype), out.to(dtype),
      lse.to(dtype), 0.0, causal, std::nullopt, scale);
  return {std::get<0>(result), per_kv_head(std::get<1>(result), Hkv), per_kv_head(std::get<2>(result), Hkv)};
}

}  // namespace parc
