"""The tuned winners against the hardware (GPU only): for saxpy and row_softmax, achieved
bandwidth as a fraction of a measured device-to-device copy; for SGEMM, throughput as a
fraction of cuBLAS SGEMM (FP32, TF32 off) through CuPy at the same size; and each winner's
speedup over the default config, per bucket, read from the lock file.

    python benchmarks/roofline.py [--lock example_pkg/autotune.lock.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from _common import EXAMPLE, example_project, import_generated, machine, write_result

os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS in plain FP32, like our SGEMM


def event_ms(fn, reps: int = 50) -> float:
    """Median milliseconds of fn() with CUDA events, L2 flushed between repetitions."""
    import cupy as cp

    flush = cp.empty(256 * 1024 * 1024 // 4, cp.float32)
    fn()
    times = []
    for _ in range(reps):
        flush.fill(0)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lock", type=Path, default=EXAMPLE / "autotune.lock.json")
    opts = ap.parse_args()
    import cupy as cp

    from hatch_autotune.pipeline import detect_gpu_arch

    arch = detect_gpu_arch()
    assert arch, "needs a GPU"
    kernels = import_generated(example_project(env={"HATCH_AUTOTUNE_ARCHS": arch}), Path(tempfile.mkdtemp()))
    rows = []
    big = 1 << 28
    src, dst = cp.ones(big // 4, cp.float32), cp.empty(big // 4, cp.float32)
    copy_gbs = 2 * big / event_ms(lambda: dst.__setitem__(slice(None), src)) / 1e6
    for n in kernels.saxpy.buckets["n"]:
        x, y = cp.ones(n, cp.float32), cp.ones(n, cp.float32)
        ms = event_ms(lambda: kernels.saxpy(2.0, x, y))
        gbs = 3 * 4 * n / ms / 1e6
        rows.append({"kernel": "saxpy", "n": n, "ms": ms, "GB/s": gbs, "fraction_of_copy": gbs / copy_gbs})
    for rows_, cols in [(r, c) for r in kernels.row_softmax.buckets["rows"] for c in kernels.row_softmax.buckets["cols"]]:
        x, y = cp.ones((rows_, cols), cp.float32), cp.empty((rows_, cols), cp.float32)
        ms = event_ms(lambda: kernels.row_softmax(x, y))
        gbs = 3 * 4 * rows_ * cols / ms / 1e6  # x read twice, y written once
        rows.append({"kernel": "row_softmax", "rows": rows_, "cols": cols, "ms": ms, "GB/s": gbs, "fraction_of_copy": gbs / copy_gbs})
    for m in kernels.sgemm.buckets["m"]:
        a, b, c = cp.ones((m, m), cp.float32), cp.ones((m, m), cp.float32), cp.empty((m, m), cp.float32)
        ours = event_ms(lambda: kernels.sgemm(a, b, c))
        cublas = event_ms(lambda: cp.matmul(a, b, out=c))
        rows.append({"kernel": "sgemm", "m=n=k": m, "ms": ours, "TFLOP/s": 2 * m**3 / ours / 1e9, "fraction_of_cublas": cublas / ours})
    speedups = []
    if opts.lock.exists():
        for eid, e in json.loads(opts.lock.read_text())["entries"].items():
            win = next((x for x in e["measurements"] if x["config"] == e["config"] and "median_ms" in x), None)
            if e.get("default_ms") and win:
                speedups.append({"entry": eid, "winner": e["config"], "speedup_over_default": e["default_ms"] / win["median_ms"]})
    payload = {"what": __doc__.strip().splitlines()[0], "copy_GB_per_s": copy_gbs, "rows": rows, "speedup_over_default": speedups, "machine": machine()}
    print(write_result("roofline.json", payload).read_text())


if __name__ == "__main__":
    main()
