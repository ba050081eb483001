"""The CUDA driver through ctypes: the functions the runtime calls, read from libcuda itself.

Why not cuda-bindings (figures: benchmarks/results/driver_seam_cpu.json, docs/drivers.md):
importing `cuda.bindings.driver` took 18.5 ms on an H200's host, more than a whole first call
may take; ctypes comes loaded with numpy and declares these functions in well under a
millisecond; a launch whose arguments are kept as ctypes objects costs what cuda-bindings'
does; and a wheel then needs no cuda-bindings at run time, whichever driver major it meets.

`LibCuda` is shaped like cuda-bindings' `driver` module for the names the runtime uses (each
function returns (CUresult, *outputs); enums and structs by the header's names), so that
cuda_seam, launching and tensor_map work over either, and over the tests' stand-in. The fast
path (fastcall.py) calls `launch` and `context_now`, the raw cuLaunchKernel and cuCtxGetCurrent,
with arguments kept as ctypes objects. Values and layouts are cuda.h's (tests/test_libcuda.py
checks them against the header, and every call against a libcuda built from it)."""

from __future__ import annotations

import ctypes
import os
from ctypes import POINTER, byref, c_char, c_char_p, c_int, c_uint, c_uint32, c_uint64, c_void_p

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from typing import Any

LIBRARY = "nvcuda.dll" if os.name == "nt" else "libcuda.so.1"


class CUresult(int):
    """A driver result: an int, with the driver's own name for it (cuGetErrorName)."""

    name: str

    def __new__(cls, value: int, name: str) -> CUresult:
        self = super().__new__(cls, value)
        self.name = name
        return self

    def __repr__(self) -> str:
        return f"<CUresult.{self.name}: {int(self)}>"


class CUdevice_attribute:
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


class CUpointer_attribute:
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9


class CUfunction_attribute:
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class CUlaunchAttributeID:
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4


class CUtensorMapDataType:
    CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0
    CU_TENSOR_MAP_DATA_TYPE_UINT16 = 1
    CU_TENSOR_MAP_DATA_TYPE_UINT32 = 2
    CU_TENSOR_MAP_DATA_TYPE_INT32 = 3
    CU_TENSOR_MAP_DATA_TYPE_UINT64 = 4
    CU_TENSOR_MAP_DATA_TYPE_INT64 = 5
    CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6
    CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7
    CU_TENSOR_MAP_DATA_TYPE_FLOAT64 = 8
    CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9


class CUtensorMapInterleave:
    CU_TENSOR_MAP_INTERLEAVE_NONE = 0


class CUtensorMapSwizzle:
    CU_TENSOR_MAP_SWIZZLE_NONE = 0
    CU_TENSOR_MAP_SWIZZLE_32B = 1
    CU_TENSOR_MAP_SWIZZLE_64B = 2
    CU_TENSOR_MAP_SWIZZLE_128B = 3


class CUtensorMapL2promotion:
    CU_TENSOR_MAP_L2_PROMOTION_NONE = 0
    CU_TENSOR_MAP_L2_PROMOTION_L2_64B = 1
    CU_TENSOR_MAP_L2_PROMOTION_L2_128B = 2
    CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3


class CUtensorMapFloatOOBfill:
    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0
    CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA = 1


class Dim3(ctypes.Structure):
    _fields_ = [("x", c_uint), ("y", c_uint), ("z", c_uint)]


class CUlaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", c_char * 64), ("clusterDim", Dim3), ("_align", c_uint64)]  # 64 bytes, 8-aligned (it holds pointers)


class CUlaunchAttribute(ctypes.Structure):
    _fields_ = [("id", c_int), ("pad", c_char * 4), ("value", CUlaunchAttributeValue)]


class CUlaunchConfig(ctypes.Structure):
    """cuLaunchKernelEx's config; `attrs` is set from a list of CUlaunchAttribute, as cuda-bindings'."""

    _fields_ = [
        ("gridDimX", c_uint), ("gridDimY", c_uint), ("gridDimZ", c_uint),
        ("blockDimX", c_uint), ("blockDimY", c_uint), ("blockDimZ", c_uint),
        ("sharedMemBytes", c_uint), ("hStream", c_void_p), ("_attrs", POINTER(CUlaunchAttribute)), ("numAttrs", c_uint),
    ]  # fmt: skip

    @property
    def attrs(self) -> list[CUlaunchAttribute]:
        return list(self._kept) if self.numAttrs else []

    @attrs.setter
    def attrs(self, attrs: list[CUlaunchAttribute]) -> None:
        self._kept = (CUlaunchAttribute * len(attrs))(*attrs)  # kept alive with the config
        self._attrs = ctypes.cast(self._kept, POINTER(CUlaunchAttribute))


TENSOR_MAP_BYTES, TENSOR_MAP_ALIGN = 128, 64


