// _async_copy.cuh - global -> shared copies that overlap with compute (cp.async), for the
// templates' multi-stage pipelines. Pulled in by a Jinja include, like _dtypes.cuh; keep Jinja
// syntax out of this file.
//
//   at_cp_async(dst, src, CP, src_bytes)  copy CP bytes (4, 8 or 16) from global src to shared
//                                         dst; bytes past src_bytes (0..CP) are zero-filled and
//                                         src is not read when src_bytes == 0. Both pointers
//                                         aligned to CP.
//   at_cp_async_commit()                  closes the calling thread's group of copies.
//   at_cp_async_wait<N>()                 waits until at most the newest N groups of this
//                                         thread are in flight. A __syncthreads() after it makes
//                                         every thread's copies visible to the block.
//
// sm_80 and newer: cp.async (16-byte copies bypass L1: .cg). Older archs: a synchronous copy
// with the same meaning, so the templates compile everywhere. Under AT_HOST_EMULATION (the
// tests' host emulator) the emulator supplies the copies.
#ifndef AT_ASYNC_COPY_CUH
#define AT_ASYNC_COPY_CUH

template <int CP>
__device__ __forceinline__ void at_cp_async(void* dst, const void* src, int src_bytes) {
    static_assert(CP == 4 || CP == 8 || CP == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(AT_HOST_EMULATION)
    at_emu_cp_async(dst, src, CP, src_bytes);
#elif __CUDA_ARCH__ >= 800
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    if (CP == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(src_bytes));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(src), "n"(CP), "r"(src_bytes));
#else
    unsigned char* d = static_cast<unsigned char*>(dst);
    const unsigned char* g = static_cast<const unsigned char*>(src);
    for (int i = 0; i < CP; ++i)
        d[i] = i < src_bytes ? g[i] : 0;
#endif
}

__device__ __forceinline__ void at_cp_async_commit() {
#if defined(AT_HOST_EMULATION)
    at_emu_cp_async_commit();
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
__device__ __forceinline__ void at_cp_async_wait() {
#if defined(AT_HOST_EMULATION)
    at_emu_cp_async_wait(N);
#elif __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

#endif  // AT_ASYNC_COPY_CUH
