/* A libcuda.so.1 without a GPU, for tests/test_libcuda.py and benchmarks/driver_seam_cpu.py.
 *
 * Each function the runtime declares in hatch_autotune/runtime/libcuda.py is defined here against
 * the real cuda.h, so the C compiler checks every signature against the header's; each records
 * what it was given (as C received it, through the C ABI) in `fake` and answers from it. The
 * constants and struct layouts the runtime hardcodes are exported from the header in
 * `fake_constants`. cuGetProcAddress_v2 lets cuda-bindings find these functions too. */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_PARAMS 16
#define MAX_STACK 8
#define DEVICE_BASE 0x700000000000ULL /* device memory: [DEVICE_BASE, DEVICE_BASE + 2**40) is device 0's */

struct fake_state {
    int version, count, cc_major, cc_minor, optin, static_shared, fail_launch; /* set by the test */
    int param_count;                     /* how many 8-byte parameters a launch records */
    int inits, launches, launches_ex, pushes, pops, encodes, loads;
    CUcontext stack[MAX_STACK];
    int depth;
    /* the last launch, as C received it */
    CUfunction function;
    unsigned int grid[3], block[3], shared;
    CUstream stream;
    void *extra;
    uint64_t params[MAX_PARAMS];
    /* the last cuLaunchKernelEx's config */
    unsigned int attr_count, attr_id, cluster[3];
    /* the last module and function asked for */
    unsigned char image_head[16]; /* the last image loaded: a cubin's ELF e_ident */
    char function_name[64];
    int dynamic_shared;
    /* the last tensor map encoded */
    int tm_dtype, tm_interleave, tm_swizzle, tm_l2, tm_oob, tm_aligned;
    unsigned int tm_rank;
    uint64_t tm_address, tm_dims[5], tm_strides[4];
    unsigned int tm_box[5], tm_elements[5];
};
struct fake_state fake = {.version = 13000, .count = 1, .cc_major = 9, .cc_minor = 0, .optin = 232448, .param_count = 4};

