"""The call path of issue #52 for strided arrays, free dims and optional arrays: a sliced or
transposed array on an argument declared `strides = "inner"` or `"any"` is launched as it is (its
pointer, its element strides as the computed scalars that read them), on the fast path while its
layout stays the same; an inout slice of a fused qkv buffer updates the buffer itself; free dims
are read from the arrays and checked across them; an optional array passed as None is a null
pointer; and every layout the kernel cannot take is refused with a message that never advises a
copy for an array the kernel writes.

The kernels here are built from their declaration records and a PTX entry that says their
parameters, and run over the driver stand-in (tests/cuda_standin.py) with an emulator that does
what the kernel would (adds to a strided matrix), so the test sees where the writes land.
Arrays are the stand-in's imitations of CuPy and PyTorch arrays (tests/standin_arrays.py);
PyTorch's own meta tensors go through the operators' fake path."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import cuda_standin
import numpy as np
import pytest
from cuda_standin import DeviceArray, install
from standin_arrays import CaiView, install_cupy, install_torch

import hatch_autotune.runtime as runtime
from hatch_autotune.runtime import ArgDecl, Kernel, KernelDecl, KeyDecl, LaunchDecl
from hatch_autotune.runtime.selection import Binaries
from hatch_autotune.runtime.table import BinaryRef, KernelTable, Variant

_PTX_TYPES = {"float32": ".f32", "int32": ".u32", "int64": ".u64"}


class _Ptx(Binaries):
    """One PTX entry for every variant: what the stand-in reads a launch's parameters by."""

    cubin_archs = ()

    def __init__(self, ptx: bytes):
        self.ptx = ptx

    def binary_for(self, cc: tuple[int, int], driver: tuple[int, int] | None = None) -> tuple[str, str]:
        return "sm_90", "compute_90"

    def read(self, table: KernelTable, variant: str, binary: str) -> bytes:
        return self.ptx


def make_kernel(decl: KernelDecl, types_keys: tuple[str, ...] = ("-",), config: dict[str, Any] | None = None) -> Kernel:
    """A Kernel of `decl` with one variant for every bucket, its binary a PTX entry whose
    parameters are the declaration's (a pointer per array, each scalar by its dtype)."""
    params = ",\n".join(f"  .param {'.u64' if a.is_array else _PTX_TYPES[a.dtype]} p{i}" for i, a in enumerate(decl.args))
    ptx = f".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry {decl.entry}(\n{params}\n)\n{{\n  ret;\n}}\n"
    variant = Variant(config or {}, {}, 0, {"compute_90": BinaryRef("k.ptx", "0" * 64, "8.0", None)}, {})
    buckets = [()]
    for k in decl.key:
        buckets = [(*b, v) for b in buckets for v in k.buckets]
    entries = [{"bucket": list(b), "variant": "v0", "tuned": False, "provenance": {"reason": "test"}} for b in buckets]
    table = KernelTable(decl, {"v0": variant}, {tkey: {"sm_90": entries} for tkey in types_keys})
    return Kernel(table, _Ptx(ptx.encode()))


def n(name: str) -> list[str]:
    return ["n", name]


def rows_decl(strides: str = "inner", intent: str = "inout", align: int | None = None, entry: str = "add_rows") -> KernelDecl:
    """add_rows(x, bias?): x[t, :] += bias (or 1) for a T x D matrix with strides, T the key, D
    a free dim; the kernel gets the row stride (`ld = x_stride0`), the column stride and D."""
    args = (
        ArgDecl("x", "float32", (n("T"), n("D")), intent, align, None, strides=strides),
        ArgDecl("bias", "float32", (n("D"),), "in", None, None, optional=True),
        ArgDecl("ld", "int64", None, None, None, n("x_stride0")),
        ArgDecl("inc", "int64", None, None, None, n("x_stride1")),
        ArgDecl("cols", "int32", None, None, None, n("D")),
    )
    key = (KeyDecl("T", "x", 0, (16, 64), "ceil"),)
    return KernelDecl("add_rows", entry, "", args, key, {}, {}, LaunchDecl((n("T"),), (32,), 0), dims={"D": 64})


