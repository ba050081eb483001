"""One wheel for CUDA 12 and CUDA 13 drivers (docs/drivers.md), end to end without a GPU.

example_pkg (its FP32 kernels, for sm_90: what the run-time side needs, built fast) is built by
`pip wheel` with `min-cuda = "12"`: NVRTC 12 (through ctypes, beside the build side's
cuda-bindings 13) compiles every binary; a kernel with the toolkit's headers compiles against the
CUDA 12 headers of the `-cu12` distributions. The wheel is installed into two fresh virtual environments, one with cuda-bindings
12 and one with 13, and called there over the driver stand-in (tests/cuda_standin.py, which uses
that environment's real cuda-bindings enums and structs) reporting CUDA 12.4, 12.8 and 13.0: the
cubin that each driver loads runs, its launch decodes to the right values (an emulated saxpy's
output is checked), and each case that cannot run (cuda-bindings 13 on a CUDA 12 driver; NVRTC
13's cubins on a CUDA 12 driver) is one clear error. Only the driver is a stand-in. The same
wheel, in a venv without cuda-python, runs over the runtime's own seam, libcuda through ctypes,
against a libcuda built from cuda.h (tests/native/fake_libcuda.c) that reports each version.
"""

from __future__ import annotations

import json
import os
import re
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import build, copy_example
from test_wheel import fresh_venv, pip_env, pip_into, run

from hatch_autotune.wheel.payload import write_package

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
DRIVERS = (12040, 12080, 13000)  # what the stand-in's cuDriverGetVersion reports: CUDA 12.4, 12.8, 13.0

# Run in a fresh venv: example_pkg's saxpy over the stand-in at each driver version, as JSON.
CHECK = """
import json, sys
sys.path.insert(0, {tests!r})
import numpy as np
import cuda.bindings
import cuda_standin
import example_pkg.kernels as kernels

rt = kernels._runtime

def saxpy(standin, kernel, launch):  # what the kernel computes, from the parameters as it reads them
    a, x, y, n = (launch.param(0, "float32"), int(launch.param(1, "uint64")), int(launch.param(2, "uint64")),
                  int(launch.param(3, "int32")))
    ys = standin.view(y, "float32", n)
    ys[:] = a * standin.view(x, "float32", n) + ys
    return 0.01

cuda_standin.EMULATORS["saxpy"] = saxpy
out = {{"bindings": cuda.bindings.__version__, "cuda_core": "cuda.core" in sys.modules}}
for version in {drivers!r}:
    standin = cuda_standin.StandIn([(9, 0)], version)
    cuda_standin._ACTIVE[:] = [standin]
    rt.use_gpu(standin.api(rt))
    library = rt.Library.load(kernels._LIBRARY.directory)
    x = cuda_standin.DeviceArray(standin, np.arange(1001, dtype=np.float32))
    y = cuda_standin.DeviceArray(standin, np.ones(1001, dtype=np.float32))
    try:
        library.kernels["saxpy"](2.0, x, y)
        launch = standin.launches[-1]
        row = {{"binary": launch.binary, "n": int(launch.param(3, "int32")),
                "right": bool(np.array_equal(standin.view(y.ptr, "float32", 1001), 2 * np.arange(1001, dtype=np.float32) + 1))}}
    except Exception as exc:
        row = {{"error": type(exc).__name__, "message": str(exc), "launches": len(standin.launches)}}
    out[str(version)] = row
# this cuda-bindings' structs as the runtime fills them (on a CUDA 13.0 driver): a cluster launch's
# CUlaunchConfig, read back, and a tensor map, decoded from the arrays the stand-in was handed
from example_pkg.kernels._runtime import cuda_seam, launching, tensor_map
standin = cuda_standin.StandIn([(9, 0)], 13000)
cuda_standin._ACTIVE[:] = [standin]
rt.use_gpu(standin.api(rt))
gpu = cuda_seam.current
gpu.start()
c = launching.ExConfig(gpu.driver, (0, 8, 2, 1, 128, 1, 1, 4096), (2, 1, 1)).config
out["cluster_config"] = [c.gridDimX, c.gridDimY, c.blockDimX, c.sharedMemBytes, c.numAttrs, c.attrs[0].value.clusterDim.x]
decl = rt.TensorMapDecl(array="A", box=(), swizzle="128B", l2_promotion="none", oob_fill="zero", when=None, order="declared")
a = cuda_standin.DeviceArray(standin, np.zeros((128, 256), np.float32))
found = cuda_standin.decode_tensor_map(tensor_map.encoder(gpu, 0, "A_map", decl, "float32", (128, 256), None, (32, 32))(a.ptr))
out["tensor_map"] = {{k: found[k] for k in ("address", "dims", "strides", "box", "swizzle")}}
out["a_ptr"] = a.ptr
out["cuda_core_after"] = "cuda.core" in sys.modules
print(json.dumps(out))
"""


