"""The Python side of the driver seam on the CPU: cuda-bindings against ctypes, over a libcuda.so.1
that does nothing (no GPU needed), to argue which one the runtime should call the driver through.

benchmarks/native/fake_libcuda.c is built with the C compiler against the real cuda.h (of the
nvidia-cuda-runtime distribution installed here), so each of its functions has the header's
signature; each returns CUDA_SUCCESS at once, and its cuGetProcAddress finds them for
cuda-bindings. Whatever a call costs through it is the seam's own Python-side cost, which a real
driver adds its work to, alike for both. Measured, interleaved, medians of the repetitions:

  per call (µs)   cuLaunchKernel as the runtime's fast path calls it (function handle, grid,
                  block, shared bytes, stream handle, the parameter buffer's address) through
                  cuda-bindings; through ctypes with argtypes (each Python int converted per call);
                  through ctypes with the arguments made ctypes objects once (what a plan could
                  keep: the function, grid, block and shared bytes fixed per plan, the buffer's
                  address per buffer, the stream per stream); cuCtxGetCurrent and the int of its
                  answer (the fast path's context check) through each
  import (ms)     in fresh interpreters (numpy imported first, as an array library brings it):
                  `from cuda.bindings import driver` then cuInit; against ctypes loading
                  libcuda.so.1 and declaring the 17 driver functions the runtime calls, then cuInit

    python benchmarks/driver_seam_cpu.py [--out DIR] [--quick]   # writes driver_seam_cpu.json
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine, options, write_result

NATIVE = Path(__file__).resolve().parent / "native" / "fake_libcuda.c"
CALLS, REPEATS = 50_000, 9
IMPORT_REPEATS = 9
# The driver functions the runtime's seam calls (runtime/cuda_seam.py, launching.py, tensor_map.py):
# what a ctypes seam would declare at its start.
RUNTIME_FUNCTIONS = (
    "cuInit", "cuDeviceGetCount", "cuDriverGetVersion", "cuDeviceGetAttribute", "cuCtxGetDevice", "cuCtxGetCurrent",
    "cuPointerGetAttribute", "cuDevicePrimaryCtxRetain", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuModuleLoadData",
    "cuModuleGetFunction", "cuFuncGetAttribute", "cuFuncSetAttribute", "cuLaunchKernel", "cuLaunchKernelEx",
    "cuTensorMapEncodeTiled",
)  # fmt: skip

IMPORT_BINDINGS = """
import sys, time, numpy
t0 = time.perf_counter()
from cuda.bindings import driver
err, = driver.cuInit(0)
assert int(err) == 0, err
print((time.perf_counter() - t0) * 1e3)
"""

IMPORT_CTYPES = """
import sys, time, numpy
t0 = time.perf_counter()
import ctypes
lib = ctypes.CDLL("libcuda.so.1")
for name in {names!r}:
    fn = getattr(lib, name, None)  # the fake defines a few; a real driver all
    if fn is not None:
        fn.restype = ctypes.c_int