def _add_rows(standin: cuda_standin.StandIn, kernel: Any, launch: cuda_standin.Launch) -> float:
    """What add_rows does, through the strides it is given."""
    x, bias = int(launch.param(0, "uint64")), int(launch.param(1, "uint64"))
    ld, inc, cols = int(launch.param(2, "int64")), int(launch.param(3, "int64")), int(launch.param(4, "int32"))
    rows = launch.grid[0]
    add = standin.view(bias, "float32", cols).copy() if bias else np.ones(cols, np.float32)
    for t in range(rows):
        for d in range(cols):
            element = standin.view(x + 4 * (t * ld + d * inc), "float32", 1)
            element += add[d]
    return 0.01


@pytest.fixture
def standin(monkeypatch):
    found = install(monkeypatch, runtime)
    monkeypatch.setitem(cuda_standin.EMULATORS, "add_rows", _add_rows)
    yield found
    runtime.use_gpu(None)


def _params(launch: cuda_standin.Launch) -> tuple[int, int, int, int, int]:
    return (
        int(launch.param(0, "uint64")),
        int(launch.param(1, "uint64")),
        int(launch.param(2, "int64")),
        int(launch.param(3, "int64")),
        int(launch.param(4, "int32")),
    )


# ---- strided arrays launched as they are ---------------------------------------------------


def test_an_inout_slice_of_a_fused_qkv_buffer_updates_the_buffer_itself_on_the_fast_path(standin, monkeypatch):
    torch = install_torch(monkeypatch, standin)
    kernel = make_kernel(rows_decl())
    T, D = 16, 64
    qkv = torch.Tensor((T, 3 * D))
    start = np.arange(T * 3 * D, dtype=np.float32).reshape(T, 3 * D)
    qkv.fill(start)
    q = qkv.as_strided((T, D), (3 * D, 1), 0)  # qkv[:, :D]
    k = qkv.as_strided((T, D), (3 * D, 1), D)  # qkv[:, D:2D]
    bias = torch.Tensor((D,))
    bias.fill(np.full(D, 10.0, np.float32))
    kernel(q, None)
    kernel(k, bias)
    kernel(q, None)
    expected = start.copy()
    expected[:, :D] += 2
    expected[:, D : 2 * D] += 10
    np.testing.assert_array_equal(qkv.values(), expected)  # the v third untouched
    assert _params(standin.launches[0]) == (q.data_ptr(), 0, 3 * D, 1, D)  # the slice's own pointer: no copy
    assert _params(standin.launches[1]) == (k.data_ptr(), bias.data_ptr(), 3 * D, 1, D)
    assert kernel.checked_calls == 2  # the bias present and absent are two signatures; then the fast path
    for _ in range(3):
        kernel(k, bias)
        kernel(q, None)
    assert kernel.checked_calls == 2 and len(standin.launches) == 9


def test_a_transposed_tensor_on_an_any_argument_is_launched_without_a_copy(standin, monkeypatch):
    torch = install_torch(monkeypatch, standin)
    kernel = make_kernel(rows_decl(strides="any"))
    base = torch.Tensor((64, 16))  # D x T in memory: its transpose is the T x D matrix
    values = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    base.fill(values)
    xt = base.t()
    assert xt.shape == (16, 64) and xt.stride() == (1, 16)
    for _ in range(3):
        kernel(xt, None)
    assert kernel.checked_calls == 1
    assert _params(standin.launches[0]) == (base.data_ptr(), 0, 1, 16, 64)
    np.testing.assert_array_equal(base.values(), values + 3)


def test_a_stride_change_is_a_new_plan_with_its_own_strides(standin, monkeypatch):
    cupy = install_cupy(monkeypatch, standin)
    kernel = make_kernel(rows_decl())
    buffer = cupy.ndarray((16, 256))
    padded = buffer.view_as((16, 64), (256 * 4, 4))  # rows of 256 elements, 64 used
    dense = buffer.view_as((16, 64), (64 * 4, 4))
    kernel(padded, None)
    kernel(padded, None)
    assert kernel.checked_calls == 1 and _params(standin.launches[-1])[2] == 256
    kernel(dense, None)  # the same shape, dtype and pointer; other strides
    assert kernel.checked_calls == 2 and _params(standin.launches[-1])[2] == 64
    kernel(padded, None)
    assert kernel.checked_calls == 2 and _params(standin.launches[-1])[2] == 256


