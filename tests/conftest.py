"""Shared fixtures: small real projects on disk, and one compile cache per test session.

Nothing here mocks NVRTC: every build in the tests really compiles. Only the GPU is absent.
"""

from __future__ import annotations

import textwrap
import tomllib
from pathlib import Path

import pytest

from hatch_autotune.cache import CompileCache
from hatch_autotune.config import ProjectSpec, parse_project
from hatch_autotune.pipeline import BuildResult, build_payload

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "example_pkg"

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


def hook_table(project_dir: Path) -> dict:
    data = tomllib.loads((project_dir / "pyproject.toml").read_text())
    return data["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["autotune"]


def load_project(project_dir: Path, env: dict | None = None) -> ProjectSpec:
    return parse_project(hook_table(project_dir), project_dir, env=env or {})


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


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    """One compile cache for the session, so example_pkg compiles cold only once."""
    return tmp_path_factory.mktemp("compile-cache")


@pytest.fixture(scope="session")
def example_kernels(session_cache, tmp_path_factory):
    """example_pkg's generated package, built by the real pipeline (NVRTC) and imported."""
    import importlib
    import sys

    from hatch_autotune.package import write_package

    site = tmp_path_factory.mktemp("site")
    result = build(EXAMPLE, session_cache)
    (site / "example_pkg").mkdir()
    (site / "example_pkg" / "__init__.py").write_text("")
    write_package(site / "example_pkg" / "kernels", load_project(EXAMPLE), result)
    sys.path.insert(0, str(site))
    saved = {k: v for k, v in sys.modules.items() if k.startswith("example_pkg")}
    for k in saved:
        del sys.modules[k]
    yield importlib.import_module("example_pkg.kernels")
    sys.path.remove(str(site))
    for k in [m for m in sys.modules if m.startswith("example_pkg")]:
        del sys.modules[k]
    sys.modules.update(saved)


@pytest.fixture
def tiny(tmp_path) -> Path:
    return write_tiny_project(tmp_path / "tiny")
