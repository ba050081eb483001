"""What a launch is made of once a variant is chosen, shared by the wheel's call path (launch.py)
and the tuning worker, so that tuning launches exactly as the wheel does: the plan's head (the
loaded function, grid, block, dynamic shared memory with its opt-in past 48 KiB, the thread-block
cluster, the tensor maps' boxes), and `FastPlan`, which packs a call's values into a parameter
buffer, writes its tensor maps and launches with cuLaunchKernel, or cuLaunchKernelEx for a
cluster."""

from __future__ import annotations

from .expr import compile_expr
from .params import BYTES16, CONVERT, POINTER, TENSOR_MAP, TENSOR_MAP_BYTES, ParamBuffer
from .scalars import c_scalar
from .selection import Selection, arch_env
from .tensor_map import GLOBAL_ALIGN, contiguous_strides, encoder, tensor_map_args
from .values import instance_env

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, Protocol

    from .args import PreparedCall
    from .checks import CallChecks
    from .cuda_seam import GpuState
    from .declaration import KernelDecl, TensorMapDecl
    from .selection import KernelSelector
    from .tensor_map import TensorMapEncoder

    class Launcher(Protocol):
        """What a plan reads of launch.py's Launcher (a Protocol: launch.py imports this module)."""

        name: str
        checks: CallChecks
        _selector: KernelSelector
        _features: LaunchFeatures
        _layout: tuple[tuple[bool, str, int | None], ...]
        _user_slots: tuple[int, ...]

        def geometry(
            self, config: Mapping[str, Any], types: Mapping[str, str], key: Mapping[str, int], dims: Mapping[str, int] | None = None
        ) -> tuple[tuple[int, ...], tuple[int, ...], int]: ...

        def _kernel_handle(self, gpu: GpuState, device: int, sel: Selection) -> Any: ...


MAX_CLUSTER = 8  # blocks per cluster that every cluster-capable GPU runs (the portable size)
# The scalar dtypes that the parameter buffer has no struct code for, by the unsigned integer of
# their size: scalars.c_scalar gives their C value (bfloat16 and FP8 as their bits, bool, complex64),
# and _bits its bytes as that integer; complex128 (16 bytes, 16-aligned) as its 16 bytes.
_PACKED_AS = {
    "bfloat16": "uint16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "float8_e8m0fnu": "uint8",
    "bool": "uint8", "complex64": "uint64", "complex128": BYTES16,
}  # fmt: skip


def launch_env(
    config: Mapping[str, Any], types: Mapping[str, str], key: Mapping[str, int], dims: Mapping[str, int] | None
) -> dict[str, Any]:
    """The names that launch expressions see: key dims, free dims, the config, `<T>_size` and constants."""
    return {**key, **(dims or {}), **config, **instance_env(types)}


class PlanHead:
    """A plan's launch, fixed per (device, instance, key): `args` (function, grid x3, block x3,
    shared bytes: cuLaunchKernel's head), `cluster` ((x, y, z), or None for no cluster) and the
    evaluated box of each tensor-map parameter (outermost first, in C order; None for a map the
    variant does not read); and the GpuState and device it was made on."""

    __slots__ = ("args", "cluster", "boxes", "gpu", "device")

    def __init__(
        self,
        args: tuple[Any, ...],
        cluster: tuple[int, int, int] | None,
        boxes: tuple[tuple[int, ...] | None, ...],
        gpu: GpuState,
        device: int,
    ):
        self.args, self.cluster, self.boxes, self.gpu, self.device = args, cluster, boxes, gpu, device


