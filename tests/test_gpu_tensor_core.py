"""Every config of example_pkg's tensor-core gemm and of its norms against float references at
odd sizes, on a GPU (skipped without one). The tuner only ever runs the configs it measures; so,
as tests/test_gpu_showcase.py does for the older kernels, each config the space keeps is compiled
for this GPU and launched here directly, as the runtime would launch it (host_cuda.launch_of:
arguments, strides, grid, block and dynamic shared memory from the declaration), on CuPy arrays:
sizes that are no multiple of any tile, every layout of its instance (row-major, column-major,
padded rows, views misaligned by one element that must take the gather or scalar paths).
On the CPU the same kernels run on the host emulator (tests/test_gemm_template.py,
tests/test_norm_templates.py)."""

from __future__ import annotations

from typing import Any

import gpu_launch
import numpy as np
import pytest
from conftest import EXAMPLE, load_project

from hatch_autotune.plan.devices import detect_gpu_arch

GPU_ARCH = detect_gpu_arch()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPU_ARCH is None, reason="needs a CUDA GPU")]

PROJECT = load_project(EXAMPLE)
KERNELS = ("gemm", "rmsnorm", "add_rmsnorm")


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


@pytest.fixture(scope="module")
def ml_dtypes():
    return pytest.importorskip("ml_dtypes")


@pytest.fixture(scope="module")
def compiled(session_cache, tmp_path_factory):
    """kernel -> [(types, config, cubin path)] for every config of every instance, for this GPU."""
    return gpu_launch.compile_every_config(PROJECT, KERNELS, GPU_ARCH, session_cache, tmp_path_factory.mktemp("tensor-core-cubins"))


def launch(cp, name: str, types, config, cubin, args) -> None:
    gpu_launch.launch(cp, PROJECT.kernels[name], types, config, cubin, args)


def device_view(cp, host: np.ndarray, how: str):
    """A device array with `host`'s values in the layout `how`: "row" (C-contiguous), "col" (the
    transpose of a C-contiguous array), "padded" (rows 24 elements longer than needed: a view of
    a wider matrix), "misaligned" (a view starting one element past a 16-byte boundary, rows of
    an odd length) or "strided" (every other column of a wider matrix)."""
    rows, cols = host.shape
    if how == "row":
        return cp.asarray(host)
    if how == "col":
        return cp.asarray(np.ascontiguousarray(host.T)).T
    store_cols = {"padded": cols + 24, "misaligned": cols + 3, "strided": 2 * cols + 1}[how]
    store = cp.zeros((rows, store_cols), host.dtype)
    if how == "strided":
        view = store[:, 1 : 2 * cols + 1 : 2]
    elif how == "misaligned":
        view = store[:, 1 : cols + 1]
    else:
        view = store[:, :cols]
    view[...] = cp.asarray(host)
    return view


# A layout whose rows are contiguous (the unit-stride variant) and the others.
UNIT_LAYOUTS, OTHER_LAYOUTS = ("row", "padded", "misaligned"), ("col", "strided")


def test_every_gemm_config(cp, ml_dtypes, compiled):
    rng = np.random.default_rng(53)
    bad = []
    # (40, 136, 1000): every block of an 8-way split-K cluster gets slices of k
    for m, n, k in ((133, 70, 37), (5, 9, 3), (257, 260, 300), (1, 17, 64), (19, 40, 0), (40, 136, 1000)):
        for types, config, cubin in compiled["gemm"]:
            dtype = np.dtype(ml_dtypes.bfloat16) if types["T"] == "bfloat16" else np.dtype(np.float16)
            a = rng.uniform(-1, 1, (m, k)).astype(dtype)
            b = rng.uniform(-1, 1, (k, n)).astype(dtype)
            want = a.astype(np.float64) @ b.astype(np.float64)
            scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64) + 1e-30
            a_layouts = UNIT_LAYOUTS if types["A_unit_stride"] else OTHER_LAYOUTS
            b_layouts = UNIT_LAYOUTS if types["B_unit_stride"] else OTHER_LAYOUTS
            for a_how, b_how in zip(a_layouts, b_layouts[::-1] + b_layouts):
                da, db = device_view(cp, a, a_how), device_view(cp, b, b_how)
                dc = device_view(cp, np.full((m, n), np.nan, np.float32).astype(dtype), "padded" if a_how == "padded" else "row")
                launch(cp, "gemm", types, config, cubin, {"A": da, "B": db, "C": dc})
                got = cp.asnumpy(dc).astype(np.float64)
                err = np.abs(got - want) / scale
                tol = 2**-7 if types["T"] == "bfloat16" else 2**-10
                if not (np.isfinite(got).all() and err.max(initial=0.0) <= tol):
                    bad.append((types, config, (m, n, k), a_how, b_how, float(np.nan_to_num(err.max(initial=0.0), nan=np.inf))))
    assert not bad, f"{len(bad)} wrong: {bad[:5]}"


