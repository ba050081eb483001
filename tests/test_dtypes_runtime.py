"""The run-time call path with every dtype of the field (bfloat16, FP8, complex, bool): arrays are
identified by their library's own dtype object (PyTorch's, CuPy's NumPy/ml_dtypes dtype) or their
DLPack type code, never by an ambiguous CUDA Array Interface typestr, which is refused with a
message that says what to pass instead; scalars become the exact bytes of their C type, on the
checked path, the fast path and cuda.core's launch (the tuning worker's); PyTorch's operators
take such tensors and scalars while tracing.

Kernels are built from their table JSON with hand-written PTX (the driver stand-in,
tests/cuda_standin.py, reads each launch's parameters as the PTX declares them): no NVRTC."""

from __future__ import annotations

import ctypes
import math
import random
import sys
from itertools import product

import ml_dtypes
import numpy as np
import pytest
import torch
from cuda.core._kernel_arg_handler import ParamHolder
from cuda_standin import DeviceArray, install
from standin_arrays import DLPackArray, RefusingCai, install_cupy, install_torch

from hatch_autotune import runtime
from hatch_autotune.declare.expr import parse
from hatch_autotune.runtime import Library
from hatch_autotune.runtime.args import CAI_AMBIGUITY, array_view, dlpack_capsule_dtype, torch_view
from hatch_autotune.runtime.declaration import NARROW_ARRAYS_DOC
from hatch_autotune.runtime.scalars import bfloat16_bits, c_scalar
from hatch_autotune.runtime.table import sha256_hex
from hatch_autotune.runtime.values import DLPACK_CODES, types_key
from hatch_autotune.wheel.stub import _Builtins, _scalar_type

NEW = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "complex64", "complex128", "bool")
T_CHOICES = ("float32", *NEW)
FP8 = ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")


def np_dtype(name: str) -> np.dtype:
    """A dtype as NumPy (ml_dtypes for the narrow ones) and so CuPy name it."""
    return np.dtype(getattr(ml_dtypes, name, None) or name)


# ---- kernels from table JSON and PTX ----------------------------------------------------------

PTX_PARAM = {
    "pointer": ".u64", "float32": ".f32", "int32": ".u32", "bfloat16": ".b16", "float8_e4m3fn": ".b8", "float8_e5m2": ".b8",
    "float8_e8m0fnu": ".b8", "bool": ".u8", "complex64": ".align 8 .b8 {}[8]", "complex128": ".align 16 .b8 {}[16]",
}  # fmt: skip


def ptx(entry: str, params: list[tuple[str, str]]) -> bytes:
    """A PTX kernel that declares these (name, dtype or 'pointer') parameters and does nothing."""
    lines = [f"    .param {PTX_PARAM[d].format(n)}" + ("" if "{}" in PTX_PARAM[d] else f" {n}") for n, d in params]
    body = ",\n".join(lines)
    return f".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry {entry}(\n{body}\n)\n{{\n    ret;\n}}\n".encode()


def arr(name: str, dtype: str, intent: str = "in") -> dict:
    return {"name": name, "dtype": dtype, "kind": "array", "shape": [parse("n").tree], "intent": intent}


def scalar(name: str, dtype: str, value: str | None = None) -> dict:
    out = {"name": name, "dtype": dtype, "kind": "scalar"}
    if value is not None:
        out["value"] = parse(value).tree
    return out


def spec(name: str, args: list[dict], type_params: dict[str, list[str]]) -> tuple[dict, bytes]:
    """A kernel's table JSON (one untuned variant, PTX for sm_90, n in one bucket) and its PTX."""
    code = ptx(name, [(a["name"], "pointer" if a["kind"] == "array" else a["dtype"]) for a in args])  # no scalar of a type parameter
    instances = [dict(zip(type_params, values)) for values in product(*type_params.values())] or [{}]
    row = [{"bucket": [1024], "variant": "v0", "tuned": False, "provenance": {"reason": "default"}}]
    return {
        "entry": name,
        "doc": "",
        "args": args,
        "key": [{"name": "n", "from": "x", "axis": 0, "buckets": [1024], "mapping": "nearest"}],
        "type_params": type_params,
        "constants": [],
        "launch": {"grid": [parse("cdiv(n, 128)").tree], "block": [128], "shared": 0},
        "variants": {
            "v0": {
                "config": {},
                "binaries": {"compute_90": {"file": f"{name}.ptx", "sha256": sha256_hex(code), "ptx_isa": "8.0", "nvrtc": "12.8"}},
            }
        },
        "select": {types_key(i): {"sm_90": row} for i in instances},
    }, code


