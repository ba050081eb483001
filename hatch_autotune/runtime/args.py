"""Call arguments, checked and converted before any GPU call: arrays (through
__cuda_array_interface__ or DLPack), scalars as their exact C types, streams, constants; and
`PreparedCall`, what a call is once every check that needs no GPU has passed. A wrong argument
is a TypeError or ValueError that names it, and nothing has been launched."""

from __future__ import annotations

import operator

from .errors import ArrayInterfaceError, short_repr
from .record import Record
from .values import DTYPE_SIZES, FLOAT_RANGES, INT_RANGES, MAX_SIZE, TYPESTRS

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Callable, Sequence
    from typing import Any

    import numpy

_DTYPE_OF_TYPESTR = {v: k for k, v in TYPESTRS.items()}


class ArrayView(Record):
    """What a call needs of an array: pointer, shape, dtype, layout, and where it lives."""

    __slots__ = ("ptr", "shape", "dtype", "contiguous", "readonly", "device", "given_dtype")
    ptr: int
    shape: tuple[int, ...]
    dtype: str | None  # None: a dtype hatch-autotune cannot pass (e.g. bfloat16, big-endian)
    contiguous: bool
    readonly: bool
    device: int | None  # None: unknown until asked (CAI); -1: host memory
    given_dtype: str  # the dtype as the array states it (a CAI typestr such as '>f4'), for messages

    def dtype_text(self) -> str:
        """The dtype for a message: its name, or what was passed when it cannot be passed on."""
        if self.dtype is not None:
            return self.dtype
        given = short_repr(self.given_dtype, 40)
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
    dtype = obj.dtype
    name = _DTYPE_OF_TYPESTR.get(f"{dtype.kind}{dtype.itemsize}") if dtype.byteorder in ("<", "|", "=") else None
    shape = tuple(obj.shape)
    memory = obj.data
    contiguous = _c_contiguous(shape, tuple(obj.strides), dtype.itemsize)
    return ArrayView(int(memory.ptr), shape, name, contiguous, False, int(memory.device_id), str(dtype))


def torch_view(obj: Any, memory: bool = True) -> ArrayView:
    """A PyTorch tensor as a call reads it. `memory=False` for a tensor without memory, a fake
    or meta one, whose metadata a PyTorch operator checks while it is traced (torch_ops.py): its
    pointer is 0 and a meta tensor's device unknown (None), not host memory."""
    given = str(obj.dtype)  # 'torch.float32'
    name = given.rpartition(".")[2]
    shape = tuple(obj.shape)
    contiguous = _c_contiguous(shape, tuple(obj.stride()), 1)  # PyTorch's strides count elements
    kind = obj.device.type
    device = obj.get_device() if kind == "cuda" else None if kind == "meta" and not memory else -1  # CPU: not device memory
    return ArrayView(int(obj.data_ptr()) if memory else 0, shape, name if name in TYPESTRS else None, contiguous, False, device, given)


def array_view(obj: Any, stream_ptr: int = -1) -> ArrayView | None:
    """Read an array (CuPy's and PyTorch's through their attributes, others through
    __cuda_array_interface__ or DLPack); None if it is none of these.

    For DLPack, `stream_ptr` is the stream the array will be used on, so that its producer can
    order its pending work before it (-1: no ordering, for checks that launch nothing)."""
    code = array_reader(type(obj)).code
    if code is CUPY:
        return _cupy_view(obj)
    if code is TORCH:
        return torch_view(obj)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        typestr, shape, ptr, readonly, strides = _cai_fields(cai)
        dtype = _DTYPE_OF_TYPESTR.get(typestr[1:]) if typestr[:1] in ("<", "|", "=") else None
        itemsize = DTYPE_SIZES[dtype] if dtype is not None else 0  # no layout check without a dtype
        return ArrayView(ptr, shape, dtype, _c_contiguous(shape, strides, itemsize), readonly, None, typestr)
    if hasattr(obj, "__dlpack__"):
        where = getattr(obj, "__dlpack_device__", None)
        if where is not None and where()[0] == _DLPACK_CPU:  # NumPy: host memory, and no stream allowed
            return ArrayView(0, (), None, True, False, -1, "")
        from cuda.core.utils import StridedMemoryView  # lazy: only DLPack-only arrays need it

        view = StridedMemoryView.from_dlpack(obj, stream_ptr=stream_ptr)
        np_dtype = view.dtype
        dtype = None
        if np_dtype is not None and np_dtype.byteorder in ("<", "|", "="):
            dtype = _DTYPE_OF_TYPESTR.get(f"{np_dtype.kind}{np_dtype.itemsize}")
        shape = tuple(view.shape)
        strides = view.strides
        contiguous = _c_contiguous(shape, strides, 1)  # DLPack strides count elements, not bytes
        device = view.device_id if view.is_device_accessible else -1
        given = str(np_dtype) if np_dtype is not None else "unknown"  # e.g. bfloat16 without ml_dtypes
        return ArrayView(view.ptr, shape, dtype, contiguous, bool(view.readonly), device, given)
    return None


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

    __slots__ = ("types", "key", "c_args", "arrays")
    types: dict[str, str]
    key: dict[str, int]
    c_args: tuple[Any, ...]  # in the kernel's C order: ints for pointers, numpy scalars
    arrays: dict[str, ArrayView]


def integral_types() -> tuple[type[int | numpy.integer[Any]], ...]:
    """What an integer argument may be: a Python int, or a numpy integer when numpy is there."""
    try:
        import numpy

        return (int, numpy.integer)
    except ImportError:  # pragma: no cover - numpy is a dependency of every generated wheel
        return (int,)


def c_scalar(value: Any, dtype: str, kernel: str, arg: str) -> Any:
    """A Python or numpy number as the exact C type (float32 stays float32), range-checked."""
    import numpy

    if isinstance(value, (bool, numpy.bool_)) or not isinstance(value, (int, float, numpy.number)):
        raise TypeError(f"{kernel}(): argument {arg!r} must be a number ({dtype}), got {type(value).__name__}")
    np_type = numpy.dtype(dtype).type
    if dtype in INT_RANGES:
        if not isinstance(value, (int, numpy.integer)):
            raise TypeError(f"{kernel}(): argument {arg!r} must be an integer ({dtype}), got {value!r}")
        lo, hi = INT_RANGES[dtype]
        if not lo <= int(value) <= hi:
            raise ValueError(f"{kernel}(): argument {arg!r}={value} does not fit in {dtype} [{lo}, {hi}]")
        return np_type(int(value))
    largest, limit = FLOAT_RANGES[dtype]
    try:
        number = float(value)  # exact for numpy floats
        overflows = not -limit < number < limit and number - number == 0  # finite, yet it would become inf
    except OverflowError:  # an int beyond any float
        overflows = True
    if overflows:
        raise ValueError(
            f"{kernel}(): argument {arg!r}={short_repr(value)} does not fit in {dtype} "
            f"[{-largest:.8g}, {largest:.8g}]: it would become inf (pass inf itself if that is meant)"
        )
    if dtype == "float16":
        return numpy.float16(number).view(numpy.uint16)  # the kernel sees at_half: 16 raw bits
    return np_type(number)


def as_constant(value: Any, kind: type) -> Any:
    """`value` as an exact int or bool of `kind` (numpy's too), else None: True is not 1."""
    import numpy

    is_bool = isinstance(value, (bool, numpy.bool_))
    if kind is bool:
        return bool(value) if is_bool else None
    return int(value) if not is_bool and isinstance(value, integral_types()) else None