def test_a_cai_view_with_byte_strides_is_read_in_elements(standin):
    kernel = make_kernel(rows_decl())
    base = DeviceArray.empty(standin, (16, 80))
    view = CaiView(standin, base.ptr, (16, 64), (80 * 4, 4))
    for _ in range(2):
        kernel(view, None)
    assert kernel.checked_calls == 1 and _params(standin.launches[-1]) == (base.ptr, 0, 80, 1, 64)
    assert kernel.prepare(view, None).arrays["x"].strides == (80, 1)
    assert kernel.prepare(CaiView(standin, base.ptr, (16, 64), None), None).c_args[2:4] == (64, 1)  # None: C-contiguous


def test_array_views_carry_element_strides_for_every_reader(standin, monkeypatch):
    cupy, torch = install_cupy(monkeypatch, standin), install_torch(monkeypatch, standin)
    from hatch_autotune.runtime.args import array_view

    assert array_view(cupy.ndarray((4, 6), "float64")).strides == (6, 1)
    assert array_view(cupy.ndarray((4, 6), "float64").view_as((4, 3), (96, 16))).strides == (12, 2)
    assert array_view(torch.Tensor((4, 6)).t()).strides == (1, 6)
    assert array_view(DeviceArray.empty(standin, (3, 5))).strides == (5, 1)
    assert array_view(CaiView(standin, 0x1000, (3, 5), (30, 6), "<i2")).strides == (15, 3)
    odd = array_view(CaiView(standin, 0x1000, (3, 5), (22, 4)))
    assert odd.strides is None and not odd.contiguous  # 22 bytes: not whole float32 elements


def test_a_dlpack_array_carries_its_element_strides():
    torch = pytest.importorskip("torch")
    from standin_arrays import DLPackArray

    from hatch_autotune.runtime.args import array_view

    view = array_view(DLPackArray(torch.zeros((4, 6)).t()))
    assert view.shape == (6, 4) and view.strides == (1, 6) and not view.contiguous
    assert array_view(DLPackArray(torch.zeros((4, 6)))).strides == (6, 1)


def test_unit_stride_variants_are_picked_by_the_calls_layout(standin, monkeypatch):
    torch = install_torch(monkeypatch, standin)
    base = rows_decl(strides="any")
    x = ArgDecl("x", "float32", base.args[0].shape, "inout", None, None, strides="any", unit_stride_variants=True)
    decl = KernelDecl(
        "add_rows", "add_rows", "", (x, *base.args[1:]), base.key, {}, {"x_unit_stride": (True, False)}, base.launch, base.dims
    )
    kernel = make_kernel(decl, ("x_unit_stride=true", "x_unit_stride=false"))
    rows, columns = torch.Tensor((16, 64)), torch.Tensor((64, 16)).t()
    assert kernel.prepare(rows, None).types == {"x_unit_stride": True}
    assert kernel.prepare(columns, None).types == {"x_unit_stride": False}
    assert kernel.prepare(torch.Tensor((64, 1)).as_strided((16, 1), (4, 7)), None).types == {"x_unit_stride": True}  # one column
    for _ in range(2):
        kernel(rows, None)
        kernel(columns, None)
    assert kernel.checked_calls == 2 and sorted(types for _, types, _, _ in kernel._memo) == [(False,), (True,)]
    with pytest.raises(TypeError, match=r"^add_rows\(\) got x_unit_stride=: the call sets it from the layout of 'x'"):
        kernel(rows, None, x_unit_stride=True)
    from hatch_autotune.runtime.torch_ops import operators
    from hatch_autotune.wheel.stub import _Builtins, _kernel_class

    assert operators(decl)[0].schema == "(Tensor(a0!) x, Tensor? bias) -> ()"  # not a keyword of the operator
    stub = _kernel_class(decl, _Builtins(set()))
    assert "def __call__(self, x: _GpuArray, bias: _GpuArray | None, *, stream: _Stream = None)" in stub
    assert "x_unit_stride: bool) -> _Selection" in stub  # select() names the variant


# ---- refusals ---------------------------------------------------------------------------------