# scale(a, x, y): a bfloat16 scalar and arrays of any dtype (T); `a` is two bytes whatever T is
SCALE = spec("scale", [scalar("a", "bfloat16"), arr("x", "T"), arr("y", "T", "out"), scalar("n", "int32", "n")], {"T": list(T_CHOICES)})
# a scalar of each narrow, complex and bool dtype beside a float32 array
SCALARS = spec(
    "scalars",
    [
        arr("x", "float32", "inout"),
        scalar("h", "bfloat16"),
        scalar("e4", "float8_e4m3fn"),
        scalar("e5", "float8_e5m2"),
        scalar("e8", "float8_e8m0fnu"),
        scalar("flag", "bool"),
        scalar("c", "complex64"),
        scalar("n", "int32", "n"),
    ],
    {},
)
WIDE = spec("wide", [arr("x", "float32", "inout"), scalar("z", "complex128"), scalar("n", "int32", "n")], {})


@pytest.fixture
def library(tmp_path) -> Library:
    kernels = {}
    for name, (table, code) in {"scale": SCALE, "scalars": SCALARS, "wide": WIDE}.items():
        (tmp_path / f"{name}.ptx").write_bytes(code)
        kernels[name] = table
    return Library(
        str(tmp_path),
        {"module": "dtkit", "archs": [], "ptx": {"sm_90": "compute_90"}, "drivers": {"compute_90": "13.0"}, "kernels": kernels},
    )


@pytest.fixture
def standin(monkeypatch):
    standin = install(monkeypatch, runtime)
    yield standin
    runtime.use_gpu(None)


# ---- arrays: PyTorch, CuPy, the CUDA Array Interface, DLPack ----------------------------------


@pytest.mark.parametrize("name", NEW)
def test_a_pytorch_tensor_is_named_by_its_own_dtype(name):
    dtype = getattr(torch, name)
    assert torch_view(torch.empty(4, dtype=dtype)).dtype == name  # CPU
    view = torch_view(torch.empty(2, 3, dtype=dtype, device="meta"), memory=False)
    assert (view.dtype, view.shape, view.device, view.contiguous) == (name, (2, 3), None, True)


def test_a_pytorch_dtype_of_no_kernel_is_named_as_pytorch_says_it():
    view = torch_view(torch.empty(4, dtype=torch.float8_e4m3fnuz))
    assert view.dtype is None and view.dtype_text() == "'torch.float8_e4m3fnuz', which hatch-autotune cannot pass"


@pytest.mark.parametrize("name", NEW)
def test_a_cupy_array_is_named_by_its_numpy_dtype_name_not_kind_and_size(monkeypatch, name):
    standin = install(monkeypatch)
    cupy = install_cupy(monkeypatch, standin)
    view = array_view(cupy.ndarray((8,), np_dtype(name)))
    assert (view.dtype, view.shape, view.contiguous) == (name, (8,), True)


def test_a_cupy_void_or_big_endian_dtype_is_none(monkeypatch):
    standin = install(monkeypatch)
    cupy = install_cupy(monkeypatch, standin)
    assert np_dtype("float8_e5m2").kind == "f" and np_dtype("float8_e5m2").itemsize == 1  # what kind + size would misname
    for dtype in ("V2", ">f4", ">c8"):
        assert array_view(cupy.ndarray((8,), dtype)).dtype is None


class CaiOnly:
    """An array that says only its __cuda_array_interface__."""

    def __init__(self, cai: dict):
        self.__cuda_array_interface__ = cai


class OtherSizeDtype(CaiOnly):
    """An interface whose `dtype` attribute does not match its typestr's size: not trusted."""

    dtype = np.dtype("float32")


