"""templates/rmsnorm.cu.j2 as example_pkg declares it (`rmsnorm` and `add_rmsnorm`), without a GPU.

1. The space against NVRTC: every config the constraints keep compiles for sm_80 and sm_90, for
   every type, with no spills, no stack and registers x threads within a block's 64K; so the
   constraints, not the tuner's pruning, keep the space launchable. The constraints refuse what
   they say they refuse.
2. Results on the host emulator (tests/host_cuda.py: real threads, shuffles, barriers,
   AddressSanitizer on every array, UBSan's alignment check on every vector access) against a
   float64 NumPy reference, for configs that span the axes (one warp and several warps per row,
   several rows a block with idle groups in the last one), at row lengths that take each of the
   four paths (16-byte vectors or scalars, one pass or two), for views with padded rows, a
   misaligned start, a row stride that breaks the vector alignment; bfloat16, float16 and
   float32; eps; and outputs that are the same array as an input (in-place residual update).
3. The machine code: 128-bit global loads and stores on the vector path, no local memory.
On a GPU, the tuner verifies every config against tuning_reference.py's float32 reference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import host_cuda
import ml_dtypes
import numpy as np
import pytest
import sass
from conftest import EXAMPLE, load_project, space_problems, threads_per_block

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.compile.nvrtc import compile_all
from hatch_autotune.compile.render import render_config

PROJECT = load_project(EXAMPLE)
KERNELS = ("rmsnorm", "add_rmsnorm")
SPECS = {name: PROJECT.kernels[name] for name in KERNELS}
ARCHS = ("sm_80", "sm_90")
DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
VEC = {"bfloat16": 8, "float16": 8, "float32": 4}  # elements in 16 bytes
# |y - reference| allowed, relative to |reference|: rounding to the output type (half an ulp)
# with room for float accumulation; float32 has only the accumulation's error.
RTOL = {"bfloat16": 2.0**-8, "float16": 2.0**-10, "float32": 2e-6}
# and absolutely: float16's subnormals (below 2^-14) are 2^-24 apart.
ATOL = {"bfloat16": 0.0, "float16": 2.0**-24, "float32": 0.0}


def capacity(config: Mapping[str, Any], dtype: str) -> int:
    """Elements of a row the vector path holds in registers (one pass up to this many)."""
    return int(config["BLOCK"] // config["ROWS"] * config["ITEMS"] * VEC[dtype])


def scalar_capacity(config: Mapping[str, Any], dtype: str) -> int:
    """Elements of a row the scalar path holds in registers (SCALAR_ITEMS of the template)."""
    return int(config["BLOCK"] // config["ROWS"] * min(config["ITEMS"] * VEC[dtype], 8))


# ---- the space ------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_space_is_small_and_spans_the_axes(kernel: str) -> None:
    spec = SPECS[kernel]
    for dtype in DTYPES:
        configs = spec.configs({"T": dtype})
        assert 20 <= len(configs) <= 48, f"{dtype}: {len(configs)} configs; a bucket's tuning measures them all"
        assert dict(spec.default) in configs
        assert {c["ROWS"] for c in configs} == {1, 2, 4} and {c["ITEMS"] for c in configs} == {1, 2, 4, 8}
        # every cols bucket has configs that hold its rows in registers (one DRAM pass)
        for cols in next(k for k in spec.key if k.name == "cols").buckets:
            assert any(capacity(c, dtype) >= cols for c in configs), (dtype, cols)
        assert all(c["FUSED"] == (kernel == "add_rmsnorm") for c in configs)


def test_every_config_compiles_within_a_blocks_resources(session_cache: Path) -> None:
    """Both kernels, every type, sm_80 and sm_90: about 200 compiles (the toolkit's 16-bit
    headers, precompiled), a minute on two cores."""
    problems = [p for spec in SPECS.values() for p in space_problems(spec, session_cache, ARCHS)]
    assert not problems, f"{len(problems)} configs the constraints keep cannot launch:\n" + "\n".join(problems[:20])


def test_the_constraints_refuse_what_the_template_cannot_build() -> None:
    """The constraints, not a compile error, exclude an illegal or useless config; each change
    below breaks one of them (or none: `accepted`)."""
    for kernel, dtype, change, why in [
        ("rmsnorm", "bfloat16", {"BLOCK": 64, "ROWS": 4, "ITEMS": 8}, "a group of 16 threads is not whole warps"),
        ("rmsnorm", "bfloat16", {"BLOCK": 512, "ROWS": 2}, "two rows a block only for groups of at most 4 warps"),
        ("rmsnorm", "bfloat16", {"BLOCK": 1024, "ITEMS": 8}, "8 cached vectors for 1024 threads of 64 registers each"),
        ("rmsnorm", "float32", {"BLOCK": 64, "ROWS": 1, "ITEMS": 2}, "a group holding 512 floats: the smallest bucket takes two passes"),
        ("rmsnorm", "bfloat16", {"BLOCK": 64, "ROWS": 1, "ITEMS": 2}, "accepted: 1024 bfloat16 in one pass"),
        ("rmsnorm", "float32", {"BLOCK": 128, "ROWS": 4, "ITEMS": 8}, "accepted: 4 one-warp groups of 1024 floats each"),
        ("rmsnorm", "bfloat16", {"BLOCK": 1024, "ITEMS": 4}, "accepted: 32 bfloat16 a thread in 64 registers"),
        ("add_rmsnorm", "bfloat16", {"BLOCK": 1024, "ITEMS": 4}, "x and residual in flight: 32 bfloat16 a thread do not fit 64 registers"),
        ("add_rmsnorm", "bfloat16", {"BLOCK": 1024, "ITEMS": 2}, "accepted: 16384 bfloat16, the largest bucket, in one pass"),
    ]:
        spec = SPECS[kernel]
        config = {**spec.default, **change}
        kept = config in spec.configs({"T": dtype})
        assert kept == why.startswith("accepted"), (kernel, dtype, config, why)


# ---- results on the host emulator -------------------------------------------------------------

# (config, why): one warp per row, several warps, several rows a block; and the default.
CONFIGS = [
    ({"BLOCK": 64, "ROWS": 2, "ITEMS": 8}, "two one-warp groups: shuffles only; rows = 5 leaves a group idle"),
    ({"BLOCK": 128, "ROWS": 1, "ITEMS": 2}, "four warps per row: the shared-memory step of the reduction"),
    ({"BLOCK": 256, "ROWS": 4, "ITEMS": 4}, "four two-warp groups: a reduction per group in one block"),
    ({"BLOCK": 256, "ROWS": 1, "ITEMS": 4}, "the default"),
]
ROWS_N = 5


def row_lengths(config: Mapping[str, Any], dtype: str) -> list[int]:
    """Row lengths that take every path of `config` for `dtype`: cols = 1, 7, 4099 (scalar: an
    odd length), 1000 (vectors), the vector path's longest one-pass row and the next one (two
    passes), two and a bit steps of it (a partial last step), and odd lengths just inside and
    outside the scalar path's one pass."""
    vec, cap, scap = VEC[dtype], capacity(config, dtype), scalar_capacity(config, dtype)
    return sorted({1, 7, 1000, 4099, cap, cap + vec, 2 * cap + 3 * vec, scap - 1, scap + 1})


