"""Shared fixtures: small real projects on disk, and one compile cache per test run.

Nothing here mocks NVRTC: every build in the tests really compiles. Only the GPU is absent.
"""

from __future__ import annotations

import os

# Ray (tests/test_cluster.py) stays on loopback: read when Ray is first imported, so set before
# any test module imports it. Without it Ray rewrites 127.0.0.1 to the machine's outward IP.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
# On an xdist worker, one BLAS (OpenMP) thread, read when numpy or torch is first imported: the
# workers are the parallelism, and OpenBLAS's threads spinning on cores the other workers keep
# busy made single GP refits take seconds (benchmarks/README.md, search_cost.py).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
# pip (the tests' builds and venvs, and the build environments of isolated builds, which inherit
# it) installs without compiling every module to bytecode: over half the CPU of installing the
# 425 MB that a build environment of hatch-autotune holds, for files thrown away after one build.
# pip reads a `no-` switch's variable as the value of the positive option: "0" turns compiling
# off (pip's docs: --no-compile is enabled with a falsy value).
os.environ.setdefault("PIP_NO_COMPILE", "0")

import collections
import contextlib
import importlib
import importlib.util
import math
import shutil
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import tomllib

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.declare.config import ConfigError, ProjectSpec, parse_project
from hatch_autotune.lock import LockEntry, LockFile, Measurement
from hatch_autotune.wheel.assemble import BuildResult, build_payload

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "example_pkg"
STENCIL_KIT = ROOT / "tests" / "consumers" / "stencil_kit"  # constants, shapes from expressions, #included headers


# The files that run longest, in the order xdist hands them out first (pyproject.toml: --dist
# loadfile --no-loadscope-reorder): a long file that started last would run alone at the end.
# Seconds: one file alone on the 2-core VM (2026-11-28). The others follow as xdist orders them by
# default: most tests first.
LONG_FILES = (
    "test_gemm_template.py",  # 170 s: the space of one instance and every default, then the emulator
    "test_norm_templates.py",  # 180 s: every config of both norms for two archs, then the emulator
    "test_cluster.py",  # 130-150 s, mostly waiting on Ray and the fake workers: beside the compiles
    "test_headers.py",  # 100 s cold: llm_kit for six archs, with the toolkit's headers
    "test_llm_kit_launch.py",  # 100-140 s cold: llm_kit built again, its new kernels called over the stand-in
    "test_sgemm_template.py",  # 115 s: every config of the space, on all cores
    "test_softmax_template.py",  # 70 s: likewise
    "test_damage.py",  # 87 s
    "test_wheel_check.py",  # 66 s (in a full run)
    "test_wheel.py",  # 60 s
    "test_stub.py",  # 56 s
    "test_cuda12.py",  # 45 s: example_pkg's FP32 kernels built with NVRTC 12, three fresh venvs
    "test_search.py",  # 53 s
    "test_sass.py",  # 49 s, 22 s after the template tests, whose compiles fill the cache it reads
    "test_host_emulator.py",  # 43 s
    "test_torch_ops.py",  # 42 s
    "test_cli.py",  # 30 s
    "test_consumer.py",  # 24 s
)


