"""CuPy arrays and PyTorch tensors in the stand-in's device memory, for the call path's readers
of those two types (runtime/args.py `array_reader`). Neither library makes a CUDA array without
a GPU, so these imitate exactly what the runtime reads of them: for CuPy `data.ptr`,
`data.device_id`, `dtype`, `shape`, `strides` and `cuda.get_current_stream(device)`; for PyTorch
`data_ptr()`, `dtype`, `shape`, `stride()`, `get_device()`, `is_cuda`, `device.type` and
`_C._cuda_getCurrentRawStream`. Both make views that share their memory (`as_strided`,
`t()`, `view_as`), as slicing and transposing do, and `CaiView` is such a view of any array
through __cuda_array_interface__ with byte strides; `values()` reads a view's elements through
its strides, `fill()` writes them (what a test checks a strided kernel against).
`install_cupy` / `install_torch` put a module of that name into sys.modules for one test (the
runtime finds an array's library there, never by importing it). tests/test_gpu.py runs the real
libraries on a GPU."""

from __future__ import annotations

import math
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def install_cupy(monkeypatch: Any, standin: Any) -> ModuleType:
    """A `cupy` module whose `ndarray(shape, dtype, device)` lives in the stand-in's memory;
    `cupy.current` holds the current device and each device's current stream (handle)."""
    cupy = ModuleType("cupy")
    current = SimpleNamespace(device=0, streams={})

    class MemoryPointer:
        def __init__(self, ptr: int, device_id: int):
            self.ptr, self.device_id = ptr, device_id

    class ndarray:
        def __init__(
            self,
            shape: tuple[int, ...],
            dtype: str = "float32",
            device: int = 0,
            strides: tuple[int, ...] | None = None,
            ptr: int | None = None,
        ):
            self.dtype = np.dtype(dtype)
            self.shape = tuple(shape)
            n = math.prod(self.shape)
            self.strides = strides if strides is not None else _c_strides(self.shape, self.dtype.itemsize)
            if ptr is None:
                ptr = standin.alloc(device, n * self.dtype.itemsize) if n else 0
            self.data = MemoryPointer(ptr, device)

        def view_as(self, shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0) -> Any:
            """A view of this array's memory: `strides` and `offset` in bytes, as CuPy's are."""
            return ndarray(shape, self.dtype.name, self.data.device_id, strides, self.data.ptr + offset)

        def get(self) -> np.ndarray:
            return standin.view(self.data.ptr, self.dtype.str, math.prod(self.shape)).reshape(self.shape).copy()

    def get_current_stream(device_id: int | None = None) -> Any:
        return SimpleNamespace(ptr=current.streams.get(current.device if device_id is None else device_id, 0))

    cupy.ndarray = ndarray
    cupy.current = current
    cupy.cuda = SimpleNamespace(get_current_stream=get_current_stream)  # CuPy 14's Python API: no get_current_stream_ptr
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return cupy


class _TorchDtype:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


