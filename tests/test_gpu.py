"""On a GPU: every example_pkg kernel against NumPy, through every array library installed,
on the default stream and on two user streams. Skipped on machines without a CUDA GPU (CI).

Sizes cover 1, primes, 2^k +- 1, values on, between and off the buckets."""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest
from conftest import device_sync

from hatch_autotune.plan.devices import detect_gpu_arch

GPU_ARCH = detect_gpu_arch()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPU_ARCH is None, reason="needs a CUDA GPU")]

SAXPY_SIZES = [1, 2, 3, 7, 31, 127, 1023, 4095, 4096, 4097, 65537, 262143, 262144, 1_000_003, 2**24 + 1]
SOFTMAX_SHAPES = [(1, 1), (3, 45), (1, 1025), (256, 128), (17, 1023), (300, 129), (64, 8193)]
SGEMM_SHAPES = [(1, 1, 1), (37, 29, 19), (64, 64, 64), (257, 129, 65), (256, 1024, 256), (1000, 3, 4096)]


@pytest.fixture(scope="module")
def kernels(example_kernels):
    return example_kernels


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


def rng_array(shape, dtype, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", SAXPY_SIZES)
def test_saxpy_matches_numpy(kernels, cp, n, dtype):
    x, y = rng_array(n, dtype, 1), rng_array(n, dtype, 2)
    dx, dy = cp.asarray(x), cp.asarray(y)
    kernels.saxpy(1.5, dx, dy)
    cp.cuda.Device().synchronize()
    expected = (np.float32(1.5) * x.astype(np.float32) + y.astype(np.float32)).astype(dtype)
    tol = 1e-6 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(cp.asnumpy(dy).astype(np.float32), expected.astype(np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("shape", SOFTMAX_SHAPES)
def test_row_softmax_matches_numpy(kernels, cp, shape):
    x = rng_array(shape, np.float32, 3) * 5
    dx, dy = cp.asarray(x), cp.full(shape, cp.nan, dtype=cp.float32)  # poisoned output
    kernels.row_softmax(dx, dy)
    cp.cuda.Device().synchronize()
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(cp.asnumpy(dy), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("m,n,k", SGEMM_SHAPES)
def test_sgemm_matches_numpy(kernels, cp, m, n, k):
    a, b = rng_array((m, k), np.float32, 4), rng_array((k, n), np.float32, 5)
    dc = cp.full((m, n), cp.nan, dtype=cp.float32)
    kernels.sgemm(cp.asarray(a), cp.asarray(b), dc)
    cp.cuda.Device().synchronize()
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(cp.asnumpy(dc), expected, rtol=1e-4, atol=1e-4 * np.sqrt(k))


os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX would take 75% of the GPU


def _libraries():
    """The array libraries installed here that can reach the GPU."""
    probes = {
        "cupy": lambda m: m.cuda.runtime.getDeviceCount() > 0,
        "torch": lambda m: m.cuda.is_available(),
        "numba.cuda": lambda m: m.is_available(),
        "jax": lambda m: bool(m.devices("gpu")),
    }
    libs = []
    for name, usable in probes.items():
        try:
            if usable(importlib.import_module(name)):
                libs.append(name)
        except Exception:
            pass
    return libs


def _to_device(lib, host):
    if lib == "cupy":
        import cupy

        return cupy.asarray(host), lambda a: cupy.asnumpy(a)
    if lib == "torch":
        import torch

        return torch.from_numpy(host).cuda(), lambda a: a.cpu().numpy()
    if lib == "numba.cuda":
        from numba import cuda

        return cuda.to_device(host), lambda a: a.copy_to_host()
    if lib == "jax":
        import jax

        # JAX copies asynchronously on its own stream: wait, so the test is about the array type
        return jax.device_put(host, jax.devices("gpu")[0]).block_until_ready(), lambda a: np.asarray(a)
    raise AssertionError(lib)


@pytest.mark.parametrize("lib", _libraries())
def test_every_installed_array_library(kernels, lib):
    n = 100_003
    x, y = rng_array(n, np.float32, 6), rng_array(n, np.float32, 7)
    dx, _ = _to_device(lib, x)
    # JAX arrays are immutable: JAX provides the input, CuPy the output
    dy, back = _to_device("cupy" if lib == "jax" else lib, y)
    kernels.saxpy(2.0, dx, dy)
    device_sync()  # cuda.core: Device().sync() alone raises "not yet initialized"
    np.testing.assert_allclose(back(dy), 2 * x + y, rtol=1e-6)


def test_two_streams(kernels, cp):
    n = 1 << 20
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    xs = [cp.asarray(rng_array(n, np.float32, i)) for i in (8, 9)]
    ys = [cp.zeros(n, cp.float32) for _ in range(2)]
    cp.cuda.Device().synchronize()  # those ran on the legacy stream; s1/s2 are non-blocking
    for x, y, s in zip(xs, ys, (s1, s2)):
        with s:
            y.fill(1.0)  # on the same stream as the kernel, so ordering holds
        kernels.saxpy(3.0, x, y, stream=s)
    s1.synchronize()
    s2.synchronize()
    for x, y in zip(xs, ys):
        # The kernel's fmaf rounds 3x+1 once, NumPy's float32 twice: where the sum nearly cancels
        # they differ by an ulp of the inputs (seen on an H200, 2026-11-26), so the reference is
        # float64 and the tolerance absolute there.
        np.testing.assert_allclose(cp.asnumpy(y), 3 * cp.asnumpy(x).astype(np.float64) + 1, rtol=1e-6, atol=1e-6)
    before = cp.asnumpy(ys[0])
    kernels.saxpy(1.0, xs[0], ys[0], stream=s1.ptr)  # a raw handle works too
    s1.synchronize()
    np.testing.assert_allclose(cp.asnumpy(ys[0]), cp.asnumpy(xs[0]) + before, rtol=1e-6)


def test_wrong_arguments_on_real_arrays(kernels, cp):
    x = cp.zeros(10, cp.float32)
    with pytest.raises(TypeError, match="argument 'y' has dtype float64"):
        kernels.saxpy(1.0, x, cp.zeros(10, cp.float64))
    with pytest.raises(ValueError, match="argument 'y' has shape"):
        kernels.saxpy(1.0, x, cp.zeros(11, cp.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.saxpy(1.0, cp.zeros(20, cp.float32)[::2], x)
    with pytest.raises(ValueError, match=r"^saxpy\(\): argument 'x' is in host memory; expected a GPU array$"):
        kernels.saxpy(1.0, np.zeros(10, np.float32), x)


def test_zero_size_launches_nothing(kernels, cp):
    """Counted through the runtime's seam, over the real driver: an empty call reaches no
    launch (on either path), a non-empty one does."""
    rt = kernels._runtime
    real = rt.CudaApi.load()
    launched = []

    class CountingDriver:
        def __getattr__(self, name):
            return getattr(real.driver, name)

        def cuLaunchKernel(self, *args):
            launched.append(args)
            return real.driver.cuLaunchKernel(*args)

    rt.use_gpu(real.replace(driver=CountingDriver()))
    try:
        saxpy = rt.Library.load(kernels._LIBRARY.directory).kernels["saxpy"]
        empty = cp.zeros(0, cp.float32)
        saxpy(1.0, empty, empty)  # the checked path
        saxpy(1.0, empty, empty)  # the fast path
        assert launched == []
        x, y = cp.ones(5, cp.float32), cp.ones(5, cp.float32)
        saxpy(2.0, x, y)
        cp.cuda.Device().synchronize()
        assert len(launched) == 1 and cp.asnumpy(y).tolist() == [3.0] * 5
    finally:
        rt.use_gpu(None)


def test_a_call_captured_in_a_cuda_graph_runs_on_each_replay(kernels, cp):
    """A call inside CuPy's stream capture launches nothing then; each replay of the graph runs
    it again, on the arrays and the scalar it was captured with."""
    n = 1 << 16
    x = cp.asarray(np.random.default_rng(20).integers(-8, 8, n).astype(np.float32))  # integers: sums are exact
    y = cp.asarray(np.random.default_rng(21).integers(-8, 8, n).astype(np.float32))
    y0, x0 = cp.asnumpy(y), cp.asnumpy(x)
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.Device().synchronize()
    kernels.saxpy(0.0, x, y, stream=s)  # a first call loads the module: done before capture, as for any graph
    s.synchronize()
    s.begin_capture()
    kernels.saxpy(2.0, x, y, stream=s)
    graph = s.end_capture()
    np.testing.assert_array_equal(cp.asnumpy(y), y0)  # captured, not run
    for replays in (1, 2, 3):
        graph.launch(stream=s)
        s.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(y), y0 + 2 * replays * x0)


def test_pytorch_tensors_on_a_pytorch_stream_keep_its_order(kernels):
    """Tensors from PyTorch, the call on a PyTorch stream between two PyTorch operations on that
    stream: the kernel sees the first one's result and the second sees the kernel's."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    n = 1 << 20
    x = torch.from_numpy(rng_array(n, np.float32, 22)).cuda()
    y = torch.from_numpy(rng_array(n, np.float32, 23)).cuda()
    x64, y64 = x.cpu().numpy().astype(np.float64), y.cpu().numpy().astype(np.float64)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y.mul_(2.0)
        kernels.saxpy(3.0, x, y, stream=s)
        y.add_(1.0)
    s.synchronize()
    np.testing.assert_allclose(y.cpu().numpy(), 2 * y64 + 3 * x64 + 1, rtol=1e-6, atol=1e-5)


def test_pytorch_tensors_without_a_stream_run_on_pytorchs_current_stream(kernels):
    """stream=None with PyTorch tensors means PyTorch's current stream, as for PyTorch's own
    operations: inside `with torch.cuda.stream(s)` (a non-blocking stream, which the legacy
    default stream does not wait for) the kernel is ordered between the two operations on s,
    on the fast path too; a tensor that requires grad is passed by its data; a CPU tensor is named."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    n = 1 << 22
    x = torch.from_numpy(rng_array(n, np.float32, 24)).cuda().requires_grad_(True)
    y = torch.from_numpy(rng_array(n, np.float32, 25)).cuda()
    x64, y64 = x.detach().cpu().numpy().astype(np.float64), y.cpu().numpy().astype(np.float64)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):  # the checked path, then the fast path
            y.mul_(2.0)
            kernels.saxpy(3.0, x, y)
        y.add_(1.0)
    s.synchronize()
    expected = y64
    for _ in range(3):
        expected = 2 * expected + 3 * x64
    np.testing.assert_allclose(y.cpu().numpy(), expected + 1, rtol=1e-5, atol=1e-3)
    with pytest.raises(ValueError, match=r"^saxpy\(\): argument 'y' is in host memory; expected a GPU array$"):
        kernels.saxpy(3.0, x, torch.zeros(n))


def test_cupy_arrays_without_a_stream_run_on_cupys_current_stream(kernels, cp):
    n = 1 << 22
    x0, y0 = rng_array(n, np.float32, 26), rng_array(n, np.float32, 27)
    x, y = cp.asarray(x0), cp.asarray(y0)
    cp.cuda.Device().synchronize()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        for _ in range(3):
            y *= 2.0
            kernels.saxpy(3.0, x, y)
        y += 1.0
    s.synchronize()
    expected = y0.astype(np.float64)
    for _ in range(3):
        expected = 2 * expected + 3 * x0.astype(np.float64)
    np.testing.assert_allclose(cp.asnumpy(y), expected + 1, rtol=1e-5, atol=1e-3)


TWO_PROCESSES = """
import os, sys, time
import numpy as np
import cupy as cp
from example_pkg import kernels

seed, barrier = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(seed)
x = rng.integers(-8, 8, 1 << 22).astype(np.float32)  # integers: y + CALLS * x stays exact in float32
y = rng.integers(-8, 8, 1 << 22).astype(np.float32)
dx, dy = cp.asarray(x), cp.asarray(y)
kernels.saxpy(0.0, dx, dy)
cp.cuda.Device().synchronize()
open(os.path.join(barrier, str(seed)), "w").close()
deadline = time.monotonic() + 60
while len(os.listdir(barrier)) < 2:  # both started: the calls below overlap
    if time.monotonic() > deadline:
        sys.exit("the other process never got ready")
    time.sleep(0.001)
for _ in range({calls}):
    kernels.saxpy(1.0, dx, dy)
cp.cuda.Device().synchronize()
np.testing.assert_array_equal(cp.asnumpy(dy), y + {calls} * x)
print("ok", seed)
"""


def test_two_processes_calling_at_once_both_get_their_results(kernels, cp, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    site = Path(kernels.__file__).parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    barrier = tmp_path / "ready"
    barrier.mkdir()
    script = TWO_PROCESSES.format(calls=3000)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(seed), str(barrier)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for seed in (31, 32)
    ]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for seed, p, (out, err) in zip((31, 32), procs, outs):
        assert p.returncode == 0 and out.split() == ["ok", str(seed)], err[-2000:]
