"""The call path from Python arguments to a launch: the fast path of a call whose signature was
seen before (pointers and scalars packed into a parameter buffer, one cuLaunchKernel), and the
checked path of any other call (every check, then the driver started, the device found, the
variant's function loaded once into the device's primary context, and a fast plan recorded).
`Launcher` is handed the kernel's selector and checks; the runtime's Kernel is one."""

from __future__ import annotations

from _thread import allocate_lock  # threading.Lock itself, without importing threading

from . import cuda_seam
from .args import _CODES, CUPY, TORCH, VIA_DLPACK, array_reader, stream_handle
from .cuda_seam import CACHE_LIMIT, CU_STREAM_LEGACY, check_cuda
from .expr import compile_expr
from .fastcall import fast_call
from .launching import FastPlan, LaunchFeatures, launch_env, plan_head, tma_served
from .tensor_map import GLOBAL_ALIGN as TMA_ALIGN
from .values import MAX_SIZE

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from .args import PreparedCall
    from .checks import CallChecks
    from .cuda_seam import GpuState
    from .declaration import KernelDecl
    from .launching import PlanHead
    from .selection import KernelSelector, Selection

# How the fast path takes each argument: an array is its alignment in bytes (1 or more), so that
# one `ptr % kind` checks it; a scalar is 0, a key scalar (its value picks the bucket) -1.
_SCALAR, _KEY_SCALAR = 0, -1


def _arg_kinds(decl: KernelDecl, tma: set[str]) -> dict[str, int]:
    """How the fast path takes each argument (_SCALAR, _KEY_SCALAR, or an array's alignment: at
    least TMA's 16 bytes for an array a map with a `when` reads, so that a misaligned pointer
    takes the checked path, which runs a variant that reads no map)."""
    key_scalars = {k.source for k in decl.key if k.axis is None}
    return {
        a.name: max(a.align or 1, TMA_ALIGN if a.name in tma else 1) if a.is_array else _KEY_SCALAR if a.name in key_scalars else _SCALAR
        for a in decl.args
    }


