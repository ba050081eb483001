"""The launch path down to the driver boundary, on the CPU, through the driver stand-in
(tests/cuda_standin.py): cuda.core's real LaunchConfig and argument packing, a fake driver below.

Every launch's packed parameters are decoded and compared, in order and size, with what the cubin
(or PTX) of the selected variant declares; grid, block and shared memory with the selection's
geometry; the context with the arrays' device, restored afterwards; the stream with the one asked
for. Covered: every example_pkg kernel and type at sizes on, between and around its buckets, on
devices of compute capability 8.0, 8.6, 9.0, 10.0 and 12.0, one and two GPUs, threads with and
without a current context, every kind of stream, no driver at all, and an old cuda-core.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path

import cuda_standin
import numpy as np
import pytest
from cuda.core._utils.cuda_utils import CUDAError
from cuda_standin import DeviceArray, install

SAXPY_SIZES = [1, 7, 4095, 4096, 4097, 100_000, 262_144, 1_000_003, 3_000_001]
SOFTMAX_SHAPES = [(1, 1), (3, 129), (256, 128), (300, 1000), (20_000, 1024), (5, 9000)]
SGEMM_SHAPES = [(1, 1, 1), (37, 29, 19), (256, 256, 256), (300, 1500, 5000), (4096, 100, 4096)]
DEVICES = [(8, 0), (8, 6), (9, 0), (10, 0), (12, 0)]


def expected_params(kernel, values: dict) -> list[bytes]:
    """What the kernel must receive: each argument in C order, as the bytes of its C type."""
    types = values.pop("_types")
    out = []
    for a in kernel.declaration.args:
        v = values[a.name]
        if a.is_array:
            out.append(int(v.ptr).to_bytes(8, "little"))
        else:
            dtype = types.get(a.dtype, a.dtype)
            out.append(np.array(v, dtype=dtype).tobytes())
    return out


def check_launch(launch, kernel, cc, types: dict, key: dict, values: dict, standin):
    sel = kernel.select(arch=cc, **types, **key)
    grid, block, shared = kernel.geometry(sel.config, types, key)
    # (a cubin's header does not tell sm_90a from sm_90: the stand-in names the plain arch)
    assert launch.entry == kernel.entry and launch.binary == sel.binary.rstrip("af")
    assert launch.grid == tuple(grid) + (1,) * (3 - len(grid))
    assert launch.block == tuple(block) + (1,) * (3 - len(block))
    assert launch.shmem == shared
    assert launch.params == expected_params(kernel, {**values, "_types": types})
    binary = kernel.binary(sel)
    declared = (
        cuda_standin.ptx_params(binary.decode(), kernel.entry)
        if sel.binary.startswith("compute_")
        else cuda_standin.cubin_params(binary, kernel.entry)
    )
    assert [len(p) for p in launch.params] == declared  # in order and size, as the binary declares


@pytest.mark.parametrize("cc", DEVICES, ids=lambda cc: f"sm_{cc[0]}{cc[1]}")
def test_every_kernel_and_type_launches_as_its_binary_declares(fresh, monkeypatch, cc, rt):
    standin = install(monkeypatch, rt, ccs=[cc], driver_version=13050)  # 13.5: PTX of NVRTC 13.5 JITs
    kernels = fresh()
    launches = 0
    for dtype in ("float32", "float16"):
        for n in SAXPY_SIZES:
            x, y = DeviceArray.empty(standin, (n,), dtype), DeviceArray.empty(standin, (n,), dtype)
            kernels["saxpy"](1.25, x, y)
            launches += 1
            check_launch(standin.launches[-1], kernels["saxpy"], cc, {"T": dtype}, {"n": n}, {"a": 1.25, "x": x, "y": y, "n": n}, standin)
    for rows, cols in SOFTMAX_SHAPES:
        x, y = DeviceArray.empty(standin, (rows, cols)), DeviceArray.empty(standin, (rows, cols))
        kernels["row_softmax"](x, y)
        launches += 1
        check_launch(
            standin.launches[-1],
            kernels["row_softmax"],
            cc,
            {},
            {"rows": rows, "cols": cols},
            {"x": x, "y": y, "rows": rows, "cols": cols},
            standin,
        )
    for m, n, k in SGEMM_SHAPES:
        a, b, c = (DeviceArray.empty(standin, s) for s in ((m, k), (k, n), (m, n)))
        kernels["sgemm"](a, b, c)
        launches += 1
        check_launch(
            standin.launches[-1],
            kernels["sgemm"],
            cc,
            {},
            {"m": m, "n": n, "k": k},
            {"A": a, "B": b, "C": c, "m": m, "n": n, "k": k},
            standin,
        )
    assert len(standin.launches) == launches and standin.refused == []
    assert all(launch.device == 0 and launch.context_depth == 1 for launch in standin.launches)
    assert standin.stack == []  # this thread had no context; the launches pushed one and popped it


def test_repeated_calls_take_the_fast_path_with_fresh_pointers_and_scalars(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt)
    saxpy = fresh()["saxpy"]
    for i in range(5):
        x, y = DeviceArray.empty(standin, (5000,)), DeviceArray.empty(standin, (5000,))
        saxpy(0.5 + i, x, y)
        check_launch(standin.launches[-1], saxpy, (9, 0), {"T": "float32"}, {"n": 5000}, {"a": 0.5 + i, "x": x, "y": y, "n": 5000}, standin)
    assert saxpy.checked_calls == 1  # only the first call: it recorded the plan once the driver had started
    assert standin.calls.get("cuPointerGetAttribute", 0) <= 2  # one GPU: the fast path asks nothing per array


def test_a_thread_with_the_device_current_launches_without_pushing(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt)
    cuda_standin.FakeDevice(0).set_current()
    kernels = fresh()
    x, y = DeviceArray.empty(standin, (100,)), DeviceArray.empty(standin, (100,))
    for _ in range(3):
        kernels["saxpy"](2.0, x, y)
    assert standin.stack == [0] and standin.calls.get("cuCtxPushCurrent", 0) == 0
    assert [launch.context_depth for launch in standin.launches] == [1, 1, 1]


def test_threads_without_a_context_use_the_fast_path_and_leave_no_context(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt)
    saxpy = fresh()["saxpy"]
    x, y = DeviceArray.empty(standin, (4096,)), DeviceArray.empty(standin, (4096,))
    saxpy(1.0, x, y)  # plans recorded in the main thread
    saxpy(1.0, x, y)
    checked = saxpy.checked_calls
    errors, stacks = [], []
    together = threading.Barrier(4)

    def work():
        try:
            together.wait(timeout=30)  # all four alive at once, so their idents differ
            for _ in range(20):
                saxpy(3.0, x, y)
            stacks.append(list(standin.stack))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and stacks == [[], [], [], []]
    assert saxpy.checked_calls == checked  # no thread fell back to the checked path
    assert standin.refused == []  # and none launched without a context first
    launched = standin.launches[2:]
    assert len(launched) == 80 and len({launch.thread for launch in launched}) == 4
    assert all(launch.context_depth == 1 and launch.param(0, "float32") == 3.0 for launch in launched)


def test_two_gpus_each_call_runs_on_the_arrays_device_and_restores_the_callers(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt, ccs=[(9, 0), (8, 6)])
    cuda_standin.FakeDevice(0).set_current()  # the caller works on device 0
    saxpy = fresh()["saxpy"]
    on0 = [DeviceArray.empty(standin, (70_000,), device=0) for _ in range(2)]
    on1 = [DeviceArray.empty(standin, (70_000,), device=1) for _ in range(2)]
    saxpy(1.0, *on1)
    saxpy(1.0, *on1)
    checked = saxpy.checked_calls
    for _ in range(3):
        saxpy(2.0, *on1)
        saxpy(2.0, *on0)
    assert saxpy.checked_calls == checked + 1  # device 0's plan is recorded once; after that both devices take the fast path
    runs = standin.launches[2:]
    assert [launch.device for launch in runs] == [1, 0] * 3
    assert [launch.binary for launch in runs] == ["sm_80", "sm_90"] * 3  # sm_86 runs the sm_80 cubin
    assert standin.stack == [0]
    with pytest.raises(ValueError, match=r"saxpy\(\): arrays are on different devices \(x on device 0, y on device 1\)"):
        saxpy(1.0, on0[0], on1[1])
    assert len(standin.launches) == 8


@pytest.mark.parametrize("kind", ["none", "cuda.core Stream", "__cuda_stream__", "raw handle"])
def test_every_kind_of_stream_reaches_the_launch(fresh, monkeypatch, kind, rt):
    standin = install(monkeypatch, rt)
    kernels = fresh()
    device = cuda_standin.FakeDevice(0)
    device.set_current()
    created = device.create_stream()

    class CuPyLike:
        def __cuda_stream__(self):
            return (0, created.handle)

    stream = {"none": None, "cuda.core Stream": created, "__cuda_stream__": CuPyLike(), "raw handle": created.handle}[kind]
    x, y = DeviceArray.empty(standin, (10,)), DeviceArray.empty(standin, (10,))
    for _ in range(2):  # the checked path, then the fast path
        kernels["saxpy"](1.0, x, y, stream=stream)
    for launch in standin.launches:
        if kind == "none":
            assert launch.stream.handle == 1 and launch.stream.ordinal is None  # the legacy default stream
        else:
            assert launch.stream is created
    assert len(standin.launches) == 2


def test_a_stream_of_another_device_is_refused_by_the_driver(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt, ccs=[(9, 0), (9, 0)])
    kernels = fresh()
    other = cuda_standin.FakeDevice(1)
    other.set_current()
    stream = other.create_stream()
    x, y = DeviceArray.empty(standin, (10,)), DeviceArray.empty(standin, (10,))
    with pytest.raises(rt.CudaCallError, match=r"^cuLaunchKernel \(saxpy\) failed: CUDA_ERROR_INVALID_HANDLE$"):
        kernels["saxpy"](1.0, x, y, stream=stream)
    assert standin.refused[-1] == "CUDA_ERROR_INVALID_HANDLE: saxpy: stream of device 1 in a context of device 0"
    assert standin.stack == [1]


def test_ptx_newer_than_the_driver_is_a_clear_error_before_the_driver_sees_it(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt, ccs=[(10, 0)], driver_version=13000)  # R580: JITs PTX up to ISA 9.0
    kernels = fresh()
    sel = kernels["saxpy"].select(arch="sm_100", n=4096, T="float32")
    info = kernels["saxpy"].variants[sel.variant].binaries[sel.binary]
    assert sel.binary == "compute_90" and info.ptx_isa == "9.5"
    x, y = DeviceArray.empty(standin, (4096,)), DeviceArray.empty(standin, (4096,))
    with pytest.raises(rt.DriverTooOldError) as err:
        kernels["saxpy"](1.0, x, y)
    msg = str(err.value)
    assert "compute capability 10.0 loads with this driver, CUDA 13.0: compute_90 needs CUDA 13.5" in msg
    assert "`archs`" in msg and "nvidia-cuda-nvrtc==13.0.*" in msg and "min-cuda" not in msg
    assert standin.launches == [] and standin.refused == []


def test_a_cuda_12_driver_is_told_which_driver_each_binary_needs(fresh, monkeypatch, rt):
    """NVRTC 13's cubins (ELF ABI 8) do not load on a CUDA 12 driver, nor its PTX (ISA 9.5) JIT:
    the selection skips them all, and the error names each one's floor, the least upgrade and a
    build for CUDA 12; the driver is never asked to load them (the stand-in, like a driver, would
    refuse with CUDA_ERROR_INVALID_IMAGE)."""
    standin = install(monkeypatch, rt, ccs=[(9, 0)], driver_version=12040)
    rt.use_gpu(standin.api(rt, bindings=(12, 9)))  # the bindings of a CUDA 12 driver (the real ones here are 13)
    kernels = fresh()
    x, y = DeviceArray.empty(standin, (4096,)), DeviceArray.empty(standin, (4096,))
    with pytest.raises(rt.DriverTooOldError) as err:
        kernels["saxpy"](1.0, x, y)
    msg = str(err.value)
    assert (
        "compute capability 9.0 loads with this driver, CUDA 12.4: compute_90 needs CUDA 13.5, sm_90 needs CUDA 13.0 (driver R580 or newer), sm_90a needs CUDA 13.0"
        in msg
    )
    assert "update the NVIDIA driver to CUDA 13.0 (driver R580 or newer)" in msg and 'min-cuda = "12"' in msg
    assert standin.launches == [] and standin.refused == [] and "cuModuleLoadData" not in standin.calls
    # a question about an arch needs no driver, and answers for one new enough
    assert kernels["saxpy"].select(arch="sm_90", n=4096, T="float32").binary == "sm_90a"
    # what the driver itself says when it is handed such a cubin anyway
    cubin = kernels["saxpy"]._selector.binary(kernels["saxpy"].select(arch="sm_90", n=4096, T="float32"))
    cuda_standin.FakeDevice(0).set_current()
    err, _ = standin.api(rt).driver.cuModuleLoadData(cubin)
    assert err == cuda_standin.R.CUDA_ERROR_INVALID_IMAGE and "ELF ABI version 8" in standin.refused[-1]


def test_cuda_bindings_of_a_newer_major_than_the_driver_is_one_clear_error(fresh, monkeypatch, rt):
    """cuda-bindings 13 needs a CUDA 13 driver: on a CUDA 12 one the first call says which
    bindings serve it, before any device query."""
    standin = cuda_standin.StandIn([(9, 0)], 12080)
    monkeypatch.setattr(cuda_standin, "_ACTIVE", [standin])
    rt.use_gpu(standin.api(rt, bindings=(13, 5)))
    kernels = fresh()
    x = DeviceArray.empty(standin, (64,))
    with pytest.raises(
        rt.DriverTooOldError,
        match=r"^cuda-bindings 13\.5 needs a CUDA 13 driver; this driver is CUDA 12\.8: "
        r"install the bindings for this driver \(pip install 'cuda-bindings>=12\.8,<13'\), or update the NVIDIA driver$",
    ):
        kernels["saxpy"](1.0, x, x)
    assert "cuDeviceGetAttribute" not in standin.calls
    rt.use_gpu(standin.api(rt, bindings=(12, 9)))  # bindings of the driver's major (or older) serve
    kernels = fresh()
    with pytest.raises(rt.DriverTooOldError, match=r"sm_90 needs CUDA 13\.0"):  # now only the binaries are too new
        kernels["saxpy"](1.0, x, x)


def test_the_driver_stand_in_refuses_what_a_driver_would(monkeypatch, example_kernels):
    """The checks the launch tests rely on really fire."""
    from cuda.core import LaunchConfig

    standin = install(monkeypatch, ccs=[(9, 0)])  # no runtime: the stand-in's own launch is tested
    saxpy = example_kernels.saxpy
    sel = saxpy.select(arch="sm_90", n=64, T="float32")
    kernel = cuda_standin.FakeObjectCode.from_cubin(saxpy.binary(sel)).get_kernel("saxpy")
    stream = cuda_standin.FakeStream(standin, 1, None)
    good = (np.float32(1), 0x10, 0x20, np.int32(64))
    with pytest.raises(CUDAError, match="CUDA_ERROR_INVALID_CONTEXT"):
        standin.launch(stream, LaunchConfig(grid=1, block=64), kernel, *good)
    cuda_standin.FakeDevice(0).set_current()
    standin.launch(stream, LaunchConfig(grid=1, block=64), kernel, *good)
    with pytest.raises(CUDAError, match=r"packed as 8 bytes .float.; the kernel's parameter is 4 bytes"):
        standin.launch(stream, LaunchConfig(grid=1, block=64), kernel, 1.0, 0x10, 0x20, np.int32(64))
    with pytest.raises(CUDAError, match="3 arguments for 4 parameters"):
        standin.launch(stream, LaunchConfig(grid=1, block=64), kernel, *good[:3])
    with pytest.raises(CUDAError, match="block"):
        standin.launch(stream, LaunchConfig(grid=1, block=2048), kernel, *good)
    sm80 = cuda_standin.FakeObjectCode.from_cubin(saxpy.binary(saxpy.select(arch="sm_80", n=64, T="float32"))).get_kernel("saxpy")
    with pytest.raises(CUDAError, match="CUDA_ERROR_NO_BINARY_FOR_GPU"):
        standin.launch(stream, LaunchConfig(grid=1, block=64), sm80, *good)  # another major: no SASS for it
    assert len(standin.launches) == 1


def test_a_numpy_array_is_a_host_memory_error_on_the_launch_path(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt)
    kernels = fresh()
    y = DeviceArray.empty(standin, (8,))
    with pytest.raises(ValueError, match=r"saxpy\(\): argument 'x' is in host memory; expected a GPU array"):
        kernels["saxpy"](1.0, np.zeros(8, np.float32), y)
    with pytest.raises(ValueError, match="argument 'x' is in host memory"):
        kernels["saxpy"](1.0, np.zeros(8, np.float64), y, stream=0)  # host memory says more than the dtype
    assert standin.launches == []


def test_without_a_driver_every_argument_check_runs_then_one_clear_error(fresh, monkeypatch, rt):
    standin = install(monkeypatch, rt, present=False)
    kernels = fresh()
    x, y = DeviceArray.empty(standin, (8,)), DeviceArray.empty(standin, (8,))
    with pytest.raises(ValueError, match="argument 'y' has shape"):
        kernels["saxpy"](1.0, x, DeviceArray.empty(standin, (9,)))
    with pytest.raises(TypeError, match="argument 'a' must be a number"):
        kernels["saxpy"]("one", x, y)
    with pytest.raises(rt.NoDriverError) as err:
        kernels["saxpy"](1.0, x, y)
    assert "no CUDA driver found" in str(err.value) and "select(arch=" in str(err.value)
    # which bindings are installed, and the driver they need (cuda-bindings 13 on an older driver looks the same)
    assert re.search(r"\(cuda-bindings 13\.\d+ is installed, which needs a CUDA 13 driver\)", str(err.value)), str(err.value)
    with pytest.raises(rt.NoDriverError, match="no CUDA driver found"):
        kernels["saxpy"].select(n=8, T="float32")
    assert kernels["saxpy"].select(arch="sm_90", n=8, T="float32").binary == "sm_90a"  # example_pkg ships sm_90a: 9.0 runs it first


def test_without_a_device_the_error_says_so(fresh, monkeypatch, rt):
    install(monkeypatch, rt, ccs=[])
    with pytest.raises(rt.NoDriverError, match="sees no device"):
        fresh()["saxpy"](1.0, HostlessArray(8), HostlessArray(8))


def test_without_a_driver_for_real(example_kernels, rt):
    """This machine's own state when it has no driver (CI): the real cuda-bindings, no stand-in."""
    try:
        from cuda.bindings import driver

        driver.cuInit(0)
        pytest.skip("this machine has a CUDA driver")
    except RuntimeError:
        pass
    kernels = rt.Library.load(example_kernels._LIBRARY.directory).kernels
    with pytest.raises(ValueError, match="argument 'y' has shape"):
        kernels["saxpy"](1.0, HostlessArray(8), HostlessArray(9))
    with pytest.raises(rt.NoDriverError, match="no CUDA driver found"):
        kernels["saxpy"](1.0, HostlessArray(8), HostlessArray(8))