def test_a_strided_array_on_a_contiguous_argument_that_the_kernel_writes_is_refused_without_advising_a_copy(standin, monkeypatch):
    torch = install_torch(monkeypatch, standin)
    qkv = torch.Tensor((16, 192))
    q = qkv.as_strided((16, 64), (192, 1))
    written = make_kernel(rows_decl(strides="contiguous"))
    with pytest.raises(ValueError, match=r"^add_rows\(\): argument 'x' must be C-contiguous") as info:
        written(q, None)
    message = str(info.value)
    assert "copy would not receive the results" in message and 'strides = "inner"' in message
    assert "pass a contiguous copy" not in message
    read = make_kernel(rows_decl(strides="contiguous", intent="in"))
    with pytest.raises(ValueError, match=r"must be C-contiguous \(row-major, dense\); pass a contiguous copy, or the kernel's author"):
        read(q, None)
    assert standin.launches == []


def test_an_inner_argument_refuses_a_non_unit_inner_stride(standin, monkeypatch):
    torch = install_torch(monkeypatch, standin)
    xt = torch.Tensor((64, 16)).t()
    with pytest.raises(ValueError, match=r"^add_rows\(\): argument 'x' has strides \(1, 16\) \(elements\); the kernel takes it with a unit innermost stride .*declare it `strides = \"any\"`"):  # fmt: skip
        make_kernel(rows_decl())(xt, None)
    with pytest.raises(ValueError, match=r"unit innermost stride .*: pass a copy whose rows are contiguous"):
        make_kernel(rows_decl(intent="in"))(xt, None)


def test_negative_strides_are_refused_for_every_array(standin):
    base = DeviceArray.empty(standin, (16, 64))
    flipped = CaiView(standin, base.ptr + 15 * 256, (16, 64), (-256, 4))
    with pytest.raises(ValueError, match=r"argument 'x' has a negative stride in dim 0 \(strides \(-64, 1\) in elements\); hatch-autotune passes no negative strides$"):  # fmt: skip
        make_kernel(rows_decl(strides="any"))(flipped, None)
    with pytest.raises(ValueError, match=r"negative stride in dim 0 .*\(pass a copy with non-negative strides\)"):
        make_kernel(rows_decl(strides="any", intent="in"))(flipped, None)


def test_overlapping_strides_are_refused_where_the_kernel_writes(standin, monkeypatch):
    torch = install_torch(monkeypatch, standin)
    row = torch.Tensor((64,))
    broadcast = row.as_strided((16, 64), (0, 1))  # row.expand(16, 64)
    with pytest.raises(ValueError, match=r"argument 'x' has shape \(16, 64\) and strides \(0, 1\) \(elements\), whose elements may share memory \(dim 0\); the kernel writes it \(intent inout\)"):  # fmt: skip
        make_kernel(rows_decl(strides="any"))(broadcast, None)
    folded = torch.Tensor((16, 64)).as_strided((16, 64), (32, 1))  # rows overlapping by half
    with pytest.raises(ValueError, match=r"may share memory \(dim 0\)"):
        make_kernel(rows_decl(strides="any", intent="out"))(folded, None)
    reader = make_kernel(rows_decl(strides="any", intent="in"))
    reader(broadcast, None)  # read only: a broadcast is fine
    assert _params(standin.launches[-1])[2:4] == (0, 1)


def test_byte_strides_that_are_not_whole_elements_are_refused_on_a_strided_argument(standin):
    base = DeviceArray.empty(standin, (16, 80))
    with pytest.raises(ValueError, match=r"argument 'x' has byte strides that are not whole float32 elements"):
        make_kernel(rows_decl(strides="any"))(CaiView(standin, base.ptr, (16, 64), (258, 4)), None)


def test_strides_of_an_aligned_argument_keep_its_vector_alignment(standin, monkeypatch):
    cupy = install_cupy(monkeypatch, standin)
    kernel = make_kernel(rows_decl(align=16))
    buffer = cupy.ndarray((16, 80))
    with pytest.raises(ValueError, match=r"argument 'x' has a stride of 66 elements \(264 bytes\) in dim 0, not a multiple of its 16-byte alignment"):  # fmt: skip
        kernel(buffer.view_as((16, 64), (264, 4)), None)
    kernel(buffer.view_as((16, 64), (272, 4)), None)  # 68 elements: 272 bytes, 16-byte rows
    assert len(standin.launches) == 1


# ---- free dims ------------------------------------------------------------------------------


