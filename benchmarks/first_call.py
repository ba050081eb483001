"""Import time and first call in a fresh process (GPU only), against CuPy's RawModule.

What a user of a tuned wheel waits for before the first result: `import example_pkg.kernels`,
then the first `kernels.saxpy(a, x, y)` (module load from the packed cubin, selection, launch,
synchronisation) and, for scale, the second call. Side by side in the same run, in its own fresh
process each time: CuPy's RawModule loading the same cubin from a file and launching it once,
which is what a hand-written wrapper without tuning would cost. Array creation and CUDA's own
start (context creation) are outside every timed region; each process is started REPEATS times
and the medians are reported.

    python benchmarks/first_call.py [--out DIR] [--quick]   # writes DIR/first_call.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import example_project, import_generated, machine, options, require_gpu, write_result

N = 1 << 20
CHILD_TIMEOUT_S = 60

OURS = """
import json, time
t0 = time.perf_counter()
import example_pkg.kernels as kernels
t1 = time.perf_counter()
import cupy as cp
x, y = cp.ones({n}, cp.float32), cp.ones({n}, cp.float32)
cp.cuda.Device().synchronize()  # the context exists before the first call, as in any GPU program
t2 = time.perf_counter()
kernels.saxpy(2.0, x, y)
cp.cuda.Device().synchronize()
t3 = time.perf_counter()
kernels.saxpy(2.0, x, y)
cp.cuda.Device().synchronize()
t4 = time.perf_counter()
assert float(y[0]) == 5.0 and float(y[-1]) == 5.0, float(y[0])
print(json.dumps({{"import_ms": (t1 - t0) * 1e3, "first_call_ms": (t3 - t2) * 1e3, "second_call_ms": (t4 - t3) * 1e3}}))
"""

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


def child(script: str, site: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if r.returncode:
        raise SystemExit(f"first_call.py: a fresh process failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    opts = options(__doc__).parse_args()
    repeats = 3 if opts.quick else 7
    arch = require_gpu("first_call.py")
    site = Path(tempfile.mkdtemp())
    kernels = import_generated(example_project(env={"HATCH_AUTOTUNE_ARCHS": arch}), site)
    sel = kernels.saxpy.select(n=N, T="float32")
    if sel.binary.startswith("compute_"):
        raise SystemExit(f"first_call.py: the wheel holds PTX, not a cubin, for {arch}: nothing to compare")
    cubin = site / "saxpy.cubin"
    cubin.write_bytes(kernels.saxpy.binary(sel))
    grid, block, shared = kernels.saxpy.geometry(sel.config, {"T": "float32"}, {"n": N})
    ours, cupy = [], []
    for i in range(repeats):  # interleaved, so that drift hits both alike
        ours.append(child(OURS.format(n=N), site))
        cupy.append(
            child(CUPY.format(n=N, cubin=str(cubin), entry=kernels.saxpy.entry, grid=tuple(grid), block=tuple(block), shared=shared), site)
        )
        print(f"  [{i + 1}/{repeats}] ours {ours[-1]}, CuPy RawModule {cupy[-1]}", flush=True)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    results = {
        "import_ms": med(ours, "import_ms"),
        "first_call_ms": med(ours, "first_call_ms"),
        "second_call_ms": med(ours, "second_call_ms"),
        "cupy_rawmodule_first_call_ms": med(cupy, "first_call_ms"),
    }
    results["first_call_vs_cupy"] = results["first_call_ms"] / results["cupy_rawmodule_first_call_ms"]
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "n": N,
        "repeats": repeats,
        "quick": opts.quick,
        "config": sel.config,
        "binary": sel.binary,
        "results": results,
        "samples": {"ours": ours, "cupy_rawmodule": cupy},
        "machine": machine(),
    }
    print(write_result("first_call.json", payload, opts.out).read_text())


if __name__ == "__main__":
    main()
