"""Shared by the benchmarks: build example_pkg's generated package for this machine's GPU and
import it, and describe the machine for the results files."""

from __future__ import annotations

import importlib
import json
import platform
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "example_pkg"
RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(ROOT))


def example_project(root: Path = EXAMPLE, env: dict[str, str] | None = None) -> Any:
    from hatch_autotune.config import parse_project

    table = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["autotune"]
    return parse_project(table, root, env=env or {})


def import_generated(project: Any, site: Path) -> Any:
    """Build the generated package with the real pipeline into `site` and import it."""
    from hatch_autotune.cache import CompileCache, default_cache_dir
    from hatch_autotune.package import write_package
    from hatch_autotune.pipeline import build_payload

    result = build_payload(project, cache=CompileCache(default_cache_dir()), log=lambda m: None)
    pkg = site / "example_pkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    write_package(pkg / "kernels", project, result)
    sys.path.insert(0, str(site))
    return importlib.import_module("example_pkg.kernels")


def machine() -> dict[str, Any]:
    """GPU, driver and versions, for the results files."""
    info: dict[str, Any] = {"python": platform.python_version()}
    try:
        from importlib.metadata import version

        for dist in ("cuda-core", "cuda-bindings", "cupy-cuda13x", "kernel-tuner", "numpy"):
            try:
                info[dist] = version(dist)
            except Exception:
                pass
        from cuda.bindings import driver
        from cuda.core import Device

        dev = Device()
        dev.set_current()
        err, v = driver.cuDriverGetVersion()
        info.update(gpu=dev.name, cc=".".join(map(str, dev.compute_capability)), driver_cuda=f"{v // 1000}.{(v % 1000) // 10}")
        from hatch_autotune.compile import nvrtc_version

        info["nvrtc"] = nvrtc_version()
    except Exception as exc:  # no GPU: say so in the file rather than guess
        info["gpu"] = f"none ({type(exc).__name__})"
    return info


def write_result(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return path
