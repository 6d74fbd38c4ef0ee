// The logsumexp reduction's accumulator (fusetune/ops/reductions.py's row for it): a running max m and
// s = the sum over the values x taken of exp(x - m), where a value equal to m counts 1 (so that m = +inf
// or -inf never computes inf - inf). The result m + log(s) is then torch.logsumexp's: NaN where any
// value is NaN (s turns NaN and stays so), +inf where any is +inf (m = +inf, s >= 1), -inf where all
// are -inf (m = -inf). Plain C++ (no Jinja syntax): the kernels include it where they reduce by logsumexp
// (and channel_softmax always), and tests/test_reductions.py compiles it with g++ on the host.
#ifndef FT_REDUCE_CUH
#define FT_REDUCE_CUH

#include <math.h>

#ifndef __CUDACC__
#include "host_compat.cuh"  // on the host only: nvcc knows the qualifiers, and rendered units ship alone
#endif

struct FtLse {
  float m, s;
};

__host__ __device__ __forceinline__ FtLse ft_lse_identity() { return FtLse{-INFINITY, 0.f}; }

// One value: a new max rescales the sum (exp(-inf) = 0 where the old max was -inf or the new one +inf);
// NaN compares false both ways and turns s into NaN through exp(NaN).
__host__ __device__ __forceinline__ FtLse ft_lse_step(FtLse acc, float x) {
  if (x > acc.m) return FtLse{x, acc.s * expf(acc.m - x) + 1.f};
  return FtLse{acc.m, acc.s + (x == acc.m ? 1.f : expf(x - acc.m))};
}

// Two partial accumulators: m = max(m1, m2), s = s1 exp(m1 - m) + s2 exp(m2 - m), a side whose max is
// m's scaled by 1 (not exp(m - m), NaN for infinite m). A NaN s stays NaN (NaN * 0 is NaN).
__host__ __device__ __forceinline__ FtLse ft_lse_merge(FtLse a, FtLse b) {
  const float m = a.m > b.m ? a.m : b.m;
  const float sa = a.m == m ? a.s : a.s * expf(a.m - m);
  const float sb = b.m == m ? b.s : b.s * expf(b.m - m);
  return FtLse{m, sa + sb};
}

__host__ __device__ __forceinline__ float ft_lse_value(FtLse acc) { return acc.m + logf(acc.s); }

// softmax and log_softmax of a value x of a row, given the row's finished accumulator (channel_softmax.cu.j2):
// exp(x - m) / s and x - m - log(s). As torch gives them: NaN for every value of a row that holds a NaN (s
// is NaN), a +inf (torch's sum of exp(x - max) is NaN then), or only -inf (x - m is NaN). softmax's
// accumulator is finished by ft_softmax_end, which takes the reciprocal of s once a row: each value is then
// a product, not a float division, whose slow path is a called subroutine (with a thread's unrolled values
// live across those calls, channel_softmax spilled registers at vec 2 and 4 with unroll 4; CUDA 13.0).
__host__ __device__ __forceinline__ FtLse ft_softmax_end(FtLse acc) { return FtLse{acc.m, 1.f / acc.s}; }
__host__ __device__ __forceinline__ float ft_softmax_of(float x, FtLse acc) {
  return acc.m == INFINITY ? NAN : expf(x - acc.m) * acc.s;
}
__host__ __device__ __forceinline__ float ft_log_softmax_of(float x, FtLse acc) {
  return acc.m == INFINITY ? NAN : x - acc.m - logf(acc.s);
}

#ifdef __CUDACC__
__device__ __forceinline__ FtLse ft_lse_shfl_xor(FtLse acc, int lane) {
  return FtLse{__shfl_xor_sync(0xffffffffu, acc.m, lane), __shfl_xor_sync(0xffffffffu, acc.s, lane)};
}
#endif

#endif  // FT_REDUCE_CUH
