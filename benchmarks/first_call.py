"""Import time and first call in a fresh process, split into its parts (GPU only), against CuPy's RawModule.

What a user of a tuned wheel waits for before the first result: `import example_pkg.kernels`,
then the first `kernels.saxpy(a, x, y)` and, for scale, the second call. Each repetition starts
fresh interpreters, interleaved (drift hits all alike), and the medians are reported with every
sample. In ours, the import comes first and is timed alone; then the array library is imported
and the arrays made and synchronised, so that CUDA's own start (context creation) is outside
every timed region, as the library's import is; then the runtime's driver seam is made, timed
alone (`driver_import_ms`: libcuda's functions declared through ctypes, runtime/libcuda.py, what
the first call does first; it was `import cuda.bindings.driver`, 18.5 ms on the H200, before
issue #54). The first call runs over a driver that times three of its functions, installed through the runtime's seam (`use_gpu`, before the first call), so the
call is split into:
  module_load_ms            cuModuleLoadData + cuModuleGetFunction (with CUDA's lazy loading,
                            part of a load may land in the launch)
  launch_ms                 cuLaunchKernel
  sync_ms                   the synchronisation after the call returned
  selection_and_checks_ms   the rest: first_call_ms - module_load_ms - launch_ms - sync_ms (the
                            driver's start, argument checks, selection, reading and hashing the
                            cubin, the plan)
  first_call_ms             the call and its synchronisation
  first_call_with_driver_import_ms   first_call_ms plus the driver seam's making: what a
                            program waits for
Also: `cuda_core_imported` (whether cuda.core is imported after the first call: must be False,
the call path needs ctypes only; `cuda_core_imported_by_first_call` tells it from an
array library that imports it itself), `modules_imported_by_first_call` (the new sys.modules
entries, to two dotted components), and whether importing the kernels loaded any CUDA module or
libcuda (`cuda_loaded_at_import`).

Side by side: CuPy's RawModule loading the same cubin from a file and launching it once (with CuPy
already imported), which is what a hand-written wrapper without tuning would cost; and ours with
PyTorch tensors instead of CuPy arrays (PyTorch imported and its context made before timing),
left out without PyTorch and, to keep within the time budget, for repetitions that would start
after TORCH_DEADLINE_S. Goals (issues #35, #54): first call <= 15 ms counting the driver's import
(`first_call_with_driver_import_ms`: what a program waits for), import <= 10 ms, no CUDA at import.

The import is timed as an installed wheel runs it: the generated package byte-compiled as pip
does when it installs a wheel, whatever PYTHONDONTWRITEBYTECODE says (gpu_check sets it).
Labelled apart (`import_without_bytecode_ms`), interleaved: the same package in a folder without
bytecode, imported alone with `-B`, as where bytecode is off.

    python benchmarks/first_call.py [--out DIR] [--quick]   # writes DIR/first_call.json
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import example_project, import_generated, machine, options, require_gpu, write_result

N = 1 << 20
CHILD_TIMEOUT_S = 60
TORCH_DEADLINE_S = (80, 35)  # (full, --quick): no PyTorch child starts later than this into the run
GOAL_FIRST_CALL_MS, GOAL_IMPORT_MS = 15.0, 10.0

# Ours, in a fresh interpreter: argv is (n, "cupy" | "torch"). Nothing is imported before the
# timed import but `sys` and `time`, which every interpreter has loaded already.
OURS = r'''
import sys, time
t0 = time.perf_counter()
import example_pkg.kernels as kernels
t1 = time.perf_counter()
cuda_modules_at_import = sorted({".".join(m.split(".")[:2]) for m in sys.modules if m == "cuda" or m.startswith("cuda.")})
try:
    with open("/proc/self/maps") as maps:
        libcuda_at_import = "libcuda.so" in maps.read()
except OSError:
    libcuda_at_import = None
n, library = int(sys.argv[1]), sys.argv[2]
if library == "torch":
    import torch
    x, y = torch.ones(n, device="cuda"), torch.ones(n, device="cuda")
    sync = torch.cuda.synchronize
else:
    import cupy as cp
    x, y = cp.ones(n, cp.float32), cp.ones(n, cp.float32)
    sync = cp.cuda.Device().synchronize
sync()  # the context exists before the first call, as in any GPU program
driver_imported_by_array_library = False  # the runtime's own seam (libcuda through ctypes): no library loads it for us
rt = kernels._runtime
t2 = time.perf_counter()
real = rt.CudaApi.libcuda()  # what the first call does first: libcuda's functions declared through ctypes
t3 = time.perf_counter()


class TimingDriver:
    """The driver module, with the time spent in the calls that the first call is split into."""

    TIMED = ("cuModuleLoadData", "cuModuleGetFunction", "cuLaunchKernel")

    def __init__(self, real):
        self._real = real
        self.seconds = dict.fromkeys(self.TIMED, 0.0)
        for name in self.TIMED:
            setattr(self, name, self._timed(name, getattr(real, name)))

    def _timed(self, name, fn):
        seconds = self.seconds

        def timed(*args):
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                seconds[name] += time.perf_counter() - t

        return timed

    def __getattr__(self, name):  # every other name: the real driver's
        return getattr(self._real, name)


timing = TimingDriver(real.driver)
rt.use_gpu(real.replace(driver=timing))
before = set(sys.modules)
cuda_core_before = "cuda.core" in before  # imported by the array library, if at all
t4 = time.perf_counter()
kernels.saxpy(2.0, x, y)
t5 = time.perf_counter()
sync()
t6 = time.perf_counter()
first = dict(timing.seconds)
new_modules = sorted({".".join(m.split(".")[:2]) for m in set(sys.modules) - before})
cuda_core_imported = "cuda.core" in sys.modules
kernels.saxpy(2.0, x, y)
sync()
t7 = time.perf_counter()
got = (float(y[0]), float(y[-1]))
assert got == (5.0, 5.0), got
import json

ms = 1e3
module_load = (first["cuModuleLoadData"] + first["cuModuleGetFunction"]) * ms
launch = first["cuLaunchKernel"] * ms
first_call, sync_ms, driver_import = (t6 - t4) * ms, (t6 - t5) * ms, (t3 - t2) * ms
print(json.dumps({
    "import_ms": (t1 - t0) * ms,
    "driver_import_ms": driver_import,
    "driver_imported_by_array_library": driver_imported_by_array_library,
    "first_call_ms": first_call,
    "first_call_with_driver_import_ms": first_call + (0.0 if driver_imported_by_array_library else driver_import),
    "module_load_ms": module_load,
    "launch_ms": launch,
    "sync_ms": sync_ms,
    "selection_and_checks_ms": first_call - module_load - launch - sync_ms,
    "second_call_ms": (t7 - t6) * ms,
    "checked_calls": kernels.saxpy.checked_calls,
    "cuda_core_imported": cuda_core_imported,
    "cuda_core_imported_by_first_call": cuda_core_imported and not cuda_core_before,
    "modules_imported_by_first_call": new_modules,
    "cuda_modules_at_import": cuda_modules_at_import,
    "libcuda_at_import": libcuda_at_import,
}))
'''

# The import alone, in a fresh interpreter started with -B over a package without bytecode.
IMPORT_ALONE = """
import json, time
t0 = time.perf_counter()
import example_pkg.kernels
print(json.dumps({"import_ms": (time.perf_counter() - t0) * 1e3}))
"""

# CuPy's RawModule, in a fresh interpreter with CuPy imported and its context made.
CUPY = """
import json, time
import cupy as cp
import numpy as np
x, y = cp.ones({n}, cp.float32), cp.ones({n}, cp.float32)
cp.cuda.Device().synchronize()
t2 = time.perf_counter()
fn = cp.RawModule(path={cubin!r}).get_function({entry!r})
fn({grid}, {block}, (np.float32(2.0), x, y, np.int32({n})), shared_mem={shared})
cp.cuda.Device().synchronize()
t3 = time.perf_counter()
assert float(y[0]) == 3.0 and float(y[-1]) == 3.0, float(y[0])
print(json.dumps({{"first_call_ms": (t3 - t2) * 1e3}}))
"""

# the timings of ours, summarised as medians (with their min and max under "spread")
TIMES = (
    "import_ms",
    "driver_import_ms",
    "first_call_ms",
    "first_call_with_driver_import_ms",
    "module_load_ms",
    "launch_ms",
    "sync_ms",
    "selection_and_checks_ms",
    "second_call_ms",
)


def child(site: Path, script: str, *args: str, flags: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run `script` in a fresh interpreter that finds the generated package; its last line, as JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    try:
        r = subprocess.run([sys.executable, *flags, "-c", script, *args], env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"a fresh process ran past {CHILD_TIMEOUT_S} s") from None
    if r.returncode:
        raise RuntimeError(f"a fresh process failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of each timing over the repetitions, their min and max, and the flags of any row."""
    out: dict[str, Any] = {k: statistics.median(r[k] for r in rows) for k in TIMES}
    out["spread"] = {k: {"min": min(r[k] for r in rows), "max": max(r[k] for r in rows)} for k in TIMES}
    out["repetitions"] = len(rows)
    out["cuda_core_imported"] = any(r["cuda_core_imported"] for r in rows)
    out["cuda_core_imported_by_first_call"] = any(r["cuda_core_imported_by_first_call"] for r in rows)
    out["cuda_loaded_at_import"] = any(r["cuda_modules_at_import"] or r["libcuda_at_import"] for r in rows)
    out["driver_imported_by_array_library"] = any(r["driver_imported_by_array_library"] for r in rows)
    out["modules_imported_by_first_call"] = sorted({m for r in rows for m in r["modules_imported_by_first_call"]})
    out["checked_calls"] = max(r["checked_calls"] for r in rows)  # 1: the second call took the fast path
    return out