class CUtensorMap:
    """An encoded tensor map: 128 bytes at a 64-byte aligned address (`getPtr()`), as the driver
    writes it (ctypes cannot align a Structure to 64)."""

    def __init__(self) -> None:
        self._raw = ctypes.create_string_buffer(TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN)
        base = ctypes.addressof(self._raw)
        self._address = base + (-base % TENSOR_MAP_ALIGN)

    def getPtr(self) -> int:
        return self._address


# name -> (restype-less argtypes) of each function the runtime calls; `_v2` where cuda.h maps the
# name to it (the driver keeps the old symbol for old binaries, with the old ABI)
_SIGNATURES: dict[str, tuple[Any, ...]] = {
    "cuGetErrorName": (c_int, POINTER(c_char_p)),
    "cuInit": (c_uint,),
    "cuDriverGetVersion": (POINTER(c_int),),
    "cuDeviceGetCount": (POINTER(c_int),),
    "cuDeviceGetAttribute": (POINTER(c_int), c_int, c_int),
    "cuCtxGetDevice": (POINTER(c_int),),
    "cuCtxGetCurrent": (POINTER(c_void_p),),
    "cuPointerGetAttribute": (c_void_p, c_int, c_uint64),
    "cuDevicePrimaryCtxRetain": (POINTER(c_void_p), c_int),
    "cuCtxPushCurrent_v2": (c_void_p,),
    "cuCtxPopCurrent_v2": (POINTER(c_void_p),),
    "cuModuleLoadData": (POINTER(c_void_p), c_char_p),
    "cuModuleGetFunction": (POINTER(c_void_p), c_void_p, c_char_p),
    "cuFuncGetAttribute": (POINTER(c_int), c_int, c_void_p),
    "cuFuncSetAttribute": (c_void_p, c_int, c_int),
    "cuLaunchKernel": (c_void_p, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_void_p, c_void_p, c_void_p),
    "cuLaunchKernelEx": (POINTER(CUlaunchConfig), c_void_p, c_void_p, c_void_p),
    "cuTensorMapEncodeTiled": (
        c_void_p, c_int, c_uint32, c_void_p, POINTER(c_uint64), POINTER(c_uint64), POINTER(c_uint32), POINTER(c_uint32),
        c_int, c_int, c_int, c_int,
    ),
}  # fmt: skip
OPTIONAL = frozenset({"cuLaunchKernelEx", "cuTensorMapEncodeTiled"})  # a driver before 12.0 lacks them; needed only by their kernels


