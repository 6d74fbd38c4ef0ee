// The CUDA qualifiers defined away for a host compiler, so that the plain headers under templates/
// (elementwise.cuh, reduce.cuh) compile with g++ in tests/test_ops.py and tests/test_reductions.py
// (-I templates). They include this file only outside nvcc (#ifndef __CUDACC__), so a rendered
// kernel unit, which Jinja inlines those headers into, needs no file of its own beside it.
#ifndef FT_HOST_COMPAT_CUH
#define FT_HOST_COMPAT_CUH

#ifndef __CUDACC__
#ifndef __host__
#define __host__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __forceinline__
#define __forceinline__ inline
#endif
#endif

#endif  // FT_HOST_COMPAT_CUH
