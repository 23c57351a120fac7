// exp for the inner loops of parc's CPU kernels.
//
// glibc's vector expf is only declared under -ffast-math, so a loop calling
// std::exp(float) stays scalar. exp_f32 is the Cephes range reduction + degree-6
// polynomial (about 1 ulp on the normal range) in plain arithmetic, which gcc -O3
// vectorizes. Doubles (gradcheck) use std::exp.
//
// Both are always inlined: a loop can be vectorized only if the call is inlined into
// it, and gcc's heuristics left exp_f32 a call in swiglu_fwd (its own function, one
// scalar call per element: 70 µs at 128 × 128 where eager silu · up takes 7 µs).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace parc {

__attribute__((always_inline)) inline float exp_f32(float x) {
  const float hi = 88.0f, lo = -87.3365447505531f;  // 2^n stays a normal float
  const float clamped = std::min(std::max(x, lo), hi);
  const float n = std::floor(clamped * 1.44269504088896341f + 0.5f);
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  const float y = p * scale;
  return x < lo ? 0.0f : (x > hi ? INFINITY : y);
}

__attribute__((always_inline)) inline float exp_acc(float x) { return exp_f32(x); }
__attribute__((always_inline)) inline double exp_acc(double x) { return std::exp(x); }

}  // namespace parc
