// emulator.h - runs CUDA kernel source on the CPU, for tests on machines without a GPU.
//
// Why: the kernels' results (and their barriers, shuffles and cp.async pipelines) must be
// checked in CI, which has no GPU. Each thread of a block is a real OS thread, so a missing
// __syncthreads or a stage read before its copy landed shows as a wrong result, a hang (caught
// by a watchdog) or an abort with a message, and the tests' AddressSanitizer build reports
// out-of-bounds accesses to global arrays and to static __shared__ arrays.
//
// Model: blocks run one at a time (so `__shared__` can be `static`), or a thread-block cluster's
// blocks together (each with its own dynamic shared memory; static `__shared__` variables would
// be shared by them, so cluster kernels keep theirs in the dynamic buffer); the block's threads
// run concurrently; warps are 32 consecutive linear thread ids. A thread that returns leaves its
// block's and warp's barriers, as an exited thread does on a GPU.
//
// Use: `#define AT_HOST_EMULATION 1`, include this file, then the kernel source. The runtime
// (launch, barriers, cp.async) is compiled where AT_EMU_IMPLEMENTATION is defined before the
// include: in exactly one translation unit (the harness builds it once, as its own object, so
// that a kernel's own compile stays small).
#ifndef AT_EMULATOR_H
#define AT_EMULATOR_H

#include <math.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#if defined(AT_EMU_IMPLEMENTATION)  // the runtime's headers, before the keyword macros below
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>
#endif

// ---- keywords ------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))  // GNU: may stand among decl-specifiers, as in CUDA
#define __shared__ static
#define __constant__ static
// __restrict__ is a g++ keyword already.

// ---- vector types and indices ---------------------------------------------------------------
struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) int2 {
    int x, y;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned int x, y;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
struct alignas(16) double2 {
    double x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline double2 make_double2(double x, double y) { return {x, y}; }

// Set by the launcher for each thread (blockIdx and the dims are the same for the whole block).
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

// ---- math and bit casts --------------------------------------------------------------------
inline float __int_as_float(int v) { return std::bit_cast<float>(v); }
inline float __uint_as_float(unsigned int v) { return std::bit_cast<float>(v); }
inline int __float_as_int(float v) { return std::bit_cast<int>(v); }
inline unsigned int __float_as_uint(float v) { return std::bit_cast<unsigned int>(v); }
inline double __longlong_as_double(long long v) { return std::bit_cast<double>(v); }
inline long long __double_as_longlong(double v) { return std::bit_cast<long long>(v); }
inline float __expf(float v) { return expf(v); }
inline float __logf(float v) { return logf(v); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float v) { return 1.0f / sqrtf(v); }
inline float __saturatef(float v) { return v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v; }
template <class T>
inline T __ldg(const T* p) {
    return *p;
}
// CUDA's min/max are overloaded for every arithmetic pair.
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
    return b < a ? b : a;
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
    return a < b ? b : a;
}

// ---- the runtime's interface ---------------------------------------------------------------
namespace at_emu {

enum class CopyMode { immediate, deferred };
extern CopyMode copy_mode;  // how cp.async copies land (see at_emu_cp_async)
extern thread_local unsigned char* dynamic_shared_ptr;  // the calling block's dynamic shared memory (extern __shared__)
extern size_t dynamic_shared_bytes;                     // its size (every block's)

// Print "at_emu error: ..." with the calling thread's coordinates and end the program (exit 86).
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

void syncthreads();

constexpr int OP_SYNCWARP = 1, OP_SHFL = 2, OP_VOTE = 3, OP_LDMATRIX = 4, OP_MMA = 5;
constexpr int GATHER = -2;       // warp_op's src: every lane's value
constexpr size_t SLOT_BYTES = 32;  // the most one lane publishes in one warp op

// One warp-wide step of the calling lane: publish `bytes` (<= SLOT_BYTES) of `value`, wait for
// every live lane of the warp, check that they all did the same op with the same mask naming them
// all, then copy lane `src`'s value into `out` (none when src == -1; an absent or exited src
// aborts; src == GATHER: every lane's, lane l's at out + l * bytes, zeros for lanes not live).
// `ballot` (if not null) gets the lanes whose published int is non-zero. Returns the live lanes.
unsigned warp_op(int op, unsigned mask, const void* value, size_t bytes, int src, void* out, unsigned* ballot, const char* what);

// Run fn(arg) on every thread of every block of the grid; blocks one at a time, in order, or the
// blocks of one thread-block cluster (`cluster` blocks per dimension, the grid a multiple of it)
// at a time, together. A block (cluster) that does not finish within block_timeout_s (a barrier
// not every live thread reaches) ends the program with a message (exit 87).
void launch_raw(void (*fn)(void*), void* arg, dim3 grid, dim3 block, size_t shared_bytes, double block_timeout_s, dim3 cluster);

template <class F>
void launch(F&& kernel, dim3 grid, dim3 block, size_t shared_bytes = 0, double block_timeout_s = 60.0, dim3 cluster = dim3(1, 1, 1)) {
    using K = std::remove_reference_t<F>;
    launch_raw([](void* k) { (*static_cast<K*>(k))(); }, const_cast<void*>(static_cast<const void*>(&kernel)), grid, block,
               shared_bytes, block_timeout_s, cluster);
}

inline int lane_id() { return (int)((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32u); }

template <class T>
inline T shuffle(unsigned mask, T v, int src, const char* what) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 16, "shuffles move trivially copyable values of up to 16 bytes");
    T out = v;
    warp_op(OP_SHFL, mask, &v, sizeof(T), src, &out, nullptr, what);
    return out;
}

}  // namespace at_emu

// ---- barriers, shuffles, votes -------------------------------------------------------------
inline void __syncthreads() { at_emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    at_emu::warp_op(at_emu::OP_SYNCWARP, mask, nullptr, 0, -1, nullptr, nullptr, "__syncwarp");
}

template <class T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
    const int lane = at_emu::lane_id();
    return at_emu::shuffle(mask, v, (lane / width) * width + (src_lane % width + width) % width, "__shfl_sync");
}

