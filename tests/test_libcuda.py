"""The runtime's own driver seam, libcuda through ctypes (hatch_autotune/runtime/libcuda.py),
down to the C ABI: a libcuda.so.1 built here from tests/native/fake_libcuda.c against the real
cuda.h (so the compiler holds each function to the header's signature) records what each call
was given as C received it. The constants and layouts libcuda.py hardcodes are the header's; a
generated kernel's checked and fast calls, a launch from a thread without the context, a failed
launch, a cluster launch, a tensor map and the shared-memory opt-in reach the driver with the
right values. No GPU: what the real driver does with them is the GPU tests' (tests/test_gpu.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from fake_libcuda import DEVICE_BASE, FakeLibcuda, build

from hatch_autotune.runtime import libcuda

EXAMPLE_ARCHS = ("sm_90",)
PRIMARY = 0xC000  # the fake's device 0 primary context


@pytest.fixture(scope="module")
def fake_path(tmp_path_factory):
    return build(tmp_path_factory.mktemp("fake-libcuda"))


@pytest.fixture
def fake(fake_path):
    made = FakeLibcuda(fake_path)
    made.reset()
    yield made
    made.reset()


class Array:
    """A __cuda_array_interface__ array in the fake's device memory (device 0)."""

    def __init__(self, ptr: int, n: int):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "strides": None, "version": 3}


def make_current(fake: FakeLibcuda) -> None:
    assert fake.lib.cuCtxPushCurrent_v2(ctypes.c_void_p(PRIMARY)) == 0


def test_the_constants_and_layouts_are_the_headers(fake):
    """Every enum value libcuda.py hardcodes, and the layouts of the structs it passes by
    pointer, equal cuda.h's (read from the fake, which the C compiler built from the header)."""
    ours = {}
    for holder in (
        libcuda.CUdevice_attribute, libcuda.CUpointer_attribute, libcuda.CUfunction_attribute, libcuda.CUlaunchAttributeID,
        libcuda.CUtensorMapDataType, libcuda.CUtensorMapInterleave, libcuda.CUtensorMapSwizzle, libcuda.CUtensorMapL2promotion,
        libcuda.CUtensorMapFloatOOBfill,
    ):  # fmt: skip
        ours.update({name: value for name, value in vars(holder).items() if name.startswith("CU_")})
    header = {name: value for name, value in fake.constants.items() if name.startswith("CU_")}
    assert ours == header
    assert fake.constants["sizeof(CUlaunchConfig)"] == ctypes.sizeof(libcuda.CUlaunchConfig)
    for field in ("sharedMemBytes", "hStream", "numAttrs"):
        assert fake.constants[f"offsetof(CUlaunchConfig, {field})"] == getattr(libcuda.CUlaunchConfig, field).offset
    assert fake.constants["offsetof(CUlaunchConfig, attrs)"] == libcuda.CUlaunchConfig._attrs.offset
    assert fake.constants["sizeof(CUlaunchAttribute)"] == ctypes.sizeof(libcuda.CUlaunchAttribute)
    assert fake.constants["offsetof(CUlaunchAttribute, value)"] == libcuda.CUlaunchAttribute.value.offset
    assert fake.constants["sizeof(CUtensorMap)"] == libcuda.TENSOR_MAP_BYTES


def test_a_kernel_is_checked_then_launched_from_kept_arguments(fake, fresh, rt, monkeypatch):
    """saxpy over the fake: the first call loads the module (an ELF cubin, the kernel's entry)
    and launches; later calls take the fast path, which calls the raw cuLaunchKernel with the
    plan's kept arguments (never the wrapper); the driver receives the grid and block the
    selection gives, the legacy stream, no `extra`, and kernelParams pointing at a, x, y, n."""
    api = rt.CudaApi.libcuda(str(fake.path))
    gpu = rt.use_gpu(api)
    assert gpu.kind == "ctypes"
    saxpy = fresh()["saxpy"]
    n = 5000
    x, y = Array(DEVICE_BASE + 0x1000, n), Array(DEVICE_BASE + 0x9000, n)
    make_current(fake)
    saxpy(1.5, x, y)
    state = fake.state
    assert bytes(state.image_head[:4]) == b"\x7fELF" and state.function_name.decode() == saxpy.entry
    sel = saxpy.select("sm_90", n=n, T="float32")
    grid, block, shared = saxpy.geometry(sel.config, {"T": "float32"}, {"n": n})
    assert tuple(state.grid) == (*grid, 1, 1)[:3] and tuple(state.block) == (*block, 1, 1)[:3] and state.shared == shared
    monkeypatch.setattr(api.driver, "cuLaunchKernel", lambda *args: pytest.fail("the fast path called the wrapper"))
    for a in (2.5, -4.0):
        saxpy(a, x, y)
        params = list(state.params[:4])
        assert struct.unpack("<f", struct.pack("<I", params[0] & 0xFFFFFFFF))[0] == a
        assert params[1:3] == [DEVICE_BASE + 0x1000, DEVICE_BASE + 0x9000] and params[3] & 0xFFFFFFFF == n
        assert state.stream == 1 and state.extra is None and state.function == 0xF000
    assert saxpy.checked_calls == 1 and state.launches == 3 and state.pushes == 1 and state.depth == 1