def pytest_collection_modifyitems(config, items) -> None:
    """On an xdist worker, the order the files are handed out in (LONG_FILES first); a test
    file's own order is kept. A run without workers keeps pytest's order."""
    if not hasattr(config, "workerinput"):
        return
    rank = {name: i - len(LONG_FILES) for i, name in enumerate(LONG_FILES)}  # all < 0
    tests = collections.Counter(item.path for item in items)
    items.sort(key=lambda item: (rank.get(item.path.name, 0), -tests[item.path]))


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module, for testing its functions. The benchmarks put their
    folder on sys.path and (through _common) the checkout on PYTHONPATH for their subprocesses:
    both undone here, or later tests' fresh venvs would see this checkout; the sibling modules
    it imported by their bare names (_common, replay) are forgotten again. The module itself is
    registered as _bench_<name> (dataclasses look their module up there)."""
    path = ROOT / "benchmarks" / f"{name}.py"
    saved_env, saved_path = dict(os.environ), list(sys.path)
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        for sibling in [
            n for n, m in sys.modules.items() if n != spec.name and Path(getattr(m, "__file__", None) or "/").parent == path.parent
        ]:
            sys.modules.pop(sibling)
    return module


# A tiny kernel whose template can be broken on purpose with the BAD axis.
SCALE_TEMPLATE = """\
extern "C" __global__ void {{ entry }}(const float* __restrict__ x, float* __restrict__ y, int n)
{
    int i = blockIdx.x * {{ BLOCK }} + threadIdx.x;
{% if BAD %}
    this_is_not_cuda(;
{% endif %}
    if (i < n) y[i] = {{ FACTOR }}.0f * x[i];
}
"""

SCALE_TABLE = """\
[tool.hatch.build.targets.wheel.hooks.autotune]
module = "tinypkg.kernels"
archs = ["sm_80", "sm_90"]
{extra}

[tool.hatch.build.targets.wheel.hooks.autotune.kernels.scale]
template = "scale.cu.j2"
args = [
  {{ name = "x", dtype = "float32", shape = ["n"], intent = "in" }},
  {{ name = "y", dtype = "float32", shape = ["n"], intent = "out" }},
  {{ name = "n", dtype = "int32", value = "n" }},
]
key = {{ n = {{ buckets = [1024, 65536, 1048576] }} }}
space = {{ BLOCK = [64, 128, 256], FACTOR = [2, 3], BAD = {bad} }}
default = {{ BLOCK = 128, FACTOR = 2, BAD = false }}
grid = ["cdiv(n, BLOCK)"]
block = ["BLOCK"]
"""


def write_tiny_project(path: Path, *, bad: str = "[false]", extra: str = "", template: str = SCALE_TEMPLATE) -> Path:
    """A consumer project with one small kernel: real pyproject.toml, template and package."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "scale.cu.j2").write_text(template)
    (path / "pyproject.toml").write_text(
        textwrap.dedent(
            """\
            [build-system]
            requires = ["hatchling", "hatch-autotune"]
            build-backend = "hatchling.build"

            [project]
            name = "tinypkg"
            version = "0.1.0"

            [tool.hatch.build.targets.wheel]
            packages = ["tinypkg"]

            """
        )
        + SCALE_TABLE.format(bad=bad, extra=extra)
    )
    (path / "tinypkg").mkdir(exist_ok=True)
    (path / "tinypkg" / "__init__.py").write_text("")
    return path


# Where example_pkg's tensor-core kernels begin in its pyproject.toml: the FP32 kernels come first.
TENSOR_CORE_KERNELS = "# --- gemm: bfloat16/float16 on the tensor cores"


def copy_example(dest: Path, *, fp32_only: bool = False) -> Path:
    """example_pkg's sources (no builds, no generated package) copied to `dest`; `fp32_only`: its
    first three kernels alone (saxpy, row_softmax, sgemm) for sm_80 and sm_90 (not sm_90a, which
    the tensor-core gemm needs), for a test about the build's machinery rather than the kernels,
    that builds the package many times."""
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("dist", "kernels", "__pycache__"))
    if fp32_only:
        text = (dest / "pyproject.toml").read_text()
        assert TENSOR_CORE_KERNELS in text, "example_pkg's tensor-core kernels moved: update TENSOR_CORE_KERNELS"
        archs = 'archs = ["sm_80", "sm_90", "sm_90a"]'
        assert archs in text, "example_pkg's archs changed: update copy_example"
        (dest / "pyproject.toml").write_text(text[: text.index(TENSOR_CORE_KERNELS)].replace(archs, 'archs = ["sm_80", "sm_90"]'))
    return dest


def write_lock(root: Path, result: BuildResult, winner: dict) -> LockFile:
    """A lock whose every entry of the first kernel names `winner` as tuned (what a GPU tuner
    would write)."""
    lock = LockFile()
    for key, (eid, checksum) in result.kernels[0].lock_ids.items():
        lock.entries[eid] = LockEntry(
            checksum=checksum,
            config=winner,
            tuned=True,
            measurements=(Measurement.from_json({"config": winner, "median_ms": 0.01, "status": "ok"}),),
            provenance={"gpu": "recorded-for-test", "arch": key[1]},
        )
    lock.save(root / "autotune.lock.json")
    return lock