// CUDA: a source lane in a later width-segment (or past it, for up/down) is not read; the
// caller keeps its own value.
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    const int lane = at_emu::lane_id(), src = lane ^ lane_mask;
    return at_emu::shuffle(mask, v, src >= (lane / width + 1) * width ? -1 : src, "__shfl_xor_sync");
}

template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = at_emu::lane_id(), src = lane + (int)delta;
    return at_emu::shuffle(mask, v, src >= (lane / width + 1) * width ? -1 : src, "__shfl_down_sync");
}

template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = at_emu::lane_id(), src = lane - (int)delta;
    return at_emu::shuffle(mask, v, src < (lane / width) * width ? -1 : src, "__shfl_up_sync");
}

inline unsigned __ballot_sync(unsigned mask, int pred) {
    const int b = pred != 0;
    unsigned ballot = 0;
    at_emu::warp_op(at_emu::OP_VOTE, mask, &b, sizeof b, -1, nullptr, &ballot, "__ballot_sync");
    return ballot & mask;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) {
    const int b = pred != 0;
    unsigned ballot = 0;
    const unsigned live = at_emu::warp_op(at_emu::OP_VOTE, mask, &b, sizeof b, -1, nullptr, &ballot, "__all_sync");
    return (ballot & mask) == (live & mask);
}

// ---- atomics -------------------------------------------------------------------------------
template <class T>
inline T atomicAdd(T* p, T v) {
    static_assert(std::is_arithmetic_v<T>, "atomicAdd on an arithmetic type");
    if constexpr (std::is_integral_v<T>) {
        return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
    } else {
        T old, want;
        __atomic_load(p, &old, __ATOMIC_SEQ_CST);
        do {
            want = old + v;
        } while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
        return old;
    }
}
template <class T>
inline T atomicMax(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
template <class T>
inline T atomicMin(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
template <class T>
inline T atomicExch(T* p, T v) {
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
template <class T>
inline T atomicCAS(T* p, T expected, T desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

inline size_t __cvta_generic_to_shared(const void* p) { return reinterpret_cast<size_t>(p); }

// ---- cp.async ------------------------------------------------------------------------------
// Copy src_bytes from src to dst and zero-fill up to cp_bytes (4, 8 or 16; both pointers aligned
// to it; src unread when src_bytes == 0). IMMEDIATE: copied at issue. DEFERRED: dst is poisoned
// at issue (all bits set: NaN for floats) and written when a wait retires the group, so a stage
// read before its wait reads garbage, as it may on a GPU.
void at_emu_cp_async(void* dst, const void* src, int cp_bytes, int src_bytes);
void at_emu_cp_async_commit();  // closes the calling thread's current group
void at_emu_cp_async_wait(int n);  // completes the thread's committed groups but the newest n
inline void at_emu_cp_async_wait_all() {
    at_emu_cp_async_commit();
    at_emu_cp_async_wait(0);
}

// ---- tensor-core warp collectives (templates/_mma.cuh) --------------------------------------
// Both are .sync.aligned: every lane of a whole warp (32 threads, none exited) executes them
// together, else the emulator aborts naming the op. Each is one warp op: the lanes' operands
// are gathered, then each lane computes its own registers from them.
//
// ldmatrix.sync.aligned.m8n8.x{num}{.trans}.shared.b16: lanes 8q .. 8q+7 give the addresses of
// the 8 rows (16 bytes each, 16-byte aligned) of matrix q < num; lane l gets in out[q] the
// elements (l/4, 2(l%4)) and (l/4, 2(l%4)+1) of matrix q, low half first; with .trans, those
// of its transpose.
void at_emu_ldmatrix(unsigned* out, int num, bool trans, const void* row);
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: d = A (16 x 16) B (16 x 8)
// + c, the fragments laid out as the PTX ISA says (a: 4 registers of 2 elements, b: 2, c and d:
// 4 floats; row g = lane/4, column pair 2 (lane%4)). The products are exact in float (8 or 11
// bit significands); the sum is taken in float, k in order, after c.
void at_emu_mma_m16n8k16(float* d, const unsigned* a, const unsigned* b, const float* c, bool bf16);

// ---- float16 conversions (bit exact, as the GPU's cvt) -------------------------------------
inline float at_emu_f16_to_f32(unsigned short h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float mag = (float)m * 0x1p-24f;  // zero or subnormal, exact
        return std::bit_cast<float>(std::bit_cast<uint32_t>(mag) | sign);
    }
    if (e == 31)
        return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
    return std::bit_cast<float>(sign | ((e - 15 + 127) << 23) | (m << 13));
}

// Round to nearest, ties to even; NaN becomes the canonical 0x7fff, as cvt.rn.f16.f32 gives.
inline unsigned short at_emu_f32_to_f16_rn(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u)
        return 0x7fff;
    if (a >= 0x477ff000u)  // >= 65520 (and inf): rounds to inf
        return (unsigned short)(sign | 0x7c00u);
    if (a < 0x38800000u) {  // below 2^-14: a subnormal (or zero, or 2^-14 after rounding)
        const float scaled = std::bit_cast<float>(a) * 0x1p24f;  // exact
        const float r = std::nearbyint(scaled);                 // ties to even in the default mode
        return (unsigned short)(sign | (uint32_t)r);
    }
    uint32_t h = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffffu) >> 13));
    const uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        ++h;  // a carry into the exponent is right
    return (unsigned short)(sign | h);
}


// ---- cuda_fp16.h / cuda_bf16.h: the types and conversions the templates use ------------------
// A template that #includes <cuda_fp16.h> or <cuda_bf16.h> gets these instead on the emulator
// (tests/host_cuda.py drops those two includes): the storage types, and the conversions, bit
// exact as the GPU's cvt (round to nearest even; NaN to the canonical 0x7fff / 0x7fff).
struct alignas(2) __half {
    unsigned short __x;
};
struct alignas(2) __nv_bfloat16 {
    unsigned short __x;
};
inline float __half2float(__half h) { return at_emu_f16_to_f32(h.__x); }
inline __half __float2half_rn(float f) { return __half{at_emu_f32_to_f16_rn(f)}; }
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return std::bit_cast<float>((uint32_t)h.__x << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return __nv_bfloat16{0x7fff};
    const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);  // ties to even; a carry into the exponent is right
    return __nv_bfloat16{(unsigned short)(rounded >> 16)};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

