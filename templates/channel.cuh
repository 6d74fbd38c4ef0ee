// The norms over the channels of a position (fusetune/ops/channel.py's CHANNEL_MAPS): their accumulators and
// each value's map, as channel_softmax.cu.j2 folds and maps them. Plain C++ (no Jinja syntax): the kernel
// includes it where it computes one of them, and tests/test_channel_norms.py compiles it with g++ on the host.
#ifndef FT_CHANNEL_CUH
#define FT_CHANNEL_CUH

#include <math.h>

#ifndef __CUDACC__
#include "host_compat.cuh"  // on the host only: nvcc knows the qualifiers, and rendered units ship alone
#endif

// Both accumulators are double: a float32 sum of squares overflows at values near 2e19 (torch's float64
// reference does not), and the moments of values near the float range would too. Each position's accumulator
// is finished once (ft_*_end: the divisions and the square root, on the device a correctly rounded reciprocal
// and rsqrt, not the division's slow path, which spills), and each value's map is then a double subtraction
// and multiplication: exact to float32's rounding of the result.

__host__ __device__ __forceinline__ double ft_rcp(double x) {
#ifdef __CUDA_ARCH__
  return __drcp_rn(x);
#else
  return 1.0 / x;
#endif
}

__host__ __device__ __forceinline__ double ft_rsqrt(double x) {
#ifdef __CUDA_ARCH__
  return rsqrt(x);
#else
  return 1.0 / sqrt(x);
#endif
}

// F.normalize(p=2): x / max(||x||_2, eps). The finished accumulator is 1 / max(sqrt(sum of squares), eps); a
// NaN norm stays NaN (not clamped to eps: torch's clamp_min keeps NaN), so a row holding a NaN is NaN
// throughout, and an infinite norm gives 0 for a finite x and NaN for an infinite one (x / inf).
__host__ __device__ __forceinline__ double ft_l2_normalize_end(double sumsq, float eps) {
  const double norm = sqrt(sumsq);
  return ft_rcp(norm < (double)eps ? (double)eps : norm);
}

__host__ __device__ __forceinline__ float ft_l2_normalize_of(float x, double inverse_norm) {
  return (float)((double)x * inverse_norm);
}

// Welford's accumulator of a position's channels: count, mean and the sum of squared deviations (m2).
struct FtMoments {
  double n, mean, m2;
};

__host__ __device__ __forceinline__ FtMoments ft_moments_identity() { return FtMoments{0.0, 0.0, 0.0}; }

// One value. A NaN or an infinity turns the mean or m2 into NaN (inf - inf), and it stays so: the whole row
// is NaN then, as torch's layer_norm gives.
__host__ __device__ __forceinline__ FtMoments ft_moments_step(FtMoments acc, float x) {
  const double n = acc.n + 1.0;
  const double d = (double)x - acc.mean;
  const double mean = fma(d, ft_rcp(n), acc.mean);
  return FtMoments{n, mean, fma(d, (double)x - mean, acc.m2)};
}

// Two partial accumulators (Chan et al.): a side with no values (a lane past the channels) gives the other.
__host__ __device__ __forceinline__ FtMoments ft_moments_merge(FtMoments a, FtMoments b) {
  if (a.n == 0.0) return b;
  if (b.n == 0.0) return a;
  const double n = a.n + b.n;
  const double d = b.mean - a.mean;
  const double wb = b.n * ft_rcp(n);
  return FtMoments{n, fma(d, wb, a.mean), a.m2 + b.m2 + d * d * a.n * wb};
}

// Finished: m2 holds 1 / sqrt(var + eps), the variance biased (m2 / n), as F.layer_norm and ConvNeXt's
// by-hand form divide by it.
__host__ __device__ __forceinline__ FtMoments ft_moments_end(FtMoments acc, float eps) {
  return FtMoments{acc.n, acc.mean, ft_rsqrt(acc.m2 * ft_rcp(acc.n) + (double)eps)};
}

// (x - mean) / sqrt(var + eps) from the finished accumulator.
__host__ __device__ __forceinline__ float ft_layer_norm_of(float x, FtMoments acc) {
  return (float)(((double)x - acc.mean) * acc.m2);
}

#ifdef __CUDACC__
__device__ __forceinline__ FtMoments ft_moments_shfl_xor(FtMoments acc, int lane) {
  return FtMoments{__shfl_xor_sync(0xffffffffu, acc.n, lane), __shfl_xor_sync(0xffffffffu, acc.mean, lane),
                   __shfl_xor_sync(0xffffffffu, acc.m2, lane)};
}
#endif

#endif  // FT_CHANNEL_CUH
