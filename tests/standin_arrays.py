"""CuPy arrays and PyTorch tensors in the stand-in's device memory, for the call path's readers
of those two types (runtime/args.py `array_reader`). Neither library makes a CUDA array without
a GPU, so these imitate exactly what the runtime reads of them: for CuPy `data.ptr`,
`data.device_id`, `dtype`, `shape`, `strides` and `cuda.get_current_stream(device)`; for PyTorch
`data_ptr()`, `dtype`, `shape`, `stride()`, `get_device()`, `is_cuda`, `device.type` and
`_C._cuda_getCurrentRawStream`.
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
        def __init__(self, shape: tuple[int, ...], dtype: str = "float32", device: int = 0, strides: tuple[int, ...] | None = None):
            self.dtype = np.dtype(dtype)
            self.shape = tuple(shape)
            n = math.prod(self.shape)
            self.strides = strides if strides is not None else _c_strides(self.shape, self.dtype.itemsize)
            self.data = MemoryPointer(standin.alloc(device, n * self.dtype.itemsize) if n else 0, device)

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
        def __init__(self, shape: tuple[int, ...], dtype: str = "float32", device: int = 0, stride: tuple[int, ...] | None = None):
            self.dtype = dtypes[dtype]
            self.shape = tuple(shape)
            itemsize = 2 if dtype in ("float16", "bfloat16") else 1 if dtype == "bool" else np.dtype(dtype).itemsize
            n = math.prod(self.shape)
            self._stride = stride if stride is not None else tuple(s // itemsize for s in _c_strides(self.shape, itemsize))
            self._device = device
            self.device = SimpleNamespace(type="cuda" if device >= 0 else "cpu", index=device if device >= 0 else None)
            self.is_cuda = device >= 0
            self._ptr = (standin.alloc(device, n * itemsize) if n else 0) if device >= 0 else 0x1000 * (n + 1)

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
