"""The SGEMM template (templates/sgemm.cu.j2) without a GPU.

1. Its space against NVRTC: every config the constraints keep compiles for every plain arch of
   the example where some bucket keeps it (split-K's clusters: sm_90 only) with no spills, no
   stack, and registers x threads within a block's 64K; so the constraints, not the tuner's
   pruning, keep the space launchable. (sm_90a compiles the same code as sm_90.)
2. Its results on the host emulator (tests/host_cuda.py: real threads, barriers, cp.async that
   lands late or at once, AddressSanitizer on every array) against NumPy, for configs that span
   the axes, at sizes that are not multiples of any tile, with B's 16-byte and 4-byte copy paths
   and C's float4 and scalar stores; split-K over an emulated cluster of 2, 4 and 8 blocks, whose
   mutations (a share of k, a part of the tile, a partial sum left out) are caught. On a GPU,
   tests/test_gpu_showcase.py runs every config.
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
    plain = [a for a in PROJECT.archs if not a.endswith(("a", "f"))]  # sm_90a builds the same code as sm_90: no arch-specific path
    assert plain == ["sm_80", "sm_90"], plain
    problems = space_problems(SPEC, session_cache, plain)
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
    {"BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32, "TM": 8, "TN": 4, "STAGES": 2, "UNROLL": 4, "SPLITK": 1},
    {"BM": 64, "BN": 128, "BK": 8, "WM": 32, "WN": 64, "TM": 8, "TN": 8, "STAGES": 4, "UNROLL": 32, "SPLITK": 1},
    {"BM": 256, "BN": 64, "BK": 8, "WM": 64, "WN": 32, "TM": 8, "TN": 8, "STAGES": 2, "UNROLL": 32, "SPLITK": 1},
    {"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "TM": 4, "TN": 8, "STAGES": 2, "UNROLL": 4, "SPLITK": 1},
    # split-K: 2, 4 and 8 blocks a tile, one cluster each (sm_90+, k >= 1024)
    {"BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32, "TM": 4, "TN": 8, "STAGES": 3, "UNROLL": 32, "SPLITK": 2},
    {"BM": 128, "BN": 64, "BK": 16, "WM": 32, "WN": 64, "TM": 8, "TN": 8, "STAGES": 3, "UNROLL": 32, "SPLITK": 4},
    {"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "TM": 8, "TN": 4, "STAGES": 2, "UNROLL": 32, "SPLITK": 8},
]
SPLIT_POINT = {"arch": 90, "arch_specific": 0, "arch_family": 0, "m": 256, "n": 256, "k": 4096}  # where split-K is kept

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


@pytest.mark.parametrize(
    "config", CONFIGS, ids=lambda c: "x".join(str(c[k]) for k in ("BM", "BN", "BK")) + f"-s{c['STAGES']}-k{c['SPLITK']}"
)
def test_results_match_numpy_at_odd_sizes(workdir, config):
    assert all(c({**SPLIT_POINT, **config}) for c in SPEC.constraints), f"{config} is not in the space"
    rng = np.random.default_rng(7)
    # split-K: k whose slices every block of the cluster shares, k they share unevenly (the last
    # blocks none), and k shorter than one slice (the edges are the tiles' own, tested above)
    split_sizes = [(21, 70, config["BK"] * config["SPLITK"] * 3), (70, 21, config["BK"] * (config["SPLITK"] + 1) + 5), (5, 9, 3)]
    for mode in host_cuda.MODES:
        for m, n, k in split_sizes if config["SPLITK"] > 1 else SIZES:
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


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("int src = 1; src < SPLITK;", "int src = 1; src < 1;"),  # a block stores its own partial sums alone
        ("const int p = split * PAIRS + q", "const int p = q"),  # every block adds up the same part of the tile
        ("kt0 = min(split * share, all_slices)", "kt0 = 0"),  # every block multiplies the first share of k
    ],
    ids=["own-partial", "same-part", "same-share"],
)
def test_a_broken_split_k_is_caught(workdir, old, new):
    """The emulated cluster can fail the split-K kernel: each mutation misses the reference."""
    from functools import partial

    config = CONFIGS[5]  # 64 x 64, SPLITK = 2
    variant, _ = render_config(SPEC, {}, config)
    assert variant.source.count(old) == 1, old
    rng = np.random.default_rng(5)
    a = rng.standard_normal((70, 16 * 2 * 3 + 5), dtype=np.float32)
    b = rng.standard_normal((a.shape[1], 68), dtype=np.float32)
    c = np.full((70, 68), np.nan, np.float32)
    params, grid, block, shared, cluster = host_cuda.launch_of(SPEC, {}, config, {"A": a, "B": b, "C": c})
    assert cluster == [2, 1, 1] and grid == [4, 2] and shared == 3 * 16 * (64 + 4 + 64) * 4, (grid, cluster, shared)
    run = partial(host_cuda.run_kernel, entry=SPEC.entry, params=params, grid=grid, block=block, workdir=workdir, shared_bytes=shared)
    with pytest.raises(AssertionError):
        run(variant.source.replace(old, new), variant.headers, cluster=cluster)
        check(c, a, b)
    c[...] = np.nan
    run(variant.source, variant.headers, cluster=cluster)
    check(c, a, b)  # (the kernel itself passes)


def test_split_k_only_where_it_may_pay():
    """Split-K configs: only sm_90+ (clusters), only at the k = 4096 buckets; the variants without
    it are those of before, and the partial tile fits each split config's pipeline."""
    from hatch_autotune.plan.exclusions import PointRules

    configs = SPEC.configs({})
    split = [c for c in configs if c["SPLITK"] > 1]
    assert {c["SPLITK"] for c in split} == {2, 4, 8} and len(configs) - len(split) == 156
    assert all(c["BM"] * (c["BN"] + 4) <= c["STAGES"] * c["BK"] * (c["BM"] + 4 + c["BN"]) for c in split)
    for arch, k, kept in (("sm_80", 4096, 0), ("sm_90", 256, 0), ("sm_90", 4096, len(split)), ("sm_90a", 4096, len(split))):
        rules = PointRules(SPEC, {}, configs, arch)
        allowed = [configs[i] for i in rules.allowed({"m": 256, "n": 256, "k": k})]
        assert sum(c["SPLITK"] > 1 for c in allowed) == kept, (arch, k)