class Launcher:
    """A kernel's launches: `__call__`, from the arguments to cuLaunchKernel on the right device
    and stream, with the plans and loaded functions that make a repeated call cheap."""

    def __init__(self, selector: KernelSelector, checks: CallChecks):
        decl = selector.decl
        self.name = decl.name
        self.entry = decl.entry
        self._selector = selector
        self.checks = checks
        self._grid = [compile_expr(t) for t in decl.launch.grid]
        self._block = [compile_expr(t) for t in decl.launch.block]
        self._shared = compile_expr(decl.launch.shared)
        self._features = LaunchFeatures(decl)  # the cluster dims and tensor-map boxes (launching.py)
        self._memo: dict[Any, Any] = {}
        self._fast: dict[tuple[Any, ...], FastPlan] = {}
        # Calls that took the checked path (every argument checked, a fast plan recorded); the
        # rest took the fast path. A count that grows with every call says the fast path is
        # missed, e.g. a new stream object per call.
        self.checked_calls = 0
        user_args = checks.user_args
        kinds = _arg_kinds(decl, set(self._features.conditional))
        self._user_kinds: tuple[int, ...] = tuple(kinds[n] for n in user_args)
        optional = {a.name for a in decl.args if a.optional}
        self._optional = tuple(n in optional for n in user_args)  # per argument: an array the caller may pass as None
        c_slot = {a.name: c for c, a in enumerate(decl.args)}
        self._user_slots = tuple(c_slot[n] for n in user_args)  # each argument's C parameter
        # The parameter layout of a plan, per C parameter: whether it is an array (a pointer),
        # its declared dtype (a type parameter's name is resolved per call), and the caller's
        # argument it comes from (None for a scalar computed from the key).
        user_index = {name: i for i, name in enumerate(user_args)}
        self._layout = tuple((a.is_array, a.dtype, user_index.get(a.name)) for a in decl.args)
        self._kernels: dict[tuple[int, str, str], Any] = {}
        self._load_lock = allocate_lock()
        self._plain_class = type(self)  # the class whose __call__ makes the generated one (see __call__)

    # The call path. A first call with a given signature (array types, dtypes, shapes, layouts
    # and devices, scalar types, stream) goes through every check (CallChecks.prepare), then starts the
    # driver, and records a FastPlan per device; later calls with the same signature read each
    # array's pointer (CuPy's and PyTorch's through their own attributes: args.array_reader),
    # check its alignment, pack the pointers and scalars into the plan's parameter buffer and
    # launch, from any thread. The device is the arrays' own (CuPy, PyTorch), the only one, or,
    # with several GPUs and other arrays, the one the driver says they are on. That repeated call
    # is Python generated for this kernel's arguments (fastcall.py), made at the first call.

    def __call__(self, *args: Any, stream: Any = None, **kwargs: Any) -> None:
        """The first call: this kernel's generated call (fastcall.py; made now, not at import: it
        costs a compile) becomes the `__call__` of a class of its own (a subclass of this one,
        so that a call is one Python frame), then serves this call."""
        call = fast_call(self)
        plain = self._plain_class
        namespace = {
            "__call__": call,
            "__slots__": (),
            "__doc__": plain.__doc__,
            "__module__": plain.__module__,
            "__qualname__": plain.__qualname__,
        }
        self.__class__ = type(plain.__name__, (plain,), namespace)
        return call(self, *args, stream=stream, **kwargs)

    def _remake(self, args: tuple[Any, ...], stream: Any, kwargs: dict[str, Any]) -> None:
        """A call that found its generated code made over another driver state: made again."""
        self.__class__ = self._plain_class
        return self(*args, stream=stream, **kwargs)

    def _multi_gpu_device(self, gpu: GpuState, arrays: Sequence[Any], ptrs: Sequence[Any], device: int | None) -> int | None:
        """With several GPUs, the device of a call's arrays: the one the driver says the arrays
        that do not tell (not CuPy's, not PyTorch's) are on, which must be `device` (what the
        others said) where that is known; None when unknown or mixed (the checked path says which)."""
        codes = _CODES
        others = [ptr for obj, ptr in zip(arrays, ptrs) if codes.get(type(obj)) not in (CUPY, TORCH)]
        if not others:
            return device
        found = self._arrays_device(gpu, others)
        return None if found is None or (device is not None and found != device) else found

    @staticmethod
    def _arrays_device(gpu: GpuState, ptrs: Sequence[Any]) -> int | None:
        """The one device that every non-null pointer is on, else None (several GPUs only)."""
        found = None
        for ptr in ptrs:
            if type(ptr) is not int or not 0 <= ptr <= MAX_SIZE:
                return None  # not a pointer: the checked path names it
            if ptr:
                device = gpu.pointer_device(ptr)
                if device is None or (found is not None and device != found):
                    return None
                found = device
        return found

    def _call_checked(self, bound: list[Any], stream: Any, fast_sig: tuple[Any, ...] | None, constants: Mapping[str, Any]) -> None:
        """Every check, then the launch; records a fast plan under `fast_sig` + device."""
        self.checked_calls += 1
        handle = stream_handle(stream)
        gpu = cuda_seam.current
        ordering = gpu.default_stream if handle is None else handle or CU_STREAM_LEGACY  # DLPack forbids stream 0
        call = self.checks.prepare(bound, ordering, constants)
        gpu.start()  # NoDriverError only now, after every check that needs no driver
        gpu.planners.add(self)  # so that use_gpu() drops the plans made below
        device = self._device_of(gpu, call)
        memo_key: tuple[Any, ...] = (device, *map(tuple, (call.types.values(), call.key.values(), call.dims.values())))  # the head's inputs
        if self._features.conditional:  # and what decides whether TMA serves the call
            layouts = self._features.layouts(call)
            memo_key = (*memo_key, layouts)
            fast_sig = fast_sig if all(aligned for *_, aligned in layouts) else None  # a misaligned pointer's fallback: no fast plan
        head = self._memo.get(memo_key)
        if head is None:
            head = self._plan(gpu, device, call)
            if len(self._memo) >= CACHE_LIMIT:
                self._memo.clear()
            self._memo[memo_key] = head
        plan = FastPlan(self, call, head, handle, stream, gpu.primary_handle(device))
        # an empty problem's calls stay on this path: they launch nothing; so do those of an array
        # read through DLPack, whose dtype its __cuda_array_interface__ typestr does not tell
        if fast_sig is not None and not plan.empty and all(view.via != VIA_DLPACK for view in call.arrays.values()):
            if len(self._fast) >= CACHE_LIMIT:
                self._fast.clear()
            try:
                self._fast[(*fast_sig, device)] = plan
            except TypeError:  # an unhashable key (a list in an array interface): every such call is checked
                pass
        if plan.empty:  # a zero-sized problem launches nothing
            return
        if handle is None:
            library_stream = self._library_stream(bound)
            handle = (library_stream(device) or CU_STREAM_LEGACY) if library_stream is not None else gpu.default_stream
        try:
            params = plan.take()  # published above: a fast call of another thread may hold it
        except IndexError:
            params = plan.fresh()
        c_values = plan.pack_exact(params, call, self._user_slots)
        plan.launch(gpu, device, handle, params, c_values)
        plan.give(params)

    def _library_stream(self, bound: Sequence[Any]) -> Callable[[int], int] | None:
        """The current-stream reader of the first array whose library has one (CuPy, PyTorch)."""
        for obj, kind in zip(bound, self._user_kinds):
            if kind > 0:
                reader = array_reader(type(obj))
                if reader.current_stream is not None:
                    return reader.current_stream
        return None

    def _drop_plans(self) -> None:
        """Forget everything made over a GpuState (see use_gpu): plans, loaded code."""
        self._kernels = {}
        self._forget_plans()

    def _forget_plans(self) -> None:
        """Forget the plans (a pin changed what a call selects: Kernel.pin); loaded code stays."""
        self._memo, self._fast = {}, {}
        self.__class__ = self._plain_class  # the generated call holds the old plans (its last one, _fast.get)

    def _device_of(self, gpu: GpuState, call: PreparedCall) -> int:
        """The one device all arrays live on (zero-sized arrays, pointer 0, are anywhere)."""
        devices = {}
        for arg, view in call.arrays.items():
            if view.ptr == 0 or 0 in view.shape:
                continue
            device = view.device if view.device is not None else gpu.pointer_device(view.ptr)
            if device is None:
                raise ValueError(f"{self.name}(): argument {arg!r} (pointer {view.ptr:#x}) is not CUDA device memory")
            devices[arg] = device
        distinct = set(devices.values())
        if len(distinct) > 1:
            listing = ", ".join(f"{a} on device {d}" for a, d in devices.items())
            raise ValueError(f"{self.name}(): arrays are on different devices ({listing})")
        if distinct:
            return distinct.pop()
        current = gpu.current_device()
        return 0 if current is None else current

    def _plan(self, gpu: GpuState, device: int, call: PreparedCall) -> PlanHead | None:
        """The head of a (device, instance, key, free dims)'s launches (launching.plan_head: the
        function, grid, block, shared bytes, cluster, tensor-map boxes); None for a zero-sized
        problem. Computed once, memoised."""
        sel = self._selector.selection(gpu.device_cc(device), call.types, call.key, driver=gpu.driver_version)
        if self._features.conditional:
            sel = tma_served(self, sel, call)
        return plan_head(self, gpu, device, sel, call, call.dims)

    def geometry(
        self, config: Mapping[str, Any], types: Mapping[str, str], key: Mapping[str, int], dims: Mapping[str, int] | None = None
    ) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """(grid, block, dynamic shared bytes) of a config at a key (and free dims): the declared expressions."""
        env = launch_env(config, types, key, dims)
        grid = tuple(int(f(env)) for f in self._grid)
        block = tuple(int(f(env)) for f in self._block)
        shared = int(self._shared(env))
        if any(g < 0 for g in grid) or any(b <= 0 for b in block) or shared < 0:
            raise ValueError(f"{self.name}: launch geometry grid={grid} block={block} shared={shared} is invalid for {dict(key)}")
        return grid, block, shared

    def _kernel_handle(self, gpu: GpuState, device: int, sel: Selection) -> Any:
        """The CUfunction of a selection on a device: its cubin (or PTX, JIT-compiled) loaded
        into the device's primary context once, with the driver's own calls."""
        cache_key = (device, sel.variant, sel.binary)
        handle = self._kernels.get(cache_key)
        if handle is None:
            with self._load_lock:
                handle = self._kernels.get(cache_key)
                if handle is None:
                    data = self._selector.binary(sel)
                    # PTX (selected only where the driver's ISA covers it: choose_arch), which
                    # cuModuleLoadData reads as a C string
                    if sel.binary.startswith("compute_") and not data.endswith(b"\0"):
                        data += b"\0"
                    driver = gpu.driver
                    what = f"{self.name} variant {sel.variant}, {sel.binary}, on device {device}"
                    with gpu.on_device(device):
                        module = check_cuda(driver.cuModuleLoadData(data), f"cuModuleLoadData ({what})")
                        handle = check_cuda(driver.cuModuleGetFunction(module, self.entry.encode()), f"cuModuleGetFunction ({what})")
                    self._kernels[cache_key] = handle
        return handle
