"""The SGEMM template (templates/sgemm.cu.j2) without a GPU.

1. Its space against NVRTC: every config the constraints keep compiles for every arch of the
   example with no spills, no stack, and registers x threads within a block's 64K; so the
   constraints, not the tuner's pruning, keep the space launchable.
2. Its results on the host emulator (tests/host_cuda.py: real threads, barriers, cp.async that
   lands late or at once, AddressSanitizer on every array) against NumPy, for configs that span
   the axes, at sizes that are not multiples of any tile, with B's 16-byte and 4-byte copy paths
   and C's float4 and scalar stores. On a GPU, tests/test_gpu_showcase.py runs every config.
"""

from __future__ import annotations

import host_cuda
import numpy as np
import pytest
from conftest import EXAMPLE, load_project, space_problems, threads_per_block

from hatch_autotune.compile.render import render_config

PROJECT = load_project(EXAMPLE)
SPEC = PROJECT.kernels["sgemm"]


def test_every_config_compiles_within_a_blocks_resources(session_cache):
    assert len(SPEC.configs({})) >= 100, "the space should span block, warp and lane tiles, stages and unrolling"
    problems = space_problems(SPEC, session_cache, PROJECT.archs)
    assert not problems, f"{len(problems)} configs the constraints keep cannot launch:\n" + "\n".join(problems[:20])


def test_the_constraints_refuse_what_the_template_cannot_build():
    """The constraints, not a compile error, exclude an illegal tiling: these configs break one each."""
    base = dict(SPEC.default)
    for change, why in [
        ({"WM": 128, "WN": 128}, "a warp tile of 128 x 128 is not 32 lane tiles of 8 x 8"),
        ({"BM": 64, "WM": 128}, "a warp tile larger than the block tile"),
        ({"BK": 32, "STAGES": 4}, "4 stages of 128 x 128 x 32 exceed 48 KiB of static shared memory"),
        ({"UNROLL": 4, "BK": 8, "STAGES": 2}, "accepted: a partial unroll of a slice of 8"),
    ]:
        config = {**base, **change}
        kept = all(c(config) for c in SPEC.constraints)
        assert kept == why.startswith("accepted"), (config, why)


# ---- results on the host emulator ---------------------------------------------------------------

CONFIGS = [
    dict(SPEC.default),  # 128 x 128 x 8, warp 64 x 32, lanes 8 x 8, 3 stages
    {"BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32, "TM": 8, "TN": 4, "STAGES": 2, "UNROLL": 4},
    {"BM": 64, "BN": 128, "BK": 8, "WM": 32, "WN": 64, "TM": 8, "TN": 8, "STAGES": 4, "UNROLL": 32},
    {"BM": 256, "BN": 64, "BK": 8, "WM": 64, "WN": 32, "TM": 8, "TN": 8, "STAGES": 2, "UNROLL": 32},
    {"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "TM": 4, "TN": 8, "STAGES": 2, "UNROLL": 4},
]

# (m, n, k): several blocks and a partial one on both axes; n % 4 == 0 (16-byte copies of B,
# float4 stores of C) and not; k not a multiple of BK, shorter than one slice, and 0.
SIZES = [(133, 70, 37), (70, 132, 45), (5, 9, 3), (66, 20, 0)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    if host_cuda.CXX is None:
        pytest.skip("needs g++ for the host emulator")
    return tmp_path_factory.mktemp("sgemm-emulated")


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def check(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    want = reference(a, b)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64) + 1e-30
    err = np.abs(c - want) / scale
    assert np.isfinite(c).all() and err.max() <= 1e-5, f"max relative error {err.max():.2e} at {np.unravel_index(err.argmax(), err.shape)}"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "x".join(str(c[k]) for k in ("BM", "BN", "BK")) + f"-s{c['STAGES']}")
def test_results_match_numpy_at_odd_sizes(workdir, config):
    assert all(c(config) for c in SPEC.constraints), f"{config} is not in the space"
    rng = np.random.default_rng(7)
    for mode in host_cuda.MODES:
        for m, n, k in SIZES:
            a = rng.standard_normal((m, k), dtype=np.float32)
            b = rng.standard_normal((k, n), dtype=np.float32)
            c = np.full((m, n), np.nan, np.float32)  # every element must be written
            host_cuda.run_variant(SPEC, {}, config, {"A": a, "B": b, "C": c}, workdir=workdir, mode=mode)
            check(c, a, b)


def test_a_misaligned_b_takes_the_4_byte_copies(workdir):
    """n % 4 == 0 but B starts 4 bytes past a 16-byte boundary (a view such as B[:, 1:] of a
    wider matrix does): 16-byte copies would fault on a GPU, so the template must take its 4-byte
    path. The wrapper calls the entry with B + 1, C + 1 inside arrays one element larger."""
    config = dict(SPEC.default)
    variant, _ = render_config(SPEC, {}, config)
    source = (
        variant.source
        + f"""
extern "C" __global__ void shifted(const float* A, const float* B, float* C, int m, int n, int k)
{{
    {SPEC.entry}(A, B + 1, C + 1, m, n, k);
}}
"""
    )
    rng = np.random.default_rng(3)
    m, n, k = 70, 68, 29
    a = rng.standard_normal((m, k), dtype=np.float32)
    b_store = rng.standard_normal(k * n + 1, dtype=np.float32)
    c_store = np.full(m * n + 1, np.nan, np.float32)
    grid = (-(-n // config["BN"]), -(-m // config["BM"]))
    params = [a, b_store, c_store, np.int32(m), np.int32(n), np.int32(k)]
    host_cuda.run_kernel(source, variant.headers, "shifted", params, grid, threads_per_block(SPEC, {}, config), workdir=workdir)
    assert np.isnan(c_store[0]), "the element before C was written"
    check(c_store[1:].reshape(m, n), a, b_store[1:].reshape(k, n))