assert lib.cuInit(0) == 0
print((time.perf_counter() - t0) * 1e3)
"""


def build(folder: Path) -> Path:
    """fake_libcuda.c compiled against cuda.h into folder/libcuda.so.1."""
    import nvidia.cuda_runtime

    include = Path(next(iter(nvidia.cuda_runtime.__path__))) / "include"
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None or not (include / "cuda.h").is_file():
        raise SystemExit(f"driver_seam_cpu.py: needs a C compiler and cuda.h (nvidia-cuda-runtime); found {compiler}, {include}")
    out = folder / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", f"-I{include}", "-o", str(out), str(NATIVE), "-ldl"], check=True)
    return out


def loop_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def per_call(calls: int, repeats: int) -> dict[str, list[float]]:
    """µs per call of each contender, interleaved (this process loaded the fake libcuda)."""
    import numpy as np
    from cuda.bindings import driver

    assert int(driver.cuInit(0)[0]) == 0
    lib = ctypes.CDLL("libcuda.so.1")
    pointers = np.zeros(4, np.uint64)
    params = int(pointers.__array_interface__["data"][0])
    head = (0x7F00_1234_5000, 4, 1, 1, 256, 1, 1, 0)  # function, grid, block, shared bytes
    stream = 0x1  # the legacy default stream's handle
    bindings_head = (driver.CUfunction(head[0]), *head[1:])
    bindings_launch = driver.cuLaunchKernel
    converted = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, *[ctypes.c_void_p] * 3)(("cuLaunchKernel", lib))
    raw = lib.cuLaunchKernel
    raw.restype = ctypes.c_int
    kept = (ctypes.c_void_p(head[0]), *map(ctypes.c_uint, head[1:]), ctypes.c_void_p(stream), ctypes.c_void_p(params), None)
    bindings_context = driver.cuCtxGetCurrent
    get_context = lib.cuCtxGetCurrent
    get_context.restype = ctypes.c_int
    context = ctypes.c_void_p()
    where = ctypes.byref(context)

    def ctypes_context() -> int | None:
        get_context(where)
        return context.value

    contenders = {
        "launch: cuda-bindings": lambda: bindings_launch(*bindings_head, stream, params, 0),
        "launch: ctypes, converted per call": lambda: converted(*head, stream, params, None),
        "launch: ctypes, arguments kept": lambda: raw(*kept),
        "context: cuda-bindings + int()": lambda: int(bindings_context()[1]),
        "context: ctypes": ctypes_context,
        "floor: a lambda": lambda: None,
    }
    assert bindings_launch(*bindings_head, stream, params, 0)[0] == 0 and converted(*head, stream, params, None) == 0 and raw(*kept) == 0
    assert int(bindings_context()[1]) == ctypes_context() == 0xC000
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    for rep in range(repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            samples[name].append(loop_us(contenders[name], calls))
        print(f"  per call [{rep + 1}/{repeats}] " + ", ".join(f"{n} {samples[n][-1]:.3f}" for n in names), flush=True)
    return samples


def imports(folder: Path, repeats: int) -> dict[str, list[float]]:
    """ms of each seam's import and start, in fresh interpreters, alternated."""
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(p for p in (str(folder), os.environ.get("LD_LIBRARY_PATH", "")) if p)}
    scripts = {"cuda-bindings": IMPORT_BINDINGS, "ctypes": IMPORT_CTYPES.format(names=RUNTIME_FUNCTIONS)}
    samples: dict[str, list[float]] = {name: [] for name in scripts}
    names = list(scripts)
    for rep in range(repeats):
        for name in names[rep % 2 :] + names[: rep % 2]:
            done = subprocess.run([sys.executable, "-c", scripts[name]], env=env, capture_output=True, text=True, timeout=120)
            if done.returncode:
                raise SystemExit(f"driver_seam_cpu.py: the {name} import failed:\n{done.stderr[-2000:]}")
            samples[name].append(float(done.stdout.split()[-1]))
        print(f"  import [{rep + 1}/{repeats}] " + ", ".join(f"{n} {samples[n][-1]:.1f} ms" for n in names), flush=True)
    return samples


def main() -> None:
    opts = options(__doc__).parse_args()
    calls, repeats, import_repeats = (CALLS // 10, 5, 3) if opts.quick else (CALLS, REPEATS, IMPORT_REPEATS)
    given = os.environ.get("HATCH_AUTOTUNE_FAKE_LIBCUDA")
    if given is None:  # here: describe the machine (its real driver, if any), build, then run again over the fake
        folder = Path(tempfile.mkdtemp(prefix="fake-libcuda-"))
        build(folder)
        env = {**os.environ, "HATCH_AUTOTUNE_FAKE_LIBCUDA": str(folder), "HATCH_AUTOTUNE_MACHINE": json.dumps(machine())}
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("LD_LIBRARY_PATH", "")) if p)
        raise SystemExit(
            subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode
        )  # the loader reads LD_LIBRARY_PATH at start
    folder = Path(given)
    host = json.loads(os.environ["HATCH_AUTOTUNE_MACHINE"])
    calls_us = per_call(calls, repeats)
    import_ms = imports(folder, import_repeats)
    med = {name: statistics.median(v) for name, v in calls_us.items()}
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "library": f"{NATIVE.name} built against nvidia-cuda-runtime's cuda.h",
        "calls_per_loop": calls,
        "repeats": repeats,
        "quick": opts.quick,
        "per_call_us": {name: {"median": m, "min": min(calls_us[name]), "max": max(calls_us[name])} for name, m in med.items()},
        "launch_ctypes_kept_over_bindings": med["launch: ctypes, arguments kept"] / med["launch: cuda-bindings"],
        "context_ctypes_over_bindings": med["context: ctypes"] / med["context: cuda-bindings + int()"],
        "import_ms": {name: {"median": statistics.median(v), "min": min(v), "max": max(v)} for name, v in import_ms.items()},
        "samples": {"per_call_us": calls_us, "import_ms": import_ms},
        "machine": host,
    }
    print(write_result("driver_seam_cpu.json", payload, opts.out).read_text())


if __name__ == "__main__":
    main()