def test_an_own_dtype_of_another_size_than_the_typestr_is_not_trusted(standin):
    x = OtherSizeDtype(DeviceArray.empty(standin, (8,), np_dtype("bfloat16")).__cuda_array_interface__)
    assert array_view(x).dtype is None


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"])
def test_an_ambiguous_cai_typestr_is_refused_with_what_to_pass_instead(library, standin, name):
    own = DeviceArray.empty(standin, (1024,), np_dtype(name))  # ml_dtypes' typestr: '<V2', '<V1' or '<f1'
    assert own.__cuda_array_interface__["typestr"] in ("<V2", "<V1", "<f1")
    assert array_view(own).dtype == name  # its own `dtype` (ml_dtypes') names it: the tuning worker's arrays
    x = CaiOnly(own.__cuda_array_interface__)  # nothing but the interface: the typestr alone
    with pytest.raises(TypeError) as caught:
        library.kernels["scale"].prepare(1.0, x, x)
    typestr = x.__cuda_array_interface__["typestr"]
    assert str(caught.value) == (
        f"scale(): argument 'x' has dtype '{typestr}' by its __cuda_array_interface__, which hatch-autotune cannot identify: "
        f"{CAI_AMBIGUITY}; expected one of {list(T_CHOICES)} (type parameter T)"
    )
    assert "DLPack" in CAI_AMBIGUITY and "torch.from_dlpack" in CAI_AMBIGUITY and "ml_dtypes" in CAI_AMBIGUITY
    with pytest.raises(
        TypeError, match=r"^scalars\(\): argument 'x' has dtype '<.\d' by its __cuda_array_interface__.*; expected float32$"
    ):
        library.kernels["scalars"].prepare(x, 1.0, 1.0, 1.0, 1.0, True, 1j)
    assert standin.launches == []


@pytest.mark.parametrize("name", ["complex64", "complex128", "bool"])
def test_an_unambiguous_cai_typestr_names_complex_and_bool(library, standin, name):
    x, y = (DeviceArray(standin, np.zeros(1024, name)) for _ in range(2))
    assert library.kernels["scale"].prepare(1.0, x, y).types == {"T": name}
    library.kernels["scale"](1.0, x, y)
    assert len(standin.launches) == 1


@pytest.mark.parametrize("name", NEW)
def test_a_dlpack_only_array_is_named_by_its_type_code(library, name):
    x, y = (DLPackArray(torch.zeros(1024, dtype=getattr(torch, name))) for _ in range(2))
    call = library.kernels["scale"].prepare(1.0, x, y)
    assert call.types == {"T": name} and call.arrays["x"].device == 0 and call.arrays["x"].shape == (1024,)


def test_an_ambiguous_typestr_beside_dlpack_is_read_through_dlpack(library, standin):
    """'<V2' says nothing; the same array's DLPack export says bfloat16. Such a call never takes
    the fast path: the typestr in its signature would not tell bfloat16 from float16's twin."""
    x, y = (DLPackArray(torch.zeros(1024, dtype=torch.bfloat16), typestr="<V2") for _ in range(2))
    kernel = library.kernels["scale"]
    assert kernel.prepare(1.0, x, y).types == {"T": "bfloat16"}
    for _ in range(2):
        kernel(1.0, x, y)  # pointers are never dereferenced: the PTX kernel does nothing
    assert kernel.checked_calls == 2 and len(standin.launches) == 2
    e4, e5 = (DLPackArray(torch.zeros(1024, dtype=getattr(torch, n)), typestr="<V1") for n in ("float8_e4m3fn", "float8_e5m2"))
    with pytest.raises(TypeError, match=r"argument 'y' has dtype float8_e5m2 but 'x' has float8_e4m3fn; both are T"):
        kernel.prepare(1.0, e4, e5)  # the same typestr, two dtypes


def test_a_cai_property_that_refuses_leaves_dlpack(library):
    x, y = (RefusingCai(DLPackArray(torch.zeros(1024, dtype=torch.bfloat16))) for _ in range(2))
    assert library.kernels["scale"].prepare(1.0, x, y).types == {"T": "bfloat16"}


@pytest.mark.parametrize("name", [n for n in DLPACK_CODES if hasattr(torch, n)])
def test_the_capsules_dtype_is_read_as_dlpack_h_lays_it_out(name):
    tensor = torch.zeros(3, dtype=getattr(torch, name))
    assert dlpack_capsule_dtype(tensor.__dlpack__()) == (*DLPACK_CODES[name], 1)
    capsule = tensor.__dlpack__()
    dlpack_capsule_dtype(capsule)
    assert torch.from_dlpack(capsule).dtype == tensor.dtype  # left unconsumed: still usable
    assert dlpack_capsule_dtype(b"dltensor") is None


