"""The call path down to the driver (issue #35): CuPy arrays and PyTorch tensors read through
their own attributes, on their library's current stream and device; one parameter buffer per
plan, packed by struct and handed to cuLaunchKernel, safe across threads; every check of the
checked path kept; and a first call that imports neither cuda.core nor NVML nor NVRTC.

The launches run through the driver stand-in (tests/cuda_standin.py), which decodes each
launch's parameter bytes through the kernelParams pointers as the kernel's binary declares them.
CuPy and PyTorch cannot make CUDA arrays here; tests/standin_arrays.py imitates what the runtime
reads of them (tests/test_gpu.py runs the real ones on a GPU)."""

from __future__ import annotations

import ctypes
import itertools
import os
import subprocess
import sys
import textwrap
import threading
from types import SimpleNamespace

import cuda_standin
import numpy as np
import pytest
from cuda_standin import DeviceArray, install
from standin_arrays import install_cupy, install_torch

from hatch_autotune.runtime.params import ParamBuffer


def saxpy_params(launch) -> tuple[float, int, int, int]:
    """(a, x pointer, y pointer, n) as the saxpy kernel receives them (float32 instance)."""
    return (
        float(launch.param(0, "float32")),
        int(launch.param(1, "uint64")),
        int(launch.param(2, "uint64")),
        int(launch.param(3, "int32")),
    )


def test_cupy_arrays_take_the_fast_path_on_cupys_current_stream(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt)
    cupy = install_cupy(monkeypatch, standin)
    saxpy = fresh()["saxpy"]
    x, y = cupy.ndarray((5000,)), cupy.ndarray((5000,))
    for a in (0.5, 1.5, 2.5):
        saxpy(a, x, y)
        assert saxpy_params(standin.launches[-1]) == (a, x.data.ptr, y.data.ptr, 5000)
        assert standin.launches[-1].stream.handle == 1  # CuPy's current one, its null stream: the legacy stream
    assert saxpy.checked_calls == 1
    device = cuda_standin.FakeDevice(0)
    device.set_current()
    created = device.create_stream()
    cupy.current.streams[0] = created.handle  # `with cupy.cuda.Stream():` in CuPy
    saxpy(3.0, x, y)
    assert standin.launches[-1].stream is created and saxpy.checked_calls == 1  # followed on the fast path
    saxpy(3.0, x, y, stream=1)  # an explicit stream wins
    assert standin.launches[-1].stream.handle == 1


def test_cupy_arrays_on_a_second_gpu_launch_there_without_asking_the_driver(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt, ccs=[(9, 0), (9, 0)])
    cupy = install_cupy(monkeypatch, standin)
    saxpy = fresh()["saxpy"]
    x, y = cupy.ndarray((64,), device=1), cupy.ndarray((64,), device=1)
    saxpy(2.0, x, y)
    queries = standin.calls.get("cuPointerGetAttribute", 0)
    for _ in range(3):
        saxpy(2.0, x, y)
    assert [launch.device for launch in standin.launches] == [1] * 4
    assert standin.calls.get("cuPointerGetAttribute", 0) == queries  # the array said where it is
    assert standin.stack == []  # device 1's context was pushed for each launch and popped
    with pytest.raises(ValueError, match=r"arrays are on different devices \(x on device 0, y on device 1\)"):
        saxpy(2.0, cupy.ndarray((64,), device=0), y)


def test_an_other_array_beside_a_pytorch_tensor_is_still_asked_where_it_is(fresh, monkeypatch, rt):
    """A PyTorch tensor says its device; an __cuda_array_interface__ array beside it does not, so
    with several GPUs the driver is asked for it at each call: a plan made with both on device 1
    does not launch one on device 0 there."""
    standin = install(monkeypatch, rt, ccs=[(9, 0), (9, 0)])
    torch = install_torch(monkeypatch, standin)
    saxpy = fresh()["saxpy"]
    x = torch.Tensor((256,), device=1)
    for _ in range(2):
        saxpy(1.0, x, DeviceArray.empty(standin, (256,), device=1))
    assert [launch.device for launch in standin.launches] == [1, 1] and saxpy.checked_calls == 1
    with pytest.raises(ValueError, match=r"arrays are on different devices \(x on device 1, y on device 0\)"):
        saxpy(1.0, x, DeviceArray.empty(standin, (256,), device=0))
    assert len(standin.launches) == 2


