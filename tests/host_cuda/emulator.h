// emulator.h - runs CUDA kernel source on the CPU, for tests on machines without a GPU.
//
// Why: the kernels' results (and their barriers, shuffles and cp.async pipelines) must be
// checked in CI, which has no GPU. Each thread of a block is a real OS thread, so a missing
// __syncthreads or a stage read before its copy landed shows as a wrong result, a hang (caught
// by a watchdog) or an abort with a message, and the tests' AddressSanitizer build reports
// out-of-bounds accesses to global arrays and to static __shared__ arrays.
//
// Model: blocks run one at a time (so `__shared__` can be `static`); the block's threads run
// concurrently; warps are 32 consecutive linear thread ids. A thread that returns leaves its
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
extern unsigned char* dynamic_shared_ptr;  // the block's dynamic shared memory (extern __shared__)

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

// Run fn(arg) on every thread of every block of the grid; blocks one at a time, in order. A block
// that does not finish within block_timeout_s (a barrier not every live thread reaches) ends the
// program with a message (exit 87).
void launch_raw(void (*fn)(void*), void* arg, dim3 grid, dim3 block, size_t shared_bytes, double block_timeout_s);

template <class F>
void launch(F&& kernel, dim3 grid, dim3 block, size_t shared_bytes = 0, double block_timeout_s = 60.0) {
    using K = std::remove_reference_t<F>;
    launch_raw([](void* k) { (*static_cast<K*>(k))(); }, const_cast<void*>(static_cast<const void*>(&kernel)), grid, block,
               shared_bytes, block_timeout_s);
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

#endif  // AT_EMULATOR_H

// =============================================================================================
// The runtime: in one translation unit only.
// =============================================================================================
#if defined(AT_EMU_IMPLEMENTATION) && !defined(AT_EMU_IMPLEMENTED)
#define AT_EMU_IMPLEMENTED


namespace at_emu {

CopyMode copy_mode = CopyMode::deferred;
unsigned char* dynamic_shared_ptr = nullptr;

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

enum ThreadState : int { running = 0, at_syncthreads = 1, at_warp_op = 2, exited = 3 };

struct Block {
    explicit Block(int n) : bar(n), state(n) {
        for (int w = 0; w * 32 < n; ++w)
            warps.push_back(std::make_unique<Warp>(std::min(32, n - w * 32)));
    }
    std::barrier<> bar;
    std::vector<std::unique_ptr<Warp>> warps;
    std::vector<std::atomic<int>> state;
};

struct Copy {
    void* dst;
    const void* src;
    int cp_bytes, src_bytes;
};

struct ThreadCtx {
    Block* block = nullptr;
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
    Block* block = nullptr;
    uint3 bidx{};
    dim3 bdim, gdim;
    void (*fn)(void*) = nullptr;
    void* arg = nullptr;
};

// A pool thread: runs linear thread `linear` of each block the launcher starts.
void run_thread(LaunchState& s, int linear) {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(s.m);
            s.start_cv.wait(lk, [&] { return s.stop || s.generation != seen; });
            if (s.stop)
                return;
            seen = s.generation;
        }
        Block& b = *s.block;
        blockIdx = s.bidx;
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
        // Leave the barriers as an exited GPU thread does: the others no longer wait for it.
        b.state[linear].store(exited);
        b.warps[ctx.warp]->bar.arrive_and_drop();
        b.bar.arrive_and_drop();
        ctx.block = nullptr;
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

void launch_raw(void (*fn)(void*), void* arg, dim3 grid, dim3 block, size_t shared_bytes, double block_timeout_s) {
    const long long n = (long long)block.x * block.y * block.z;
    if (n <= 0 || n > 1024)
        fail("a block of %u x %u x %u threads: CUDA allows 1 to 1024", block.x, block.y, block.z);
    if (shared_bytes)  // exactly the size asked for: ASan reports an access past it
        dynamic_shared_ptr = static_cast<unsigned char*>(::operator new[](shared_bytes, std::align_val_t(128)));
    LaunchState s;
    s.fn = fn;
    s.arg = arg;
    s.bdim = block;
    s.gdim = grid;
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (int i = 0; i < n; ++i)
        threads.emplace_back(run_thread, std::ref(s), i);
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                if (shared_bytes)
                    std::memset(dynamic_shared_ptr, 0xff, shared_bytes);  // undefined on a GPU: NaN here
                Block b((int)n);
                std::unique_lock<std::mutex> lk(s.m);
                s.block = &b;
                s.bidx = uint3{bx, by, bz};
                s.remaining = (int)n;
                ++s.generation;
                s.start_cv.notify_all();
                const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(block_timeout_s);
                if (!s.done_cv.wait_until(lk, deadline, [&] { return s.remaining == 0; })) {
                    int counts[4] = {0, 0, 0, 0};
                    for (int i = 0; i < n; ++i)
                        counts[b.state[i].load()]++;
                    std::fprintf(stderr,
                                 "at_emu error: block (%u,%u,%u) of a %u x %u x %u grid did not finish within %.1f s (a hang?): of its %lld "
                                 "threads, %d wait in __syncthreads, %d in a warp operation, %d run, %d have returned. A barrier "
                                 "that not every live thread reaches?\n",
                                 bx, by, bz, grid.x, grid.y, grid.z, block_timeout_s, n, counts[at_syncthreads], counts[at_warp_op],
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
    if (shared_bytes) {
        ::operator delete[](dynamic_shared_ptr, std::align_val_t(128));
        dynamic_shared_ptr = nullptr;
    }
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

#endif  // AT_EMU_IMPLEMENTATION
