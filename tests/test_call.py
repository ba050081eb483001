"""The call boundary of generated kernels, on the CPU: argument binding, array protocol, dtype,
shape, contiguity and intent checks, type-parameter inference, key derivation, scalar
conversion, streams and launch geometry. The arrays here are stand-ins that expose
__cuda_array_interface__ with made-up pointers: nothing is launched (no GPU here)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from hatch_autotune.runtime import stream_handle


class FakeGPUArray:
    """Exposes the CUDA Array Interface v3 like CuPy/PyTorch/Numba do; never dereferenced."""

    _next_ptr = 0x7F0000000000

    def __init__(self, shape, typestr="<f4", strides=None, readonly=False):
        FakeGPUArray._next_ptr += 1 << 20
        self.ptr = FakeGPUArray._next_ptr
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (self.ptr, readonly),
            "strides": strides,
            "version": 3,
        }


@pytest.fixture(scope="module")
def kernels(example_kernels):
    return example_kernels


def test_saxpy_float32_call_is_prepared_exactly(kernels):
    x, y = FakeGPUArray((1000,)), FakeGPUArray((1000,))
    call = kernels.saxpy.prepare(2.5, x, y)
    assert call.types == {"T": "float32"} and call.key == {"n": 1000}
    a, px, py, n = call.c_args
    assert type(a) is np.float32 and a == np.float32(2.5)  # float32 stays float32
    assert (px, py) == (x.ptr, y.ptr)
    assert type(n) is np.int32 and n == 1000  # computed from the key, not passed
    assert kernels.saxpy.prepare(a=1.0, x=x, y=y).c_args[1:3] == (x.ptr, y.ptr)


def test_type_parameter_is_inferred_from_the_arrays(kernels):
    x, y = FakeGPUArray((7,), "<f2"), FakeGPUArray((7,), "<f2")
    call = kernels.saxpy.prepare(np.float64(3.0), x, y)
    assert call.types == {"T": "float16"}
    assert type(call.c_args[0]) is np.float32  # `a` is declared float32 whatever T is


@pytest.mark.parametrize(
    "make,exc,fragment",
    [
        (lambda: (1.0, FakeGPUArray((8,)), FakeGPUArray((8,), "<f2")), TypeError, "argument 'y' has dtype float16 but 'x' has float32"),
        (
            lambda: (1.0, FakeGPUArray((8,), "<f8"), FakeGPUArray((8,), "<f8")),
            TypeError,
            "argument 'x' has dtype float64; expected one of ['float32', 'float16']",
        ),
        (
            lambda: (1.0, FakeGPUArray((8,), ">f4"), FakeGPUArray((8,))),
            TypeError,
            "argument 'x' has dtype '>f4' (big-endian), which hatch-autotune cannot pass",
        ),
        (lambda: (1.0, FakeGPUArray((8,)), FakeGPUArray((9,))), ValueError, "argument 'y' has shape (9,); expected (8,) (from n=8)"),
        (lambda: (1.0, FakeGPUArray((8, 1)), FakeGPUArray((8,))), ValueError, "argument 'x' has 2 dimension(s)"),
        (lambda: (1.0, FakeGPUArray((8,), strides=(8,)), FakeGPUArray((8,))), ValueError, "argument 'x' must be C-contiguous"),
        (
            lambda: (1.0, FakeGPUArray((8,)), FakeGPUArray((8,), readonly=True)),
            ValueError,
            "argument 'y' is read-only but the kernel writes it (intent inout)",
        ),
        (
            lambda: (1.0, [1.0] * 8, FakeGPUArray((8,))),
            TypeError,
            "argument 'x' must be a GPU array exposing __cuda_array_interface__ or DLPack",
        ),
        (lambda: ("2", FakeGPUArray((8,)), FakeGPUArray((8,))), TypeError, "argument 'a' must be a number (float32), got str"),
        (lambda: (True, FakeGPUArray((8,)), FakeGPUArray((8,))), TypeError, "argument 'a' must be a number"),
    ],
)
def test_wrong_arguments_name_the_argument(kernels, make, exc, fragment):
    with pytest.raises(exc) as info:
        kernels.saxpy.prepare(*make())
    assert fragment in str(info.value) and str(info.value).startswith("saxpy(): ")


def test_misaligned_view_is_rejected_before_a_vector_load_faults(kernels):
    x, y = FakeGPUArray((8,)), FakeGPUArray((8,))
    x.__cuda_array_interface__["data"] = (x.ptr + 4, False)  # like x[1:] of a float32 array
    with pytest.raises(ValueError, match=r"argument 'x' must start on a 16-byte boundary.*offset by 4 bytes"):
        kernels.saxpy.prepare(1.0, x, y)


def test_read_only_input_is_fine(kernels):
    x = FakeGPUArray((8,), readonly=True)
    assert kernels.saxpy.prepare(1.0, x, FakeGPUArray((8,))).arrays["x"].readonly


def test_strides_of_size_one_dims_are_ignored(kernels):
    x = FakeGPUArray((3, 1), strides=(4, 999))
    y = FakeGPUArray((3, 1), strides=(4, 4))
    assert kernels.row_softmax.prepare(x, y).key == {"rows": 3, "cols": 1}


def test_host_numpy_array_is_rejected_before_launch(kernels):
    host = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match=r"saxpy\(\): argument 'x' is in host memory; expected a GPU array"):
        kernels.saxpy.prepare(1.0, host, FakeGPUArray((8,)))


def test_binding_errors(kernels):
    x, y = FakeGPUArray((8,)), FakeGPUArray((8,))
    with pytest.raises(TypeError, match=r"saxpy\(\) missing argument\(s\): y"):
        kernels.saxpy.prepare(1.0, x)
    with pytest.raises(TypeError, match="takes 3 arguments"):
        kernels.saxpy.prepare(1.0, x, y, y)
    with pytest.raises(TypeError, match="unexpected argument 'n'"):
        kernels.saxpy.prepare(1.0, x, y=y, n=8)  # n is computed from the key, not passed
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        kernels.saxpy.prepare(1.0, x, x=x, y=y)


def test_sgemm_key_from_two_arrays_and_shape_check(kernels):
    A, B, C = FakeGPUArray((37, 19)), FakeGPUArray((19, 29)), FakeGPUArray((37, 29))
    call = kernels.sgemm.prepare(A, B, C)
    assert call.key == {"m": 37, "n": 29, "k": 19}
    assert [int(v) for v in call.c_args[3:]] == [37, 29, 19] and all(type(v) is np.int32 for v in call.c_args[3:])
    with pytest.raises(ValueError, match=r"argument 'B' has shape \(20, 29\); expected \(19, 29\)"):
        kernels.sgemm.prepare(A, FakeGPUArray((20, 29)), C)
    with pytest.raises(ValueError, match=r"argument 'C' has shape \(29, 37\); expected \(37, 29\)"):
        kernels.sgemm.prepare(A, B, FakeGPUArray((29, 37)))


def test_launch_geometry_follows_the_config(kernels):
    sgemm = kernels.sgemm
    config = {"BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64, "TM": 4, "TN": 8, "STAGES": 2, "SPLITK": 1}
    assert sgemm.geometry(config, {}, {"m": 1000, "n": 1000, "k": 7}) == ((8, 16), (128,), 0)
    # split-K: SPLITK blocks a tile along x, the pipeline in dynamic shared memory
    split = {**config, "SPLITK": 4}
    assert sgemm.geometry(split, {}, {"m": 1000, "n": 1000, "k": 4096}) == ((32, 16), (128,), 2 * 16 * (64 + 4 + 128) * 4)
    saxpy = kernels.saxpy
    assert saxpy.geometry({"BLOCK": 256, "VEC": 4, "ITEMS": 2}, {"T": "float16"}, {"n": 2049}) == ((2,), (256,), 0)
    assert saxpy.geometry({"BLOCK": 256, "VEC": 4, "ITEMS": 2}, {"T": "float32"}, {"n": 0}) == ((0,), (256,), 0)


class CuPyLikeStream:
    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


class TorchLikeStream:
    cuda_stream = 0xABC


class OldCuPyStream:
    ptr = 0xDEF


def test_stream_handles():
    assert stream_handle(None) is None
    assert stream_handle(0x1234) == 0x1234
    assert stream_handle(CuPyLikeStream(0x55)) == 0x55
    assert stream_handle(TorchLikeStream()) == 0xABC
    assert stream_handle(OldCuPyStream()) == 0xDEF
    with pytest.raises(ValueError, match="non-negative"):
        stream_handle(-1)
    with pytest.raises(TypeError, match=r"stream: expected None, a cuda.core Stream"):
        stream_handle("default")
    with pytest.raises(TypeError):
        stream_handle(True)


def test_scalar_range_and_kind_checks():
    from hatch_autotune.runtime.scalars import c_scalar

    assert type(c_scalar(3, "int32", "k", "n")) is np.int32
    assert c_scalar(2.0, "float16", "k", "h") == np.float16(2.0).view(np.uint16)  # raw half bits
    with pytest.raises(ValueError, match=r"argument 'n'=4294967296 does not fit in int32"):
        c_scalar(2**32, "int32", "k", "n")
    with pytest.raises(TypeError, match="must be an integer"):
        c_scalar(1.5, "int32", "k", "n")
    with pytest.raises(ValueError, match="does not fit in uint8"):
        c_scalar(-1, "uint8", "k", "n")


def test_docstring_and_signature(kernels):
    doc = kernels.saxpy.__doc__
    assert doc.startswith("saxpy(a, x, y, *, stream=None)")
    assert "x: GPU array, T in {float32, float16}, shape (n), C-contiguous, 16-byte aligned, intent in" in doc
    assert "Key (selects the variant): n = x.shape[0] in [4096, 262144, 16777216] (nearest)" in doc
    assert str(inspect.signature(kernels.sgemm)) == "(A, B, C, *, stream=None)"


def test_help_and_the_stub_show_the_same_prose(kernels):
    """One function writes a kernel's prose (runtime/declaration.py): help() shows it, and so
    does the stub's `__call__` and `select` of every kernel, word for word."""
    import ast
    from pathlib import Path

    stub = ast.parse((Path(kernels.__file__).parent / "__init__.pyi").read_text(encoding="utf-8"))
    classes = {n.name: n for n in stub.body if isinstance(n, ast.ClassDef)}
    for name in ("saxpy", "row_softmax", "sgemm"):
        kernel = getattr(kernels, name)
        methods = {n.name: n for n in classes[f"_{name}_kernel"].body if isinstance(n, ast.FunctionDef)}
        assert ast.get_docstring(methods["__call__"]) == inspect.cleandoc(kernel.__doc__)
        assert ast.get_docstring(methods["select"]) == kernel.declaration.select_doc()
    assert "M: GPU array" not in kernels.sgemm.__doc__ and "C: GPU array, float32, shape (m, n)" in kernels.sgemm.__doc__