def test_pytorch_tensors_take_the_fast_path_on_pytorchs_current_stream(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt, ccs=[(9, 0), (9, 0)])
    torch = install_torch(monkeypatch, standin)
    saxpy = fresh()["saxpy"]
    x, y = torch.Tensor((300,), device=1), torch.nn.parameter.Parameter((300,), device=1)
    created = None
    for i in range(4):
        if i == 2:  # `with torch.cuda.stream(s):` in PyTorch, for device 1
            device = cuda_standin.FakeDevice(1)
            device.set_current()
            created = device.create_stream()
            torch.current_streams[1] = created.handle
        saxpy(1.0 + i, x, y)
        launch = standin.launches[-1]
        assert saxpy_params(launch) == (1.0 + i, x.data_ptr(), y.data_ptr(), 300) and launch.device == 1
        assert launch.stream is created if i >= 2 else launch.stream.handle == 1  # PyTorch's null stream: the legacy one
    assert saxpy.checked_calls == 1


def test_the_fast_path_keeps_every_check_for_cupy_and_pytorch(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt)
    cupy, torch = install_cupy(monkeypatch, standin), install_torch(monkeypatch, standin)
    saxpy = fresh()["saxpy"]
    x, y = cupy.ndarray((100,)), cupy.ndarray((100,))
    t, u = torch.Tensor((100,)), torch.Tensor((100,))
    saxpy(1.0, x, y), saxpy(1.0, t, u)  # plans for both
    launched = len(standin.launches)
    with pytest.raises(ValueError, match=r"^saxpy\(\): argument 'y' must be C-contiguous"):
        saxpy(1.0, x, cupy.ndarray((100,), strides=(8,)))
    with pytest.raises(ValueError, match=r"^saxpy\(\): argument 'y' must be C-contiguous"):
        saxpy(1.0, t, torch.Tensor((100,), stride=(2,)))
    with pytest.raises(TypeError, match=r"argument 'y' has dtype float16 but 'x' has float32"):
        saxpy(1.0, x, cupy.ndarray((100,), "float16"))
    with pytest.raises(TypeError, match=r"^saxpy\(\): argument 'y' has dtype bfloat16; expected one of \['float32', 'float16'\]"):
        saxpy(1.0, t, torch.Tensor((100,), "bfloat16"))
    with pytest.raises(ValueError, match=r"^saxpy\(\): argument 'y' has shape \(99,\); expected \(100,\)"):
        saxpy(1.0, t, torch.Tensor((99,)))
    with pytest.raises(ValueError, match=r"^saxpy\(\): argument 'x' is in host memory; expected a GPU array$"):
        saxpy(1.0, torch.Tensor((100,), device=-1), u)  # a CPU tensor: same dtype, shape and strides
    other_backend = torch.Tensor((100,))  # as an XPU tensor: a device index, but no CUDA memory
    other_backend.is_cuda, other_backend.device = False, SimpleNamespace(type="xpu", index=0)
    with pytest.raises(ValueError, match=r"^saxpy\(\): argument 'x' is in host memory; expected a GPU array$"):
        saxpy(1.0, other_backend, u)
    with pytest.raises(ValueError, match=r"^saxpy\(\): argument 'a'=1e\+39 does not fit in float32"):
        saxpy(1e39, x, y)  # struct refuses it on the fast path; the checked path names it
    with pytest.raises(TypeError, match=r"^saxpy\(\): argument 'a' must be a number"):
        saxpy(True, t, u)
    assert len(standin.launches) == launched  # nothing was launched


