"""The kernels as PyTorch operators (issue #37), with PyTorch's CPU build: the generated
`<module>.torch_ops` registers them (never `import <module>`), their schemas come from the
declarations, their fake implementations give the outputs' shapes (symbolic ones too) and the
call's own errors while tracing, torch.compile(fullgraph=True) and torch.export trace through
them, torch.library.opcheck passes on meta tensors, and a call reaches the driver.

No CUDA tensor exists here. A call's launch is proven down to the driver stand-in with
`StandinTensor`, a tensor subclass that PyTorch sees on a CUDA device and whose memory is the
stand-in's (the runtime reads it through __cuda_array_interface__, as any subclass); a
functional operator's outputs come from torch.empty, which the test points at the stand-in's
memory for CUDA devices: PyTorch's CUDA allocator is the one part imitated. tests/test_gpu_torch.py
runs the operators on a GPU: against NumPy, under torch.compile and inside a captured CUDA graph."""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import STENCIL_KIT as STENCIL
from conftest import errors_for, hook_table
from torch._subclasses.fake_tensor import FakeTensorMode

from hatch_autotune.declare.config import parse_project

EXAMPLE_ARCHS = ("sm_90",)


@pytest.fixture(scope="module")
def ops(example_kernels):
    """example_pkg's operators: its generated `torch_ops`, imported."""
    return importlib.import_module("example_pkg.kernels.torch_ops")


@pytest.fixture(scope="module")
def stencil_ops(stencil_kit):
    return importlib.import_module("stencil_kit.kernels.torch_ops")


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


# ---- registration and schemas ---------------------------------------------------------------

SCHEMAS = {
    "example_pkg::saxpy": "(float a, Tensor x, Tensor(a0!) y) -> ()",
    "example_pkg::row_softmax": "(Tensor x) -> Tensor",
    "example_pkg::row_softmax_out": "(Tensor x, Tensor(a0!) y) -> ()",
    "example_pkg::sgemm": "(Tensor A, Tensor B) -> Tensor",
    "example_pkg::sgemm_out": "(Tensor A, Tensor B, Tensor(a0!) C) -> ()",
    "example_pkg::gemm": "(Tensor A, Tensor B) -> Tensor",
    "example_pkg::gemm_out": "(Tensor A, Tensor B, Tensor(a0!) C) -> ()",
    "example_pkg::rmsnorm": "(Tensor x, Tensor w, float eps) -> Tensor",
    "example_pkg::rmsnorm_out": "(Tensor x, Tensor w, Tensor(a0!) y, float eps) -> ()",
    "example_pkg::add_rmsnorm": "(Tensor x, Tensor residual, Tensor w, float eps) -> (Tensor, Tensor)",
    "example_pkg::add_rmsnorm_out": "(Tensor x, Tensor residual, Tensor w, Tensor(a0!) y, Tensor(a1!) residual_out, float eps) -> ()",
    "stencil_kit::stencil": "(Tensor x, *, int RADIUS, bool PERIODIC) -> Tensor",
    "stencil_kit::stencil_out": "(Tensor x, Tensor(a0!) y, *, int RADIUS, bool PERIODIC) -> ()",
    "stencil_kit::halo_sum": "(Tensor x, *, int RADIUS) -> Tensor",
    "stencil_kit::halo_sum_out": "(Tensor x, Tensor(a0!) y, *, int RADIUS) -> ()",
    "stencil_kit::transpose": "(Tensor a) -> Tensor",
    "stencil_kit::transpose_out": "(Tensor a, Tensor(a0!) b) -> ()",
}


def test_each_kernel_is_registered_with_a_schema_from_its_declaration(ops, stencil_ops):
    registered = {}
    for module, ns in ((ops, "example_pkg"), (stencil_ops, "stencil_kit")):
        for name in module.__all__:
            packet = getattr(module, name)
            assert packet is getattr(getattr(torch.ops, ns), name)  # the module's names are torch.ops' own
            schema = packet.default._schema
            registered[f"{ns}::{name}"] = str(schema).removeprefix(f"{ns}::{name}")
            assert schema.is_mutable == (name in ("saxpy",) or name.endswith("_out"))
    assert registered == SCHEMAS