// ---- Hopper: mbarriers, TMA tile loads, warpgroup MMAs (templates/_wgmma.cuh) ----------------
// A kernel parameter `const __grid_constant__ CUtensorMap m` is an ordinary by-value struct here.
#define __grid_constant__
// The emulator's tensor map: what tests/host_cuda.py writes into a CUtensorMap's 128 bytes (its
// own encoding, not the driver's; all zeros: a map the variant does not read, which a TMA load
// refuses). `base` is filled in by the harness with the source array's pointer.
struct AtEmuTensorMap {
    uint32_t magic;        // AT_EMU_TMAP_MAGIC
    uint32_t rank;         // 2 (the only rank emulated)
    uint32_t elem;         // bytes per element
    uint32_t swizzle;      // 0, 32, 64 or 128 (bytes)
    uint64_t base;         // the array's first element
    uint64_t dims[2];      // innermost first, in elements
    uint64_t stride1;      // bytes between consecutive indices of dim 1
    uint32_t box[2];       // innermost first
    uint32_t oob_nan;      // out-of-bounds elements read as NaN (else zero)
    uint32_t source;       // the parameter index of the array (the harness binds base from it)
};
static_assert(sizeof(AtEmuTensorMap) <= 128, "fits a CUtensorMap");
static_assert(offsetof(AtEmuTensorMap, base) == 16 && offsetof(AtEmuTensorMap, source) == 60, "as tests/host_cuda.py packs it");
constexpr uint32_t AT_EMU_TMAP_MAGIC = 0x50414d54u;  // "TMAP"
void at_emu_bind_tensor_map(void* map, const void* base);  // the harness: the source array's pointer

// The shared-window address of p (what __cvta_generic_to_shared gives on a GPU): its offset in
// the block's dynamic shared memory, which the emulator allocates 1024-byte aligned (so address
// bits, which swizzles read, are those of the offset). p outside it aborts.
unsigned at_emu_shared_address(const void* p);
// mbarrier (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier"): a
// phase completes when its pending arrivals reach zero and its transaction count is zero; then
// the next phase starts with the expected count. try_wait.parity(P) is true when the phase of
// parity P has completed: the current phase's parity is not P.
void at_emu_mbarrier_init(unsigned long long* bar, unsigned count);
void at_emu_mbarrier_arrive(unsigned long long* bar);
void at_emu_mbarrier_arrive_expect_tx(unsigned long long* bar, unsigned bytes);
bool at_emu_mbarrier_try_wait_parity(unsigned long long* bar, unsigned parity);
// cp.async.bulk.tensor.2d ... mbarrier::complete_tx::bytes: the box at (c0 innermost, c1); dst is
// poisoned (0xff: NaN) at issue and the box lands, completing its bytes on bar, only when a
// thread next try_waits on bar: a tile read before its barrier's wait reads NaNs.
void at_emu_tma_load_2d(void* dst, const void* tensor_map, int c0, int c1, unsigned long long* bar);
void at_emu_fence_proxy_async();
// wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{bf16,f16}: computed at issue from the shared
// operands the descriptors give, into a pending result (the thread's accumulators d are NaN until
// the wait_group that retires its group, which re-reads the operands and aborts if they changed:
// a stage released before the MMAs on it finished). A later wgmma on the same d chains on the
// pending result, as the hardware orders them.
void at_emu_wgmma_fence();
void at_emu_wgmma_commit_group();
void at_emu_wgmma_wait_group(int n);
void at_emu_wgmma_m64k16(float* d, int n, unsigned long long desc_a, unsigned long long desc_b, int scale_d, bool bf16, int trans_a,
                         int trans_b);

// Thread-block clusters (templates/_cluster.cuh): %cluster_ctarank and %cluster_nctarank, the
// cluster barrier (barrier.cluster.arrive.release + wait.acquire: every live thread of every block
// of the cluster), and mapa: the address in block `rank`'s dynamic shared memory at the offset
// that p has in the caller's (only dynamic shared memory is mapped; a rank past the cluster aborts).
unsigned at_emu_cluster_ctarank();
unsigned at_emu_cluster_nctarank();
void at_emu_cluster_sync();
void* at_emu_cluster_map_shared(const void* p, unsigned rank);

#endif  // AT_EMULATOR_H

// =============================================================================================
// The runtime: in one translation unit only.
// =============================================================================================
#if defined(AT_EMU_IMPLEMENTATION) && !defined(AT_EMU_IMPLEMENTED)
#define AT_EMU_IMPLEMENTED