def test_an_empty_cupy_array_with_zero_strides_is_contiguous_and_launches_nothing(fresh, monkeypatch, rt):
    """On an H200 (2026-11-26), `cupy.zeros(0)` was refused as not C-contiguous: an empty array's
    strides say nothing (NumPy's rule), so they are not checked."""
    standin = install(monkeypatch, rt)
    cupy = install_cupy(monkeypatch, standin)
    saxpy = fresh()["saxpy"]
    launched = len(standin.launches)
    saxpy(1.0, cupy.ndarray((0,), strides=(0,)), cupy.ndarray((0,), strides=(0,)))  # the checked path
    saxpy(1.0, cupy.ndarray((0,), strides=(0,)), cupy.ndarray((0,), strides=(0,)))  # the fast path
    assert len(standin.launches) == launched
    with pytest.raises(ValueError, match=r"^saxpy\(\): argument 'y' must be C-contiguous"):
        saxpy(1.0, cupy.ndarray((2,)), cupy.ndarray((2,), strides=(0,)))  # a broadcast view is not


def test_a_plan_in_use_launches_from_a_buffer_of_its_own(fresh, monkeypatch, rt):
    """cuLaunchKernel reads the parameter buffer while it runs: a call that finds the plan's
    buffer taken (another thread is launching from it) packs into a fresh one, and the taken
    buffer is left as it was."""
    standin = install(monkeypatch, rt)
    saxpy = fresh()["saxpy"]
    x, y = DeviceArray.empty(standin, (64,)), DeviceArray.empty(standin, (64,))
    saxpy(2.0, x, y)
    saxpy(2.0, x, y)
    (plan,) = saxpy._fast.values()
    held_before = plan.params.values()
    assert held_before == (np.float32(2.0), x.ptr, y.ptr) and len(held_before) == 3  # a, x, y: n is computed, fixed
    taken = plan.take()
    saxpy(5.0, x, y)
    assert taken is plan.params and taken.values() == held_before
    assert saxpy_params(standin.launches[-1]) == (5.0, x.ptr, y.ptr, 64)
    plan.give(taken)
    saxpy(6.0, x, y)
    assert saxpy_params(standin.launches[-1]) == (6.0, x.ptr, y.ptr, 64)
    assert saxpy.checked_calls == 1


def test_threads_calling_one_plan_each_launch_their_own_values(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt)
    saxpy = fresh()["saxpy"]
    pairs = [(DeviceArray.empty(standin, (512,)), DeviceArray.empty(standin, (512,))) for _ in range(4)]
    saxpy(0.0, *pairs[0])
    start = threading.Barrier(4)
    errors = []

    def calls(i: int) -> None:
        try:
            cuda_standin.FakeDevice(0).set_current()
            start.wait()
            for _ in range(300):
                saxpy(float(i), *pairs[i])
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=calls, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert errors == [] and len(standin.launches) == 1 + 4 * 300
    expected = {i: (float(i), pairs[i][0].ptr, pairs[i][1].ptr, 512) for i in range(4)}
    seen = [saxpy_params(launch) for launch in standin.launches[1:]]
    assert all(params == expected[int(params[0])] for params in seen)  # never one thread's a with another's arrays
    assert saxpy.checked_calls == 1


def test_a_parameter_buffer_lays_out_each_parameter_aligned_and_apart():
    layout = [("pointer", 0, None), ("float16", 1, None), ("int32", None, 7), ("float64", 2, None), ("int8", None, -3)]
    buffer = ParamBuffer(layout)
    sizes = [8, 2, 4, 8, 1]
    buffer.convert.pack_into(buffer.storage, 0, 0x7F00_0000_0100, 1.5, -2.25)
    addresses = list((ctypes.c_void_p * 5).from_address(buffer.address))
    assert all(addr % size == 0 for addr, size in zip(addresses, sizes))  # natural alignment
    spans = sorted((addr, addr + size) for addr, size in zip(addresses, sizes))
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))  # no overlap
    read = [ctypes.string_at(addr, size) for addr, size in zip(addresses, sizes)]
    assert read == [
        (0x7F00_0000_0100).to_bytes(8, "little"),
        np.float16(1.5).tobytes(),
        np.int32(7).tobytes(),
        np.float64(-2.25).tobytes(),
        np.int8(-3).tobytes(),
    ]
    assert addresses[:2] == sorted(addresses[:2]) and max(addresses[0], addresses[1], addresses[3]) < addresses[2]  # callers' first
    copy = buffer.fresh()
    copy_addresses = list((ctypes.c_void_p * 5).from_address(copy.address))
    assert ctypes.string_at(copy_addresses[2], 4) == np.int32(7).tobytes() and copy.address != buffer.address