def test_a_wrong_dtype_is_refused_by_name(library, standin, monkeypatch):
    torch_ = install_torch(monkeypatch, standin)
    cupy = install_cupy(monkeypatch, standin)
    kernel = library.kernels["scalars"]
    args = (1.0, 1.0, 1.0, 1.0, True, 1j)
    with pytest.raises(TypeError, match=r"^scalars\(\): argument 'x' has dtype bfloat16; expected float32$"):
        kernel(torch_.Tensor((1024,), "bfloat16"), *args)
    with pytest.raises(TypeError, match=r"^scalars\(\): argument 'x' has dtype float8_e8m0fnu; expected float32$"):
        kernel(cupy.ndarray((1024,), np_dtype("float8_e8m0fnu")), *args)
    with pytest.raises(TypeError, match=r"^scalars\(\): argument 'x' has dtype complex64; expected float32$"):
        kernel(DLPackArray(torch.zeros(1024, dtype=torch.complex64)), *args)
    assert standin.launches == []


# ---- launches: every dtype's arrays, and scalars as their bytes -------------------------------


@pytest.mark.parametrize("name", T_CHOICES)
def test_cupy_and_pytorch_arrays_of_each_dtype_launch_with_the_scalar_as_bfloat16_bits(library, standin, monkeypatch, name):
    cupy = install_cupy(monkeypatch, standin)
    kernel = library.kernels["scale"]
    x, y = cupy.ndarray((1024,), np_dtype(name)), cupy.ndarray((1024,), np_dtype(name))
    for a, bits in ((1.5, 0x3FC0), (2, 0x4000), (np.float32(-0.5), 0xBF00), (1 + 2**-8, 0x3F80)):  # 1 + 2**-8: a tie, to even
        kernel(a, x, y)
        launch = standin.launches[-1]
        assert launch.params[0] == bits.to_bytes(2, "little")  # an int 2 is 2.0, not the bits 0x0002
        assert [int.from_bytes(p, "little") for p in launch.params[1:]] == [x.data.ptr, y.data.ptr, 1024]
    assert kernel.checked_calls == 3  # a float, an int, a NumPy float32: three signatures; the last call took the fast path
    with pytest.raises(ValueError, match=r"^scale\(\): argument 'a'=1e\+39 does not fit in bfloat16 .*would become inf"):
        kernel(1e39, x, y)
    with pytest.raises(TypeError, match=r"^scale\(\): argument 'a' must be a real number \(bfloat16\), got 1j"):
        kernel(1j, x, y)
    assert len(standin.launches) == 4
    if name in ("float32", "bfloat16", "bool"):  # the dtypes the stand-in's PyTorch has
        torch_ = install_torch(monkeypatch, standin)
        t, u = torch_.Tensor((1024,), name), torch_.Tensor((1024,), name)
        kernel(0.25, t, u)
        assert standin.launches[-1].params[0] == (0x3E80).to_bytes(2, "little")


def expected_scalar_bytes(h, e4, e5, e8, flag, c) -> list[bytes]:
    """The bytes each scalar of SCALARS has in the kernel, as ml_dtypes and NumPy make them."""
    narrow = [np.array(np.float32(v)).astype(getattr(ml_dtypes, d)).tobytes() for v, d in zip((h, e4, e5, e8), ("bfloat16", *FP8))]
    return [*narrow, np.bool_(flag).tobytes(), np.complex64(c).tobytes()]


def test_each_scalar_reaches_the_kernel_as_its_c_bytes_on_both_paths(library, standin, monkeypatch):
    cupy = install_cupy(monkeypatch, standin)
    kernel = library.kernels["scalars"]
    x = cupy.ndarray((1024,))
    calls = [
        (1.5, 1.0, 3.0, 0.5, True, 1 + 2j),  # checked
        (-2.25, 448.0, 57344.0, 2.0**-127, False, 2.5),  # fast: the same types
        (3.0, -0.1, 1e-5, 2.0**127, True, -1j),
    ]
    for h, e4, e5, e8, flag, c in calls:
        kernel(x, h, e4, e5, e8, flag, c)
        launch = standin.launches[-1]
        assert launch.params[0] == x.data.ptr.to_bytes(8, "little")
        assert launch.params[1:7] == expected_scalar_bytes(h, e4, e5, e8, flag, c), (h, e4, e5, e8, flag, c)
        assert launch.params[7] == (1024).to_bytes(4, "little")
    assert kernel.checked_calls == 2  # c=2.5, a float, is another signature than a complex
    launched = len(standin.launches)
    for bad, message in [
        ((x, 1.0, 500.0, 1.0, 1.0, True, 1j), r"argument 'e4'=500.0 does not fit in float8_e4m3fn \[-448, 448\]: it would become NaN"),
        ((x, 1.0, 1.0, 1.0, 3.0, True, 1j), r"argument 'e8'=3.0 is not a float8_e8m0fnu value"),
        ((x, 1.0, 1.0, 1.0, 1.0, 1, 1j), r"argument 'flag' must be a bool \(True or False\), got 1"),
        ((x, 1.0, 1.0, 1e6, 1.0, True, 1j), r"argument 'e5'=1000000.0 does not fit in float8_e5m2 .*would become inf"),
        ((x, 1.0, 1.0, 1.0, 1.0, True, complex(1e39, 0)), r"argument 'c'=\(1e\+39\+0j\) does not fit in the real part of complex64"),
    ]:
        with pytest.raises((TypeError, ValueError), match=r"^scalars\(\): " + message):
            kernel(*bad)
    assert len(standin.launches) == launched