namespace at_emu {

CopyMode copy_mode = CopyMode::deferred;
thread_local unsigned char* dynamic_shared_ptr = nullptr;
size_t dynamic_shared_bytes = 0;

namespace {

struct Warp {
    explicit Warp(int lanes) : nlanes(lanes), bar(lanes) {}
    int nlanes;
    std::barrier<> bar;
    // Double-buffered exchange slots: op k writes buffer k % 2, so a lane's next write never
    // hits a slot that a slower lane may still read (all passed op k+1's barrier first).
    alignas(16) unsigned char slot[2][32][SLOT_BYTES] = {};
    int op[2][32] = {};
    unsigned mask[2][32] = {};
    uint64_t seq[2][32] = {};  // which warp op of the lane wrote the slot: it took part iff it equals ours
};

enum ThreadState : int { running = 0, at_syncthreads = 1, at_warp_op = 2, exited = 3, at_mbarrier = 4, at_cluster_barrier = 5 };

// The Hopper state (defined with the Hopper hooks below): a block starts with no mbarriers and no
// TMA copies in flight, a thread with no wgmma in flight (the pool's threads run block after block).
void hopper_block_start();
void hopper_thread_end();

struct Block {
    explicit Block(int n) : bar(n), state(n) {
        for (int w = 0; w * 32 < n; ++w)
            warps.push_back(std::make_unique<Warp>(std::min(32, n - w * 32)));
    }
    std::barrier<> bar;
    std::vector<std::unique_ptr<Warp>> warps;
    std::vector<std::atomic<int>> state;
};

// The blocks of one cluster (one block when the launch has no clusters), run together; block
// `rank` (its rank in the cluster: x fastest) has its own threads, barriers and shared memory.
struct ClusterRun {
    ClusterRun(int blocks, int threads_per_block) : bar(blocks * threads_per_block), bidx(blocks), shared(blocks) {
        for (int r = 0; r < blocks; ++r)
            this->blocks.push_back(std::make_unique<Block>(threads_per_block));
    }
    std::barrier<> bar;  // the cluster barrier: every thread of every block
    std::vector<std::unique_ptr<Block>> blocks;
    std::vector<uint3> bidx;
    std::vector<unsigned char*> shared;
};

struct Copy {
    void* dst;
    const void* src;
    int cp_bytes, src_bytes;
};

struct ThreadCtx {
    Block* block = nullptr;
    ClusterRun* cluster = nullptr;
    unsigned rank = 0;  // the block's rank in its cluster
    int linear = 0, lane = 0, warp = 0;
    unsigned parity = 0;
    uint64_t seq = 0;                      // warp ops done, counted from 1
    std::vector<Copy> open;                // cp.async copies not yet committed
    std::deque<std::vector<Copy>> groups;  // committed and not yet landed (deferred mode)
};
thread_local ThreadCtx ctx;

const char* op_name(int op) {
    return op == OP_SYNCWARP ? "__syncwarp"
           : op == OP_SHFL   ? "a shuffle"
           : op == OP_VOTE   ? "a vote (__ballot_sync, __any_sync, __all_sync)"
           : op == OP_LDMATRIX ? "ldmatrix"
           : op == OP_MMA      ? "mma.sync"
                               : "?";
}

void do_copy(const Copy& c) {
    if (c.src_bytes > 0)
        std::memcpy(c.dst, c.src, c.src_bytes);
    std::memset(static_cast<unsigned char*>(c.dst) + c.src_bytes, 0, c.cp_bytes - c.src_bytes);
}

struct LaunchState {
    std::mutex m;
    std::condition_variable start_cv, done_cv;
    uint64_t generation = 0;
    int remaining = 0;
    bool stop = false;
    ClusterRun* run = nullptr;
    dim3 bdim, gdim;
    void (*fn)(void*) = nullptr;
    void* arg = nullptr;
};

// A pool thread: runs linear thread `linear` of block `rank` of each cluster the launcher starts.
void run_thread(LaunchState& s, int rank, int linear) {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(s.m);
            s.start_cv.wait(lk, [&] { return s.stop || s.generation != seen; });
            if (s.stop)
                return;
            seen = s.generation;
        }
        ClusterRun& c = *s.run;
        Block& b = *c.blocks[rank];
        blockIdx = c.bidx[rank];
        dynamic_shared_ptr = c.shared[rank];
        ctx.cluster = &c;
        ctx.rank = (unsigned)rank;
        blockDim = s.bdim;
        gridDim = s.gdim;
        threadIdx = uint3{linear % s.bdim.x, linear / s.bdim.x % s.bdim.y, linear / (s.bdim.x * s.bdim.y)};
        ctx.block = &b;
        ctx.linear = linear;
        ctx.lane = linear % 32;
        ctx.warp = linear / 32;
        ctx.parity = 0;
        ctx.seq = 0;
        ctx.open.clear();
        ctx.groups.clear();
        s.fn(s.arg);
        if (!ctx.open.empty())
            fail("the thread returned with %zu cp.async cop%s never committed (at_cp_async_commit)", ctx.open.size(),
                 ctx.open.size() == 1 ? "y" : "ies");
        ctx.groups.clear();  // committed, never waited for: nothing may read them
        hopper_thread_end();
        // Leave the barriers as an exited GPU thread does: the others no longer wait for it.
        b.state[linear].store(exited);
        b.warps[ctx.warp]->bar.arrive_and_drop();
        b.bar.arrive_and_drop();
        c.bar.arrive_and_drop();
        ctx.block = nullptr;
        ctx.cluster = nullptr;
        {
            std::lock_guard<std::mutex> lk(s.m);
            if (--s.remaining == 0)
                s.done_cv.notify_one();
        }
    }
}

}  // namespace

void fail(const char* fmt, ...) {
    std::fprintf(stderr, "at_emu error: ");
    va_list ap;
    va_start(ap, fmt);
    std::vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (ctx.block)
        std::fprintf(stderr, " [thread (%u,%u,%u) of block (%u,%u,%u)]\n", threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y,
                     blockIdx.z);
    else
        std::fprintf(stderr, "\n");
    std::fflush(stderr);
    std::_Exit(86);
}

void syncthreads() {
    ctx.block->state[ctx.linear].store(at_syncthreads);
    ctx.block->bar.arrive_and_wait();
    ctx.block->state[ctx.linear].store(running);
}

unsigned warp_op(int op, unsigned mask, const void* value, size_t bytes, int src, void* out, unsigned* ballot, const char* what) {
    Warp& w = *ctx.block->warps[ctx.warp];
    const unsigned p = ctx.parity;
    ctx.parity ^= 1u;
    const uint64_t seq = ++ctx.seq;
    if (bytes > SLOT_BYTES)
        fail("%s publishes %zu bytes; a warp op moves at most %zu", what, bytes, SLOT_BYTES);
    if (bytes)
        std::memcpy(w.slot[p][ctx.lane], value, bytes);
    w.op[p][ctx.lane] = op;
    w.mask[p][ctx.lane] = mask;
    w.seq[p][ctx.lane] = seq;
    ctx.block->state[ctx.linear].store(at_warp_op);
    w.bar.arrive_and_wait();
    ctx.block->state[ctx.linear].store(running);
    unsigned live = 0;
    for (int l = 0; l < w.nlanes; ++l)
        if (w.seq[p][l] == seq)
            live |= 1u << l;
    if ((mask & live) != live)
        fail("%s with mask 0x%08x, but the live lanes of warp %d are 0x%08x: the emulator needs every live lane in the mask", what, mask,
             ctx.warp, live);
    for (int l = 0; l < w.nlanes; ++l)
        if ((live >> l) & 1u) {
            if (w.op[p][l] != op)
                fail("%s in lane %d met %s in lane %d of warp %d: divergent warp-synchronous code", what, ctx.lane, op_name(w.op[p][l]), l,
                     ctx.warp);
            if (w.mask[p][l] != mask)
                fail("%s: lanes %d and %d of warp %d pass different masks (0x%08x, 0x%08x)", what, ctx.lane, l, ctx.warp, mask, w.mask[p][l]);
        }
    if (src == GATHER) {
        for (int l = 0; l < 32; ++l) {
            if (l < w.nlanes && ((live >> l) & 1u))
                std::memcpy(static_cast<unsigned char*>(out) + l * bytes, w.slot[p][l], bytes);
            else
                std::memset(static_cast<unsigned char*>(out) + l * bytes, 0, bytes);
        }
    } else if (src != -1) {
        if (src < 0 || src >= w.nlanes || !((live >> src) & 1u))
            fail("%s in lane %d reads lane %d of warp %d, which %s", what, ctx.lane, src, ctx.warp,
                 src < 0 || src >= 32 ? "does not exist" : src >= w.nlanes ? "is past the block's last thread" : "has exited");
        std::memcpy(out, w.slot[p][src], bytes);
    }
    if (ballot) {
        *ballot = 0;
        for (int l = 0; l < w.nlanes; ++l) {
            int v;
            std::memcpy(&v, w.slot[p][l], sizeof v);
            if (((live >> l) & 1u) && v)
                *ballot |= 1u << l;
        }
    }
    return live;
}