def test_the_stand_in_reads_parameters_as_the_binary_declares_and_refuses_overlaps(fresh, monkeypatch, rt):
    """The stand-in's cuLaunchKernel, which every test above relies on, is itself checked: bytes
    through the pointers, as many as the kernel declares; slots that overlap are refused."""
    standin = install(monkeypatch, rt)
    saxpy = fresh()["saxpy"]
    x, y = DeviceArray.empty(standin, (64,)), DeviceArray.empty(standin, (64,))
    saxpy(2.0, x, y)
    (function,) = standin.functions_loaded
    driver = standin.api().driver
    values = [np.float32(4.0).tobytes(), x.ptr.to_bytes(8, "little"), y.ptr.to_bytes(8, "little"), np.int32(64).tobytes()]
    slots = [ctypes.create_string_buffer(v, len(v)) for v in values]
    pointers = (ctypes.c_void_p * 4)(*[ctypes.addressof(s) for s in slots])
    cuda_standin.FakeDevice(0).set_current()
    assert driver.cuLaunchKernel(function, 1, 1, 1, 64, 1, 1, 0, 1, ctypes.addressof(pointers), 0) == (cuda_standin.R.CUDA_SUCCESS,)
    assert saxpy_params(standin.launches[-1]) == (4.0, x.ptr, y.ptr, 64)
    pointers[3] = ctypes.addressof(slots[2]) + 4  # n inside y's pointer
    (err,) = driver.cuLaunchKernel(function, 1, 1, 1, 64, 1, 1, 0, 1, ctypes.addressof(pointers), 0)
    assert err == cuda_standin.R.CUDA_ERROR_INVALID_VALUE and standin.refused[-1].endswith("the bytes of parameters 2 and 3 overlap")


def test_the_call_path_needs_nothing_of_cuda_core(fresh, monkeypatch, rt):
    """With cuda.core unimportable, calls still check, load, pack and launch: the call path uses
    the driver bindings alone (cuda.core imports NVML and its program compiler: ~300 ms)."""
    standin = install(monkeypatch, rt)
    for name in [n for n in sys.modules if n == "cuda.core" or n.startswith("cuda.core.")]:
        monkeypatch.setitem(sys.modules, name, None)
    kernels = fresh()
    x, y = DeviceArray.empty(standin, (4096,)), DeviceArray.empty(standin, (4096,))
    for _ in range(2):
        kernels["saxpy"](3.0, x, y)
    rows = DeviceArray.empty(standin, (3, 129))
    kernels["row_softmax"](rows, DeviceArray.empty(standin, (3, 129)))
    assert len(standin.launches) == 3


FIRST_CALL = """
import sys
before = set(sys.modules)
import example_pkg.kernels as kernels
imported = set(sys.modules)

class Array:
    def __init__(self, ptr):
        self.__cuda_array_interface__ = {"shape": (4096,), "typestr": "<f4", "data": (ptr, False), "strides": None, "version": 3}

try:
    kernels.saxpy(2.0, Array(0x7F0000000000), Array(0x7F0000100000))
except (kernels._runtime.NoDriverError, ValueError) as exc:  # no GPU here; on a GPU: not device memory
    outcome = type(exc).__name__
called = set(sys.modules)
print("cuda" in {m.split(".")[0] for m in imported - before}, outcome)
print(" ".join(sorted(called - imported)))
"""


