// Helpers shared by the kernels of stencil-kit: plain CUDA, included with #include "common.cuh".
#pragma once
#include "detail/weights.cuh"

// Index i of an array of n elements, clamped to the ends or wrapped around.
__device__ inline long long halo_index(long long i, int n, bool periodic)
{
    if (periodic) {
        long long m = i % n;
        return m < 0 ? m + n : m;
    }
    return i < 0 ? 0 : (i >= n ? n - 1 : i);
}