def test_cuda_core_launch_packs_the_c_values_as_the_kernel_reads_them(library):
    """The tuning worker launches with cuda.core's launch and `prepare(...).c_args`: its
    ParamHolder packs them into the same bytes."""
    call = library.kernels["scalars"].prepare(DLPackArray(torch.zeros(1024)), 1.5, 1.0, 3.0, 0.5, True, 1 + 2j)
    holder = ParamHolder(list(call.c_args))
    addresses = (ctypes.c_void_p * len(call.c_args)).from_address(holder.ptr)
    sizes = [8, 2, 1, 1, 1, 1, 8, 4]
    packed = [ctypes.string_at(addresses[i], size) for i, size in enumerate(sizes)]
    assert packed[1:7] == expected_scalar_bytes(1.5, 1.0, 3.0, 0.5, True, 1 + 2j)
    assert [type(v).__name__ for v in call.c_args[1:7]] == ["uint16", "uint8", "uint8", "uint8", "bool", "complex64"]


def test_a_complex128_scalar_reaches_the_kernel_as_its_16_bytes_on_both_paths(library, standin, monkeypatch):
    cupy = install_cupy(monkeypatch, standin)
    kernel = library.kernels["wide"]
    x = cupy.ndarray((1024,))
    assert kernel.prepare(x, 1 + 2j).c_args[1] == np.complex128(1 + 2j)
    for z in (1 + 2j, -0.5 + 1e300j):  # checked, then fast
        kernel(x, z)
        launch = standin.launches[-1]
        assert launch.params[1] == np.complex128(z).tobytes()
        assert launch.params[2] == (1024).to_bytes(4, "little")
    assert kernel.checked_calls == 1
    with pytest.raises(TypeError, match=r"^wide\(\): argument 'z' must be a number \(complex128\), got str"):
        kernel(x, "1j")
    assert len(standin.launches) == 2


# ---- scalars ------------------------------------------------------------------------------------


def bf16_cases() -> list[float]:
    rng = random.Random(7)
    values = [0.0, -0.0, 1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-30, 3.3895313892515355e38, 2.0**-133, -(2.0**-126), 1e-45]
    values += [float("inf"), -float("inf"), float("nan"), -float("nan")]
    values += [rng.uniform(-1e4, 1e4) for _ in range(2000)] + [math.ldexp(rng.random(), rng.randint(-140, 127)) for _ in range(2000)]
    bits = [rng.getrandbits(32) for _ in range(2000)]  # float32s of every kind, NaN payloads included
    return values + [float(np.uint32(b).view(np.float32)) for b in bits]


def test_bfloat16_rounding_matches_ml_dtypes_and_needs_no_ml_dtypes(monkeypatch):
    for v in bf16_cases():
        theirs = int(np.array(np.float32(v)).astype(ml_dtypes.bfloat16).view(np.uint16))
        if math.isfinite(v) and theirs & 0x7F80 == 0x7F80:  # a finite value that would become inf: refused
            with pytest.raises(ValueError, match=r"would become inf"):
                c_scalar(v, "bfloat16", "k", "a")
        else:
            assert int(c_scalar(v, "bfloat16", "k", "a")) == theirs, v
    assert all(type(c_scalar(v, "bfloat16", "k", "a")) is np.uint16 for v in (1.0, np.float64(2.0), ml_dtypes.bfloat16(3.0)))
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # a wheel's runtime without ml_dtypes
    assert int(c_scalar(1.5, "bfloat16", "k", "a")) == 0x3FC0 and int(bfloat16_bits(np.float32(-2.0))) == 0xC000
    with pytest.raises(ImportError, match=r"^k\(\): argument 'a' is a float8_e5m2 scalar, .*pip install ml_dtypes$"):
        c_scalar(1.0, "float8_e5m2", "k", "a")