def install_torch(monkeypatch: Any, standin: Any) -> ModuleType:
    """A `torch` module whose `Tensor(shape, dtype, device)` lives in the stand-in's memory
    (device -1: a CPU tensor); `torch.current_streams` maps a device to its current stream."""
    torch = ModuleType("torch")
    streams: dict[int, int] = {}
    dtypes = {name: _TorchDtype(name) for name in ("float16", "float32", "float64", "int32", "int64", "bfloat16", "bool")}

    class Tensor:
        def __init__(
            self,
            shape: tuple[int, ...],
            dtype: str = "float32",
            device: int = 0,
            stride: tuple[int, ...] | None = None,
            ptr: int | None = None,
        ):
            self.dtype = dtypes[dtype]
            self.shape = tuple(shape)
            self.itemsize = itemsize = 2 if dtype in ("float16", "bfloat16") else 1 if dtype == "bool" else np.dtype(dtype).itemsize
            n = math.prod(self.shape)
            self._stride = stride if stride is not None else tuple(s // itemsize for s in _c_strides(self.shape, itemsize))
            self._device = device
            self.device = SimpleNamespace(type="cuda" if device >= 0 else "cpu", index=device if device >= 0 else None)
            self.is_cuda = device >= 0
            if ptr is None:
                ptr = (standin.alloc(device, n * itemsize) if n else 0) if device >= 0 else 0x1000 * (n + 1)
            self._ptr = ptr

        def as_strided(self, size: tuple[int, ...], stride: tuple[int, ...], storage_offset: int = 0) -> Any:
            """A view of this tensor's memory, as torch.Tensor.as_strided (element units)."""
            return Tensor(size, self.dtype.name, self._device, tuple(stride), self._ptr + storage_offset * self.itemsize)

        def t(self) -> Any:
            """The transpose of a matrix: the same memory, its dims and strides swapped."""
            return self.as_strided(self.shape[::-1], self._stride[::-1])

        def values(self) -> np.ndarray:
            return strided_values(standin, self._ptr, self.dtype.name, self.shape, tuple(s * self.itemsize for s in self._stride))

        def fill(self, values: Any) -> None:
            strided_fill(standin, self._ptr, self.dtype.name, self.shape, tuple(s * self.itemsize for s in self._stride), values)

        def data_ptr(self) -> int:
            return self._ptr

        def stride(self) -> tuple[int, ...]:
            return self._stride

        def get_device(self) -> int:
            return self._device

    class Parameter(Tensor):
        pass

    torch.Tensor = Tensor
    torch.nn = SimpleNamespace(parameter=SimpleNamespace(Parameter=Parameter))
    torch._C = SimpleNamespace(_cuda_getCurrentRawStream=lambda device: streams.get(device, 0))
    torch.current_streams = streams
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch


def _strided(standin: Any, ptr: int, dtype: str, shape: tuple[int, ...], byte_strides: tuple[int, ...]) -> np.ndarray:
    """The stand-in's memory behind a view, as a NumPy view with the same strides."""
    itemsize = np.dtype(dtype).itemsize
    span = 1 + sum((n - 1) * s // itemsize for n, s in zip(shape, byte_strides)) if 0 not in shape else 0
    memory = standin.view(ptr, dtype, span)
    return np.lib.stride_tricks.as_strided(memory, shape, byte_strides)


def strided_values(standin: Any, ptr: int, dtype: str, shape: tuple[int, ...], byte_strides: tuple[int, ...]) -> np.ndarray:
    """A copy of a view's elements, read through its strides."""
    return _strided(standin, ptr, dtype, shape, byte_strides).copy()


def strided_fill(standin: Any, ptr: int, dtype: str, shape: tuple[int, ...], byte_strides: tuple[int, ...], values: Any) -> None:
    """Write a view's elements through its strides."""
    _strided(standin, ptr, dtype, shape, byte_strides)[...] = values


class CaiView:
    """A view of stand-in memory through __cuda_array_interface__ with explicit byte strides
    (as Numba's or CuPy's interface gives a sliced or transposed array), `offset` bytes into
    `base`'s memory (a pointer)."""

    def __init__(self, standin: Any, base: int, shape: tuple[int, ...], strides: tuple[int, ...] | None, typestr: str = "<f4"):
        self.standin, self.shape, self.strides, self.typestr = standin, tuple(shape), strides, typestr
        self.ptr = base
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": typestr, "data": (base, False), "strides": strides, "version": 3}

    def values(self) -> np.ndarray:
        dtype = np.dtype(self.typestr)
        strides = self.strides if self.strides is not None else _c_strides(self.shape, dtype.itemsize)
        return strided_values(self.standin, self.ptr, dtype.str, self.shape, strides)


class DLPackArray:
    """An array that a caller hands over through DLPack alone (as JAX's are), made from a PyTorch
    CPU tensor: `__dlpack__` gives that tensor's own capsule, whose DLDataType PyTorch writes
    (bfloat16, FP8, complex, bool), and `__dlpack_device__` says CUDA device `device`, so that
    the runtime reads it as a GPU array. cuda.core's StridedMemoryView takes the device from
    `__dlpack_device__`; the pointer is host memory, so only checks (`prepare`) may use it,
    never a launch. `typestr` adds a __cuda_array_interface__ that says only that (e.g. '<V2',
    as PyTorch's says for bfloat16), for an array that offers both."""

    def __init__(self, tensor: Any, device: int = 0, typestr: str | None = None):
        self.tensor, self.device = tensor, device
        self.streams: list[Any] = []  # the `stream` of each __dlpack__ call
        if typestr is not None:
            self.__cuda_array_interface__ = {
                "shape": tuple(tensor.shape),
                "typestr": typestr,
                "data": (tensor.data_ptr(), False),
                "strides": None,
                "version": 3,
            }

    def __dlpack__(self, stream: Any = None, max_version: Any = None, **kwargs: Any) -> Any:
        self.streams.append(stream)
        return self.tensor.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self.device)  # kDLCUDA


class RefusingCai:
    """An array whose __cuda_array_interface__ property raises, as JAX's does for bfloat16,
    beside a DLPack export (a DLPackArray's)."""

    def __init__(self, inner: DLPackArray):
        self.inner = inner

    @property
    def __cuda_array_interface__(self) -> Any:
        raise ValueError("__cuda_array_interface__ is not supported for bfloat16 buffers")

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.inner.__dlpack_device__()