class LibCuda:
    """libcuda's functions that the runtime calls, as cuda-bindings' driver module offers them."""

    kind = "ctypes"  # how fastcall.py launches over it (the kept-argument entry points)
    CUdevice_attribute = CUdevice_attribute
    CUpointer_attribute = CUpointer_attribute
    CUfunction_attribute = CUfunction_attribute
    CUlaunchAttributeID = CUlaunchAttributeID
    CUlaunchAttribute = CUlaunchAttribute
    CUlaunchConfig = CUlaunchConfig
    CUtensorMapDataType = CUtensorMapDataType
    CUtensorMapInterleave = CUtensorMapInterleave
    CUtensorMapSwizzle = CUtensorMapSwizzle
    CUtensorMapL2promotion = CUtensorMapL2promotion
    CUtensorMapFloatOOBfill = CUtensorMapFloatOOBfill
    cuuint64_t = cuuint32_t = int  # the arrays' elements: ints, converted by the declared argtypes

    def __init__(self, path: str = LIBRARY):
        """Load libcuda (OSError where there is none) and declare its functions."""
        self.path = path
        lib = ctypes.CDLL(path)
        self._f: dict[str, Any] = {}
        for name, argtypes in _SIGNATURES.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                if name in OPTIONAL:
                    continue
                raise OSError(f"{path} has no {name}: not a CUDA driver this runtime can use") from None
            fn.restype, fn.argtypes = c_int, argtypes
            self._f[name] = fn
        # the fast path's entry points: the same functions without argtypes, so that arguments
        # made ctypes objects once (keep_head; the buffers' own, launching.FastPlan.fresh) pass as they are
        self.launch = lib["cuLaunchKernel"]
        self.context_now = lib["cuCtxGetCurrent"]
        self.launch.restype = self.context_now.restype = c_int
        self._names: dict[int, CUresult] = {}

    def result(self, code: int) -> CUresult:
        """The CUresult of `code`, named by the driver (cuGetErrorName; a number it does not know, as itself)."""
        found = self._names.get(code)
        if found is None:
            name = c_char_p()
            err = self._f["cuGetErrorName"](code, byref(name))
            text = name.value.decode("ascii", "replace") if not err and name.value else f"CUDA error {code}"
            found = self._names[code] = CUresult(code, text)
        return found

    # ---- the fast path's kept arguments -------------------------------------------------------

    @staticmethod
    def keep_head(head: tuple[Any, ...]) -> tuple[Any, ...]:
        """cuLaunchKernel's head (function, grid x3, block x3, shared bytes) as ctypes objects."""
        function, *dims = head
        return (c_void_p(int(function)), *(c_uint(int(d)) for d in dims))

    # ---- cuda-bindings' shape -----------------------------------------------------------------

    def _call(self, name: str, *args: Any) -> CUresult:
        return self.result(self._f[name](*args))

    def _out(self, name: str, kind: Any, *args: Any) -> tuple[CUresult, Any]:
        value = kind()
        err = self._call(name, byref(value), *args)
        return err, value.value if value.value is not None else 0

    def cuInit(self, flags: int) -> tuple[CUresult]:
        return (self._call("cuInit", flags),)

    def cuDriverGetVersion(self) -> tuple[CUresult, int]:
        return self._out("cuDriverGetVersion", c_int)

    def cuDeviceGetCount(self) -> tuple[CUresult, int]:
        return self._out("cuDeviceGetCount", c_int)

    def cuDeviceGetAttribute(self, attrib: int, device: int) -> tuple[CUresult, int]:
        return self._out("cuDeviceGetAttribute", c_int, int(attrib), int(device))

    def cuCtxGetDevice(self) -> tuple[CUresult, int]:
        return self._out("cuCtxGetDevice", c_int)

    def cuCtxGetCurrent(self) -> tuple[CUresult, int]:
        return self._out("cuCtxGetCurrent", c_void_p)

    def cuPointerGetAttribute(self, attribute: int, ptr: int) -> tuple[CUresult, int]:
        if int(attribute) != CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            raise ValueError(f"LibCuda.cuPointerGetAttribute: attribute {attribute} is not one the runtime reads")
        ordinal = c_int(-1)
        return self._call("cuPointerGetAttribute", byref(ordinal), int(attribute), int(ptr)), ordinal.value

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple[CUresult, int]:
        return self._out("cuDevicePrimaryCtxRetain", c_void_p, int(device))

    def cuCtxPushCurrent(self, ctx: int) -> tuple[CUresult]:
        return (self._call("cuCtxPushCurrent_v2", int(ctx)),)

    def cuCtxPopCurrent(self) -> tuple[CUresult, int]:
        return self._out("cuCtxPopCurrent_v2", c_void_p)

    def cuModuleLoadData(self, image: bytes) -> tuple[CUresult, int]:
        return self._out("cuModuleLoadData", c_void_p, bytes(image))

    def cuModuleGetFunction(self, module: int, name: bytes) -> tuple[CUresult, int]:
        return self._out("cuModuleGetFunction", c_void_p, int(module), bytes(name))

    def cuFuncGetAttribute(self, attrib: int, function: int) -> tuple[CUresult, int]:
        return self._out("cuFuncGetAttribute", c_int, int(attrib), int(function))

    def cuFuncSetAttribute(self, function: int, attrib: int, value: int) -> tuple[CUresult]:
        return (self._call("cuFuncSetAttribute", int(function), int(attrib), int(value)),)

    def cuLaunchKernel(
        self, f: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int, stream: int, params: int, extra: Any
    ) -> tuple[CUresult]:
        return (self._call("cuLaunchKernel", int(f), gx, gy, gz, bx, by, bz, shared, int(stream), int(params), None),)

    def cuLaunchKernelEx(self, config: Any, f: int, params: int, extra: Any) -> tuple[CUresult]:
        if "cuLaunchKernelEx" not in self._f:
            raise OSError(f"{self.path} has no cuLaunchKernelEx: thread-block clusters need a CUDA 12 driver")
        return (self._call("cuLaunchKernelEx", byref(config), int(f), int(params), None),)

    def cuTensorMapEncodeTiled(
        self, dtype: int, rank: int, ptr: int, dims: Any, strides: Any, box: Any, element_strides: Any,
        interleave: int, swizzle: int, l2: int, oob: int,
    ) -> tuple[CUresult, CUtensorMap]:  # fmt: skip
        if "cuTensorMapEncodeTiled" not in self._f:
            raise OSError(f"{self.path} has no cuTensorMapEncodeTiled: tensor maps need a CUDA 12 driver")
        tensor_map = CUtensorMap()
        err = self._call(
            "cuTensorMapEncodeTiled", tensor_map.getPtr(), int(dtype), int(rank), int(ptr),
            (c_uint64 * len(dims))(*dims), (c_uint64 * max(len(strides), 1))(*strides),
            (c_uint32 * len(box))(*box), (c_uint32 * len(element_strides))(*element_strides),
            int(interleave), int(swizzle), int(l2), int(oob),
        )  # fmt: skip
        return err, tensor_map
