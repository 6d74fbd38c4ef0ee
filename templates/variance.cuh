// The var and std reductions' accumulator (fusetune/ops/reductions.py's rows for them): the count n, and the sums
// s1 and s2 of the values' deviations from a pivot k and of their squares, k being the first value taken (the
// statistics passes' sums around a pivot, templates/stats.cu.j2). The squared deviations from the mean are then
// m2 = s2 - s1^2 / n, which cancels only as far as the mean lies from the pivot, never as E[x^2] - E[x]^2 does
// where the mean is large against the spread. Taking a value is a subtraction and two adds: no division, which
// on the device is a called subroutine around which a loop over the channels spills its accumulators.
// The result is torch.var's: m2 / max(0, n - correction), NaN where any value is NaN or infinite (a deviation
// inf - inf, or s2 - s1^2 / n of infinities), +inf or NaN where n <= correction (m2 / 0); std is its square root.
// The count is an int, not a float: a float stops counting at 2^24 (2^24 + 1 rounds back to 2^24), and a row
// has at most fusetune/config.py's MAX_ELEMENTS (2^31 - 1) values, which an int holds.
// Plain C++ (no Jinja syntax): the kernels include it where they reduce by var or std, and
// tests/test_reductions.py compiles it with g++.
#ifndef FT_VARIANCE_CUH
#define FT_VARIANCE_CUH

#include <math.h>

#ifndef __CUDACC__
#include "host_compat.cuh"  // on the host only: nvcc knows the qualifiers, and rendered units ship alone
#endif

struct FtSpread {
  int n;
  float k, s1, s2;
};

__host__ __device__ __forceinline__ FtSpread ft_spread_identity() { return FtSpread{0, 0.f, 0.f, 0.f}; }

// One value: the first sets the pivot (its deviation 0); each adds its deviation and that squared.
__host__ __device__ __forceinline__ FtSpread ft_spread_step(FtSpread acc, float x) {
  const float k = acc.n == 0 ? x : acc.k;
  const float y = x - k;
  return FtSpread{acc.n + 1, k, acc.s1 + y, fmaf(y, y, acc.s2)};
}

// Two partial accumulators: b's sums moved to a's pivot (a deviation from b.k is one from a.k less d = b.k - a.k),
// an empty side the other one as it is.
__host__ __device__ __forceinline__ FtSpread ft_spread_merge(FtSpread a, FtSpread b) {
  if (a.n == 0) return b;
  if (b.n == 0) return a;
  const float d = b.k - a.k, bn = (float)b.n;
  return FtSpread{a.n + b.n, a.k, a.s1 + fmaf(bn, d, b.s1), a.s2 + b.s2 + d * fmaf(bn, d, 2.f * b.s1)};
}

// The sum of squared deviations from the mean: +inf where the squares pass float32's range but no value is
// infinite (s1 finite), as a float32 reduction gives it; rounding may leave it a little below 0 where every
// value is (nearly) the same, which is 0 (a NaN stays NaN: it fails the comparison). s1 * (s1 / n) is at most
// s2: it overflows only where s2 does.
__host__ __device__ __forceinline__ float ft_spread_m2(FtSpread acc) {
  if (isinf(acc.s2) && isfinite(acc.s1)) return INFINITY;
  const float m2 = acc.s2 - acc.s1 * (acc.s1 / (float)acc.n);
  return m2 < 0.f ? 0.f : m2;
}

__host__ __device__ __forceinline__ float ft_var_value(FtSpread acc, float correction) {
  return ft_spread_m2(acc) / fmaxf(0.f, (float)acc.n - correction);
}

__host__ __device__ __forceinline__ float ft_std_value(FtSpread acc, float correction) {
  return sqrtf(ft_var_value(acc, correction));
}

#ifdef __CUDACC__
__device__ __forceinline__ FtSpread ft_spread_shfl_xor(FtSpread acc, int lane) {
  return FtSpread{__shfl_xor_sync(0xffffffffu, acc.n, lane), __shfl_xor_sync(0xffffffffu, acc.k, lane),
                  __shfl_xor_sync(0xffffffffu, acc.s1, lane), __shfl_xor_sync(0xffffffffu, acc.s2, lane)};
}
#endif

#endif  // FT_VARIANCE_CUH
