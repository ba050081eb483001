"""tests/native/fake_libcuda.c built and loaded: a libcuda.so.1 without a GPU, built with the C
compiler against the real cuda.h (the nvidia-cuda-runtime distribution's), whose functions record
what they were given through the C ABI (`state`) and answer from it; its `constants` are the
header's values and layouts. Used by tests/test_libcuda.py and benchmarks/driver_seam_cpu.py."""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from ctypes import c_char, c_int, c_ubyte, c_uint, c_uint64, c_void_p
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "native" / "fake_libcuda.c"
MAX_PARAMS, MAX_STACK = 16, 8
DEVICE_BASE = 0x7000_0000_0000  # device 0's memory: [DEVICE_BASE, DEVICE_BASE + 2**40)
DEFAULTS = {"version": 13000, "count": 1, "cc_major": 9, "cc_minor": 0, "optin": 232448, "param_count": 4}


class State(ctypes.Structure):
    """`struct fake_state` of fake_libcuda.c, field for field."""

    _fields_ = [
        *[(name, c_int) for name in ("version", "count", "cc_major", "cc_minor", "optin", "static_shared", "fail_launch")],
        ("param_count", c_int),
        *[(name, c_int) for name in ("inits", "launches", "launches_ex", "pushes", "pops", "encodes", "loads")],
        ("stack", c_void_p * MAX_STACK),
        ("depth", c_int),
        ("function", c_void_p),
        ("grid", c_uint * 3), ("block", c_uint * 3), ("shared", c_uint),
        ("stream", c_void_p),
        ("extra", c_void_p),
        ("params", c_uint64 * MAX_PARAMS),
        ("attr_count", c_uint), ("attr_id", c_uint), ("cluster", c_uint * 3),
        ("image_head", c_ubyte * 16),
        ("function_name", c_char * 64),
        ("dynamic_shared", c_int),
        *[(name, c_int) for name in ("tm_dtype", "tm_interleave", "tm_swizzle", "tm_l2", "tm_oob", "tm_aligned")],
        ("tm_rank", c_uint),
        ("tm_address", c_uint64), ("tm_dims", c_uint64 * 5), ("tm_strides", c_uint64 * 4),
        ("tm_box", c_uint * 5), ("tm_elements", c_uint * 5),
    ]  # fmt: skip


class _Constant(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_longlong)]


def include_dir() -> Path:
    import nvidia.cuda_runtime

    return Path(next(iter(nvidia.cuda_runtime.__path__))) / "include"


def build(folder: Path | None = None) -> Path:
    """The fake compiled into `folder` (default: a cache by the source's and header's hash)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    assert compiler, "a C compiler (gcc) builds tests/native/fake_libcuda.c"
    header = include_dir() / "cuda.h"
    digest = hashlib.sha256(SOURCE.read_bytes() + header.read_bytes()).hexdigest()[:16]
    folder = folder or Path(tempfile.gettempdir()) / f"hatch-autotune-fake-libcuda-{digest}"
    out = folder / "libcuda.so.1"
    if not out.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"libcuda.so.1.{digest}.part"
        subprocess.run(
            [
                compiler,
                "-shared",
                "-fPIC",
                "-O2",
                "-Wall",
                "-Wextra",
                "-Werror",
                f"-I{include_dir()}",
                "-o",
                str(partial),
                str(SOURCE),
                "-ldl",
            ],
            check=True,
            timeout=120,
        )
        partial.replace(out)
    return out


class FakeLibcuda:
    """The built fake, loaded: its `state` (read and set by tests) and `constants` (cuda.h's)."""

    def __init__(self, path: Path):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self.state = State.in_dll(self.lib, "fake")
        table = (_Constant * 64).in_dll(self.lib, "fake_constants")
        self.constants = {}
        for entry in table:
            if entry.name is None:
                break
            self.constants[entry.name.decode()] = entry.value

    def reset(self, **changes: int) -> State:
        """Every count and record zeroed, the defaults back, then `changes`."""
        ctypes.memset(ctypes.addressof(self.state), 0, ctypes.sizeof(self.state))
        for name, value in {**DEFAULTS, **changes}.items():
            setattr(self.state, name, value)
        return self.state
