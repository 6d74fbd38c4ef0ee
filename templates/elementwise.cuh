// Device helpers of the elementwise ops (fusetune/ops/elementwise.py, fusetune/ops/activations.py):
// each is PyTorch's float32 definition of the op, NaN in -> NaN out, without fast-math.
// Plain C++ (no Jinja syntax): common.cuh.j2 includes it into every kernel unit, and
// tests/test_ops.py compiles it with g++ on the host, where the CUDA qualifiers are defined away.
#ifndef FT_ELEMENTWISE_CUH
#define FT_ELEMENTWISE_CUH

#include <math.h>

#ifndef __CUDACC__
#include "host_compat.cuh"  // on the host only: nvcc knows the qualifiers, and rendered units ship alone
#endif

// torch.clamp, torch.max and max pooling propagate NaN; fmaxf/fminf would drop it. These keep a NaN
// from either side, in one instruction from sm_80 on.
__host__ __device__ __forceinline__ float ft_max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || a > b) ? a : b;
#endif
}
__host__ __device__ __forceinline__ float ft_min_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || a < b) ? a : b;
#endif
}

// F.hardtanh / F.relu6: a clamp that keeps NaN.
__host__ __device__ __forceinline__ float ft_hardtanh(float x, float lo, float hi) {
  return ft_min_nan(ft_max_nan(x, lo), hi);
}
__host__ __device__ __forceinline__ float ft_relu6(float x) { return ft_hardtanh(x, 0.0f, 6.0f); }

// F.leaky_relu: x where x > 0, else x * negative_slope (NaN fails the test and stays NaN).
__host__ __device__ __forceinline__ float ft_leaky_relu(float x, float negative_slope) {
  return x > 0.0f ? x : x * negative_slope;
}

// F.elu: x where x > 0, else alpha * (exp(x) - 1); expm1f keeps float32 accurate near 0.
__host__ __device__ __forceinline__ float ft_elu(float x, float alpha) {
  return x > 0.0f ? x : alpha * expm1f(x);
}

// F.selu: scale * elu(x, alpha) with PyTorch's constants; the negative side's factor is the float
// nearest alpha * scale = 1.0507009873554805 * 1.6732632423543772 (as torch's float kernel uses).
__host__ __device__ __forceinline__ float ft_selu(float x) {
  return x > 0.0f ? 1.0507009873554805f * x : 1.7580993408473766f * expm1f(x);
}

// F.celu: max(0, x) + min(0, alpha * (exp(x / alpha) - 1)), i.e. x where x > 0, else
// alpha * expm1(x / alpha) (for either sign of alpha, that term is <= 0 where x <= 0).
__host__ __device__ __forceinline__ float ft_celu(float x, float alpha) {
  return x > 0.0f ? x : alpha * expm1f(x / alpha);
}

// a / b without the IEEE float division's slow path, for the ops whose quotient is a loop's per-element work
// (sigmoid, silu, gelu's tanh form, mish). That slow path is a called subroutine: with a thread's unrolled values
// live across the calls, kernels spilled registers around it (channel_softmax at vec 2 and 4 with unroll 4;
// channel_reduce's var, std and logsumexp accumulators after silu, gelu tanh or mish; CUDA 13.0). On the device it
// is __fdividef (2 ulp), which gives a zero (a NaN for an infinite a) where 2^126 < |b|; on the host
// (tests/test_ops.py compiles these helpers with g++) the same zero there and a / b elsewhere, so the op tests see
// what the device gives past that edge. Not for a divisor that may pass 2^126 where the quotient is not tiny
// (softsign's x / (1 + |x|) tends to 1, which this would make 0).
__host__ __device__ __forceinline__ float ft_div_fast(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdividef(a, b);
#else
  return fabsf(b) > 0x1p126f ? a * copysignf(0.0f, b) : a / b;
#endif
}

// F.gelu(approximate='none'): 0.5 * x * (1 + erf(x / sqrt(2))), written 0.5 * x * erfc(-x / sqrt(2)),
// the same function without the cancellation of 1 + erf for negative x.
__host__ __device__ __forceinline__ float ft_gelu(float x) {
  return 0.5f * x * erfcf(-0.70710678118654752f * x);
}

// F.gelu(approximate='tanh'): 0.5 * x * (1 + tanh(u)), u = sqrt(2 / pi) * (x + 0.044715 * x^3),
// written x / (1 + exp(-2u)) (1 + tanh(u) = 2 / (1 + exp(-2u))): no cancellation for negative x. The
// denominator passes 2^126 below x = -10.0, where the value is above -1.2e-37: ft_div_fast's 0 there.
__host__ __device__ __forceinline__ float ft_gelu_tanh(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * (x * x * x));
  return ft_div_fast(x, 1.0f + expf(-2.0f * u));
}

// torch.sigmoid and F.silu (x * sigmoid(x)), as torch computes them: 1 / (1 + exp(-x)) and x / (1 + exp(-x)),
// through ft_div_fast. The denominator is at least 1; past 2^126 (x < -87.3, a sigmoid below 1.2e-38, a silu
// above -1.1e-36) the value is a zero (-0 for silu); at x = -inf silu is -inf / inf, NaN, as in torch.
__host__ __device__ __forceinline__ float ft_sigmoid(float x) { return ft_div_fast(1.0f, 1.0f + expf(-x)); }
__host__ __device__ __forceinline__ float ft_silu(float x) { return ft_div_fast(x, 1.0f + expf(-x)); }