def test_a_thread_without_the_context_launches_in_it_and_leaves_none(fake, fresh, rt):
    """With no current context (a new thread), each launch pushes the device's primary context
    and pops it: the driver sees it current during the launch, the thread none afterwards."""
    rt.use_gpu(rt.CudaApi.libcuda(str(fake.path)))
    saxpy = fresh()["saxpy"]
    x, y = Array(DEVICE_BASE, 256), Array(DEVICE_BASE + 0x400, 256)
    for a in (1.0, 2.0, 3.0):
        saxpy(a, x, y)
    state = fake.state
    assert state.launches == 3 and state.depth == 0 and state.pushes == state.pops >= 3


def test_a_failed_launch_is_named_by_the_driver_and_the_next_call_launches(fake, fresh, rt):
    rt.use_gpu(rt.CudaApi.libcuda(str(fake.path)))
    saxpy = fresh()["saxpy"]
    x, y = Array(DEVICE_BASE, 256), Array(DEVICE_BASE + 0x400, 256)
    make_current(fake)
    saxpy(1.0, x, y)
    fake.state.fail_launch = 700
    with pytest.raises(rt.errors.CudaCallError, match=r"cuLaunchKernel \(saxpy\).*CUDA_ERROR_ILLEGAL_ADDRESS"):
        saxpy(2.0, x, y)
    fake.state.fail_launch = 999  # a code the driver has no name for: its number
    with pytest.raises(rt.errors.CudaCallError, match="CUDA error 999"):
        saxpy(2.0, x, y)
    saxpy(3.0, x, y)
    assert fake.state.launches == 4 and saxpy.checked_calls == 1


def test_a_cluster_launch_a_tensor_map_and_the_shared_memory_opt_in_reach_the_driver(fake, rt):
    """launching.ExConfig and GpuState.launch_ex (a cluster), tensor_map.encode_tiled and
    GpuState.allow_shared over libcuda: the fake receives each value as the header lays it out."""
    from hatch_autotune.runtime.launching import ExConfig
    from hatch_autotune.runtime.tensor_map import encode_tiled

    gpu = rt.use_gpu(rt.CudaApi.libcuda(str(fake.path)))
    gpu.start()
    driver = gpu.driver
    make_current(fake)
    head = (0xF000, 8, 2, 1, 128, 1, 1, 4096)
    launch = ExConfig(driver, head, (2, 1, 1))
    params = np.array([7, 8, 9, 10], np.uint64)  # four parameters, each its own 8 bytes
    pointers = np.array([params.ctypes.data + 8 * i for i in range(4)], np.uint64)
    gpu.launch_ex(0, launch, 0x5, head[0], pointers.ctypes.data, "a cluster")
    state = fake.state
    assert state.launches_ex == 1 and state.attr_count == 1 and state.attr_id == 4 and tuple(state.cluster) == (2, 1, 1)
    assert tuple(state.grid) == (8, 2, 1) and tuple(state.block) == (128, 1, 1) and state.shared == 4096
    assert state.stream == 0x5 and list(state.params[:4]) == [7, 8, 9, 10]

    args = ("BFLOAT16", 2, (64, 4096), (128,), (64, 128), "128B", "L2_128B", "NAN_REQUEST_ZERO_FMA")
    err, tensor_map = encode_tiled(driver, args, DEVICE_BASE + 0x10000)
    assert int(err) == 0 and tensor_map.getPtr() % 64 == 0 and state.tm_aligned == 1
    assert (state.tm_dtype, state.tm_rank, state.tm_address) == (9, 2, DEVICE_BASE + 0x10000)
    assert list(state.tm_dims[:2]) == [64, 4096] and state.tm_strides[0] == 128
    assert list(state.tm_box[:2]) == [64, 128] and list(state.tm_elements[:2]) == [1, 1]
    assert (state.tm_interleave, state.tm_swizzle, state.tm_l2, state.tm_oob) == (0, 3, 2, 1)
    assert ctypes.string_at(tensor_map.getPtr(), 8) == struct.pack("<Q", DEVICE_BASE + 0x10000)

    fake.state.static_shared = 1024
    gpu.allow_shared(0, 0xF000, 100 * 1024, "a kernel")
    assert fake.state.dynamic_shared == 100 * 1024
    with pytest.raises(ValueError, match=r"asks 240000 bytes .* at most 232448"):
        gpu.allow_shared(0, 0xF000, 240_000, "a kernel")