def main() -> None:
    opts = options(__doc__).parse_args()
    started = time.monotonic()
    repeats = 3 if opts.quick else 7
    torch_deadline = TORCH_DEADLINE_S[1] if opts.quick else TORCH_DEADLINE_S[0]
    arch = require_gpu("first_call.py")
    site = Path(tempfile.mkdtemp())
    kernels = import_generated(example_project(env={"HATCH_AUTOTUNE_ARCHS": arch}), site)
    plain = Path(tempfile.mkdtemp())  # the same package, no bytecode: the labelled import
    shutil.copytree(site / "example_pkg", plain / "example_pkg", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(site / "example_pkg")], check=True)  # as pip installs it
    sel = kernels.saxpy.select(n=N, T="float32")
    if sel.binary.startswith("compute_"):
        raise SystemExit(f"first_call.py: the wheel holds PTX, not a cubin, for {arch}: nothing to compare")
    cubin = site / "saxpy.cubin"
    cubin.write_bytes(kernels.saxpy.binary(sel))
    grid, block, shared = kernels.saxpy.geometry(sel.config, {"T": "float32"}, {"n": N})
    peer = CUPY.format(n=N, cubin=str(cubin), entry=kernels.saxpy.entry, grid=tuple(grid), block=tuple(block), shared=shared)
    torch_missing = None if importlib.util.find_spec("torch") is not None else "PyTorch not installed"
    ours, cupy, torch_rows, without_bytecode = [], [], [], []
    torch_left_out = 0
    for i in range(repeats):  # interleaved, so that drift hits all alike
        try:
            ours.append(child(site, OURS, str(N), "cupy"))
            cupy.append(child(site, peer))
            without_bytecode.append(child(plain, IMPORT_ALONE, flags=("-B",))["import_ms"])
        except RuntimeError as exc:
            raise SystemExit(f"first_call.py: {exc}") from None
        line = (
            f"  [{i + 1}/{repeats}] ours {ours[-1]['first_call_ms']:.2f} ms, with the driver's import "
            f"{ours[-1]['first_call_with_driver_import_ms']:.2f} (import {ours[-1]['import_ms']:.1f}, without bytecode "
            f"{without_bytecode[-1]:.1f}), CuPy RawModule {cupy[-1]['first_call_ms']:.2f}"
        )
        if torch_missing is None and time.monotonic() - started < torch_deadline:
            try:
                torch_rows.append(child(site, OURS, str(N), "torch"))
                line += f", ours with PyTorch {torch_rows[-1]['first_call_ms']:.2f}"
            except RuntimeError as exc:  # PyTorch without CUDA, say: ours and CuPy's still count
                torch_missing = str(exc)
        elif torch_missing is None:
            torch_left_out += 1
        print(line, flush=True)

    results = summarise(ours)
    results["import_without_bytecode_ms"] = statistics.median(without_bytecode)
    results["cupy_rawmodule_first_call_ms"] = statistics.median(r["first_call_ms"] for r in cupy)
    results["first_call_vs_cupy"] = results["first_call_ms"] / results["cupy_rawmodule_first_call_ms"]
    if torch_rows:
        results["torch"] = summarise(torch_rows)
    results["torch_left_out"] = {"why": torch_missing, "repetitions_past_deadline": torch_left_out}
    goals = {
        "first_call_ms_max": GOAL_FIRST_CALL_MS,
        "import_ms_max": GOAL_IMPORT_MS,
        "first_call_met": results["first_call_with_driver_import_ms"] <= GOAL_FIRST_CALL_MS,  # what a program waits for
        "first_call_after_driver_import_met": results["first_call_ms"] <= GOAL_FIRST_CALL_MS,
        "import_met": results["import_ms"] <= GOAL_IMPORT_MS,
        "no_cuda_at_import": not results["cuda_loaded_at_import"],
        "no_cuda_core_at_first_call": not results["cuda_core_imported_by_first_call"],
    }
    if torch_rows:
        goals["torch_first_call_met"] = results["torch"]["first_call_with_driver_import_ms"] <= GOAL_FIRST_CALL_MS
    goals["met"] = all(v for k, v in goals.items() if not k.endswith("_max"))
    results["goals"] = goals
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "n": N,
        "repeats": repeats,
        "quick": opts.quick,
        "config": sel.config,
        "binary": sel.binary,
        "parameters": {"n": N, "repeats": repeats, "child_timeout_s": CHILD_TIMEOUT_S, "torch_deadline_s": torch_deadline},
        "results": results,
        "samples": {"ours": ours, "cupy_rawmodule": cupy, "ours_torch": torch_rows, "import_without_bytecode_ms": without_bytecode},
        "machine": machine(),
    }
    out = write_result("first_call.json", payload, opts.out)
    r = results
    print(
        f"import {r['import_ms']:.1f} ms (without bytecode {r['import_without_bytecode_ms']:.1f}); first call with the driver's import "
        f"{r['first_call_with_driver_import_ms']:.2f} ms; first call {r['first_call_ms']:.2f} ms = module load {r['module_load_ms']:.2f} "
        f"+ launch {r['launch_ms']:.3f} + selection and checks {r['selection_and_checks_ms']:.2f} + sync {r['sync_ms']:.3f}; "
        f"driver import {r['driver_import_ms']:.1f}; second call {r['second_call_ms']:.3f}; "
        f"CuPy RawModule {r['cupy_rawmodule_first_call_ms']:.2f}; goals {'met' if goals['met'] else 'MISSED'}; wrote {out}"
    )


if __name__ == "__main__":
    main()
