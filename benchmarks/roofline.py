"""The tuned winners against the hardware (GPU only): for saxpy and row_softmax, achieved
bandwidth as a fraction of a measured device-to-device copy; for SGEMM, throughput as a
fraction of cuBLAS SGEMM (FP32, TF32 off) through CuPy at the same size; and each winner's
speedup over the default config, per bucket, read from the lock file.

Every kernel runs on CuPy's current stream (passed explicitly), timed with CUDA events on that
stream, the L2 flushed before each repetition; the median is reported.

    python benchmarks/roofline.py [--lock example_pkg/autotune.lock.json] [--out DIR] [--quick]
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

from _common import EXAMPLE, example_project, import_generated, machine, options, require_gpu, write_result

os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS in plain FP32, like our SGEMM

_FLUSH = []


def event_ms(fn, reps: int) -> float:
    """Median milliseconds of fn() with CUDA events, L2 flushed between repetitions."""
    import cupy as cp

    if not _FLUSH:
        _FLUSH.append(cp.empty(256 * 1024 * 1024 // 4, cp.float32))  # 256 MiB: several times any L2
    flush = _FLUSH[0]
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
    ap = options(__doc__)
    ap.add_argument("--lock", type=Path, default=EXAMPLE / "autotune.lock.json")
    opts = ap.parse_args()
    reps = 15 if opts.quick else 50
    arch = require_gpu("roofline.py")  # before importing CuPy: one clear line without a GPU
    import cupy as cp
    from cuda.core import Device

    Device(0).set_current()
    kernels = import_generated(example_project(env={"HATCH_AUTOTUNE_ARCHS": arch}), Path(tempfile.mkdtemp()))
    stream = cp.cuda.get_current_stream()  # the events below are recorded on this stream
    rows = []
    big = 1 << 28
    src, dst = cp.ones(big // 4, cp.float32), cp.empty(big // 4, cp.float32)
    copy_gbs = 2 * big / event_ms(lambda: dst.__setitem__(slice(None), src), reps) / 1e6
    for n in kernels.saxpy.buckets["n"]:
        x, y = cp.ones(n, cp.float32), cp.ones(n, cp.float32)
        ms = event_ms(lambda: kernels.saxpy(2.0, x, y, stream=stream), reps)
        gbs = 3 * 4 * n / ms / 1e6
        sel = kernels.saxpy.select(n=n, T="float32")
        rows.append(
            {"kernel": "saxpy", "n": n, "ms": ms, "GB/s": gbs, "fraction_of_copy": gbs / copy_gbs, "config": sel.config, "tuned": sel.tuned}
        )
    for rows_, cols in [(r, c) for r in kernels.row_softmax.buckets["rows"] for c in kernels.row_softmax.buckets["cols"]]:
        x, y = cp.ones((rows_, cols), cp.float32), cp.empty((rows_, cols), cp.float32)
        ms = event_ms(lambda: kernels.row_softmax(x, y, stream=stream), reps)
        gbs = 3 * 4 * rows_ * cols / ms / 1e6  # x read twice, y written once
        sel = kernels.row_softmax.select(rows=rows_, cols=cols)
        rows.append(
            {
                "kernel": "row_softmax",
                "rows": rows_,
                "cols": cols,
                "ms": ms,
                "GB/s": gbs,
                "fraction_of_copy": gbs / copy_gbs,
                "config": sel.config,
                "tuned": sel.tuned,
            }
        )
    for m in kernels.sgemm.buckets["m"]:
        a, b, c = cp.ones((m, m), cp.float32), cp.ones((m, m), cp.float32), cp.empty((m, m), cp.float32)
        ours = event_ms(lambda: kernels.sgemm(a, b, c, stream=stream), reps)
        cublas = event_ms(lambda: cp.matmul(a, b, out=c), reps)
        sel = kernels.sgemm.select(m=m, n=m, k=m)
        rows.append(
            {
                "kernel": "sgemm",
                "m=n=k": m,
                "ms": ours,
                "TFLOP/s": 2 * m**3 / ours / 1e9,
                "cublas_ms": cublas,
                "cublas_TFLOP/s": 2 * m**3 / cublas / 1e9,
                "fraction_of_cublas": cublas / ours,
                "config": sel.config,
                "tuned": sel.tuned,
            }
        )
    speedups = []
    if opts.lock.exists():
        from hatch_autotune.lock import LockFile

        for eid, e in LockFile.load(opts.lock).entries.items():
            if e.default_ms and e.winner_ms:
                speedups.append({"entry": eid, "winner": dict(e.config), "speedup_over_default": e.default_ms / e.winner_ms})
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "quick": opts.quick,
        "reps": reps,
        "copy_GB_per_s": copy_gbs,
        "lock": str(opts.lock) if opts.lock.exists() else None,
        "rows": rows,
        "speedup_over_default": speedups,
        "machine": machine(),
    }
    print(write_result("roofline.json", payload, opts.out).read_text())


if __name__ == "__main__":
    main()