def test_a_first_call_imports_nothing_of_cuda_python(example_kernels):
    """In a fresh interpreter over the real driver: importing the kernels loads no CUDA module,
    and neither does the first call: the runtime calls libcuda through ctypes (runtime/libcuda.py),
    never cuda.bindings, cuda.core, NVML or NVRTC. Without a GPU the call ends at loading libcuda
    (NoDriverError), after every import it needs; on a GPU, at the pointers (not device memory)."""
    site = os.path.dirname(os.path.dirname(os.path.dirname(example_kernels.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(FIRST_CALL)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    head, *rest = done.stdout.splitlines()
    cuda_at_import, outcome = head.split()
    assert cuda_at_import == "False" and outcome in ("NoDriverError", "ValueError")
    imported = set(rest[0].split()) if rest else set()
    assert not [m for m in imported if m == "cuda" or m.startswith("cuda.")], imported


def test_the_generated_call_holds_only_numbers_and_its_own_names():
    """The fast call is Python generated per kernel (runtime/fastcall.py) and compiled: nothing
    read from a wheel's table may reach its text. Every string in it is one of the CUDA Array
    Interface's keys, every name one of the template's own, for any mix of argument kinds."""
    import ast
    import re

    from hatch_autotune.runtime.fastcall import source

    numbered = re.compile(r"[apthsro]\d+")  # per argument: its value, pointer, type and layout
    own = set(
        [
            "CUPY",
            "Exception",
            "IndexError",
            "LEGACY",
            "NO_CONSTANTS",
            "PACK_ERRORS",
            "TORCH",
            "TypeError",
            "args",
            "bind",
            "bool",
            "c",
            "cai",
            "call",
            "checked",
            "checks",
            "ckey",
            "codes_get",
            "constants",
            "current",
            "current_stream",
            "d",
            "data",
            "device",
            "driver",
            "err",
            "fast_get",
            "gpu",
            "handle",
            "id",
            "int",
            "key",
            "kwargs",
            "kept_pointer",
            "remake",
            "state",
            "last",
            "last_key",
            "launcher",
            "len",
            "lib",
            "list",
            "m",
            "multi_gpu_device",
            "name",
            "params",
            "plan",
            "reader_of",
            "result",
            "seam",
            "self",
            "single",
            "stream",
            "take_constants",
            "tuple",
            "type",
            "v",
        ]
    )
    for kinds, optional in [((), ()), ((0,), (False,)), ((-1, 4, 16, 1), (False, True, False, True)), ((8,) * 9, (True,) * 9)]:
        tree = ast.parse(source(kinds, optional))
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert strings <= {"data", "typestr", "shape", "strides"}, strings
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
        assert {name for name in names if not numbered.fullmatch(name)} <= own, sorted(names)
        arrays = sum(kind > 0 for kind in kinds)
        assert source(kinds, optional).count("# step: array") == arrays


def test_a_new_driver_state_is_never_launched_with_the_last_plan(fresh, monkeypatch, rt):
    """The generated call keeps its last plan to skip a hash; use_gpu() (a new driver state)
    must drop it with the others: the next call with the same layout is checked again and
    launches the function loaded on the new state."""
    first = install(monkeypatch, rt)
    saxpy = fresh()["saxpy"]
    x, y = DeviceArray.empty(first, (4096,)), DeviceArray.empty(first, (4096,))
    saxpy(1.0, x, y)
    saxpy(2.0, x, y)
    assert saxpy.checked_calls == 1 and len(first.launches) == 2
    second = install(monkeypatch, rt)  # use_gpu: the kernels drop their plans
    u, v = DeviceArray.empty(second, (4096,)), DeviceArray.empty(second, (4096,))
    saxpy(3.0, u, v)
    saxpy(4.0, u, v)
    assert saxpy.checked_calls == 2 and len(first.launches) == 2
    assert [saxpy_params(launch)[:3] for launch in second.launches] == [(3.0, u.ptr, v.ptr), (4.0, u.ptr, v.ptr)]
