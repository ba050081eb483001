// _cluster.cuh - thread-block clusters (sm_90 and newer) as inline PTX: a block's rank in its
// cluster, the cluster barrier and loads from another block's shared memory (distributed shared
// memory). Pulled in by a Jinja include, like _mma.cuh; keep Jinja syntax out of this file.
//
//   at_cluster_rank()              %cluster_ctarank: this block's rank in its cluster (x fastest)
//   at_cluster_size()              %cluster_nctarank: the blocks in the cluster
//   at_cluster_sync()              barrier.cluster.arrive.release + wait.acquire: every thread of
//                                  every block of the cluster; shared-memory writes before it are
//                                  visible to the cluster's loads after it
//   at_cluster_ld_f32x2(p, rank)   the two floats at the offset of shared p (this block's) in the
//                                  shared memory of block `rank` (mapa + ld.shared::cluster)
//
// A block must not exit while another still reads its shared memory: end with at_cluster_sync().
// Under AT_HOST_EMULATION (tests/host_cuda/emulator.h) the emulator runs a cluster's blocks
// together, each with its own dynamic shared memory (the only memory at_cluster_ld_f32x2 maps).
#ifndef AT_CLUSTER_CUH
#define AT_CLUSTER_CUH

#if !defined(AT_HOST_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "_cluster.cuh: thread-block clusters need sm_90 or newer"
#endif

__device__ __forceinline__ unsigned at_cluster_rank() {
#if defined(AT_HOST_EMULATION)
    return at_emu_cluster_ctarank();
#else
    unsigned rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return rank;
#endif
}

__device__ __forceinline__ unsigned at_cluster_size() {
#if defined(AT_HOST_EMULATION)
    return at_emu_cluster_nctarank();
#else
    unsigned size;
    asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(size));
    return size;
#endif
}

__device__ __forceinline__ void at_cluster_sync() {
#if defined(AT_HOST_EMULATION)
    at_emu_cluster_sync();
#else
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
#endif
}

__device__ __forceinline__ float2 at_cluster_ld_f32x2(const float* p, unsigned rank) {
#if defined(AT_HOST_EMULATION)
    return *static_cast<const float2*>(at_emu_cluster_map_shared(p, rank));
#else
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                 : "=r"(remote)
                 : "r"(static_cast<unsigned>(__cvta_generic_to_shared(p))), "r"(rank));
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 { %0, %1 }, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(remote) : "memory");
    return v;
#endif
}

#endif  // AT_CLUSTER_CUH