class LaunchFeatures:
    """A kernel's cluster dims and tensor maps (boxes and `when`s), compiled once from its declaration."""

    __slots__ = ("name", "cluster", "boxes", "maps", "conditional")

    def __init__(self, decl: KernelDecl):
        self.name = decl.name
        cluster = decl.launch.cluster
        self.cluster = None if cluster is None else tuple(compile_expr(t) for t in cluster)
        self.maps = tuple(
            (a.name, a.tensor_map, None if a.tensor_map.when is None else compile_expr(a.tensor_map.when))
            for a in decl.args
            if a.tensor_map is not None
        )
        self.boxes = tuple(tuple(compile_expr(t) for t in m.box) for _, m, _ in self.maps)
        self.conditional = tuple(m.array for _, m, when in self.maps if when is not None)  # the arrays such maps read

    def cluster_dims(self, env: Mapping[str, Any], grid: Sequence[int], cc: tuple[int, int], what: str) -> tuple[int, int, int] | None:
        """The cluster of a launch, checked against its grid and the device before the driver;
        None when the kernel declares none or it is 1x1x1 (a plain launch)."""
        if self.cluster is None:
            return None
        dims = tuple(int(f(env)) for f in self.cluster)
        x, y, z = (*dims, 1, 1)[:3]
        if min(x, y, z) < 1:
            raise ValueError(f"{what}: cluster {dims} is invalid (each dim at least 1)")
        if (x, y, z) == (1, 1, 1):
            return None
        if x * y * z > MAX_CLUSTER:
            raise ValueError(f"{what}: cluster {(x, y, z)} has {x * y * z} blocks; a portable cluster has at most {MAX_CLUSTER}")
        off = [f"{axis} ({g} % {c} = {g % c})" for axis, g, c in zip("xyz", grid, (x, y, z)) if g % c]
        if off:
            raise ValueError(f"{what}: grid {tuple(grid)} is not a multiple of cluster {(x, y, z)} in {', '.join(off)}")
        if cc < (9, 0):
            raise ValueError(f"{what}: a thread-block cluster {(x, y, z)} needs sm_90 or newer; the device is sm_{cc[0]}{cc[1]}")
        return x, y, z

    def box_dims(self, env: Mapping[str, Any]) -> tuple[tuple[int, ...] | None, ...]:
        """Each map's box; None for a map the variant does not read (its `when` is false: the
        parameter stays zeros, nothing is encoded or checked). `env` has the arch's names."""
        return tuple(
            None if when is not None and not when(env) else tuple(int(f(env)) for f in box)
            for (_, _, when), box in zip(self.maps, self.boxes)
        )

    def layouts(self, call: PreparedCall) -> tuple[tuple[Any, Any, bool], ...]:
        """What decides whether TMA serves a call (with `map_problem`): per array a map with a
        `when` reads, its shape, strides and whether its address is 16-byte aligned."""
        return tuple((v.shape, v.strides, v.ptr % GLOBAL_ALIGN == 0) for v in map(call.arrays.get, self.conditional) if v)

    def map_problem(self, env: Mapping[str, Any], call: PreparedCall, what: str) -> str | None:
        """Why the call's arrays cannot give a map with a `when` that the variant of `env` reads
        (TMA's rules, tensor_map_args, and a 16-byte aligned address), or None."""
        for (name, decl, when), box in zip(self.maps, self.boxes):
            if when is None or not when(env):
                continue
            view = call.arrays.get(decl.array)
            if view is None:
                return f"tensor map {name!r}: array {decl.array!r} was passed as None"
            if view.ptr % GLOBAL_ALIGN:
                return f"tensor map {name!r}: array {decl.array!r} is not {GLOBAL_ALIGN}-byte aligned"
            strides = contiguous_strides(view.shape) if view.strides is None else view.strides
            try:
                tensor_map_args(f"{what}: tensor map {name!r}", decl, view.dtype, view.shape, strides, [int(f(env)) for f in box])
            except ValueError as exc:
                return str(exc)
        return None


def plan_head(
    launcher: Launcher, gpu: GpuState, device: int, sel: Selection, call: PreparedCall, dims: Mapping[str, int] | None = None
) -> PlanHead | None:
    """The head of a selection's launches on a device (None: a zero-sized grid launches nothing):
    its geometry, cluster and boxes, its function loaded, and its dynamic shared memory allowed."""
    grid, block, shared = launcher.geometry(sel.config, call.types, call.key, dims)
    if min(grid) == 0:
        return None
    grid3, block3 = (*grid, 1, 1)[:3], (*block, 1, 1)[:3]
    what = f"{launcher.name} (variant {sel.variant}, {', '.join(f'{k}={v}' for k, v in call.key.items()) or 'no key'})"
    env = launch_env(sel.config, call.types, call.key, dims)
    features = launcher._features
    cluster = features.cluster_dims(env, grid3, gpu.device_cc(device), what)
    boxes = features.box_dims({**env, **arch_env(sel.arch)})
    function = launcher._kernel_handle(gpu, device, sel)
    if shared:
        gpu.allow_shared(device, function, shared, what)
    return PlanHead((function, *grid3, *block3, shared), cluster, boxes, gpu, device)


def tma_served(launcher: Launcher, sel: Selection, call: PreparedCall) -> Selection:
    """`sel`, unless its variant reads a tensor map (one with a `when`) that the call's arrays
    cannot give (TMA's layout rules, a 16-byte aligned address): then the first variant of the
    instance's row that reads none such (Kernel.select says what the bucket chose)."""
    features = launcher._features

    def problem(config: Mapping[str, Any]) -> str | None:
        env = {**launch_env(config, call.types, call.key, call.dims), **arch_env(sel.arch)}
        return features.map_problem(env, call, launcher.name)

    why = problem(sel.config)
    if why is None:
        return sel
    served = launcher._selector.serving(sel, call.types, call.key, lambda config: problem(config) is None)
    if served is None:
        raise ValueError(
            f"{launcher.name}(): variant {sel.variant} reads a tensor map the call cannot give ({why}), and the wheel ships no "
            f"variant of this instance for {sel.arch} that reads none; pass arrays TMA can read (16-byte aligned, rows a "
            "multiple of 16 bytes apart)"
        )
    return served


