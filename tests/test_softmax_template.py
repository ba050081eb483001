"""templates/row_softmax.cu.j2 as example_pkg declares it, without a GPU.

Every config of the declared space is compiled by NVRTC (as the build does) for sm_80 and sm_90
and must use no local memory: the one-pass branch holds a row in registers, and a spill would
put it back in DRAM. A representative set of configs runs on the host emulator
(tests/host_cuda.py: real threads, barriers, shuffles, AddressSanitizer) at odd sizes against
NumPy, covering both branches (one DRAM pass, two passes), both kinds of access (vector, scalar),
every VEC and ROWS > 1 with idle groups in the last block.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import EXAMPLE, load_project, space_problems

from hatch_autotune.compile.render import render_config

ARCHS = ("sm_80", "sm_90")


@pytest.fixture(scope="module")
def spec():
    return load_project(EXAMPLE).kernels["row_softmax"]


def test_space_is_small_and_legal(spec):
    configs = spec.configs({})
    assert 50 <= len(configs) <= 150  # what a tuning run can afford per bucket
    assert dict(spec.default) in configs
    for c in configs:
        group = c["BLOCK"] // c["ROWS"]
        assert group % 32 == 0 and c["BLOCK"] % c["ROWS"] == 0 and c["BLOCK"] <= 1024
        assert c["VEC"] * c["ITEMS"] <= 32
    assert {c["VEC"] for c in configs} == {1, 2, 4}
    assert {c["ROWS"] for c in configs} == {1, 2, 4, 8}


def test_every_config_compiles_without_local_memory(spec, session_cache):
    problems = space_problems(spec, session_cache, ARCHS)
    assert not problems, "\n".join(problems)


# ---- correctness on the host emulator -------------------------------------------------------

# (BLOCK, VEC, ITEMS, ROWS): group threads (BLOCK // ROWS) x VEC x ITEMS floats of a row fit in
# registers; longer rows take the two-pass branch.
CONFIGS = [
    (32, 4, 1, 1),  # one warp, 128 floats
    (256, 2, 2, 8),  # 8 one-warp groups, 128 floats: rows=5 leaves 3 groups idle
    (128, 1, 8, 2),  # 2 two-warp groups (shared-memory reduction per group), 512 floats
    (64, 4, 2, 2),  # 2 one-warp groups, 256 floats
    (256, 4, 1, 1),  # 8 warps, 1024 floats
]
COLS = (1, 37, 128, 130, 1000)
ROWS_N = 5

WRAPPER = """
// Test entry: the kernel on x + shift, y + shift (a view that starts `shift` elements in).
extern "C" __global__ void softmax_shifted(const float* x, float* y, int rows, int cols, int shift)
{
    {entry}(x + shift, y + shift, rows, cols);
}
"""


def branch(config: tuple[int, int, int, int], cols: int, shift: int) -> tuple[str, str]:
    """The template's choice for a launch: (pass, access); arrays are 256-byte aligned."""
    block, vec, items, rows = config
    one = "one" if cols <= block // rows * vec * items else "two"
    vector = vec > 1 and cols % vec == 0 and (4 * shift) % (4 * vec) == 0
    return one, "vector" if vector else "scalar"


CASES = [(c, cols, shift) for c in CONFIGS for cols in COLS for shift in (0, 1)]


def test_cases_cover_every_branch():
    seen = {(c[1], *branch(c, cols, shift)) for c, cols, shift in CASES}
    for vec in (2, 4):
        assert {(vec, p, a) for p in ("one", "two") for a in ("vector", "scalar")} <= seen
    assert {(1, p, "scalar") for p in ("one", "two")} <= seen
    assert {c[3] for c in CONFIGS} == {1, 2, 8}


def softmax_inputs(rows: int, cols: int, seed: int) -> np.ndarray:
    """Random rows, then the awkward ones: -inf entries, an all -inf row, a NaN, large values."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 4).astype(np.float32)
    some = rng.random(cols) < 0.3
    some[0] = False  # row 1 keeps a finite entry
    x[1, some] = -np.inf
    x[2, :] = -np.inf
    x[3, rng.integers(cols)] = np.nan
    x[4, :] = rng.uniform(1e4, 3e4, cols).astype(np.float32)
    if cols > 1:
        x[4, rng.integers(cols)] = -np.inf
    return x


def softmax_reference(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


@pytest.fixture(scope="module")
def host_cuda():
    if shutil.which("g++") is None:
        pytest.skip("the host emulator needs g++")
    return pytest.importorskip("host_cuda", reason="tests/host_cuda.py (the host CUDA emulator) is missing")


@pytest.fixture(scope="module")
def emulated(spec, host_cuda, tmp_path_factory):
    """config -> source of the kernel and its test entry; every program built up front, two at a
    time (g++ with the sanitizers takes seconds per config)."""
    workdir = tmp_path_factory.mktemp("emu")
    sources = {}
    for block, vec, items, rows in CONFIGS:
        variant, _ = render_config(spec, {}, {"BLOCK": block, "VEC": vec, "ITEMS": items, "ROWS": rows})
        sources[(block, vec, items, rows)] = (variant.source + WRAPPER.replace("{entry}", spec.entry), variant.headers)
    params = [(True, "float"), (True, "float"), (False, "int"), (False, "int"), (False, "int")]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda s: host_cuda.build(s[0], s[1], "softmax_shifted", params, workdir=workdir), sources.values()))
    return sources, workdir


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "B{}-V{}-I{}-R{}".format(*c))
def test_matches_numpy_on_the_host_emulator(config, emulated, host_cuda):
    sources, workdir = emulated
    source, headers = sources[config]
    block, _, _, rows_per_block = config
    for cols in COLS:
        for shift in (0, 1):
            x = softmax_inputs(ROWS_N, cols, seed=cols)
            n = ROWS_N * cols
            xs = np.full(n + shift + 1, 7.0, np.float32)
            xs[shift : shift + n] = x.ravel()
            ys = np.full(n + shift + 1, -5.0, np.float32)  # sentinels either side of the view
            host_cuda.run_kernel(
                source,
                headers,
                "softmax_shifted",
                [xs, ys, np.int32(ROWS_N), np.int32(cols), np.int32(shift)],
                -(-ROWS_N // rows_per_block),
                block,
                workdir=workdir,
            )
            what = f"{config} cols={cols} shift={shift} ({'/'.join(branch(config, cols, shift))})"
            assert (ys[:shift] == -5.0).all() and ys[shift + n] == -5.0, f"{what}: wrote outside y"
            y = ys[shift : shift + n].reshape(ROWS_N, cols)
            np.testing.assert_allclose(y, softmax_reference(x), rtol=1e-5, atol=1e-8, err_msg=what)
            assert np.isnan(y[2:4]).all(), what  # all -inf row, NaN row: NaN as in NumPy
            assert (y[1][x[1] == -np.inf] == 0).all(), what