class HostlessArray:
    """A __cuda_array_interface__ with a made-up pointer, for paths that never reach memory."""

    def __init__(self, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (0x7F0000100000, False), "strides": None, "version": 3}


def write_fake_cuda_core(root: Path, version: str | None, experimental: bool) -> Path:
    core = root / "cuda" / "core"
    core.mkdir(parents=True)
    (core / "__init__.py").write_text("")
    if version:
        (core / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    if experimental:
        (core / "experimental").mkdir()
        (core / "experimental" / "__init__.py").write_text("")
    return root


def test_a_generated_package_never_reads_cuda_core_so_an_old_one_does_not_matter(tmp_path, example_kernels):
    """The call path launches through cuda-bindings alone (wheels no longer depend on cuda-core):
    with a cuda-core of the old `experimental`-only API first on the path, the package imports,
    selects and starts a call (NoDriverError here: no GPU) without importing any of it."""
    old = write_fake_cuda_core(tmp_path / "old", "0.3.2", experimental=True)
    (old / "cuda" / "core" / "__init__.py").write_text("raise ImportError('this cuda-core is not to be imported')\n")
    site = Path(example_kernels._LIBRARY.directory).parents[1]
    script = (
        f"import sys; sys.path[:0] = [{str(old)!r}, {str(site)!r}]; import example_pkg.kernels as k\n"
        "print(k.saxpy.select(arch='sm_90', n=4096, T='float32').binary)\n"
        "a = type('A', (), {'__cuda_array_interface__': {'shape': (8,), 'typestr': '<f4', 'data': (1 << 40, False), 'version': 3}})()\n"
        "try:\n    k.saxpy(1.0, a, a)\nexcept k._runtime.NoDriverError:\n    print('NoDriverError')\n"
        "print(sorted(m for m in sys.modules if m.startswith('cuda.core')))"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:3] == ["sm_90a", "NoDriverError", "[]"]


def test_device_sync_helper_sets_the_device_current_first(monkeypatch):
    """tests/test_gpu.py synchronises through conftest.device_sync: cuda.core refuses sync()
    on a device that was never made current in the thread."""
    import conftest
    import cuda.core

    install(monkeypatch)
    monkeypatch.setattr(cuda.core, "Device", cuda_standin.FakeDevice)  # the helper calls cuda.core itself
    with pytest.raises(CUDAError, match="not yet initialized"):
        cuda.core.Device().sync()
    conftest.device_sync()


def test_the_stand_in_offers_only_what_cuda_core_and_the_driver_have(monkeypatch):
    """Code that passes here must not lean on an API the real cuda.core or driver lacks."""
    import cuda.core
    from cuda.bindings import driver

    api = install(monkeypatch).api()
    assert sorted(n for n in vars(api.driver) if not hasattr(driver, n)) == []
    assert all(hasattr(cuda.core, name) for name in api.CORE_NAMES)
    assert api.LaunchConfig is cuda.core.LaunchConfig  # the real argument packing
    real = {
        "FakeDevice": cuda.core.Device,
        "FakeStream": cuda.core.Stream,
        "FakeEvent": cuda.core.Event,
        "FakeObjectCode": cuda.core.ObjectCode,
    }
    for fake_name, real_cls in real.items():
        fake = getattr(cuda_standin, fake_name)
        public = {n for n in dir(fake) if not n.startswith("_")} - fake.STANDIN_ONLY - {"STANDIN_ONLY"}
        assert public <= set(dir(real_cls)), (fake_name, public - set(dir(real_cls)))


def test_use_gpu_starts_afresh_and_kernels_drop_plans_made_over_the_old_driver(fresh, monkeypatch, rt):
    first = install(monkeypatch, rt)
    saxpy = fresh()["saxpy"]
    for _ in range(2):  # the checked path, then a fast-path plan holding first's loaded cubin
        saxpy(1.0, DeviceArray.empty(first, (4096,)), DeviceArray.empty(first, (4096,)))
    second = install(monkeypatch, rt, ccs=[(8, 6)])
    for _ in range(2):
        saxpy(1.0, DeviceArray.empty(second, (4096,)), DeviceArray.empty(second, (4096,)))
    assert [launch.binary for launch in first.launches] == ["sm_90", "sm_90"]
    assert [launch.binary for launch in second.launches] == ["sm_80", "sm_80"]  # loaded again, from second
    assert second.calls["cuInit"] == 1 and second.refused == []


def test_cubin_sm_reads_the_elf_header():
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[4], header[5], header[8] = 2, 1, 8
    header[18:20] = (190).to_bytes(2, "little")
    header[48:52] = (0x6005A04).to_bytes(4, "little")  # what NVRTC 13 writes for sm_90
    assert cuda_standin.cubin_sm(bytes(header)) == 90
    header[8] = 7  # before ABI version 8 the SM was in the low byte
    assert cuda_standin.cubin_sm(bytes(header)) == 4
    header[18:20] = (62).to_bytes(2, "little")  # x86-64
    with pytest.raises(ValueError, match="EM_CUDA"):
        cuda_standin.cubin_sm(bytes(header))
    with pytest.raises(ValueError, match="not an ELF"):
        cuda_standin.cubin_sm(b"//\n.version 9.0")
