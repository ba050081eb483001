"""Per-call Python cost of a generated kernel callable on the CPU (no GPU needed).

The launch path runs through the driver stand-in (tests/cuda_standin.py) with cuda.core's launch
replaced by a no-op and the two driver queries of a repeated call (the current context's device;
with several GPUs, each array's device) replaced by constant functions, so that what is timed is
hatch-autotune's own Python: the fast path on one GPU, the fast path on two GPUs (arrays on the
second device), and the fully checked path that every call took on several GPUs before. It is
not a GPU measurement: the real driver queries add their own cost (benchmarks/launch_overhead.py
measures the whole call against a raw cuda.core launch on a GPU).

    python benchmarks/launch_path_cpu.py [--out DIR]   # writes launch_path_cpu.json (--quick: fewer calls)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, example_project, import_generated, machine, options, write_result

CALLS, REPEATS = 20_000, 7


def per_call_us(fn, calls: int = CALLS) -> float:
    samples = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    opts = options(__doc__).parse_args()
    calls = CALLS // 10 if opts.quick else CALLS
    sys.path.insert(0, str(ROOT / "tests"))
    import cuda_standin
    from cuda.bindings import driver

    host = machine()  # before the stand-in is installed, which would answer for a "GPU"
    kernels = import_generated(example_project(), Path(tempfile.mkdtemp()))
    rt = kernels._runtime
    ok = driver.CUresult.CUDA_SUCCESS
    results = {}
    for label, ccs, device in [("one_gpu_fast_path_us", [(9, 0)], 0), ("two_gpus_fast_path_us", [(9, 0), (9, 0)], 1)]:
        standin = cuda_standin.install_globally(ccs, runtime=rt)
        cuda_standin.FakeDevice(device).set_current()
        api = standin.api()
        api.driver.cuCtxGetDevice = lambda: (ok, device)
        api.driver.cuPointerGetAttribute = lambda attr, ptr: (ok, device)
        rt.use_gpu(api.replace(launch=lambda *args: None))  # the runtime's seam: no patching
        saxpy = rt.Library.load(kernels._LIBRARY.directory).kernels["saxpy"]
        x, y = (cuda_standin.DeviceArray.empty(standin, (1024,), device=device) for _ in range(2))
        saxpy(2.0, x, y)
        results[label] = per_call_us(lambda: saxpy(2.0, x, y), calls)
        if device == 1:
            results["checked_path_us"] = per_call_us(lambda: saxpy._call_checked([2.0, x, y], None, None, {}), calls)
    results["two_gpus_vs_one"] = results["two_gpus_fast_path_us"] / results["one_gpu_fast_path_us"]
    payload = {"what": __doc__.strip().splitlines()[0], "calls": calls, "repeats": REPEATS, "results": results, "machine": host}
    print(write_result("launch_path_cpu.json", payload, opts.out).read_text())


if __name__ == "__main__":
    main()
