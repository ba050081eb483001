"""Every config of example_pkg's showcase kernels against NumPy at odd sizes, on a GPU (skipped
without one). The tuner only ever runs the configs it measures, and a wrong config that happens
to be slow would never show; so each config the space keeps is compiled for this GPU and launched
here directly, as the runtime would launch it (host_cuda.launch_of: arguments, grid and block
from the declaration), on CuPy arrays: sizes that are no multiple of any tile, misaligned views
that must take the scalar paths, and rows with -inf and NaN for the softmax. On the CPU the
same kernels run on the host emulator (tests/test_sgemm_template.py, test_softmax_template.py)."""

from __future__ import annotations

import gpu_launch
import numpy as np
import pytest
from conftest import EXAMPLE, load_project

from hatch_autotune.plan.devices import detect_gpu_arch

GPU_ARCH = detect_gpu_arch()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPU_ARCH is None, reason="needs a CUDA GPU")]

PROJECT = load_project(EXAMPLE)


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


@pytest.fixture(scope="module")
def compiled(session_cache, tmp_path_factory):
    """kernel -> [(types, config, cubin path)] for every config of its space, built for this GPU."""
    return gpu_launch.compile_every_config(
        PROJECT, ("saxpy", "row_softmax", "sgemm"), GPU_ARCH, session_cache, tmp_path_factory.mktemp("showcase-cubins")
    )


def launch(cp, name: str, types, config, cubin, args) -> None:
    gpu_launch.launch(cp, PROJECT.kernels[name], types, config, cubin, args)


def misaligned(cp, host: np.ndarray):
    """A device copy of `host` that starts 4 bytes past a 16-byte boundary (a view [1:])."""
    store = cp.empty(host.size + 1, host.dtype)
    view = store[1:].reshape(host.shape)
    view[...] = cp.asarray(host)
    return view


def test_every_saxpy_config(cp, compiled):
    rng = np.random.default_rng(1)
    bad = []
    for types, config, cubin in compiled["saxpy"]:
        dtype = np.dtype(types["T"])
        for n in (1, 1001, 4099):
            for shift in (False, True):
                x, y = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
                want = (np.float32(1.5) * x.astype(np.float32) + y.astype(np.float32)).astype(dtype)
                dx, dy = (misaligned(cp, x), misaligned(cp, y)) if shift else (cp.asarray(x), cp.asarray(y))
                if shift and config["VEC"] > 1:
                    continue  # saxpy declares align = 16: the runtime refuses such views before a launch
                launch(cp, "saxpy", types, config, cubin, {"a": 1.5, "x": dx, "y": dy})
                got = cp.asnumpy(dy)
                if not np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2 if dtype == np.float16 else 1e-6, atol=1e-3):
                    bad.append((types, config, n, shift))
    assert not bad, f"{len(bad)} wrong: {bad[:5]}"


def softmax(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    m = x64.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        e = np.exp(x64 - m)
        return e / e.sum(axis=1, keepdims=True)


def test_every_row_softmax_config(cp, compiled):
    rng = np.random.default_rng(2)
    bad = []
    for rows, cols in ((5, 1), (7, 37), (3, 130), (9, 1000), (2, 9001)):
        x = (rng.standard_normal((rows, cols)) * 30).astype(np.float32)
        x[0, : cols // 2] = -np.inf
        if rows > 2:
            x[1, cols // 3] = np.nan
            x[2, :] = -np.inf
        want = softmax(x)
        for types, config, cubin in compiled["row_softmax"]:
            for shift in (False, True):
                dx = misaligned(cp, x) if shift else cp.asarray(x)
                dy = misaligned(cp, np.full_like(x, 7.0)) if shift else cp.full(x.shape, 7.0, cp.float32)
                launch(cp, "row_softmax", types, config, cubin, {"x": dx, "y": dy})
                got = cp.asnumpy(dy)
                if not np.allclose(got, want, rtol=1e-5, atol=1e-7, equal_nan=True):
                    bad.append((config, rows, cols, shift))
    assert not bad, f"{len(bad)} wrong: {bad[:5]}"


def test_every_sgemm_config(cp, compiled):
    rng = np.random.default_rng(3)
    bad = []
    # (130, 68, 1030): a long k, split over a cluster's blocks by the split-K configs (sm_90+)
    for m, n, k in ((133, 70, 37), (70, 132, 45), (5, 9, 3), (257, 260, 300), (130, 68, 1030)):
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        want = a.astype(np.float64) @ b.astype(np.float64)
        scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64) + 1e-30
        for types, config, cubin in compiled["sgemm"]:
            for shift in (False, True):
                da, db = (misaligned(cp, a), misaligned(cp, b)) if shift else (cp.asarray(a), cp.asarray(b))
                dc = misaligned(cp, np.full((m, n), np.nan, np.float32)) if shift else cp.full((m, n), cp.nan, cp.float32)
                launch(cp, "sgemm", types, config, cubin, {"A": da, "B": db, "C": dc})
                got = cp.asnumpy(dc)
                err = np.abs(got - want) / scale
                if not (np.isfinite(got).all() and err.max() <= 1e-5):
                    bad.append((config, (m, n, k), shift, float(np.nan_to_num(err.max(), nan=np.inf))))
    assert not bad, f"{len(bad)} wrong: {bad[:5]}"