def test_without_libcuda_a_call_is_no_driver_naming_the_library(rt, monkeypatch):
    monkeypatch.setattr(rt.libcuda, "LIBRARY", "/nonexistent/libcuda.so.1")  # the generated package's own runtime
    gpu = rt.use_gpu(None)
    with pytest.raises(rt.NoDriverError, match=r"no CUDA driver found \(OSError: /nonexistent/libcuda.so.1"):
        gpu.start()
    with pytest.raises(OSError, match="has no cuGetErrorName: not a CUDA driver"):
        libcuda.LibCuda(ctypes.util.find_library("c") or "libc.so.6")


FIRST_CALL = """
import sys
import example_pkg.kernels as kernels
before = set(sys.modules)

class Array:
    def __init__(self, ptr):
        self.__cuda_array_interface__ = {"shape": (4096,), "typestr": "<f4", "data": (ptr, False), "strides": None, "version": 3}

kernels._runtime.use_gpu(kernels._runtime.CudaApi.libcuda(sys.argv[1]))
kernels.saxpy(2.0, Array(0x700000001000), Array(0x700000100000))
kernels.saxpy(3.0, Array(0x700000001000), Array(0x700000100000))
print(kernels.saxpy.checked_calls, " ".join(sorted(set(sys.modules) - before)))
"""


def test_a_first_call_over_libcuda_imports_no_cuda_python(fake_path, example_kernels):
    """In a fresh interpreter: two calls over the fake libcuda import nothing of cuda-python
    (neither cuda.bindings nor cuda.core): the runtime's seam is ctypes, which numpy loads anyway."""
    import os

    site = os.path.dirname(os.path.dirname(os.path.dirname(example_kernels.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FIRST_CALL), str(fake_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    checked, *imported = done.stdout.split()
    assert checked == "1"
    assert not [m for m in imported if m == "cuda" or m.startswith("cuda.")], imported


def test_only_the_pointer_attribute_the_runtime_reads_is_asked(fake, rt):
    """LibCuda declares cuPointerGetAttribute for the device ordinal alone (a 4-byte answer);
    another attribute, whose answer may be wider, is refused before the driver writes it."""
    driver = rt.CudaApi.libcuda(str(fake.path)).driver
    ordinal = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    err, device = driver.cuPointerGetAttribute(ordinal, DEVICE_BASE + 64)
    assert int(err) == 0 and device == 0
    assert driver.cuPointerGetAttribute(ordinal, 0x1000)[0].name == "CUDA_ERROR_INVALID_VALUE"  # host memory: the driver's answer
    with pytest.raises(ValueError, match="attribute 1 is not one the runtime reads"):
        driver.cuPointerGetAttribute(1, DEVICE_BASE + 64)  # CU_POINTER_ATTRIBUTE_CONTEXT: a pointer-sized answer


def test_code_beyond_the_call_path_gets_cuda_bindings_not_the_ctypes_seam(rt, monkeypatch):
    """cuda_api() (the tuning worker's) needs memory, streams and events, which libcuda.py does
    not declare: over the runtime's default state it installs CudaApi.load's (cuda-bindings);
    over a state a test or caller set, it keeps that one."""
    import cuda_standin

    standin = cuda_standin.StandIn([(9, 0)], 13000)
    loaded = []
    monkeypatch.setattr(rt.CudaApi, "load", classmethod(lambda cls, driver=None: loaded.append(1) or standin.api(rt)))
    rt.use_gpu(None)
    assert rt.cuda_seam.current.kind == "ctypes"
    api = rt.cuda_api()
    assert loaded == [1] and rt.cuda_seam.current.kind == "tuple" and api is rt.cuda_seam.current.api
    given = standin.api(rt)
    rt.use_gpu(given)
    assert rt.cuda_api() is given and loaded == [1]
