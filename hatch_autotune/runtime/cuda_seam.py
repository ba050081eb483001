"""The CUDA seam (GPU only). Every CUDA call of the runtime, and of the tuning worker, goes
through one `CudaApi`; every driver result goes through `check_cuda`; all that the runtime
learns from the driver lives in one `GpuState`. The seam for tests is `use_gpu(api)`: it puts
a stand-in driver under the real call path, from a clean state. The runtime's own driver is
libcuda through ctypes (libcuda.py), loaded at the first launch or device query, never at
import; code beyond the call path (the tuning worker: memory, streams, events) calls
cuda-bindings and cuda-core (`CudaApi.load`, `cuda_api`)."""

from __future__ import annotations

import os
from _thread import allocate_lock  # threading.Lock itself, without importing threading

from .drivers import bindings_refusal, installed_bindings
from .errors import CudaCallError, DriverTooOldError, NoDriverError

try:  # weakref.WeakSet itself, from its small pure-Python module (weakref imports more)
    from _weakrefset import WeakSet
except ImportError:  # pragma: no cover - depends on the interpreter
    from weakref import WeakSet

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Sequence
    from typing import Any, Protocol

    class PlanHolder(Protocol):
        """A kernel, as GpuState sees it: it holds plans made over a state, and drops them."""

        def _drop_plans(self) -> None: ...


DEFAULT_SHARED = 48 * 1024  # the shared memory per block (static and dynamic) that needs no opt-in
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


CU_STREAM_LEGACY, CU_STREAM_PER_THREAD = 0x1, 0x2  # the driver's special stream handles
PER_THREAD_VARIABLE = "CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM"

_NO_DRIVER_HINT = (
    "running a kernel needs an NVIDIA GPU and its driver; `<kernel>.select(arch='sm_90', ...)` "
    "shows which variant would run, without either"
)

# cuda-core before 0.5 had its API under `cuda.core.experimental` only (the tuning worker's need).
MIN_CUDA_CORE = (0, 5)
_CORE_NAMES = ("Device", "Stream", "LaunchConfig", "ObjectCode", "EventOptions", "launch")


class CudaApi:
    """Every CUDA name that the runtime and the tuning worker call, in one object, so that a
    test can hand them a stand-in: a `driver` shaped as cuda.bindings' driver module (its cu*
    functions and enums: the runtime's own libcuda.LibCuda, cuda-bindings' module itself for
    the tuning worker, or the tests' stand-in), which is all that a call of a kernel uses, and
    six names of cuda.core for the tuning worker (Device, Stream, LaunchConfig,
    ObjectCode, EventOptions, launch), imported at their first use: cuda.core takes hundreds of
    milliseconds to import (it imports NVML and its program compiler), which a first call must
    not pay."""

    __slots__ = ("driver", "bindings", "_core")
    CORE_NAMES = _CORE_NAMES

    def __init__(self, driver: Any, *core: Any, bindings: tuple[int, int] | None = None, **named: Any):
        self.driver = driver
        self.bindings = bindings  # the cuda-bindings (major, minor) that `driver` is; None: unknown
        given = {**dict(zip(_CORE_NAMES, core)), **named}
        unknown = sorted(set(given) - set(_CORE_NAMES))
        if unknown:
            raise TypeError(f"CudaApi: unknown name(s) {unknown}; expected some of {list(_CORE_NAMES)}")
        self._core: dict[str, Any] | None = given if len(given) == len(_CORE_NAMES) else None
        if self._core is None and given:
            raise TypeError(f"CudaApi: give all of cuda.core's names or none (given {sorted(given)})")

    def __getattr__(self, name: str) -> Any:  # only for names that are not slots: cuda.core's
        if name not in _CORE_NAMES:
            raise AttributeError(name)
        core = self._core
        if core is None:
            core = self._core = _load_core()
        return core[name]

    @classmethod
    def libcuda(cls, path: str | None = None) -> CudaApi:
        """The runtime's own driver: libcuda through ctypes (OSError where there is none)."""
        from .libcuda import LIBRARY, LibCuda

        return cls(LibCuda(path or LIBRARY))

    @classmethod
    def load(cls, driver: Any = None) -> CudaApi:
        """The real driver bindings (cuda-bindings), for code beyond the call path that needs
        more of CUDA than libcuda.py declares; cuda.core's names come at their first use."""
        if driver is None:
            from cuda.bindings import driver as bindings_driver

            driver = bindings_driver
        return cls(driver, bindings=installed_bindings())

    def replace(self, **changes: Any) -> CudaApi:
        """A copy with some names replaced (e.g. a counting `driver`)."""
        driver = changes.pop("driver", self.driver)
        if not changes:
            return type(self)(driver, bindings=self.bindings, **(self._core or {}))
        core = {n: changes.pop(n) if n in changes else getattr(self, n) for n in _CORE_NAMES}
        if changes:
            raise TypeError(f"CudaApi.replace: unknown name(s) {sorted(changes)}")
        return type(self)(driver, bindings=self.bindings, **core)