@pytest.mark.parametrize("name", FP8)
def test_fp8_scalars_are_their_bits_through_float32(name):
    rng = random.Random(name)
    narrow = getattr(ml_dtypes, name)
    largest = float(ml_dtypes.finfo(narrow).max)
    if name == "float8_e8m0fnu":
        values = [2.0**k for k in range(-127, 128)] + [float("nan")]
    else:
        values = [rng.uniform(-largest, largest) for _ in range(500)] + [0.0, -0.0, largest, -largest, float("nan"), 1 + 2**-4 + 2**-40]
    for v in values:
        got = c_scalar(v, name, "k", "a")
        assert type(got) is np.uint8 and int(got) == int(np.array(np.float32(v)).astype(narrow).view(np.uint8)), v


@pytest.mark.parametrize(
    "value,dtype,error,message",
    [
        (
            500.0,
            "float8_e4m3fn",
            ValueError,
            "does not fit in float8_e4m3fn [-448, 448]: it would become NaN (float8_e4m3fn has no infinity)",
        ),
        (float("inf"), "float8_e4m3fn", ValueError, "float8_e4m3fn has no infinity; pass a finite value or NaN"),
        (
            1e6,
            "float8_e5m2",
            ValueError,
            "does not fit in float8_e5m2 [-57344, 57344]: it would become inf (pass inf itself if that is meant)",
        ),
        (10**400, "bfloat16", ValueError, "does not fit in bfloat16"),
        (float(2**128 - 2**119), "bfloat16", ValueError, "would become inf"),  # the tie: to even, inf
        (float(2**128 - 2**119) * (1 - 2**-40), "bfloat16", ValueError, "would become inf"),  # float32 rounds it onto the tie
        (3.0, "float8_e8m0fnu", ValueError, "is not a float8_e8m0fnu value: that type (a scale) holds only powers of two"),
        (0.0, "float8_e8m0fnu", ValueError, "is not a float8_e8m0fnu value"),
        (-1.0, "float8_e8m0fnu", ValueError, "is not a float8_e8m0fnu value"),
        (float("inf"), "float8_e8m0fnu", ValueError, "is not a float8_e8m0fnu value"),
        (2.0**128, "float8_e8m0fnu", ValueError, "is not a float8_e8m0fnu value"),
        (1, "bool", TypeError, "must be a bool (True or False), got 1"),
        (np.int8(0), "bool", TypeError, "must be a bool (True or False)"),
        (True, "complex64", TypeError, "must be a number (complex64), got bool"),
        ("1j", "complex128", TypeError, "must be a number (complex128), got str"),
        (complex(0, 1e39), "complex64", ValueError, "does not fit in the imaginary part of complex64"),
        (10**400, "complex128", ValueError, "does not fit in the real part of complex128"),
        (1 + 1j, "float32", TypeError, "must be a real number (float32), got (1+1j)"),
        (np.complex64(1), "bfloat16", TypeError, "must be a real number (bfloat16)"),
    ],
)
def test_scalars_out_of_range_or_of_the_wrong_kind_are_refused_by_name(value, dtype, error, message):
    with pytest.raises(error) as caught:
        c_scalar(value, dtype, "k", "a")
    text = str(caught.value)
    assert text.startswith("k(): argument 'a'") and message in text, text
    if dtype in ("float8_e4m3fn", "float8_e8m0fnu"):
        assert "pass inf itself" not in text and "become inf" not in text  # no infinity to promise


def test_complex_and_bool_scalars_accept_what_they_hold():
    for value in (1 + 2j, np.complex64(1 + 2j), np.complex128(1 + 2j)):
        assert c_scalar(value, "complex64", "k", "a") == np.complex64(1 + 2j)
    for value, expected in ((3, 3), (np.float32(2.5), 2.5), (np.int64(-1), -1), (float("inf"), float("inf"))):
        got = c_scalar(value, "complex128", "k", "a")
        assert type(got) is np.complex128 and got == complex(expected)
    assert type(c_scalar(1.0, "complex64", "k", "a")) is np.complex64
    assert c_scalar(True, "bool", "k", "a") is np.True_ and c_scalar(np.bool_(False), "bool", "k", "a") is np.False_
    assert int(c_scalar(float("nan"), "float8_e8m0fnu", "k", "a")) == 0xFF


