"""Import time of a generated module (goal: at most 10 ms, no GPU touched).

Builds example_pkg's generated package with the real pipeline (NVRTC, no GPU needed), the
vendored runtime package (`_runtime/`) included, byte-compiles it as pip would on install, then
imports it in N fresh interpreters and reports the median wall time of the import statement
itself, and whether any CUDA module or numpy got loaded. Runs anywhere; no GPU needed. On a
shared machine, other load inflates every figure: compare builds in one run of interleaved
imports, not across runs.

Labelled apart (`without_bytecode`), interleaved with those imports: the same package in a
second folder without bytecode, imported with `-B` (so none is written): what an import costs
where bytecode is off (PYTHONDONTWRITEBYTECODE, a read-only install that pip could not compile).
The headline (`median_ms`, the goal) is the import as pip installs the wheel, with bytecode.

    python benchmarks/import_time.py [-n 30] [-o benchmarks/results/import_time.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import machine  # noqa: E402

from hatch_autotune.compile.cache import CompileCache  # noqa: E402
from hatch_autotune.compile.tiers import default_cache_dir  # noqa: E402
from hatch_autotune.declare.config import parse_project  # noqa: E402
from hatch_autotune.wheel.assemble import build_payload  # noqa: E402
from hatch_autotune.wheel.payload import runtime_files, write_package  # noqa: E402

PROBE = """
import sys, time
t0 = time.perf_counter()
import example_pkg.kernels
dt = (time.perf_counter() - t0) * 1e3
print(dt, int(any(m.startswith("cuda") for m in sys.modules)), int("numpy" in sys.modules))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("-o", type=Path, default=None)
    args = ap.parse_args()
    example = ROOT / "example_pkg"
    table = tomllib.loads((example / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["autotune"]
    project = parse_project(table, example, env={"HATCH_AUTOTUNE_MODE": "offline"})
    result = build_payload(project, cache=CompileCache(default_cache_dir()), log=lambda m: None)
    with tempfile.TemporaryDirectory() as tmp:
        sites = {"with_bytecode": Path(tmp) / "installed", "without_bytecode": Path(tmp) / "source"}
        for site in sites.values():
            (site / "example_pkg").mkdir(parents=True)
            (site / "example_pkg" / "__init__.py").write_text("")
            write_package(site / "example_pkg" / "kernels", project, result)
        # pip byte-compiles what it installs; do the same, or every run would compile the source
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(sites["with_bytecode"])], check=True)
        flags = {"with_bytecode": [], "without_bytecode": ["-B"]}
        samples: dict[str, list[float]] = {name: [] for name in sites}
        cuda_loaded, numpy_loaded = 0, 0
        for i in range(args.n):
            for name in list(sites)[i % 2 :] + list(sites)[: i % 2]:  # alternated: neither always first
                out = subprocess.run(
                    [sys.executable, *flags[name], "-c", PROBE], cwd=sites[name], capture_output=True, text=True, check=True
                )
                dt, cuda, np_ = out.stdout.split()
                samples[name].append(float(dt))
                cuda_loaded += int(cuda)
                numpy_loaded += int(np_)
        assert not list(sites["without_bytecode"].rglob("*.pyc")), "bytecode was written where none should be"
    times = samples["with_bytecode"]
    plain = samples["without_bytecode"]
    report = {
        "what": "wall time of `import example_pkg.kernels` in a fresh interpreter (ms), as pip installs it (with bytecode)",
        "runs": args.n,
        "median_ms": round(statistics.median(times), 3),
        "min_ms": round(min(times), 3),
        "max_ms": round(max(times), 3),
        "without_bytecode": {
            "median_ms": round(statistics.median(plain), 3),
            "min_ms": round(min(plain), 3),
            "max_ms": round(max(plain), 3),
        },
        "samples_ms": samples,
        "runs_that_loaded_cuda": cuda_loaded,
        "runs_that_loaded_numpy": numpy_loaded,
        "goal_ms": 10,
        "machine": {"cpu": f"{platform.machine()} {platform.processor() or ''}".strip(), **machine()},
        "python": platform.python_version(),
        "kernels": len(project.kernels),
        "runtime_modules": len(runtime_files()),
    }
    print(json.dumps(report, indent=1))
    if args.o:
        args.o.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
