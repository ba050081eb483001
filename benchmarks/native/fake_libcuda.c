/* A libcuda.so.1 that does nothing, for benchmarks/driver_seam_cpu.py: the driver functions that
 * the runtime's call path uses, defined against the real cuda.h (so the compiler checks each
 * signature against the header's), each returning CUDA_SUCCESS at once, and cuGetProcAddress,
 * through which cuda-bindings finds them. What remains of a call through it is the cost of the
 * Python side of the seam: cuda-bindings' or ctypes'. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stddef.h>

CUresult CUDAAPI cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
CUresult CUDAAPI cuDriverGetVersion(int *version) { *version = 13000; return CUDA_SUCCESS; }
CUresult CUDAAPI cuDeviceGetCount(int *count) { *count = 1; return CUDA_SUCCESS; }
CUresult CUDAAPI cuCtxGetCurrent(CUcontext *ctx) { *ctx = (CUcontext)0xC000; return CUDA_SUCCESS; }
CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                unsigned int by, unsigned int bz, unsigned int shared, CUstream stream,
                                void **params, void **extra) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shared; (void)stream; (void)params; (void)extra;
    return CUDA_SUCCESS;
}

static void *find(const char *symbol) { return dlsym(RTLD_DEFAULT, symbol); }

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *status) {
    (void)version; (void)flags;
    *pfn = find(symbol);
    if (status) *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