# ---- the repeated-call fast path, through the driver stand-in (tests/cuda_standin.py) ----------


def test_a_new_signature_takes_the_checked_path(gpu):
    from cuda_standin import DeviceArray

    standin, k = gpu
    arr = lambda n, dtype="float32": DeviceArray.empty(standin, (n,), dtype)  # noqa: E731
    k["saxpy"](1.0, arr(10), arr(10))
    k["saxpy"](1.0, arr(10, "float16"), arr(10, "float16"))  # another dtype
    k["saxpy"](1.0, arr(11), arr(11))  # another size
    k["saxpy"](1.0, arr(11), arr(11), stream=1)  # another stream
    assert len(k["saxpy"]._fast) == 4
    assert [launch.param(3, "int32") for launch in standin.launches] == [10, 10, 11, 11]
    assert [launch.param(0, "float32") for launch in standin.launches] == [1.0] * 4  # `a` is float32 whatever T is
    with pytest.raises(ValueError, match="argument 'y' has shape"):
        k["saxpy"](1.0, arr(11), arr(12))
    assert len(standin.launches) == 4  # nothing launched for the bad call


def test_fast_path_still_checks_alignment_and_scalar_ranges(gpu):
    from cuda_standin import DeviceArray

    standin, k = gpu
    x, y = DeviceArray.empty(standin, (64,)), DeviceArray.empty(standin, (64,))
    k["saxpy"](1.0, x, y)
    k["saxpy"](1.0, x, y)
    x.__cuda_array_interface__ = {**x.__cuda_array_interface__, "data": (x.ptr + 4, False)}
    with pytest.raises(ValueError, match="argument 'x' must start on a 16-byte boundary"):
        k["saxpy"](1.0, x, y)
    with pytest.raises(TypeError, match="argument 'a' must be a number"):
        k["saxpy"]("2", y, y)
    softmax_in, softmax_out = DeviceArray.empty(standin, (3, 5)), DeviceArray.empty(standin, (3, 5))
    k["row_softmax"](softmax_in, softmax_out)
    assert standin.launches[-1].grid == (3, 1, 1)  # one block per row
    assert len(standin.launches) == 3


def test_zero_sized_arrays_launch_nothing(gpu):
    from cuda_standin import DeviceArray

    standin, k = gpu
    x, y = DeviceArray.empty(standin, (0,)), DeviceArray.empty(standin, (0,))
    assert x.ptr == 0  # what CuPy gives for an empty array
    k["saxpy"](1.0, x, y)
    k["saxpy"](1.0, x, y)
    assert standin.launches == []