void launch_raw(void (*fn)(void*), void* arg, dim3 grid, dim3 block, size_t shared_bytes, double block_timeout_s, dim3 cluster) {
    const long long n = (long long)block.x * block.y * block.z;
    if (n <= 0 || n > 1024)
        fail("a block of %u x %u x %u threads: CUDA allows 1 to 1024", block.x, block.y, block.z);
    const long long blocks = (long long)cluster.x * cluster.y * cluster.z;
    if (blocks <= 0 || blocks > 8)
        fail("a cluster of %u x %u x %u blocks: 1 to 8 (the portable size)", cluster.x, cluster.y, cluster.z);
    if (grid.x % cluster.x || grid.y % cluster.y || grid.z % cluster.z)
        fail("a %u x %u x %u grid in clusters of %u x %u x %u: each grid dimension must be a multiple of the cluster's", grid.x, grid.y,
             grid.z, cluster.x, cluster.y, cluster.z);
    dynamic_shared_bytes = shared_bytes;
    LaunchState s;
    s.fn = fn;
    s.arg = arg;
    s.bdim = block;
    s.gdim = grid;
    std::vector<unsigned char*> buffers((size_t)blocks, nullptr);
    if (shared_bytes)  // exactly the size asked for: ASan reports an access past it
        for (auto& p : buffers)
            p = static_cast<unsigned char*>(::operator new[](shared_bytes, std::align_val_t(1024)));  // 128B swizzles
    std::vector<std::thread> threads;
    threads.reserve((size_t)(blocks * n));
    for (int r = 0; r < blocks; ++r)
        for (int i = 0; i < n; ++i)
            threads.emplace_back(run_thread, std::ref(s), r, i);
    for (unsigned cz = 0; cz < grid.z; cz += cluster.z)
        for (unsigned cy = 0; cy < grid.y; cy += cluster.y)
            for (unsigned cx = 0; cx < grid.x; cx += cluster.x) {
                ClusterRun c((int)blocks, (int)n);
                for (int r = 0; r < blocks; ++r) {
                    c.bidx[r] = uint3{cx + r % cluster.x, cy + r / cluster.x % cluster.y, cz + r / (cluster.x * cluster.y)};
                    c.shared[r] = buffers[r];
                    if (shared_bytes)
                        std::memset(buffers[r], 0xff, shared_bytes);  // undefined on a GPU: NaN here
                }
                hopper_block_start();
                std::unique_lock<std::mutex> lk(s.m);
                s.run = &c;
                s.remaining = (int)(blocks * n);
                ++s.generation;
                s.start_cv.notify_all();
                const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(block_timeout_s);
                if (!s.done_cv.wait_until(lk, deadline, [&] { return s.remaining == 0; })) {
                    int counts[6] = {0, 0, 0, 0, 0, 0};
                    for (const auto& b : c.blocks)
                        for (int i = 0; i < n; ++i)
                            counts[b->state[i].load()]++;
                    std::fprintf(stderr,
                                 "at_emu error: block (%u,%u,%u)%s of a %u x %u x %u grid did not finish within %.1f s (a hang?): of its "
                                 "%lld threads, %d wait in __syncthreads, %d in a warp operation, %d on an mbarrier phase, %d at the "
                                 "cluster barrier, %d run, %d have returned. A barrier that not every live thread reaches (or an "
                                 "mbarrier phase whose arrivals or transaction bytes never all come)?\n",
                                 cx, cy, cz, blocks > 1 ? " and the rest of its cluster" : "", grid.x, grid.y, grid.z, block_timeout_s,
                                 blocks * n, counts[at_syncthreads], counts[at_warp_op], counts[at_mbarrier], counts[at_cluster_barrier],
                                 counts[running], counts[exited]);
                    std::fflush(stderr);
                    std::_Exit(87);
                }
            }
    {
        std::lock_guard<std::mutex> lk(s.m);
        s.stop = true;
        s.start_cv.notify_all();
    }
    for (auto& t : threads)
        t.join();
    for (auto* p : buffers)
        if (p)
            ::operator delete[](p, std::align_val_t(1024));
    dynamic_shared_bytes = 0;
}

}  // namespace at_emu

void at_emu_cp_async(void* dst, const void* src, int cp_bytes, int src_bytes) {
    using namespace at_emu;
    if (cp_bytes != 4 && cp_bytes != 8 && cp_bytes != 16)
        fail("cp.async of %d bytes: only 4, 8 or 16", cp_bytes);
    if (src_bytes < 0 || src_bytes > cp_bytes)
        fail("cp.async with src_bytes %d outside 0..%d", src_bytes, cp_bytes);
    if (reinterpret_cast<uintptr_t>(dst) % cp_bytes)
        fail("cp.async of %d bytes to shared address %p, not aligned to %d bytes (a GPU faults)", cp_bytes, dst, cp_bytes);
    if (reinterpret_cast<uintptr_t>(src) % cp_bytes)
        fail("cp.async of %d bytes from global address %p, not aligned to %d bytes (a GPU faults)", cp_bytes, src, cp_bytes);
    const Copy c{dst, src, cp_bytes, src_bytes};
    if (copy_mode == CopyMode::immediate)
        do_copy(c);
    else
        std::memset(dst, 0xff, cp_bytes);
    ctx.open.push_back(c);
}

