"""The CUDA seam (GPU only). Every CUDA call of the runtime, and of the tuning worker, goes
through one `CudaApi`; every driver result goes through `check_cuda`; all that the runtime
learns from the driver lives in one `GpuState`. The seam for tests is `use_gpu(api)`: it puts
a stand-in driver under the real call path, from a clean state. cuda-python is imported at the
first launch or device query, never at import."""

from __future__ import annotations

import os
import re
import sys
from _thread import allocate_lock  # threading.Lock itself, without importing threading

from .errors import CudaCallError, NoDriverError
from .record import Record

try:  # weakref.WeakSet itself, from its small pure-Python module (weakref imports more)
    from _weakrefset import WeakSet
except ImportError:  # pragma: no cover - depends on the interpreter
    from weakref import WeakSet

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from typing import Any, Callable, Protocol, Sequence

    class PlanHolder(Protocol):
        """A kernel, as GpuState sees it: it holds plans made over a state, and drops them."""

        def _drop_plans(self) -> None: ...


CACHE_LIMIT = 4096  # memo entries (a kernel's distinct sizes, wrapped stream handles) before a clear


def check_cuda(result: Sequence[Any], call: str) -> Any:
    """The one funnel for cuda-bindings results, driver (CUresult) and NVRTC (nvrtcResult)
    alike: `result` is (err, *values). Returns None, the one value or a tuple of the values;
    CudaCallError naming `call` and the error (e.g. CUDA_ERROR_OUT_OF_MEMORY) otherwise."""
    err = result[0]
    if int(err):  # CUDA_SUCCESS and NVRTC_SUCCESS are both 0
        raise CudaCallError(call, getattr(err, "name", str(err)))
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else tuple(result[1:])


_NO_DRIVER_HINT = (
    "running a kernel needs an NVIDIA GPU and its driver; `<kernel>.select(arch='sm_90', ...)` "
    "shows which variant would run, without either"
)

# cuda-core before 0.5 had its API under `cuda.core.experimental` only.
MIN_CUDA_CORE = (0, 5)
_VERSION_RE = re.compile(r"""__version__\s*=\s*(?:version\s*=\s*)?['"](\d+)\.(\d+)""")


def check_cuda_core(path: Sequence[str] | None = None) -> None:
    """ImportError, at import, when the cuda-core Python would import predates the `cuda.core`
    API. Reads its _version.py instead of importing it (that takes ~300 ms and may load CUDA);
    a missing cuda-core is not an error here: `select(arch=...)` needs none."""
    for entry in sys.path if path is None else path:
        core = os.path.join(entry or ".", "cuda", "core")
        if os.path.isdir(core):
            break
    else:
        return
    try:
        with open(os.path.join(core, "_version.py"), encoding="utf-8") as f:
            m = _VERSION_RE.search(f.read())
    except OSError:
        m = None
    version = (int(m.group(1)), int(m.group(2))) if m else None
    legacy = os.path.isdir(os.path.join(core, "experimental")) and not os.path.isdir(os.path.join(core, "cu13"))
    if (version is not None and version < MIN_CUDA_CORE) or (version is None and legacy):
        found = f"{version[0]}.{version[1]}" if version else "an unknown version"
        raise ImportError(
            f"hatch-autotune kernels need cuda-core >= {MIN_CUDA_CORE[0]}.{MIN_CUDA_CORE[1]} (the `cuda.core` API); "
            f"{core} is cuda-core {found}, whose API is only under `cuda.core.experimental`: "
            "upgrade it with `pip install -U cuda-core`"
        )


