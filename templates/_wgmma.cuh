// _wgmma.cuh - Hopper's asynchronous pieces the sm_90a GEMM path uses, as inline PTX: mbarriers,
// TMA tile loads and the warpgroup MMA's fences and shared-memory descriptors. Pulled in by a
// Jinja include, like _mma.cuh; keep Jinja syntax out of this file (hence the space after each
// brace of the PTX operand lists). The wgmma.mma_async instruction itself has one register per
// accumulator (n/2 of them), so the template writes it out for its own n.
//
//   at_mbar_init(bar, count)          mbarrier.init: `count` arrivals complete a phase
//   at_mbar_arrive(bar)               one arrival
//   at_mbar_arrive_expect_tx(bar, b)  expect b more bytes of async copies, then one arrival: the
//                                     phase completes when the arrivals and the bytes are in
//   at_mbar_wait(bar, parity)         wait until the phase of that parity has completed (a fresh
//                                     barrier: parity 1 passes at once, parity 0 waits for phase 0)
//   at_tma_load_2d(dst, map, c0, c1, bar)
//                                     the box of `map` at element coordinates (c0 innermost, c1)
//                                     into shared dst with the map's swizzle; out-of-bounds
//                                     elements read as zero; the bytes complete_tx on bar
//   at_fence_barrier_init()           mbarrier inits visible to the async proxy (TMA)
//   at_wgmma_fence(), at_wgmma_commit(), at_wgmma_wait<N>()
//                                     wgmma.fence / commit_group / wait_group N (.sync.aligned:
//                                     the whole warpgroup executes them together)
//   at_smem_desc_k128(p)              the descriptor of a K-major operand tile of 16-bit
//                                     elements at shared p: rows of 64 elements (128 bytes),
//                                     swizzled 128B as a TMA load with SWIZZLE_128B lays them,
//                                     8-row groups 1024 bytes apart; p 1024-byte aligned but for
//                                     the k offset (32 bytes per k16 step) added to it
//
// sm_90a only (wgmma and the tensor-map copy need the arch-specific target). Under
// AT_HOST_EMULATION (the tests' host emulator, tests/host_cuda/emulator.h) the emulator runs them.
#ifndef AT_WGMMA_CUH
#define AT_WGMMA_CUH

#if !defined(AT_HOST_EMULATION) && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "_wgmma.cuh: wgmma and TMA need the sm_90a target"
#endif

// CUtensorMap: defined by the including template (NVRTC has no cuda.h).

__device__ __forceinline__ unsigned at_smem_addr(const void* p) {
#if defined(AT_HOST_EMULATION)
    return at_emu_shared_address(p);
#else
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
#endif
}

__device__ __forceinline__ void at_mbar_init(unsigned long long* bar, unsigned count) {
#if defined(AT_HOST_EMULATION)
    at_emu_mbarrier_init(bar, count);
#else
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(at_smem_addr(bar)), "r"(count) : "memory");
#endif
}

__device__ __forceinline__ void at_fence_barrier_init() {
#if defined(AT_HOST_EMULATION)
    at_emu_fence_proxy_async();
#else
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void at_mbar_arrive(unsigned long long* bar) {
#if defined(AT_HOST_EMULATION)
    at_emu_mbarrier_arrive(bar);
#else
    asm volatile("{ .reg .b64 state;\n mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(at_smem_addr(bar)) : "memory");
#endif
}

__device__ __forceinline__ void at_mbar_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
#if defined(AT_HOST_EMULATION)
    at_emu_mbarrier_arrive_expect_tx(bar, bytes);
#else
    asm volatile("{ .reg .b64 state;\n mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(at_smem_addr(bar)), "r"(bytes)
                 : "memory");
#endif
}

__device__ __forceinline__ void at_mbar_wait(unsigned long long* bar, unsigned parity) {
#if defined(AT_HOST_EMULATION)
    while (!at_emu_mbarrier_try_wait_parity(bar, parity)) {
    }
#else
    const unsigned addr = at_smem_addr(bar);
    unsigned done = 0;
    do {
        asm volatile("{ .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(addr), "r"(parity)
                     : "memory");
    } while (!done);
#endif
}

__device__ __forceinline__ void at_tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, unsigned long long* bar) {
#if defined(AT_HOST_EMULATION)
    at_emu_tma_load_2d(dst, map, c0, c1, bar);
#else
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, { %2, %3}], [%4];\n" ::"r"(
            at_smem_addr(dst)),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(at_smem_addr(bar))
        : "memory");
#endif
}

__device__ __forceinline__ void at_wgmma_fence() {
#if defined(AT_HOST_EMULATION)
    at_emu_wgmma_fence();
#else
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void at_wgmma_commit() {
#if defined(AT_HOST_EMULATION)
    at_emu_wgmma_commit_group();
#else
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void at_wgmma_wait() {
    static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0 to 7");
#if defined(AT_HOST_EMULATION)
    at_emu_wgmma_wait_group(N);
#else
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// Matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address >> 4 in bits 0-13,
// leading byte offset >> 4 in 16-29 (unused by swizzled K-major layouts: 1 by convention),
// stride byte offset >> 4 in 32-45 (1024: the next group of 8 rows), base offset 0 in 49-51
// (the tile is 1024-byte aligned), swizzle mode in 62-63 (1: 128B).
__device__ __forceinline__ unsigned long long at_smem_desc_k128(const void* p) {
    const unsigned long long addr = at_smem_addr(p);
    return ((addr & 0x3FFFFull) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

#endif  // AT_WGMMA_CUH