namespace {

// Every lane of the calling warp takes part (mma.sync and ldmatrix are .aligned): else abort.
void require_full_warp(unsigned live, const char* what) {
    using namespace at_emu;
    if (live != 0xffffffffu)
        fail("%s with live lanes 0x%08x: it needs all 32 lanes of a full warp", what, live);
}

float half_bits_to_float(unsigned short h, bool bf16) {
    return bf16 ? std::bit_cast<float>((uint32_t)h << 16) : at_emu_f16_to_f32(h);
}

}  // namespace

void at_emu_ldmatrix(unsigned* out, int num, bool trans, const void* row) {
    using namespace at_emu;
    if (num != 1 && num != 2 && num != 4)
        fail("ldmatrix .x%d: only x1, x2 or x4", num);
    const void* rows[32];
    const char* what = trans ? "ldmatrix .trans" : "ldmatrix";
    require_full_warp(warp_op(OP_LDMATRIX, 0xffffffffu, &row, sizeof row, GATHER, rows, nullptr, what), what);
    for (int l = 0; l < 8 * num; ++l)
        if (reinterpret_cast<uintptr_t>(rows[l]) % 16)
            fail("%s: lane %d gives row address %p, not 16-byte aligned", what, l, rows[l]);
    const int lane = ctx.lane, g = lane / 4, t = lane % 4;
    auto at = [&](int q, int r, int c) {  // element (r, c) of matrix q as stored
        unsigned short v;
        std::memcpy(&v, static_cast<const unsigned char*>(rows[8 * q + r]) + 2 * c, 2);
        return (unsigned)v;
    };
    for (int q = 0; q < num; ++q)
        out[q] = trans ? at(q, 2 * t, g) | at(q, 2 * t + 1, g) << 16 : at(q, g, 2 * t) | at(q, g, 2 * t + 1) << 16;
}

void at_emu_mma_m16n8k16(float* d, const unsigned* a, const unsigned* b, const float* c, bool bf16) {
    using namespace at_emu;
    unsigned mine[6], all[32][6];
    std::memcpy(mine, a, 16);
    std::memcpy(mine + 4, b, 8);
    const char* what = bf16 ? "mma.sync m16n8k16 bf16" : "mma.sync m16n8k16 f16";
    require_full_warp(warp_op(OP_MMA, 0xffffffffu, mine, sizeof mine, GATHER, all, nullptr, what), what);
    // A[r][k] and B[k][n] from the lanes' fragments: lane l holds rows l/4 and l/4+8 of A and
    // column l/4 of B, at k = 2 (l%4) + {0, 1, 8, 9}.
    auto half = [&](unsigned reg, int hi) { return half_bits_to_float((unsigned short)(hi ? reg >> 16 : reg & 0xffffu), bf16); };
    auto A = [&](int r, int k) {
        const int l = (r % 8) * 4 + (k % 8) / 2;
        return half(all[l][(r / 8) + 2 * (k / 8)], k % 2);
    };
    auto B = [&](int k, int n) {
        const int l = n * 4 + (k % 8) / 2;
        return half(all[l][4 + k / 8], k % 2);
    };
    const int g = ctx.lane / 4, t = ctx.lane % 4;
    for (int i = 0; i < 4; ++i) {
        const int r = g + 8 * (i / 2), n = 2 * t + i % 2;
        float acc = c[i];
        for (int k = 0; k < 16; ++k)
            acc += A(r, k) * B(k, n);
        d[i] = acc;
    }
}

void at_emu_cp_async_commit() {
    using namespace at_emu;
    if (copy_mode == CopyMode::deferred)
        ctx.groups.push_back(std::move(ctx.open));
    ctx.open.clear();
}

void at_emu_cp_async_wait(int n) {
    using namespace at_emu;
    if (n < 0)
        fail("cp.async wait for %d groups", n);
    while (ctx.groups.size() > static_cast<size_t>(n)) {
        for (const Copy& c : ctx.groups.front())
            do_copy(c);
        ctx.groups.pop_front();
    }
}

