"""Call arguments, checked and converted before any GPU call: arrays (through
__cuda_array_interface__ or DLPack), scalars as their exact C types, streams, constants; and
`PreparedCall`, what a call is once every check that needs no GPU has passed. A wrong argument
is a TypeError or ValueError that names it, and nothing has been launched."""

from __future__ import annotations

import operator

from .errors import ArrayInterfaceError, short_repr
from .record import Record
from .values import DLPACK_CODES, DTYPE_SIZES, MAX_SIZE, TYPESTRS

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Callable, Sequence
    from typing import Any


_DTYPE_OF_TYPESTR = {v: k for k, v in TYPESTRS.items()}
_DTYPE_OF_DLPACK = {v: k for k, v in DLPACK_CODES.items()}  # (DLPack code, bits) -> dtype name
# How an ArrayView was read (its `via`): the array library's own dtype object names the dtype
# (CuPy's NumPy dtype, PyTorch's), DLPack's type code does, or a CUDA Array Interface typestr,
# which names no bfloat16 or FP8 type.
VIA_CUPY, VIA_TORCH, VIA_DLPACK, VIA_CAI = "cupy", "torch", "dlpack", "cai"
# What a message tells the caller whose array said only an ambiguous CAI typestr.
CAI_AMBIGUITY = (
    "the CUDA Array Interface cannot name bfloat16 or FP8 (its typestr is the same for several types); "
    "pass the array through DLPack instead (a JAX array, or a PyTorch tensor: `torch.from_dlpack(x)`), "
    "or a CuPy array whose dtype is ml_dtypes' own (e.g. ml_dtypes.bfloat16)"
)


def typestr_dtype(typestr: str) -> str | None:
    """The dtype a CUDA Array Interface typestr names on its own: None for big-endian, for a
    typestr of no dtype, and for the void and one-byte float typestrs ('<V2', '|V1', '<f1'),
    which bfloat16, FP8 and other types share."""
    return _DTYPE_OF_TYPESTR.get(typestr[1:]) if typestr[:1] in ("<", "|", "=") else None


def _ambiguous_typestr(typestr: str) -> bool:
    """A typestr that bfloat16 or an FP8 type may hide behind: PyTorch's '<V2' for bfloat16,
    ml_dtypes' '<V1' (three FP8 types) and '<f1' (float8_e5m2)."""
    return typestr[:1] in ("<", "|", "=") and typestr[1:] in ("V1", "V2", "f1")


def numpy_dtype_name(dtype: Any) -> str | None:
    """Our name of a NumPy dtype (ml_dtypes' included: its `name` is ours, 'bfloat16',
    'float8_e5m2'), or None. By name, not kind and size: ml_dtypes' float8_e5m2 says kind 'f'
    and size 1, like no NumPy float, and its other types all say 'V'."""
    name = getattr(dtype, "name", None)
    if name in DTYPE_SIZES and dtype.itemsize == DTYPE_SIZES[name] and dtype.byteorder in ("<", "|", "="):
        return str(name)
    return None


def _own_dtype(obj: Any, typestr: str) -> str | None:
    """Our name of an array's own `dtype` attribute when it is a NumPy (or ml_dtypes) dtype of
    the typestr's size; None otherwise (no attribute, a property that raises, another size)."""
    try:
        name = numpy_dtype_name(getattr(obj, "dtype", None))
    except Exception:
        return None
    return name if name is not None and str(DTYPE_SIZES[name]) == typestr[2:] else None


