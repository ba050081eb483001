"""Per-call overhead of a generated kernel callable (GPU only).

Side by side in one run, on a tiny saxpy (n = 1024, so the launch dominates): the generated
callable `kernels.saxpy(a, x, y)`, a raw cuda.core launch of the same cubin with prebuilt
arguments and LaunchConfig, and CuPy's RawKernel of the same cubin. Each is called CALLS times
in a loop, REPEATS times; the per-call time is the median over repeats of (loop time / CALLS),
each loop ending with a device synchronisation. Goal: generated <= 1.5x raw cuda.core.

Also measured: the GPU's own time per launch in a back-to-back burst of raw launches (CUDA
events). A per-call time near that floor means the loop waited on the GPU, not on Python, and
the ratios then understate the difference in Python overhead (`gpu_bound` says so).

    python benchmarks/launch_overhead.py [--out DIR] [--quick]   # writes DIR/launch_overhead.json
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from _common import example_project, import_generated, machine, options, require_gpu, write_result

N = 1024


def per_call_us(fn, sync, calls: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    opts = options(__doc__).parse_args()
    calls, repeats = (5_000, 7) if opts.quick else (20_000, 15)
    arch = require_gpu("launch_overhead.py")  # before importing CuPy: one clear line without a GPU
    import cupy as cp
    import numpy as np
    from cuda.core import Device, EventOptions, LaunchConfig, ObjectCode, launch

    dev = Device(0)
    dev.set_current()  # cuda.core: sync(), streams and launches need a current device
    kernels = import_generated(example_project(env={"HATCH_AUTOTUNE_ARCHS": arch}), Path(tempfile.mkdtemp()))
    x, y = cp.ones(N, cp.float32), cp.ones(N, cp.float32)
    sel = kernels.saxpy.select(n=N, T="float32")
    binary = kernels.saxpy.binary(sel)
    is_ptx = sel.binary.startswith("compute_")
    grid, block, shared = kernels.saxpy.geometry(sel.config, {"T": "float32"}, {"n": N})

    code = ObjectCode.from_ptx(binary) if is_ptx else ObjectCode.from_cubin(binary)
    raw_kernel = code.get_kernel(kernels.saxpy.entry)
    stream = dev.default_stream
    config = LaunchConfig(grid=grid, block=block, shmem_size=shared)
    # C float and int: numpy scalars (a Python float would be packed as a double, an int as a
    # 64-bit pointer); CuPy arrays as their device pointers.
    raw_args = (np.float32(2.0), x.data.ptr, y.data.ptr, np.int32(N))
    path = Path(tempfile.mkdtemp()) / ("saxpy.ptx" if is_ptx else "saxpy.cubin")
    path.write_bytes(binary)
    cupy_kernel = cp.RawModule(path=str(path)).get_function(kernels.saxpy.entry)
    cupy_args = (np.float32(2.0), x, y, np.int32(N))

    sync = dev.sync
    cp.cuda.Device(0).synchronize()
    kernels.saxpy(2.0, x, y)  # first call: loads the module, fills the caches
    launch(stream, config, raw_kernel, *raw_args)
    cupy_kernel(grid, block, cupy_args)
    sync()
    results = {
        "generated_callable_us": per_call_us(lambda: kernels.saxpy(2.0, x, y), sync, calls, repeats),
        "raw_cuda_core_launch_us": per_call_us(lambda: launch(stream, config, raw_kernel, *raw_args), sync, calls, repeats),
        "cupy_rawkernel_us": per_call_us(lambda: cupy_kernel(grid, block, cupy_args), sync, calls, repeats),
    }
    # The GPU's floor: back-to-back raw launches timed by events on the same stream.
    timing = EventOptions(timing_enabled=True)
    burst = 2000
    floors = []
    for _ in range(5):
        sync()
        start = stream.record(options=timing)
        for _ in range(burst):
            launch(stream, config, raw_kernel, *raw_args)
        end = stream.record(options=timing)
        end.sync()
        floors.append(float(end - start) * 1e3 / burst)
    results["gpu_us_per_launch_back_to_back"] = statistics.median(floors)
    # Where the generated callable's host time goes: the parts of its fast path that the raw
    # launch does not have, each timed alone in the same loop (no GPU work in these).
    from cuda.bindings import driver as cu

    results["host_parts_us"] = {
        "two_cupy_cuda_array_interface": per_call_us(
            lambda: (x.__cuda_array_interface__, y.__cuda_array_interface__), sync, calls, repeats
        ),
        "two_cupy_data_ptr": per_call_us(lambda: (x.data.ptr, y.data.ptr), sync, calls, repeats),
        "cuCtxGetDevice": per_call_us(cu.cuCtxGetDevice, sync, calls, repeats),
    }
    results["ratio_generated_vs_raw"] = results["generated_callable_us"] / results["raw_cuda_core_launch_us"]
    results["ratio_generated_vs_cupy"] = results["generated_callable_us"] / results["cupy_rawkernel_us"]
    results["gpu_bound"] = results["raw_cuda_core_launch_us"] < 1.15 * results["gpu_us_per_launch_back_to_back"]
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "n": N,
        "calls": calls,
        "repeats": repeats,
        "quick": opts.quick,
        "config": sel.config,
        "binary": sel.binary,
        "results": results,
        "machine": machine(),
    }
    print(write_result("launch_overhead.json", payload, opts.out).read_text())


if __name__ == "__main__":
    main()