// F.mish: x * tanh(softplus(x)). With e = exp(x), tanh(log(1 + e)) = n / (n + 2), n = e * (e + 2):
// one exponential, accurate on both sides. Past x = 20 the factor is 1 in float32 (and n would
// overflow later on), so x itself; NaN fails x <= 20 and returns x, NaN. n + 2 stays below 2.4e17, within
// ft_div_fast's range.
__host__ __device__ __forceinline__ float ft_mish(float x) {
  if (x <= 20.0f) {
    const float e = expf(x);
    const float n = e * (e + 2.0f);
    return x * ft_div_fast(n, n + 2.0f);
  }
  return x;
}

// F.softplus: x where beta * x > threshold, else log(1 + exp(beta * x)) / beta. The log term is
// written max(s, 0) + log1p(exp(-|s|)), s = beta * x: the same value without exp overflowing
// for a large threshold, accurate for s of either sign.
__host__ __device__ __forceinline__ float ft_softplus(float x, float beta, float threshold) {
  const float s = x * beta;
  if (s > threshold) return x;
  return (ft_max_nan(s, 0.0f) + log1pf(expf(-fabsf(s)))) / beta;
}

// F.hardsigmoid = relu6(x + 3) / 6 and F.hardswish = x * relu6(x + 3) / 6, the latter as x times the
// former: exactly x from x = 3 on, where torch's float32 order (x * 6) / 6 overflows past 5.6e37.
__host__ __device__ __forceinline__ float ft_hardsigmoid(float x) { return ft_relu6(x + 3.0f) / 6.0f; }
__host__ __device__ __forceinline__ float ft_hardswish(float x) { return x * ft_hardsigmoid(x); }

// F.logsigmoid as torch computes it: min(x, 0) - log1p(exp(-|x|)), no overflow on either side.
__host__ __device__ __forceinline__ float ft_logsigmoid(float x) {
  return ft_min_nan(x, 0.0f) - log1pf(expf(-fabsf(x)));
}

// F.softsign = x / (1 + |x|) and F.tanhshrink = x - tanh(x), written as torch writes them (softsign is
// NaN at +-inf there: inf / inf).
__host__ __device__ __forceinline__ float ft_softsign(float x) { return x / (1.0f + fabsf(x)); }
__host__ __device__ __forceinline__ float ft_tanhshrink(float x) { return x - tanhf(x); }

// torch.sign: (0 < x) - (x < 0), which maps NaN (and -0) to 0, as torch does.
__host__ __device__ __forceinline__ float ft_sign(float x) {
  return (float)((0.0f < x) - (x < 0.0f));
}

// torch.nan_to_num: NaN to nan, +inf to posinf, -inf to neginf (the op gives PyTorch's defaults: 0 and the
// dtype's largest and lowest finite values), every other value as it is.
__host__ __device__ __forceinline__ float ft_nan_to_num(float x, float nan, float posinf, float neginf) {
  return x != x ? nan : (x == INFINITY ? posinf : (x == -INFINITY ? neginf : x));
}

// F.hardshrink: 0 where -lambd <= x <= lambd, else x. F.softshrink: x -+ lambd outside [-lambd, lambd],
// else +0 (not x * 0: torch's kernels give +0 for a negative x there too), NaN kept. F.threshold: value
// where x <= threshold, else x. NaN fails every test.
__host__ __device__ __forceinline__ float ft_hardshrink(float x, float lambd) {
  return (x >= -lambd && x <= lambd) ? 0.0f : x;
}
__host__ __device__ __forceinline__ float ft_softshrink(float x, float lambd) {
  return x != x ? x : (x > lambd ? x - lambd : (x < -lambd ? x + lambd : 0.0f));
}
__host__ __device__ __forceinline__ float ft_threshold(float x, float threshold, float value) {
  return x <= threshold ? value : x;
}

// torch.pow(x, c) for the exponents torch itself computes without pow (its pow_tensor_scalar
// special cases): exact products and square roots instead of powf. Any other exponent goes to powf,
// which gives NaN for a negative base and a non-integer exponent, as torch does.
__host__ __device__ __forceinline__ float ft_pow2(float x) { return x * x; }
__host__ __device__ __forceinline__ float ft_pow3(float x) { return x * x * x; }
__host__ __device__ __forceinline__ float ft_pow4(float x) { const float s = x * x; return s * s; }
__host__ __device__ __forceinline__ float ft_pow_m1(float x) { return 1.0f / x; }
__host__ __device__ __forceinline__ float ft_pow_m2(float x) { return 1.0f / (x * x); }
__host__ __device__ __forceinline__ float ft_pow_half(float x) { return sqrtf(x); }
__host__ __device__ __forceinline__ float ft_pow_mhalf(float x) { return 1.0f / sqrtf(x); }

#endif  // FT_ELEMENTWISE_CUH