def test_a_free_dim_is_read_from_the_first_array_and_checked_against_the_others(standin, monkeypatch):
    torch = install_torch(monkeypatch, standin)
    kernel = make_kernel(rows_decl())
    x = torch.Tensor((16, 48))
    call = kernel.prepare(x, torch.Tensor((48,)))
    assert call.dims == {"D": 48} and call.c_args[4] == 48
    with pytest.raises(ValueError, match=r"^add_rows\(\): argument 'bias' has shape \(40,\); expected \(48,\): its dim 0 is the free dim D, which is 48 in 'x' \(x.shape\[1\]\) but 40 in 'bias'; every array must agree on D$"):  # fmt: skip
        kernel(x, torch.Tensor((40,)))
    kernel(x, None)
    kernel(torch.Tensor((16, 32)), None)  # another D in the same bucket: another launch head
    assert [_params(launch)[4] for launch in standin.launches] == [48, 32]
    assert len(kernel._memo) == 2


# ---- optional arrays ----------------------------------------------------------------------------


def test_an_optional_array_passed_as_none_is_a_null_pointer_and_a_required_one_is_refused(standin, monkeypatch):
    torch = install_torch(monkeypatch, standin)
    kernel = make_kernel(rows_decl())
    x = torch.Tensor((16, 64))
    assert kernel.prepare(x, None).c_args[1] == 0 and "bias" not in kernel.prepare(x, None).arrays
    assert kernel.prepare(x, bias=None).c_args[1] == 0
    with pytest.raises(TypeError, match=r"^add_rows\(\): argument 'x' must be a GPU array exposing __cuda_array_interface__ or DLPack .*got NoneType"):  # fmt: skip
        kernel(None, None)
    with pytest.raises(TypeError, match=r"argument 'bias' has dtype float16; expected float32"):
        kernel(x, torch.Tensor((64,), "float16"))  # present: checked as any array


def test_a_type_parameter_only_an_absent_optional_array_gives_is_said(standin):
    args = (
        ArgDecl("x", "float32", (n("n"),), "inout", None, None),
        ArgDecl("scale", "S", (n("n"),), "in", None, None, optional=True),
    )
    decl = KernelDecl("scaled", "scaled", "", args, (KeyDecl("n", "x", 0, (64,), "ceil"),), {"S": ("float32", "float16")}, {}, LaunchDecl((1,), (32,), 0))  # fmt: skip
    kernel = make_kernel(decl, ("S=float16", "S=float32"))
    x = DeviceArray.empty(standin, (64,))
    with pytest.raises(TypeError, match=r"^scaled\(\): cannot infer type parameter S \(one of \['float32', 'float16'\]\): only 'scale' would give it, and the call passes None$"):  # fmt: skip
        kernel(x, None)
    assert kernel.prepare(x, DeviceArray.empty(standin, (64,), "float16")).types == {"S": "float16"}
    single = KernelDecl("scaled", "scaled", "", args, decl.key, {"S": ("float16",)}, {}, decl.launch)
    assert make_kernel(single, ("S=float16",)).prepare(x, None).types == {"S": "float16"}  # one value: no array needed


def test_an_optional_array_takes_the_fast_path_for_cai_arrays_too(standin):
    kernel = make_kernel(rows_decl())
    x, bias = DeviceArray.empty(standin, (16, 64)), DeviceArray.empty(standin, (64,))
    for _ in range(3):
        kernel(x, None)
        kernel(x, bias)
    assert kernel.checked_calls == 2
    assert [_params(launch)[1] for launch in standin.launches] == [0, bias.ptr] * 3


# ---- PyTorch operators: schemas and the fake path -----------------------------------------------


@pytest.fixture
def torch_ops(standin):
    """The operators of a library holding add_rows (strided x, optional bias), under a namespace
    of this test module's own; PyTorch's real meta tensors trace through them."""
    torch = pytest.importorskip("torch")
    from hatch_autotune.runtime import torch_ops

    kernel = make_kernel(rows_decl())
    library = SimpleNamespace(module="strided_calls_test", kernels={"add_rows": kernel})
    packets = torch_ops.register(library, "strided_calls_test")
    return torch, packets, kernel


def test_an_optional_array_is_an_optional_tensor_in_the_schema(torch_ops):
    from hatch_autotune.runtime.torch_ops import operators

    (op,) = operators(rows_decl())
    assert op.schema == "(Tensor(a0!) x, Tensor? bias) -> ()"
    (read,) = operators(rows_decl(intent="in"))
    assert read.schema == "(Tensor x, Tensor? bias) -> ()"