struct fake_constant { const char *name; long long value; };
const struct fake_constant fake_constants[] = {
    {"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR},
    {"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR", CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR},
    {"CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN},
    {"CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL", CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL},
    {"CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES", CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES},
    {"CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES},
    {"CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION", CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION},
    {"CU_TENSOR_MAP_DATA_TYPE_UINT8", CU_TENSOR_MAP_DATA_TYPE_UINT8},
    {"CU_TENSOR_MAP_DATA_TYPE_UINT16", CU_TENSOR_MAP_DATA_TYPE_UINT16},
    {"CU_TENSOR_MAP_DATA_TYPE_UINT32", CU_TENSOR_MAP_DATA_TYPE_UINT32},
    {"CU_TENSOR_MAP_DATA_TYPE_INT32", CU_TENSOR_MAP_DATA_TYPE_INT32},
    {"CU_TENSOR_MAP_DATA_TYPE_UINT64", CU_TENSOR_MAP_DATA_TYPE_UINT64},
    {"CU_TENSOR_MAP_DATA_TYPE_INT64", CU_TENSOR_MAP_DATA_TYPE_INT64},
    {"CU_TENSOR_MAP_DATA_TYPE_FLOAT16", CU_TENSOR_MAP_DATA_TYPE_FLOAT16},
    {"CU_TENSOR_MAP_DATA_TYPE_FLOAT32", CU_TENSOR_MAP_DATA_TYPE_FLOAT32},
    {"CU_TENSOR_MAP_DATA_TYPE_FLOAT64", CU_TENSOR_MAP_DATA_TYPE_FLOAT64},
    {"CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", CU_TENSOR_MAP_DATA_TYPE_BFLOAT16},
    {"CU_TENSOR_MAP_INTERLEAVE_NONE", CU_TENSOR_MAP_INTERLEAVE_NONE},
    {"CU_TENSOR_MAP_SWIZZLE_NONE", CU_TENSOR_MAP_SWIZZLE_NONE},
    {"CU_TENSOR_MAP_SWIZZLE_32B", CU_TENSOR_MAP_SWIZZLE_32B},
    {"CU_TENSOR_MAP_SWIZZLE_64B", CU_TENSOR_MAP_SWIZZLE_64B},
    {"CU_TENSOR_MAP_SWIZZLE_128B", CU_TENSOR_MAP_SWIZZLE_128B},
    {"CU_TENSOR_MAP_L2_PROMOTION_NONE", CU_TENSOR_MAP_L2_PROMOTION_NONE},
    {"CU_TENSOR_MAP_L2_PROMOTION_L2_64B", CU_TENSOR_MAP_L2_PROMOTION_L2_64B},
    {"CU_TENSOR_MAP_L2_PROMOTION_L2_128B", CU_TENSOR_MAP_L2_PROMOTION_L2_128B},
    {"CU_TENSOR_MAP_L2_PROMOTION_L2_256B", CU_TENSOR_MAP_L2_PROMOTION_L2_256B},
    {"CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE", CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE},
    {"CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA", CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA},
    {"sizeof(CUlaunchConfig)", sizeof(CUlaunchConfig)},
    {"offsetof(CUlaunchConfig, sharedMemBytes)", offsetof(CUlaunchConfig, sharedMemBytes)},
    {"offsetof(CUlaunchConfig, hStream)", offsetof(CUlaunchConfig, hStream)},
    {"offsetof(CUlaunchConfig, attrs)", offsetof(CUlaunchConfig, attrs)},
    {"offsetof(CUlaunchConfig, numAttrs)", offsetof(CUlaunchConfig, numAttrs)},
    {"sizeof(CUlaunchAttribute)", sizeof(CUlaunchAttribute)},
    {"offsetof(CUlaunchAttribute, value)", offsetof(CUlaunchAttribute, value)},
    {"sizeof(CUtensorMap)", sizeof(CUtensorMap)},
    {NULL, 0},
};

static CUcontext current(void) { return fake.depth ? fake.stack[fake.depth - 1] : NULL; }

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **name) {
    switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_HANDLE: *name = "CUDA_ERROR_INVALID_HANDLE"; return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_IMAGE: *name = "CUDA_ERROR_INVALID_IMAGE"; return CUDA_SUCCESS;
    default: *name = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
}
CUresult CUDAAPI cuInit(unsigned int flags) { fake.inits++; return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS; }
CUresult CUDAAPI cuDriverGetVersion(int *version) { *version = fake.version; return CUDA_SUCCESS; }
CUresult CUDAAPI cuDeviceGetCount(int *count) { *count = fake.count; return CUDA_SUCCESS; }
CUresult CUDAAPI cuDeviceGetAttribute(int *value, CUdevice_attribute attrib, CUdevice device) {
    if (device < 0 || device >= fake.count) return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = fake.cc_major; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = fake.cc_minor; return CUDA_SUCCESS;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = fake.optin; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device) {
    if (device < 0 || device >= fake.count) return CUDA_ERROR_INVALID_DEVICE;
    *ctx = (CUcontext)(uintptr_t)(0xC000 + device);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxGetCurrent(CUcontext *ctx) { *ctx = current(); return CUDA_SUCCESS; }
CUresult CUDAAPI cuCtxGetDevice(CUdevice *device) {
    if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
    *device = (CUdevice)((uintptr_t)current() - 0xC000);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
    if (fake.depth == MAX_STACK) return CUDA_ERROR_INVALID_VALUE;
    fake.stack[fake.depth++] = ctx;
    fake.pushes++;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxPopCurrent(CUcontext *ctx) {
    if (!fake.depth) return CUDA_ERROR_INVALID_CONTEXT;
    *ctx = fake.stack[--fake.depth];
    fake.pops++;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    if (attribute != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) return CUDA_ERROR_INVALID_VALUE;
    if (ptr < DEVICE_BASE || ptr >= DEVICE_BASE + (1ULL << 40)) return CUDA_ERROR_INVALID_VALUE;
    *(int *)data = 0;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image) {
    if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
    const unsigned char *bytes = image;
    /* a CUDA 12 driver refuses the ELF ABI version 8 that NVRTC 13 writes (what the selection avoids) */
    if (fake.version < 13000 && memcmp(bytes, "\x7f" "ELF", 4) == 0 && bytes[8] >= 8) return CUDA_ERROR_INVALID_IMAGE;
    memcpy(fake.image_head, image, 16);
    fake.loads++;
    *module = (CUmodule)(uintptr_t)0x4D00;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name) {
    if ((uintptr_t)module != 0x4D00) return CUDA_ERROR_INVALID_HANDLE;
    strncpy(fake.function_name, name, sizeof fake.function_name - 1);
    *function = (CUfunction)(uintptr_t)0xF000;
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuFuncGetAttribute(int *value, CUfunction_attribute attrib, CUfunction function) {
    if ((uintptr_t)function != 0xF000) return CUDA_ERROR_INVALID_HANDLE;
    if (attrib == CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES) { *value = fake.static_shared; return CUDA_SUCCESS; }
    if (attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) { *value = fake.dynamic_shared; return CUDA_SUCCESS; }
    return CUDA_ERROR_INVALID_VALUE;
}
CUresult CUDAAPI cuFuncSetAttribute(CUfunction function, CUfunction_attribute attrib, int value) {
    if ((uintptr_t)function != 0xF000 || attrib != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_ERROR_INVALID_VALUE;
    fake.dynamic_shared = value;
    return CUDA_SUCCESS;
}

static CUresult record(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
                       unsigned int bz, unsigned int shared, CUstream stream, void **params, void **extra) {
    if (!current()) return CUDA_ERROR_INVALID_CONTEXT;
    if (fake.fail_launch) { CUresult err = (CUresult)fake.fail_launch; fake.fail_launch = 0; return err; }
    fake.function = f;
    fake.grid[0] = gx; fake.grid[1] = gy; fake.grid[2] = gz;
    fake.block[0] = bx; fake.block[1] = by; fake.block[2] = bz;
    fake.shared = shared;
    fake.stream = stream;
    fake.extra = extra;
    for (int i = 0; i < fake.param_count && i < MAX_PARAMS; i++) memcpy(&fake.params[i], params[i], 8);
    return CUDA_SUCCESS;
}
CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,
                                void **extra) {
    fake.launches++;
    return record(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}
CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) {
    fake.launches_ex++;
    fake.attr_count = config->numAttrs;
    if (config->numAttrs) {
        fake.attr_id = config->attrs[0].id;
        fake.cluster[0] = config->attrs[0].value.clusterDim.x;
        fake.cluster[1] = config->attrs[0].value.clusterDim.y;
        fake.cluster[2] = config->attrs[0].value.clusterDim.z;
    }
    return record(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX, config->blockDimY,
                  config->blockDimZ, config->sharedMemBytes, config->hStream, params, extra);
}
CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType dtype, cuuint32_t rank, void *address,
                                        const cuuint64_t *dims, const cuuint64_t *strides, const cuuint32_t *box,
                                        const cuuint32_t *elements, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                        CUtensorMapFloatOOBfill oob) {
    if (rank < 1 || rank > 5) return CUDA_ERROR_INVALID_VALUE;
    fake.encodes++;
    fake.tm_dtype = dtype; fake.tm_rank = rank; fake.tm_address = (uint64_t)(uintptr_t)address;
    fake.tm_interleave = interleave; fake.tm_swizzle = swizzle; fake.tm_l2 = l2; fake.tm_oob = oob;
    fake.tm_aligned = ((uintptr_t)map % 64) == 0;
    for (cuuint32_t i = 0; i < rank; i++) {
        fake.tm_dims[i] = dims[i]; fake.tm_box[i] = box[i]; fake.tm_elements[i] = elements[i];
        if (i + 1 < rank) fake.tm_strides[i] = strides[i];
    }
    memset(map, 0xAB, sizeof *map);
    memcpy(map, &fake.tm_address, 8); /* the map's first bytes: the address, so a test sees whose map it is */
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *status) {
    (void)version; (void)flags;
    *pfn = dlsym(RTLD_DEFAULT, symbol);
    if (status) *status = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