// ---- Hopper ------------------------------------------------------------------------------------
namespace {

struct PendingTma {
    unsigned char* dst;
    AtEmuTensorMap map;
    int c0, c1;
};

struct MBarrier {
    unsigned expected = 0, pending = 0, phase = 0;
    long long tx = 0;
    std::vector<PendingTma> copies;
};

std::mutex hopper_mutex;
std::map<const void*, MBarrier> barriers;  // by address (a block's barriers; re-initialised per block)

size_t swizzled(size_t off, uint32_t swizzle) {
    // the 16-byte chunk bits [4:6] XOR the 128-byte row bits [7:9] (128B; 64B: 2 bits, 32B: 1),
    // of the shared address, as a TMA store with that swizzle and a wgmma descriptor read them
    const size_t mask = swizzle == 128 ? 7 : swizzle == 64 ? 3 : swizzle == 32 ? 1 : 0;
    return off ^ (((off >> 7) & mask) << 4);
}

void land(const PendingTma& c) {
    using namespace at_emu;
    const AtEmuTensorMap& m = c.map;
    const size_t base = at_emu_shared_address(c.dst);
    for (uint32_t r = 0; r < m.box[1]; ++r)
        for (uint32_t e = 0; e < m.box[0]; ++e) {
            const long long x = (long long)c.c0 + e, y = (long long)c.c1 + r;
            const size_t off = swizzled(base + ((size_t)r * m.box[0] + e) * m.elem, m.swizzle);
            unsigned char* to = dynamic_shared_ptr + off;
            if (x >= 0 && y >= 0 && (uint64_t)x < m.dims[0] && (uint64_t)y < m.dims[1])
                std::memcpy(to, reinterpret_cast<const unsigned char*>(m.base) + y * m.stride1 + x * m.elem, m.elem);
            else if (m.oob_nan)
                std::memset(to, 0xff, m.elem);
            else
                std::memset(to, 0, m.elem);
        }
}

void complete_if_done(MBarrier& b) {
    if (b.pending == 0 && b.tx == 0) {
        b.phase ^= 1u;
        b.pending = b.expected;
    }
}

MBarrier& barrier_at(const void* bar, const char* what) {
    using namespace at_emu;
    auto it = barriers.find(bar);
    if (it == barriers.end())
        fail("%s on an mbarrier at %p that was never initialised", what, bar);
    return it->second;
}

struct WgmmaOp {
    float* d;
    int n;
    unsigned long long desc_a, desc_b;
    bool bf16;
    std::vector<uint16_t> a, b;  // the operands as read at issue: A 64 x 16, B n x 16 (row-major)
    std::vector<float> result;   // this thread's n / 2 accumulators
};

struct WgmmaThread {
    std::vector<WgmmaOp> open;                   // issued, not yet committed
    std::deque<std::vector<WgmmaOp>> groups;     // committed, not yet retired
};
thread_local WgmmaThread wgmma;

// Element (row, k) of a K-major operand through its descriptor (PTX ISA, "Matrix Descriptor
// Format" and the canonical K-major layouts): 16-bit elements; swizzled modes: rows of the
// swizzle's width in 8-row groups SBO bytes apart, the 16-byte chunks swizzled on the address;
// no swizzle: 8 x 16-byte core matrices, SBO apart along rows and LBO apart along k.
uint16_t operand(unsigned long long desc, int row, int k) {
    using namespace at_emu;
    const size_t start = (desc & 0x3FFFull) << 4, lbo = ((desc >> 16) & 0x3FFFull) << 4, sbo = ((desc >> 32) & 0x3FFFull) << 4;
    const unsigned base_offset = (desc >> 49) & 7u, mode = (unsigned)(desc >> 62);
    if (base_offset)
        fail("wgmma descriptor with base offset %u: not emulated", base_offset);
    size_t off;
    if (mode == 0) {
        off = start + (size_t)(row / 8) * sbo + (size_t)(k / 8) * lbo + (size_t)(row % 8) * 16 + (size_t)(k % 8) * 2;
    } else {
        const uint32_t width = mode == 1 ? 128 : mode == 2 ? 64 : 32;
        off = swizzled(start + (size_t)(row / 8) * sbo + (size_t)(row % 8) * width + (size_t)k * 2, width);
    }
    uint16_t v;
    std::memcpy(&v, dynamic_shared_ptr + off, 2);  // ASan: an offset past the buffer is reported
    return v;
}

void read_operands(WgmmaOp& op) {
    op.a.resize(64 * 16);
    op.b.resize((size_t)op.n * 16);
    for (int r = 0; r < 64; ++r)
        for (int k = 0; k < 16; ++k)
            op.a[r * 16 + k] = operand(op.desc_a, r, k);
    for (int r = 0; r < op.n; ++r)
        for (int k = 0; k < 16; ++k)
            op.b[r * 16 + k] = operand(op.desc_b, r, k);
}

// The newest wgmma on d not yet retired: the uncommitted ones first, then the groups newest first.
const std::vector<float>* pending_result(const float* d) {
    for (auto op = wgmma.open.rbegin(); op != wgmma.open.rend(); ++op)
        if (op->d == d)
            return &op->result;
    for (auto g = wgmma.groups.rbegin(); g != wgmma.groups.rend(); ++g)
        for (auto op = g->rbegin(); op != g->rend(); ++op)
            if (op->d == d)
                return &op->result;
    return nullptr;
}

}  // namespace

void at_emu_bind_tensor_map(void* map, const void* base) {
    AtEmuTensorMap m;
    std::memcpy(&m, map, sizeof m);
    if (m.magic == AT_EMU_TMAP_MAGIC) {
        m.base = reinterpret_cast<uint64_t>(base);
        std::memcpy(map, &m, sizeof m);
    }
}

unsigned at_emu_shared_address(const void* p) {
    using namespace at_emu;
    const unsigned char* q = static_cast<const unsigned char*>(p);
    if (!dynamic_shared_ptr || q < dynamic_shared_ptr || q >= dynamic_shared_ptr + dynamic_shared_bytes)
        fail("a shared-window address of %p, outside the block's dynamic shared memory (the emulator's descriptors and TMA "
             "boxes live there)",
             p);
    return (unsigned)(q - dynamic_shared_ptr);
}

void at_emu_mbarrier_init(unsigned long long* bar, unsigned count) {
    using namespace at_emu;
    if (reinterpret_cast<uintptr_t>(bar) % 8)
        fail("mbarrier at %p: not 8-byte aligned", (void*)bar);
    if (count == 0)
        fail("mbarrier.init with a count of 0");
    std::lock_guard<std::mutex> lk(hopper_mutex);
    MBarrier& b = barriers[bar];
    b = MBarrier{};
    b.expected = b.pending = count;
}

void at_emu_mbarrier_arrive(unsigned long long* bar) {
    using namespace at_emu;
    std::lock_guard<std::mutex> lk(hopper_mutex);
    MBarrier& b = barrier_at(bar, "mbarrier.arrive");
    --b.pending;
    complete_if_done(b);
}

void at_emu_mbarrier_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
    using namespace at_emu;
    std::lock_guard<std::mutex> lk(hopper_mutex);
    MBarrier& b = barrier_at(bar, "mbarrier.arrive.expect_tx");
    b.tx += bytes;
    --b.pending;
    complete_if_done(b);
}

bool at_emu_mbarrier_try_wait_parity(unsigned long long* bar, unsigned parity) {
    using namespace at_emu;
    bool done;
    {
        std::lock_guard<std::mutex> lk(hopper_mutex);
        MBarrier& b = barrier_at(bar, "mbarrier.try_wait.parity");
        for (const PendingTma& c : b.copies) {  // the copies land now, and complete their bytes
            land(c);
            b.tx -= (long long)c.map.box[0] * c.map.box[1] * c.map.elem;
            if (b.tx < 0)
                fail("mbarrier: a TMA load completed %lld more bytes than were expected (expect_tx)", -b.tx);
            complete_if_done(b);
        }
        b.copies.clear();
        done = b.phase != (parity & 1u);
    }
    if (ctx.block)  // the watchdog's report counts the threads waiting on an mbarrier
        ctx.block->state[ctx.linear].store(done ? running : at_mbarrier);
    if (!done)
        std::this_thread::yield();
    return done;
}

