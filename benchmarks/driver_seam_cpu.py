"""The Python side of the driver seam on the CPU: cuda-bindings against ctypes, over a libcuda.so.1
that does nothing (no GPU needed), to argue which one the runtime should call the driver through.

tests/native/fake_libcuda.c (the tests' libcuda) is built with the C compiler against the real
cuda.h (of the nvidia-cuda-runtime distribution installed here), so each of its functions has the
header's signature; each records its arguments and returns, and its cuGetProcAddress finds them
for cuda-bindings. Whatever a call costs through it is the seam's own Python-side cost (and the
fake's few stores, alike for both), which a real driver adds its work to. Measured, interleaved, medians of the repetitions:

  per call (µs)   cuLaunchKernel as the runtime's fast path calls it (function handle, grid,
                  block, shared bytes, stream handle, the parameter buffer's address) through
                  cuda-bindings; through ctypes with argtypes (each Python int converted per call);
                  through ctypes with the arguments made ctypes objects once (what a plan could
                  keep: the function, grid, block and shared bytes fixed per plan, the buffer's
                  address per buffer, the stream per stream); cuCtxGetCurrent and the int of its
                  answer (the fast path's context check) through each; and example_pkg's
                  generated saxpy on its fast path over this libcuda through the runtime's own
                  seam (runtime/libcuda.py), against the raw cuda-bindings launch: the CPU side
                  of the GPU goal (per call <= 1.3x a raw cuLaunchKernel)
  import (ms)     in fresh interpreters (numpy imported first, as an array library brings it):
                  `from cuda.bindings import driver` then cuInit; against the runtime's own
                  libcuda.py loaded and its LibCuda made (libcuda.so.1 loaded, its functions
                  declared through ctypes), then cuInit

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

from _common import ROOT, machine, options, write_result

sys.path.insert(0, str(ROOT / "tests"))
CALLS, REPEATS = 50_000, 9
IMPORT_REPEATS = 9
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
import importlib.util
spec = importlib.util.spec_from_file_location("libcuda", {path!r})  # the runtime's module alone, as the first call makes it
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
err, = module.LibCuda("libcuda.so.1").cuInit(0)
assert int(err) == 0, err
print((time.perf_counter() - t0) * 1e3)
"""


def loop_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def generated_saxpy() -> tuple:
    """example_pkg's saxpy, built with the real pipeline and run over the runtime's own seam on
    this process's (fake) libcuda, with __cuda_array_interface__ arrays in its device memory;
    checked once to launch what it should, then on its fast path."""
    from _common import example_project, import_generated
    from fake_libcuda import DEVICE_BASE, FakeLibcuda

    kernels = import_generated(example_project(), Path(tempfile.mkdtemp()))
    rt = kernels._runtime
    rt.use_gpu(rt.CudaApi.libcuda("libcuda.so.1"))
    saxpy = rt.Library.load(kernels._LIBRARY.directory).kernels["saxpy"]

    class Array:
        def __init__(self, ptr: int, n: int):
            self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "strides": None, "version": 3}

    x, y = Array(DEVICE_BASE + 0x1000, 1024), Array(DEVICE_BASE + 0x9000, 1024)
    fake = FakeLibcuda(Path(os.environ["HATCH_AUTOTUNE_FAKE_LIBCUDA"]) / "libcuda.so.1")
    saxpy(2.0, x, y)
    saxpy(3.0, x, y)
    state = fake.state
    assert saxpy.checked_calls == 1 and state.launches >= 2 and list(state.params[1:3]) == [DEVICE_BASE + 0x1000, DEVICE_BASE + 0x9000]
    return saxpy, x, y


