// EPL_HOST_DEVICE marks a function that CUDA kernels call too: `__host__ __device__` under
// nvcc, nothing for the C++ compiler.
#pragma once

#if defined(__CUDACC__)
#define EPL_HOST_DEVICE __host__ __device__
#else
#define EPL_HOST_DEVICE
#endif