# Run in a fresh venv without cuda-python: example_pkg's saxpy over the fake libcuda
# (tests/native/fake_libcuda.c, through the runtime's own ctypes seam) at each driver version, as JSON.
CHECK_LIBCUDA = """
import ctypes, importlib.util, json, sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from fake_libcuda import DEVICE_BASE, FakeLibcuda
import example_pkg.kernels as kernels

rt = kernels._runtime
fake = FakeLibcuda(Path({library!r}))

class Array:
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {{"shape": (n,), "typestr": "<f4", "data": (ptr, False), "strides": None, "version": 3}}

out = {{"cuda_installed": importlib.util.find_spec("cuda") is not None}}
for version in {drivers!r}:
    state = fake.reset(version=version)
    rt.use_gpu(rt.CudaApi.libcuda({library!r}))
    assert fake.lib.cuCtxPushCurrent_v2(ctypes.c_void_p(0xC000)) == 0  # the device's primary context, current
    library = rt.Library.load(kernels._LIBRARY.directory)
    try:
        for a in (2.0, 3.0):  # the checked call, then the fast one
            library.kernels["saxpy"](a, Array(DEVICE_BASE + 0x1000, 1001), Array(DEVICE_BASE + 0x9000, 1001))
        row = {{"elf": [state.image_head[7], state.image_head[8]], "launches": state.launches, "params": list(state.params[1:3]),
                "n": state.params[3] & 0xFFFFFFFF}}
    except Exception as exc:
        row = {{"error": type(exc).__name__, "message": str(exc), "loads": state.loads, "launches": state.launches}}
    out[str(version)] = row
out["cuda_python_imported"] = sorted(m for m in sys.modules if m == "cuda" or m.startswith("cuda."))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory) -> Path:
    from fake_libcuda import build as build_fake

    return build_fake(tmp_path_factory.mktemp("fake-libcuda"))


def check_over_libcuda(py: Path, cwd: Path, library: Path, site: Path | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(site)} if site else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = run([str(py), "-c", CHECK_LIBCUDA.format(tests=str(TESTS), drivers=DRIVERS, library=str(library))], cwd=cwd, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_without_cuda_python_each_driver_runs_what_it_loads_over_libcuda(cu12_wheel, cu13_site, fake_libcuda, tmp_path):
    """The CUDA 12 wheel installed alone (pip brings numpy, nothing of cuda-python), called over a
    libcuda built against cuda.h that reports CUDA 12.4, 12.8 and 13.0 and refuses, as a CUDA 12
    driver does, the ELF ABI 8 of NVRTC 13's cubins: each loads the NVRTC 12 cubin and launches
    it, checked then fast, with the call's pointers and size; cuda-python is neither there nor
    imported. In the same venv, example_pkg as it ships (NVRTC 13): a CUDA 12 driver gets one
    DriverTooOldError before anything loads; CUDA 13.0 loads the ABI 8 cubin and runs it."""
    py = venv_with(tmp_path / "venv", str(cu12_wheel[0]))
    out = check_over_libcuda(py, tmp_path, fake_libcuda)
    assert out["cuda_installed"] is False and out["cuda_python_imported"] == []
    for version in map(str, DRIVERS):
        assert out[version] == {"elf": [0x33, 7], "launches": 2, "params": [0x7000_0000_1000, 0x7000_0000_9000], "n": 1001}, out[version]
    out = check_over_libcuda(py, tmp_path, fake_libcuda, site=cu13_site)
    for version in ("12040", "12080"):
        row = out[version]
        assert row["error"] == "DriverTooOldError" and row["loads"] == 0 and row["launches"] == 0, row
        assert 'min-cuda = "12"' in row["message"] and "update the NVIDIA driver to CUDA 13.0 (driver R580 or newer)" in row["message"]
    assert out["13000"]["elf"] == [0x41, 8] and out["13000"]["launches"] == 2


@pytest.fixture(scope="module")
def cu13_site(session_cache, tmp_path_factory) -> Path:
    """The same kernels as example_pkg ships them (NVRTC 13), for sm_90, as an importable site."""
    tmp = tmp_path_factory.mktemp("cu13")
    src = copy_example(tmp / "src", fp32_only=True)
    env = {"HATCH_AUTOTUNE_ARCHS": "sm_90"}
    from conftest import load_project

    site = tmp / "site"
    (site / "example_pkg").mkdir(parents=True)
    (site / "example_pkg" / "__init__.py").write_text("")
    write_package(site / "example_pkg" / "kernels", load_project(src, env), build(src, session_cache, env=env))
    return site


def elf_abi(cubin: bytes) -> tuple[int, int]:
    """(EI_OSABI, EI_ABIVERSION) of a cubin: (0x33, 7) from NVRTC 12, (0x41, 8) from NVRTC 13."""
    return cubin[7], cubin[8]


@pytest.fixture(scope="module")
def cu12_wheel(plugin_dist, session_cache, tmp_path_factory) -> tuple[Path, str]:
    """example_pkg's FP32 kernels with `min-cuda = "12"`, for sm_90 (and its PTX), built by pip
    without build isolation (this environment has hatch-autotune[cu12]): (the wheel, pip's log)."""
    tmp = tmp_path_factory.mktemp("cu12")
    src = copy_example(tmp / "src", fp32_only=True)
    text = (src / "pyproject.toml").read_text()
    marker = 'module = "example_pkg.kernels"'
    assert marker in text
    (src / "pyproject.toml").write_text(text.replace(marker, marker + '\nmin-cuda = "12"', 1))
    env = {**pip_env(plugin_dist, session_cache, tmp), "HATCH_AUTOTUNE_ARCHS": "sm_90"}
    out = tmp / "out"
    proc = run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)], env=env)
    (wheel,) = out.glob("example_pkg-*.whl")
    return wheel, proc.stdout + proc.stderr


