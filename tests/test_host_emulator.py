"""The host emulator (tests/host_cuda): small hand-written kernels show that its barriers,
shuffles, early exits, cp.async modes, sanitizers, hang guard and f16 conversions behave as a
GPU would, so that the templates' results on it (checked here against NumPy) can be trusted."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import EXAMPLE, load_project
from host_cuda import CXX, run_kernel, run_variant

pytestmark = pytest.mark.skipif(CXX is None, reason="needs g++ to build kernels for the host emulator")


@pytest.fixture(scope="session")
def emu_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("host_emulator")


def run(source, entry, params, grid, block, workdir, **kw):
    run_kernel(source, (), entry, params, grid, block, workdir=workdir, **kw)


# ---- barriers ------------------------------------------------------------------------------------

NEIGHBOUR = """
extern "C" __global__ void neighbour(const float* x, float* y, int n)
{
    __shared__ float sm[96];
    const int t = threadIdx.x, i = blockIdx.x * 96 + t;
    sm[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) y[i] = sm[(t + 1) % 96] + 1000.0f * blockIdx.x;
}
"""


def neighbour_expected(x):
    n = x.size
    xp = np.zeros(-(-n // 96) * 96, np.float32)
    xp[:n] = x
    blocks = xp.reshape(-1, 96)
    return (np.roll(blocks, -1, axis=1) + 1000.0 * np.arange(len(blocks))[:, None]).astype(np.float32).ravel()[:n]


def test_threads_see_each_others_shared_writes_after_a_barrier(emu_dir):
    x = np.arange(250, dtype=np.float32) * 0.5
    y = np.full(250, np.nan, np.float32)
    run(NEIGHBOUR, "neighbour", [x, y, np.int32(250)], 3, 96, emu_dir)
    np.testing.assert_array_equal(y, neighbour_expected(x))


EARLY_EXIT = """
extern "C" __global__ void early(const float* x, float* y, int live)
{
    __shared__ float sm[128];
    const int t = threadIdx.x;
    if (t >= live) return;  // before the barrier: the others must not wait for these threads
    sm[t] = x[blockIdx.x * 128 + t];
    __syncthreads();
    const float v = sm[(t + 1) % live];
    __syncthreads();
    y[blockIdx.x * 128 + t] = v;
}
"""


@pytest.mark.parametrize("live", [40, 64, 1])
def test_threads_that_return_early_do_not_hold_up_a_barrier(emu_dir, live):
    x = np.arange(256, dtype=np.float32)
    y = np.zeros(256, np.float32)
    run(EARLY_EXIT, "early", [x, y, np.int32(live)], 2, 128, emu_dir, timeout_s=30)
    expected = np.zeros(256, np.float32)
    for b in range(2):
        idx = np.arange(live)
        expected[b * 128 + idx] = x[b * 128 + (idx + 1) % live]
    np.testing.assert_array_equal(y, expected)


HANG = """
extern "C" __global__ void hang(float* y)
{
    // lanes 0-15 wait for their warp, lanes 16-31 for the block: neither barrier completes
    if (threadIdx.x < 16) __syncwarp();
    else __syncthreads();
    y[threadIdx.x] = 1.0f;
}
"""


def test_a_barrier_not_reached_by_every_thread_fails_within_the_timeout(emu_dir):
    import time

    y = np.zeros(64, np.float32)
    start = time.monotonic()
    with pytest.raises(AssertionError, match=r"(?s)kernel hang .*did not finish within .*a hang.*wait in __syncthreads"):
        run(HANG, "hang", [y], 1, 64, emu_dir, timeout_s=5)
    assert time.monotonic() - start < 30


# ---- cp.async ------------------------------------------------------------------------------------

STAGE = """
extern "C" __global__ void stage(const float* x, float* y, int n)
{
    __shared__ __align__(16) float buf[128];
    const int t = threadIdx.x;
    const int i = blockIdx.x * 128 + t * 4;
    const int valid = max(0, min(4, n - i));
    at_emu_cp_async(&buf[t * 4], valid ? x + i : x, 16, valid * 4);  // zero-fills past n
    at_emu_cp_async_commit();
    WAIT
    __syncthreads();
    const int src = ((t + 1) % 32) * 4;  // a neighbour's copy: visible after wait + barrier
    for (int j = 0; j < 4; ++j)
        if (i + j < n) y[i + j] = buf[src + j] + (src + j + blockIdx.x * 128 >= n ? 100.0f : 0.0f);
}
"""


def stage_source(wait: bool) -> str:
    return STAGE.replace("WAIT", "at_emu_cp_async_wait(0);" if wait else "")


def stage_expected(x):
    n = x.size
    blocks = -(-n // 128)
    xp = np.zeros(blocks * 128, np.float32)
    xp[:n] = x
    b = xp.reshape(blocks, 32, 4)
    out = np.roll(b, -1, axis=1).ravel()
    pos = np.roll(np.arange(blocks * 128).reshape(blocks, 32, 4), -1, axis=1).ravel()
    return (out + np.where(pos >= n, 100.0, 0.0)).astype(np.float32)[:n]


@pytest.mark.parametrize("mode", ["deferred", "immediate"])
def test_a_stage_read_after_its_wait_is_right_in_both_modes(emu_dir, mode):
    x = np.arange(1, 231, dtype=np.float32)
    y = np.zeros(230, np.float32)
    run(stage_source(True), "stage", [x, y, np.int32(230)], 2, 32, emu_dir, mode=mode)
    np.testing.assert_array_equal(y, stage_expected(x))


def test_a_stage_read_before_its_wait_is_wrong_in_deferred_mode(emu_dir):
    x = np.arange(1, 231, dtype=np.float32)
    y = np.zeros(230, np.float32)
    run(stage_source(False), "stage", [x, y, np.int32(230)], 2, 32, emu_dir, mode="deferred")
    assert np.isnan(y).all()  # the copies had not landed: the destination holds the poison
    run(stage_source(False), "stage", [x, y, np.int32(230)], 2, 32, emu_dir, mode="immediate")
    np.testing.assert_array_equal(y, stage_expected(x))  # immediate copies hide that bug


GROUPS = """
extern "C" __global__ void groups(const float* x, float* y)
{
    __shared__ __align__(16) float a[32], b[32];
    const int t = threadIdx.x;
    at_emu_cp_async(&a[t], x + t, 4, 4);
    at_emu_cp_async_commit();
    at_emu_cp_async(&b[t], x + 32 + t, 4, 4);
    at_emu_cp_async_commit();
    at_emu_cp_async_wait(1);  // the older group has landed, the newer one may not have
    y[t] = a[t];
    y[32 + t] = b[t];
    at_emu_cp_async_wait(0);
    y[64 + t] = b[t];
}
"""


def test_a_wait_retires_all_but_the_newest_groups(emu_dir):
    x = np.arange(64, dtype=np.float32)
    y = np.zeros(96, np.float32)
    run(GROUPS, "groups", [x, y], 1, 32, emu_dir)
    np.testing.assert_array_equal(y[:32], x[:32])
    assert np.isnan(y[32:64]).all()
    np.testing.assert_array_equal(y[64:], x[32:])


MISUSE = """
extern "C" __global__ void misuse(const float* x, float* y)
{
    __shared__ __align__(16) float a[64];
    const int t = threadIdx.x;
#if UNALIGNED
    at_emu_cp_async(&a[t * 2 + 1], x, 16, 16);
#else
    at_emu_cp_async(&a[t], x + t, 4, 4);  // never committed
#endif
    y[t] = 0.0f;
}
"""


@pytest.mark.parametrize(
    "unaligned, message",
    [(True, "cp.async of 16 bytes to shared address .* not aligned to 16 bytes"), (False, "never committed")],
)
def test_cp_async_misuse_aborts_with_a_message(emu_dir, unaligned, message):
    source = f"#define UNALIGNED {int(unaligned)}\n" + MISUSE
    with pytest.raises(AssertionError, match=f"(?s)kernel misuse .*emulator check failed.*{message}"):
        run(source, "misuse", [np.zeros(64, np.float32), np.zeros(32, np.float32)], 1, 32, emu_dir)


# ---- warp shuffles -------------------------------------------------------------------------------

SHUFFLES = """
extern "C" __global__ void shuffles(float* sums, int* down, int* up, int* bcast, unsigned* ballot)
{
    const int t = threadIdx.x, lane = t % 32;
    float v = (float)t;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    sums[t] = v;
    down[t] = __shfl_down_sync(0xffffffffu, t, 3);
    up[t] = __shfl_up_sync(0xffffffffu, t, 5);
    bcast[t] = __shfl_sync(0xffffffffu, t * 10, 7);
    ballot[t] = __ballot_sync(0xffffffffu, lane % 3 == 0);
}
"""


def test_warp_shuffles_over_three_warps(emu_dir):
    n = 96
    sums, down, up, bcast, ballot = np.zeros(n, np.float32), *(np.zeros(n, np.int32) for _ in range(3)), np.zeros(n, np.uint32)
    run(SHUFFLES, "shuffles", [sums, down, up, bcast, ballot], 1, n, emu_dir)
    t = np.arange(n)
    lane, warp = t % 32, t // 32
    np.testing.assert_array_equal(sums, [sum(range(w * 32, w * 32 + 32)) for w in warp])
    np.testing.assert_array_equal(down, np.where(lane + 3 < 32, t + 3, t))
    np.testing.assert_array_equal(up, np.where(lane >= 5, t - 5, t))
    np.testing.assert_array_equal(bcast, (warp * 32 + 7) * 10)
    assert (ballot == sum(1 << i for i in range(0, 32, 3))).all()


BAD_SHUFFLE = """
extern "C" __global__ void bad_shuffle(float* y)
{
    const int t = threadIdx.x;
#if EXITED
    if (t % 32 >= 16) return;
    y[t] = __shfl_xor_sync(0xffffffffu, (float)t, 16);  // reads a lane that has returned
#else
    y[t] = __shfl_xor_sync(0x0000ffffu, (float)t, 1);  // every lane calls, the mask names half
#endif
}
"""


@pytest.mark.parametrize(
    "exited, message",
    [
        (False, r"__shfl_xor_sync with mask 0x0000ffff, but the live lanes of warp 0 are 0xffffffff"),
        (True, r"__shfl_xor_sync in lane \d+ reads lane \d+ of warp 0, which has exited"),
    ],
)
def test_a_shuffle_with_a_partial_mask_or_an_exited_source_aborts(emu_dir, exited, message):
    source = f"#define EXITED {int(exited)}\n" + BAD_SHUFFLE
    with pytest.raises(AssertionError, match=f"(?s)kernel bad_shuffle .*emulator check failed.*{message}"):
        run(source, "bad_shuffle", [np.zeros(32, np.float32)], 1, 32, emu_dir)


# ---- AddressSanitizer ----------------------------------------------------------------------------

OVERFLOW = """
extern "C" __global__ void overflow(const float* x, float* y, int n)
{
    __shared__ float sm[32];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
#if SHARED
    float* volatile p = sm;  // opaque: UBSan's bounds and object-size checks would report it first
    p[threadIdx.x + 1] = 1.0f;  // one past the static shared array
#else
    if (i <= n) y[i] = x[i < n ? i : 0];  // i == n: one past y
#endif
    (void)sm;
}
"""


@pytest.mark.parametrize("shared, report", [(False, "heap-buffer-overflow"), (True, "global-buffer-overflow")])
def test_an_access_one_past_an_array_is_reported(emu_dir, shared, report):
    source = f"#define SHARED {int(shared)}\n" + OVERFLOW
    with pytest.raises(AssertionError, match=f"(?s)kernel overflow .*AddressSanitizer: {report}"):
        run(source, "overflow", [np.zeros(50, np.float32), np.zeros(50, np.float32), np.int32(50)], 2, 32, emu_dir)


DYNAMIC = """
extern "C" __global__ void dynamic(const float* x, float* y, int past)
{
    extern __shared__ __align__(16) float dyn[];  // blockDim.x floats, from the launch
    const int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    dyn[t] = x[i];
    __syncthreads();
    y[i] = dyn[(t + 1) % blockDim.x] + (past ? dyn[blockDim.x] : 0.0f);
}
"""


@pytest.mark.parametrize("past", [False, True])
def test_dynamic_shared_memory_has_the_launchs_size(emu_dir, past):
    x = np.arange(128, dtype=np.float32)
    y = np.zeros(128, np.float32)
    call = lambda: run(DYNAMIC, "dynamic", [x, y, np.int32(past)], 2, 64, emu_dir, shared_bytes=64 * 4)  # noqa: E731
    if past:
        with pytest.raises(AssertionError, match="AddressSanitizer: heap-buffer-overflow"):
            call()
    else:
        call()
        np.testing.assert_array_equal(y, np.roll(x.reshape(2, 64), -1, axis=1).ravel())


# ---- float16 conversions -------------------------------------------------------------------------

F16 = """
extern "C" __global__ void f16(const float* x, unsigned short* h, const unsigned short* bits, float* back, int n, int m)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        h[i] = at_emu_f32_to_f16_rn(x[i]);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < m; i += gridDim.x * blockDim.x)
        back[i] = at_emu_f16_to_f32(bits[i]);
}
"""


def f16_cases() -> np.ndarray:
    rng = np.random.default_rng(7)
    halves = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)  # every finite f16 >= 0
    ties = (halves[:-1] + halves[1:]) / 2  # exact midpoints: round half to even
    cases = [
        rng.standard_normal(1500) * 10.0 ** rng.integers(-9, 6, 1500),
        rng.choice(ties, 1500),
        rng.choice(halves, 300) * (1 + rng.uniform(-1e-4, 1e-4, 300)),
        rng.uniform(0, 2.0**-14, 500),  # subnormals
        [0.0, 2.0**-25, 2.0**-24, 1.5 * 2.0**-24, 2.0**-26, 6.1e-5, 65504, 65519.99, 65520, 65536, 1e10, np.inf, np.nan, 2.0**-14],
    ]
    x = np.concatenate([np.asarray(c, np.float64) for c in cases]).astype(np.float32)
    return np.concatenate([x, -x])


def test_f16_conversions_match_numpy(emu_dir):
    x = f16_cases()
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    h, back = np.zeros(x.size, np.uint16), np.zeros(bits.size, np.float32)
    run(F16, "f16", [x, h, bits, back, np.int32(x.size), np.int32(bits.size)], 8, 128, emu_dir)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(h[~nan], want.view(np.uint16)[~nan])
    assert (h[nan] & 0x7FFF == 0x7FFF).all()  # the GPU's canonical NaN
    ref = bits.view(np.float16).astype(np.float32)
    fin = ~np.isnan(ref)
    np.testing.assert_array_equal(back.view(np.uint32)[fin], ref.view(np.uint32)[fin])  # bit exact, -0 included
    assert np.isnan(back[~fin]).all()


# ---- the example package's templates ---------------------------------------------------------------


@pytest.fixture(scope="module")
def example():
    return load_project(EXAMPLE).kernels


@pytest.mark.parametrize(
    "dtype, n, config",
    [
        ("float32", 1001, {"BLOCK": 64, "VEC": 4, "ITEMS": 2}),
        ("float32", 1000, {"BLOCK": 128, "VEC": 1, "ITEMS": 4}),
        ("float16", 999, {"BLOCK": 64, "VEC": 4, "ITEMS": 1}),
        ("float16", 37, {"BLOCK": 32, "VEC": 8, "ITEMS": 1}),
    ],
)
def test_saxpy_matches_numpy(emu_dir, example, dtype, n, config):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(dtype)
    y = rng.standard_normal(n).astype(dtype)
    a = np.float32(1.75)
    expected = (a * x.astype(np.float32) + y.astype(np.float32)).astype(dtype)  # float math, one rounding to T
    run_variant(example["saxpy"], {"T": dtype}, config, {"a": a, "x": x, "y": y}, workdir=emu_dir)
    np.testing.assert_array_equal(y, expected)


@pytest.mark.parametrize(
    "rows, cols, config",
    [
        (5, 1000, {"BLOCK": 128, "VEC": 4, "ITEMS": 2, "ROWS": 1}),  # two passes
        (5, 77, {"BLOCK": 64, "VEC": 1, "ITEMS": 4, "ROWS": 2}),  # one pass, a group past the last row
    ],
)
def test_row_softmax_matches_numpy(emu_dir, example, rows, cols, config):
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
    x[0, 3] = -np.inf
    y = np.full_like(x, np.nan)
    run_variant(example["row_softmax"], {}, config, {"x": x, "y": y}, workdir=emu_dir)
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=2e-6, atol=1e-9)


def test_sgemm_matches_numpy(emu_dir, example):
    """A smoke test of the cp.async pipeline template; tests of its own sweep its configs."""
    m, n, k = 70, 45, 37
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    C = np.full((m, n), np.nan, np.float32)
    config = {"BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32, "TM": 4, "TN": 8, "STAGES": 3, "UNROLL": 4, "SPLITK": 1}
    run_variant(example["sgemm"], {}, config, {"A": A, "B": B, "C": C}, workdir=emu_dir)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)
