"""Call arguments, checked and converted before any GPU call: arrays (through
__cuda_array_interface__ or DLPack), scalars as their exact C types, streams, constants; and
`PreparedCall`, what a call is once every check that needs no GPU has passed. A wrong argument
is a TypeError or ValueError that names it, and nothing has been launched."""

from __future__ import annotations

from .errors import ArrayInterfaceError, short_repr
from .record import Record
from .values import INT_RANGES, TYPESTRS

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from typing import Any, Callable, Sequence

    import numpy

_DTYPE_OF_TYPESTR = {v: k for k, v in TYPESTRS.items()}


class ArrayView(Record):
    """What a call needs of an array: pointer, shape, dtype, layout, and where it lives."""

    __slots__ = ("ptr", "shape", "dtype", "contiguous", "readonly", "device")
    ptr: int
    shape: tuple[int, ...]
    dtype: str | None  # None: a dtype hatch-autotune cannot pass (e.g. bfloat16, big-endian)
    contiguous: bool
    readonly: bool
    device: int | None  # None: unknown until asked (CAI); -1: host memory


def _c_contiguous(shape: Sequence[int], strides: Sequence[int] | None, itemsize: int) -> bool:
    """Row-major dense; strides of size-1 dims do not matter."""
    if strides is None:
        return True
    expected = itemsize
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


_DLPACK_CPU = 1  # DLPack's kDLCPU device type


def array_view(obj: Any, stream_ptr: int = -1) -> ArrayView | None:
    """Read an array through __cuda_array_interface__ (fast) or DLPack; None if it has neither.

    For DLPack, `stream_ptr` is the stream the array will be used on, so that its producer can
    order its pending work before it (-1: no ordering, for checks that launch nothing)."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        typestr, shape, ptr, readonly, strides = _cai_fields(cai)
        dtype = _DTYPE_OF_TYPESTR.get(typestr[1:]) if typestr[:1] in ("<", "|", "=") else None
        itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 0
        return ArrayView(ptr, shape, dtype, _c_contiguous(shape, strides, itemsize), readonly, None)
    if hasattr(obj, "__dlpack__"):
        where = getattr(obj, "__dlpack_device__", None)
        if where is not None and where()[0] == _DLPACK_CPU:  # NumPy: host memory, and no stream allowed
            return ArrayView(0, (), None, True, False, -1)
        from cuda.core.utils import StridedMemoryView  # lazy: only DLPack-only arrays need it

        view = StridedMemoryView.from_dlpack(obj, stream_ptr=stream_ptr)
        np_dtype = view.dtype
        dtype = None
        if np_dtype is not None and np_dtype.byteorder in ("<", "|", "="):
            dtype = _DTYPE_OF_TYPESTR.get(f"{np_dtype.kind}{np_dtype.itemsize}")
        shape = tuple(view.shape)
        strides = view.strides
        contiguous = _c_contiguous(shape, strides, 1)  # DLPack strides count elements, not bytes
        return ArrayView(view.ptr, shape, dtype, contiguous, bool(view.readonly), view.device_id if view.is_device_accessible else -1)
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    if not isinstance(shape, (tuple, list)) or not all(_is_int(d) and d >= 0 for d in shape):
        raise ArrayInterfaceError(f"__cuda_array_interface__['shape'] is {short_repr(shape)}, not a tuple of sizes")
    if not (isinstance(data, (tuple, list)) and len(data) == 2 and _is_int(data[0]) and data[0] >= 0):
        raise ArrayInterfaceError(f"__cuda_array_interface__['data'] is {short_repr(data)}, not (pointer, read_only)")
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
        version, handle = proto() if callable(proto) else proto
        return int(handle)
    for attr in ("cuda_stream", "ptr"):
        handle = getattr(stream, attr, None)
        if isinstance(handle, int) and not isinstance(handle, bool):
            return handle
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


def scalar_converter(dtype: str, kernel: str, arg: str) -> Callable[[Any], Any]:
    """A fast scalar converter for the repeated-call path (its type was checked on the first
    call); numpy raises OverflowError for an integer out of range, which is re-raised as
    c_scalar's ValueError by the checked path."""

    def convert(value: Any) -> Any:
        try:
            return fast(value)
        except (OverflowError, ValueError, TypeError):
            return c_scalar(value, dtype, kernel, arg)

    import numpy

    if dtype == "float16":
        fast = lambda v: numpy.float16(v).view(numpy.uint16)  # noqa: E731
    else:
        fast = numpy.dtype(dtype).type
        if dtype in INT_RANGES:
            (lo, hi), np_type = INT_RANGES[dtype], fast

            def fast(v: Any) -> Any:  # noqa: F811 - bounds checked explicitly (numpy casts numpy ints silently)
                if not lo <= v <= hi:
                    raise OverflowError
                return np_type(v)

    return convert


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
    if dtype == "float16":
        return numpy.float16(value).view(numpy.uint16)  # the kernel sees at_half: 16 raw bits
    return np_type(value)


def as_constant(value: Any, kind: type) -> Any:
    """`value` as an exact int or bool of `kind` (numpy's too), else None: True is not 1."""
    import numpy

    is_bool = isinstance(value, (bool, numpy.bool_))
    if kind is bool:
        return bool(value) if is_bool else None
    return int(value) if not is_bool and isinstance(value, integral_types()) else None
