"""NVRTC 12 for a build whose wheel must load on CUDA 12 drivers (`min-cuda = "12"`).

cuda-bindings 13, which the build side uses, binds NVRTC 13 only, and cuda-bindings 12 cannot
be installed beside it; cubins of NVRTC 13 (ELF ABI 8) do not load on CUDA 12 drivers. So NVRTC
12 (the `nvidia-cuda-nvrtc-cu12` wheel, `hatch-autotune[cu12]`) is reached here through ctypes:
its C API is a dozen functions. `Nvrtc12` answers in cuda-bindings' shape, (result, *values) with
the result an `nvrtcResult` (the same enum: NVRTC 12 and 13 number it alike), so that
compile_one, the PCH helpers and `check_cuda` take either binding.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from typing import Any

from ..errors import BuildError

# Where the nvidia-cuda-nvrtc-cu12 wheel puts its library, under a sys.path entry.
NVRTC12_LIBRARY = os.path.join("nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12")
INSTALL_HINT = "pip install 'hatch-autotune[cu12]' (or nvidia-cuda-nvrtc-cu12 and the -cu12 header distributions)"


def find_library(path: list[str] | None = None) -> str:
    """libnvrtc.so.12 of the nvidia-cuda-nvrtc-cu12 wheel on `path` (default sys.path); BuildError
    saying what to install where none is."""
    for entry in sys.path if path is None else path:
        candidate = os.path.join(entry or ".", NVRTC12_LIBRARY)
        if os.path.isfile(candidate):
            return candidate
    raise BuildError(f'hatch-autotune: `min-cuda = "12"` compiles with NVRTC 12, which is not installed here; {INSTALL_HINT}')


class Nvrtc12:
    """The NVRTC 12 functions that compiling needs, shaped like cuda.bindings.nvrtc's."""

    def __init__(self, library: str):
        from cuda.bindings.nvrtc import nvrtcResult

        self.nvrtcResult = nvrtcResult
        self._lib = lib = ctypes.CDLL(library)
        size_p, int_p, void_p = ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int), ctypes.c_void_p
        signatures: dict[str, list[Any]] = {
            "nvrtcVersion": [int_p, int_p],
            "nvrtcGetNumSupportedArchs": [int_p],
            "nvrtcGetSupportedArchs": [int_p],
            "nvrtcCreateProgram": [ctypes.POINTER(void_p), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, void_p, void_p],
            "nvrtcCompileProgram": [void_p, ctypes.c_int, void_p],
            "nvrtcDestroyProgram": [ctypes.POINTER(void_p)],
            "nvrtcGetProgramLogSize": [void_p, size_p],
            "nvrtcGetProgramLog": [void_p, ctypes.c_char_p],
            "nvrtcGetPTXSize": [void_p, size_p],
            "nvrtcGetPTX": [void_p, ctypes.c_char_p],
            "nvrtcGetCUBINSize": [void_p, size_p],
            "nvrtcGetCUBIN": [void_p, ctypes.c_char_p],
            "nvrtcGetPCHHeapSize": [size_p],
            "nvrtcSetPCHHeapSize": [ctypes.c_size_t],
            "nvrtcGetPCHCreateStatus": [void_p],
            "nvrtcGetPCHHeapSizeRequired": [void_p, size_p],
        }
        for name, argtypes in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int

    def _result(self, code: int) -> Any:
        return self.nvrtcResult(code)

    def nvrtcVersion(self) -> tuple[Any, int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        return self._result(self._lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))), major.value, minor.value

    def nvrtcGetSupportedArchs(self) -> tuple[Any, list[int]]:
        n = ctypes.c_int()
        err = self._lib.nvrtcGetNumSupportedArchs(ctypes.byref(n))
        if err:
            return self._result(err), []
        archs = (ctypes.c_int * n.value)()
        return self._result(self._lib.nvrtcGetSupportedArchs(archs)), list(archs)

    def nvrtcCreateProgram(self, src: bytes, name: bytes, count: int, sources: list[bytes], names: list[bytes]) -> tuple[Any, Any]:
        prog = ctypes.c_void_p()
        header_sources = (ctypes.c_char_p * max(count, 1))(*sources)
        header_names = (ctypes.c_char_p * max(count, 1))(*names)
        err = self._lib.nvrtcCreateProgram(ctypes.byref(prog), src, name, count, header_sources, header_names)
        return self._result(err), prog

    def nvrtcCompileProgram(self, prog: Any, count: int, options: list[bytes]) -> tuple[Any]:
        array = (ctypes.c_char_p * max(count, 1))(*options)
        return (self._result(self._lib.nvrtcCompileProgram(prog, count, array)),)

    def nvrtcDestroyProgram(self, prog: Any) -> tuple[Any]:
        handle = ctypes.c_void_p(prog.value)
        return (self._result(self._lib.nvrtcDestroyProgram(ctypes.byref(handle))),)

    def _size(self, fn: Any, *args: Any) -> tuple[Any, int]:
        size = ctypes.c_size_t()
        return self._result(fn(*args, ctypes.byref(size))), size.value

    def _fill(self, fn: Any, prog: Any, buffer: bytearray) -> tuple[Any]:
        out = ctypes.create_string_buffer(len(buffer))
        err = fn(prog, out)
        buffer[:] = out.raw[: len(buffer)]
        return (self._result(err),)

    def nvrtcGetProgramLogSize(self, prog: Any) -> tuple[Any, int]:
        return self._size(self._lib.nvrtcGetProgramLogSize, prog)

    def nvrtcGetProgramLog(self, prog: Any, buffer: bytearray) -> tuple[Any]:
        return self._fill(self._lib.nvrtcGetProgramLog, prog, buffer)

    def nvrtcGetPTXSize(self, prog: Any) -> tuple[Any, int]:
        return self._size(self._lib.nvrtcGetPTXSize, prog)

    def nvrtcGetPTX(self, prog: Any, buffer: bytearray) -> tuple[Any]:
        return self._fill(self._lib.nvrtcGetPTX, prog, buffer)

    def nvrtcGetCUBINSize(self, prog: Any) -> tuple[Any, int]:
        return self._size(self._lib.nvrtcGetCUBINSize, prog)

    def nvrtcGetCUBIN(self, prog: Any, buffer: bytearray) -> tuple[Any]:
        return self._fill(self._lib.nvrtcGetCUBIN, prog, buffer)

    def nvrtcGetPCHHeapSize(self) -> tuple[Any, int]:
        return self._size(self._lib.nvrtcGetPCHHeapSize)

    def nvrtcSetPCHHeapSize(self, size: int) -> tuple[Any]:
        return (self._result(self._lib.nvrtcSetPCHHeapSize(size)),)

    def nvrtcGetPCHCreateStatus(self, prog: Any) -> tuple[Any]:
        return (self._result(self._lib.nvrtcGetPCHCreateStatus(prog)),)

    def nvrtcGetPCHHeapSizeRequired(self, prog: Any) -> tuple[Any, int]:
        return self._size(self._lib.nvrtcGetPCHHeapSizeRequired, prog)


@functools.cache
def load() -> Nvrtc12:
    """This process's NVRTC 12 (once); BuildError where it is not installed."""
    return Nvrtc12(find_library())
