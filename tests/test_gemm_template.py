"""The tensor-core GEMM template (templates/gemm.cu.j2: sm_80+ mma.sync, sm_90a wgmma) without a GPU.

1. Its space against NVRTC: every config the constraints keep compiles for sm_80 and sm_90
   with no spills, no stack, registers x threads within a block's 64K and its dynamic shared
   memory within what every sm_80+ arch lets a block opt into; so the constraints, not the
   tuner's pruning, keep the space launchable. The whole space for one instance (bfloat16,
   row-major A and B), the default for every type and layout.
2. The constraints refuse the tilings the template cannot build, by name.
3. Its results on the host emulator (tests/host_cuda.py: real threads, barriers, cp.async that
   lands late or at once, ldmatrix and mma.sync emulated as warp collectives, AddressSanitizer
   on every array) against a float64 NumPy reference, for configs that span the axes, both
   types, A and B row-major, column-major, with a padded leading dimension, misaligned by one
   element and every other column, at sizes that are not multiples of any tile (k < BK, k == 0,
   m == 1), and with 16-byte cp.async and the gather path both taken.
   The emulator's ldmatrix (x1, x2, x4, .trans) and mma.sync are checked register by register
   against the PTX ISA's fragment layouts, written out independently here.
4. SASS of the default and two other configs per arch: HMMA in the main loop, LDSM, LDGSTS,
   no local memory, registers within a block's register file.
5. The sm_90a path (WGMMA = 1: wgmma fed by TMA through mbarriers): its whole family compiles
   for sm_90a within a block's resources, only its instance and sm_90a keep it, its SASS has
   HGMMA in the k-slice loop, UTMALDG and the mbarrier waits, and its results on the emulator
   (mbarriers, TMA boxes that land late, wgmma through descriptors) match NumPy; mutations of
   the kernel fail.
On a GPU, tests/test_gpu_tensor_core.py runs every config against a float reference.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import host_cuda
import ml_dtypes
import numpy as np
import pytest
import sass
from conftest import EXAMPLE, geometry_envs, load_project, threads_per_block

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.compile.nvrtc import compile_all
from hatch_autotune.compile.render import render_config, render_kernel
from hatch_autotune.plan.limits import shared_optin_limit
from hatch_autotune.tuning.bucket import prune_reason
from hatch_autotune.tuning.protocol import Limits

PROJECT = load_project(EXAMPLE)
SPEC = PROJECT.kernels["gemm"]
ARCHS = ("sm_80", "sm_90")
FAST: dict[str, Any] = {"T": "bfloat16", "A_unit_stride": True, "B_unit_stride": True}  # the instance compiled in full
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
MISSING = sass.missing_tools()


def _instance_label(types: dict[str, Any]) -> str:
    return f"{types['T']}-A{'row' if types['A_unit_stride'] else 'any'}-B{'row' if types['B_unit_stride'] else 'any'}"


def _shared(types: dict[str, Any], config: dict[str, Any]) -> int:
    return max(int(SPEC.shared(env)) for env in geometry_envs(SPEC, types, config))


# ---- 1. the space against NVRTC -----------------------------------------------------------------


def _problems(jobs: list[tuple[dict[str, Any], dict[str, Any], str]], cache_dir: Path) -> list[str]:
    """Why each (types, config, arch) could not launch: what the tuner would prune (no compile,
    registers x threads, shared memory over the arch's opt-in limit, spills) or a stack frame."""
    rendered = [render_config(SPEC, types, config)[0] for types, config, _ in jobs]
    results = compile_all(
        [v.compile_job(arch, SPEC.entry, SPEC.nvrtc_options) for v, (_, _, arch) in zip(rendered, jobs)], CompileCache(cache_dir)
    )
    out = []
    for (types, config, arch), r in zip(jobs, results):
        optin = shared_optin_limit(arch)
        limits = Limits(1024, 65536, 48 * 1024, optin)
        res = r.resources if r.ok else None
        why = prune_reason(config, res, partial(threads_per_block, SPEC, types), partial(_shared, types), limits, True)
        if why is None and res is not None and res.stack_bytes:
            why = f"a stack frame of {res.stack_bytes} B (local memory)"
        if why is not None:
            out.append(f"{arch} {_instance_label(types)} {config}: {why}" + (f"\n{r.log[-500:]}" if not r.ok else ""))
    return out


def kept_on(arch: str, configs: list[dict[str, Any]], types: dict[str, Any] = FAST, m: int | None = None) -> list[dict[str, Any]]:
    """The configs the point constraints keep on `arch` at the bucket of m (n, k: the largest),
    or at any bucket of m (None)."""
    from hatch_autotune.plan.exclusions import PointRules

    rules = PointRules(SPEC, types, configs, arch)
    ms = [m] if m is not None else next(k.buckets for k in SPEC.key if k.name == "m")
    buckets = [{**{k.name: k.buckets[-1] for k in SPEC.key}, "m": b} for b in ms]
    return [c for i, c in enumerate(configs) if any(rules.exclusion(i, b) is None for b in buckets)]


def test_every_config_compiles_within_a_blocks_resources(session_cache: Path) -> None:
    configs = SPEC.configs(FAST)
    assert 180 <= len(configs) <= 220, f"{len(configs)} configs: the space should span tiles and stages and stay compilable in CI"
    assert {c["BM"] for c in configs} >= {16, 32, 64, 128, 256} and {c["BN"] for c in configs} >= {32, 256}, (
        "skinny (decode) and large tiles"
    )
    smallest_optin = min(shared_optin_limit(a) for a in ("sm_80", "sm_86", "sm_89", "sm_90"))
    assert max(_shared(FAST, c) for c in configs) <= smallest_optin, "a config no sm_80+ arch can launch"
    jobs = [(FAST, c, arch) for arch in ARCHS for c in kept_on(arch, configs)]
    assert len(jobs) == len(configs) + len(kept_on("sm_80", configs)), "sm_90 keeps every config at some bucket"
    jobs += [(types, dict(SPEC.default), arch) for types in SPEC.type_instances() if types != FAST for arch in ARCHS]
    problems = _problems(jobs, session_cache)
    assert not problems, f"{len(problems)} configs the constraints keep cannot launch:\n" + "\n".join(problems[:20])


# The sm_90a path (WGMMA = 1): its own instance (row-major A, B = W.T) and arch.
WG: dict[str, Any] = {"T": "bfloat16", "A_unit_stride": True, "B_unit_stride": False}
WG_ARCH = "sm_90a"


def wgmma_configs(types: dict[str, Any] = WG) -> list[dict[str, Any]]:
    return [c for c in SPEC.configs(types) if c["WGMMA"]]


def test_every_wgmma_config_compiles_for_sm_90a_within_a_blocks_resources(session_cache: Path) -> None:
    """The whole sm_90a family of the bfloat16 instance, and its float16 twin's largest tiles:
    no spill, no stack, registers x threads within 64K, shared memory within sm_90's opt-in."""
    configs = wgmma_configs()
    assert 70 <= len(configs) <= 100, f"{len(configs)} wgmma configs"
    assert {(c["BM"] // c["WM"]) for c in configs} == {1, 2} and {c["BN"] for c in configs} == {64, 128, 256}
    assert max(_shared(WG, c) for c in configs) + 1024 <= shared_optin_limit(WG_ARCH)
    f16 = {**WG, "T": "float16"}
    jobs = [(WG, c, WG_ARCH) for c in configs]
    jobs += [
        (f16, c, WG_ARCH) for c in wgmma_configs(f16) if c["BM"] * c["BN"] >= 32768 and c["GROUP_M"] == 8
    ]  # the raster: as in bfloat16
    problems = _problems(jobs, session_cache)
    assert not problems, f"{len(problems)} wgmma configs cannot launch:\n" + "\n".join(problems[:20])


def test_the_wgmma_family_lives_only_where_tma_and_sm_90a_serve_it() -> None:
    """WGMMA = 1 configs exist only in the row-major A, B = W.T instance, and only sm_90a keeps them
    (a point constraint): sm_80 and plain sm_90 see the mma.sync family alone."""
    from hatch_autotune.plan.exclusions import PointRules

    for types in SPEC.type_instances():
        has = bool(wgmma_configs(types))
        assert has == (types["A_unit_stride"] and not types["B_unit_stride"]), types
    configs = SPEC.configs(WG)
    bucket = {k.name: k.buckets[-1] for k in SPEC.key}
    for arch, wgmma_kept in (("sm_80", False), ("sm_90", False), ("sm_90a", True)):
        rules = PointRules(SPEC, WG, configs, arch)
        kept = [c for i, c in enumerate(configs) if rules.exclusion(i, bucket) is None]
        assert any(c["WGMMA"] for c in kept) == wgmma_kept, arch
        assert any(not c["WGMMA"] for c in kept), f"{arch}: the mma.sync family must stay"
    assert SPEC.default["WGMMA"] == 0, "the default runs everywhere, and serves the calls TMA cannot"


def test_split_k_lives_on_sm_90_at_the_decode_buckets() -> None:
    """SPLITK > 1 (a cluster of blocks a tile) only on skinny mma.sync tiles, only where clusters
    exist (sm_90, sm_90a) and only at the buckets with few output tiles (m <= 128)."""
    configs = SPEC.configs(FAST)
    split = [c for c in configs if c["SPLITK"] > 1]
    assert split and all(c["BM"] <= 32 and not c["WGMMA"] for c in split)
    assert {c["SPLITK"] for c in split} == {2, 4, 8}
    assert not any(c["SPLITK"] > 1 for c in kept_on("sm_80", configs, m=16)), "no clusters before sm_90"
    for arch in ("sm_90", "sm_90a"):
        assert len([c for c in kept_on(arch, configs, m=16) if c["SPLITK"] > 1]) == len(split), arch
        assert not any(c["SPLITK"] > 1 for c in kept_on(arch, configs, m=512)), f"{arch}: split-K at a prefill bucket"
    assert SPEC.default["SPLITK"] == 1 and SPEC.cluster is not None


def test_raster_orders_are_tuned_for_the_big_tiles_at_the_prefill_buckets() -> None:
    """GROUP_M 1 (row order), 8 and 16 for the big tiles of both families, kept at m >= 512 (many
    block rows); the skinny tiles and the decode buckets keep the default, 8."""
    configs = SPEC.configs(FAST) + wgmma_configs()
    other = [c for c in configs if c["GROUP_M"] != 8]
    assert {c["GROUP_M"] for c in other} == {1, 16} and all(c["BM"] >= 64 for c in other)
    assert any(c["WGMMA"] for c in other) and any(not c["WGMMA"] for c in other)
    for arch in ("sm_80", "sm_90"):
        assert not any(c["GROUP_M"] != 8 for c in kept_on(arch, SPEC.configs(FAST), m=128)), arch
        assert len([c for c in kept_on(arch, SPEC.configs(FAST), m=512) if c["GROUP_M"] != 8]) == len(
            [c for c in SPEC.configs(FAST) if c["GROUP_M"] != 8]
        ), arch
    assert SPEC.default["GROUP_M"] == 8


# ---- 2. the constraints -------------------------------------------------------------------------


def test_the_constraints_refuse_what_the_template_cannot_build() -> None:
    """The constraints, not a compile error, exclude a bad tiling: these configs break one each."""
    base = dict(SPEC.default)  # 128 x 128 x 32, warps 64 x 64, 4 stages
    for change, why in [
        ({"WM": 32, "WN": 32}, "16 warps of 32 x 32: more than 256 threads"),
        ({"BM": 64, "WM": 128}, "a warp tile larger than the block tile"),
        ({"BN": 256, "BK": 64, "STAGES": 3}, "3 x (128 + 256) x 64 x 2 B = 144 KiB: over the 96 KiB every sm_80+ arch allows"),
        ({"BK": 32, "STAGES": 2}, "a pipeline 64 deep along k: too shallow to hide DRAM"),
        ({"BM": 16, "WM": 16, "WN": 64}, "a skinny tile of 16 x 64 warp tiles: skinny warps are 32 wide"),
        ({"BM": 16, "BN": 256, "WM": 16, "WN": 32}, "a skinny tile 256 wide: half as many blocks along n"),
        ({"BM": 256, "BN": 32, "BK": 32, "WM": 64, "WN": 32}, "a big tile 32 wide: B's tile too narrow to reuse A's"),
        ({"BM": 16, "BN": 32, "WM": 16, "WN": 32}, "accepted: one warp, the decode tile for n = 4096 on 128 blocks"),
        ({"BM": 16, "BN": 128, "WM": 16, "WN": 32}, "accepted: the decode tile, 4 warps side by side"),
        ({"BK": 64, "STAGES": 2}, "64 x 64 warp tiles with BK = 64: ptxas spills on sm_80"),
        ({"BM": 256, "BN": 128, "BK": 32, "STAGES": 4}, "accepted: 8 warps of 64 x 64, 96 KiB"),
        ({"BM": 128, "WM": 128, "WN": 32}, "a 128-row warp tile: the mma.sync family's warps are at most 64 rows"),
        ({"BM": 16, "BN": 32, "WM": 16, "WN": 32, "GROUP_M": 16}, "a raster group on a skinny tile: one block row at decode sizes"),
        ({"BM": 32, "BN": 64, "WM": 32, "WN": 32, "GROUP_M": 1}, "row order on a skinny tile"),
        ({"SPLITK": 2}, "split-K on a big tile: they have output tiles enough"),
    ]:
        config = {**base, **change}
        kept = all(c(config) for c in SPEC.constraints)
        assert kept == why.startswith("accepted"), (config, why)
    # the wgmma family, in its instance on sm_90a (the point constraints read the arch)
    from hatch_autotune.runtime.selection import arch_env

    env = {**SPEC.type_env(WG), **arch_env(WG_ARCH), **{k.name: k.buckets[-1] for k in SPEC.key}}
    wg = {**base, "WGMMA": 1, "BM": 128, "BN": 256, "BK": 64, "WM": 64, "WN": 64, "STAGES": 4}
    for change, why in [
        ({}, "accepted: 2 consumer warpgroups of 64 x 256, 192 KiB of stages"),
        ({"BK": 32}, "a 32-element slice: half a 128-byte swizzle row"),
        ({"WM": 128}, "128 x 256 a warpgroup: 256 accumulators a thread"),
        ({"BM": 256, "WM": 64}, "4 consumer warpgroups"),
        ({"STAGES": 5}, "5 x (128 + 256) x 64 x 2 B = 240 KiB: over sm_90's 227 KiB"),
        ({"STAGES": 2}, "2 stages: too shallow for TMA's latency"),
        ({"BN": 32, "BM": 64}, "n = 32 a wgmma: too narrow to reuse A"),
        ({"WN": 32}, "WN is unused by the wgmma family: one value, so no duplicate configs"),
        ({"BM": 256, "BN": 128, "WM": 128, "STAGES": 4}, "accepted: 2 consumers of 128 x 128 (2 m64 tiles each)"),
    ]:
        config = {**wg, **change}
        kept = all(c({**env, **config}) for c in SPEC.constraints)
        assert kept == why.startswith("accepted"), (config, why)
    assert not all(c({**env, **arch_env("sm_90"), **wg}) for c in SPEC.constraints), "wgmma on plain sm_90"
    assert not all(c({**env, **SPEC.type_env(FAST), **wg}) for c in SPEC.constraints), "wgmma with B row-major (N-major)"


# ---- 3. results on the host emulator -------------------------------------------------------------

# (config changes from the default, type): spanning block and warp tiles (skinny 16 and 32 rows,
# 2 to 8 warps, 64 x 32 warps), BK 32 and 64 and 2 to 5 stages; the default runs both types.
CONFIGS = [
    ({}, "bfloat16"),
    ({}, "float16"),
    ({"BM": 16, "BN": 64, "BK": 64, "WM": 16, "WN": 32, "STAGES": 2}, "float16"),
    ({"BM": 32, "BN": 32, "BK": 64, "WM": 32, "WN": 32, "STAGES": 3}, "bfloat16"),
    ({"BM": 32, "BN": 128, "BK": 32, "WM": 32, "WN": 32, "STAGES": 5}, "bfloat16"),
    ({"BM": 64, "BN": 128, "BK": 64, "WM": 64, "WN": 32, "STAGES": 3}, "float16"),
    ({"BM": 256, "BN": 64, "BK": 32, "WM": 64, "WN": 64, "STAGES": 4}, "bfloat16"),
    # split-K: 2, 4 and 8 blocks a tile, one cluster each (sm_90+)
    ({"BM": 16, "BN": 128, "BK": 32, "WM": 16, "WN": 32, "STAGES": 4, "SPLITK": 2}, "bfloat16"),
    ({"BM": 16, "BN": 64, "BK": 64, "WM": 16, "WN": 32, "STAGES": 2, "SPLITK": 4}, "float16"),
    ({"BM": 32, "BN": 32, "BK": 32, "WM": 32, "WN": 32, "STAGES": 5, "SPLITK": 8}, "bfloat16"),
]
# Where a split-K config is kept: sm_90, a decode bucket.
SPLIT_POINT: dict[str, Any] = {"arch": 90, "arch_specific": 0, "arch_family": 0, "m": 16, "n": 4096, "k": 4096}

# (m, n, k): several blocks and partial ones on both axes, k not a multiple of BK; then every
# size a multiple of 8 (16-byte copies of row-major A and B, column-major ones when m, n % 8 ==
# 0) with k not a multiple of 64; k < 16 with m == 1; k == 0 (C is zeros).
SIZES = [(133, 70, 37), (72, 136, 80), (1, 9, 3), (20, 17, 0)]

# How A [m, k] and B [k, n] are laid out: (A's layout, B's layout) pairs, each taking one of the
# four variants, the gather path (misaligned, every other column) and the cp.async path; C's
# view for each pair takes the 4-byte pair stores and the 2-byte ones (see _run).
LAYOUTS = [("row", "row"), ("col", "padded"), ("padded", "col"), ("misaligned", "strided")]


def layout(a: np.ndarray, how: str) -> np.ndarray:
    """`a` (a 2-D array) as a view of the given layout with the same values."""
    rows, cols = a.shape
    if how == "row":
        return np.ascontiguousarray(a)
    if how == "col":  # column-major: strides (1, rows); B = W.T for a row-major W [n, k]
        return np.asfortranarray(a)
    if how in ("padded", "misaligned"):  # rows 8 elements longer; the misaligned view starts one element in
        start = 1 if how == "misaligned" else 0
        big = np.zeros((rows, cols + 8), a.dtype)
        big[:, start : start + cols] = a
        return big[:, start : start + cols]
    if how == "strided":  # every other column: no unit stride at all
        big = np.zeros((rows, 2 * cols), a.dtype)
        big[:, ::2] = a
        return big[:, ::2]
    raise ValueError(how)


def unit_stride(x: np.ndarray) -> bool:
    """The variant the runtime picks: rows of unit stride (or of one element)."""
    return x.shape[1] <= 1 or x.strides[1] == x.itemsize


def check(c: np.ndarray, a: np.ndarray, b: np.ndarray, dtype_name: str) -> None:
    """C against float64 A @ B: within rounding to the output type (2^-8 relative for bfloat16,
    2^-11 for float16) plus float32 accumulation error, bounded by |A| @ |B|."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want, scale = a64 @ b64, np.abs(a64) @ np.abs(b64)
    got = c.astype(np.float64)
    eps = 2.0**-8 if dtype_name == "bfloat16" else 2.0**-11
    bound = eps * np.abs(want) + 2.0**-18 * scale + 1e-30
    assert np.isfinite(got).all(), f"{np.count_nonzero(~np.isfinite(got))} elements of C not written (or not finite)"
    excess = np.abs(got - want) / bound
    worst = np.unravel_index(excess.argmax(), excess.shape) if excess.size else ()
    assert excess.size == 0 or excess.max() <= 1.0, f"error {excess.max():.2f}x the bound at {worst}: {got[worst]} != {want[worst]}"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if host_cuda.CXX is None:
        pytest.skip("needs g++ for the host emulator")
    return tmp_path_factory.mktemp("gemm-emulated")


def _run(
    workdir: Path, config: dict[str, Any], dtype_name: str, a: np.ndarray, b: np.ndarray, mode: str, c_view: str = "even"
) -> np.ndarray:
    """C = A @ B on the emulator, C a view of a wider NaN-filled matrix: its rows 2 elements
    apart more than n ("even": pairs of columns stored 4 bytes at a time where n is even), 3
    ("odd": 2-byte stores), or 2 and starting one element in ("shifted": misaligned pairs)."""
    m, n = a.shape[0], b.shape[1]
    pad, start = {"even": (2, 0), "odd": (3, 0), "shifted": (2, 1)}[c_view]
    c_big = np.full((m, n + pad), np.nan, DTYPES[dtype_name])
    c = c_big[:, start : start + n]
    types = {"T": dtype_name, "A_unit_stride": unit_stride(a), "B_unit_stride": unit_stride(b)}
    host_cuda.run_variant(SPEC, types, config, {"A": a, "B": b, "C": c}, workdir=workdir, mode=mode)
    outside = np.ones(c_big.shape, bool)
    outside[:, start : start + n] = False
    assert np.isnan(c_big[outside].astype(np.float32)).all(), "the kernel wrote outside C's columns"
    return c


@pytest.mark.parametrize(
    ("change", "dtype_name"),
    CONFIGS,
    ids=[f"{c.get('BM', 128)}x{c.get('BN', 128)}x{c.get('BK', 32)}-s{c.get('STAGES', 4)}-k{c.get('SPLITK', 1)}-{t}" for c, t in CONFIGS],
)
def test_results_match_numpy_at_odd_sizes(workdir: Path, change: dict[str, Any], dtype_name: str) -> None:
    config = {**SPEC.default, **change}
    assert all(c({**SPLIT_POINT, **config}) for c in SPEC.constraints), f"{config} is not in the space"
    rng = np.random.default_rng(11)
    dtype = DTYPES[dtype_name]
    # split-K: also a k whose slices every block of the cluster shares (the small k leave some none)
    sizes = [*SIZES, (21, 40, 8 * 32 * config["SPLITK"] + 24)] if config["SPLITK"] > 1 else SIZES
    for i, (m, n, k) in enumerate(sizes):
        for j, (a_how, b_how) in enumerate(LAYOUTS):
            mode = host_cuda.MODES[(i + j) % 2]  # both cp.async modes over the grid of cases
            a = layout(rng.standard_normal((m, k)).astype(dtype), a_how)
            b = layout(rng.standard_normal((k, n)).astype(dtype), b_how)
            c = _run(workdir, config, dtype_name, a, b, mode, ("even", "odd", "even", "shifted")[j])
            try:
                check(c, a, b, dtype_name)
            except AssertionError as exc:
                raise AssertionError(f"m, n, k = {m}, {n}, {k}, A {a_how}, B {b_how}, {mode} cp.async: {exc}") from None


@pytest.mark.parametrize(
    "change",
    [
        {"BM": 128, "BN": 64, "WM": 64, "WN": 32, "GROUP_M": 1},
        {"BM": 128, "BN": 64, "WM": 64, "WN": 32, "GROUP_M": 16},
        {"WGMMA": 1, "BM": 64, "BN": 64, "BK": 64, "WM": 64, "WN": 64, "STAGES": 3, "GROUP_M": 16},
    ],
    ids=["row-order", "groups-of-16", "wgmma-groups-of-16"],
)
def test_every_raster_order_computes_each_tile_once(workdir: Path, change: dict[str, Any]) -> None:
    """17 block rows and 2 block columns: row order, and groups of 16 (a whole group, then a
    partial one of 1 row); a tile computed twice leaves another unwritten (NaN)."""
    config = {**SPEC.default, **change}
    rng = np.random.default_rng(17)
    a = rng.standard_normal((17 * config["BM"] - 3, 72)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((72, 70)).astype(ml_dtypes.bfloat16)
    if config["WGMMA"]:
        b = np.asfortranarray(b)  # B = W.T: the wgmma family's instance
    check(_run(workdir, config, "bfloat16", a, b, host_cuda.MODES[0]), a, b, "bfloat16")


# The wgmma family on the emulator (TMA boxes that land late, mbarrier phases, warpgroup MMAs
# through descriptors, all as the PTX ISA says: tests/host_cuda/emulator.h): one and two consumer
# warpgroups, WM = 128 (two m64 tiles a consumer), both types; A row-major or with padded rows, B =
# W.T; m, n no multiple of any tile, k a multiple of 8 (TMA's 16-byte row pitch) and not of 64,
# k < 16 with m == 1, more slices than stages (the stages reused).
WGMMA_CONFIGS = [
    ({"BM": 64, "BN": 64, "STAGES": 3}, "bfloat16"),
    ({"BM": 128, "BN": 128, "STAGES": 4}, "float16"),
    ({"BM": 256, "BN": 64, "WM": 128, "STAGES": 3}, "bfloat16"),
]
WGMMA_SIZES = [(133, 70, 200), (1, 9, 8), (70, 130, 264)]


@pytest.mark.parametrize(("change", "dtype_name"), WGMMA_CONFIGS, ids=[f"{c['BM']}x{c['BN']}-s{c['STAGES']}-{t}" for c, t in WGMMA_CONFIGS])
def test_wgmma_results_match_numpy_at_odd_sizes(workdir: Path, change: dict[str, Any], dtype_name: str) -> None:
    config = {**SPEC.default, "WGMMA": 1, "BK": 64, "WM": 64, "WN": 64, **change}
    assert config in wgmma_configs({**WG, "T": dtype_name}), f"{config} is not in the wgmma family"
    rng = np.random.default_rng(90)
    dtype = DTYPES[dtype_name]
    for i, (m, n, k) in enumerate(WGMMA_SIZES):
        a_how = ("row", "padded")[i % 2]
        a = layout(rng.standard_normal((m, k)).astype(dtype), a_how)
        b = layout(rng.standard_normal((k, n)).astype(dtype), "col")  # B = W.T
        c = _run(workdir, config, dtype_name, a, b, host_cuda.MODES[0], ("even", "odd")[i % 2])
        try:
            check(c, a, b, dtype_name)
        except AssertionError as exc:
            raise AssertionError(f"m, n, k = {m}, {n}, {k}, A {a_how}: {exc}") from None


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("at_mbar_wait(&full[s], (kt / STAGES) & 1);", "", "the MMAs read a stage before its TMA boxes landed"),
        ("((1024ull >> 4) << 32)", "((512ull >> 4) << 32)", "a descriptor's stride byte offset half the 8-row groups' 1024 bytes"),
        ("(1ull << 62)", "(2ull << 62)", "a descriptor that reads 64B swizzling where TMA wrote 128B"),
        ("to_elem(acc[i][4 * j + 2 * h])", "to_elem(acc[i][4 * j + h])", "the accumulator fragment's rows mixed up"),
    ],
    ids=["no-full-wait", "sbo", "swizzle", "fragment"],
)
def test_a_broken_wgmma_kernel_is_caught(workdir: Path, old: str, new: str, why: str) -> None:
    """The emulated TMA, mbarriers and wgmma can fail the kernel: each mutation of it misses the
    reference (or the emulator stops it)."""
    config = {**SPEC.default, "WGMMA": 1, "BM": 64, "BN": 64, "BK": 64, "WM": 64, "WN": 64, "STAGES": 3}
    variant = render_config(SPEC, WG, config)[0]
    assert variant.source.count(old) == 1, old
    rng = np.random.default_rng(7)
    a = rng.standard_normal((70, 256)).astype(ml_dtypes.bfloat16)
    b = np.asfortranarray(rng.standard_normal((256, 72)).astype(ml_dtypes.bfloat16))
    c = np.full((70, 72), np.nan, ml_dtypes.bfloat16)
    params, grid, block, shared, _ = host_cuda.launch_of(SPEC, WG, config, {"A": a, "B": b, "C": c})
    with pytest.raises(AssertionError):
        host_cuda.run_kernel(
            variant.source.replace(old, new), variant.headers, SPEC.entry, params, grid, block, workdir=workdir, shared_bytes=shared
        )
        check(c, a, b, "bfloat16")
    host_cuda.run_kernel(variant.source, variant.headers, SPEC.entry, params, grid, block, workdir=workdir, shared_bytes=shared)
    check(c, a, b, "bfloat16")  # (the kernel itself passes)


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("int src = 1; src < SPLITK;", "int src = 1; src < 1;", "a block stores its own partial sums alone"),
        ("const int p = split * PAIRS + q", "const int p = q", "every block of the cluster adds up the same part of the tile"),
        ("kt0 = min(split * share, all_slices)", "kt0 = 0", "every block multiplies the first share of k"),
        (
            "float2 sum = at_cluster_ld_f32x2(partial + r * RED_LD + c, 0);",
            "float2 sum = at_cluster_ld_f32x2(partial + r * BN + c, 0);",
            "rank 0's partial tile read at the wrong row pitch",
        ),
    ],
    ids=["own-partial", "same-part", "same-share", "pitch"],
)
def test_a_broken_split_k_reduction_is_caught(workdir: Path, old: str, new: str, why: str) -> None:
    """The emulated cluster (its blocks run together, each its own shared memory, the cluster
    barrier and distributed shared-memory loads) can fail the split-K kernel: each mutation of
    its split or reduction misses the reference."""
    config = {**SPEC.default, "BM": 16, "BN": 64, "BK": 32, "WM": 16, "WN": 32, "STAGES": 4, "SPLITK": 4}
    variant = render_config(SPEC, FAST, config)[0]
    assert variant.source.count(old) == 1, old
    rng = np.random.default_rng(3)
    a = rng.standard_normal((20, 8 * 32 * 4 + 8)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((a.shape[1], 72)).astype(ml_dtypes.bfloat16)
    c = np.full((20, 72), np.nan, ml_dtypes.bfloat16)
    params, grid, block, shared, cluster = host_cuda.launch_of(SPEC, FAST, config, {"A": a, "B": b, "C": c})
    assert cluster == [4, 1, 1] and grid == [8, 2], (grid, cluster)
    run = partial(host_cuda.run_kernel, entry=SPEC.entry, params=params, grid=grid, block=block, workdir=workdir, shared_bytes=shared)
    with pytest.raises(AssertionError):
        run(variant.source.replace(old, new), variant.headers, cluster=cluster)
        check(c, a, b, "bfloat16")
    c[...] = np.nan
    run(variant.source, variant.headers, cluster=cluster)
    check(c, a, b, "bfloat16")  # (the kernel itself passes)


def test_an_element_the_tiles_drop_is_caught(workdir: Path) -> None:
    """The check can fail: the same kernel with k one too small (the last slice's last column
    of A and row of B left out) misses the reference."""
    config = dict(SPEC.default)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((40, 33)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((33, 24)).astype(ml_dtypes.bfloat16)
    c = _run(workdir, config, "bfloat16", a[:, :32], b[:32], "immediate")
    with pytest.raises(AssertionError, match="the bound"):
        check(c, a, b, "bfloat16")


# ---- the emulator's tensor-core collectives, against the PTX ISA's fragment layouts -------------

# One warp: ldmatrix x1, x2, x4 (plain and .trans) of a 16 x 16 matrix S in shared memory, an
# x2.trans of a 16 x 8 B [k][n], and mma.sync of the x4 fragments (A = S) with B's: every
# register and D written out. `shift` moves each row address by that many elements.
PROBE = """
#include <cuda_bf16.h>
{mma}
extern "C" __global__ void probe(const unsigned short* src, const unsigned short* b_src, unsigned* regs, float* d, int shift)
{{
    __shared__ __align__(16) unsigned short s[16][16];
    __shared__ __align__(16) unsigned short sb[16][8];
    const int lane = threadIdx.x;
    for (int i = lane; i < 256; i += 32) s[i / 16][i % 16] = src[i];
    for (int i = lane; i < 128; i += 32) sb[i / 8][i % 8] = b_src[i];
    __syncwarp();
    unsigned x1[1], x2[2], x4[4], t4[4], b[2];
    at_ldmatrix<1, false>(x1, &s[lane % 8][shift]);
    at_ldmatrix<2, false>(x2, &s[lane % 16][0]);
    at_ldmatrix<4, false>(x4, &s[lane % 16][lane / 16 * 8]);
    at_ldmatrix<4, true>(t4, &s[lane % 16][lane / 16 * 8]);
    at_ldmatrix<2, true>(b, &sb[lane % 16][0]);
    const unsigned all[13] = {{x1[0], x2[0], x2[1], x4[0], x4[1], x4[2], x4[3], t4[0], t4[1], t4[2], t4[3], b[0], b[1]}};
    for (int i = 0; i < 13; ++i) regs[lane * 13 + i] = all[i];
    float acc[4] = {{0.5f, 0.5f, 0.5f, 0.5f}};
    at_mma_m16n8k16<true>(acc, x4, b);
    for (int i = 0; i < 4; ++i) d[lane * 4 + i] = acc[i];
}}
"""


def _probe(workdir: Path, shift: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    mma = (Path(__file__).resolve().parents[1] / "templates" / "_mma.cuh").read_text()
    s = (np.arange(256) % 97 - 40).astype(ml_dtypes.bfloat16).reshape(16, 16)  # small integers: exact products and sums
    b = (np.arange(128) % 13 - 6).astype(ml_dtypes.bfloat16).reshape(16, 8)
    regs = np.zeros(32 * 13, np.uint32)
    d = np.zeros(32 * 4, np.float32)
    params = [s.view(np.uint16), b.view(np.uint16), regs, d, np.int32(shift)]
    host_cuda.run_kernel(PROBE.format(mma=mma), [], "probe", params, 1, 32, workdir=workdir)
    return s, b, regs.reshape(32, 13), d.reshape(32, 4)


def test_the_emulated_ldmatrix_and_mma_follow_the_ptx_fragment_layouts(workdir: Path) -> None:
    """The PTX ISA's layouts, written out here independently of the emulator: lane l (g = l/4,
    t = l%4) gets elements (g, 2t) and (g, 2t+1) of each 8x8 matrix (of its transpose with
    .trans), matrix q from the rows lanes 8q..8q+7 address; mma's A fragment a0..a3 is A's
    8x8 blocks (0,0), (1,0), (0,1), (1,1), B's b0, b1 are k rows 2t, 2t+1 and 2t+8, 2t+9 of column
    g, and D's d0..d3 are (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)."""
    s, b, regs, d = _probe(workdir, 0)
    bits, b_bits = s.view(np.uint16).astype(np.uint32), b.view(np.uint16).astype(np.uint32)

    def pair(m: np.ndarray, g: int, t: int) -> int:  # this lane's two elements of an 8 x 8 matrix
        return int(m[g, 2 * t] | m[g, 2 * t + 1] << 16)

    blocks = [bits[r : r + 8, c : c + 8] for r, c in ((0, 0), (8, 0), (0, 8), (8, 8))]  # as x4 addresses them
    for lane in range(32):
        g, t = divmod(lane, 4)
        want = [pair(blocks[0], g, t), pair(blocks[0], g, t), pair(blocks[1], g, t)]
        want += [pair(m, g, t) for m in blocks] + [pair(m.T, g, t) for m in blocks]
        want += [pair(b_bits[0:8].T, g, t), pair(b_bits[8:16].T, g, t)]
        assert list(regs[lane]) == want, f"lane {lane}: {list(regs[lane])} != {want}"
    full = s.astype(np.float32) @ b.astype(np.float32) + 0.5
    for lane in range(32):
        g, t = divmod(lane, 4)
        want_d = [full[g, 2 * t], full[g, 2 * t + 1], full[g + 8, 2 * t], full[g + 8, 2 * t + 1]]
        assert list(d[lane]) == want_d, f"lane {lane}: D {list(d[lane])} != {want_d}"


def test_a_misaligned_ldmatrix_row_is_refused(workdir: Path) -> None:
    """A row address that is not 16-byte aligned faults on a GPU: the emulator stops, naming it."""
    with pytest.raises(AssertionError, match="not 16-byte aligned"):
        _probe(workdir, 1)


# ---- 4. SASS -------------------------------------------------------------------------------------

SASS_CONFIGS = [
    dict(SPEC.default),
    {**SPEC.default, "BM": 16, "BN": 128, "BK": 64, "WM": 16, "WN": 32, "STAGES": 3},
    {**SPEC.default, "BM": 256, "BN": 128, "BK": 32, "WM": 64, "WN": 64, "STAGES": 4},
]


def _mma_loop(code: list[sass.Instruction]) -> sass.Loop | None:
    """The loop with the most HMMA, the smaller on ties: the k-slice loop. Not necessarily an
    innermost one: the gather path of the copies (not unrolled) is a loop inside it."""
    best = max(sass.loops(code), key=lambda lp: (sass.count(lp.body, "HMMA"), -lp.size), default=None)
    return best if best is not None and sass.count(best.body, "HMMA") else None


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
@pytest.mark.parametrize("arch", ARCHS)
def test_sass_has_tensor_core_main_loop_and_no_local_memory(session_cache: Path, arch: str) -> None:
    jobs = [(types, c) for c in SASS_CONFIGS for types in (FAST, {**FAST, "B_unit_stride": False})]
    assert all(all(k(c) for k in SPEC.constraints) for _, c in jobs), "a SASS config left the space"
    variants = [render_config(SPEC, types, c)[0] for types, c in jobs]
    results = compile_all([v.compile_job(arch, SPEC.entry, SPEC.nvrtc_options) for v in variants], CompileCache(session_cache))
    for (types, config), r in zip(jobs, results):
        assert r.ok and r.binary is not None, r.log[-2000:]
        code = sass.function_sass(r.binary, SPEC.entry)
        usage = sass.resource_usage(r.binary)[SPEC.entry]
        what = f"{arch} {_instance_label(types)} {config}: {sass.opcodes(code)}"
        loop = _mma_loop(code)
        mi, ni = config["WM"] // 16, config["WN"] // 8
        assert loop is not None, f"no loop with HMMA.16816: {what}"
        assert sass.count(loop.body, "HMMA.16816.F32") >= mi * ni * config["BK"] // 16, f"the main loop lacks MMAs: {what}"
        # ldmatrix: plain for k-contiguous tiles ([m][k] A, [n][k] B), .trans (MT88) for [k][n] B
        assert sass.count(loop.body, "LDSM.16.M88.4"), f"no ldmatrix.x4 in the main loop: {what}"
        if types["B_unit_stride"]:
            assert sass.count(loop.body, "LDSM.16.MT88.4"), f"no ldmatrix.x4.trans of B [k][n]: {what}"
        assert sass.count(code, "LDGSTS.128"), f"no 16-byte cp.async: {what}"
        assert not usage.local and not usage.stack, f"local memory: {usage} {what}"
        assert not any(i.base in ("LDL", "STL") for i in code), f"local loads or stores: {what}"
        threads = threads_per_block(SPEC, types, config)
        assert usage.registers <= 255 and usage.registers * threads <= 65536, f"{usage.registers} registers x {threads} threads: {what}"


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_sass_of_split_k_has_the_cluster_barriers_and_distributed_shared_loads(session_cache: Path) -> None:
    """A split-K variant on sm_90: the mma.sync main loop as without it, two cluster barriers
    (arrive + wait each: partials written, then nobody leaves early), the other blocks' partial
    tiles read 8 bytes at a time (mapa'd generic loads: LD.E.64), no local memory."""
    for types, splitk in ((FAST, 4), ({**FAST, "B_unit_stride": False}, 8)):
        config = {**SPEC.default, "BM": 16, "BN": 64, "BK": 64, "WM": 16, "WN": 32, "STAGES": 2, "SPLITK": splitk}
        r = compile_all(
            [render_config(SPEC, types, config)[0].compile_job("sm_90", SPEC.entry, SPEC.nvrtc_options)], CompileCache(session_cache)
        )[0]
        assert r.ok and r.binary is not None, r.log[-2000:]
        code = sass.function_sass(r.binary, SPEC.entry)
        usage = sass.resource_usage(r.binary)[SPEC.entry]
        what = f"{_instance_label(types)} {config}: {sass.opcodes(code)}"
        loop = _mma_loop(code)
        assert loop is not None and sass.count(loop.body, "HMMA.16816.F32") >= 2 * 4, f"the main loop lacks MMAs: {what}"
        assert sass.count(code, "UCGABAR_ARV") == 2 and sass.count(code, "UCGABAR_WAIT") == 2, f"two cluster barriers: {what}"
        assert sass.count(code, "LD.E.64") >= splitk, f"no 8-byte loads of the cluster's partial tiles: {what}"
        assert not usage.local and not usage.stack and not any(i.base in ("LDL", "STL") for i in code), f"local memory: {what}"


def test_the_space_renders_one_source_per_variant() -> None:
    """Every instance renders (the two unit-stride constants and both types): 8 instances, the
    mma.sync family in each and the wgmma family in the two of row-major A and B = W.T."""
    rendered = render_kernel(SPEC)
    assert len(rendered) == 8
    for vs in rendered.values():
        types = vs[0].types_dict
        assert len(vs) == len(SPEC.configs(FAST)) + len(wgmma_configs(types)), types
    sources = {v.source for vs in rendered.values() for v in vs}
    assert len(sources) == sum(len(vs) for vs in rendered.values())


WGMMA_SASS_CONFIGS = [
    {**SPEC.default, "WGMMA": 1, "BM": 128, "BN": 256, "BK": 64, "WM": 64, "WN": 64, "STAGES": 4},
    {**SPEC.default, "WGMMA": 1, "BM": 256, "BN": 128, "BK": 64, "WM": 128, "WN": 64, "STAGES": 4},
    {**SPEC.default, "WGMMA": 1, "BM": 64, "BN": 64, "BK": 64, "WM": 64, "WN": 64, "STAGES": 3},
]


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_sass_of_the_sm_90a_path_has_warpgroup_mmas_tma_loads_and_mbarriers(session_cache: Path) -> None:
    """HGMMA (wgmma) of the config's n in the k-slice loop, 4 k16 steps per m64 tile a slice;
    UTMALDG.2D (TMA) for A and B; the mbarrier waits (SYNCS.PHASECHK) and the transaction-count
    arrive; warpgroup fences and waits; no local memory; the launch bounds' registers."""
    configs = [c for c in WGMMA_SASS_CONFIGS if c in wgmma_configs()]
    assert len(configs) == len(WGMMA_SASS_CONFIGS), "a SASS config left the space"
    variants = [render_config(SPEC, WG, c)[0] for c in configs]
    results = compile_all([v.compile_job(WG_ARCH, SPEC.entry, SPEC.nvrtc_options) for v in variants], CompileCache(session_cache))
    for config, r in zip(configs, results):
        assert r.ok and r.binary is not None, r.log[-2000:]
        assert "serialized" not in r.log, f"ptxas serialised the wgmma pipeline: {r.log[-1500:]}"
        code = sass.function_sass(r.binary, SPEC.entry)
        usage = sass.resource_usage(r.binary)[SPEC.entry]
        what = f"{config}: {sass.opcodes(code)}"
        loop = max(sass.loops(code), key=lambda lp: (sass.count(lp.body, "HGMMA"), -lp.size), default=None)
        assert loop is not None, f"no loop: {what}"
        # HGMMA.64x{n}x16.F32.BF16 (the disassembly's shape modifier starts with a digit: the
        # parser keeps `HGMMA.64` as the opcode and the rest with the operands)
        hgmma = [f"{i.opcode}{i.operands}" for i in loop.body if i.base == "HGMMA"]
        shape = f"HGMMA.64x{config['BN']}x16.F32.BF16"
        assert len(hgmma) == 4 * config["WM"] // 64 and all(h.startswith(shape) for h in hgmma), (
            f"the k-slice loop's wgmmas {hgmma}: {what}"
        )
        assert sass.count(loop.body, "SYNCS.PHASECHK.TRANS64.TRYWAIT"), f"no mbarrier wait in the k-slice loop: {what}"
        assert sass.count(loop.body, "WARPGROUP.ARRIVE") and sass.count(code, "WARPGROUP.DEPBAR.LE"), f"no wgmma fence or wait: {what}"
        assert sass.count(code, "UTMALDG.2D") == 2, f"A's and B's TMA loads: {what}"
        assert sass.count(code, "SYNCS.ARRIVE.TRANS64"), f"no transaction-count arrive: {what}"
        assert not sass.count(code, "HMMA") and not sass.count(code, "LDGSTS"), f"mma.sync pieces in the wgmma path: {what}"
        assert not usage.local and not usage.stack and not any(i.base in ("LDL", "STL") for i in code), f"local memory: {what}"
        threads = threads_per_block(SPEC, WG, config)
        assert threads == (config["BM"] // config["WM"] + 1) * 128
        assert usage.registers * threads <= 65536, f"{usage.registers} registers x {threads} threads: {what}"
