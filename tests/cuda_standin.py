"""A stand-in for the CUDA driver, for tests on machines without a GPU.

Only the lowest layer is replaced: the `cuda.bindings.driver` functions that hatch-autotune
calls, and cuda.core's `Device`, `Stream`, `Event`, `ObjectCode` and `launch` (`StandIn.api()`
hands them over as the runtime's `CudaApi`). A kernel call launches as on a GPU, through the
driver: `cuModuleLoadData` (refusing a cubin of another arch or PTX newer than the driver),
`cuModuleGetFunction`, then `cuLaunchKernel`, whose parameter bytes are read through its
`kernelParams` pointers, as many and as large as the cubin itself declares in its
`.nv.info.<entry>` section (for PTX: its `.entry` parameter list); the tuning worker launches its
variants the same way (the runtime's own launch code). The worker's compare kernels launch with
cuda.core's `launch`: there cuda.core's real `LaunchConfig` and argument packing (`ParamHolder`)
stay, and the packed buffer is decoded the same way. What a real driver would
refuse, the stand-in refuses with the driver's error name: no current context, a stream or
module of another device, a block or shared-memory size over the device's limits, PTX newer
than the driver, a cubin of another arch, dynamic shared memory past 48 KiB without the function's
opt-in (cuFuncSetAttribute) or past the device's opt-in limit, a cluster launch (cuLaunchKernelEx)
whose cluster does not divide the grid, exceeds 8 blocks, runs on a device before sm_90 or differs
from the cluster the cubin was compiled with, and a tensor map (cuTensorMapEncodeTiled) against
any of the driver's documented rules; and, stricter than a driver, parameters whose bytes overlap,
and a 128-byte (CUtensorMap) parameter whose bytes are not a stand-in tensor map at a 64-byte
aligned host address, or that the cubin does not place 64-byte aligned. `decode_tensor_map`
reads back what a stand-in CUtensorMap encodes.

Device memory is emulated (host buffers at fake device addresses), and kernels can be emulated
in Python (see `EMULATORS`), so that the real tuning worker can run whole buckets: an emulated
kernel may write its outputs, fault with an illegal address (sticky, as on a GPU), or hang.
Event timings come from a virtual clock that emulated kernels and memsets advance: they are
SYNTHETIC. CUDA graphs: a stream being captured (cuStreamBeginCapture) records its kernel
launches and memsets as nodes instead of running them, refuses to synchronise or record an event,
and cuGraphLaunch replays an instantiated graph's nodes (each launch says `in_graph`); a memset of
at least the L2's size makes the device's L2 cold until the next launch (`Launch.l2_cold`), so an
emulator may time a kernel by how it was launched and what the L2 held.

Nothing is patched: the stand-in reaches the code under test through the runtime's one seam,
`runtime.use_gpu(standin.api())`, which `install` calls. Usage: `standin = install(monkeypatch,
runtime, ccs=[(9, 0)])` in a test whose fixture calls `runtime.use_gpu(None)` afterwards, or
`install_globally(...)` in a child process (tests/standin_worker.py).
"""

from __future__ import annotations

import ctypes
import re
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
from cuda.bindings import __version__ as BINDINGS_VERSION
from cuda.bindings import driver

try:  # the tuning worker's side; a wheel's runtime in a venv of its run-time dependencies has no cuda-core
    from cuda.core import EventOptions, LaunchConfig
    from cuda.core._kernel_arg_handler import ParamHolder
    from cuda.core._utils.cuda_utils import CUDAError
except ImportError:
    EventOptions = LaunchConfig = ParamHolder = None

    class CUDAError(RuntimeError):  # type: ignore[no-redef]  # what cuda.core raises, where it is absent
        pass


try:  # absent beside a generated wheel's own runtime (a fresh venv): `install(runtime=...)` gives that one
    import hatch_autotune.runtime
except ImportError:
    hatch_autotune = None

R = driver.CUresult
ATTR = driver.CUdevice_attribute
BASE_ADDRESS = 0x7F00_0000_0000  # device d's allocations start at BASE_ADDRESS + d << 36
LEGACY_STREAMS = (0, 1, 2)  # NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: the current context's
DEFAULT_SHARED = 48 * 1024  # shared memory per block (static and dynamic) without an opt-in
RESERVED_SHARED = 1024  # shared memory per block the driver keeps for itself (outside the limits above)
# compute capability -> CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, bytes
SHARED_OPTIN = {(8, 0): 166912, (8, 6): 101376, (8, 9): 101376, (9, 0): 232448, (10, 0): 232448, (12, 0): 101376}
MAX_CLUSTER = 8  # blocks: the portable cluster size (no non-portable opt-in here)
L2_BYTES = 1 << 20  # each device's L2 (small, so that the tuner's L2 flush stays cheap to emulate)
MEMSET_MS_PER_MIB = 0.002  # a memset's SYNTHETIC time on its stream's clock (a flush is not free)


def shared_optin(cc: tuple[int, int]) -> int:
    """The opt-in shared memory per block of a device of compute capability `cc`."""
    return SHARED_OPTIN.get(tuple(cc), SHARED_OPTIN.get((cc[0], 0), 101376))


# ---- what a cubin or PTX declares -----------------------------------------------------------


def elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name -> bytes of a 64-bit little-endian ELF file (a cubin)."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    out = {}
    for h in headers:
        name = data[names + h[0] : data.index(b"\0", names + h[0])].decode()
        out[name] = data[h[4] : h[4] + h[5]]
    return out


def cubin_params(cubin: bytes, entry: str) -> list[int]:
    """The byte size of each parameter of `entry`, in order, from EIATTR_KPARAM_INFO records.

    .nv.info records are 4-byte (format, attribute, 2 value bytes) except EIFMT_SVAL (format 4),
    which carries a 2-byte length and that many bytes; KPARAM_INFO (0x17) holds index (u32),
    ordinal (u16), offset (u16) and a word whose top 14 bits are the size."""
    info = elf_sections(cubin).get(f".nv.info.{entry}")
    if info is None:
        raise KeyError(entry)
    params: dict[int, int] = {}
    i = 0
    while i + 4 <= len(info):
        fmt, attr = info[i], info[i + 1]
        if fmt == 4:
            size = struct.unpack_from("<H", info, i + 2)[0]
            value = info[i + 4 : i + 4 + size]
            i += 4 + size
            if attr == 0x17:
                _, ordinal, _, word = struct.unpack("<IHHI", value)
                params[ordinal] = word >> 18
        else:
            i += 4
    return [params[k] for k in sorted(params)]