class ExConfig:
    """A cluster launch's CUlaunchConfig (grid, block, shared bytes and the cluster attribute set
    once) and the stream it was last given: only hStream changes per call."""

    __slots__ = ("config", "stream")

    def __init__(self, driver: Any, head: tuple[Any, ...], cluster: tuple[int, int, int]):
        config = driver.CUlaunchConfig()
        (
            _,
            config.gridDimX,
            config.gridDimY,
            config.gridDimZ,
            config.blockDimX,
            config.blockDimY,
            config.blockDimZ,
            config.sharedMemBytes,
        ) = head
        attr = driver.CUlaunchAttribute()
        attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
        config.attrs = [attr]
        config.numAttrs = 1
        config.hStream = 0
        self.config, self.stream = config, 0


class FastPlan:
    """What a call with a known signature needs: the launch's head (function, grid, block,
    shared bytes), the parameter buffers that its pointers and scalars are packed into
    (`take()` one, `give()` it back, `fresh()` another), and its stream (None: asked at each
    call, see Kernel.__call__). `converts` lists the caller's scalars whose dtype struct cannot
    convert (bfloat16, FP8, bool, complex64: see _PACKED_AS), as (position among the caller's
    values, dtype, argument); a buffer's `pack` converts those through scalars.c_scalar.
    `special`: a cluster or tensor maps, launched by `launch()` (a plain plan inline)."""

    __slots__ = (
        "params", "take", "give", "head", "empty", "stream", "stream_ref", "context", "converts", "kernel",
        "cluster", "maps", "special", "_driver", "kept",
    )  # fmt: skip

    def __init__(self, launcher: Launcher, call: PreparedCall, head: PlanHead | None, stream: int | None, stream_ref: Any, context: int):
        layout: list[tuple[str, int | None, Any]] = []
        converts = []
        sources: list[tuple[str, TensorMapDecl, int]] = []  # per tensor map: its name, declaration, array's place among the caller's values
        args = launcher.checks.decl.args
        user_of = {a.name: user for (_, _, user), a in zip(launcher._layout, args)}
        for (is_array, dtype, user), value, arg in zip(launcher._layout, call.c_args, args):
            if arg.tensor_map is not None:
                sources.append((arg.name, arg.tensor_map, user_of[arg.tensor_map.array] or 0))
                layout.append((TENSOR_MAP, None, None))
                continue
            kind = POINTER if is_array else call.types.get(dtype, dtype)
            if kind not in CONVERT:
                packed = _PACKED_AS.get(kind)
                if packed is None:
                    raise TypeError(
                        f"{launcher.name}(): argument {arg.name!r} is a {kind} scalar, which this runtime cannot pack into a "
                        "kernel parameter; pass it in a one-element array"
                    )
                if user is not None:
                    converts.append((user, kind, arg.name))
                else:
                    value = _bits(value)
                kind = packed
            layout.append((kind, user, None if user is not None else value))
        self.converts = tuple(converts)
        self.kernel = launcher.name
        self.head, self.empty = head.args if head is not None else (), head is None
        self.cluster = head.cluster if head is not None else None
        self._driver = head.gpu.driver if head is not None else None
        # a driver through ctypes (libcuda.py): the head as the ctypes objects its raw cuLaunchKernel takes
        self.kept = head.gpu.driver.keep_head(self.head) if head is not None and head.gpu.kind == "ctypes" else None
        self.params = self.fresh(ParamBuffer(layout))
        maps = []
        if head is not None:
            for (name, decl, user), box, offset in zip(sources, head.boxes, self.params.map_offsets):
                if box is None:  # a map this variant does not read (`when`): its bytes stay zeros
                    continue
                what = f"{launcher.name}(): tensor map {name!r}"
                view = call.arrays.get(decl.array)
                if view is None:
                    raise ValueError(f"{what} is encoded from array {decl.array!r}, which was passed as None")
                maps.append((offset, user, encoder(head.gpu, head.device, what, decl, view.dtype, view.shape, view.strides, box)))
        self.maps: tuple[tuple[int, int, TensorMapEncoder], ...] = tuple(maps)
        self.special = bool(maps) or self.cluster is not None
        # Buffers not in use: cuLaunchKernel reads a buffer while it runs (without the GIL), so a
        # call takes one (list.pop is atomic) and gives it back after its launch; a call that
        # finds none (another thread launches this plan) packs into a fresh one.
        free = [self.params]
        self.take, self.give = free.pop, free.append
        self.stream = stream
        self.stream_ref = stream_ref  # the user's stream object, so a new object is not mistaken for it
        self.context = context  # the device's primary context (an int): where the launch must happen

    def fresh(self, params: ParamBuffer | None = None) -> ParamBuffer:
        """A buffer of this plan's layout (`params`, else a new one), whose `pack` converts the
        scalars that struct cannot (a plan without such scalars packs with struct alone), with
        its own CUlaunchConfig for a cluster launch (threads launch from their own buffers)."""
        params = params if params is not None else self.params.fresh()
        if self.converts:
            params.pack = _converting_pack(params.pack, self.converts, self.kernel)
        if self.cluster is not None:
            params.launch_config = ExConfig(self._driver, self.head, self.cluster)
        if self.kept is not None:
            from ctypes import byref, c_void_p

            params.kept_address = c_void_p(params.address)
            params.context_out = c_void_p()
            params.context_ref = byref(params.context_out)
        return params

    def pack_exact(self, params: ParamBuffer, call: PreparedCall, slots: Sequence[int]) -> list[Any]:
        """Pack a checked call's C values (`slots`: the caller's arguments' C positions) into
        `params`; the caller's values as packed (pointers for arrays), which `launch` reads."""
        c_values = [call.c_args[c] for c in slots]
        for i, _, _ in self.converts:
            c_values[i] = _bits(c_values[i])
        params.exact.pack_into(params.storage, 0, *c_values)
        return c_values

    def launch(self, gpu: GpuState, device: int, stream: Any, params: ParamBuffer, values: Sequence[Any]) -> None:
        """Write the tensor maps of the arrays in `values` (the caller's values: pointers for
        arrays) into `params`, then launch: cuLaunchKernelEx for a cluster, else cuLaunchKernel."""
        if self.maps:
            storage = params.storage
            for offset, source, encode in self.maps:
                storage[offset : offset + TENSOR_MAP_BYTES] = encode(values[source])
        if self.cluster is None:
            gpu.launch(device, self.head, stream, params.address, self.kernel)
        else:
            gpu.launch_ex(device, params.launch_config, stream, self.head[0], params.address, self.kernel)