def hook_table(project_dir: Path) -> dict:
    data = tomllib.loads((project_dir / "pyproject.toml").read_text())
    return data["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["autotune"]


def load_project(project_dir: Path, env: dict | None = None) -> ProjectSpec:
    return parse_project(hook_table(project_dir), project_dir, env=env or {})


def in_forked_child(target, args: tuple, bound_s: float, what: str):
    """What `target(*args, queue)` puts on its queue, run in a forked child that is killed after
    `bound_s`: a case that hangs (or eats memory) fails its test instead of hanging the suite."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=target, args=(*args, queue))
    child.start()
    child.join(bound_s)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"{what} ran past {bound_s} s")
    return queue.get(timeout=5)


@pytest.fixture
def good(tmp_path):
    """A tiny valid project and its hook table, for tests that break one key of it."""
    root = write_tiny_project(tmp_path / "p")
    return root, hook_table(root)


def errors_for(root, table, env=None) -> list[str]:
    """The configuration errors of a table that must be refused."""
    with pytest.raises(ConfigError) as info:
        parse_project(table, root, env=env or {})
    return info.value.errors


def tune_over_fake_worker(root: Path, cache_dir: Path, **options: Any):
    """`tune()` of the project at `root` for sm_90, its worker tests/fake_worker.py doing as
    it does by default (SYNTHETIC timings); `options`: more of tune()'s keywords."""
    from hatch_autotune.compile.cache import CompileCache
    from hatch_autotune.tuning import tune
    from hatch_autotune.tuning.worker_client import WorkerClient

    fake = [sys.executable, str(Path(__file__).parent / "fake_worker.py")]
    return tune(
        load_project(root),
        gpu_arch="sm_90",
        log=lambda line: None,
        cache=CompileCache(cache_dir),
        client_factory=lambda device: WorkerClient(fake, env={**os.environ, "FAKE_WORKER": "{}"}),
        **options,
    )


def tune_over_standin(root: Path, cache_dir: Path, log=lambda line: None, env: dict | None = None, mode: str = "tune"):
    """`tune()` of the project at `root` for sm_90, its worker the real worker process over the
    driver stand-in with emulated kernels (tests/standin_worker.py), one sm_90 device; `env`:
    more of the worker's environment (STANDIN_MEMORY: the device's bytes; STANDIN_OPS: a file
    each request's op is appended to)."""
    from hatch_autotune.compile.cache import CompileCache
    from hatch_autotune.tuning import tune
    from hatch_autotune.tuning.worker_client import WorkerClient

    here = Path(__file__).parent
    worker = [sys.executable, str(here / "standin_worker.py")]
    env = {
        **os.environ,
        "STANDIN_CCS": "9.0",
        "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    return tune(
        load_project(root),
        mode=mode,
        log=log,
        gpu_arch="sm_90",
        cache=CompileCache(cache_dir),
        client_factory=lambda device: WorkerClient(worker, env=env),
    )


def device_sync(device_id: int = 0) -> None:
    """Wait for everything queued on a CUDA device. cuda.core's Device.sync() (like most device
    calls) raises "not yet initialized" unless the device was made current in this process first."""
    from cuda.core import Device  # lazy: importing conftest never needs a driver

    device = Device(device_id)
    device.set_current()
    device.sync()


def build(project_dir: Path, cache_dir: Path | None, logs: list | None = None, env: dict | None = None) -> BuildResult:
    cache = CompileCache(cache_dir) if cache_dir is not None else None
    sink = logs.append if logs is not None else (lambda m: None)
    return build_payload(load_project(project_dir, env), cache=cache, log=sink)


def xdist_shared(tmp_path_factory) -> Path | None:
    """The folder this run's pytest-xdist workers share (the parent of each one's basetemp), or
    None in a run without workers (`-n 0`)."""
    return tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else None


@contextlib.contextmanager
def exclusive(lock_path: Path):
    """Held by one process of the run at a time (an flock): the first worker makes what the
    others then reuse."""
    import fcntl

    with open(lock_path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    """One compile cache for the run, so each binary compiles cold only once: with xdist, one
    for all workers (the store is safe for concurrent writers: compile/cache.py), as `-n 0` has
    one; so the whole-space compiles of the template tests also serve test_sass and the builds."""
    shared = xdist_shared(tmp_path_factory)
    if shared is None:
        return tmp_path_factory.mktemp("compile-cache")
    (shared / "compile-cache").mkdir(exist_ok=True)
    return shared / "compile-cache"


@pytest.fixture(scope="session")
def example_site(session_cache, tmp_path_factory):
    """example_site(archs) -> a directory holding example_pkg with its generated `kernels`
    package, built by the real pipeline (NVRTC) for `archs` (None: the archs example_pkg
    declares), once per session and archs."""
    from hatch_autotune.wheel.payload import write_package

    sites: dict[tuple[str, ...] | None, Path] = {}

    def get(archs: tuple[str, ...] | None = None) -> Path:
        if archs not in sites:
            env = {"HATCH_AUTOTUNE_ARCHS": ",".join(archs)} if archs else {}
            site = tmp_path_factory.mktemp("site")
            project = load_project(EXAMPLE, env)
            result = build_payload(project, cache=CompileCache(session_cache), log=lambda m: None)
            assert result.archs == (archs or result.archs)
            (site / "example_pkg").mkdir()
            (site / "example_pkg" / "__init__.py").write_text("")
            write_package(site / "example_pkg" / "kernels", project, result)
            sites[archs] = site
        return sites[archs]

    return get


@pytest.fixture(scope="module")
def example_kernels(request, example_site):
    """example_pkg's generated package, imported. A test module that needs only some archs says
    so with a module-level EXAMPLE_ARCHS = ("sm_90",): fewer binaries to compile."""
    archs = getattr(request.module, "EXAMPLE_ARCHS", None)
    with imported_kernels(example_site(tuple(archs) if archs else None), "example_pkg") as kernels:
        yield kernels


@contextlib.contextmanager
def imported_kernels(site: Path, package: str):
    """`<package>.kernels` imported from `site`, and forgotten afterwards: the modules of that
    package loaded before (another site's) come back."""

    def ours(name: str) -> bool:
        return name == package or name.startswith(package + ".")

    saved = {k: v for k, v in sys.modules.items() if ours(k)}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(site))
    try:
        yield importlib.import_module(f"{package}.kernels")
    finally:
        sys.path.remove(str(site))
        for k in [m for m in sys.modules if ours(m)]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def stencil_kit(session_cache, tmp_path_factory):
    """stencil_kit's generated package for sm_90, built by the real pipeline and imported."""
    from hatch_autotune.wheel.payload import write_package

    site = tmp_path_factory.mktemp("stencil-site")
    project = load_project(STENCIL_KIT, {"HATCH_AUTOTUNE_ARCHS": "sm_90"})
    result = build_payload(project, cache=CompileCache(session_cache), log=lambda m: None)
    shutil.copytree(STENCIL_KIT / "src" / "stencil_kit", site / "stencil_kit")
    write_package(site / "stencil_kit" / "kernels", project, result)
    with imported_kernels(site, "stencil_kit") as kernels:
        yield kernels


@contextlib.contextmanager
def real_driver_runtime(kernels):
    """A generated package's runtime, on the real driver (a fresh state) before and after."""
    runtime = kernels._runtime
    runtime.use_gpu(None)
    yield runtime
    runtime.use_gpu(None)


@pytest.fixture
def rt(example_kernels):
    """example_pkg's runtime; back on the real driver (a fresh state) afterwards."""
    with real_driver_runtime(example_kernels) as runtime:
        yield runtime


@pytest.fixture
def fresh(rt, example_kernels):
    """A new Library (empty plans and module caches) over example_pkg's generated files."""
    return lambda: rt.Library.load(example_kernels._LIBRARY.directory).kernels


@pytest.fixture
def gpu(rt, fresh, monkeypatch):
    """example_pkg's kernels over the driver stand-in (one sm_90 device), with no plans yet:
    (stand-in, kernels by name)."""
    from cuda_standin import install

    standin = install(monkeypatch, rt)
    return standin, fresh()


def pip_constraints(path: Path) -> Path:
    """A pip constraints file pinning, in a build environment, the hatchling and NVRTC of this
    one: a wheel built with build isolation then equals one built here (and the compile cache,
    whose keys hold the NVRTC build, is shared)."""
    import importlib.metadata

    pins = []
    for dist in ("hatchling", "cuda-toolkit", "nvidia-cuda-nvrtc"):
        try:
            pins.append(f"{dist}=={importlib.metadata.version(dist)}\n")
        except importlib.metadata.PackageNotFoundError:
            pass
    path.write_text("".join(pins))
    return path


@pytest.fixture(scope="session")
def plugin_dist(tmp_path_factory) -> Path:
    """hatch-autotune as a wheel, built from this checkout the way a release is (build isolation):
    once per run, the xdist workers sharing the first one's."""
    shared = xdist_shared(tmp_path_factory)
    if shared is None:
        return _build_plugin_dist(tmp_path_factory)
    with exclusive(shared / "plugin-dist.lock"):
        done = shared / "plugin-dist.path"
        if not done.exists():
            done.write_text(str(_build_plugin_dist(tmp_path_factory)))
        return Path(done.read_text())


def _build_plugin_dist(tmp_path_factory) -> Path:
    import subprocess

    src = tmp_path_factory.mktemp("plugin-src")
    shutil.copytree(
        ROOT, src, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git", ".venv", "dist", "__pycache__", "example_pkg", "tests")
    )
    dist = tmp_path_factory.mktemp("plugin-dist")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert len(list(dist.glob("hatch_autotune-*.whl"))) == 1
    return dist


@pytest.fixture
def tiny(tmp_path) -> Path:
    return write_tiny_project(tmp_path / "tiny")


def geometry_envs(spec, types: Mapping[str, Any], config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The names the launch geometry sees for a config at each of the kernel's bucket points, as
    the declare stage evaluates it (key dims, config axes and the instance's names)."""
    from hatch_autotune.declare.space import bucket_points

    names = [k.name for k in spec.key]
    type_env = spec.type_env(types)
    return [{**dict(zip(names, point)), **config, **type_env} for point in bucket_points([k.buckets for k in spec.key])]


def threads_per_block(spec, types: Mapping[str, Any], config: Mapping[str, Any]) -> int:
    """The block's threads for a config, from the spec's `block` expressions, the most over all
    buckets (the expressions may use the key)."""
    return max(math.prod(int(e(env)) for e in spec.block) for env in geometry_envs(spec, types, config))


# What a block may use on sm_80 and sm_90 without opting in: 1024 threads, 64K registers and
# 48 KiB of shared memory (the launcher sets no larger dynamic-shared limit).
SM80_90_LIMITS = {"max_threads_per_block": 1024, "max_registers_per_block": 65536, "max_shared_memory_per_block": 48 * 1024}


def space_problems(spec, cache_dir: Path, archs: Sequence[str]) -> list[str]:
    """Why configs of a kernel's whole space could not run, each compiled for each arch where some
    bucket keeps it (a point constraint may keep it off an arch, as split-K's clusters): what
    the tuner would prune (tuning/bucket.prune_reason: no compile, threads, registers or shared
    memory over a block's limits, spills) or a stack frame. [] when the constraints keep only
    configs that compile and launch, so that the tuner's pruning never has to."""
    from gpu_launch import runs_on_arch

    from hatch_autotune.compile.nvrtc import compile_all
    from hatch_autotune.compile.render import render_kernel
    from hatch_autotune.tuning.bucket import prune_reason
    from hatch_autotune.tuning.protocol import Limits

    limits = Limits.from_json(SM80_90_LIMITS)
    variants = [v for vs in render_kernel(spec).values() for v in vs]
    # what a build or tuner would compile for an arch: a config some bucket of the arch keeps
    jobs = [(v, arch) for v in variants for arch in archs if runs_on_arch(spec, v.types_dict, v.config_dict, arch)]
    results = compile_all([v.compile_job(arch, spec.entry, spec.nvrtc_options) for v, arch in jobs], CompileCache(cache_dir))
    problems = []
    for (v, arch), r in zip(jobs, results):
        types, config = v.types_dict, v.config_dict
        res = r.resources if r.ok else None
        why = prune_reason(
            config,
            res,
            lambda c, types=types: threads_per_block(spec, types, c),  # called before the loop moves on
            lambda c, types=types: max(int(spec.shared(env)) for env in geometry_envs(spec, types, c)),
            limits,
            True,
        )
        if why is None and res is not None and res.stack_bytes:
            why = f"a stack frame of {res.stack_bytes} B (local memory)"
        if why is not None:
            problems.append(f"{arch} {v.label}: {why}" + (f"\n{r.log[-500:]}" if not r.ok else ""))
    return problems
