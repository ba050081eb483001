"""A kernel's call, as straight-line Python generated once per kernel from how it takes each
argument (an array's alignment, optional or not; a scalar; a key scalar), then compiled.

Why generated: the call of a kernel whose signature was seen before is all Python (read each
array's pointer and layout, look the plan up, pack, launch), and a loop over the arguments with
a branch per kind and a signature grown item by item cost twice what the same steps cost
written out (benchmarks/launch_path_cpu.py). The source holds only numbers and this module's
own names, never a name or string read from the wheel's table (as dataclasses and namedtuple
make their methods); its text is one per argument-kinds tuple, compiled once per process.

What the call does is launch.py's to say (Launcher): every call that is not a repeat of a
recorded signature, or that the fast path cannot finish (a kwarg that is no constant, a
wrong argument count, a pointer that is null, misaligned or not an int, a scalar that its C
type cannot hold, an unknown layout, several GPUs with arrays that do not say where), goes
to `Launcher._call_checked`, which names what is wrong or records the plan."""

from __future__ import annotations

from . import cuda_seam
from .args import _CODES, CUPY, TORCH, array_reader
from .cuda_seam import CU_STREAM_LEGACY
from .params import PACK_ERRORS

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Callable
    from typing import Any

    FastCall = Callable[..., None]

_NO_CONSTANTS: dict[str, Any] = {}  # a call without constants (never written to)
_COMPILED: dict[tuple[tuple[int, ...], tuple[bool, ...], str], Any] = {}  # argument kinds -> the code of `make`

_HEAD = """\
def make(launcher, seam, state, codes_get, reader_of, CUPY, TORCH, LEGACY, PACK_ERRORS, NO_CONSTANTS, kept_pointer):
    fast_get = launcher._fast.get
    checked = launcher._call_checked
    multi_gpu_device = launcher._multi_gpu_device
    remake = launcher._remake
    checks = launcher.checks
    take_constants, bind = checks.take_constants, checks.bind
    name = launcher.name
    last = (None, None)

    def call(self, *args, stream=None, **kwargs):
        nonlocal last
        gpu = seam.current
        if gpu is not state:  # made for another driver state (use_gpu since): made again for this one
            return remake(args, stream, kwargs)
        constants, ckey = NO_CONSTANTS, None
        if kwargs:
            constants = take_constants(kwargs)
            if kwargs:
                return checked(bind(args, kwargs), stream, None, constants)
            for v in constants.values():
                if type(v) is not int and type(v) is not bool:
                    return checked(list(args), stream, None, constants)  # names what is wrong, or converts
            ckey = tuple([(c, type(v), v) for c, v in constants.items()])  # the type too: True == 1, not for a constant
        if len(args) != {n}:
            return checked(bind(args, kwargs), stream, None, constants)
        {unpack}
        device = lib = None
        # step: the call's arguments
"""

_ARRAY = """\
        t{i} = type(a{i})
        c = codes_get(t{i}) or reader_of(t{i}).code
        if c is CUPY:
            m = a{i}.data
            p{i} = m.ptr
            d = m.device_id
            s{i}, h{i}, r{i}, o{i} = a{i}.dtype, a{i}.shape, a{i}.strides, d
            if device is None:
                device, lib = d, t{i}
        elif c is TORCH:
            p{i} = a{i}.data_ptr()
            d = a{i}.get_device() if a{i}.is_cuda else -1  # another backend's index is no CUDA device
            s{i}, h{i}, r{i}, o{i} = a{i}.dtype, a{i}.shape, a{i}.stride(), d
            if device is None:
                device, lib = d, t{i}
        else:
            try:
                cai = a{i}.__cuda_array_interface__
                data = cai["data"]
                s{i}, h{i}, r{i}, o{i} = cai["typestr"], cai["shape"], data[1], cai.get("strides")
            except Exception:  # DLPack only, not an array, not a real interface, or one that refuses
                return checked(list(args), stream, None, constants)
            p{i} = data[0]
        # an int pointer that fits the parameter (below 2**63), aligned, not null: a null or odd
        # one (an empty array's, or a mistake) takes the checked path, which says which
        if type(p{i}) is not int or p{i} <= 0 or p{i} % {align}:
            return checked(list(args), stream, None, constants)
        # step: array {i}
"""

_TAIL = """\
        if gpu.api is None:  # the first call in this process: checks first, then the driver
            return checked(list(args), stream, ({sig},), constants)
        single = gpu.single_device
        if single is None:  # several GPUs: the driver says where the other arrays are
            device = multi_gpu_device(gpu, ({arrays}), ({pointers}), device)
            if device is None:
                return checked(list(args), stream, ({sig},), constants)
        elif device is None:
            device = single
        # step: the device
        key = ({sig}, device)
        last_key, plan = last  # the last call's plan: compared before hashing, for a call that repeats it
        if key != last_key:
            try:
                plan = fast_get(key)
            except TypeError:  # an interface with a list (shape, strides): valid, but no plan is keyed by it
                return checked(list(args), stream, None, constants)
            if plan is not None:
                last = (key, plan)  # one assignment: another thread reads the old pair or the new one
        if plan is None or (stream is not None and plan.stream_ref is not stream and type(stream) is not int):
            return checked(list(args), stream, key[:-1], constants)
        # step: the plan
        handle = plan.stream
        if handle is None:  # stream=None: where the arrays' library runs its own work, else the default
            # (a library's null stream 0 is its legacy one: 0 is the per-thread one where
            # cuda-python is told to use that)
            current_stream = None if lib is None else reader_of(lib).current_stream
            handle = gpu.default_stream if current_stream is None else current_stream(device) or LEGACY
        # step: the stream
        try:
            params = plan.take()  # the plan's buffer, unless another thread is launching from it
        except IndexError:
            params = plan.fresh()
        try:
            params.pack(params.storage, 0, {values})
        except PACK_ERRORS:  # a scalar its C type cannot hold: the checked path says which
            plan.give(params)
            return checked(list(args), stream, None, constants)
        # step: the parameters packed
        if plan.special:  # a cluster (cuLaunchKernelEx) or tensor maps (encoded per pointer): the plan launches
            plan.launch(gpu, device, handle, params, ({values}))
        else:
{launch}        plan.give(params)  # not after a failed launch: a later call makes a fresh one
        return None

    return call
"""