def _load_core() -> dict[str, Any]:
    """cuda.core's names that the tuning worker uses; ImportError for a cuda-core too old."""
    try:
        from cuda.core import Device, EventOptions, LaunchConfig, ObjectCode, Stream, launch
    except ImportError as exc:
        need = ".".join(map(str, MIN_CUDA_CORE))
        raise ImportError(f"hatch-autotune needs cuda-core >= {need} (the `cuda.core` API): {exc}") from None
    return {
        "Device": Device,
        "Stream": Stream,
        "LaunchConfig": LaunchConfig,
        "ObjectCode": ObjectCode,
        "EventOptions": EventOptions,
        "launch": launch,
    }


class GpuState:
    """What the runtime learns from CUDA, once per process: the API it calls, the device count
    and driver version, per-device facts and objects, and which kernels hold plans over it."""

    # `api` (and its driver) as the methods that run only after start() read them: not Optional,
    # so that the launch path needs no None check. Set with `api` by start(), unset before.
    _api: CudaApi
    driver: Any

    def __init__(self, api: CudaApi | None = None):
        self._given = api  # None: libcuda through ctypes (CudaApi.libcuda), loaded at the first launch
        # how the fast path launches over this state's driver (fastcall.py): "ctypes" (libcuda.py's
        # kept-argument entry points) or "tuple" (a driver shaped as cuda-bindings': the stand-in, cuda-bindings)
        self.kind = "ctypes" if api is None else getattr(api.driver, "kind", "tuple")
        self.api: CudaApi | None = None  # set once the driver has started
        self.single_device: int | None = None  # the one device's ordinal; None with several
        self.driver_version = (0, 0)
        self.cc: dict[int, tuple[int, int]] = {}
        self.primary: dict[int, Any] = {}
        self.primary_handles: dict[int, int] = {}  # the same contexts as ints: what cuCtxGetCurrent is compared with
        # What stream=None launches on when the arrays' library has no current stream of its own:
        # the current context's legacy default stream, or its per-thread one where cuda-python
        # is told to use that (cuda.core's Device.default_stream reads the same variable).
        self.default_stream = CU_STREAM_PER_THREAD if os.environ.get(PER_THREAD_VARIABLE, "0") not in ("", "0") else CU_STREAM_LEGACY
        self.planners: WeakSet[PlanHolder] = WeakSet()  # kernels whose plans hold this API's objects
        self.lock = allocate_lock()
        self.shared_optin: dict[int, int] = {}  # device -> its opt-in shared memory per block, bytes
        self.shared_allowed: dict[int, tuple[int, int]] = {}  # function (int) -> (static bytes, dynamic bytes allowed)
        self.tensor_maps: dict[Any, Any] = {}  # tensor_map.encoder's cache: a layout -> its TensorMapEncoder

    def start(self) -> CudaApi:
        """Initialise the driver and the API, once; NoDriverError without a driver or device."""
        api = self.api
        if api is not None:
            return api
        with self.lock:
            if self.api is not None:
                return self.api
            try:
                api = self._given if self._given is not None else CudaApi.libcuda()
                driver = api.driver
                (err,) = driver.cuInit(0)
            except Exception as exc:  # OSError without libcuda; cuda.pathfinder's DynamicLibNotFoundError under cuda-bindings
                bindings = None if self._given is None else self._given.bindings
                also = (
                    f" (cuda-bindings {bindings[0]}.{bindings[1]} is installed, which needs a CUDA {bindings[0]} driver)"
                    if bindings
                    else ""
                )
                raise NoDriverError(f"no CUDA driver found ({type(exc).__name__}: {exc}){also}; {_NO_DRIVER_HINT}") from None
            if int(err):  # not check_cuda: a driver that does not start means "no GPU", said as NoDriverError
                raise NoDriverError(f"the CUDA driver did not initialise ({getattr(err, 'name', err)}); {_NO_DRIVER_HINT}")
            count = check_cuda(driver.cuDeviceGetCount(), "cuDeviceGetCount")
            if count < 1:
                raise NoDriverError(f"the CUDA driver sees no device; {_NO_DRIVER_HINT}")
            version = check_cuda(driver.cuDriverGetVersion(), "cuDriverGetVersion")
            driver_version = (version // 1000, (version % 1000) // 10)
            refusal = api.bindings and bindings_refusal(api.bindings, driver_version)
            if refusal:
                raise DriverTooOldError(refusal)
            self.single_device = 0 if count == 1 else None
            self.driver_version = driver_version
            self._api = api
            self.driver = api.driver
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
            self.primary_handles.setdefault(device, int(ctx))
        return ctx

    def in_primary(self, device: int) -> bool:
        """Whether the calling thread's current context is `device`'s primary context, where the
        runtime loads its modules and launches: not merely a context on that device (a module
        loaded in one context cannot be launched in another)."""
        err, ctx = self._api.driver.cuCtxGetCurrent()
        if err:
            return False
        return int(ctx) == self.primary_handle(device)

    def primary_handle(self, device: int) -> int:
        """`device`'s primary context as an int: what cuCtxGetCurrent's answer is compared with."""
        handle = self.primary_handles.get(device)
        if handle is None:
            self.primary_context(device)
            handle = self.primary_handles[device]
        return handle

    def on_device(self, device: int) -> _OnDevice:
        """A block with `device` current in the calling thread (see _OnDevice)."""
        return _OnDevice(self, device)

    def launch(self, device: int, head: tuple[Any, ...], stream: int, params: int, what: str) -> None:
        """cuLaunchKernel(*head, stream, params) in `device`'s primary context: as it is when the
        caller's current context is that one, else pushed and popped, so that any thread can call
        and the caller's current context never changes. `head` is (function, grid x3, block x3,
        shared bytes); `params` the address of the kernel's parameter pointers (params.ParamBuffer)."""
        driver = self.driver
        if self.in_primary(device):
            result = driver.cuLaunchKernel(*head, stream, params, 0)
        else:
            with _OnDevice(self, device):
                result = driver.cuLaunchKernel(*head, stream, params, 0)
        if result[0]:
            self.raise_launch_error(result[0], what)

    def launch_ex(self, device: int, launch: Any, stream: Any, function: Any, params: int, what: str) -> None:
        """cuLaunchKernelEx with a plan's prebuilt CUlaunchConfig (`launch`: launching.ExConfig,
        its grid, block, shared bytes and attributes set once), in `device`'s primary context as
        `launch()` does; only the config's stream is set per call, when it changed."""
        if launch.stream != stream:
            launch.config.hStream = stream
            launch.stream = stream
        driver = self.driver
        if self.in_primary(device):
            result = driver.cuLaunchKernelEx(launch.config, function, params, 0)
        else:
            with _OnDevice(self, device):
                result = driver.cuLaunchKernelEx(launch.config, function, params, 0)
        if result[0]:
            raise CudaCallError(f"cuLaunchKernelEx ({what})", getattr(result[0], "name", str(result[0])))

    @staticmethod
    def raise_launch_error(err: Any, what: str) -> None:
        raise CudaCallError(f"cuLaunchKernel ({what})", getattr(err, "name", str(err)))

    def shared_limit(self, device: int) -> int:
        """The most shared memory (static and dynamic) a block of `device` may use once a
        function opts in (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)."""
        limit = self.shared_optin.get(device)
        if limit is None:
            driver = self._api.driver
            attr = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
            found = check_cuda(driver.cuDeviceGetAttribute(attr, device), f"cuDeviceGetAttribute (opt-in shared memory of device {device})")
            limit = self.shared_optin.setdefault(device, int(found))
        return limit

    def allow_shared(self, device: int, function: Any, nbytes: int, what: str) -> None:
        """Let `function` (loaded on `device`) launch with `nbytes` of dynamic shared memory: past
        the 48 KiB that a block has without asking (less the function's static shared memory),
        CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES is set, once per function and again only
        for a larger size, after the device's opt-in limit is checked: a ValueError naming
        `what` (the kernel and variant), the bytes and the limit, rather than the launch's bare
        CUDA_ERROR_INVALID_VALUE."""
        key = int(function)
        known = self.shared_allowed.get(key)
        if known is not None and nbytes <= known[1]:
            return
        driver = self._api.driver
        if known is None:
            attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
            static = int(check_cuda(driver.cuFuncGetAttribute(attr, function), f"cuFuncGetAttribute (static shared memory of {what})"))
            known = self.shared_allowed[key] = (static, max(DEFAULT_SHARED - static, 0))
            if nbytes <= known[1]:
                return
        static = known[0]
        limit = self.shared_limit(device)
        if nbytes + static > limit:
            cc = self.device_cc(device)
            raise ValueError(
                f"{what}: asks {nbytes} bytes of dynamic shared memory" + (f" (besides {static} bytes of static)" if static else "")
                + f"; device {device} (sm_{cc[0]}{cc[1]}) allows at most {limit} bytes per block"
            )  # fmt: skip
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        with _OnDevice(self, device):
            check_cuda(driver.cuFuncSetAttribute(function, attr, nbytes), f"cuFuncSetAttribute (max dynamic shared memory of {what})")
        self.shared_allowed[key] = (static, nbytes)


class _OnDevice:
    """Run a block with `device`'s primary context current, restoring the caller's afterwards,
    so that loading or launching never changes which device or context CuPy or PyTorch consider
    current (a caller's own context on the same device, from cuCtxCreate, is not the primary
    one: the module would be loaded into it, and fail in every other context)."""

    __slots__ = ("gpu", "device", "pushed")

    def __init__(self, gpu: GpuState, device: int):
        self.gpu, self.device, self.pushed = gpu, device, False

    def __enter__(self) -> None:
        gpu = self.gpu
        if gpu.in_primary(self.device):
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
    runtime that calls CUDA, such as the tuning worker; NoDriverError without a driver. Where
    none was set, cuda-bindings (CudaApi.load): that code needs more of CUDA (memory, streams,
    events) than the runtime's own ctypes driver declares."""
    gpu = current
    if gpu.kind == "ctypes":
        gpu = use_gpu(CudaApi.load())
    return gpu.start()


def current_device() -> tuple[tuple[int, int], tuple[int, int]]:
    """(compute capability, driver's CUDA version) of the calling thread's current device (else
    device 0): what `select()` without an arch answers for. NoDriverError without a driver."""
    return current_device_cc(), current.driver_version


def current_device_cc(device_id: int | None = None) -> tuple[int, int]:
    """Compute capability of a CUDA device (None: the calling thread's current device, else 0);
    NoDriverError without a driver or device."""
    gpu = current
    gpu.start()
    if device_id is None:
        device_id = gpu.current_device()
    return gpu.device_cc(0 if device_id is None else device_id)
