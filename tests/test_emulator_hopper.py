"""The host emulator's Hopper pieces (tests/host_cuda/emulator.h: mbarriers, TMA 2D tile loads,
wgmma) against hand-written kernels, so that the sm_90a gemm's results on it can be trusted.

Each behaviour the PTX ISA and the driver's cuTensorMapEncodeTiled give them is checked against a
model written out here independently of the emulator's code (the swizzles chunk by chunk, the
accumulator fragment by the PTX ISA's formula), and each kernel has a mutation that must fail:
a wait left out, a count off by one, a descriptor field or an operand stage wrong. The kernels
call the hooks through templates/_wgmma.cuh, as the gemm template does."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from conftest import EXAMPLE, load_project
from host_cuda import CXX, TensorMapParam, launch_of, run_kernel

from hatch_autotune.runtime.tensor_map import tensor_map_args

pytestmark = pytest.mark.skipif(CXX is None, reason="needs g++ to build kernels for the host emulator")

ROOT = Path(__file__).resolve().parents[1]
PRELUDE = (
    "struct CUtensorMap_st {\n    alignas(64) unsigned long long opaque[16];\n};\n"
    "typedef struct CUtensorMap_st CUtensorMap;\n"
    + (ROOT / "templates" / "_wgmma.cuh").read_text()
    + (ROOT / "templates" / "_cluster.cuh").read_text()
)


@pytest.fixture(scope="module")
def emu_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("emulator_hopper")


def run(source: str, entry: str, params: list[Any], grid: int, block: int, workdir: Path, **kw: Any) -> None:
    run_kernel(PRELUDE + source, (), entry, params, grid, block, workdir=workdir, **kw)


def tmap(source: int, array: np.ndarray, box: tuple[int, int], swizzle: str = "none", oob_fill: str = "zero") -> TensorMapParam:
    """The map the runtime encodes for `array` (the kernel's parameter `source`), box outermost first."""
    decl = SimpleNamespace(array="x", swizzle=swizzle, l2_promotion="none", oob_fill=oob_fill, order="declared")
    strides = tuple(s // array.itemsize for s in array.strides)
    args = tensor_map_args("test map", decl, array.dtype.name, array.shape, strides, box)
    return TensorMapParam(source, args, array.itemsize)


# ---- mbarrier phases ----------------------------------------------------------------------------

PHASES = """
extern "C" __global__ void phases(int* out, int extra)
{
    __shared__ __align__(8) unsigned long long bar;
    const int t = threadIdx.x;
    if (t == 0)
        at_mbar_init(&bar, blockDim.x + extra);
    __syncthreads();
    out[4 * t] = at_emu_mbarrier_try_wait_parity(&bar, 1);      // phase 0 runs: the one before it counts as done
    out[4 * t + 1] = at_emu_mbarrier_try_wait_parity(&bar, 0);  // phase 0 not done
    __syncthreads();
    at_mbar_arrive(&bar);
    at_mbar_wait(&bar, 0);                                      // every thread arrived: phase 0 completes
    out[4 * t + 2] = at_emu_mbarrier_try_wait_parity(&bar, 1);  // phase 1 runs now
    __syncthreads();
    at_mbar_arrive(&bar);
    at_mbar_wait(&bar, 1);
    out[4 * t + 3] = at_emu_mbarrier_try_wait_parity(&bar, 1) + 2 * at_emu_mbarrier_try_wait_parity(&bar, 0);
}
"""


def test_mbarrier_phases_complete_on_the_expected_arrivals_and_flip_parity(emu_dir: Path) -> None:
    out = np.full(4 * 96, -1, np.int32)
    run(PHASES, "phases", [out, np.int32(0)], 1, 96, emu_dir)
    # after phase 1: phase 2 (parity 0) runs, so parity 1 reads done and parity 0 not
    np.testing.assert_array_equal(out.reshape(96, 4), np.tile([1, 0, 0, 1], (96, 1)))


def test_an_mbarrier_phase_missing_an_arrival_is_caught_by_the_watchdog(emu_dir: Path) -> None:
    out = np.zeros(4 * 64, np.int32)
    with pytest.raises(AssertionError, match=r"(?s)did not finish within .*64 on an mbarrier phase"):
        run(PHASES, "phases", [out, np.int32(1)], 1, 64, emu_dir, timeout_s=5)


def test_an_mbarrier_used_before_its_init_is_refused(emu_dir: Path) -> None:
    """Also in the second block, after the first initialised its own: a block starts with none."""
    source = PHASES.replace("at_mbar_init(&bar, blockDim.x + extra);", "if (blockIdx.x == 0) at_mbar_init(&bar, blockDim.x + extra);")
    with pytest.raises(AssertionError, match=r"never initialised.*block \(1,0,0\)"):
        run(source, "phases", [np.zeros(4 * 32, np.int32), np.int32(0)], 2, 32, emu_dir)


# ---- TMA tile loads -------------------------------------------------------------------------------

TILE = """
extern "C" __global__ void tile(const unsigned short* x, const __grid_constant__ CUtensorMap map, unsigned short* out,
                                int c0, int c1, int box_bytes, int expect, int dst_offset)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bar;
    if (threadIdx.x == 0) {
        at_mbar_init(&bar, 1);
        at_fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        at_mbar_arrive_expect_tx(&bar, expect);
        at_tma_load_2d(smem + dst_offset, &map, c0, c1, &bar);
    }
    at_mbar_wait(&bar, 0);
    const unsigned short* s = reinterpret_cast<const unsigned short*>(smem + dst_offset);
    for (int i = threadIdx.x; i < box_bytes / 2; i += blockDim.x)
        out[i] = s[i];
}
"""


def landed(x: np.ndarray, box: tuple[int, int], c0: int, c1: int, swizzle: int) -> np.ndarray:
    """The box's bytes in shared memory as 16-bit words: row r of the box (its elements from
    (c1 + r, c0), zeros out of bounds) at r * its bytes; under a swizzle of S bytes (the row S
    bytes: the driver's rule), the 16-byte chunk j of row r at chunk j ^ (the row's 128-byte line
    modulo the pattern's 8, 4 or 2 lines): 128B r % 8, 64B (r // 2) % 4, 32B (r // 4) % 2."""
    rows, cols = box
    row_bytes = 2 * cols
    out = np.zeros(rows * cols, np.uint16)
    for r in range(rows):
        for e in range(cols):
            y, xx = c1 + r, c0 + e
            v = x[y, xx] if 0 <= y < x.shape[0] and 0 <= xx < x.shape[1] else 0
            chunk, within = divmod(2 * e, 16)
            if swizzle:
                assert row_bytes == swizzle
                chunk ^= {128: r % 8, 64: (r // 2) % 4, 32: (r // 4) % 2}[swizzle]
            out[(r * row_bytes + 16 * chunk + within) // 2] = v
    return out


TILE_CASES = [  # (array shape, box outermost first, swizzle, (c0, c1))
    ((37, 48), (5, 16), "none", (-3, -2)),  # a corner before the array: zeros
    ((37, 48), (7, 24), "none", (40, 33)),  # past both edges
    ((20, 104), (16, 64), "128B", (0, 0)),
    ((20, 104), (16, 64), "128B", (56, 10)),  # past both edges, swizzled
    ((20, 104), (12, 64), "128B", (8, -5)),
    ((30, 40), (12, 32), "64B", (16, 3)),
    ((30, 40), (9, 16), "32B", (-8, 25)),
]


@pytest.mark.parametrize(("shape", "box", "swizzle", "at"), TILE_CASES)
def test_a_tma_box_lands_as_the_driver_lays_it_out(
    emu_dir: Path, shape: tuple[int, int], box: tuple[int, int], swizzle: str, at: tuple[int, int]
) -> None:
    x = np.arange(1, 1 + shape[0] * shape[1], dtype=np.uint16).reshape(shape)
    nbytes = 2 * box[0] * box[1]
    out = np.zeros(nbytes // 2, np.uint16)
    params = [x, tmap(0, x, box, swizzle), out, np.int32(at[0]), np.int32(at[1]), np.int32(nbytes), np.int32(nbytes), np.int32(0)]
    run(TILE, "tile", params, 1, 64, emu_dir, shared_bytes=nbytes)
    span = 0 if swizzle == "none" else int(swizzle[:-1])
    np.testing.assert_array_equal(out, landed(x, box, *at, span))


def test_a_tma_box_read_before_its_barrier_wait_is_poison(emu_dir: Path) -> None:
    """The box lands late (when a thread waits on its barrier): a read before the wait sees the
    0xff bytes the emulator writes at issue (NaN in a 16-bit float), not the data."""
    x = np.arange(16 * 64, dtype=np.uint16).reshape(16, 64)
    out = np.zeros(16 * 64, np.uint16)
    params = [x, tmap(0, x, (16, 64), "128B"), out, np.int32(0), np.int32(0), np.int32(2048), np.int32(2048), np.int32(0)]
    run(TILE.replace("at_mbar_wait(&bar, 0);", ""), "tile", params, 1, 32, emu_dir, shared_bytes=2048)
    assert (out == 0xFFFF).all()
    run(TILE, "tile", params, 1, 32, emu_dir, shared_bytes=2048)  # the kernel itself
    np.testing.assert_array_equal(out, landed(x, (16, 64), 0, 0, 128))


@pytest.mark.parametrize(
    ("expect", "offset", "error"),
    [
        (2048 - 16, 0, "completed 16 more bytes than were expected"),
        (2048 + 16, 0, "did not finish .*32 on an mbarrier phase"),  # the phase waits for bytes that never come
        (2048, 512, "not 1024-byte aligned"),  # a 128B-swizzled box must start on a 1024-byte boundary
    ],
    ids=["tx-short", "tx-long", "misaligned"],
)
def test_a_tma_load_with_a_wrong_byte_count_or_destination_fails(emu_dir: Path, expect: int, offset: int, error: str) -> None:
    x = np.arange(16 * 64, dtype=np.uint16).reshape(16, 64)
    out = np.zeros(16 * 64, np.uint16)
    params = [x, tmap(0, x, (16, 64), "128B"), out, np.int32(0), np.int32(0), np.int32(2048), np.int32(expect), np.int32(offset)]
    with pytest.raises(AssertionError, match=f"(?s){error}"):
        run(TILE, "tile", params, 1, 32, emu_dir, shared_bytes=4096, timeout_s=5)


def test_an_encoded_map_without_its_element_size_is_refused() -> None:
    """The emulator counts a TMA load's transaction bytes from the map's element size: a map
    packed without one would complete 0 bytes and hang its barrier, so it is refused at packing."""
    x = np.zeros((16, 64), np.uint16)
    args = tmap(0, x, (16, 64)).args
    with pytest.raises(ValueError, match="element size"):
        TensorMapParam(0, args).to_bytes()
    assert len(TensorMapParam(0, args, 2).to_bytes()) == 128 and TensorMapParam(0, None).to_bytes() == bytes(128)


def test_a_map_the_call_did_not_encode_is_refused(emu_dir: Path) -> None:
    """A variant whose map's `when` is false gets 128 zero bytes: a TMA load through it aborts."""
    x = np.arange(16 * 64, dtype=np.uint16).reshape(16, 64)
    params = [x, TensorMapParam(0, None), np.zeros(1024, np.uint16), *map(np.int32, (0, 0, 2048, 2048, 0))]
    with pytest.raises(AssertionError, match="not encoded"):
        run(TILE, "tile", params, 1, 32, emu_dir, shared_bytes=2048)


# ---- wgmma ----------------------------------------------------------------------------------------

NN = 24  # the MMA's n: a multiple of 8 that is not one of 16 (three 8-column blocks per thread)
WGMMA = """
#define NN 24
extern "C" __global__ void wg(const __nv_bfloat16* A, const __nv_bfloat16* W, const __grid_constant__ CUtensorMap a_map,
                              const __grid_constant__ CUtensorMap w_map, float* D, float* early)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    __shared__ __align__(8) unsigned long long bar;
    __nv_bfloat16* const As = reinterpret_cast<__nv_bfloat16*>(smem);               // 128 rows x 64, 128B swizzled
    __nv_bfloat16* const Ws = reinterpret_cast<__nv_bfloat16*>(smem + 128 * 128);   // NN rows x 64
    if (threadIdx.x == 0) {
        at_mbar_init(&bar, 1);
        at_fence_barrier_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        at_mbar_arrive_expect_tx(&bar, 128 * 128 + NN * 128);
        at_tma_load_2d(As, &a_map, 0, 0, &bar);
        at_tma_load_2d(Ws, &w_map, 0, 0, &bar);
    }
    at_mbar_wait(&bar, 0);
    const int g = threadIdx.x / 128, t = threadIdx.x % 128, lane = t % 32;
    float d[NN / 2];
    for (int i = 0; i < NN / 2; ++i)
        d[i] = 1000.0f;  // the first MMA (scale_d 0) ignores it
    at_wgmma_fence();
    for (int kk = 0; kk < 2; ++kk)
        at_emu_wgmma_m64k16(d, NN, at_smem_desc_k128(As + g * 64 * 64 + kk * 16), at_smem_desc_k128(Ws + kk * 16), kk > 0, true, 0, 0);
    at_wgmma_commit();
    for (int kk = 2; kk < 4; ++kk)  // a second group on the same accumulators: it chains on the first
        at_emu_wgmma_m64k16(d, NN, at_smem_desc_k128(As + g * 64 * 64 + kk * 16), at_smem_desc_k128(Ws + kk * 16), 1, true, 0, 0);
    at_wgmma_commit();
    early[threadIdx.x] = d[0];  // in flight: NaN
    at_wgmma_wait<1>();
    early[blockDim.x + threadIdx.x] = d[0];  // the first group retired, the second (on d) still in flight: NaN
    at_wgmma_wait<0>();
    for (int i = 0; i < NN / 2; ++i) {
        const int row = 64 * g + 16 * (t / 32) + lane / 4 + 8 * ((i % 4) / 2), col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
        D[row * NN + col] = d[i];
    }
}
"""


def wgmma_inputs() -> tuple[np.ndarray, np.ndarray]:
    """Small integers: every product and sum exact in float32, so the check is equality."""
    rng = np.random.default_rng(53)
    a = rng.integers(-4, 5, (128, 64)).astype(ml_dtypes.bfloat16)
    w = rng.integers(-4, 5, (NN, 64)).astype(ml_dtypes.bfloat16)
    return a, w


def run_wgmma(source: str, workdir: Path) -> tuple[np.ndarray, np.ndarray]:
    a, w = wgmma_inputs()
    d = np.full((128, NN), np.nan, np.float32)
    early = np.zeros(2 * 256, np.float32)
    params = [a, w, tmap(0, a, (128, 64), "128B"), tmap(1, w, (NN, 64), "128B"), d, early]
    run(source, "wg", params, 1, 256, workdir, shared_bytes=128 * 128 + NN * 128)
    return d, early


def test_wgmma_through_128b_swizzled_descriptors_gives_the_product_in_the_ptx_fragment(emu_dir: Path) -> None:
    """Two warpgroups, each D = A[its 64 rows] @ W.T over k = 64 (four k16 steps, the descriptor
    start 32 bytes further each), in two commit groups; the accumulators NaN until retired."""
    a, w = wgmma_inputs()
    d, early = run_wgmma(WGMMA, emu_dir)
    np.testing.assert_array_equal(d, a.astype(np.float32) @ w.astype(np.float32).T)
    assert np.isnan(early).all(), "accumulators read before their wait_group must not hold a value"


@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        ("at_wgmma_wait<0>();", "", None),  # accumulators never retired: NaN
        ("kk * 16), 1, true", "kk * 16), 0, true", None),  # the second group overwrites instead of accumulating
        (
            "As + g * 64 * 64 + kk * 16), at_smem_desc_k128(Ws + kk * 16), kk > 0",
            "As + g * 64 * 64 + kk * 8), at_smem_desc_k128(Ws + kk * 8), kk > 0",
            None,
        ),
        ("lane / 4 + 8 * ((i % 4) / 2), col", "lane / 4 + 8 * (i % 2), col", None),  # not the PTX ISA's fragment
        ("at_mbar_wait(&bar, 0);", "", None),  # the operands read before the boxes landed: NaN
        (
            "at_wgmma_commit();\n    early",
            "if (threadIdx.x == 0) As[1] = __float2bfloat16(77.0f);\n    at_wgmma_commit();\n    early",
            "overwritten before its wait_group",
        ),
        ("kk > 0, true, 0, 0);", "kk > 0, true, 1, 0);", "transposed operand"),
    ],
    ids=["no-wait", "scale-d", "k-step", "fragment", "no-tma-wait", "overwritten", "trans"],
)
def test_a_broken_wgmma_kernel_fails(emu_dir: Path, old: str, new: str, error: str | None) -> None:
    assert WGMMA.count(old) == 1, old
    a, w = wgmma_inputs()
    if error:
        with pytest.raises(AssertionError, match=error):
            run_wgmma(WGMMA.replace(old, new), emu_dir)
        return
    d, _ = run_wgmma(WGMMA.replace(old, new), emu_dir)
    assert not np.array_equal(d, a.astype(np.float32) @ w.astype(np.float32).T)


@pytest.mark.parametrize(
    ("sbo", "mode", "problem"),
    [(512, 1, "the 8-row groups' stride byte offset halved"), (1024, 2, "64B swizzling read where TMA wrote 128B")],
)
def test_a_wrong_descriptor_field_misses(emu_dir: Path, sbo: int, mode: int, problem: str) -> None:
    source = WGMMA.replace("at_smem_desc_k128(", "desc(")
    helper = f"""
__device__ unsigned long long desc(const void* p) {{
    return ((at_smem_addr(p) & 0x3FFFFull) >> 4) | (1ull << 16) | (({sbo}ull >> 4) << 32) | ({mode}ull << 62);
}}
"""
    a, w = wgmma_inputs()
    d, _ = run_wgmma(helper + source, emu_dir)
    assert not np.array_equal(d, a.astype(np.float32) @ w.astype(np.float32).T), problem
    ok = helper.replace(f"{sbo}ull", "1024ull").replace(f"{mode}ull << 62", "1ull << 62")
    d, _ = run_wgmma(ok + source, emu_dir)
    np.testing.assert_array_equal(d, a.astype(np.float32) @ w.astype(np.float32).T)


INTERLEAVE = """
extern "C" __global__ void wg0(const __nv_bfloat16* A, const __nv_bfloat16* W, float* D, int lbo, int sbo, int desc_lbo, int desc_sbo)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    // the canonical K-major layout without swizzle: 8 x 16-byte core matrices, SBO apart along the
    // rows (M or N), LBO apart along k; A (64 x 16) from 0, W (NN x 16) from 4096
    for (int i = threadIdx.x; i < 64 * 16 + NN * 16; i += blockDim.x) {
        const bool is_a = i < 64 * 16;
        const int j = is_a ? i : i - 64 * 16, r = j / 16, k = j % 16;
        const size_t off = (is_a ? 0 : 4096) + (r / 8) * sbo + (k / 8) * lbo + (r % 8) * 16 + (k % 8) * 2;
        *reinterpret_cast<__nv_bfloat16*>(smem + off) = is_a ? A[j] : W[j];
    }
    __syncthreads();
    const int t = threadIdx.x, lane = t % 32;
    float d[NN / 2];
    const unsigned long long fields = ((unsigned long long)(desc_lbo >> 4) << 16) | ((unsigned long long)(desc_sbo >> 4) << 32);
    at_wgmma_fence();
    at_emu_wgmma_m64k16(d, NN, fields | (at_smem_addr(smem) >> 4), fields | (at_smem_addr(smem + 4096) >> 4), 0, true, 0, 0);
    at_wgmma_commit();
    at_wgmma_wait<0>();
    for (int i = 0; i < NN / 2; ++i)
        D[(16 * (t / 32) + lane / 4 + 8 * ((i % 4) / 2)) * NN + 8 * (i / 4) + 2 * (lane % 4) + (i % 2)] = d[i];
}
"""


def test_wgmma_reads_the_unswizzled_core_matrix_layout_through_lbo_and_sbo(emu_dir: Path) -> None:
    rng = np.random.default_rng(8)
    a = rng.integers(-4, 5, (64, 16)).astype(ml_dtypes.bfloat16)
    w = rng.integers(-4, 5, (NN, 16)).astype(ml_dtypes.bfloat16)
    source = "#define NN 24\n" + INTERLEAVE
    expected = a.astype(np.float32) @ w.astype(np.float32).T
    for lbo, sbo in ((128, 256), (1024, 128)):
        d = np.full((64, NN), np.nan, np.float32)
        run(source, "wg0", [a, w, d, *map(np.int32, (lbo, sbo, lbo, sbo))], 1, 128, emu_dir, shared_bytes=8192)
        np.testing.assert_array_equal(d, expected)
    # a descriptor with LBO and SBO swapped from the layout the kernel wrote: another matrix
    d = np.full((64, NN), np.nan, np.float32)
    run(source, "wg0", [a, w, d, *map(np.int32, (128, 256, 256, 128))], 1, 128, emu_dir, shared_bytes=8192)
    assert not np.array_equal(d, expected)


# ---- thread-block clusters ------------------------------------------------------------------------

CLUSTER = """
extern "C" __global__ void csum(const float* x, float* out, unsigned* where, int bad_rank)
{
    extern __shared__ __align__(16) float part[];
    const unsigned rank = at_cluster_rank(), size = at_cluster_size();
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int t = threadIdx.x, i = 2 * (block * blockDim.x + t);
    part[2 * t] = x[i];
    part[2 * t + 1] = x[i + 1];
    if (t == 0) {
        where[2 * block] = rank;
        where[2 * block + 1] = size;
    }
    at_cluster_sync();  // every block's part is written
    float2 s = make_float2(0.0f, 0.0f);
    for (unsigned r = 0; r < size + bad_rank; ++r) {
        const float2 v = at_cluster_ld_f32x2(part + 2 * t, r);
        s.x += v.x;
        s.y += v.y;
    }
    out[i] = s.x;
    out[i + 1] = s.y;
    at_cluster_sync();  // no block leaves while another reads its part
}
"""


def cluster_model(x: np.ndarray, grid: tuple[int, int, int], cluster: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """What CUDA gives: block (bx, by, bz) is rank (bx % cx) + cx ((by % cy) + cy (bz % cz)) of the
    cluster (bx // cx, by // cy, bz // cz); every block's out is the sum of its cluster's x."""
    gx, gy, gz = grid
    cx, cy, cz = cluster
    out, where = np.zeros_like(x), np.zeros((gx * gy * gz, 2), np.uint32)
    for bz, by, bx in np.ndindex(gz, gy, gx):
        b = bx + gx * (by + gy * bz)
        where[b] = (bx % cx + cx * (by % cy + cy * (bz % cz)), cx * cy * cz)
        for oz, oy, ox in np.ndindex(cz, cy, cx):
            o = bx // cx * cx + ox + gx * (by // cy * cy + oy + gy * (bz // cz * cz + oz))
            out[b] += x[o]
    return out, where


@pytest.mark.parametrize(
    ("grid", "cluster"), [((8, 1, 1), (4, 1, 1)), ((4, 2, 2), (2, 2, 1)), ((2, 2, 2), (1, 1, 2)), ((3, 1, 1), (1, 1, 1))]
)
def test_a_clusters_blocks_run_together_and_read_each_others_shared_memory(
    emu_dir: Path, grid: tuple[int, int, int], cluster: tuple[int, int, int]
) -> None:
    threads = 32
    blocks = grid[0] * grid[1] * grid[2]
    x = np.random.default_rng(2).standard_normal((blocks, 2 * threads)).astype(np.float32)
    out = np.full_like(x, np.nan)
    where = np.zeros((blocks, 2), np.uint32)
    run(CLUSTER, "csum", [x, out, where, np.int32(0)], grid, threads, emu_dir, shared_bytes=8 * threads, cluster=cluster)
    want, want_where = cluster_model(x, grid, cluster)
    np.testing.assert_array_equal(where, want_where)
    np.testing.assert_allclose(out, want, rtol=1e-6)


@pytest.mark.parametrize(
    ("grid", "cluster", "bad_rank", "error"),
    [
        ((6, 1, 1), (4, 1, 1), 0, "each grid dimension must be a multiple of the cluster's"),
        ((16, 1, 1), (16, 1, 1), 0, "1 to 8"),
        ((4, 1, 1), (2, 1, 1), 1, "mapa to block rank 2 of a cluster of 2 blocks"),
    ],
    ids=["grid", "size", "rank"],
)
def test_a_bad_cluster_launch_or_rank_is_refused(
    emu_dir: Path, grid: tuple[int, int, int], cluster: tuple[int, int, int], bad_rank: int, error: str
) -> None:
    x = np.zeros((grid[0], 64), np.float32)
    params = [x, np.zeros_like(x), np.zeros((grid[0], 2), np.uint32), np.int32(bad_rank)]
    with pytest.raises(AssertionError, match=error):
        run(CLUSTER, "csum", params, grid, 32, emu_dir, shared_bytes=256, cluster=cluster)


# ---- host_cuda: tensor-map arguments of a declared kernel -----------------------------------------


def test_launch_of_encodes_a_map_only_where_its_when_holds_and_in_memory_order() -> None:
    """gemm's A_map and B_map: zeros for an mma.sync variant (WGMMA = 0: `when` false); for a
    wgmma variant the runtime's arguments, B = W.T (strides (1, k)) in memory order: dims
    innermost first (k, n), box (BK, BN), the outer stride k elements."""
    spec = load_project(EXAMPLE).kernels["gemm"]
    types = {"T": "bfloat16", "A_unit_stride": True, "B_unit_stride": False}
    m, n, k = 70, 40, 96
    a = np.zeros((m, k), ml_dtypes.bfloat16)
    b = np.asfortranarray(np.zeros((k, n), ml_dtypes.bfloat16))
    args = {"A": a, "B": b, "C": np.zeros((m, n), ml_dtypes.bfloat16)}
    names = [x.name for x in spec.args]
    config = {**spec.default, "WGMMA": 1, "BM": 64, "BN": 64, "BK": 64, "WM": 64, "WN": 64, "STAGES": 3}
    wg = dict(zip(names, launch_of(spec, types, config, args)[0]))
    assert wg["A_map"].source == names.index("A") and wg["B_map"].source == names.index("B")
    assert wg["A_map"].args[:5] == ("BFLOAT16", 2, (k, m), (2 * k,), (64, 64))
    assert wg["B_map"].args[:5] == ("BFLOAT16", 2, (k, n), (2 * k,), (64, 64))
    assert wg["B_map"].args[5] == "128B"
    packed = wg["B_map"].to_bytes()
    assert len(packed) == 128 and packed[:4] == b"TMAP"
    mma = dict(zip(names, launch_of(spec, types, {**spec.default, "WGMMA": 0}, args)[0]))
    assert mma["A_map"].args is None and mma["B_map"].to_bytes() == bytes(128)