# The launch, as GpuState.launch does it, inline, per kind of driver (GpuState.kind): where the
# calling thread's current context is not the device's primary one, GpuState.launch pushes it.
_LAUNCH = {
    # a driver shaped as cuda-bindings' (the stand-in; cuda-bindings): results are tuples
    "tuple": """\
            driver = gpu.driver
            err, current = driver.cuCtxGetCurrent()
            if err or int(current) != plan.context:
                gpu.launch(device, plan.head, handle, params.address, name)  # the caller's context is another
            else:
                result = driver.cuLaunchKernel(*plan.head, handle, params.address, 0)
                if result[0]:
                    gpu.raise_launch_error(result[0], name)
""",
    # libcuda through ctypes (libcuda.py): the raw functions, with arguments kept as ctypes
    # objects by the plan (its head) and by the buffer (its address, the context's answer, the
    # last stream), which this call holds alone
    "ctypes": """\
            driver = gpu.driver
            if driver.context_now(params.context_ref) or params.context_out.value != plan.context:
                gpu.launch(device, plan.head, handle, params.address, name)  # the caller's context is another
            else:
                if handle != params.stream_value:
                    params.stream_value, params.kept_stream = handle, kept_pointer(handle)
                err = driver.launch(*plan.kept, params.kept_stream, params.kept_address, None)
                if err:
                    gpu.raise_launch_error(driver.result(err), name)
""",
}


def source(kinds: tuple[int, ...], optional: tuple[bool, ...], driver: str = "tuple") -> str:
    """The text of `make(launcher, ...)` for arguments taken as `kinds` (an array's alignment
    in bytes, 1 or more; 0 a scalar; -1 a key scalar, whose value picks the bucket), `optional`
    saying which arrays may be passed as None (a null pointer); `driver` the driver's kind (_LAUNCH)."""
    n = len(kinds)
    unpack = f"{', '.join(f'a{i}' for i in range(n))}, = args" if n else "pass"
    parts = [_HEAD.format(n=n, unpack=unpack)]
    sig = ["stream if stream is None or type(stream) is int else id(stream)", "ckey"]
    values, arrays = [], []  # the packed values' names; the arrays' indices
    for i, (kind, may_be_none) in enumerate(zip(kinds, optional)):
        if kind > 0:
            body = _ARRAY.format(i=i, align=kind)
            if may_be_none:  # an optional array left out: a null pointer (tested first: an array's path costs no more)
                body = (
                    f"        if a{i} is None:\n            p{i} = 0\n            t{i} = s{i} = h{i} = r{i} = o{i} = None\n        else:\n"
                    + "".join(f"    {line}\n" for line in body.splitlines())
                )
            parts.append(body)
            sig += [f"t{i}", f"s{i}", f"h{i}", f"r{i}", f"o{i}"]
            values.append(f"p{i}")
            arrays.append(i)
        else:
            sig += [f"type(a{i})"] + ([f"a{i}"] if kind < 0 else [])  # a key scalar's value picks the bucket
            values.append(f"a{i}")
    parts.append(
        _TAIL.format(
            sig=", ".join(sig),
            arrays="".join(f"a{i}, " for i in arrays),
            pointers="".join(f"p{i}, " for i in arrays),
            values="".join(f"{v}, " for v in values),
            launch=_LAUNCH[driver],
        )
    )
    return "".join(parts)


def _kept_pointer(value: int) -> Any:
    """A stream handle as the ctypes object the raw cuLaunchKernel takes (libcuda.py)."""
    from ctypes import c_void_p

    return c_void_p(value)


def fast_call(launcher: Any, text: str | None = None) -> FastCall:
    """The generated call of `launcher` (launch.py's Launcher, not imported: it imports this
    module; see `source`): `call(launcher, *args, stream=None,
    **kwargs)`, the `__call__` of the launcher's own class (Launcher.__call__). `text`: a
    variant of its source to compile instead (benchmarks/launch_path_cpu.py times the call cut
    after each `# step:` line)."""
    state = cuda_seam.current  # the driver state it serves (a call over another makes it again), and whose kind
    shape = (launcher._user_kinds, launcher._optional, state.kind)
    code = _COMPILED.get(shape) if text is None else compile(text, "<hatch-autotune fast call, variant>", "exec")
    if code is None:
        code = _COMPILED[shape] = compile(source(*shape), "<hatch-autotune fast call>", "exec")
    namespace: dict[str, Any] = {}
    exec(code, namespace)  # our own template's text (numbers and our names only), not data
    make = namespace["make"]
    call: FastCall = make(
        launcher, cuda_seam, state, _CODES.get, array_reader, CUPY, TORCH, CU_STREAM_LEGACY, PACK_ERRORS, _NO_CONSTANTS, _kept_pointer
    )
    return call