class ArrayView(Record):
    """What a call needs of an array: pointer, shape, dtype, layout (C-contiguous or not, and its
    element strides, which a strided argument's kernel gets), and where it lives."""

    __slots__ = ("ptr", "shape", "dtype", "contiguous", "readonly", "device", "given_dtype", "via", "strides")
    ptr: int
    shape: tuple[int, ...]
    dtype: str | None  # None: a dtype hatch-autotune cannot pass or cannot tell (big-endian, '<V2' by CAI)
    contiguous: bool  # C-contiguous (row-major, dense), by NumPy's rule (see _c_contiguous)
    readonly: bool
    device: int | None  # None: unknown until asked (CAI); -1: host memory
    given_dtype: str  # the dtype as the array states it (a CAI typestr such as '>f4'), for messages
    via: str  # how it was read: VIA_CUPY, VIA_TORCH, VIA_DLPACK or VIA_CAI
    # Per dim, in elements (a strided argument's kernel indexes with these). None: byte strides
    # that are not whole elements (a CAI array's, or one whose dtype is unknown), which only a
    # C-contiguous argument can take (there `contiguous` decides).
    strides: tuple[int, ...] | None

    def dtype_text(self) -> str:
        """The dtype for a message: its name, or what was passed when it cannot be passed on."""
        if self.dtype is not None:
            return self.dtype
        given = short_repr(self.given_dtype, 40)
        if self.via == VIA_CAI and _ambiguous_typestr(self.given_dtype):
            return f"{given} by its __cuda_array_interface__, which hatch-autotune cannot identify: {CAI_AMBIGUITY}"
        return f"{given}{' (big-endian)' if given[1:2] == '>' else ''}, which hatch-autotune cannot pass"