def variant_launch(launcher: Launcher, vid: str, call: PreparedCall, device: int) -> Callable[[Any], None]:
    """A launch of variant `vid` with a checked call's values, as the wheel's call path makes it
    (the tuning worker times these): the function loaded by the runtime's loader, the shared
    memory allowed, a cluster launched with cuLaunchKernelEx, tensor maps encoded, a ParamBuffer.
    The returned function takes a stream (a cuda.core Stream, or a raw handle)."""
    from . import cuda_seam

    gpu = cuda_seam.current
    gpu.start()
    selector = launcher._selector
    table_arch, binary = selector.binaries.binary_for(gpu.device_cc(device), gpu.driver_version)
    config = selector.variant(vid).config
    sel = Selection(
        kernel=launcher.name, variant=vid, config=config, types=call.types, constants={}, bucket=call.key,
        tuned=False, arch=table_arch, binary=binary, reason="named by the tuner", pinned="",
    )  # fmt: skip
    head = plan_head(launcher, gpu, device, sel, call, call.dims)
    if head is None:
        return lambda stream: None  # a zero-sized grid launches nothing
    plan = FastPlan(launcher, call, head, None, None, gpu.primary_handle(device))
    params = plan.params
    values = plan.pack_exact(params, call, launcher._user_slots)

    def run(stream: Any) -> None:
        handle = stream if type(stream) is int else int(getattr(stream, "handle", stream))
        plan.launch(gpu, device, handle, params, values)

    return run


def _converting_pack(pack: Callable[..., None], converts: Sequence[tuple[int, str, str]], kernel: str) -> Callable[..., None]:
    """`pack` (a struct's pack_into) after the caller's values at `converts` are made C values
    (scalars.c_scalar, whose TypeError or ValueError sends the call to the checked path)."""

    def converting(storage: bytearray, offset: int, *values: Any) -> None:
        given = list(values)
        for i, dtype, arg in converts:
            given[i] = _bits(c_scalar(given[i], dtype, kernel, arg))
        pack(storage, offset, *given)

    return converting


def _bits(value: Any) -> int | bytes:
    """A NumPy scalar's bytes as the unsigned integer that _PACKED_AS packs them as (a
    complex128's 16 bytes as they are)."""
    import sys

    data = value.tobytes()
    return data if len(data) == 16 else int.from_bytes(data, sys.byteorder)