def test_importing_the_kernels_imports_no_pytorch_and_torch_ops_registers_once(example_kernels):
    site = Path(example_kernels.__file__).parents[2]
    code = textwrap.dedent(
        """
        import sys
        import example_pkg.kernels
        assert "torch" not in sys.modules, "import example_pkg.kernels imported PyTorch"
        from example_pkg.kernels import torch_ops
        import importlib, torch
        assert torch.ops.example_pkg.row_softmax is torch_ops.row_softmax
        again = importlib.reload(torch_ops)  # a second registration in the process: the same operators
        assert again.row_softmax is torch.ops.example_pkg.row_softmax
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=site, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_without_pytorch_the_operators_say_what_they_need(example_kernels):
    site = Path(example_kernels.__file__).parents[2]
    code = "import sys; sys.modules['torch'] = None\nfrom example_pkg.kernels import torch_ops"
    proc = subprocess.run([sys.executable, "-c", code], cwd=site, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "ImportError: the kernels' PyTorch operators need PyTorch 2.4 or newer (pip install torch); the kernels themselves do not"
        )
    ), proc.stderr


def test_a_pytorch_too_old_for_register_fake_is_refused(example_kernels, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.3.1+cu121")
    with pytest.raises(ImportError, match=r"need PyTorch 2\.4 or newer \(torch\.library\.register_fake\); this is PyTorch 2\.3\.1\+cu121$"):
        example_kernels._runtime.torch_ops.register(example_kernels._LIBRARY, "too_old")


def test_the_same_module_imported_again_takes_over_its_operators(ops, example_kernels, rt):
    torch_ops = rt.torch_ops
    again = rt.Library.load(example_kernels._LIBRARY.directory)  # another copy of the module's library
    packets = torch_ops.register(again, "example_pkg")
    assert packets["saxpy"] is ops.saxpy
    assert torch_ops._REGISTERED["example_pkg"].library is again
    torch_ops.register(example_kernels._LIBRARY, "example_pkg")
    assert torch_ops._REGISTERED["example_pkg"].library is example_kernels._LIBRARY


def test_another_module_or_other_schemas_in_a_namespace_are_refused(ops, example_kernels, rt):
    library = example_kernels._LIBRARY
    other = rt.Library(library.directory, {**library.table, "module": "other_pkg.kernels"})
    with pytest.raises(
        RuntimeError,
        match=r"^other_pkg\.kernels: torch\.ops\.example_pkg already holds the operators of example_pkg\.kernels; .*`torch-namespace`",
    ):
        rt.torch_ops.register(other, "example_pkg")
    kernels = dict(library.table["kernels"])
    saxpy = kernels["saxpy"]
    kernels["saxpy"] = {**saxpy, "args": [{**a, "intent": "in"} if a["name"] == "y" else a for a in saxpy["args"]]}
    changed = rt.Library(library.directory, {**library.table, "kernels": kernels})
    with pytest.raises(RuntimeError, match=r"another build of this module, whose operators differ \(saxpy\); .*restart the process"):
        rt.torch_ops.register(changed, "example_pkg")


def test_an_operator_name_taken_in_the_namespace_is_said(example_kernels, rt):
    theirs = torch.library.Library("taken_ns", "DEF")
    theirs.define("row_softmax(Tensor x, int dim) -> Tensor")
    with pytest.raises(
        RuntimeError,
        match=r"^example_pkg\.kernels: cannot define operator taken_ns::saxpy|^example_pkg\.kernels: cannot define operator taken_ns::row_softmax",
    ):
        rt.torch_ops.register(example_kernels._LIBRARY, "taken_ns")


# ---- fake implementations: shapes and errors while tracing -----------------------------------


def test_fake_outputs_have_the_declared_shape_dtype_and_the_inputs_device(ops, stencil_ops):
    with FakeTensorMode():
        x = torch.empty(300, 1000, device="cuda:1")
        y = ops.row_softmax(x)
        assert (tuple(y.shape), y.dtype, y.device) == ((300, 1000), torch.float32, torch.device("cuda", 1))
        c = ops.sgemm(torch.empty(64, 32, device="cuda"), torch.empty(32, 48, device="cuda"))
        assert (tuple(c.shape), c.device) == ((64, 48), torch.device("cuda", 0))
        assert (
            ops.saxpy(2.0, torch.empty(8, device="cuda", dtype=torch.float16), torch.empty(8, device="cuda", dtype=torch.float16)) is None
        )
        v = torch.empty(1000, device="cuda")
        assert tuple(stencil_ops.halo_sum(v, RADIUS=4).shape) == (992,)  # n - 2 * RADIUS
        assert tuple(stencil_ops.halo_sum(v, RADIUS=2).shape) == (996,)
        assert tuple(stencil_ops.stencil(v, RADIUS=3, PERIODIC=True).shape) == (1000,)
        assert tuple(stencil_ops.transpose(torch.empty(7, 5, device="cuda")).shape) == (5, 7)


def test_meta_tensors_propagate_shapes_without_a_device(ops, stencil_ops):
    assert tuple(ops.sgemm(meta(5, 3), meta(3, 9)).shape) == (5, 9)
    assert tuple(stencil_ops.transpose(meta(2, 6)).shape) == (6, 2)
    assert ops.row_softmax(meta(4, 4).requires_grad_()).requires_grad is False  # no gradient: none is claimed


# (call, the error a direct call of the kernel gives): the same words through the operator
BAD_CALLS = [
    (lambda o, s: o.row_softmax(torch.empty(3, 4, device="cuda", dtype=torch.float64)), TypeError,
     "row_softmax(): argument 'x' has dtype float64; expected float32"),
    (lambda o, s: o.row_softmax(torch.empty(3, 4, device="cuda", dtype=torch.bfloat16)), TypeError,
     "row_softmax(): argument 'x' has dtype bfloat16; expected float32"),
    (lambda o, s: o.row_softmax(torch.empty(3, 4, device="cuda", dtype=torch.float8_e4m3fnuz)), TypeError,
     "row_softmax(): argument 'x' has dtype 'torch.float8_e4m3fnuz', which hatch-autotune cannot pass; expected float32"),
    (lambda o, s: o.row_softmax(torch.empty(12, device="cuda")), ValueError,
     "row_softmax(): argument 'x' has 1 dimension(s) (12,); expected 2"),
    (lambda o, s: o.row_softmax(torch.empty(4, 3, device="cuda").t()), ValueError,
     "row_softmax(): argument 'x' must be C-contiguous (row-major, dense); pass a contiguous copy"),
    (lambda o, s: o.row_softmax(torch.empty(3, 4)), ValueError,
     "row_softmax(): argument 'x' is in host memory; expected a GPU array"),
    (lambda o, s: o.sgemm(torch.empty(8, 4, device="cuda"), torch.empty(5, 6, device="cuda")), ValueError,
     "sgemm(): argument 'B' has shape (5, 6); expected (4, 6) (from m=8, n=6, k=4)"),
    (lambda o, s: o.saxpy(2.0, torch.empty(8, device="cuda"), torch.empty(8, device="cuda", dtype=torch.float16)), TypeError,
     "saxpy(): argument 'y' has dtype float16 but 'x' has float32; both are T"),
    (lambda o, s: o.saxpy(1e39, torch.empty(8, device="cuda"), torch.empty(8, device="cuda")), ValueError,
     "saxpy(): argument 'a'=1e+39 does not fit in float32"),
    (lambda o, s: s.halo_sum(torch.empty(1000, device="cuda"), RADIUS=3), ValueError,
     "halo_sum(): constant RADIUS=3; expected one of [2, 4]"),
    (lambda o, s: s.halo_sum(torch.empty(5, device="cuda"), RADIUS=4), ValueError,
     "halo_sum(): argument 'y' would have shape (n - 2 * RADIUS,) = (-3,) for n=5, RADIUS=4, a negative size: n=5 is too small for this kernel"),
    (lambda o, s: s.stencil_out(torch.empty(10, device="cuda"), torch.empty(9, device="cuda"), RADIUS=1, PERIODIC=False), ValueError,
     "stencil(): argument 'y' has shape (9,); expected (10,) (from n=10, RADIUS=1, PERIODIC=False)"),
]  # fmt: skip


@pytest.mark.parametrize("case", range(len(BAD_CALLS)))
def test_bad_input_is_refused_while_tracing_with_the_calls_own_words(ops, stencil_ops, case):
    call, kind, message = BAD_CALLS[case]
    with FakeTensorMode(), pytest.raises(kind) as caught:
        call(ops, stencil_ops)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_missing_constant_is_named_by_the_schema(stencil_ops):
    with pytest.raises(RuntimeError, match=r"missing value for argument 'PERIODIC'"):
        stencil_ops.stencil(meta(10), RADIUS=1)


def test_the_direct_call_words_bad_input_the_same(example_kernels, stencil_kit, ops, stencil_ops):
    """The same wrong calls, to the kernel directly (arrays in the stand-in's memory, refused
    before any driver call) and through the operator (fake tensors): the same messages."""
    from cuda_standin import DeviceArray, StandIn

    standin = StandIn()

    def arr(*shape, dtype=np.float32):
        return DeviceArray(standin, np.zeros(shape, dtype))

    def cuda(*shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device="cuda")

    k, s = example_kernels, stencil_kit
    pairs = [
        (lambda: k.row_softmax(arr(3, 4, dtype=np.float64), arr(3, 4)), lambda: ops.row_softmax(cuda(3, 4, dtype=torch.float64))),
        (lambda: k.sgemm(arr(8, 4), arr(5, 6), arr(8, 6)), lambda: ops.sgemm(cuda(8, 4), cuda(5, 6))),
        (lambda: k.saxpy(1e39, arr(8), arr(8)), lambda: ops.saxpy(1e39, cuda(8), cuda(8))),
        (lambda: s.halo_sum(arr(1000), arr(992), RADIUS=3), lambda: stencil_ops.halo_sum(cuda(1000), RADIUS=3)),
        (lambda: s.halo_sum(arr(5), arr(1), RADIUS=4), lambda: stencil_ops.halo_sum(cuda(5), RADIUS=4)),
        (lambda: s.transpose(arr(4, 6), arr(4, 6)), lambda: stencil_ops.transpose_out(cuda(4, 6), cuda(4, 6))),
    ]
    for direct_call, operator_call in pairs:
        with pytest.raises((TypeError, ValueError)) as direct:
            direct_call()
        with FakeTensorMode(), pytest.raises(type(direct.value)) as through:
            operator_call()
        assert str(through.value) == str(direct.value)
    with pytest.raises(ValueError) as direct:  # real CPU tensors, no fake mode
        example_kernels.row_softmax(torch.empty(3, 4), torch.empty(3, 4))
    with pytest.raises(ValueError) as through:
        ops.row_softmax(torch.empty(3, 4))
    assert str(through.value) == str(direct.value) == "row_softmax(): argument 'x' is in host memory; expected a GPU array"


BF16 = torch.bfloat16
OPCHECK_ARGS = {
    "row_softmax": lambda: (meta(30, 100),),
    "row_softmax_out": lambda: (meta(30, 100), meta(30, 100)),
    "saxpy": lambda: (2.0, meta(64), meta(64)),
    "sgemm": lambda: (meta(8, 4), meta(4, 6)),
    "sgemm_out": lambda: (meta(8, 4), meta(4, 6), meta(8, 6)),
    # the tensor-core showcase (issue #53): bfloat16 and float16, B = W.T of a weight, views with padded rows
    "gemm": lambda: (meta(8, 64, dtype=BF16), meta(48, 64, dtype=BF16).t()),
    "gemm_out": lambda: (meta(8, 64, dtype=torch.float16), meta(64, 48, dtype=torch.float16), meta(8, 48, dtype=torch.float16)),
    "rmsnorm": lambda: (meta(6, 4096, dtype=BF16), meta(4096, dtype=BF16), 1e-6),
    "rmsnorm_out": lambda: (meta(6, 160, dtype=BF16)[:, :100], meta(100, dtype=BF16), meta(6, 100, dtype=BF16), 1e-6),
    "add_rmsnorm": lambda: (meta(6, 512, dtype=torch.float16), meta(6, 512, dtype=torch.float16), meta(512, dtype=torch.float16), 1e-5),
    "add_rmsnorm_out": lambda: (meta(6, 512), meta(6, 512), meta(512), meta(6, 512), meta(6, 512), 1e-5),
}


@pytest.mark.parametrize("op", list(OPCHECK_ARGS))
def test_opcheck_passes_on_meta_tensors(ops, op):
    args = OPCHECK_ARGS[op]()
    result = torch.library.opcheck(getattr(ops, op).default, args)
    assert set(result.values()) == {"SUCCESS"}, result


# ---- torch.compile and torch.export ----------------------------------------------------------


class Model(torch.nn.Module):
    """Three generated operators among PyTorch's own."""

    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        p = self.ops.row_softmax(x * 2)
        h = self.ops.sgemm(p, w)
        self.ops.saxpy(0.5, h.view(-1), h.view(-1))
        return h.relu()


def test_torch_compile_fullgraph_traces_three_operators_without_a_break(ops):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = Model(ops)
    torch._dynamo.reset()
    out = torch.compile(model, fullgraph=True, backend=backend)(meta(16, 32), meta(32, 8))
    assert (tuple(out.shape), out.device.type) == ((16, 8), "meta")
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert {"example_pkg.row_softmax", "example_pkg.sgemm", "example_pkg.saxpy"} <= set(targets), targets
    explained = torch._dynamo.explain(model)(meta(16, 32), meta(32, 8))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


class DecoderStep(torch.nn.Module):
    """An LLM layer's skeleton on the showcase operators: the residual add fused with the norm,
    then a projection by an nn.Linear-style weight W [out, in] (B = W.T: a strided view)."""

    def __init__(self, ops, weight: torch.Tensor, norm_weight: torch.Tensor):
        super().__init__()
        self.ops, self.weight, self.norm_weight = ops, weight, norm_weight

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        normed, residual = self.ops.add_rmsnorm(x, residual, self.norm_weight, 1e-6)
        return self.ops.gemm(normed, self.weight.t()), residual


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph_traces_the_tensor_core_operators(ops, dynamic):
    """bfloat16 operators with a two-output norm and a transposed weight: one graph, no break,
    the shapes and dtypes of the declarations (symbolic sizes too)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    step = DecoderStep(ops, meta(256, 128, dtype=torch.bfloat16), meta(128, dtype=torch.bfloat16))
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=backend, dynamic=dynamic)
    for tokens in (16, 7):
        out, residual = compiled(meta(tokens, 128, dtype=torch.bfloat16), meta(tokens, 128, dtype=torch.bfloat16))
        assert (tuple(out.shape), out.dtype, tuple(residual.shape), residual.dtype) == (
            (tokens, 256),
            torch.bfloat16,
            (tokens, 128),
            torch.bfloat16,
        )
    targets = {str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert {"example_pkg.add_rmsnorm", "example_pkg.gemm"} <= targets, targets
    explained = torch._dynamo.explain(step)(meta(16, 128, dtype=torch.bfloat16), meta(16, 128, dtype=torch.bfloat16))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_the_tensor_core_operators_refuse_what_their_kernels_refuse(ops):
    """While tracing, with the call's own words: a float32 gemm (no such type instance), a weight
    of the wrong length, operands of different types."""
    with FakeTensorMode():
        with pytest.raises(TypeError, match=r"gemm\(\): argument 'A' has dtype float32; expected one of \[?'?bfloat16"):
            ops.gemm(torch.empty(8, 16, device="cuda"), torch.empty(16, 8, device="cuda"))
        with pytest.raises(ValueError, match=r"rmsnorm\(\): argument 'w' has shape \(99,\); expected \(100,\)"):
            ops.rmsnorm(torch.empty(4, 100, device="cuda", dtype=BF16), torch.empty(99, device="cuda", dtype=BF16), 1e-6)
        with pytest.raises(TypeError, match=r"add_rmsnorm\(\): argument 'residual' has dtype float16 but 'x' has bfloat16"):
            h = torch.empty(4, 64, device="cuda", dtype=torch.float16)
            ops.add_rmsnorm(torch.empty(4, 64, device="cuda", dtype=BF16), h, torch.empty(64, device="cuda", dtype=BF16), 1e-6)


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_with_functionalization_gives_every_shape(ops, stencil_ops, dynamic):
    def f(x, v):
        y = ops.row_softmax(x)
        z = torch.empty_like(y)
        ops.row_softmax_out(y, z)
        return z, stencil_ops.halo_sum(v, RADIUS=4), stencil_ops.transpose(z)

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    for rows, n in ((4, 100), (9, 37)):
        z, h, t = compiled(meta(rows, 16), meta(n))
        assert (tuple(z.shape), tuple(h.shape), tuple(t.shape)) == ((rows, 16), (n - 8,), (16, rows))


def test_torch_compile_refuses_bad_input_at_trace_time(stencil_ops):
    def f(v):
        return stencil_ops.halo_sum(v, RADIUS=4)

    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"halo_sum\(\): argument 'y' would have shape \(n - 2 \* RADIUS,\) = \(-3,\)"):
        torch.compile(f, fullgraph=True, backend="aot_eager")(meta(5))
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"halo_sum\(\): argument 'x' has dtype float64; expected float32"):
        torch.compile(f, fullgraph=True, backend="aot_eager")(meta(50, dtype=torch.float64))


def test_torch_export_records_the_operators_with_real_output_metadata(ops):
    with FakeTensorMode():
        program = torch.export.export(Model(ops), (torch.empty(16, 32, device="cuda"), torch.empty(32, 8, device="cuda")))
    calls = {str(n.target): n for n in program.graph.nodes if n.op == "call_function"}
    assert {"example_pkg.row_softmax.default", "example_pkg.sgemm.default", "example_pkg.saxpy.default"} <= set(calls)
    assert tuple(calls["example_pkg.sgemm.default"].meta["val"].shape) == (16, 8)
    assert calls["example_pkg.row_softmax.default"].meta["val"].device == torch.device("cuda", 0)


# ---- a call down to the driver stand-in -----------------------------------------------------

_TYPESTRS = {torch.float32: "<f4", torch.float16: "<f2"}


class StandinTensor(torch.Tensor):
    """A tensor PyTorch sees on a CUDA device, in the stand-in's memory (no data of its own).
    A generated operator called with it runs its implementation (CompositeExplicitAutograd)."""

    @staticmethod
    def __new__(cls, standin, shape, dtype=torch.float32, device=0):
        t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=torch.device("cuda", device))
        t.ptr = standin.alloc(device, math.prod(shape) * t.element_size())
        t.standin = standin
        return t

    @property
    def __cuda_array_interface__(self):
        return {"shape": tuple(self.shape), "typestr": _TYPESTRS[self.dtype], "data": (self.ptr, False), "version": 3, "strides": None}

    def numpy_view(self) -> np.ndarray:
        return self.standin.view(self.ptr, _TYPESTRS[self.dtype], self.numel()).reshape(tuple(self.shape))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func.namespace in ("example_pkg", "stencil_kit", "swapped_args"):
            return func._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *args, **(kwargs or {}))
        raise NotImplementedError(f"StandinTensor: {func}")


@pytest.fixture
def standin_torch(rt, monkeypatch):
    """The driver stand-in under example_pkg's runtime, and torch.empty on a CUDA device making
    StandinTensors (PyTorch's CUDA allocator, imitated): (stand-in, the tensors allocated)."""
    from cuda_standin import install

    standin = install(monkeypatch, rt)
    made: list[StandinTensor] = []
    real_empty = torch.empty

    def empty(*shape, dtype=None, device=None, **kwargs):
        if device is not None and torch.device(device).type == "cuda":
            made.append(
                StandinTensor(
                    standin, tuple(shape[0] if len(shape) == 1 else shape), dtype or torch.float32, torch.device(device).index or 0
                )
            )
            return made[-1]
        return real_empty(*shape, dtype=dtype, device=device, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    return standin, made


def test_an_operator_launches_its_kernel_with_the_arguments_in_declared_order(ops, standin_torch):
    standin, made = standin_torch
    x, y = StandinTensor(standin, (5000,)), StandinTensor(standin, (5000,))
    ops.saxpy(2.5, x, y)
    launch = standin.launches[-1]
    assert (launch.entry, float(launch.param(0, "float32")), int(launch.param(1, "uint64")), int(launch.param(2, "uint64"))) == (
        "saxpy",
        2.5,
        x.ptr,
        y.ptr,
    )
    assert int(launch.param(3, "int32")) == 5000 and made == []


def test_a_functional_operator_allocates_its_output_on_the_inputs_device_and_returns_it(ops, standin_torch):
    standin, made = standin_torch
    a, b = StandinTensor(standin, (70, 33)), StandinTensor(standin, (33, 130))
    for _ in range(2):  # the second call takes the memoised shapes
        c = ops.sgemm(a, b)
        assert c is made[-1] and (tuple(c.shape), c.dtype, c.device) == ((70, 130), torch.float32, torch.device("cuda", 0))
        launch = standin.launches[-1]
        pointers = [int(launch.param(i, "uint64")) for i in range(3)]
        sizes = [int(launch.param(i, "int32")) for i in range(3, 6)]
        assert (pointers, sizes) == ([a.ptr, b.ptr, c.ptr], [70, 130, 33])
    x = StandinTensor(standin, (3, 4))
    y = ops.row_softmax(x)
    assert [int(standin.launches[-1].param(i, "uint64")) for i in range(2)] == [x.ptr, y.ptr]
    assert len(standin.launches) == 3


def test_a_bad_call_allocates_nothing_and_launches_nothing(ops, standin_torch):
    standin, made = standin_torch
    with pytest.raises(ValueError, match=r"^sgemm\(\): argument 'B' has shape \(5, 6\); expected \(4, 6\)"):
        ops.sgemm(StandinTensor(standin, (8, 4)), StandinTensor(standin, (5, 6)))
    with pytest.raises(ValueError, match=r"^row_softmax\(\): argument 'x' is in host memory; expected a GPU array$"):
        ops.row_softmax(torch.ones(3, 4))
    assert made == [] and standin.launches == []


# ---- configuration -------------------------------------------------------------------------


def test_the_namespace_is_the_top_level_package_unless_set(good):
    root, table = good
    assert parse_project(table, root).torch_namespace == table["module"].split(".")[0]
    assert parse_project({**table, "torch-namespace": "my_ops"}, root).torch_namespace == "my_ops"
    key = "tool.hatch.build.targets.wheel.hooks.autotune.torch-namespace"
    assert errors_for(root, {**table, "torch-namespace": "aten"}) == [
        f"{key}: expected an identifier that names your operators' namespace (torch.ops.<name>), not one of PyTorch's own, got a string 'aten'"
    ]
    assert errors_for(root, {**table, "torch-namespace": "my.ops"}) == [
        f"{key}: expected an identifier that names your operators' namespace (torch.ops.<name>), not one of PyTorch's own, got a string 'my.ops'"
    ]


def test_a_kernel_named_as_another_kernels_out_operator_is_refused():
    table = hook_table(STENCIL)
    kernels = {**table["kernels"], "transpose_out": table["kernels"]["halo_sum"]}
    assert errors_for(STENCIL, {**table, "kernels": kernels}) == [
        "tool.hatch.build.targets.wheel.hooks.autotune.kernels.transpose_out: the name of kernel 'transpose''s PyTorch operator "
        "that writes into the caller's outputs (transpose_out); rename one of the two kernels"
    ]


# ---- which operators a declaration gives -----------------------------------------------------


def _arg(name, dtype="float32", shape=None, intent=None, value=None):
    a = {"name": name, "dtype": dtype, "kind": "array" if shape else "scalar"}
    if shape:
        a.update(shape=[["n", d] for d in shape], intent=intent)
    if value is not None:
        a["value"] = value
    return a


def _key(name, source, axis=0):
    return {"name": name, "from": source, "axis": axis, "buckets": [16], "mapping": "nearest"}


def test_operators_follow_the_intents_and_say_why_a_kernel_has_no_functional_form(rt):
    def operators(name, args, key, type_params, constants):
        """The operators of a declaration, given as the table's JSON form."""
        launch = {"grid": [1], "block": [32], "shared": 0}
        listed = [{"name": c, "values": v} for c, v in constants.items()]
        data = {"entry": name, "args": args, "key": key, "type_params": type_params, "constants": listed, "launch": launch}
        return rt.torch_ops.operators(rt.KernelDecl.from_json(name, data))

    ints = {"I": ["int32", "int64"], "F": ["float16", "float32"], "M": ["int8", "float64"]}
    args = [_arg("y", "F", ["n"], "out"), _arg("x", "F", ["n"], "in"), _arg("s", "I"), _arg("t", "M"), _arg("n", "int32", value=["n", "n"])]
    functional, out_form = operators("k", args, [_key("n", "x")], ints, {"C": [True, False], "R": [3]})
    assert (functional.name, functional.params, functional.returns, functional.schema) == (
        "k",
        ("x", "s", "t"),
        ("y",),
        "(Tensor x, int s, Scalar t, *, bool C, int R=3) -> Tensor",
    )
    assert (out_form.name, out_form.params, out_form.mutates, out_form.note) == ("k_out", ("y", "x", "s", "t"), ("y",), "")
    assert out_form.schema == "(Tensor(a0!) y, Tensor x, int s, Scalar t, *, bool C, int R=3) -> ()"
    two = [_arg("x", shape=["n"], intent="inout"), _arg("y", shape=["n"], intent="out"), _arg("z", shape=["n"], intent="out")]
    (f, o) = operators("two", two, [_key("n", "x")], {}, {})
    assert (f.schema, f.mutates, o.schema) == (
        "(Tensor(a0!) x) -> (Tensor, Tensor)",
        ("x",),
        "(Tensor(a0!) x, Tensor(a1!) y, Tensor(a2!) z) -> ()",
    )
    blocked = [
        ([_arg("x", shape=["n"], intent="in"), _arg("y", shape=["n"], intent="out")], [_key("n", "y")], {},
         "key dim n is read from `out` array 'y', so the outputs' sizes are not known before the call"),
        ([_arg("y", shape=["n"], intent="out"), _arg("n", "int64")], [_key("n", "n", None)], {},
         "it has no array but its `out` arrays, so no tensor says which device they go on"),
        ([_arg("x", shape=["n"], intent="in"), _arg("y", "F", ["n"], "out")], [_key("n", "x")], ints,
         "the dtype of `out` array 'y' is type parameter F, which no other array fixes"),
    ]  # fmt: skip
    for args, key, types, why in blocked:
        (only,) = operators("b", args, key, types, {})
        assert (only.name, only.note) == ("b_out", why)


def test_a_functional_operator_passes_its_outputs_where_the_kernel_declares_them(stencil_kit, stencil_ops, standin_torch):
    """transpose declared with its output first: the operator's call puts it back in front."""
    standin, _made = standin_torch
    library = stencil_kit._LIBRARY
    runtime = stencil_kit._runtime
    kernels = dict(library.table["kernels"])
    spec = kernels["transpose"]
    kernels["transpose"] = {**spec, "args": [spec["args"][1], spec["args"][0], *spec["args"][2:]]}
    swapped = runtime.Library(library.directory, {**library.table, "kernels": kernels})
    packets = runtime.torch_ops.register(swapped, "swapped_args")
    assert str(packets["transpose"].default._schema) == "swapped_args::transpose(Tensor a) -> Tensor"
    runtime.use_gpu(standin.api())
    try:
        a = StandinTensor(standin, (6, 5))
        b = packets["transpose"](a)
        assert tuple(b.shape) == (5, 6)
        assert [int(standin.launches[-1].param(i, "uint64")) for i in range(2)] == [b.ptr, a.ptr]
    finally:
        runtime.use_gpu(None)