class CudaApi(Record):
    """Every CUDA name that the runtime and the tuning worker call, in one object, so that a
    test can hand them a stand-in: cuda.bindings' `driver` module (its cu* functions and the
    CUresult, CUdevice_attribute and CUpointer_attribute enums) and six names of cuda.core."""

    __slots__ = ("driver", "Device", "Stream", "LaunchConfig", "ObjectCode", "EventOptions", "launch")
    driver: Any
    Device: Any
    Stream: Any
    LaunchConfig: Any
    ObjectCode: Any
    EventOptions: Any
    launch: Callable[..., None]

    @classmethod
    def load(cls, driver: Any = None) -> CudaApi:
        """The real ones, from cuda-bindings and cuda-core; ImportError for a cuda-core too old."""
        if driver is None:
            from cuda.bindings import driver as bindings_driver

            driver = bindings_driver
        try:
            from cuda.core import Device, EventOptions, LaunchConfig, ObjectCode, Stream, launch
        except ImportError as exc:
            need = ".".join(map(str, MIN_CUDA_CORE))
            raise ImportError(f"hatch-autotune kernels need cuda-core >= {need} (the `cuda.core` API): {exc}") from None
        return cls(driver, Device, Stream, LaunchConfig, ObjectCode, EventOptions, launch)

    def replace(self, **changes: Any) -> CudaApi:
        """A copy with some names replaced (e.g. a counting `launch`)."""
        return type(self)(**{**{n: getattr(self, n) for n in self.__slots__}, **changes})


class GpuState:
    """What the runtime learns from CUDA, once per process: the API it calls, the device count
    and driver version, per-device facts and objects, and which kernels hold plans over it."""

    # `api` as the methods that run only after start() read it: not Optional, so that the
    # launch path needs no None check. Set with `api` by start(), unset before.
    _api: CudaApi

    def __init__(self, api: CudaApi | None = None):
        self._given = api  # None: the real cuda-bindings and cuda-core, imported at the first launch
        self.api: CudaApi | None = None  # set once the driver has started
        self.single_device: int | None = None  # the one device's ordinal; None with several
        self.driver_version = (0, 0)
        self.cc: dict[int, tuple[int, int]] = {}
        self.primary: dict[int, Any] = {}
        self.default_streams: dict[int, Any] = {}
        self.handle_streams: dict[int, Any] = {}
        self.planners: WeakSet[PlanHolder] = WeakSet()  # kernels whose plans hold this API's objects
        self.lock = allocate_lock()

    def start(self) -> CudaApi:
        """Initialise the driver and the API, once; NoDriverError without a driver or device."""
        api = self.api
        if api is not None:
            return api
        with self.lock:
            if self.api is not None:
                return self.api
            try:
                if self._given is not None:
                    driver = self._given.driver
                else:
                    from cuda.bindings import driver as bindings_driver

                    driver = bindings_driver
                (err,) = driver.cuInit(0)
            except Exception as exc:  # cuda.pathfinder's DynamicLibNotFoundError when libcuda is absent
                raise NoDriverError(f"no CUDA driver found ({type(exc).__name__}: {exc}); {_NO_DRIVER_HINT}") from None
            if int(err):  # not check_cuda: a driver that does not start means "no GPU", said as NoDriverError
                raise NoDriverError(f"the CUDA driver did not initialise ({getattr(err, 'name', err)}); {_NO_DRIVER_HINT}")
            count = check_cuda(driver.cuDeviceGetCount(), "cuDeviceGetCount")
            if count < 1:
                raise NoDriverError(f"the CUDA driver sees no device; {_NO_DRIVER_HINT}")
            version = check_cuda(driver.cuDriverGetVersion(), "cuDriverGetVersion")
            api = self._given if self._given is not None else CudaApi.load(driver)
            self.single_device = 0 if count == 1 else None
            self.driver_version = (version // 1000, (version % 1000) // 10)
            self._api = api
            self.api = api
            return api

    def forget(self) -> None:
        """Drop the plans that kernels made over this state (loaded code, streams, configs)."""
        for kernel in list(self.planners):
            kernel._drop_plans()
        self.planners.clear()

    def device_cc(self, device: int) -> tuple[int, int]:
        cc = self.cc.get(device)
        if cc is None:
            driver = self._api.driver
            attr = driver.CUdevice_attribute
            what = f"cuDeviceGetAttribute (compute capability of device {device})"
            major = check_cuda(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), what)
            minor = check_cuda(driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), what)
            cc = self.cc.setdefault(device, (int(major), int(minor)))
        return cc

    def current_device(self) -> int | None:
        """The device of the calling thread's current context, None when it has none (the
        driver's error here is that answer, not a failure: no check_cuda)."""
        err, dev = self._api.driver.cuCtxGetDevice()
        return None if err else int(dev)

    def pointer_device(self, ptr: int) -> int | None:
        """Device ordinal of a device pointer; None when it is not device memory (the driver's
        error here is that answer, not a failure: no check_cuda)."""
        driver = self._api.driver
        err, ordinal = driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
        return None if err else int(ordinal)

    def primary_context(self, device: int) -> Any:
        ctx = self.primary.get(device)
        if ctx is None:
            found = check_cuda(self._api.driver.cuDevicePrimaryCtxRetain(device), f"cuDevicePrimaryCtxRetain (device {device})")
            ctx = self.primary.setdefault(device, found)
        return ctx

    def on_device(self, device: int) -> _OnDevice:
        """A block with `device` current in the calling thread (see _OnDevice)."""
        return _OnDevice(self, device)

    def launch(self, device: int, stream: Any, config: Any, kernel: Any, c_args: Sequence[Any]) -> None:
        """Launch with `device` current in the calling thread: as it is when the caller's
        context is already on that device, else its primary context pushed and popped, so that
        any thread can call and the caller's current device never changes."""
        if self.current_device() == device:
            self._api.launch(stream, config, kernel, *c_args)
            return
        with _OnDevice(self, device):
            self._api.launch(stream, config, kernel, *c_args)

    def launch_stream(self, stream: Any, handle: int | None, device: int) -> Any:
        """What to launch on: a cuda.core Stream as given; the device's default stream for None;
        anything else by its handle, wrapped once (Stream.from_handle costs microseconds)."""
        api = self._api
        if isinstance(stream, api.Stream):
            return stream
        if handle is None:
            found = self.default_streams.get(device)
            if found is None:
                with _OnDevice(self, device):
                    found = self.default_streams.setdefault(device, api.Device(device).default_stream)
            return found
        found = self.handle_streams.get(handle)
        if found is None:
            if len(self.handle_streams) >= CACHE_LIMIT:
                self.handle_streams.clear()
            found = self.handle_streams.setdefault(handle, api.Stream.from_handle(handle))
        return found


