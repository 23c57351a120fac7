// Softmax cross-entropy over this rank's slice of the vocab: the local statistics in
// one read of the logits, and dlogits in one read.
//
// Columns are the slice [start, start + cols) of the padded vocab; those at or past
// vocab_size are padding and take no part. Statistics per row: the max logit, the
// sum of exp(logit - max) and the target's logit (0 where another rank owns the
// target). The caller combines them over ranks (see ops.py) into the row's
// logsumexp; backward is dlogits = (exp(logit - lse) - onehot(target)) · grad, with
// no softmax kept between the two.
#include "common.h"
#include "math.h"

namespace parc {

std::vector<at::Tensor> cross_entropy_stats(const at::Tensor& logits_in, const at::Tensor& targets_in,
                                            int64_t start, int64_t vocab_size) {
  auto logits = rows_view(logits_in);
  auto targets = targets_in.contiguous().view({-1}).to(at::kLong);
  const int64_t N = logits.size(0), V = logits.size(1);
  TORCH_CHECK(targets.numel() == N, "cross_entropy: targets do not match the logits' rows");
  const int64_t limit = std::min(V, std::max<int64_t>(0, vocab_size - start));
  auto stats_dtype = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto shape = logits_in.sizes().vec();
  shape.pop_back();
  auto opts = logits.options().dtype(stats_dtype);
  auto row_max = at::empty(shape, opts), sum_exp = at::empty(shape, opts), picked = at::empty(shape, opts);
  PARC_DISPATCH(logits.scalar_type(), "parc_cross_entropy_stats", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* L = logits.data_ptr<scalar_t>();
    const int64_t* TG = targets.data_ptr<int64_t>();
    A *M = row_max.data_ptr<A>(), *S = sum_exp.data_ptr<A>(), *P = picked.data_ptr<A>();
    at::parallel_for(0, N, row_grain(V), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* row = L + i * V;
        // The row (V/tp values) is read from memory once; the second sweep hits cache.
        const A m = lane_max<A>(limit, [&](int64_t j) { return A(row[j]); });
        M[i] = m;
        S[i] = limit == 0 ? A(0) : lane_sum<A>(limit, [&](int64_t j) { return exp_acc(A(row[j]) - m); });
        const int64_t local = TG[i] - start;
        P[i] = (local >= 0 && local < limit) ? A(row[local]) : A(0);
      }
    });
  });
  return {row_max, sum_exp, picked};
}

at::Tensor cross_entropy_grad(const at::Tensor& logits_in, const at::Tensor& targets_in,
                              const at::Tensor& lse_in, const at::Tensor& grad_in, int64_t start,
                              int64_t vocab_size) {
  auto logits = rows_view(logits_in);
  auto targets = targets_in.contiguous().view({-1}).to(at::kLong);
  const int64_t N = logits.size(0), V = logits.size(1);
  const int64_t limit = std::min(V, std::max<int64_t>(0, vocab_size - start));
  auto stats_dtype = logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto lse = lse_in.contiguous().view({-1}).to(stats_dtype);
  auto grad = grad_in.contiguous().view({-1}).to(stats_dtype);
  auto out = empty_output(logits);
  PARC_DISPATCH(logits.scalar_type(), "parc_cross_entropy_grad", [&] {
    using A = acc_t<scalar_t>;
    const scalar_t* L = logits.data_ptr<scalar_t>();
    const int64_t* TG = targets.data_ptr<int64_t>();
    const A *LSE = lse.data_ptr<A>(), *G = grad.data_ptr<A>();
    scalar_t* O = out.data_ptr<scalar_t>();
    at::parallel_for(0, N, row_grain(V), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* row = L + i * V;
        scalar_t* orow = O + i * V;
        const A shift = LSE[i], g = G[i];
        for (int64_t j = 0; j < limit; ++j) orow[j] = scalar_t(exp_acc(A(row[j]) - shift) * g);
        for (int64_t j = limit; j < V; ++j) orow[j] = scalar_t(0);
        const int64_t local = TG[i] - start;
        if (local >= 0 && local < limit) orow[local] = scalar_t((exp_acc(A(row[local]) - shift) - A(1)) * g);
      }
    });
  });
  return out.view(logits_in.sizes());
}

}  // namespace parc