@pytest.fixture(scope="module")
def compiled_sm90a(session_cache, tmp_path_factory):
    """The gemm's sm_90a family (WGMMA = 1) compiled for sm_90a: on a device of compute capability 9.0 only."""
    if GPU_ARCH != "sm_90":
        pytest.skip(f"the sm_90a path runs on compute capability 9.0 only; this GPU is {GPU_ARCH}")
    folder = tmp_path_factory.mktemp("wgmma-cubins")
    every = gpu_launch.compile_every_config(PROJECT, ("gemm",), "sm_90a", session_cache, folder)["gemm"]
    return [(types, config, cubin) for types, config, cubin in every if config["WGMMA"]]


def test_every_wgmma_gemm_config(cp, ml_dtypes, compiled_sm90a):
    """Each WGMMA = 1 config (TMA, mbarriers, wgmma) against float64 NumPy: A row-major or with
    padded rows, B = W.T; sizes no multiple of any tile, k a multiple of 8 (TMA's 16-byte row
    pitch), k < 64 (one partial slice) and m == 1."""
    assert compiled_sm90a, "no WGMMA = 1 config compiled"
    rng = np.random.default_rng(90)
    bad = []
    for m, n, k in ((133, 70, 40), (257, 260, 328), (1, 17, 64), (300, 512, 1024)):
        for types, config, cubin in compiled_sm90a:
            dtype = np.dtype(ml_dtypes.bfloat16) if types["T"] == "bfloat16" else np.dtype(np.float16)
            a = rng.uniform(-1, 1, (m, k)).astype(dtype)
            b = rng.uniform(-1, 1, (k, n)).astype(dtype)
            want = a.astype(np.float64) @ b.astype(np.float64)
            scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64) + 1e-30
            for a_how in ("row", "padded"):
                da, db = device_view(cp, a, a_how), device_view(cp, b, "col")
                dc = device_view(cp, np.full((m, n), np.nan, np.float32).astype(dtype), a_how)
                launch(cp, "gemm", types, config, cubin, {"A": da, "B": db, "C": dc})
                got = cp.asnumpy(dc).astype(np.float64)
                err = np.abs(got - want) / scale
                tol = 2**-7 if types["T"] == "bfloat16" else 2**-10
                if not (np.isfinite(got).all() and err.max(initial=0.0) <= tol):
                    bad.append((types["T"], config, (m, n, k), a_how, float(np.nan_to_num(err.max(initial=0.0), nan=np.inf))))
    assert not bad, f"{len(bad)} wrong: {bad[:5]}"


def rms_reference(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x32 = x.astype(np.float32)
    return x32 / np.sqrt(np.mean(x32 * x32, axis=1, keepdims=True) + np.float32(eps)) * w.astype(np.float32)


def norm_tolerance(dtype: np.dtype) -> float:
    return {"bfloat16": 2**-6, "float16": 2**-9}.get(dtype.name, 1e-5)


def test_every_rmsnorm_and_add_rmsnorm_config(cp, ml_dtypes, compiled):
    rng = np.random.default_rng(54)
    bad = []
    eps = 1e-5
    for rows, cols in ((3, 1), (5, 7), (4, 1000), (3, 4099), (2, 9000), (17, 4096)):
        for name in ("rmsnorm", "add_rmsnorm"):
            for types, config, cubin in compiled[name]:
                dtype = np.dtype(ml_dtypes.bfloat16) if types["T"] == "bfloat16" else np.dtype(types["T"])
                x = rng.standard_normal((rows, cols)).astype(dtype)
                res = rng.standard_normal((rows, cols)).astype(dtype)
                w = rng.uniform(0.5, 1.5, cols).astype(dtype)
                summed = (x.astype(np.float32) + res.astype(np.float32)).astype(dtype) if name == "add_rmsnorm" else x
                want = rms_reference(summed, w, eps)
                for how in ("row", "padded", "misaligned"):
                    args: dict[str, Any] = {"x": device_view(cp, x, how), "w": cp.asarray(w), "eps": eps}
                    args["y"] = device_view(cp, np.full((rows, cols), np.nan, np.float32).astype(dtype), how)
                    if name == "add_rmsnorm":
                        args["residual"] = device_view(cp, res, how)
                        args["residual_out"] = device_view(cp, np.full((rows, cols), np.nan, np.float32).astype(dtype), how)
                    launch(cp, name, types, config, cubin, args)
                    got = cp.asnumpy(args["y"]).astype(np.float32)
                    ok = np.isfinite(got).all() and np.allclose(got, want, rtol=norm_tolerance(dtype), atol=norm_tolerance(dtype))
                    if name == "add_rmsnorm":
                        ok = ok and np.array_equal(cp.asnumpy(args["residual_out"]).astype(np.float32), summed.astype(np.float32))
                    if not ok:
                        bad.append((name, types, config, (rows, cols), how))
    assert not bad, f"{len(bad)} wrong: {bad[:5]}"