def per_call(calls: int, repeats: int) -> dict[str, list[float]]:
    """µs per call of each contender, interleaved (this process loaded the fake libcuda)."""
    import numpy as np
    from cuda.bindings import driver

    assert int(driver.cuInit(0)[0]) == 0
    lib = ctypes.CDLL("libcuda.so.1")
    assert lib.cuCtxPushCurrent_v2(ctypes.c_void_p(0xC000)) == 0  # the fake launches in a current context
    values = np.zeros(4, np.uint64)  # four 8-byte parameters, and the table of their addresses
    pointers = np.array([values.ctypes.data + 8 * i for i in range(4)], np.uint64)
    params = int(pointers.ctypes.data)
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

    saxpy, x, y = generated_saxpy()
    contenders = {
        "call: the generated saxpy over libcuda (fast path)": lambda: saxpy(2.0, x, y),
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
    installed = folder / "libcuda_module" / "libcuda.py"  # byte-compiled, as pip installs a wheel
    installed.parent.mkdir(exist_ok=True)
    shutil.copyfile(ROOT / "hatch_autotune" / "runtime" / "libcuda.py", installed)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(installed.parent)], check=True)
    scripts = {
        "cuda-bindings": IMPORT_BINDINGS,
        "ctypes": IMPORT_CTYPES.format(path=str(installed)),
    }
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
        from fake_libcuda import build

        folder = build(Path(tempfile.mkdtemp(prefix="fake-libcuda-"))).parent
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
        "library": "tests/native/fake_libcuda.c built against nvidia-cuda-runtime's cuda.h",
        "calls_per_loop": calls,
        "repeats": repeats,
        "quick": opts.quick,
        "per_call_us": {name: {"median": m, "min": min(calls_us[name]), "max": max(calls_us[name])} for name, m in med.items()},
        "launch_ctypes_kept_over_bindings": med["launch: ctypes, arguments kept"] / med["launch: cuda-bindings"],
        "generated_over_raw_bindings_launch": med["call: the generated saxpy over libcuda (fast path)"] / med["launch: cuda-bindings"],
        "context_ctypes_over_bindings": med["context: ctypes"] / med["context: cuda-bindings + int()"],
        "import_ms": {name: {"median": statistics.median(v), "min": min(v), "max": max(v)} for name, v in import_ms.items()},
        "samples": {"per_call_us": calls_us, "import_ms": import_ms},
        "machine": host,
    }
    payload["table"] = table(payload)
    print(write_result("driver_seam_cpu.json", payload, opts.out).read_text())


def table(payload: dict) -> str:
    """The markdown table docs/drivers.md shows (its docs hook checks it against this file)."""
    calls, imports = payload["per_call_us"], payload["import_ms"]

    def row(label: str, stats: dict, unit: str) -> str:
        digits = 2 if unit == "µs" else 1
        return f"| {label} | {stats['median']:.{digits}f} {unit} | {stats['min']:.{digits}f}-{stats['max']:.{digits}f} {unit} |"

    rows = [
        "| on the development VM, over a libcuda without a GPU (it records its arguments) | median | range |",
        "|---|---|---|",
        row("import and start: `cuda.bindings.driver`, cuInit", imports["cuda-bindings"], "ms"),
        row("import and start: the runtime's `libcuda.py` (ctypes), cuInit", imports["ctypes"], "ms"),
        row("cuLaunchKernel through cuda-bindings", calls["launch: cuda-bindings"], "µs"),
        row("cuLaunchKernel through ctypes, arguments kept (the runtime's fast path)", calls["launch: ctypes, arguments kept"], "µs"),
        row("cuLaunchKernel through ctypes, arguments converted per call", calls["launch: ctypes, converted per call"], "µs"),
        row("cuCtxGetCurrent and int(): cuda-bindings", calls["context: cuda-bindings + int()"], "µs"),
        row("cuCtxGetCurrent through ctypes (the runtime's)", calls["context: ctypes"], "µs"),
        row("example_pkg's saxpy, fast path, over the runtime's seam", calls["call: the generated saxpy over libcuda (fast path)"], "µs"),
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    main()