# ---- PyTorch operators --------------------------------------------------------------------------


@pytest.fixture
def dtype_ops(library):
    """The library's operators under a namespace of this test module (registered once per process)."""
    return runtime.torch_ops.register(library, "dtkit_dtypes")


def test_operator_schemas_take_narrow_complex_and_bool_scalars(dtype_ops):
    schemas = {name: str(packet.default._schema).split("::", 1)[1] for name, packet in dtype_ops.items()}
    assert schemas == {
        "scale": "scale(float a, Tensor x) -> Tensor",
        "scale_out": "scale_out(float a, Tensor x, Tensor(a0!) y) -> ()",
        "scalars": "scalars(Tensor(a0!) x, float h, float e4, float e5, float e8, bool flag, complex c) -> ()",
        "wide": "wide(Tensor(a0!) x, complex z) -> ()",
    }


@pytest.mark.parametrize("name", NEW)
def test_fake_implementations_accept_each_dtype_and_make_its_outputs(dtype_ops, name):
    dtype = getattr(torch, name)
    out = dtype_ops["scale"](1.5, torch.empty(1024, dtype=dtype, device="meta"))
    assert (out.dtype, tuple(out.shape), out.device.type) == (dtype, (1024,), "meta")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = dtype_ops["scale"](2, torch.empty(1024, dtype=dtype, device="cuda"))
    assert out.dtype == dtype


def test_fake_implementations_refuse_wrong_dtypes_and_scalars_by_name(dtype_ops):
    with pytest.raises(TypeError, match=r"^scale\(\): argument 'x' has dtype float64; expected one of \['float32', 'bfloat16'"):
        dtype_ops["scale"](1.0, torch.empty(1024, dtype=torch.float64, device="meta"))
    with pytest.raises(TypeError, match=r"^scale\(\): argument 'x' has dtype 'torch.float8_e4m3fnuz', which hatch-autotune cannot pass"):
        dtype_ops["scale"](1.0, torch.empty(1024, dtype=torch.float8_e4m3fnuz, device="meta"))
    x = torch.empty(1024, device="meta")
    with pytest.raises(ValueError, match=r"^scalars\(\): argument 'e8'=3.0 is not a float8_e8m0fnu value"):
        dtype_ops["scalars"](x, 1.0, 1.0, 1.0, 3.0, True, 1j)
    with pytest.raises(ValueError, match=r"^scalars\(\): argument 'h'=1e\+39 does not fit in bfloat16"):
        dtype_ops["scalars"](x, 1e39, 1.0, 1.0, 1.0, True, 1j)
    dtype_ops["scalars"](x, 1.0, 1.0, 1.0, 1.0, True, 1j)  # all fine


# ---- help() and the stubs -------------------------------------------------------------------------


def test_help_and_stubs_say_how_to_pass_each_dtype(library):
    scale, scalars = library.kernels["scale"].declaration, library.kernels["scalars"].declaration
    doc = scale.call_doc()
    assert "  a: scalar, bfloat16 (a real number, rounded to nearest even)\n" in doc
    assert "  x: GPU array, T in {float32, bfloat16, float8_e4m3fn" in doc and NARROW_ARRAYS_DOC in doc
    doc = scalars.call_doc()
    assert "  e8: scalar, float8_e8m0fnu (a real number, rounded to nearest even, FP8 through ml_dtypes)\n" in doc
    assert "  flag: scalar, bool (True or False)\n" in doc and "  c: scalar, complex64 (a complex or real number)\n" in doc
    assert NARROW_ARRAYS_DOC not in doc  # its only array is float32
    b = _Builtins(shadowed=set())
    kinds = {a.name: _scalar_type(a, scalars, b) for a in scalars.user_args if not a.is_array}
    assert kinds == {"h": "_SupportsFloat", "e4": "_SupportsFloat", "e5": "_SupportsFloat", "e8": "_SupportsFloat",
                     "flag": "bool", "c": "_SupportsComplex | _SupportsFloat"}  # fmt: skip
