// Shared helpers of parc's CPU kernels (see ../build.py for how they are compiled).
//
// Every kernel views its input as rows × cols with the last dimension contiguous,
// computes in fp32 (fp64 for double, so gradcheck sees exact arithmetic) and
// parallelizes over rows with at::parallel_for. Inner loops are plain loops over
// contiguous memory written so that gcc -O3 vectorizes them; reductions keep kLanes
// independent partial sums so no reassociation flag (-ffast-math) is needed.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace parc {

template <typename T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };
template <typename T> using acc_t = typename AccType<T>::type;

constexpr int64_t kLanes = 16;

// Note [grain of the thread pool]: at::parallel_for splits its range over the threads
// only where the range holds more than its grain, and each task gets at least a grain.
// Waking the pool costs a few microseconds on an idle machine and far more on a busy
// one (a task waits for a core), more than a small tensor's whole pass: at 128 × 128 a
// norm's forward and backward ran slower with grain 1 than eager PyTorch on one thread.
// So every task holds at least kGrainElements elements (128 KiB of fp32), and a
// tensor smaller than that runs on the calling thread alone.
constexpr int64_t kGrainElements = int64_t{1} << 15;

// Grain of a loop over items of `per_item` elements each.
inline int64_t grain_for(int64_t per_item) {
  return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(per_item, 1));
}

// Rows per parallel task (Note [grain of the thread pool]).
inline int64_t row_grain(int64_t cols) { return grain_for(cols); }

// Rows per block when per-column sums (a weight's gradient) are reduced over rows: at
// most kReduceBlocks blocks, each of at least kGrainElements elements (or all rows), so
// one block is one task's worth (the blocks run with grain 1) and a small tensor is
// one block, summed in one pass without a partial-sum buffer as large as itself. It
// depends on the shape only, never on the thread count, so the sums come out
// bit-identical however many threads run.
constexpr int64_t kReduceBlocks = 64;
inline int64_t rows_per_block(int64_t rows, int64_t cols) {
  return std::max<int64_t>({int64_t{1}, (rows + kReduceBlocks - 1) / kReduceBlocks, grain_for(cols)});
}

// Sum of f(j) for j in [0, n), with kLanes independent accumulators.
template <typename A, typename F>
inline A lane_sum(int64_t n, const F& f) {
  A lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma GCC unroll 16
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += f(j + l);
  }
  A tail = 0;
  for (; j < n; ++j) tail += f(j);
  A total = 0;
  for (int64_t l = 0; l < kLanes; ++l) total += lanes[l];
  return total + tail;
}

// Both sums of f(j) -> (a, b) for j in [0, n) in one sweep: f(j, a, b) sets a and b.
template <typename A, typename F>
inline void lane_sum2(int64_t n, const F& f, A& total_a, A& total_b) {
  A lanes_a[kLanes] = {}, lanes_b[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma GCC unroll 16
    for (int64_t l = 0; l < kLanes; ++l) {
      A a, b;
      f(j + l, a, b);
      lanes_a[l] += a;
      lanes_b[l] += b;
    }
  }
  A tail_a = 0, tail_b = 0;
  for (; j < n; ++j) {
    A a, b;
    f(j, a, b);
    tail_a += a;
    tail_b += b;
  }
  total_a = 0;
  total_b = 0;
  for (int64_t l = 0; l < kLanes; ++l) {
    total_a += lanes_a[l];
    total_b += lanes_b[l];
  }
  total_a += tail_a;
  total_b += tail_b;
}

// Max of f(j) for j in [0, n); -inf when n == 0.
template <typename A, typename F>
inline A lane_max(int64_t n, const F& f) {
  const A lowest = -std::numeric_limits<A>::infinity();
  A lanes[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) lanes[l] = lowest;
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
#pragma GCC unroll 16
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] = std::max(lanes[l], f(j + l));
  }
  A best = lowest;
  for (; j < n; ++j) best = std::max(best, f(j));
  for (int64_t l = 0; l < kLanes; ++l) best = std::max(best, lanes[l]);
  return best;
}

// Note [huge-page outputs]: a large output is fresh memory (glibc maps allocations
// above its mmap threshold anew each time), and the kernel's first write to each 4 KiB
// page faults into the kernel, which zeroes it. At 8192 × 4096 fp32 that is 32,768
// faults, costing more than the kernel's own pass over the data (measured: 100 ms of
// system time against 20–50 ms of user time). Asking for transparent huge pages on
// the buffer before anything touches it (madvise(MADV_HUGEPAGE), honoured when
// /sys/kernel/mm/transparent_hugepage/enabled is "madvise" or "always") makes that 64
// faults of 2 MiB. Only the 2 MiB-aligned interior is advised; a smaller buffer, or a
// kernel without THP, is left as it is (the hint is only a hint: any error is ignored).
constexpr int64_t kHugePage = int64_t{1} << 21;

inline void advise_huge(const at::Tensor& t) {
#ifdef MADV_HUGEPAGE
  const int64_t bytes = static_cast<int64_t>(t.nbytes());
  if (!t.device().is_cpu() || bytes < 2 * kHugePage) return;
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t first = (begin + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
  const uintptr_t last = (begin + bytes) & ~uintptr_t(kHugePage - 1);
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

// at::empty_like(x) for an output the kernel writes in full (Note [huge-page outputs]).
inline at::Tensor empty_output(const at::Tensor& x) {
  auto out = at::empty_like(x);
  advise_huge(out);
  return out;
}

// The tensor as (rows, cols), last dimension contiguous.
inline at::Tensor rows_view(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 1, "parc kernels: expected at least one dimension");
  auto c = x.contiguous();
  return c.view({-1, c.size(-1)});
}

}  // namespace parc

// fp32, fp64, bf16 and fp16 (the last two computed in fp32).
#define PARC_DISPATCH(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, TYPE, NAME, __VA_ARGS__)
