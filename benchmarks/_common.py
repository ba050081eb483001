"""Shared by the benchmarks: build example_pkg's generated package for this machine's GPU and
import it, describe the machine for the results files, and the options every benchmark takes
(`--out DIR`, `--quick`)."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Kernel Tuner 1.5.0's strategies that kernel_tuner_sim.py and methodology_score.py run against ours
KT_STRATEGIES = (
    "genetic_algorithm",
    "dual_annealing",
    "pso",
    "random_sample",
    "bayes_opt",
    "simulated_annealing",
    "firefly_algorithm",
    "diff_evo",
)
EXAMPLE = ROOT / "example_pkg"
RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(ROOT))
# Child processes must find hatch_autotune too: the tuning worker runs
# `python -m hatch_autotune.tuning.worker`, which does not inherit sys.path.
if str(ROOT) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
# JAX, if anything imports it, must not take 75% of the GPU's memory.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def options(doc: str | None) -> argparse.ArgumentParser:
    """The parser every benchmark starts from: --out DIR and --quick."""
    ap = argparse.ArgumentParser(description=(doc or "").strip().splitlines()[0] if doc else None)
    ap.add_argument("--out", type=Path, default=RESULTS, help=f"directory for the JSON result (default {RESULTS.relative_to(ROOT)}/)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and sizes (for a time-limited GPU session)")
    return ap


def require_gpu(script: str) -> str:
    """The GPU's arch (`sm_90`), or exit with one line that says why there is none."""
    from hatch_autotune.runtime import current_device_cc

    try:
        major, minor = current_device_cc(0)
    except Exception as exc:  # the real reason: no driver, no device, ...
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".rstrip(": ")
        raise SystemExit(f"{script}: needs a CUDA GPU and found none ({why})") from None
    return f"sm_{major}{minor}"


def example_project(root: Path = EXAMPLE, env: dict[str, str] | None = None) -> Any:
    from hatch_autotune.declare.config import parse_project
    from hatch_autotune.declare.project import hook_table

    return parse_project(hook_table(root / "pyproject.toml")[0], root, env=env or {})


def import_generated(project: Any, site: Path) -> Any:
    """Build the generated package with the real pipeline into `site` and import it."""
    from hatch_autotune.compile.cache import CompileCache
    from hatch_autotune.compile.tiers import default_cache_dir
    from hatch_autotune.wheel.assemble import build_payload
    from hatch_autotune.wheel.payload import write_package

    result = build_payload(project, cache=CompileCache(default_cache_dir()), log=lambda m: None)
    pkg = site / "example_pkg"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    write_package(pkg / "kernels", project, result)
    sys.path.insert(0, str(site))
    return importlib.import_module("example_pkg.kernels")


def _dist_version(*names: str) -> str | None:
    from importlib.metadata import version

    for name in names:
        try:
            return version(name)
        except Exception:
            pass
    return None


def commit() -> str:
    """The checkout's commit (`+dirty.<sha256 of the diff, 12 digits>` when tracked files differ
    from it), or 'unknown': a device machine's copy of the working tree may have no .git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=20)
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if dirty.returncode != 0 or not dirty.stdout.strip():
        return head.stdout.strip()
    try:  # a dirty tree is named by a hash of its diff, so two results of one tree can be told apart
        diff = subprocess.run(["git", "diff", "HEAD"], cwd=ROOT, capture_output=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        diff = b""
    import hashlib

    return f"{head.stdout.strip()}+dirty.{hashlib.sha256(diff).hexdigest()[:12]}"


def machine() -> dict[str, Any]:
    """GPU, driver, versions and the commit, for the results files."""
    info: dict[str, Any] = {"python": platform.python_version(), "host": platform.node(), "commit": commit()}
    for key, names in {
        "cuda-core": ("cuda-core",),
        "cuda-bindings": ("cuda-bindings",),
        "nvidia-cuda-nvrtc": ("nvidia-cuda-nvrtc",),
        "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy"),
        "kernel_tuner": ("kernel_tuner",),
        "numpy": ("numpy",),
    }.items():
        v = _dist_version(*names)
        if v:
            info[key] = v
    try:
        from hatch_autotune import __version__

        info["hatch_autotune"] = __version__
        from cuda.bindings import driver
        from cuda.core import Device

        dev = Device()
        dev.set_current()
        _err, v = driver.cuDriverGetVersion()
        info.update(gpu=dev.name, cc=".".join(map(str, dev.compute_capability)), driver_cuda=f"{v // 1000}.{(v % 1000) // 10}")
        from hatch_autotune.compile.nvrtc import nvrtc_version

        info["nvrtc"] = nvrtc_version()
    except Exception as exc:  # no GPU: say so in the file rather than guess
        info["gpu"] = f"none ({type(exc).__name__})"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
        if out.returncode == 0 and out.stdout.strip():
            info["driver"] = out.stdout.strip().splitlines()[0]
    except Exception:
        pass
    return info


def machine_slug(gpu: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3', for result file names."""
    s = re.sub(r"^nvidia\s+", "", gpu.strip(), flags=re.I).lower()
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-") or "unknown-gpu"


def write_result(name: str, payload: dict[str, Any], out: Path | None = None) -> Path:
    out = Path(out) if out is not None else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def quantile(values: list[float], q: float) -> float:
    """The q-quantile, interpolated between closest ranks (numpy's default)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def spread(values: list[float]) -> dict[str, Any]:
    """Median, min, max and the quartiles of a list of samples."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "p25": quantile(values, 0.25),
        "p75": quantile(values, 0.75),
        "n": len(values),
    }