def _c_contiguous(shape: Sequence[int], strides: Sequence[int] | None, itemsize: int) -> bool:
    """Row-major dense; strides of size-1 dims do not matter, nor any stride of an empty array
    (NumPy's rule: CuPy gives `cupy.zeros(0)` strides (0,))."""
    if strides is None or 0 in shape:
        return True
    expected = itemsize
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The element strides of a C-contiguous array of `shape`."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def element_strides(shape: Sequence[int], strides: Sequence[int] | None, itemsize: int) -> tuple[int, ...] | None:
    """Byte strides (None: C-contiguous) in elements; None where one is not a whole element."""
    if strides is None:
        return c_strides(shape)
    if itemsize <= 0 or any(s % itemsize for s in strides):
        return None
    return tuple(s // itemsize for s in strides)


_DLPACK_CPU = 1  # DLPack's kDLCPU device type

# How the call path reads an array, by its type (the first call of a type decides; see
# array_reader): CuPy arrays and PyTorch tensors through their own attributes, which costs a
# fraction of building a __cuda_array_interface__ dict (two CuPy arrays: 0.13 µs against 1.1 µs on
# an H200, benchmarks/results/launch_overhead_h200.json) and says which device they are on;
# other arrays through __cuda_array_interface__ (Numba, JAX, ...; a class attribute or, as some
# wrappers set it, an instance one), else DLPack.
CAI, CUPY, TORCH = "cai", "cupy", "torch"


class ArrayReader:
    """How arrays of one type are read: `code` (CUPY, TORCH, or CAI for any other type: its
    __cuda_array_interface__, else DLPack on the checked path) and `current_stream(device)`, the raw handle of the stream
    that the array's library launches its own work on (None: the library has none; stream=None
    then means the device's default stream)."""

    __slots__ = ("code", "current_stream")

    def __init__(self, code: str, current_stream: Callable[[int], int] | None = None):
        self.code, self.current_stream = code, current_stream


_READERS: dict[type, ArrayReader] = {}
_CODES: dict[type, str] = {}  # type -> its reader's code: what the fast path reads, one lookup


def array_reader(kind: type) -> ArrayReader:
    """The reader of an array type, found once per type (the array's library is imported, since
    one of its arrays exists, so it is looked up in sys.modules, never imported here)."""
    reader = _READERS.get(kind)
    if reader is None:
        if len(_READERS) >= 4096:  # classes made per call would otherwise grow it without end
            _READERS.clear()
            _CODES.clear()
        reader = _READERS[kind] = _reader_of(kind)
        _CODES[kind] = reader.code
    return reader


def _reader_of(kind: type) -> ArrayReader:
    import sys

    cupy = sys.modules.get("cupy")
    if cupy is not None and kind is getattr(cupy, "ndarray", None):
        return ArrayReader(CUPY, _cupy_stream(cupy))
    torch = sys.modules.get("torch")
    if torch is not None:
        tensor = getattr(torch, "Tensor", None)
        parameter = getattr(getattr(getattr(torch, "nn", None), "parameter", None), "Parameter", None)
        if tensor is not None and (kind is tensor or kind is parameter):
            return ArrayReader(TORCH, _torch_stream(torch))
    return ArrayReader(CAI)


def _torch_stream(torch: Any) -> Callable[[int], int]:
    """PyTorch's current stream on a device: what its own operations run on."""
    # as Inductor's launchers read it: (device index) -> the raw cudaStream_t
    raw: Callable[[int], int] | None = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    current = torch.cuda.current_stream
    return lambda device: int(current(device).cuda_stream)


def _cupy_stream(cupy: Any) -> Callable[[int], int]:
    """CuPy's current stream on a device (`with cupy.cuda.Stream():`): what its own kernels run on.
    (CuPy keeps that Stream object per thread and device; its C-level get_current_stream_ptr is
    not reachable from Python.)"""
    get = cupy.cuda.get_current_stream
    return lambda device: int(get(device).ptr)


def _cupy_view(obj: Any) -> ArrayView:
    dtype = obj.dtype  # a NumPy dtype: ml_dtypes' own for bfloat16 and FP8
    shape = tuple(obj.shape)
    memory = obj.data
    byte_strides = tuple(obj.strides)
    contiguous = _c_contiguous(shape, byte_strides, dtype.itemsize)
    strides = element_strides(shape, byte_strides, dtype.itemsize)
    return ArrayView(
        int(memory.ptr), shape, numpy_dtype_name(dtype), contiguous, False, int(memory.device_id), str(dtype), VIA_CUPY, strides
    )


def torch_view(obj: Any, memory: bool = True) -> ArrayView:
    """A PyTorch tensor as a call reads it. `memory=False` for a tensor without memory, a fake
    or meta one, whose metadata a PyTorch operator checks while it is traced (torch_ops.py): its
    pointer is 0 and a meta tensor's device unknown (None), not host memory."""
    given = str(obj.dtype)  # 'torch.float32', 'torch.bfloat16', 'torch.float8_e4m3fn': our names after the dot
    name = given.rpartition(".")[2]
    shape = tuple(obj.shape)
    strides = tuple(obj.stride())  # PyTorch's strides count elements
    contiguous = _c_contiguous(shape, strides, 1)
    kind = obj.device.type
    device = obj.get_device() if kind == "cuda" else None if kind == "meta" and not memory else -1  # CPU: not device memory
    dtype = name if name in DTYPE_SIZES else None  # e.g. torch.float8_e4m3fnuz: no dtype of ours
    return ArrayView(int(obj.data_ptr()) if memory else 0, shape, dtype, contiguous, False, device, given, VIA_TORCH, strides)


def array_view(obj: Any, stream_ptr: int = -1) -> ArrayView | None:
    """Read an array (CuPy's and PyTorch's through their attributes, others through
    __cuda_array_interface__ or DLPack); None if it is none of these.

    An array whose __cuda_array_interface__ typestr may be bfloat16 or FP8 ('<V2', '<V1',
    '<f1') is named by its own NumPy/ml_dtypes `dtype`, else read through DLPack when it has
    that too, whose type code names the dtype.
    For DLPack, `stream_ptr` is the stream the array will be used on, so that its producer can
    order its pending work before it (-1: no ordering, for checks that launch nothing)."""
    code = array_reader(type(obj)).code
    if code is CUPY:
        return _cupy_view(obj)
    if code is TORCH:
        return torch_view(obj)
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except Exception:  # a property that refuses (JAX's for bfloat16): DLPack may still serve
        cai = None
    has_dlpack = hasattr(obj, "__dlpack__")
    if cai is not None:
        typestr, shape, ptr, readonly, strides = _cai_fields(cai)
        dtype = typestr_dtype(typestr)
        if dtype is None and _ambiguous_typestr(typestr):
            # the array's own dtype object names it (Numba's, a NumPy-like one of ml_dtypes), if
            # it says the same size; else its DLPack type code
            dtype = _own_dtype(obj, typestr)
            if dtype is None and has_dlpack:
                return _dlpack_view(obj, stream_ptr)
        itemsize = DTYPE_SIZES[dtype] if dtype is not None else 0  # no layout check without a dtype
        contiguous = _c_contiguous(shape, strides, itemsize)
        return ArrayView(ptr, shape, dtype, contiguous, readonly, None, typestr, VIA_CAI, element_strides(shape, strides, itemsize))
    if has_dlpack:
        return _dlpack_view(obj, stream_ptr)
    return None


def _dlpack_view(obj: Any, stream_ptr: int) -> ArrayView:
    """An array read through DLPack (cuda.core's StridedMemoryView), its dtype by type code."""
    where = getattr(obj, "__dlpack_device__", None)
    if where is not None and where()[0] == _DLPACK_CPU:  # NumPy: host memory, and no stream allowed
        return ArrayView(0, (), None, True, False, -1, "", VIA_DLPACK, ())
    from cuda.core.utils import StridedMemoryView  # lazy: only DLPack arrays need it

    view = StridedMemoryView.from_dlpack(obj, stream_ptr=stream_ptr)
    dtype, given = _dlpack_dtype(obj, view)
    shape = tuple(view.shape)
    given_strides = view.strides  # DLPack strides count elements, not bytes; None: C-contiguous
    contiguous = _c_contiguous(shape, given_strides, 1)
    strides = c_strides(shape) if given_strides is None else tuple(int(s) for s in given_strides)
    device = view.device_id if view.is_device_accessible else -1
    return ArrayView(view.ptr, shape, dtype, contiguous, bool(view.readonly), device, given, VIA_DLPACK, strides)


def _dlpack_dtype(obj: Any, view: Any) -> tuple[str | None, str]:
    """(our dtype name or None, the dtype as given) of a DLPack array. cuda.core names NumPy's
    dtypes and, with ml_dtypes installed, bfloat16, but no FP8 type (TypeError 'Unsupported
    dtype'); then the type code is read from a capsule of the array's own."""
    try:
        np_dtype = view.dtype
    except (TypeError, NotImplementedError):  # FP8; bfloat16 without ml_dtypes
        np_dtype = None
    if np_dtype is not None:
        name = numpy_dtype_name(np_dtype)
        if name is not None:
            return name, str(np_dtype)
    found = _capsule_dtype(obj)
    if found is None:
        return None, str(np_dtype) if np_dtype is not None else "a DLPack dtype that cannot be read"
    code, bits, lanes = found
    name = _DTYPE_OF_DLPACK.get((code, bits)) if lanes == 1 else None
    return name, f"DLPack type code {code}, {bits} bits" + (f", {lanes} lanes" if lanes != 1 else "")


def dlpack_capsule_dtype(capsule: Any) -> tuple[int, int, int] | None:
    """(type code, bits, lanes) of the DLDataType in a DLPack capsule ('dltensor' or
    'dltensor_versioned'), or None for another object. Reads 4 bytes and leaves the capsule as
    it was (not renamed 'used_'), so its producer's destructor still frees the tensor."""
    import ctypes
    import struct

    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer", ctypes.pythonapi))
    if type(capsule).__name__ != "PyCapsule":
        return None
    name = get_name(capsule)
    # DLTensor: data (8 bytes), device (2 x int32), ndim (int32), then dtype {uint8 code, uint8
    # bits, uint16 lanes}: offset 20; DLManagedTensorVersioned puts its version, manager_ctx,
    # deleter and flags (32 bytes) before its DLTensor
    offset = {b"dltensor": 20, b"dltensor_versioned": 52}.get(name or b"")
    pointer = get_pointer(capsule, name) if offset is not None else None
    if not pointer:
        return None
    code, bits, lanes = struct.unpack("=BBH", ctypes.string_at(pointer + offset, 4))
    return code, bits, lanes


def _capsule_dtype(obj: Any) -> tuple[int, int, int] | None:
    """The DLDataType of a fresh capsule of `obj` (stream -1: the view already ordered the
    producer's work), or None when it makes none that can be read."""
    try:
        try:
            capsule = obj.__dlpack__(stream=-1)
        except TypeError:  # a producer that takes no stream
            capsule = obj.__dlpack__()
    except Exception:  # the caller says the dtype is unknown, naming the argument
        return None
    return dlpack_capsule_dtype(capsule)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _index(value: Any) -> int | None:
    """An integer (a Python or numpy one, not a bool) as an int; None for anything else."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _cai_fields(cai: Any) -> tuple[str, tuple[int, ...], int, bool, tuple[int, ...] | None]:
    """(typestr, shape, pointer, readonly, strides) of a __cuda_array_interface__ (version 3),
    or ArrayInterfaceError saying which field is missing or malformed."""
    if not isinstance(cai, dict):
        raise ArrayInterfaceError(f"__cuda_array_interface__ is {type(cai).__name__}, not a dict")
    missing = [k for k in ("typestr", "shape", "data") if k not in cai]
    if missing:
        raise ArrayInterfaceError(f"__cuda_array_interface__ lacks {', '.join(repr(k) for k in missing)}")
    typestr, shape, data, strides = cai["typestr"], cai["shape"], cai["data"], cai.get("strides")
    if not isinstance(typestr, str):
        raise ArrayInterfaceError(f"__cuda_array_interface__['typestr'] is {short_repr(typestr)}, not a string such as '<f4'")
    if not isinstance(shape, (tuple, list)) or not all(_is_int(d) and 0 <= d <= MAX_SIZE for d in shape):
        raise ArrayInterfaceError(f"__cuda_array_interface__['shape'] is {short_repr(shape)}, not a tuple of sizes (ints from 0)")
    if not (isinstance(data, (tuple, list)) and len(data) == 2 and _is_int(data[0]) and 0 <= data[0] <= MAX_SIZE):
        raise ArrayInterfaceError(
            f"__cuda_array_interface__['data'] is {short_repr(data)}, not (pointer, read_only) with an int pointer from 0 to 2**63 - 1"
        )
    if strides is not None and not (isinstance(strides, (tuple, list)) and len(strides) == len(shape) and all(map(_is_int, strides))):
        raise ArrayInterfaceError(f"__cuda_array_interface__['strides'] is {short_repr(strides)}, not None or one int per dim")
    return typestr, tuple(shape), data[0], bool(data[1]), None if strides is None else tuple(strides)


def stream_handle(stream: Any) -> int | None:
    """The cudaStream_t address of anything a user may pass as `stream=`; None for the default.

    Accepts a cuda.core Stream or any object with __cuda_stream__ (CuPy, cuda.core), an object
    with `.cuda_stream` (PyTorch) or `.ptr` (older CuPy), or a raw handle (int).
    """
    if stream is None:
        return None
    if isinstance(stream, int) and not isinstance(stream, bool):
        if stream < 0:
            raise ValueError(f"stream: a raw handle must be a non-negative int, got {stream}")
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        given = proto() if callable(proto) else proto
        handle = _index(given[1]) if isinstance(given, tuple) and len(given) == 2 else None
        if handle is None or handle < 0:
            raise TypeError(
                f"stream: __cuda_stream__ of {type(stream).__name__} gave {short_repr(given)}; "
                "expected (version, handle) with the handle a non-negative int"
            )
        return handle
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(stream, attr, None)
        if isinstance(handle, int) and not isinstance(handle, bool):
            if handle < 0:
                raise ValueError(f"stream: {type(stream).__name__}.{attr} is {handle}; a handle is a non-negative int")
            return int(handle)
    raise TypeError(
        "stream: expected None, a cuda.core Stream, an object with __cuda_stream__ (CuPy), "
        f"a PyTorch stream, or a raw cudaStream_t handle (int); got {type(stream).__name__}"
    )


class PreparedCall(Record):
    """A call after every check that needs no GPU: what to select and what to pass."""

    __slots__ = ("types", "key", "c_args", "arrays", "dims")
    types: dict[str, str]
    key: dict[str, int]
    c_args: tuple[Any, ...]  # in the kernel's C order: ints for pointers (0: an optional array passed as None), numpy scalars
    arrays: dict[str, ArrayView]  # the arrays passed (an optional one passed as None is left out)
    dims: dict[str, int]  # the free dims (KernelDecl.dims) as the call's arrays give them