def test_an_operator_with_a_strided_argument_keeps_the_callers_strides_under_torch_compile(torch_ops):
    torch, packets, _ = torch_ops
    tags = packets["add_rows"].default.tags
    assert torch.Tag.needs_exact_strides in tags and torch.Tag.needs_contiguous_strides not in tags


def test_a_functional_operator_needs_an_input_that_gives_the_free_dims_and_the_device():
    from hatch_autotune.runtime.torch_ops import functional_blocker

    out = ArgDecl("y", "float32", (n("T"), n("D")), "out", None, None)
    x = ArgDecl("x", "float32", (n("T"),), "in", None, None)
    key = (KeyDecl("T", "x", 0, (16,), "ceil"),)
    only_out = KernelDecl("k", "k", "", (x, out), key, {}, {}, LaunchDecl((1,), (32,), 0), dims={"D": 8})
    assert (
        functional_blocker(only_out) == "free dim D is read only from `out` arrays (y), so the outputs' sizes are not known before the call"
    )
    bias = ArgDecl("bias", "float32", (n("D"),), "in", None, None, optional=True)
    optional_in = KernelDecl("k", "k", "", (bias, out), (KeyDecl("T", "y", 0, (16,), "ceil"),), {}, {}, only_out.launch, dims={"D": 8})
    assert "key dim T is read from `out` array 'y'" in (functional_blocker(optional_in) or "")
    with_x = KernelDecl(
        "k", "k", "", (x, ArgDecl("w", "float32", (n("D"),), "in", None, None), out), key, {}, {}, only_out.launch, {"D": 8}
    )
    assert functional_blocker(with_x) is None
    all_optional = KernelDecl("k", "k", "", (bias, ArgDecl("z", "float32", (4,), "out", None, None)), (), {}, {}, only_out.launch, {"D": 8})
    assert (
        functional_blocker(all_optional) == "every array but its `out` arrays is optional, so no tensor surely says which device they go on"
    )


def test_the_stub_lets_an_optional_array_be_none():
    from hatch_autotune.wheel.stub import _Builtins, _kernel_class

    stub = _kernel_class(rows_decl(), _Builtins(set()))
    assert "def __call__(self, x: _GpuArray, bias: _GpuArray | None, *, stream: _Stream = None) -> None:" in stub
    assert "def prepare(self, x: _GpuArray, bias: _GpuArray | None) -> _PreparedCall:" in stub


def test_the_fake_path_takes_strided_meta_tensors_and_refuses_what_the_call_refuses(torch_ops):
    torch, packets, _ = torch_ops
    from torch._subclasses.fake_tensor import FakeTensorMode

    qkv = torch.empty((16, 192), device="meta")
    with FakeTensorMode(allow_non_fake_inputs=True):
        packets["add_rows"](qkv[:, 64:128], None)  # a slice: the call's checks pass
        packets["add_rows"](qkv[:, :64], torch.empty((64,), device="meta"))
        with pytest.raises(ValueError, match=r"argument 'x' has strides \(1, 16\) \(elements\); the kernel takes it with a unit innermost stride"):  # fmt: skip
            packets["add_rows"](torch.empty((64, 16), device="meta").t(), None)
        with pytest.raises(ValueError, match=r"free dim D, which is 64 in 'x'"):
            packets["add_rows"](qkv[:, :64], torch.empty((32,), device="meta"))


def test_a_pytorch_cpu_tensor_is_refused_as_host_memory(torch_ops):
    torch, _, kernel = torch_ops
    with pytest.raises(ValueError, match=r"argument 'x' is in host memory; expected a GPU array"):
        kernel(torch.zeros((16, 192))[:, :64], None)


# ---- tuning inputs follow the declared layout ----------------------------------------------------

ROWS_TABLE = """\
[tool.hatch.build.targets.wheel.hooks.autotune]
module = "rowspkg.kernels"
archs = ["sm_90"]

[tool.hatch.build.targets.wheel.hooks.autotune.kernels.add_rows]
template = "add_rows.cu.j2"
args = [
  { name = "x", dtype = "float32", shape = ["T", "D"], intent = "inout", strides = "inner" },
  { name = "bias", dtype = "float32", shape = ["D"], intent = "in", optional = true },
  { name = "ld", dtype = "int64", value = "x_stride0" },
  { name = "inc", dtype = "int64", value = "x_stride1" },
  { name = "cols", dtype = "int32", value = "D" },
  { name = "w", dtype = "float32", shape = ["D", "T"], intent = "in", strides = "any" },
]
key = { T = { buckets = [16, 64] } }
dims = { D = 40 }
space = { BLOCK = [32, 64] }
default = { BLOCK = 32 }
grid = ["T"]
block = ["BLOCK"]
"""


