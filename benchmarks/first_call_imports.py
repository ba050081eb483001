"""What a first call imports, and what that costs, in fresh interpreters on the CPU (no GPU).

A first call of a generated kernel imports what its launch path needs before the driver starts;
without a GPU it ends right there (NoDriverError at cuInit), after every import it needs, so its
imports can be measured anywhere. Each repetition runs one fresh interpreter with
`python -X importtime` in which numpy is imported first (an array library brings it: CuPy and
PyTorch import it), then `import example_pkg.kernels`, then the first call with
__cuda_array_interface__ arrays; the modules each phase imported and their cumulative import
times are read from -X importtime's report. Side by side in the same repetitions, interleaved:
a fresh interpreter importing cuda.core, which the launch path imported before issue #35.

    python benchmarks/first_call_imports.py [--out DIR] [--quick]   # writes first_call_imports_cpu.json
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import example_project, import_generated, machine, options, write_result

MARK = "hatch-autotune-phase:"
PROBE = f"""
import sys, time
import numpy
print("{MARK}import", file=sys.stderr, flush=True)
t0 = time.perf_counter()
import example_pkg.kernels as kernels
t1 = time.perf_counter()
print("{MARK}call", file=sys.stderr, flush=True)

class Array:
    def __init__(self, ptr):
        self.__cuda_array_interface__ = {{"shape": (4096,), "typestr": "<f4", "data": (ptr, False), "strides": None, "version": 3}}

x, y = Array(0x7F0000000000), Array(0x7F0000100000)
t2 = time.perf_counter()
try:
    kernels.saxpy(2.0, x, y)
    outcome = "launched"
except Exception as exc:  # no GPU: NoDriverError once the driver is asked
    outcome = type(exc).__name__
t3 = time.perf_counter()
print("{MARK}end", file=sys.stderr, flush=True)
print((t1 - t0) * 1e3, (t3 - t2) * 1e3, outcome)
"""
CUDA_CORE = f"""
import sys, time
print("{MARK}call", file=sys.stderr, flush=True)
t0 = time.perf_counter()
import cuda.core
t1 = time.perf_counter()
print("{MARK}end", file=sys.stderr, flush=True)
print((t1 - t0) * 1e3)
"""


def phases(stderr: str) -> dict[str, dict[str, int]]:
    """phase -> {module: cumulative µs} for the modules imported at the top of that phase."""
    out: dict[str, dict[str, int]] = {}
    phase = None
    for line in stderr.splitlines():
        if line.startswith(MARK):
            phase = line[len(MARK) :]
            out.setdefault(phase, {})
        elif line.startswith("import time:") and phase is not None and "|" in line:
            _, cumulative, name = line.split("|", 2)
            if not name.startswith("  ") and cumulative.strip().isdigit():  # one level below the phase itself
                out[phase][name.strip()] = int(cumulative)
    return out


def run(script: str, site: Path) -> tuple[list[str], dict[str, dict[str, int]]]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    if done.returncode:
        raise SystemExit(f"first_call_imports.py: a fresh interpreter failed:\n{done.stderr[-2000:]}")
    return done.stdout.split(), phases(done.stderr)


def main() -> None:
    opts = options(__doc__).parse_args()
    repeats = 3 if opts.quick else 9
    site = Path(tempfile.mkdtemp())
    import_generated(example_project(), site)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(site)], check=True)  # as pip installs it
    ours: list[dict] = []
    core: list[dict] = []
    for i in range(repeats):  # interleaved, so that load on the machine hits both alike
        (import_ms, call_ms, outcome), seen = run(PROBE, site)
        ours.append({"import_ms": float(import_ms), "first_call_ms": float(call_ms), "outcome": outcome, "imports": seen})
        (core_ms,), core_seen = run(CUDA_CORE, site)
        core.append({"import_ms": float(core_ms), "imports": core_seen})
        print(f"  [{i + 1}/{repeats}] import {float(import_ms):.1f} ms, first call's imports {float(call_ms):.1f} ms ({outcome}), "
              f"cuda.core {float(core_ms):.1f} ms", flush=True)  # fmt: skip
    call_modules = sorted({m for r in ours for m in r["imports"].get("call", {})})
    import_modules = sorted({m for r in ours for m in r["imports"].get("import", {})})
    med = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "repeats": repeats,
        "quick": opts.quick,
        "results": {
            "import_ms": med(ours, "import_ms"),
            "first_call_imports_ms": med(ours, "first_call_ms"),
            "cuda_core_import_ms": med(core, "import_ms"),
            "outcomes": sorted({r["outcome"] for r in ours}),
            "modules_imported_by_import": import_modules,
            "modules_imported_by_first_call": call_modules,
            "first_call_imports_cuda_core": any(m.startswith("cuda.core") for m in call_modules),
            "cumulative_us_by_first_call": {
                m: statistics.median(r["imports"]["call"].get(m, 0) for r in ours if "call" in r["imports"]) for m in call_modules
            },
        },
        "samples": {
            "ours": [{k: v for k, v in r.items() if k != "imports"} for r in ours],
            "cuda_core_import_ms": [r["import_ms"] for r in core],
        },
        "machine": machine(),
    }
    print(write_result("first_call_imports_cpu.json", payload, opts.out).read_text())


if __name__ == "__main__":
    main()