void at_emu_tma_load_2d(void* dst, const void* tensor_map, int c0, int c1, unsigned long long* bar) {
    using namespace at_emu;
    AtEmuTensorMap m;
    std::memcpy(&m, tensor_map, sizeof m);
    if (m.magic != AT_EMU_TMAP_MAGIC)
        fail("a TMA load through a tensor map that was not encoded (the call passed zeros: its `when` is false for this variant)");
    if (m.rank != 2 || !m.base)
        fail("a 2D TMA load through a map of rank %u (base %p)", m.rank, (void*)m.base);
    const size_t off = at_emu_shared_address(dst), align = m.swizzle == 128 ? 1024 : m.swizzle == 64 ? 512 : m.swizzle == 32 ? 256 : 128;
    if (off % align)
        fail("a TMA load into shared offset %zu, not %zu-byte aligned (swizzle %uB)", off, align, m.swizzle);
    if (m.swizzle && m.box[0] * m.elem > m.swizzle)
        fail("a TMA box %u elements wide (%u bytes) under a %uB swizzle", m.box[0], m.box[0] * m.elem, m.swizzle);
    const size_t bytes = (size_t)m.box[0] * m.box[1] * m.elem;
    if (off + bytes > dynamic_shared_bytes)
        fail("a TMA box of %zu bytes at shared offset %zu, past the %zu bytes of dynamic shared memory", bytes, off, dynamic_shared_bytes);
    std::memset(dst, 0xff, bytes);
    std::lock_guard<std::mutex> lk(hopper_mutex);
    barrier_at(bar, "cp.async.bulk.tensor's complete_tx").copies.push_back(PendingTma{static_cast<unsigned char*>(dst), m, c0, c1});
}

void at_emu_fence_proxy_async() { std::atomic_thread_fence(std::memory_order_seq_cst); }

void at_emu_wgmma_fence() {}

void at_emu_wgmma_m64k16(float* d, int n, unsigned long long desc_a, unsigned long long desc_b, int scale_d, bool bf16, int trans_a,
                         int trans_b) {
    using namespace at_emu;
    if (trans_a || trans_b)
        fail("wgmma with a transposed operand: not emulated");
    if (n < 8 || n > 256 || n % 8)
        fail("wgmma m64n%dk16: n must be a multiple of 8 from 8 to 256", n);
    if (blockDim.x % 128 || blockDim.y != 1 || blockDim.z != 1)
        fail("wgmma in a block of %u x %u x %u threads: warpgroups are 128 threads of a 1-D block", blockDim.x, blockDim.y, blockDim.z);
    WgmmaOp op{d, n, desc_a, desc_b, bf16, {}, {}, {}};
    read_operands(op);
    const std::vector<float>* before = pending_result(d);
    std::vector<float> in(d, d + n / 2);
    if (before)
        in = *before;
    const int t = (int)(threadIdx.x % 128), w = t / 32, lane = t % 32;
    op.result.resize(n / 2);
    for (int i = 0; i < n / 2; ++i) {
        const int row = 16 * w + lane / 4 + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
        float acc = scale_d ? in[i] : 0.0f;
        for (int k = 0; k < 16; ++k)
            acc += half_bits_to_float(op.a[row * 16 + k], bf16) * half_bits_to_float(op.b[col * 16 + k], bf16);
        op.result[i] = acc;
    }
    for (int i = 0; i < n / 2; ++i)
        d[i] = std::numeric_limits<float>::quiet_NaN();  // in flight: not to be read before the wait
    wgmma.open.push_back(std::move(op));
}

void at_emu_wgmma_commit_group() { wgmma.groups.push_back(std::move(wgmma.open)), wgmma.open.clear(); }

void at_emu_wgmma_wait_group(int n) {
    using namespace at_emu;
    if (n < 0 || n > 7)
        fail("wgmma.wait_group %d: 0 to 7", n);
    while (wgmma.groups.size() > (size_t)n) {
        std::vector<WgmmaOp> group = std::move(wgmma.groups.front());
        wgmma.groups.pop_front();
        for (WgmmaOp& op : group) {
            WgmmaOp again{op.d, op.n, op.desc_a, op.desc_b, op.bf16, {}, {}, {}};
            read_operands(again);
            if (again.a != op.a || again.b != op.b)
                fail("a shared operand of a wgmma was overwritten before its wait_group retired it (a stage released too early?)");
            if (!pending_result(op.d))  // a later wgmma on d still in flight: d stays NaN until that one retires
                std::copy(op.result.begin(), op.result.end(), op.d);
        }
    }
}

namespace at_emu {
namespace {

void hopper_block_start() {
    std::lock_guard<std::mutex> lk(hopper_mutex);
    barriers.clear();  // a block's mbarriers (and the TMA copies queued on them) end with it
}

void hopper_thread_end() {
    wgmma.open.clear();  // in flight at exit: nothing may read them, and the next block must not chain on them
    wgmma.groups.clear();
}

}  // namespace
}  // namespace at_emu

unsigned at_emu_cluster_ctarank() { return at_emu::ctx.rank; }

unsigned at_emu_cluster_nctarank() { return (unsigned)at_emu::ctx.cluster->blocks.size(); }

void at_emu_cluster_sync() {
    using namespace at_emu;
    ctx.block->state[ctx.linear].store(at_cluster_barrier);
    ctx.cluster->bar.arrive_and_wait();
    ctx.block->state[ctx.linear].store(running);
}

void* at_emu_cluster_map_shared(const void* p, unsigned rank) {
    using namespace at_emu;
    const unsigned offset = at_emu_shared_address(p);
    if (rank >= ctx.cluster->blocks.size())
        fail("mapa to block rank %u of a cluster of %zu blocks", rank, ctx.cluster->blocks.size());
    return ctx.cluster->shared[rank] + offset;
}

#endif  // AT_EMU_IMPLEMENTATION
