"""On a GPU with PyTorch's CUDA build: example_pkg's kernels as PyTorch operators (issue #37)
against NumPy, under torch.compile (Inductor, fullgraph), inside a captured CUDA graph, on
PyTorch's current stream, and refusing bad tensors before any launch. Skipped without a GPU or
without a PyTorch that sees it. tests/test_torch_ops.py proves the rest on the CPU; the per-call
cost against a direct call is measured in benchmarks/launch_overhead.py."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from hatch_autotune.plan.devices import detect_gpu_arch

GPU_ARCH = detect_gpu_arch()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPU_ARCH is None, reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    return torch


@pytest.fixture(scope="module")
def ops(example_kernels, torch):
    return importlib.import_module("example_pkg.kernels.torch_ops")


def tensor(torch, shape, seed, dtype=np.float32):
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape).astype(dtype)).cuda()


def softmax64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("shape", [(1, 1), (3, 45), (17, 1023), (300, 129), (64, 8193)])
def test_row_softmax_operators_match_numpy(ops, torch, shape):
    x = tensor(torch, shape, 1)
    y = ops.row_softmax(x)
    assert (tuple(y.shape), y.dtype, y.device) == (shape, torch.float32, x.device)
    out = torch.full(shape, float("nan"), device="cuda")
    ops.row_softmax_out(x, out)
    torch.cuda.synchronize()
    np.testing.assert_allclose(y.cpu().numpy(), softmax64(x.cpu().numpy()), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(out.cpu().numpy(), y.cpu().numpy())


@pytest.mark.parametrize("mnk", [(1, 1, 1), (37, 29, 19), (257, 129, 65), (1000, 3, 4096)])
def test_sgemm_operators_match_numpy(ops, torch, mnk):
    m, n, k = mnk
    a, b = tensor(torch, (m, k), 2), tensor(torch, (k, n), 3)
    c = ops.sgemm(a, b)
    out = torch.empty(m, n, device="cuda")
    ops.sgemm_out(a, b, out)
    expected = a.cpu().numpy().astype(np.float64) @ b.cpu().numpy().astype(np.float64)
    np.testing.assert_allclose(c.cpu().numpy(), expected, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    np.testing.assert_array_equal(out.cpu().numpy(), c.cpu().numpy())


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_saxpy_operator_writes_y(ops, torch, dtype):
    n = 1_000_003
    x, y = tensor(torch, n, 4, dtype), tensor(torch, n, 5, dtype)
    expected = 1.5 * x.cpu().numpy().astype(np.float64) + y.cpu().numpy().astype(np.float64)
    assert ops.saxpy(1.5, x, y) is None
    np.testing.assert_allclose(y.cpu().numpy().astype(np.float64), expected, rtol=1e-3 if dtype == np.float16 else 1e-6, atol=1e-2)


def model(ops, torch):
    def forward(x, w, bias):
        p = ops.row_softmax(x * 2.0)
        h = ops.sgemm(p, w)
        ops.saxpy(0.5, bias.expand_as(h).contiguous().view(-1), h.view(-1))
        return torch.relu(h)

    return forward


def test_torch_compile_fullgraph_with_inductor_matches_eager(ops, torch):
    forward = model(ops, torch)
    x, w, bias = tensor(torch, (96, 200), 6), tensor(torch, (200, 72), 7), tensor(torch, (1, 72), 8)
    eager = forward(x, w, bias)
    torch._dynamo.reset()
    compiled = torch.compile(forward, fullgraph=True)
    for _ in range(2):
        got = compiled(x, w, bias)
    torch.cuda.synchronize()
    np.testing.assert_allclose(got.cpu().numpy(), eager.cpu().numpy(), rtol=1e-5, atol=1e-6)
    explained = torch._dynamo.explain(forward)(x, w, bias)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_a_captured_cuda_graph_replays_the_operators_on_new_data(ops, torch):
    x, w = tensor(torch, (64, 128), 9), tensor(torch, (128, 32), 10)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as PyTorch asks: loads the modules
        for _ in range(2):
            ops.sgemm(ops.row_softmax(x), w)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        h = ops.sgemm(ops.row_softmax(x), w)
        ops.saxpy(2.0, h.view(-1), h.view(-1))  # h = 3 h
    for seed in (11, 12):
        x.copy_(tensor(torch, (64, 128), seed))
        graph.replay()
        torch.cuda.synchronize()
        expected = 3 * (softmax64(x.cpu().numpy()) @ w.cpu().numpy().astype(np.float64))
        np.testing.assert_allclose(h.cpu().numpy(), expected, rtol=1e-4, atol=1e-5)


def test_operators_run_on_pytorchs_current_stream(ops, torch):
    x = tensor(torch, (512, 1024), 13)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):  # ordered between two operations on s, which the default stream does not wait for
        x.mul_(2.0)
        y = ops.row_softmax(x)
        y.mul_(3.0)
    s.synchronize()
    np.testing.assert_allclose(y.cpu().numpy(), 3 * softmax64(x.cpu().numpy()), rtol=1e-5, atol=1e-6)


def test_bad_tensors_are_refused_before_any_launch(ops, torch):
    x = tensor(torch, (8, 16), 14)
    with pytest.raises(TypeError, match=r"^row_softmax\(\): argument 'x' has dtype float64; expected float32$"):
        ops.row_softmax(x.double())
    with pytest.raises(ValueError, match=r"^row_softmax\(\): argument 'x' must be C-contiguous"):
        ops.row_softmax(tensor(torch, (16, 8), 15).t())
    with pytest.raises(ValueError, match=r"^sgemm\(\): argument 'C' has shape \(8, 5\); expected \(8, 4\)"):
        ops.sgemm_out(x, tensor(torch, (16, 4), 16), torch.empty(8, 5, device="cuda"))
    with pytest.raises(ValueError, match=r"^row_softmax\(\): argument 'x' is in host memory; expected a GPU array$"):
        ops.row_softmax(x.cpu())
