"""Host time per call of a generated kernel callable, against the launches it competes with (GPU only).

What is timed is the host's time per launch with the GPU kept out of it. Before each timed loop a
one-thread kernel that holds the GPU (it busy-waits on the GPU's nanosecond timer for `hold_ms`)
is launched on the stream, so every launch of the loop queues behind it and the loop never waits
for the GPU; the timer stops before anything synchronises. An event recorded right after the hold
and still pending when the loop ends says the hold outlasted the loop; a loop where it did not is
counted as `gpu_limited`. A loop has CALLS_PER_LOOP (250) launches: the driver keeps about a
thousand launches pending before cuLaunchKernel itself waits for the GPU, which would time the GPU
again. The hold lasts HOLD_FACTOR times the slowest contender's loop, measured first.

The contenders launch the same cubin (the tuned saxpy selection for n = 1024, float32) on the same
stream, the legacy default stream: CuPy's and PyTorch's current stream unless a program changes it,
so what the generated callable launches on with stream=None (handle 0; cuda.core's default_stream
names it CU_STREAM_LEGACY; the handles used are in the result's parameters.streams):
  raw_cuLaunchKernel  driver.cuLaunchKernel with a kernelParams buffer packed once: the floor
  cuda_core_launch    cuda.core's launch(stream, config, kernel, *args), everything prebuilt
  cupy_rawkernel      CuPy's RawModule function of the cubin, fn(grid, block, args), CuPy arrays
  generated_cupy      kernels.saxpy(2.0, x, y) with CuPy arrays
  generated_torch     kernels.saxpy(2.0, x, y) with PyTorch tensors (left out without torch)
  torch_operator      torch_ops.saxpy(2.0, x, y), the PyTorch operator (torch.ops.example_pkg.saxpy,
                      issue #37): PyTorch's dispatcher, then the same call (left out without torch)
A raw launch with PyTorch's pointers is not measured: its pointers are packed once, so it is
raw_cuLaunchKernel again. Each contender is bound with functools.partial, so every loop pays the
same one call from Python.

Interleaved: REPS repetitions (7; --quick 5); in each, LOOPS_PER_REP loops per contender, the
order rotated by one from loop to loop; a repetition's sample is the median of its loops, in µs
per call. Reported per contender: the median over repetitions, min, max, p25 and p75, and every
loop's time; the ratios generated / raw and generated / CuPy RawKernel (of the medians, and the
range of the repetitions' paired ratios). Goal (issue #35): generated <= 1.3x raw and <= CuPy's
RawKernel, with CuPy arrays and with PyTorch tensors; (issue #37) the operator <= 1.5x the
generated callable with PyTorch tensors.

After the timing, each contender's timed call runs once more on its own arrays refilled with
fresh values and is checked against y = a * x + y, so that a contender that launched nothing, or
the wrong thing, cannot post a fast time (the result is written, then the script exits 1). Also
timed, alone and without GPU work: the host parts that explain the differences (two CuPy
pointers, two PyTorch pointers, each library's current stream as the runtime reads it,
cuCtxGetCurrent (the launch's context check), the parameter buffer's pack_into of a saxpy call's values).

    python benchmarks/launch_overhead.py [--out DIR] [--quick]   # writes DIR/launch_overhead.json
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import example_project, import_generated, machine, options, require_gpu, spread, write_result

N = 1024
A = 2.0
REPS, QUICK_REPS = 7, 5
LOOPS_PER_REP, QUICK_LOOPS_PER_REP = 8, 5
CALLS_PER_LOOP = 250  # well below the ~1000 pending launches at which cuLaunchKernel blocks
WARMUP_CALLS = 20
HOLD_FACTOR = 4  # the hold lasts this many times the slowest contender's loop (plus 1 ms)
MIN_HOLD_MS, MAX_HOLD_MS, PROBE_HOLD_MS = 10.0, 250.0, 250.0
HOST_CALLS, HOST_REPEATS = 20_000, 5
GOAL_VS_RAW, GOAL_VS_CUPY, GOAL_OPERATOR = 1.3, 1.0, 1.5

RAW, CORE, CUPY_RAW, GEN_CUPY, GEN_TORCH = "raw_cuLaunchKernel", "cuda_core_launch", "cupy_rawkernel", "generated_cupy", "generated_torch"
OPERATOR = "torch_operator"
GENERATED = (GEN_CUPY, GEN_TORCH)

HOLD_SOURCE = r"""
extern "C" __global__ void hold_gpu(unsigned long long ns, long long max_cycles)
{
    // One thread busy-waits for `ns` nanoseconds of the GPU's global timer (SM cycles would
    // depend on the clock); the cycle cap ends it should that timer not advance.
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    const long long first = clock64();
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns && clock64() - first < max_cycles);
}
"""
HOLD_MAX_CYCLES_PER_NS = 4  # a cap well above any SM clock (<= 2.1 GHz on an H200)


class PackedParams:
    """cuLaunchKernel's kernelParams, built once: each value a ctypes object of its C type, and
    the array of their addresses, whose own address is what the driver takes."""

    def __init__(self, *values: Any):
        self.values = values  # kept alive: the driver reads them at every launch
        self.pointers = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        self.address = ctypes.addressof(self.pointers)


class GpuHold:
    """A kernel that keeps the GPU busy for a given time on the measured stream, so that the
    launches of a timed loop queue behind it: the loop then times the host alone."""

    def __init__(self, driver: Any, check: Callable[..., Any], arch: str, stream: int):
        from hatch_autotune.compile.nvrtc import CompileJob, compile_one

        ok, cubin, log = compile_one(CompileJob(HOLD_SOURCE, arch, "hold_gpu"))
        if not ok:
            raise SystemExit(f"launch_overhead.py: the kernel that holds the GPU did not compile for {arch}:\n{log}")
        self.driver, self.check, self.stream = driver, check, stream
        module = check(driver.cuModuleLoadData(cubin), "cuModuleLoadData (hold_gpu)")
        self.function = check(driver.cuModuleGetFunction(module, b"hold_gpu"), "cuModuleGetFunction (hold_gpu)")
        self.ns, self.max_cycles = ctypes.c_uint64(0), ctypes.c_int64(0)
        self.params = PackedParams(self.ns, self.max_cycles)
        flags = driver.CUevent_flags
        self.after = check(driver.cuEventCreate(flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        self.timing = [check(driver.cuEventCreate(flags.CU_EVENT_DEFAULT), "cuEventCreate") for _ in range(2)]
        self.not_ready = driver.CUresult.CUDA_ERROR_NOT_READY

    def _launch(self, ms: float) -> None:
        ns = int(ms * 1e6)
        self.ns.value, self.max_cycles.value = ns, ns * HOLD_MAX_CYCLES_PER_NS  # read by the driver at the launch
        self.check(self.driver.cuLaunchKernel(self.function, 1, 1, 1, 1, 1, 1, 0, self.stream, self.params.address, 0), "hold_gpu")

    def start(self, ms: float) -> None:
        """The hold on the stream, then the event that completes when the hold ends."""
        self._launch(ms)
        self.check(self.driver.cuEventRecord(self.after, self.stream), "cuEventRecord")

    def holding(self) -> bool:
        """Whether the hold still runs (its event pending), asked without waiting."""
        result = self.driver.cuEventQuery(self.after)
        if result[0] == self.not_ready:
            return True
        self.check(result, "cuEventQuery")
        return False

    def finish(self) -> None:
        """Wait for the hold and for every launch queued behind it."""
        self.check(self.driver.cuCtxSynchronize(), "cuCtxSynchronize")

    def measured_ms(self, ms: float) -> float:
        """How long a hold of `ms` lasts on the GPU (CUDA events): says whether its timer works."""
        start, end = self.timing
        self.check(self.driver.cuEventRecord(start, self.stream), "cuEventRecord")
        self._launch(ms)
        self.check(self.driver.cuEventRecord(end, self.stream), "cuEventRecord")
        self.finish()
        return float(self.check(self.driver.cuEventElapsedTime(start, end), "cuEventElapsedTime"))


@dataclass
class Contender:
    """One way to launch the kernel: `call` launches it once (arguments bound), on `arrays`
    (x, y) of `library`, which the correctness check refills and reads."""

    name: str
    call: Callable[[], Any]
    arrays: tuple[Any, Any]
    library: str  # "cupy" or "torch"


def timed_loop(call: Callable[[], Any], calls: int, hold: GpuHold, hold_ms: float) -> tuple[float, bool]:
    """(µs per call, whether the GPU may have limited the loop): `calls` calls queued behind a
    hold, timed on the host; the timer stops before the hold is waited for."""
    hold.start(hold_ms)
    loop = itertools.repeat(None, calls)
    t0 = time.perf_counter()
    for _ in loop:
        call()
    elapsed = time.perf_counter() - t0
    held = hold.holding()
    hold.finish()
    return elapsed / calls * 1e6, not held


def host_us(fn: Callable[[], Any]) -> dict[str, Any]:
    """µs per call of a host-only operation (no GPU work): HOST_REPEATS loops of HOST_CALLS."""
    samples = []
    for _ in range(HOST_REPEATS):
        loop = itertools.repeat(None, HOST_CALLS)
        t0 = time.perf_counter()
        for _ in loop:
            fn()
        samples.append((time.perf_counter() - t0) / HOST_CALLS * 1e6)
    return spread(samples)


def import_torch() -> tuple[Any, str | None]:
    """(torch, None) when PyTorch and its CUDA are there, else (None, why not)."""
    try:
        import torch
    except ImportError as exc:
        return None, f"PyTorch not importable ({exc})"
    if not torch.cuda.is_available():
        return None, "torch.cuda.is_available() is False"
    return torch, None


def main() -> None:
    opts = options(__doc__).parse_args()
    reps, loops_per_rep = (QUICK_REPS, QUICK_LOOPS_PER_REP) if opts.quick else (REPS, LOOPS_PER_REP)
    arch = require_gpu("launch_overhead.py")  # before importing CuPy: one clear line without a GPU
    import cupy as cp
    import numpy as np
    from cuda.bindings import driver
    from cuda.core import Device, LaunchConfig, ObjectCode, Stream, launch

    from hatch_autotune.runtime import check_cuda

    dev = Device(0)
    dev.set_current()  # the primary context, which CuPy, PyTorch and the runtime share
    torch, no_torch = import_torch()
    kernels = import_generated(example_project(env={"HATCH_AUTOTUNE_ARCHS": arch}), Path(tempfile.mkdtemp()))
    rt = kernels._runtime
    saxpy = kernels.saxpy
    sel = saxpy.select(n=N, T="float32")
    binary = saxpy.binary(sel)
    is_ptx = sel.binary.startswith("compute_")
    grid, block, shared = saxpy.geometry(sel.config, {"T": "float32"}, {"n": N})
    grid3, block3 = (*grid, 1, 1)[:3], (*block, 1, 1)[:3]

    # The stream: what the generated callable launches on for CuPy arrays with stream=None.
    cupy_stream = rt.args.array_reader(cp.ndarray).current_stream
    stream = int(cupy_stream(0))
    core_stream = dev.default_stream if stream == 0 else Stream.from_handle(stream)
    streams = {"cupy_current": stream, "raw_and_hold": stream, "cuda_core": int(core_stream.handle)}
    if torch is not None:
        streams["torch_current"] = int(torch._C._cuda_getCurrentRawStream(0))

    def cupy_pair() -> tuple[Any, Any]:
        return cp.ones(N, cp.float32), cp.ones(N, cp.float32)

    contenders: list[Contender] = []
    # 1. the floor: the driver's call with a parameter buffer packed once
    data = binary + b"\0" if is_ptx and not binary.endswith(b"\0") else binary
    module = check_cuda(driver.cuModuleLoadData(data), "cuModuleLoadData (saxpy)")
    function = check_cuda(driver.cuModuleGetFunction(module, saxpy.entry.encode()), "cuModuleGetFunction (saxpy)")
    x, y = cupy_pair()
    raw_params = PackedParams(ctypes.c_float(A), ctypes.c_uint64(x.data.ptr), ctypes.c_uint64(y.data.ptr), ctypes.c_int32(N))
    raw_call = functools.partial(driver.cuLaunchKernel, function, *grid3, *block3, shared, stream, raw_params.address, 0)
    contenders.append(Contender(RAW, raw_call, (x, y), "cupy"))
    # 2. cuda.core: C float and int as numpy scalars (a Python float would be packed as a double,
    # an int as a 64-bit pointer), the arrays as their device pointers
    code = ObjectCode.from_ptx(binary) if is_ptx else ObjectCode.from_cubin(binary)
    config = LaunchConfig(grid=grid, block=block, shmem_size=shared)
    x, y = cupy_pair()
    core_call = functools.partial(
        launch, core_stream, config, code.get_kernel(saxpy.entry), np.float32(A), x.data.ptr, y.data.ptr, np.int32(N)
    )
    contenders.append(Contender(CORE, core_call, (x, y), "cupy"))
    # 3. CuPy's RawModule of the same binary, from a file as a hand-written wrapper would load it
    path = Path(tempfile.mkdtemp()) / ("saxpy.ptx" if is_ptx else "saxpy.cubin")
    path.write_bytes(binary)
    cupy_fn = cp.RawModule(path=str(path)).get_function(saxpy.entry)
    x, y = cupy_pair()
    shared_mem = {"shared_mem": shared} if shared else {}  # no keyword when there is none: CuPy's own fast call
    cupy_call = functools.partial(cupy_fn, grid, block, (np.float32(A), x, y, np.int32(N)), **shared_mem)
    contenders.append(Contender(CUPY_RAW, cupy_call, (x, y), "cupy"))
    # 4. and 5. the generated callable, stream=None
    x, y = cupy_pair()
    contenders.append(Contender(GEN_CUPY, functools.partial(saxpy, A, x, y), (x, y), "cupy"))
    if torch is not None:
        xt, yt = torch.ones(N, device="cuda"), torch.ones(N, device="cuda")
        contenders.append(Contender(GEN_TORCH, functools.partial(saxpy, A, xt, yt), (xt, yt), "torch"))
        torch_ops = importlib.import_module("example_pkg.kernels.torch_ops")  # registers the operators
        xt, yt = torch.ones(N, device="cuda"), torch.ones(N, device="cuda")
        contenders.append(Contender(OPERATOR, functools.partial(torch_ops.saxpy, A, xt, yt), (xt, yt), "torch"))

    hold = GpuHold(driver, check_cuda, arch, stream)
    for c in contenders:  # first calls: module loads, plans, CuPy's argument caches
        for _ in range(WARMUP_CALLS):
            result = c.call()
            if isinstance(result, tuple):  # the driver's (CUresult,)
                check_cuda(result, c.name)
    hold.finish()
    hold_check = {"requested_ms": MIN_HOLD_MS, "measured_ms": hold.measured_ms(MIN_HOLD_MS)}
    # How long a loop takes, each contender behind a long hold; the timed loops' hold follows from it.
    probe = {c.name: timed_loop(c.call, CALLS_PER_LOOP, hold, PROBE_HOLD_MS)[0] * CALLS_PER_LOOP / 1e3 for c in contenders}
    hold_ms = min(MAX_HOLD_MS, max(MIN_HOLD_MS, HOLD_FACTOR * max(probe.values()) + 1.0))
    print(f"loop of {CALLS_PER_LOOP} calls, ms: {', '.join(f'{k} {v:.2f}' for k, v in probe.items())}; hold {hold_ms:.1f} ms", flush=True)

    checked_before = saxpy.checked_calls
    loops: dict[str, list[list[float]]] = {c.name: [[] for _ in range(reps)] for c in contenders}
    gpu_limited: list[dict[str, Any]] = []
    for rep in range(reps):
        for loop in range(loops_per_rep):
            shift = (rep * loops_per_rep + loop) % len(contenders)
            for c in contenders[shift:] + contenders[:shift]:
                us, limited = timed_loop(c.call, CALLS_PER_LOOP, hold, hold_ms)
                loops[c.name][rep].append(us)
                if limited:
                    gpu_limited.append({"contender": c.name, "rep": rep, "loop": loop})
        medians = ", ".join(f"{name} {statistics.median(v[rep]):.2f}" for name, v in loops.items())
        print(f"  [{rep + 1}/{reps}] µs/call: {medians}", flush=True)
    checked_while_timed = saxpy.checked_calls - checked_before

    per_rep = {name: [statistics.median(v) for v in by_rep] for name, by_rep in loops.items()}
    us_per_call = {name: spread(v) for name, v in per_rep.items()}

    def ratio(num: str, den: str) -> dict[str, float]:
        paired = [a / b for a, b in zip(per_rep[num], per_rep[den])]
        return {"median": us_per_call[num]["median"] / us_per_call[den]["median"], "min": min(paired), "max": max(paired)}

    measured = [g for g in GENERATED if g in per_rep]
    ratios = {f"{g}_vs_raw": ratio(g, RAW) for g in measured}
    ratios.update({f"{g}_vs_cupy_rawkernel": ratio(g, CUPY_RAW) for g in measured})
    ratios.update({f"{name}_vs_raw": ratio(name, RAW) for name in (CORE, CUPY_RAW)})
    goals: dict[str, Any] = {"max_vs_raw": GOAL_VS_RAW, "max_vs_cupy_rawkernel": GOAL_VS_CUPY}
    for g in measured:
        goals[f"{g}_vs_raw_met"] = ratios[f"{g}_vs_raw"]["median"] <= GOAL_VS_RAW
        goals[f"{g}_vs_cupy_rawkernel_met"] = ratios[f"{g}_vs_cupy_rawkernel"]["median"] <= GOAL_VS_CUPY
    if OPERATOR in per_rep:
        ratios[f"{OPERATOR}_vs_{GEN_TORCH}"] = ratio(OPERATOR, GEN_TORCH)
        ratios[f"{OPERATOR}_vs_raw"] = ratio(OPERATOR, RAW)
        goals["max_operator_vs_generated_torch"] = GOAL_OPERATOR
        goals[f"{OPERATOR}_vs_{GEN_TORCH}_met"] = ratios[f"{OPERATOR}_vs_{GEN_TORCH}"]["median"] <= GOAL_OPERATOR
    goals["met"] = len(measured) == len(GENERATED) and OPERATOR in per_rep and all(v for k, v in goals.items() if k.endswith("_met"))

    # Host parts, each alone, no GPU work: what the generated call does that the raw one does not.
    host_parts: dict[str, Any] = {}

    def host_part(name: str, make: Callable[[], Callable[[], Any]]) -> None:
        try:
            host_parts[name] = host_us(make())
        except Exception as exc:  # a part that cannot be timed (an internal renamed) is said, not fatal
            host_parts[name] = {"error": f"{type(exc).__name__}: {exc}"}

    by_name = {c.name: c for c in contenders}
    xc, yc = by_name[GEN_CUPY].arrays
    host_part("lambda_call_floor", lambda: lambda: None)
    host_part("two_cupy_data_ptr", lambda: lambda: (xc.data.ptr, yc.data.ptr))
    host_part("cupy_current_stream", lambda: functools.partial(cupy_stream, 0))
    host_part("cuCtxGetCurrent", lambda: driver.cuCtxGetCurrent)

    def pack_into() -> Callable[[], Any]:
        layout = [("float32", 0, None), (rt.params.POINTER, 1, None), (rt.params.POINTER, 2, None), ("int32", None, N)]
        buf = rt.params.ParamBuffer(layout)
        return functools.partial(buf.convert.pack_into, buf.storage, 0, A, xc.data.ptr, yc.data.ptr)

    host_part("param_buffer_pack_into", pack_into)
    if torch is not None:
        xt, yt = by_name[GEN_TORCH].arrays
        host_part("two_torch_data_ptr", lambda: lambda: (xt.data_ptr(), yt.data_ptr()))
        host_part("torch_current_raw_stream", lambda: functools.partial(torch._C._cuda_getCurrentRawStream, 0))

    # Each timed call once more, on its own arrays refilled with fresh values.
    def synchronize() -> None:
        check_cuda(driver.cuCtxSynchronize(), "cuCtxSynchronize")

    rng = np.random.default_rng(35)
    correct: dict[str, bool] = {}
    for c in contenders:
        xs, ys = rng.random(N, dtype=np.float32), rng.random(N, dtype=np.float32)
        xa, ya = c.arrays
        if c.library == "torch":
            xa.copy_(torch.from_numpy(xs))
            ya.copy_(torch.from_numpy(ys))
        else:
            xa.set(xs)
            ya.set(ys)
        synchronize()
        c.call()
        synchronize()
        got = ya.cpu().numpy() if c.library == "torch" else cp.asnumpy(ya)
        correct[c.name] = bool(np.allclose(got, np.float32(A) * xs + ys, rtol=1e-6, atol=1e-6))

    results = {
        "us_per_call": us_per_call,
        "ratios": ratios,
        "goals": goals,
        "gpu_limited_loops": len(gpu_limited),
        "loops": reps * loops_per_rep * len(contenders),
        "checked_calls_while_timed": checked_while_timed,
        "correct": correct,
        "host_parts_us": host_parts,
        "skipped": {GEN_TORCH: no_torch, OPERATOR: no_torch} if no_torch else {},
    }
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "method": "host time per call, each timed loop queued behind a kernel that holds the GPU; interleaved repetitions",
        "n": N,
        "quick": opts.quick,
        "config": sel.config,
        "binary": sel.binary,
        "parameters": {
            "reps": reps,
            "loops_per_rep": loops_per_rep,
            "calls_per_loop": CALLS_PER_LOOP,
            "hold_ms": hold_ms,
            "hold_check": hold_check,
            "probe_loop_ms": probe,
            "streams": streams,
            "grid": list(grid),
            "block": list(block),
            "shared": shared,
            "contenders": [c.name for c in contenders],
        },
        "results": results,
        "samples": {"us_per_call_per_loop": loops, "us_per_call_per_rep": per_rep, "gpu_limited": gpu_limited},
        "machine": machine(),
    }
    out = write_result("launch_overhead.json", payload, opts.out)
    for name, s in us_per_call.items():
        print(f"{name:>20}: {s['median']:.2f} µs/call (min {s['min']:.2f}, max {s['max']:.2f}, p25-p75 {s['p25']:.2f}-{s['p75']:.2f})")
    for name, r in ratios.items():
        print(f"{name:>36}: {r['median']:.2f}x (repetitions {r['min']:.2f}-{r['max']:.2f})")
    print(f"goal {'met' if goals['met'] else 'MISSED'}; {len(gpu_limited)} of {results['loops']} loops GPU-limited; wrote {out}")
    wrong = [name for name, ok in correct.items() if not ok]
    if wrong:
        raise SystemExit(f"launch_overhead.py: wrong results from {', '.join(wrong)}: their times do not count")


if __name__ == "__main__":
    main()