def cubin_sm(data: bytes) -> int:
    """The SM number (e.g. 90) a CUDA ELF cubin was built for, from its header (e_flags: bits
    8-15 from ELF ABI version 8 on, as NVRTC 13 writes; bits 0-7 before); ValueError if not a cubin."""
    if len(data) < 52 or data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    if int.from_bytes(data[18:20], "little") != 190:  # EM_CUDA
        raise ValueError("ELF machine is not EM_CUDA (190)")
    flags = int.from_bytes(data[48:52], "little")
    abi_version = data[8]
    return (flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF


def _nv_info(cubin: bytes, entry: str) -> list[tuple[int, bytes]]:
    """(attribute, value bytes) of each record in `entry`'s .nv.info section (see cubin_params)."""
    info = elf_sections(cubin).get(f".nv.info.{entry}")
    if info is None:
        raise KeyError(entry)
    out = []
    i = 0
    while i + 4 <= len(info):
        fmt, attr = info[i], info[i + 1]
        if fmt == 4:
            size = struct.unpack_from("<H", info, i + 2)[0]
            out.append((attr, info[i + 4 : i + 4 + size]))
            i += 4 + size
        else:
            out.append((attr, info[i + 2 : i + 4]))
            i += 4
    return out


EIATTR_PARAM_CBANK, EIATTR_KPARAM_INFO, EIATTR_CTA_PER_CLUSTER = 0x0A, 0x17, 0x3D


def cubin_param_offsets(cubin: bytes, entry: str) -> list[int]:
    """Each parameter's offset in the constant bank (the bank's parameter base from
    EIATTR_PARAM_CBANK plus the parameter's own offset from EIATTR_KPARAM_INFO), in order: what
    the kernel's alignment of a parameter (64 bytes for a CUtensorMap) is measured against."""
    base, offsets = 0, {}
    for attr, value in _nv_info(cubin, entry):
        if attr == EIATTR_PARAM_CBANK:
            base = struct.unpack_from("<IH", value)[1]
        elif attr == EIATTR_KPARAM_INFO:
            _, ordinal, offset, _ = struct.unpack("<IHHI", value)
            offsets[ordinal] = offset
    return [base + offsets[k] for k in sorted(offsets)]


def cubin_cluster(cubin: bytes, entry: str) -> tuple[int, int, int] | None:
    """The cluster dims a kernel was compiled with (`__cluster_dims__`: EIATTR_CTA_PER_CLUSTER), or None."""
    for attr, value in _nv_info(cubin, entry):
        if attr == EIATTR_CTA_PER_CLUSTER:
            return struct.unpack("<III", value)
    return None


def cubin_static_shared(cubin: bytes, entry: str) -> int:
    """A kernel's static shared memory in bytes, as CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES gives it:
    the size of its .nv.shared.<entry> section (NOBITS: the size is in the header), less the
    block the driver reserves (CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, 1 KiB): from
    sm_90 on, NVRTC writes an empty .nv.shared.reserved.0 and counts that KiB inside every
    kernel's section, which the device's opt-in limit already leaves out."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    sizes = {cubin[names + h[0] : cubin.index(b"\0", names + h[0])].decode(): h[5] for h in headers}
    reserved = RESERVED_SHARED if any(name.startswith(".nv.shared.reserved.") for name in sizes) else 0
    return max(sizes.get(f".nv.shared.{entry}", 0) - reserved, 0)


def cubin_cc(cubin: bytes) -> tuple[int, int]:
    """(major, minor) a cubin was built for."""
    sm = cubin_sm(cubin)
    return sm // 10, sm % 10


_PTX_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.([usfb])(\d+)\s+[\w$]+(?:\[(\d+)\])?")


def ptx_params(ptx: str, entry: str) -> list[int]:
    """The byte size of each parameter of `.entry <entry>(...)` in PTX text."""
    m = re.search(rf"\.entry\s+{re.escape(entry)}\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise KeyError(entry)
    return [int(bits) // 8 * int(count or 1) for _, bits, count in _PTX_PARAM.findall(m.group(1))]


def ptx_isa(ptx: str) -> tuple[int, int]:
    major, minor = re.search(r"^\s*\.version\s+(\d+)\.(\d+)", ptx, re.M).groups()
    return int(major), int(minor)


def packed_size(value: Any) -> int:
    """How many bytes cuda.core packs for a Python argument (its documented rules: int -> intptr_t,
    float -> double, bool -> bool, NumPy scalars their itemsize)."""
    if isinstance(value, np.generic):
        return value.dtype.itemsize
    if isinstance(value, bool):
        return 1
    if isinstance(value, (int, float)):
        return 8
    raise TypeError(f"the stand-in does not know how cuda.core packs {type(value).__name__}")


# ---- tensor maps (cuTensorMapEncodeTiled) ----------------------------------------------------

TENSOR_MAP_BYTES = 128
_TMAP_MAGIC = int.from_bytes(b"STANDTMA", "little")
# CUtensorMapDataType value -> element bytes (the packed 16U4/16U6 types are not emulated)
TMAP_ELEMENT_BYTES = {0: 1, 1: 2, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 4, 11: 4, 12: 4}
TMAP_FLOATS = frozenset({6, 7, 8, 9, 10, 11, 12})  # the types whose out-of-bounds fill may be NaN
_SWIZZLE_SPAN = {1: 32, 2: 64, 3: 128, 4: 128, 5: 128, 6: 128}


def tensor_map_refusal(dtype, rank, address, dims, strides, box, element_strides, interleave, swizzle, l2, oob) -> str | None:
    """Why the driver refuses these cuTensorMapEncodeTiled arguments (its documented rules for
    interleave NONE), or None."""
    dtype, rank, address = int(dtype), int(rank), int(address or 0)
    dims, strides, box, element_strides = ([int(v) for v in seq or []] for seq in (dims, strides, box, element_strides))
    if dtype not in TMAP_ELEMENT_BYTES:
        return f"tensorDataType {dtype} (packed types are not emulated)"
    size = TMAP_ELEMENT_BYTES[dtype]
    if not 1 <= rank <= 5:
        return f"tensorRank {rank}"
    if int(interleave) != 0:
        return f"interleave {int(interleave)} (the stand-in emulates NONE)"
    if not address or address % 16:
        return f"globalAddress {address:#x} not 16-byte aligned"
    if len(dims) != rank or any(not 1 <= d <= 2**32 for d in dims):
        return f"globalDim {dims} for rank {rank}"
    if len(strides) != rank - 1 or any(s <= 0 or s % 16 or s >= 2**40 for s in strides):
        return f"globalStrides {strides} (rank - 1 multiples of 16 below 2**40)"
    if len(box) != rank or any(not 1 <= b <= 256 for b in box):
        return f"boxDim {box} (1..256 per dim)"
    if box[0] * size % 16:
        return f"boxDim[0] {box[0]} x {size} bytes is not a multiple of 16 bytes"
    if len(element_strides) != rank or any(not 1 <= e <= 8 for e in element_strides):
        return f"elementStrides {element_strides} (1..8 per dim)"
    span = _SWIZZLE_SPAN.get(int(swizzle))
    if int(swizzle) and span is None:
        return f"swizzle {int(swizzle)}"
    if span is not None and box[0] * size > span:
        return f"the inner box ({box[0] * size} bytes) exceeds the swizzle span {span}"
    if not 0 <= int(l2) <= 3:
        return f"l2Promotion {int(l2)}"
    if int(oob) not in (0, 1) or (int(oob) == 1 and dtype not in TMAP_FLOATS):
        return f"oobFill {int(oob)} for tensorDataType {dtype}"
    return None


def encode_tensor_map(dtype, rank, address, dims, strides, box, element_strides, swizzle, l2, oob) -> list[int]:
    """The 16 words of a stand-in CUtensorMap: a magic word, the address, the options, then the
    dims, strides, box and element strides (innermost first, as given)."""
    pad = lambda seq, n: [*seq, *[0] * (n - len(seq))]  # noqa: E731
    dims5, strides4, box5, es5 = pad(dims, 5), pad(strides, 4), pad(box, 5), pad(element_strides, 5)
    halves = box5 + es5  # ten 16-bit fields
    packed = [sum(v << (16 * i) for i, v in enumerate(halves[j : j + 4])) for j in (0, 4, 8)]
    options = dtype | rank << 8 | swizzle << 24 | l2 << 32 | oob << 40
    return [_TMAP_MAGIC, address, options, *dims5, *strides4, *packed, 0]


def decode_tensor_map(data: bytes) -> dict[str, Any] | None:
    """What a stand-in CUtensorMap's 128 bytes encode (None: not one the stand-in made)."""
    if len(data) != TENSOR_MAP_BYTES:
        return None
    words = struct.unpack("<16Q", data)
    if words[0] != _TMAP_MAGIC:
        return None
    options = words[2]
    rank = options >> 8 & 0xFF
    halves = [w >> (16 * i) & 0xFFFF for w in words[12:15] for i in range(4)]
    return {
        "dtype": options & 0xFF, "rank": rank, "address": words[1],
        "swizzle": options >> 24 & 0xFF, "l2_promotion": options >> 32 & 0xFF, "oob_fill": options >> 40 & 0xFF,
        "dims": list(words[3 : 3 + rank]), "strides": list(words[8 : 8 + rank - 1]),
        "box": halves[:rank], "element_strides": halves[5 : 5 + rank],
    }  # fmt: skip


# ---- the recorded launch ---------------------------------------------------------------------


@dataclass
class Launch:
    """One launch as the driver would have received it."""

    entry: str
    binary: str  # 'sm_90' (cubin) or 'compute_90' (PTX)
    device: int  # the device of the context current at launch
    stream: FakeStream
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shmem: int
    params: list[bytes]  # each parameter's bytes, as the kernel reads them
    thread: int
    context_depth: int  # contexts on the calling thread's stack during the launch
    cluster: tuple[int, int, int] | None = None  # cuLaunchKernelEx's cluster dims (None: a plain launch)
    in_graph: bool = False  # a kernel node of a CUDA graph replayed by cuGraphLaunch
    l2_cold: bool = False  # the device's L2 was flushed (a memset of at least its size) since the last launch

    def param(self, i: int, dtype: str) -> Any:
        return np.frombuffer(self.params[i], dtype=dtype)[0]


def driver_error(name: str, what: str = "") -> CUDAError:
    return CUDAError(f"{name}: {what}" if what else name)


# ---- the driver ------------------------------------------------------------------------------


@dataclass
class _DeviceState:
    ordinal: int
    cc: tuple[int, int]
    name: str
    total_memory: int = 80 << 30  # cuMemAlloc past it is CUDA_ERROR_OUT_OF_MEMORY
    used_memory: int = 0
    sticky_error: str | None = None  # an illegal address poisons the context for good
    next_address: int = 0
    l2_cold: bool = True  # nothing run yet; a memset of at least L2_BYTES flushes it, a launch warms it


class _Allocation:
    """Device memory: its bytes are made on first use, so a test may hand kernels large arrays
    that nothing reads."""

    def __init__(self, device: int, size: int):
        self.device, self.size, self._data = device, size, None

    @property
    def data(self) -> bytearray:
        if self._data is None:
            self._data = bytearray(self.size)
        return self._data


class StandIn:
    """The emulated driver: devices, per-thread context stacks, memory, streams and launches."""

    def __init__(self, ccs=((9, 0),), driver_version: int = 13000, present: bool = True):
        self.devices = [_DeviceState(i, tuple(cc), f"Stand-in GPU {i} (sm_{cc[0]}{cc[1]})") for i, cc in enumerate(ccs)]
        for d in self.devices:
            d.next_address = BASE_ADDRESS + (d.ordinal << 36)
        self.version = driver_version
        self.present = present
        self.initialised = False
        self.tls = threading.local()
        self.memory: dict[int, _Allocation] = {}
        self.streams: dict[int, FakeStream] = {}
        self.launches: list[Launch] = []
        self.modules: dict[int, tuple[FakeObjectCode, int]] = {}  # cuModuleLoadData's: handle -> (code, device)
        self.functions_loaded: dict[int, tuple[FakeKernel, int]] = {}  # cuModuleGetFunction's: handle -> (kernel, device)
        self.refused: list[str] = []  # what the driver refused, in order
        self.shared_set: list[tuple[str, int]] = []  # cuFuncSetAttribute's dynamic shared sizes: (entry, bytes)
        self.encoded = 0  # tensor maps encoded (cuTensorMapEncodeTiled)
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()
        self._next_stream = 0x5000
        # CUDA graphs: a capturing stream's nodes, the graphs made from them, their executables.
        # A node is ("kernel", kernel, grid, block, shmem, params, cluster) or ("memset", ptr, value, bytes).
        self.capturing: dict[int, list[tuple]] = {}
        self.graphs: dict[int, list[tuple]] = {}
        self.graph_execs: dict[int, list[tuple]] = {}
        self.graph_calls: list[str] = []  # the graph API's calls in order, e.g. 'cuGraphLaunch 0x6001'
        self._next_graph = 0x6000

    # per-thread context stack: a list of device ordinals (primary contexts)
    @property
    def stack(self) -> list[int]:
        if not hasattr(self.tls, "stack"):
            self.tls.stack = []
        return self.tls.stack

    def current(self) -> int | None:
        return self.stack[-1] if self.stack else None

    def refuse(self, name: str, what: str) -> CUDAError:
        self.refused.append(f"{name}: {what}")
        return driver_error(name, what)

    # -- the cuda.bindings.driver functions ----------------------------------------------------

    def functions(self) -> dict[str, Callable[..., Any]]:
        names = [n for n in dir(self) if re.match(r"cu[A-Z]", n)]  # the driver API names
        return {n: self._counted(n, getattr(self, n)) for n in names}

    def api(self, runtime: ModuleType | None = None, bindings: tuple[int, int] | None = None) -> Any:
        """What the runtime and the tuning worker call, as `runtime`'s CudaApi (hatch_autotune's
        unless given): the emulated driver functions with the installed cuda-bindings' real enums
        and structs, that cuda-bindings' version (or `bindings`, to play another's), and where
        cuda-core is installed the fake cuda.core objects with cuda.core's real LaunchConfig and
        EventOptions."""
        # the enums and structs (CUlaunchConfig, CUtensorMap) and the integer wrappers (cuuint64_t)
        enums = {n: getattr(driver, n) for n in dir(driver) if n.startswith(("CU", "cuuint"))}
        core = {} if LaunchConfig is None else {
            "Device": FakeDevice, "Stream": FakeStream, "LaunchConfig": LaunchConfig, "ObjectCode": FakeObjectCode,
            "EventOptions": EventOptions, "launch": self.launch,
        }  # fmt: skip
        if bindings is None:
            major, minor = (int(p) for p in BINDINGS_VERSION.split(".")[:2])
            bindings = (major, minor)
        api_type = (runtime or hatch_autotune.runtime).CudaApi
        return api_type(driver=SimpleNamespace(**self.functions(), **enums), bindings=bindings, **core)

    _NO_VALUE = frozenset(
        {
            "cuInit",
            "cuCtxPushCurrent",
            "cuCtxSetCurrent",
            "cuCtxSynchronize",
            "cuMemFree",
            "cuMemcpyHtoD",
            "cuMemcpyDtoH",
            "cuMemsetD8Async",
            "cuLaunchKernel",
            "cuLaunchKernelEx",
            "cuFuncSetAttribute",
            "cuStreamBeginCapture",
            "cuGraphLaunch",
            "cuGraphExecDestroy",
            "cuGraphDestroy",
        }
    )

    def _counted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            if not self.present:
                from cuda.pathfinder import DynamicLibNotFoundError

                raise DynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only be found via system search (stand-in)')
            with self.lock:
                self.calls[name] = self.calls.get(name, 0) + 1
            if name != "cuInit" and not self.initialised:
                return (R.CUDA_ERROR_NOT_INITIALIZED,) if name in self._NO_VALUE else (R.CUDA_ERROR_NOT_INITIALIZED, None)
            return fn(*args)

        return call

    def cuInit(self, flags: int) -> tuple:
        self.initialised = True
        return (R.CUDA_SUCCESS,)

    def cuDriverGetVersion(self) -> tuple:
        return R.CUDA_SUCCESS, self.version

    def cuDeviceGetCount(self) -> tuple:
        return R.CUDA_SUCCESS, len(self.devices)

    def cuDeviceGetAttribute(self, attr: Any, device: int) -> tuple:
        if not 0 <= int(device) < len(self.devices):
            return R.CUDA_ERROR_INVALID_DEVICE, 0
        cc = self.devices[int(device)].cc
        values = {
            ATTR.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: cc[0],
            ATTR.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: cc[1],
            ATTR.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: DEFAULT_SHARED,
            ATTR.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: shared_optin(cc),
        }
        if attr not in values:
            return R.CUDA_ERROR_INVALID_VALUE, 0
        return R.CUDA_SUCCESS, values[attr]

    def cuCtxGetDevice(self) -> tuple:
        cur = self.current()
        return (R.CUDA_ERROR_INVALID_CONTEXT, 0) if cur is None else (R.CUDA_SUCCESS, cur)

    def cuCtxGetCurrent(self) -> tuple:
        cur = self.current()
        return R.CUDA_SUCCESS, 0 if cur is None else 0xC000 + cur

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple:
        if not 0 <= int(device) < len(self.devices):
            return R.CUDA_ERROR_INVALID_DEVICE, None
        return R.CUDA_SUCCESS, 0xC000 + int(device)

    def cuCtxPushCurrent(self, ctx: Any) -> tuple:
        self.stack.append(int(ctx) - 0xC000)
        return (R.CUDA_SUCCESS,)

    def cuCtxPopCurrent(self) -> tuple:
        if not self.stack:
            return R.CUDA_ERROR_INVALID_CONTEXT, None
        return R.CUDA_SUCCESS, 0xC000 + self.stack.pop()

    def cuCtxSetCurrent(self, ctx: Any) -> tuple:
        if self.stack:
            self.stack.pop()
        if int(ctx):
            self.stack.append(int(ctx) - 0xC000)
        return (R.CUDA_SUCCESS,)

    def cuCtxSynchronize(self) -> tuple:
        cur = self.current()
        if cur is None:
            return (R.CUDA_ERROR_INVALID_CONTEXT,)
        return (self._sticky(cur),)

    def cuPointerGetAttribute(self, attr: Any, ptr: int) -> tuple:
        alloc = self.find(int(ptr))
        if alloc is None:
            return R.CUDA_ERROR_INVALID_VALUE, None
        return R.CUDA_SUCCESS, alloc[0].device

    def cuMemAlloc(self, nbytes: int) -> tuple:
        cur = self.current()
        if cur is None:
            return R.CUDA_ERROR_INVALID_CONTEXT, None
        d = self.devices[cur]
        if d.used_memory + max(int(nbytes), 1) > d.total_memory:
            return R.CUDA_ERROR_OUT_OF_MEMORY, None
        return R.CUDA_SUCCESS, self.alloc(cur, int(nbytes))

    def cuMemFree(self, ptr: int) -> tuple:
        alloc = self.memory.pop(int(ptr), None)
        if alloc is None:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        self.devices[alloc.device].used_memory -= alloc.size
        return (R.CUDA_SUCCESS,)

    def cuMemcpyHtoD(self, dst: int, src: int, nbytes: int) -> tuple:
        alloc, offset = self.find(int(dst)) or (None, 0)
        if alloc is None or offset + nbytes > alloc.size:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        alloc.data[offset : offset + nbytes] = ctypes.string_at(int(src), int(nbytes))
        return (self._sticky(alloc.device),)

    def cuMemcpyDtoH(self, dst: int, src: int, nbytes: int) -> tuple:
        alloc, offset = self.find(int(src)) or (None, 0)
        if alloc is None or offset + nbytes > alloc.size:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        err = self._sticky(alloc.device)
        if err == R.CUDA_SUCCESS:
            ctypes.memmove(int(dst), bytes(alloc.data[offset : offset + nbytes]), int(nbytes))
        return (err,)

    def cuMemcpyDtoDAsync(self, dst: int, src: int, nbytes: int, stream: Any) -> tuple:
        to, to_offset = self.find(int(dst)) or (None, 0)
        frm, frm_offset = self.find(int(src)) or (None, 0)
        if to is None or frm is None or to_offset + nbytes > to.size or frm_offset + nbytes > frm.size:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        to.data[to_offset : to_offset + nbytes] = bytes(frm.data[frm_offset : frm_offset + nbytes])
        return (self._sticky(to.device),)

    def cuMemsetD8Async(self, ptr: int, value: int, nbytes: int, stream: Any) -> tuple:
        alloc, offset = self.find(int(ptr)) or (None, 0)
        if alloc is None or offset + nbytes > alloc.size:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        if int(stream) in self.capturing:  # a memset node of the graph being captured
            self.capturing[int(stream)].append(("memset", int(ptr), int(value), int(nbytes)))
            return (R.CUDA_SUCCESS,)
        self._memset(int(ptr), int(value), int(nbytes), self.streams.get(int(stream)))
        return (R.CUDA_SUCCESS,)

    def _memset(self, ptr: int, value: int, nbytes: int, stream: FakeStream | None) -> None:
        alloc, offset = self.find(ptr)
        alloc.data[offset : offset + nbytes] = bytes([value]) * nbytes
        if nbytes >= L2_BYTES:  # writes through the whole L2: what the tuner's flush does
            self.devices[alloc.device].l2_cold = True
        if stream is not None:
            stream.clock_ms += MEMSET_MS_PER_MIB * nbytes / (1 << 20)  # SYNTHETIC, as the kernels' times

    # -- CUDA graphs: stream capture, instantiation, replay ---------------------------------------

    def cuStreamBeginCapture(self, stream: Any, mode: Any) -> tuple:
        handle = int(stream)
        if not isinstance(mode, driver.CUstreamCaptureMode):
            return (R.CUDA_ERROR_INVALID_VALUE,)
        if handle not in self.streams:  # the legacy and per-thread default streams cannot be captured
            self.refuse("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", f"stream {handle:#x} is not a created stream")
            return (R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        if handle in self.capturing:
            return (R.CUDA_ERROR_ILLEGAL_STATE,)
        self.capturing[handle] = []
        self.graph_calls.append(f"cuStreamBeginCapture {mode.name}")
        return (R.CUDA_SUCCESS,)

    def cuStreamEndCapture(self, stream: Any) -> tuple:
        nodes = self.capturing.pop(int(stream), None)
        if nodes is None:
            return R.CUDA_ERROR_ILLEGAL_STATE, None
        self._next_graph += 1
        self.graphs[self._next_graph] = nodes
        self.graph_calls.append(f"cuStreamEndCapture {len(nodes)} nodes: {' '.join(n[0] for n in nodes)}")
        return R.CUDA_SUCCESS, self._next_graph

    def cuGraphInstantiate(self, graph: Any, flags: int) -> tuple:
        nodes = self.graphs.get(int(graph))
        if nodes is None or int(flags) != 0:
            return R.CUDA_ERROR_INVALID_VALUE, None
        self._next_graph += 1
        self.graph_execs[self._next_graph] = list(nodes)
        self.graph_calls.append(f"cuGraphInstantiate {int(graph):#x}")
        return R.CUDA_SUCCESS, self._next_graph

    def cuGraphLaunch(self, executable: Any, stream: Any) -> tuple:
        nodes = self.graph_execs.get(int(executable))
        if nodes is None:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        if int(stream) in self.capturing:
            return (R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,)
        try:
            fake = self._stream(int(stream), "cuGraphLaunch")
            if self.current() is None:
                raise self.refuse("CUDA_ERROR_INVALID_CONTEXT", "cuGraphLaunch: no current context in this thread")
            self.graph_calls.append(f"cuGraphLaunch {int(executable):#x}")
            for node in nodes:
                if node[0] == "memset":
                    self._memset(*node[1:], fake)
                else:
                    _, kernel, grid, block, shmem, params, cluster = node
                    self.tls.in_graph = True
                    try:
                        self._run(kernel, fake, grid, block, shmem, params, cluster)
                    finally:
                        self.tls.in_graph = False
        except CUDAError as exc:
            return (self._code(exc),)
        return (R.CUDA_SUCCESS,)

    def cuGraphExecDestroy(self, executable: Any) -> tuple:
        if self.graph_execs.pop(int(executable), None) is None:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        self.graph_calls.append(f"cuGraphExecDestroy {int(executable):#x}")
        return (R.CUDA_SUCCESS,)

    def cuGraphDestroy(self, graph: Any) -> tuple:
        if self.graphs.pop(int(graph), None) is None:
            return (R.CUDA_ERROR_INVALID_VALUE,)
        self.graph_calls.append(f"cuGraphDestroy {int(graph):#x}")
        return (R.CUDA_SUCCESS,)

    def _stream(self, handle: int, what: str) -> FakeStream:
        fake = self.streams.get(handle)
        if fake is None:
            if handle not in LEGACY_STREAMS:
                raise self.refuse("CUDA_ERROR_INVALID_HANDLE", f"{what}: no stream {handle:#x}")
            fake = FakeStream(self, handle, None)
        return fake

    def _sticky(self, device: int) -> Any:
        err = self.devices[device].sticky_error
        return getattr(R, err) if err else R.CUDA_SUCCESS

    # -- memory ---------------------------------------------------------------------------------

    def alloc(self, device: int, nbytes: int) -> int:
        with self.lock:
            d = self.devices[device]
            ptr = d.next_address
            d.next_address += (max(nbytes, 1) + 255) // 256 * 256 + 256  # a gap: off-by-one reads fault
            d.used_memory += max(nbytes, 1)
            self.memory[ptr] = _Allocation(device, max(nbytes, 1))
        return ptr

    def find(self, ptr: int) -> tuple[_Allocation, int] | None:
        for base, alloc in self.memory.items():
            if base <= ptr < base + alloc.size:
                return alloc, ptr - base
        return None

    def view(self, ptr: int, dtype: str, count: int) -> np.ndarray:
        """`count` elements at device address `ptr`; an illegal address raises IllegalAddress."""
        found = self.find(ptr)
        nbytes = count * np.dtype(dtype).itemsize
        if found is None or found[1] + nbytes > found[0].size:
            raise IllegalAddress(f"{count} x {dtype} at {ptr:#x}")
        alloc, offset = found
        return np.frombuffer(alloc.data, dtype=dtype, count=count, offset=offset)

    # -- modules and the driver's launch (the runtime's call path) -----------------------------

    def cuModuleLoadData(self, image: Any) -> tuple:
        """A cubin or PTX (a C string) loaded into the current context: refused, as the driver
        does at load, for another arch or PTX newer than the driver."""
        device = self.current()
        if device is None:
            return R.CUDA_ERROR_INVALID_CONTEXT, None
        data = bytes(image)
        code = FakeObjectCode(data, "cubin") if data[:4] == b"\x7fELF" else FakeObjectCode(data.rstrip(b"\0"), "ptx")
        try:
            FakeKernel.check_code_runs_on(code, self, device)
        except CUDAError as exc:
            return self._code(exc), None
        with self.lock:
            handle = self._next_handle = getattr(self, "_next_handle", 0xD000) + 0x10
            self.modules[handle] = (code, device)
        return R.CUDA_SUCCESS, handle

    def cuModuleGetFunction(self, module: Any, name: bytes) -> tuple:
        found = self.modules.get(int(module))
        if found is None:
            return R.CUDA_ERROR_INVALID_HANDLE, None
        code, device = found
        try:
            kernel = code.get_kernel(name.decode())
        except CUDAError as exc:
            return self._code(exc), None
        with self.lock:
            handle = self._next_handle = self._next_handle + 0x10
            self.functions_loaded[handle] = (kernel, device)
        return R.CUDA_SUCCESS, handle

    def cuLaunchKernel(
        self, f: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shmem: int, stream: Any, params: Any, extra: Any
    ) -> tuple:
        """The driver's launch: each parameter's bytes are read through the `params` array of
        pointers, as many and as large as the kernel's binary declares, as a GPU driver reads
        them. Stricter than a driver: parameters whose bytes overlap are refused, so that a
        buffer laid out with a slot too small for its parameter cannot pass."""
        found = self.functions_loaded.get(int(f))
        if found is None:
            return (R.CUDA_ERROR_INVALID_HANDLE,)
        kernel, loaded_on = found
        try:
            device = self.current()
            if device is None:
                raise self.refuse("CUDA_ERROR_INVALID_CONTEXT", f"{kernel.entry}: no current context in this thread")
            if device != loaded_on:
                raise self.refuse(
                    "CUDA_ERROR_INVALID_HANDLE", f"{kernel.entry}: a function of device {loaded_on} in a context of device {device}"
                )
            fake = self._stream(int(stream), kernel.entry)
            if extra not in (0, None):
                raise self.refuse("CUDA_ERROR_INVALID_VALUE", f"{kernel.entry}: `extra` given (the runtime passes kernelParams)")
            values = self._read_params(kernel, params)
            if kernel.cluster is not None:  # compiled with __cluster_dims__: the grid must hold whole clusters
                self._check_cluster(kernel, (int(gx), int(gy), int(gz)), kernel.cluster)
            self._run(kernel, fake, (gx, gy, gz), (bx, by, bz), int(shmem), values, getattr(self.tls, "cluster", None) or kernel.cluster)
        except CUDAError as exc:
            return (self._code(exc),)
        return (R.CUDA_SUCCESS,)

    def _read_params(self, kernel: FakeKernel, params: Any) -> list[bytes]:
        """Each parameter's bytes through the kernelParams pointers, as many and as large as the
        binary declares; refused: overlapping or null slots, and a CUtensorMap parameter (128
        bytes) that the cubin does not place 64-byte aligned, whose host bytes are not 64-byte
        aligned, or that is neither a tensor map this stand-in encoded nor 128 zero bytes (the
        parameter of a map the variant does not read: the driver never looks inside it)."""
        sizes = kernel.params
        if sizes and not int(params):
            raise self.refuse("CUDA_ERROR_INVALID_VALUE", f"{kernel.entry}: no kernelParams for {len(sizes)} parameters")
        addresses = list((ctypes.c_void_p * len(sizes)).from_address(int(params))) if sizes else []
        spans = sorted((int(addr or 0), int(addr or 0) + size, i) for i, (addr, size) in enumerate(zip(addresses, sizes)))
        for (start, _, i), (_, end, j) in zip(spans[1:], spans):
            if start < end:
                raise self.refuse("CUDA_ERROR_INVALID_VALUE", f"{kernel.entry}: the bytes of parameters {j} and {i} overlap")
        if any(not addr for addr in addresses):
            raise self.refuse("CUDA_ERROR_INVALID_VALUE", f"{kernel.entry}: a null parameter pointer")
        values = [ctypes.string_at(addr, size) for addr, size in zip(addresses, sizes)]
        for i, (addr, size, value) in enumerate(zip(addresses, sizes, values)):
            if size != TENSOR_MAP_BYTES:
                continue
            if kernel.offsets is not None and kernel.offsets[i] % 64:
                raise self.refuse(
                    "CUDA_ERROR_INVALID_IMAGE",
                    f"{kernel.entry}: parameter {i} (a CUtensorMap) at constant offset {kernel.offsets[i]:#x}, not 64-byte aligned",
                )
            if addr % 64:
                raise self.refuse(
                    "CUDA_ERROR_INVALID_VALUE", f"{kernel.entry}: parameter {i} (a CUtensorMap) read from {addr:#x}, not 64-byte aligned"
                )
            if decode_tensor_map(value) is None and value != bytes(TENSOR_MAP_BYTES):  # zeros: a map the variant does not read (`when`)
                raise self.refuse(
                    "CUDA_ERROR_INVALID_VALUE", f"{kernel.entry}: parameter {i} is 128 bytes but no tensor map this stand-in encoded"
                )
        return values

    def _check_cluster(self, kernel: FakeKernel, grid: tuple[int, int, int], cluster: tuple[int, int, int]) -> None:
        """A cluster launch's dims against the grid, the portable size, the function's arch and the
        cluster the kernel was compiled with."""
        if min(cluster) < 1 or cluster[0] * cluster[1] * cluster[2] > MAX_CLUSTER:
            raise self.refuse("CUDA_ERROR_INVALID_CLUSTER_SIZE", f"{kernel.entry}: cluster {cluster}")
        if any(g % c for g, c in zip(grid, cluster)):
            raise self.refuse("CUDA_ERROR_INVALID_CLUSTER_SIZE", f"{kernel.entry}: grid {grid} is not a multiple of cluster {cluster}")
        if kernel.cc < (9, 0):
            raise self.refuse(
                "CUDA_ERROR_INVALID_CLUSTER_SIZE", f"{kernel.entry}: a cluster launch of an sm_{kernel.cc[0]}{kernel.cc[1]} function"
            )
        if kernel.cluster is not None and tuple(kernel.cluster) != tuple(cluster):
            raise self.refuse("CUDA_ERROR_INVALID_CLUSTER_SIZE", f"{kernel.entry}: cluster {cluster}; compiled with {kernel.cluster}")

    def cuLaunchKernelEx(self, config: Any, f: Any, params: Any, extra: Any) -> tuple:
        """The driver's launch with a CUlaunchConfig: its attributes checked (only the cluster
        dimension is known here), then launched as cuLaunchKernel launches, with its cluster."""
        found = self.functions_loaded.get(int(f))
        if found is None:
            return (R.CUDA_ERROR_INVALID_HANDLE,)
        kernel = found[0]
        if not isinstance(config, driver.CUlaunchConfig):
            return (R.CUDA_ERROR_INVALID_VALUE,)
        cluster = None
        try:
            attrs = config.attrs if config.numAttrs else []
            if len(attrs) != config.numAttrs:
                raise self.refuse("CUDA_ERROR_INVALID_VALUE", f"{kernel.entry}: numAttrs {config.numAttrs} for {len(attrs)} attributes")
            for attr in attrs:
                if attr.id != driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
                    raise self.refuse(
                        "CUDA_ERROR_INVALID_VALUE",
                        f"{kernel.entry}: launch attribute {attr.id!r} (the stand-in knows the cluster dimension)",
                    )
                dim = attr.value.clusterDim
                cluster = (int(dim.x), int(dim.y), int(dim.z))
            grid = (int(config.gridDimX), int(config.gridDimY), int(config.gridDimZ))
            if cluster is not None:
                self._check_cluster(kernel, grid, cluster)
        except CUDAError as exc:
            return (self._code(exc),)
        block = (int(config.blockDimX), int(config.blockDimY), int(config.blockDimZ))
        with self._cluster_of_next(cluster or kernel.cluster):
            return self.cuLaunchKernel(f, *grid, *block, int(config.sharedMemBytes), int(config.hStream), params, extra)

    def _cluster_of_next(self, cluster: tuple[int, int, int] | None) -> Any:
        """The cluster that cuLaunchKernel records for the launch made inside this block."""
        import contextlib

        @contextlib.contextmanager
        def block() -> Any:
            self.tls.cluster = cluster
            try:
                yield
            finally:
                self.tls.cluster = None

        return block()

    # -- function attributes and tensor maps --------------------------------------------------

    def cuFuncGetAttribute(self, attrib: Any, f: Any) -> tuple:
        found = self.functions_loaded.get(int(f))
        if found is None:
            return R.CUDA_ERROR_INVALID_HANDLE, 0
        kernel = found[0]
        FA = driver.CUfunction_attribute
        values = {
            FA.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: kernel.static_shared,
            FA.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: kernel.max_dynamic_shared,
            FA.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: 1024,
        }
        if attrib not in values:
            return R.CUDA_ERROR_INVALID_VALUE, 0
        return R.CUDA_SUCCESS, values[attrib]

    def cuFuncSetAttribute(self, f: Any, attrib: Any, value: int) -> tuple:
        """Only MAX_DYNAMIC_SHARED_SIZE_BYTES, refused past the device's opt-in limit less the
        function's static shared memory, as the driver documents."""
        found = self.functions_loaded.get(int(f))
        if found is None:
            return (R.CUDA_ERROR_INVALID_HANDLE,)
        kernel, device = found
        if attrib != driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
            self.refused.append(
                f"CUDA_ERROR_INVALID_VALUE: {kernel.entry}: attribute {attrib!r} (the stand-in sets only the dynamic shared size)"
            )
            return (R.CUDA_ERROR_INVALID_VALUE,)
        limit = shared_optin(self.devices[device].cc)
        if not 0 <= int(value) <= limit - kernel.static_shared:
            self.refused.append(f"CUDA_ERROR_INVALID_VALUE: {kernel.entry}: {value} B dynamic + {kernel.static_shared} B static > {limit}")
            return (R.CUDA_ERROR_INVALID_VALUE,)
        kernel.max_dynamic_shared = int(value)
        self.shared_set.append((kernel.entry, int(value)))
        return (R.CUDA_SUCCESS,)

    def cuTensorMapEncodeTiled(
        self, dtype: Any, rank: Any, address: Any, dims: Any, strides: Any, box: Any, element_strides: Any,
        interleave: Any, swizzle: Any, l2: Any, oob: Any,
    ) -> tuple:  # fmt: skip
        """Every rule the driver documents for a tiled map with interleave NONE; a CUtensorMap
        whose bytes encode what was given (decode_tensor_map reads them back). As the bindings
        do, a TypeError for array elements that are not cuuint64_t (dims, strides) or cuuint32_t
        (box, element strides)."""
        for name, values, kind in (
            ("globalDim", dims, driver.cuuint64_t), ("globalStrides", strides, driver.cuuint64_t),
            ("boxDim", box, driver.cuuint32_t), ("elementStrides", element_strides, driver.cuuint32_t),
        ):  # fmt: skip
            if any(not isinstance(v, kind) for v in values or []):
                raise TypeError(f"cuTensorMapEncodeTiled: {name}: Cannot convert int to cuda.bindings.driver.{kind.__name__}")
        why = tensor_map_refusal(dtype, rank, address, dims, strides, box, element_strides, interleave, swizzle, l2, oob)
        if why is None and self.current() is None:
            why = "no current context"
        if why is not None:
            self.refused.append(f"CUDA_ERROR_INVALID_VALUE: cuTensorMapEncodeTiled: {why}")
            return R.CUDA_ERROR_INVALID_VALUE, None
        tensor_map = driver.CUtensorMap()
        words = encode_tensor_map(int(dtype), int(rank), int(address), [int(d) for d in dims], [int(s) for s in strides],
                                  [int(b) for b in box], [int(e) for e in element_strides], int(swizzle), int(l2), int(oob))  # fmt: skip
        ctypes.memmove(int(tensor_map.getPtr()), struct.pack("<16Q", *words), TENSOR_MAP_BYTES)
        self.encoded += 1
        return R.CUDA_SUCCESS, tensor_map

    @staticmethod
    def _code(exc: CUDAError) -> Any:
        """The CUresult of a refusal (its message starts with the error's name)."""
        return getattr(R, str(exc).split(":")[0])

    # -- cuda.core's launch (the tuning worker's) -------------------------------------------------

    def launch(self, stream: Any, config: Any, kernel: Any, *args: Any) -> None:
        if not isinstance(config, LaunchConfig):
            raise TypeError(f"launch(): config must be a cuda.core LaunchConfig, got {type(config).__name__}")
        if not isinstance(kernel, FakeKernel):
            raise TypeError(f"launch(): kernel must be a cuda.core Kernel, got {type(kernel).__name__}")
        if not isinstance(stream, FakeStream):
            raise TypeError(f"launch(): stream must be a cuda.core Stream, got {type(stream).__name__}")
        if self.current() is None:
            raise self.refuse("CUDA_ERROR_INVALID_CONTEXT", f"{kernel.entry}: no current context in this thread")
        sizes = kernel.params
        if len(args) != len(sizes):
            raise self.refuse("CUDA_ERROR_INVALID_VALUE", f"{kernel.entry}: {len(args)} arguments for {len(sizes)} parameters")
        for i, (value, size) in enumerate(zip(args, sizes)):
            if packed_size(value) != size:
                raise self.refuse(
                    "CUDA_ERROR_INVALID_VALUE",
                    f"{kernel.entry}: argument {i} is packed as {packed_size(value)} bytes ({type(value).__name__}); the kernel's parameter is {size} bytes",
                )
        holder = ParamHolder(args)  # cuda.core's own packing, as launch() does it
        addresses = (ctypes.c_void_p * len(args)).from_address(holder.ptr)
        values = [ctypes.string_at(addresses[i], size) for i, size in enumerate(sizes)]
        self._run(kernel, stream, tuple(config.grid), tuple(config.block), config.shmem_size, values)

    def _run(
        self,
        kernel: FakeKernel,
        stream: FakeStream,
        grid: tuple,
        block: tuple,
        shmem: int,
        params: list[bytes],
        cluster: tuple | None = None,
    ) -> None:
        """What both launches check of the device, then the launch recorded and emulated."""
        device = self.current()
        if stream.ordinal is not None and stream.ordinal != device:
            raise self.refuse(
                "CUDA_ERROR_INVALID_HANDLE", f"{kernel.entry}: stream of device {stream.ordinal} in a context of device {device}"
            )
        kernel.check_runs_on(self, device)
        block, grid = tuple(int(b) for b in block), tuple(int(g) for g in grid)
        if stream.handle in self.capturing:  # captured, not run: a kernel node with its parameters' bytes as they are now
            self.capturing[stream.handle].append(("kernel", kernel, grid, block, shmem, params, cluster))
            return
        if block[0] * block[1] * block[2] > 1024 or block[2] > 64 or min(block) < 1:
            raise self.refuse("CUDA_ERROR_INVALID_VALUE", f"{kernel.entry}: block {block}")
        if grid[0] >= 2**31 or grid[1] > 65535 or grid[2] > 65535 or min(grid) < 1:
            raise self.refuse("CUDA_ERROR_INVALID_VALUE", f"{kernel.entry}: grid {grid}")
        limit = shared_optin(self.devices[device].cc)
        if shmem + kernel.static_shared > limit:
            raise self.refuse(
                "CUDA_ERROR_INVALID_VALUE",
                f"{kernel.entry}: {shmem} B dynamic + {kernel.static_shared} B static shared memory > the opt-in limit {limit}",
            )
        if shmem > kernel.max_dynamic_shared:
            raise self.refuse(
                "CUDA_ERROR_INVALID_VALUE",
                f"{kernel.entry}: {shmem} B dynamic shared memory; the function allows {kernel.max_dynamic_shared} (cuFuncSetAttribute not called)",
            )
        in_graph, state = getattr(self.tls, "in_graph", False), self.devices[device]
        record = Launch(
            kernel.entry, kernel.binary, device, stream, grid, block, shmem, params, threading.get_ident(), len(self.stack), cluster,
            in_graph, state.l2_cold,
        )  # fmt: skip
        state.l2_cold = False  # what it read is in the L2 now
        with self.lock:
            self.launches.append(record)
        emulate = EMULATORS.get(kernel.entry)
        if emulate is not None and self.devices[device].sticky_error is None:
            try:
                stream.clock_ms += emulate(self, kernel, record)
            except IllegalAddress:
                self.devices[device].sticky_error = "CUDA_ERROR_ILLEGAL_ADDRESS"
            except Hang:
                stream.hung = True


class IllegalAddress(Exception):
    """An emulated kernel touched memory outside every allocation."""


class Hang(Exception):
    """An emulated kernel never finishes."""


# Emulated kernels, by entry name: fn(standin, kernel, launch) -> synthetic milliseconds. An
# emulator reads and writes device memory through standin.view().
EMULATORS: dict[str, Callable[[StandIn, FakeKernel, Launch], float]] = {}


# ---- cuda.core's objects ---------------------------------------------------------------------


class FakeKernel:
    """A kernel of a loaded cubin or PTX: its entry and what its binary declares."""

    def __init__(self, code: FakeObjectCode, entry: str):
        self.code, self.entry = code, entry
        try:
            if code.kind == "ptx":
                self.params = ptx_params(code.data.decode(), entry)
                self.binary = "compute_" + re.search(r"^\s*\.target\s+sm_(\d+)", code.data.decode(), re.M).group(1)
                self.offsets: list[int] | None = None  # PTX says no constant-bank offsets
                self.cluster: tuple[int, int, int] | None = None
                self.static_shared = 0
            else:
                self.params = cubin_params(code.data, entry)
                self.offsets = cubin_param_offsets(code.data, entry)
                self.cluster = cubin_cluster(code.data, entry)
                self.static_shared = cubin_static_shared(code.data, entry)
                major, minor = cubin_cc(code.data)
                self.binary = f"sm_{major}{minor}"
        except KeyError:
            raise driver_error("CUDA_ERROR_NOT_FOUND", f"no kernel named {entry!r} in the module") from None
        self.tag = code.tag
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: what a launch may ask without the opt-in
        self.max_dynamic_shared = max(DEFAULT_SHARED - self.static_shared, 0)

    @property
    def cc(self) -> tuple[int, int]:
        """The compute capability the function's binary targets (PTX: its .target)."""
        number = int(self.binary.rpartition("_")[2].rstrip("af"))
        return number // 10, number % 10

    def check_runs_on(self, standin: StandIn, device: int) -> None:
        self.check_code_runs_on(self.code, standin, device)

    @staticmethod
    def check_code_runs_on(code: FakeObjectCode, standin: StandIn, device: int) -> None:
        cc = standin.devices[device].cc
        if code.kind == "ptx":
            text = code.data.decode()
            isa = ptx_isa(text)
            minor = standin.version % 1000 // 10  # CUDA 13.x JITs ISA 9.x; 12.0-12.5 ISA 8.0-8.5, 12.6-12.9 ISA 8.5-8.8
            supported = (9, minor) if standin.version >= 13000 else (8, minor if minor <= 5 else minor - 1)
            if isa > supported:
                raise standin.refuse("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", f"PTX ISA {isa[0]}.{isa[1]} on driver {standin.version}")
            target = int(re.search(r"^\s*\.target\s+sm_(\d+)", text, re.M).group(1))
            if target > cc[0] * 10 + cc[1]:
                raise standin.refuse("CUDA_ERROR_NO_BINARY_FOR_GPU", f"compute_{target} PTX on sm_{cc[0]}{cc[1]}")
        else:
            major, minor = cubin_cc(code.data)
            if code.data[8] >= 8 and standin.version < 13000:  # ELF ABI 8: NVRTC 13's cubins, which CUDA 12 drivers refuse
                raise standin.refuse(
                    "CUDA_ERROR_INVALID_IMAGE", f"a cubin of ELF ABI version {code.data[8]} (CUDA 13) on driver {standin.version}"
                )
            if major != cc[0] or minor > cc[1]:
                raise standin.refuse("CUDA_ERROR_NO_BINARY_FOR_GPU", f"sm_{major}{minor} cubin on sm_{cc[0]}{cc[1]}")


_TAG = re.compile(rb"EMU:([A-Za-z0-9_=;.\-]+)")


class FakeObjectCode:
    STANDIN_ONLY = frozenset({"data", "kind", "tag"})

    def __init__(self, data: bytes, kind: str):
        self.data, self.kind = bytes(data), kind
        m = _TAG.search(self.data)  # an emulated kernel's config, from a string its template embeds
        self.tag = dict(item.split("=", 1) for item in m.group(1).decode().split(";")) if m else {}

    @classmethod
    def from_cubin(cls, data: bytes) -> FakeObjectCode:
        return cls(data, "cubin")

    @classmethod
    def from_ptx(cls, data: bytes) -> FakeObjectCode:
        return cls(data, "ptx")

    def get_kernel(self, name: str) -> FakeKernel:
        return FakeKernel(self, name)


class FakeEvent:
    STANDIN_ONLY = frozenset({"stream", "ms"})

    def __init__(self, stream: FakeStream):
        self.stream, self.ms = stream, stream.clock_ms

    def sync(self) -> None:
        self.stream.sync()

    def __sub__(self, other: FakeEvent) -> float:
        return self.ms - other.ms


class FakeStream:
    """A stream of one device (None: a legacy/per-thread default handle, any current context)."""

    STANDIN_ONLY = frozenset({"standin", "ordinal", "clock_ms", "hung"})  # not part of cuda.core's Stream

    def __init__(self, standin: StandIn, handle: int, device: int | None):
        self.standin, self._handle, self.ordinal = standin, handle, device
        self.clock_ms = 0.0
        self.hung = False

    @property
    def handle(self) -> int:
        return self._handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return 0, self._handle

    @classmethod
    def from_handle(cls, handle: int) -> FakeStream:
        standin = _ACTIVE[0]
        found = standin.streams.get(int(handle))
        if found is None:
            if int(handle) not in LEGACY_STREAMS:
                raise standin.refuse("CUDA_ERROR_INVALID_HANDLE", f"no stream {int(handle):#x}")
            found = cls(standin, int(handle), None)
        return found

    def record(self, event: Any = None, options: Any = None) -> FakeEvent:
        if self._handle in self.standin.capturing:  # the tuner records no events while it captures
            raise self.standin.refuse("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "an event recorded on a capturing stream")
        return FakeEvent(self)

    def sync(self) -> None:
        if self._handle in self.standin.capturing:
            raise self.standin.refuse("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "a capturing stream synchronised")
        if self.hung:
            time.sleep(3600)
        device = self.ordinal if self.ordinal is not None else self.standin.current()
        if device is not None and self.standin.devices[device].sticky_error:
            raise driver_error(self.standin.devices[device].sticky_error, "an earlier kernel failed")


class _Properties:
    def __init__(self, standin: StandIn, device: int):
        self.max_threads_per_block = 1024
        self.max_registers_per_block = 65536
        self.max_shared_memory_per_block = 49152
        self.l2_cache_size = L2_BYTES
        self.multiprocessor_count = 132


class FakeDevice:
    """cuda.core's Device: per-thread `set_current()` before most calls, as cuda.core requires."""

    STANDIN_ONLY = frozenset({"standin"})

    def __init__(self, device_id: int | None = None):
        standin = _ACTIVE[0]
        if device_id is None:
            device_id = standin.current() or 0
        if not 0 <= device_id < len(standin.devices):
            raise ValueError(f"device_id must be within [0, {len(standin.devices)}), got {device_id}")
        self.standin, self.device_id = standin, device_id
        standin.initialised = True  # cuda.core's Device() calls cuInit

    def _ready(self, what: str) -> None:
        if self.device_id not in getattr(self.standin.tls, "inited", set()):
            raise CUDAError(f"Device {self.device_id} is not yet initialized, perhaps you forgot to call .set_current() first? ({what})")

    def set_current(self) -> None:
        self.standin.cuCtxSetCurrent(0xC000 + self.device_id)
        if not hasattr(self.standin.tls, "inited"):
            self.standin.tls.inited = set()
        self.standin.tls.inited.add(self.device_id)

    @property
    def name(self) -> str:
        return self.standin.devices[self.device_id].name

    @property
    def compute_capability(self) -> tuple[int, int]:
        return self.standin.devices[self.device_id].cc

    @property
    def properties(self) -> _Properties:
        return _Properties(self.standin, self.device_id)

    @property
    def default_stream(self) -> FakeStream:
        return FakeStream(self.standin, 1, None)  # CU_STREAM_LEGACY: the current context's

    def create_stream(self) -> FakeStream:
        self._ready("create_stream")
        with self.standin.lock:
            self.standin._next_stream += 0x10
            stream = FakeStream(self.standin, self.standin._next_stream, self.device_id)
            self.standin.streams[stream.handle] = stream
        return stream

    def sync(self) -> None:
        self._ready("sync")
        err = self.standin._sticky(self.device_id)
        if err != R.CUDA_SUCCESS:
            raise driver_error(err.name)


_ACTIVE: list[StandIn] = []  # the stand-in that FakeDevice() and FakeStream.from_handle() answer for


def install(
    monkeypatch: Any, runtime: ModuleType | None = None, ccs=((9, 0),), driver_version: int = 13000, present: bool = True
) -> StandIn:
    """A stand-in for one test, handed to `runtime` (hatch_autotune.runtime or a generated
    package's _runtime) through `runtime.use_gpu`; the test's fixture calls
    `runtime.use_gpu(None)` afterwards. Without a runtime, only the stand-in's own objects work."""
    standin = StandIn(ccs, driver_version, present)
    monkeypatch.setattr(sys.modules[__name__], "_ACTIVE", [standin])
    if runtime is not None:
        runtime.use_gpu(standin.api())
    return standin


def install_globally(ccs=((9, 0),), driver_version: int = 13000, runtime: ModuleType | None = None) -> StandIn:
    """For a whole process (the tuning worker, a benchmark): `runtime` (hatch_autotune.runtime
    unless given) runs over a stand-in until the process ends."""
    global _ACTIVE
    standin = StandIn(ccs, driver_version)
    _ACTIVE = [standin]
    runtime = runtime or hatch_autotune.runtime
    runtime.use_gpu(standin.api(runtime))
    return standin


# ---- arrays a test hands to kernels ----------------------------------------------------------


class DeviceArray:
    """An array in the stand-in's device memory, exposing __cuda_array_interface__ like CuPy."""

    def __init__(self, standin: StandIn, host: np.ndarray, device: int = 0):
        self.standin, self.device = standin, device
        self.shape, self.dtype = host.shape, host.dtype
        self.ptr = standin.alloc(device, host.nbytes) if host.size else 0
        if host.size and host.any():
            standin.view(self.ptr, host.dtype.str, host.size)[...] = host.ravel()
        self.__cuda_array_interface__ = {
            "shape": tuple(host.shape),
            "typestr": host.dtype.str,
            "data": (self.ptr, False),
            "strides": None,
            "version": 3,
        }

    @classmethod
    def empty(cls, standin: StandIn, shape: tuple[int, ...], dtype: str = "float32", device: int = 0) -> DeviceArray:
        """Unread memory (made lazily), for launches whose data nothing looks at."""
        return cls(standin, np.zeros((0,), dtype), device)._as(shape)

    def _as(self, shape: tuple[int, ...]) -> DeviceArray:
        n = int(np.prod(shape))
        self.shape = tuple(shape)
        self.ptr = self.standin.alloc(self.device, n * self.dtype.itemsize) if n else 0
        self.__cuda_array_interface__ = {**self.__cuda_array_interface__, "shape": tuple(shape), "data": (self.ptr, False)}
        return self

    def get(self) -> np.ndarray:
        if not self.ptr:
            return np.zeros(self.shape, self.dtype)
        return self.standin.view(self.ptr, self.dtype.str, int(np.prod(self.shape))).reshape(self.shape).copy()
