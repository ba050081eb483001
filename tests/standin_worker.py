"""The real tuning worker (hatch_autotune.tuning.worker) over the driver stand-in, with emulated
kernels: what tests/test_standin_tuning.py runs as the worker process on a machine without a GPU.

STANDIN_CCS (e.g. "9.0" or "9.0,8.6") sets the devices, STANDIN_MEMORY each device's bytes (an
allocation past it is CUDA_ERROR_OUT_OF_MEMORY), STANDIN_OPS a file each request's op is appended
to (a "hello" per worker process), STANDIN_COUNT a file for the compare kernels' launches and the
outputs downloaded, written when the worker ends; the compare kernels (device verification) are emulated by
tests/standin_compare.py. The worker meets the stand-in through the
runtime's seam (`install_globally` calls hatch_autotune.runtime.use_gpu). The emulated kernel is the test's `scale`
kernel: its template embeds its config as "EMU:MODE=...;FACTOR=...;BLOCK=..." and the emulator
does what that config's CUDA code does (MODE=ok: y = FACTOR * x; wrong: y = FACTOR * x + 1; clobber: ok, then x = -1; oob:
writes 2^40 elements past y, an illegal address; hang: never finishes; graphfast and cachefast: ok, and fast only in a
CUDA graph or with a warm L2). Its times are SYNTHETIC.
"""

import json
import os

import cuda_standin
import numpy as np
import standin_compare


def scale(standin, kernel, launch):
    x_ptr, y_ptr = (int.from_bytes(p, "little") for p in launch.params[:2])
    n = int(np.frombuffer(launch.params[2], np.int32)[0])
    mode, factor, block = kernel.tag["MODE"], float(kernel.tag["FACTOR"]), int(kernel.tag["BLOCK"])
    if mode == "hang":
        raise cuda_standin.Hang()
    if mode == "oob":
        standin.view(y_ptr + (1 << 40) * 4, "float32", n)  # raises IllegalAddress
    covered = min(n, launch.grid[0] * launch.block[0])  # the threads the grid really has
    x, y = standin.view(x_ptr, "float32", n), standin.view(y_ptr, "float32", n)
    y[:covered] = factor * x[:covered] + (1.0 if mode == "wrong" else 0.0)
    if mode == "clobber":  # writes into its input, as a buggy kernel may
        x[:covered] = -1.0
    if mode == "graphfast":  # SYNTHETIC: fast only where launched from a CUDA graph
        return 0.003 if launch.in_graph else 0.030
    if mode == "cachefast":  # SYNTHETIC: fast only when its inputs are still in the L2
        return 0.030 if launch.l2_cold else 0.005
    return 0.010 + 0.002 * 256 / block  # SYNTHETIC milliseconds: larger blocks are "faster"


def halo(standin, kernel, launch):
    """tests/test_constants.py's `halo` kernel: y[i] = x[i] + ... + x[i + 2 RADIUS] for i < m, its
    RADIUS a caller-chosen constant; SKEW=true adds 1 (a wrong variant)."""
    x_ptr, y_ptr = (int.from_bytes(p, "little") for p in launch.params[:2])
    m = int(np.frombuffer(launch.params[2], np.int32)[0])
    radius, block = int(kernel.tag["RADIUS"]), int(kernel.tag["BLOCK"])
    x, y = standin.view(x_ptr, "float32", m + 2 * radius), standin.view(y_ptr, "float32", m)
    y[:] = sum(x[d : m + d] for d in range(2 * radius + 1)) + (1.0 if kernel.tag["SKEW"] == "true" else 0.0)
    return 0.010 + 0.002 * 256 / block  # SYNTHETIC milliseconds


def scale_rows(standin, kernel, launch):
    """tests/test_strided_tuning.py's `scale_rows` kernel: x[r, c] *= FACTOR in place, x a strided
    view (params: pointer, rows, cols, stride0, stride1 in elements). The variant for a unit
    innermost stride (UNIT=true) steps by one element, whatever the stride says, as its CUDA code
    would: given a non-unit stride it writes the wrong elements, and verification rejects it."""
    x_ptr = int.from_bytes(launch.params[0], "little")
    rows, cols = (int(np.frombuffer(p, np.int32)[0]) for p in launch.params[1:3])
    s0, s1 = (int(np.frombuffer(p, np.int64)[0]) for p in launch.params[3:5])
    unit, factor, block = kernel.tag["UNIT"] == "true", float(kernel.tag["FACTOR"]), int(kernel.tag["BLOCK"])
    step = 1 if unit else s1
    span = (rows - 1) * s0 + (cols - 1) * max(step, s1) + 1
    buffer = standin.view(x_ptr, "float32", span)
    for r in range(rows):
        row = buffer[r * s0 : r * s0 + (cols - 1) * step + 1 : step]
        row *= factor
    return 0.010 + 0.002 * 256 / block  # SYNTHETIC milliseconds


if __name__ == "__main__":
    ccs = [tuple(int(p) for p in cc.split(".")) for cc in os.environ.get("STANDIN_CCS", "9.0").split(",")]
    counts = {"compare_launches": 0, "output_downloads": 0}
    download = cuda_standin.StandIn.cuMemcpyDtoH

    def counted_download(self, dst, src, nbytes):
        counts["output_downloads"] += int(nbytes) > 1024  # an output; a compare record or one element is a few bytes
        return download(self, dst, src, nbytes)

    cuda_standin.StandIn.cuMemcpyDtoH = counted_download
    standin = cuda_standin.install_globally(ccs)
    for device in standin.devices:
        device.total_memory = int(os.environ.get("STANDIN_MEMORY", device.total_memory))
    cuda_standin.EMULATORS["scale"] = scale
    cuda_standin.EMULATORS["halo"] = halo
    cuda_standin.EMULATORS["scale_rows"] = scale_rows
    standin_compare.register()
    from hatch_autotune.tuning import worker

    ops = os.environ.get("STANDIN_OPS")
    if ops:
        handle = worker._WorkerState.handle

        def logged(self, msg):
            with open(ops, "a") as f:
                f.write(f"{msg.op}\n")
            return handle(self, msg)

        worker._WorkerState.handle = logged
    worker.main()
    if os.environ.get("STANDIN_COUNT"):  # STANDIN_COUNT: a file for what the stand-in saw, written as the worker ends
        counts["compare_launches"] = sum(launch.entry.startswith("hatch_autotune_compare") for launch in standin.launches)
        counts["graph_calls"] = standin.graph_calls
        with open(os.environ["STANDIN_COUNT"], "w") as f:
            json.dump(counts, f)