class _OnDevice:
    """Run a block with `device`'s primary context current, restoring the caller's afterwards,
    so that loading or launching never changes which device CuPy or PyTorch consider current."""

    __slots__ = ("gpu", "device", "pushed")

    def __init__(self, gpu: GpuState, device: int):
        self.gpu, self.device, self.pushed = gpu, device, False

    def __enter__(self) -> None:
        gpu = self.gpu
        if gpu.current_device() == self.device:
            return
        check_cuda(gpu._api.driver.cuCtxPushCurrent(gpu.primary_context(self.device)), f"cuCtxPushCurrent (device {self.device})")
        self.pushed = True

    def __exit__(self, *exc: Any) -> None:
        if self.pushed:
            result = self.gpu._api.driver.cuCtxPopCurrent()
            if exc[0] is None:  # a failure inside the block is the one to report, not the pop's
                check_cuda(result, f"cuCtxPopCurrent (device {self.device})")


# The process's one state; replaced only by use_gpu. Read it as `cuda_seam.current` at each use,
# never imported by name: a name bound at import would keep the state use_gpu replaced.
current = GpuState()


def use_gpu(api: CudaApi | None = None) -> GpuState:
    """Run this process's kernels over `api` (None: the real cuda-bindings and cuda-core), from
    a fresh state; kernels drop their plans made over the previous one. The seam that tests use
    to put a stand-in driver under the real call path. Not while other threads launch."""
    global current
    old, current = current, GpuState(api)
    old.forget()
    return current


def cuda_api() -> CudaApi:
    """The started CUDA API of this process (the one `use_gpu` set), for code outside the
    runtime that calls CUDA, such as the tuning worker; NoDriverError without a driver."""
    return current.start()


def current_device_cc(device_id: int | None = None) -> tuple[int, int]:
    """Compute capability of a CUDA device (None: the calling thread's current device, else 0);
    NoDriverError without a driver or device."""
    gpu = current
    gpu.start()
    if device_id is None:
        device_id = gpu.current_device()
    return gpu.device_cc(0 if device_id is None else device_id)