@pytest.fixture
def rows_spec(tmp_path):
    from conftest import load_project

    (tmp_path / "add_rows.cu.j2").write_text('extern "C" __global__ void {{ entry }}() {}\n')
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "rowspkg"\nversion = "0.1.0"\n\n' + ROWS_TABLE)
    return load_project(tmp_path).kernels["add_rows"]


def test_tuning_inputs_are_strided_views_sized_by_the_free_dims_with_optional_arrays_present(rows_spec):
    from hatch_autotune.tuning.inputs import InputRecipe

    recipe = InputRecipe.of(rows_spec, {}, {"T": 16}, ".", 5)
    by_name = {a.name: a for a in recipe.args}
    assert list(by_name) == ["x", "bias", "w"]  # computed scalars are not made
    assert by_name["x"].shape == (16, 40) and by_name["x"].strides == (64, 1)  # 160-byte rows padded to 256 bytes
    assert by_name["w"].shape == (40, 16) and by_name["w"].strides == (1, 40)  # transposed
    assert by_name["bias"].shape == (40,) and by_name["bias"].strides is None
    assert recipe.nbytes() == (15 * 64 + 40) * 4 + 640 * 4 + 40 * 4
    assert InputRecipe.from_json(recipe.to_json()) == recipe
    assert "strides" not in by_name["bias"].to_json()  # a contiguous array's wire form is as before
    made = recipe.make()
    x, w = made["x"], made["w"]
    assert x.shape == (16, 40) and x.strides == (256, 4) and w.strides == (4, 160) and made["bias"].flags.c_contiguous
    assert np.isnan(np.lib.stride_tricks.as_strided(x, (15, 64), (256, 4))[:, 40:]).all()  # the padding: poison
    np.testing.assert_array_equal(np.ascontiguousarray(x), recipe.make()["x"])  # the same values from the same seed


def test_the_worker_uploads_a_strided_input_with_its_buffer_and_the_runtime_takes_it(rows_spec, standin):
    from hatch_autotune.declare.kernel_decl import kernel_decl
    from hatch_autotune.tuning.inputs import InputRecipe
    from hatch_autotune.tuning.worker_memory import DeviceArray as WorkerArray
    from hatch_autotune.tuning.worker_memory import Expected

    cuda_standin.FakeDevice(0).set_current()
    driver = standin.api().driver
    made = InputRecipe.of(rows_spec, {}, {"T": 16}, ".", 5).make()
    arrays = {name: WorkerArray(driver, host, keep_pristine=True) for name, host in made.items()}
    x = arrays["x"]
    assert not x.contiguous and x.strides == (64, 1) and x.nbytes == (15 * 64 + 40) * 4
    assert x.__cuda_array_interface__["strides"] == (256, 4) and arrays["bias"].__cuda_array_interface__["strides"] is None
    stream = cuda_standin.FakeDevice(0).create_stream().handle
    for array in arrays.values():
        array.reset(False, stream)  # each run starts from the pristine copy
    np.testing.assert_array_equal(x.download(), made["x"])
    np.testing.assert_array_equal(arrays["w"].download(), made["w"])
    kernel = make_kernel(kernel_decl(rows_spec), config={"BLOCK": 32})
    call = kernel.prepare(**arrays)
    assert call.c_args[2:5] == (64, 1, 40) and call.dims == {"D": 40}  # ld = x_stride0, inc = x_stride1, cols = D
    kernel(**arrays)  # as the worker launches a variant: the rows of the padded buffer get the bias
    np.testing.assert_array_equal(x.download(), made["x"] + made["bias"])
    assert not Expected(driver).keep_device("x", x, stream)  # a strided output is compared on the host
    x.reset(True, stream)  # poisoned: the padding too
    assert np.isnan(x.download()).all()
    x.reset(False, stream)
    np.testing.assert_array_equal(x.download(), made["x"])