def test_a_cuda_12_floor_ships_nvrtc_12_binaries_with_their_driver_floors(cu12_wheel):
    wheel, log = cu12_wheel
    assert re.search(r"\(NVRTC 12\.9, build 12\.9\.\d+; binaries for CUDA 12 drivers and newer\)", log), log[-3000:]
    # the lock's winners were timed with NVRTC 13: used, and said so (exact-nvrtc = true re-tunes them)
    assert re.search(r"lock entries were tuned with NVRTC 13\.\d and this build uses NVRTC 12\.9", log), log[-3000:]
    with zipfile.ZipFile(wheel) as zf:
        table = json.loads(zf.read("example_pkg/kernels/table.json"))
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        binaries = {n: zf.read(n) for n in zf.namelist() if n.endswith((".cubin", ".ptx"))}
    assert table["provenance"]["nvrtc"] == "12.9"
    # cubins load on every CUDA 12 driver (minor-version compatibility); PTX of ISA 8.8 JITs on 12.9 and newer
    assert table["drivers"] == {"compute_90": "12.9", "sm_90": "12.0"}
    cubins = [b for n, b in binaries.items() if n.endswith(".cubin")]
    assert cubins and all(elf_abi(b) == (0x33, 7) for b in cubins)  # NVRTC 12's ELF ABI, which CUDA 12 drivers load
    assert all(b".version 8.8" in b for n, b in binaries.items() if n.endswith(".ptx"))
    # the hook declares what the generated module imports: numpy; the driver through ctypes, no cuda-python
    requires = sorted(line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:"))
    assert [r for r in requires if "extra ==" not in r] == ["numpy>=1.24"]
    assert "cuda-core" not in metadata and "cuda-bindings" not in metadata
    shown = run([sys.executable, "-m", "hatch_autotune", "show", str(wheel)]).stdout
    assert "the driver each binary needs (a call skips those the driver cannot load): compute_90: CUDA 12.9+, sm_90: CUDA 12.0+" in shown


def venv_with(tmp: Path, *packages: str, env: dict | None = None) -> Path:
    py = fresh_venv(tmp)
    pip_into(py, *packages, env=env)
    return py


def check_in(py: Path, cwd: Path, site: Path | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(site)} if site else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = run([str(py), "-c", CHECK.format(tests=str(TESTS), drivers=DRIVERS)], cwd=cwd, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_structs_filled(out: dict) -> None:
    """The runtime's cluster config and tensor map, as this cuda-bindings' types carried them."""
    assert out["cluster_config"] == [8, 2, 128, 4096, 1, 2]
    assert out["tensor_map"] == {"address": out["a_ptr"], "dims": [256, 128], "strides": [1024], "box": [32, 32], "swizzle": 3}


@pytest.fixture(scope="module")
def venv12(cu12_wheel, tmp_path_factory) -> Path:
    """A fresh venv with the CUDA 12 wheel and cuda-bindings 12 (the tuning worker's seam on a
    CUDA 12 machine), shared by the tests that run over that bindings' stand-in."""
    return venv_with(tmp_path_factory.mktemp("venv12") / "venv", str(cu12_wheel[0]), "cuda-bindings>=12.8,<13")


def test_with_cuda_bindings_12_every_cuda_12_and_13_driver_runs_the_cuda_12_wheel(venv12, tmp_path):
    out = check_in(venv12, tmp_path)
    assert out["bindings"].startswith("12.")
    for version in map(str, DRIVERS):
        assert out[version] == {"binary": "sm_90", "n": 1001, "right": True}, (version, out[version])
    assert_structs_filled(out)
    assert out["cuda_core"] is False and out["cuda_core_after"] is False  # not installed, not needed


def test_with_cuda_bindings_13_a_cuda_12_driver_is_told_which_bindings_serve_it(cu12_wheel, tmp_path):
    py = venv_with(tmp_path / "venv13", str(cu12_wheel[0]), "cuda-bindings>=13,<14")  # the tuning worker's bindings
    out = check_in(py, tmp_path)
    assert out["bindings"].startswith("13.")
    for version, words in (("12040", "12.4"), ("12080", "12.8")):
        assert out[version]["error"] == "DriverTooOldError" and out[version]["launches"] == 0
        assert out[version]["message"] == (
            f"cuda-bindings {'.'.join(out['bindings'].split('.')[:2])} needs a CUDA 13 driver; this driver is CUDA {words}: "
            "install the bindings for this driver (pip install 'cuda-bindings>=12.8,<13'), or update the NVIDIA driver"
        )
    assert out["13000"] == {"binary": "sm_90", "n": 1001, "right": True}
    assert_structs_filled(out)


def test_nvrtc_13_binaries_on_a_cuda_12_driver_are_one_clear_error(cu13_site, venv12, tmp_path):
    """example_pkg as it ships (NVRTC 13: cubins of ELF ABI 8, PTX of ISA 9.5), run with
    cuda-bindings 12: a CUDA 12 driver gets each binary's floor and the two fixes; 13.0 runs it."""
    out = check_in(venv12, tmp_path, site=cu13_site)  # the site's example_pkg comes first on the path
    for version, words in (("12040", "12.4"), ("12080", "12.8")):
        assert out[version]["error"] == "DriverTooOldError" and out[version]["launches"] == 0
        message = out[version]["message"]
        assert message.startswith(
            f"no binary of this wheel that runs on a device of compute capability 9.0 loads with this driver, CUDA {words}: "
            "compute_90 needs CUDA 13.5, sm_90 needs CUDA 13.0 (driver R580 or newer)"
        ), message
        assert 'min-cuda = "12"' in message and "update the NVIDIA driver to CUDA 13.0 (driver R580 or newer)" in message
    assert out["13000"] == {"binary": "sm_90", "n": 1001, "right": True}


def test_the_stand_in_plays_a_cuda_12_driver_refusing_nvrtc_13_cubins(cu12_wheel, cu13_site):
    """What the selection avoids is what a CUDA 12 driver does: it refuses an ELF ABI 8 cubin
    (CUDA_ERROR_INVALID_IMAGE) and loads the ABI 7 one; a CUDA 13 driver loads both."""
    import cuda_standin

    with zipfile.ZipFile(cu12_wheel[0]) as zf:
        cubin12 = next(zf.read(n) for n in zf.namelist() if n.endswith(".sm_90.cubin"))
    cubin13 = next((cu13_site / "example_pkg" / "kernels" / "bin").glob("*.sm_90.cubin")).read_bytes()
    assert elf_abi(cubin13) == (0x41, 8) and elf_abi(cubin12) == (0x33, 7)
    for version, refused in ((12040, True), (13000, False)):
        standin = cuda_standin.StandIn([(9, 0)], version)
        driver = standin.api().driver
        driver.cuInit(0)
        standin.stack.append(0)  # the device's context current, as cuCtxPushCurrent leaves it
        assert driver.cuModuleLoadData(cubin12)[0] == cuda_standin.R.CUDA_SUCCESS
        err = driver.cuModuleLoadData(cubin13)[0]
        assert (err == cuda_standin.R.CUDA_ERROR_INVALID_IMAGE) is refused


@pytest.mark.parametrize(
    "declared,added,warned",
    [
        ([], ["numpy>=1.24"], []),
        (["numpy>=2"], [], []),  # the author's own range rules
        (["cuda_bindings>=13,<14"], ["numpy>=1.24"], ["never imports cuda-bindings"]),
        (["cuda-core>=1.0", "numpy"], [], ["never imports cuda-core"]),
    ],
)
def test_the_hook_adds_the_run_time_dependencies_the_project_does_not_name(declared, added, warned):
    from types import SimpleNamespace

    from hatch_autotune.hatch.plugin import AutotuneBuildHook
    from hatch_autotune.wheel.payload import runtime_requirements

    said: list[str] = []
    hook = SimpleNamespace(metadata=SimpleNamespace(core=SimpleNamespace(dependencies=declared)), _say=said.append)
    assert AutotuneBuildHook._runtime_dependencies(hook, runtime_requirements()) == added
    assert len(said) == len(warned) and all(w in s and s.startswith("warning: ") for w, s in zip(warned, said))


HEADERS_KERNEL = """
#include <cuda_bf16.h>
#include <cub/block/block_reduce.cuh>
extern "C" __global__ void row_sum(const __nv_bfloat16* x, float* out, int n) {
    using Reduce = cub::BlockReduce<float, 128>;
    __shared__ typename Reduce::TempStorage scratch;
    float v = threadIdx.x < n ? __bfloat162float(x[threadIdx.x]) : 0.0f;
    float total = Reduce(scratch).Sum(v);
    if (threadIdx.x == 0) *out = total;
}
"""


def test_the_toolkit_headers_for_nvrtc_12_are_the_cu12_distributions(tmp_path):
    """The header set `cuda` for NVRTC 12 (which carries none): the runtime's, CCCL's and nvcc's
    crt/ folders of the -cu12 distributions, never CUDA 13's; a bf16 + CUB kernel compiles there
    to an ELF ABI 7 cubin, and the same job without the set does not find the headers."""
    from hatch_autotune.compile import nvrtc
    from hatch_autotune.compile.headers import resolve_header_sets
    from hatch_autotune.declare.headers import TOOLKIT_SET

    (cu12,) = resolve_header_sets((TOOLKIT_SET,), tmp_path, nvrtc=12)
    (cu13,) = resolve_header_sets((TOOLKIT_SET,), tmp_path, nvrtc=13)
    assert cu12.label.startswith("CUDA 12 headers and CCCL from nvidia-cuda-runtime-cu12 12.9.")
    assert [Path(f).parts[-2:] for f in cu12.folders] == [("cuda_runtime", "include"), ("cuda_cccl", "include"), ("cuda_nvcc", "include")]
    assert cu12.identity != cu13.identity and "NVRTC 13" in cu13.label
    job = nvrtc.CompileJob(HEADERS_KERNEL, "sm_90", "row_sum", header_sets=(cu12,), nvrtc=12)
    ok, cubin, log = nvrtc.compile_one(job)
    assert ok and elf_abi(cubin) == (0x33, 7), log[-2000:]
    bare = nvrtc.compile_one(nvrtc.CompileJob(HEADERS_KERNEL, "sm_90", "row_sum", nvrtc=12))
    assert not bare[0] and "cuda_bf16.h" in bare[2]


@pytest.mark.parametrize(
    "config",
    [
        {
            "WGMMA": 0,
            "BM": 16,
            "BN": 32,
            "BK": 32,
            "WM": 16,
            "WN": 32,
            "STAGES": 4,
            "SPLITK": 4,
            "GROUP_M": 8,
        },  # mma.sync, split-K over a cluster
        {"WGMMA": 1, "BM": 128, "BN": 128, "BK": 64, "WM": 64, "WN": 64, "STAGES": 4, "SPLITK": 1, "GROUP_M": 8},  # wgmma + TMA + mbarriers
    ],
)
def test_the_tensor_core_gemm_compiles_with_nvrtc_12_for_sm_90a(config):
    """The showcase's Hopper paths under `min-cuda = "12"`: NVRTC 12.9 and the CUDA 12 headers
    compile them to cubins a CUDA 12 driver loads."""
    from conftest import EXAMPLE, hook_table

    from hatch_autotune.compile import nvrtc
    from hatch_autotune.compile.render import render_config
    from hatch_autotune.declare.config import parse_project

    table = {**hook_table(EXAMPLE), "min-cuda": "12"}
    spec = parse_project(table, EXAMPLE).kernels["gemm"]
    assert spec.nvrtc == 12
    types = {"T": "bfloat16", "A_unit_stride": True, "B_unit_stride": False}
    variant, _ = render_config(spec, types, config)
    ok, cubin, log = nvrtc.compile_one(variant.compile_job("sm_90a", spec.entry, spec.nvrtc_options))
    assert ok and elf_abi(cubin) == (0x33, 7), log[-2000:]
