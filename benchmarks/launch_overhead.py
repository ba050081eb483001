"""Per-call overhead of a generated kernel callable (GPU only).

Side by side in one run, on a tiny saxpy (n = 1024, so the launch dominates): the generated
callable `kernels.saxpy(a, x, y)`, a raw cuda.core launch of the same cubin with prebuilt
arguments and LaunchConfig, and CuPy's RawKernel of the same cubin. Each is called CALLS times
in a loop, REPEATS times; the per-call time is the median over repeats of (loop time / CALLS),
each loop ending with a device synchronisation. Goal: generated <= 1.5x raw cuda.core.

    python benchmarks/launch_overhead.py   # writes benchmarks/results/launch_overhead.json
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from _common import example_project, import_generated, machine, write_result

CALLS, REPEATS, N = 20_000, 15, 1024


def per_call_us(fn, sync) -> float:
    samples = []
    for _ in range(REPEATS):
        sync()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / CALLS * 1e6)
    return statistics.median(samples)


def main() -> None:
    import cupy as cp
    import numpy as np
    from cuda.core import Device, LaunchConfig, ObjectCode, launch

    from hatch_autotune.pipeline import detect_gpu_arch

    arch = detect_gpu_arch()
    assert arch, "needs a GPU"
    os.environ["HATCH_AUTOTUNE_ARCHS"] = arch
    kernels = import_generated(example_project(env={"HATCH_AUTOTUNE_ARCHS": arch}), Path(tempfile.mkdtemp()))
    dev = Device()
    dev.set_current()
    x, y = cp.ones(N, cp.float32), cp.ones(N, cp.float32)
    sel = kernels.saxpy.select(n=N, T="float32")
    cubin = kernels.saxpy.binary(sel)
    grid, block, shared = kernels.saxpy.geometry(sel.config, {"T": "float32"}, {"n": N})

    raw_kernel = ObjectCode.from_cubin(cubin).get_kernel("saxpy")
    stream = dev.default_stream
    config = LaunchConfig(grid=grid, block=block, shmem_size=shared)
    raw_args = (np.float32(2.0), x.data.ptr, y.data.ptr, np.int32(N))
    path = Path(tempfile.mkdtemp()) / "saxpy.cubin"
    path.write_bytes(cubin)
    cupy_kernel = cp.RawModule(path=str(path)).get_function("saxpy")
    cupy_args = (np.float32(2.0), x, y, np.int32(N))

    sync = dev.sync
    kernels.saxpy(2.0, x, y)  # first call: loads the module, fills the caches
    results = {
        "generated_callable_us": per_call_us(lambda: kernels.saxpy(2.0, x, y), sync),
        "raw_cuda_core_launch_us": per_call_us(lambda: launch(stream, config, raw_kernel, *raw_args), sync),
        "cupy_rawkernel_us": per_call_us(lambda: cupy_kernel(grid, block, cupy_args), sync),
    }
    results["ratio_generated_vs_raw"] = results["generated_callable_us"] / results["raw_cuda_core_launch_us"]
    results["ratio_generated_vs_cupy"] = results["generated_callable_us"] / results["cupy_rawkernel_us"]
    payload = {"what": __doc__.strip().splitlines()[0], "n": N, "calls": CALLS, "repeats": REPEATS, "config": sel.config, "results": results, "machine": machine()}
    print(write_result("launch_overhead.json", payload).read_text())


if __name__ == "__main__":
    main()