def reference(x: np.ndarray, w: np.ndarray, eps: float, residual: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(y, the rows normalised) in float64; with a residual, the rows are x + residual as the
    kernel stores them: added in float32, rounded once to the type (what residual_out must hold)."""
    rows = x if residual is None else (x.astype(np.float32) + residual.astype(np.float32)).astype(x.dtype)
    r = rows.astype(np.float64)
    scale = 1.0 / np.sqrt(np.mean(r * r, axis=1, keepdims=True) + np.float64(np.float32(eps)))
    return r * scale * w.astype(np.float64), rows


def assert_close(y: np.ndarray, want: np.ndarray, dtype: str, what: str) -> None:
    got = y.astype(np.float64)
    err = np.abs(got - want) - RTOL[dtype] * np.abs(want) - ATOL[dtype]
    assert np.isfinite(got).all(), f"{what}: {np.count_nonzero(~np.isfinite(got))} non-finite outputs (an element not written?)"
    worst = np.unravel_index(err.argmax(), err.shape)
    assert err.max() <= 1e-30, (
        f"{what}: at {worst} got {got[worst]!r}, want {want[worst]!r} (rtol {RTOL[dtype]:.1e}, atol {ATOL[dtype]:.1e})"
    )


def random_rows(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32).astype(DTYPES[dtype])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if host_cuda.CXX is None:
        pytest.skip("needs g++ for the host emulator")
    return tmp_path_factory.mktemp("norm-emulated")


def run(kernel: str, dtype: str, config: Mapping[str, Any], arrays: dict[str, Any], eps: float, workdir: Path) -> None:
    spec = SPECS[kernel]
    config = {**spec.default, **config}
    host_cuda.run_variant(spec, {"T": dtype}, config, {**arrays, "eps": np.float32(eps)}, workdir=workdir)


def check_call(
    kernel: str,
    dtype: str,
    config: Mapping[str, Any],
    x: np.ndarray,
    w: np.ndarray,
    eps: float,
    workdir: Path,
    residual: np.ndarray | None = None,
    y: np.ndarray | None = None,
    residual_out: np.ndarray | None = None,
) -> None:
    """Run `kernel` on these arrays (fresh NaN outputs unless given: every element must be
    written) and compare with the reference."""
    what = f"{kernel} {dtype} {config} cols={x.shape[1]}"
    y = np.full(x.shape, np.nan, DTYPES[dtype]) if y is None else y
    arrays: dict[str, Any] = {"x": x, "w": w, "y": y}
    if kernel == "add_rmsnorm":
        residual_out = np.full(x.shape, np.nan, DTYPES[dtype]) if residual_out is None else residual_out
        arrays.update(residual=residual, residual_out=residual_out)
    run(kernel, dtype, config, arrays, eps, workdir)
    want, rows = reference(x, w, eps, residual)
    if residual_out is not None:
        assert np.array_equal(residual_out.view(np.uint8), rows.view(np.uint8)), f"{what}: residual_out is not x + residual"
    assert_close(y, want, dtype, what)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("config", [c for c, _ in CONFIGS], ids=[f"{c['BLOCK']}x{c['ROWS']}x{c['ITEMS']}" for c, _ in CONFIGS])
def test_results_match_numpy_on_every_path(workdir: Path, kernel: str, dtype: str, config: dict[str, int]) -> None:
    assert {**SPECS[kernel].default, **config} in SPECS[kernel].configs({"T": dtype}), f"{config} is not in the space"
    rng = np.random.default_rng(11)
    for cols in row_lengths(config, dtype):
        x = random_rows(rng, (ROWS_N, cols), dtype)
        w = random_rows(rng, (cols,), dtype)
        residual = random_rows(rng, (ROWS_N, cols), dtype) if kernel == "add_rmsnorm" else None
        check_call(kernel, dtype, config, x, w, 1e-6, workdir, residual)


def padded(
    rng: np.random.Generator, rows: int, cols: int, dtype: str, start: int, row_length: int, fill: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(a view [rows, cols] at column `start` of a [rows, row_length] array, that array): random
    values, or `fill` everywhere."""
    owner = random_rows(rng, (rows, row_length), dtype) if fill is None else np.full((rows, row_length), fill, DTYPES[dtype])
    return owner[:, start : start + cols], owner


# (start, row length - cols, why): where a view's rows begin in their owner.
VIEWS = [
    (0, 16, "padded rows, 16-byte aligned: the vector path"),
    (8, 24, "a column slice that starts 16 bytes in: the vector path"),
    (1, 9, "a start 1 element in: the scalar path"),
    (0, 1, "a row stride that is no multiple of 16 bytes: rows after the first misaligned, the scalar path"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_views_with_padded_rows_are_read_and_written_in_place(workdir: Path, kernel: str, dtype: str) -> None:
    """Every array a view of a wider one; the outputs' padding must stay as it was (NaN), so the
    kernel writes each element of the view and nothing else. Under UBSan a 16-byte access on a
    misaligned view aborts, so the scalar fallback is proven taken."""
    rng = np.random.default_rng(5)
    config = {"BLOCK": 64, "ROWS": 2, "ITEMS": 8}  # one pass up to 2048 bfloat16 / 1024 float32
    for cols in (capacity(config, dtype), capacity(config, dtype) + 3 * VEC[dtype]):  # one pass, two
        for start, extra, why in VIEWS:
            what = f"{kernel} {dtype} cols={cols}: {why}"
            x, _ = padded(rng, ROWS_N, cols, dtype, start, cols + extra)
            y, y_owner = padded(rng, ROWS_N, cols, dtype, start, cols + extra, fill=np.nan)
            w = random_rows(rng, (cols,), dtype)
            arrays = {"x": x, "w": w, "y": y}
            residual = out_owner = None
            if kernel == "add_rmsnorm":
                residual, _ = padded(rng, ROWS_N, cols, dtype, start, cols + extra + 8)
                out, out_owner = padded(rng, ROWS_N, cols, dtype, start, cols + extra, fill=np.nan)
                arrays.update(residual=residual, residual_out=out)
            run(kernel, dtype, config, arrays, 1e-5, workdir)
            want, rows = reference(x, w, 1e-5, residual)
            assert_close(y, want, dtype, what)
            for owner in (y_owner, out_owner):
                if owner is not None:
                    outside = np.ones(owner.shape, bool)
                    outside[:, start : start + cols] = False
                    assert np.isnan(owner[outside].astype(np.float32)).all(), f"{what}: an element outside the view was written"
            if kernel == "add_rmsnorm":
                assert np.array_equal(arrays["residual_out"].astype(np.float32), rows.astype(np.float32)), what


def test_a_misaligned_weight_takes_the_scalar_path(workdir: Path) -> None:
    """w one element past a 16-byte boundary (a slice of a bigger parameter) while x and y are
    aligned: 16-byte loads of w would fault on a GPU (and abort under UBSan here)."""
    rng = np.random.default_rng(9)
    cols = 1024
    x = random_rows(rng, (ROWS_N, cols), "bfloat16")
    w = random_rows(rng, (cols + 1,), "bfloat16")[1:]
    check_call("rmsnorm", "bfloat16", {}, x, w, 1e-6, workdir)


@pytest.mark.parametrize("dtype", DTYPES)
def test_eps_is_added_to_the_mean_square(workdir: Path, dtype: str) -> None:
    """Small rows (mean square 1e-6) with eps = 1e-2: y is close to x / sqrt(eps) * w, about
    100 times smaller than without eps; both kernels, one pass and two."""
    rng = np.random.default_rng(2)
    eps = 1e-2
    for kernel in KERNELS:
        for cols in (1000, 3000):
            x = (rng.standard_normal((ROWS_N, cols)) * 1e-3).astype(np.float32).astype(DTYPES[dtype])
            w = random_rows(rng, (cols,), dtype)
            residual = np.zeros_like(x) if kernel == "add_rmsnorm" else None
            y = np.full(x.shape, np.nan, DTYPES[dtype])
            check_call(kernel, dtype, {"BLOCK": 128, "ROWS": 1, "ITEMS": 2}, x, w, eps, workdir, residual, y=y)
            without, _ = reference(x, w, 0.0)
            assert np.abs(y.astype(np.float64)).max() < 0.1 * np.abs(without).max(), f"{kernel} {dtype}: eps was not added"


# The kernels called with an output that is an input, as a caller does in place: the entry
# called by a wrapper that passes one pointer twice (the emulator gives each array argument its
# own buffer, so passing one NumPy array twice would not alias).
IN_PLACE = {
    "add_rmsnorm": """
extern "C" __global__ void in_place(const elem_t* x, elem_t* residual, const elem_t* w, elem_t* y, float eps, int rows, int cols,
                                    long long x_stride, long long residual_stride, long long y_stride)
{
    add_rmsnorm(x, residual, w, y, residual, eps, rows, cols, x_stride, residual_stride, y_stride, residual_stride);
}
""",
    "rmsnorm": """
extern "C" __global__ void in_place(elem_t* x, const elem_t* w, float eps, int rows, int cols, long long x_stride)
{
    rmsnorm(x, w, x, eps, rows, cols, x_stride, x_stride);
}
""",
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_an_output_may_be_its_input(workdir: Path, kernel: str, dtype: str) -> None:
    """add_rmsnorm(x, residual, w, y, residual_out=residual): the residual updated in place (the
    vLLM way), and rmsnorm(x, w, y=x); on the vector and scalar paths, one pass and two."""
    spec = SPECS[kernel]
    config = {**spec.default, "BLOCK": 64, "ROWS": 2, "ITEMS": 8}
    variant, _ = render_config(spec, {"T": dtype}, config)
    source = variant.source + IN_PLACE[kernel]
    rng = np.random.default_rng(4)
    for cols in (1000, capacity(config, dtype) + VEC[dtype], 199, 4099):  # vector: one pass, two; scalar: one, two
        x = random_rows(rng, (ROWS_N, cols), dtype)
        w = random_rows(rng, (cols,), dtype)
        grid = math.ceil(ROWS_N / config["ROWS"])
        sizes = [np.float32(1e-6), np.int32(ROWS_N), np.int32(cols), np.int64(cols)]
        if kernel == "add_rmsnorm":
            residual = random_rows(rng, (ROWS_N, cols), dtype)
            want, rows = reference(x, w, 1e-6, residual)
            y = np.full(x.shape, np.nan, DTYPES[dtype])
            out = residual.copy()  # updated in place
            params = [x, out, w, y, *sizes, np.int64(cols), np.int64(cols)]
        else:
            want, _ = reference(x, w, 1e-6)
            out = y = x.copy()  # normalised in place
            params = [y, w, *sizes]
        host_cuda.run_kernel(source, variant.headers, "in_place", params, grid, config["BLOCK"], workdir=workdir)
        if kernel == "add_rmsnorm":
            assert np.array_equal(out.view(np.uint8), rows.view(np.uint8)), f"cols={cols}: the residual updated in place is wrong"
        assert_close(y, want, dtype, f"{kernel} {dtype} in place, cols={cols}")


# ---- machine code ---------------------------------------------------------------------------------

SASS_CONFIGS = [{}, {"BLOCK": 128, "ROWS": 4, "ITEMS": 8}, {"BLOCK": 1024, "ROWS": 1, "ITEMS": 2}]


@pytest.mark.skipif(sass.missing_tools() is not None, reason=sass.missing_tools() or "")
def test_the_vector_path_moves_16_bytes_an_access_and_nothing_spills(session_cache: Path) -> None:
    """The default and two other configs, per kernel, type and arch: LDG.E.128 and STG.E.128
    (the vector path compiled as 16-byte accesses, not split into narrower ones), no local
    memory (LDL/STL, stack: the row cache stays in registers), registers within the block's
    64K."""
    cases, jobs = [], []
    for kernel, spec in SPECS.items():
        for dtype in DTYPES:
            for change in SASS_CONFIGS:
                config = {**spec.default, **change}
                if config not in spec.configs({"T": dtype}):
                    continue
                variant, _ = render_config(spec, {"T": dtype}, config)
                for arch in ARCHS:
                    cases.append((kernel, dtype, config, arch))
                    jobs.append(variant.compile_job(arch, spec.entry, spec.nvrtc_options))
    assert len(cases) >= 30
    problems = []
    for (kernel, dtype, config, arch), result in zip(cases, compile_all(jobs, CompileCache(session_cache))):
        label = f"{kernel} {dtype} {arch} {config}"
        assert result.ok and result.binary, f"{label}:\n{result.log[-2000:]}"
        code = sass.function_sass(result.binary, kernel)
        usage = sass.resource_usage(result.binary)[kernel]
        threads = threads_per_block(SPECS[kernel], {"T": dtype}, config)
        ops = sass.opcodes(code)
        for pattern in ("LDG.E.128", "STG.E.128"):
            if not sass.count(code, pattern):
                problems.append(f"{label}: no {pattern}")
        if usage.local or usage.stack or sass.count(code, "LDL") or sass.count(code, "STL"):
            problems.append(f"{label}: local memory ({usage})")
        if usage.registers * threads > 65536:
            problems.append(f"{label}: {usage.registers} registers x {threads} threads")
        if kernel == "add_rmsnorm" and sass.count(code, "LDG.E.128") < 3:
            problems.append(f"{label}: x, residual and w are not all read 16 bytes at a time: {ops}")
    assert not problems, "\n".join(problems)
