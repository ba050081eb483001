"""The tuned winners against the hardware's ceilings (GPU only), each DRAM byte counted once.

Memory-bound kernels (saxpy, row_softmax) against two ceilings measured in the same run on
buffers of BIG_BYTES (2 GiB) each, far beyond the L2 (50 MB on an H200):
  memcpy_d2d   cudaMemcpyAsync device to device
  cupy_copy    CuPy's `dst[...] = src` (what the previous version of this benchmark called copy)
  stream:*     a streaming read-write kernel written here (float4 loads, then float4 stores; CuPy
               RawKernel of a cubin from this project's NVRTC), in STREAM_SHAPES launch shapes:
               grid-stride with a few blocks per SM, and one chunk per block; the fastest correct
               shape is the streaming ceiling, and is named
Each counts its bytes once: the source read, the destination written. cudaMemcpy is not the
ceiling for kernels (on the H200 it moved 4.1-4.2 TB/s while kernels reached more), so both are
reported, and the goal is against the streaming kernel.

The kernels at >= 2 GiB, interleaved in the same rounds as the ceilings (so every ratio is side
by side): saxpy float32 with n = BIG_BYTES / 4 (2^29, 2 GiB per array) and float16 at the same n
(1 GiB per array), counting 3 * n * itemsize (x read, y read, y written: once each); row_softmax
at cols 128, 1024 and 8192 (its cols buckets) with rows making x BIG_BYTES, counting
2 * rows * cols * 4 (x read once, y written once: the template's second pass over a row is meant
to hit in L2 or registers, and is not a DRAM byte). Then each declared bucket of saxpy (both
types) and row_softmax, labelled as such: small problems fit in L2, so the L2 is flushed (a
memset of FLUSH_BYTES) before each launch and each launch is timed alone; their fractions are of
the 2 GiB ceilings (a small problem is bound by launch and latency, not by the ceiling), and
of the ceiling at the bucket's own size: the streaming shapes copying the same bytes (each
bucket's byte count, read + write), timed the same way in the same rounds, the fastest correct
one per size; beside it the launch-latency floor, an empty kernel launched and timed the same
way (what no kernel of any size goes below).

SGEMM against cuBLAS (CuPy's `matmul`, float32, TF32 off: CUPY_TF32=0 and
NVIDIA_TF32_OVERRIDE=0 before CuPy loads) at 1024^3 and 4096^3 and at every declared bucket
(m, n, k): TFLOP/s = 2 m n k / time, and cuBLAS time / ours. Each result is checked before it
counts: ours against cuBLAS's over the whole matrix (max |ours - cuBLAS| / max |cuBLAS| <=
GEMM_TOL), and both against float64 on a sample of rows (which says which one is off);
saxpy against a * x + y over the whole array; row_softmax's every row summing to 1 and a sample
of rows against CuPy's softmax; every streaming shape and copy against its source. A wrong
result is reported and makes the script exit 1 after writing its JSON.

Timing: CUDA events on the stream every call runs on (CuPy's current stream, passed to our
kernels as stream=). Interleaved: ROUNDS rounds (7; --quick 5) after a discarded warm-up round;
each round runs every contender of its section once, the order rotated by one each round. A
2 GiB contender's sample is BIG_LAUNCHES back-to-back launches between two events, averaged; a
bucket's or a GEMM's is SMALL_LAUNCHES / GEMM_LAUNCHES launches, each after an L2 flush and
timed alone, averaged. Reported per contender: the median over rounds with p25, p75, min and
max; fractions as the ratio of medians with the range of the rounds' paired ratios. Also kept:
each winner's speedup over the default config per bucket, from the lock file's own measurements.

    python benchmarks/roofline.py [--lock example_pkg/autotune.lock.json] [--out DIR] [--quick]
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import EXAMPLE, example_project, import_generated, machine, options, require_gpu, spread, write_result

# cuBLAS in plain FP32, like our SGEMM: set before CuPy (which reads CUPY_TF32 at import) and
# cuBLAS load; NVIDIA_TF32_OVERRIDE=0 keeps every NVIDIA library off TF32.
os.environ["CUPY_TF32"] = "0"
os.environ["NVIDIA_TF32_OVERRIDE"] = "0"

GiB = 1 << 30
BIG_BYTES = 2 * GiB  # per array, for the ceilings and the big problems
MIN_BIG_BYTES = 256 << 20  # if the device has too little free memory, BIG_BYTES halves down to this
BIG_ARRAYS = 11  # BIG_BYTES arrays alive in the 2 GiB section (2 ceilings, 2 saxpy f32, 1 saxpy f16, 6 softmax)
CHECK_ARRAYS = 5  # and at most this many more while a check runs
FLUSH_BYTES = 256 << 20  # the L2 flush: several times any L2 (50 MB on an H200)
ROUNDS, QUICK_ROUNDS = 7, 5
BIG_LAUNCHES, QUICK_BIG_LAUNCHES = 10, 5  # back to back per sample (each ~1 ms at 2 GiB)
SMALL_LAUNCHES, QUICK_SMALL_LAUNCHES = 10, 5  # each after an L2 flush, timed alone
GEMM_LAUNCHES, QUICK_GEMM_LAUNCHES = 3, 2  # each after an L2 flush, timed alone
SAXPY_A = 2.0
SOFTMAX_BIG_COLS = (128, 1024, 8192)  # row_softmax's cols buckets
SGEMM_HEADLINE = ((1024, 1024, 1024), (4096, 4096, 4096))
GOAL_STREAMING = 0.90  # saxpy float32 and row_softmax at 2 GiB, of the streaming ceiling
GOAL_SGEMM = {1024: 0.80, 4096: 0.90}  # of cuBLAS FP32, m = n = k
GEMM_TOL = 1e-4  # max |ours - cuBLAS| / max |cuBLAS|; two FP32 GEMMs differ by ~1e-6 at k = 4096, TF32 by ~1e-3
CHECK_ROWS = 256  # softmax rows (head and tail each) and GEMM rows (32 each) checked against a reference
SEC_BIG, SEC_BUCKET = "2GiB", "bucket"
FLOOR_NAME = "launch floor (empty kernel)"
EMPTY_KERNEL = 'extern "C" __global__ void roofline_empty() {}'

# The streaming kernels: entry -> (float4s per thread per step, streaming cache hints ld/st.cs).
STREAM_KERNELS = {"stream_copy_u1": (1, False), "stream_copy_u4": (4, False), "stream_copy_u4_cs": (4, True)}
# Launch shapes: (name, entry, threads per block, blocks per SM; None: one chunk per block, the grid covering the array once).
STREAM_SHAPES = (
    ("gs_b256_8perSM_u4", "stream_copy_u4", 256, 8),
    ("gs_b512_4perSM_u1", "stream_copy_u1", 512, 4),
    ("chunk_b256_u1", "stream_copy_u1", 256, None),
    ("chunk_b256_u4", "stream_copy_u4", 256, None),
    ("chunk_b256_u4_cs", "stream_copy_u4_cs", 256, None),
)


def stream_source(entry: str) -> str:
    """One streaming copy kernel: each thread moves `unroll` float4s per step, all loads before
    all stores; the grid strides over the array (a grid smaller than the array) or covers it once."""
    unroll, hints = STREAM_KERNELS[entry]
    load = "__ldcs(src + j)" if hints else "src[j]"
    store = "__stcs(dst + j, v[u])" if hints else "dst[j] = v[u]"
    return f"""
extern "C" __global__ void {entry}(const float4* __restrict__ src, float4* __restrict__ dst, long long n4)
{{
    const long long step = (long long)gridDim.x * blockDim.x * {unroll};
    for (long long base = (long long)blockIdx.x * blockDim.x * {unroll} + threadIdx.x; base < n4; base += step) {{
        float4 v[{unroll}];
#pragma unroll
        for (int u = 0; u < {unroll}; ++u) {{
            const long long j = base + (long long)u * blockDim.x;
            if (j < n4) v[u] = {load};
        }}
#pragma unroll
        for (int u = 0; u < {unroll}; ++u) {{
            const long long j = base + (long long)u * blockDim.x;
            if (j < n4) {store};
        }}
    }}
}}
"""


def stream_grid(n4: int, block: int, per_sm: int | None, unroll: int, sms: int) -> int:
    return sms * per_sm if per_sm else -(-n4 // (block * unroll))


# ---- statistics and the rows of the result (pure: no GPU) ------------------------------------


def rate(amount: float, ms: list[float], scale: float) -> dict[str, float]:
    """amount / time at the median, p25 and p75 of the times (p25 of the rate is p75 of the time)."""
    s = spread(ms)
    return {"median": amount / s["median"] / scale, "p25": amount / s["p75"] / scale, "p75": amount / s["p25"] / scale}


def paired(num_ms: list[float], den_ms: list[float], num_work: float, den_work: float) -> dict[str, float] | None:
    """The rate of `num` over the rate of `den`: at the medians, and the range of the rounds'
    paired ratios (the same round of an interleaved section)."""
    if not num_ms or not den_ms:
        return None
    ratios = [(num_work / a) / (den_work / b) for a, b in zip(num_ms, den_ms)]
    return {
        "median": (num_work / statistics.median(num_ms)) / (den_work / statistics.median(den_ms)),
        "min": min(ratios),
        "max": max(ratios),
    }


def ceilings(meta: dict[str, dict[str, Any]], samples: dict[str, list[float]], correct: dict[str, bool]) -> dict[str, Any]:
    """Each ceiling contender's GB/s; the streaming ceiling is the fastest correct streaming shape."""
    out: dict[str, Any] = {"contenders": {}}
    for name, m in meta.items():
        if m.get("kind") not in ("memcpy", "cupy_copy", "streaming") or name not in samples:
            continue
        out["contenders"][name] = {
            **m,
            "ms": spread(samples[name]),
            "GB_per_s": rate(m["bytes"], samples[name], 1e6),
            "correct": correct.get(name),
        }
    c = out["contenders"]
    streaming = [n for n, v in c.items() if v["kind"] == "streaming" and v["correct"]]
    best = max(streaming, key=lambda n: c[n]["GB_per_s"]["median"]) if streaming else None
    out["streaming_best"] = best
    out["streaming_GB_per_s"] = c[best]["GB_per_s"]["median"] if best else None
    out["memcpy_GB_per_s"] = c["memcpy_d2d"]["GB_per_s"]["median"] if "memcpy_d2d" in c else None
    out["cupy_copy_GB_per_s"] = c["cupy_copy"]["GB_per_s"]["median"] if "cupy_copy" in c else None
    if best and "memcpy_d2d" in c:
        out["streaming_over_memcpy"] = paired(samples[best], samples["memcpy_d2d"], c[best]["bytes"], c["memcpy_d2d"]["bytes"])
    return out


def memory_rows(
    meta: dict[str, dict[str, Any]], samples: dict[str, list[float]], checks: dict[str, dict[str, Any]], ceil: dict[str, Any]
) -> list[dict[str, Any]]:
    """saxpy and row_softmax: GB/s of the bytes counted once, and the fractions of the streaming
    ceiling and of memcpy (paired by round in the 2 GiB section, where they ran side by side)."""
    best, rows = ceil.get("streaming_best"), []
    refs = {"streaming": best, "memcpy": "memcpy_d2d" if "memcpy_d2d" in ceil["contenders"] else None}
    for name, m in meta.items():
        if m.get("kind") not in ("saxpy", "row_softmax") or name not in samples:
            continue
        ms = samples[name]
        row = {
            "name": name,
            **{k: v for k, v in m.items() if k != "kind"},
            "kernel": m["kind"],
            "ms": spread(ms),
            "GB_per_s": rate(m["bytes"], ms, 1e6),
            "check": checks.get(name),
            "correct": bool(checks.get(name, {}).get("ok")),
        }
        for label, ref in refs.items():
            if ref is None:
                row[f"fraction_of_{label}"] = None
            elif m["section"] == SEC_BIG:
                row[f"fraction_of_{label}"] = paired(ms, samples[ref], m["bytes"], meta[ref]["bytes"])
            else:  # a bucket ran in its own section: the ratio of medians only
                row[f"fraction_of_{label}"] = {"median": row["GB_per_s"]["median"] / ceil["contenders"][ref]["GB_per_s"]["median"]}
        if m["section"] == SEC_BUCKET:
            row.update(at_size(m["bytes"], ms, meta, samples, checks))
        rows.append(row)
    return rows


def at_size(
    nbytes: int, ms: list[float], meta: dict[str, dict[str, Any]], samples: dict[str, list[float]], checks: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """A bucket against the ceiling at its own size: the fastest correct streaming shape that
    moved the same bytes in the same rounds (paired by round), and the launch-latency floor
    (an empty kernel timed the same way): the time no launch goes below, and the rate that
    time would give these bytes."""
    shapes = [
        n
        for n, m in meta.items()
        if m.get("kind") == "streaming_at_size" and m["bytes"] == nbytes and n in samples and checks.get(n, {}).get("ok")
    ]
    best = min(shapes, key=lambda n: statistics.median(samples[n])) if shapes else None
    floor = samples.get(FLOOR_NAME)
    return {
        "streaming_at_size_best": best,
        "streaming_at_size_GB_per_s": rate(nbytes, samples[best], 1e6) if best else None,
        "fraction_of_streaming_at_size": paired(ms, samples[best], nbytes, nbytes) if best else None,
        "launch_floor_ms": spread(floor) if floor else None,
        "launch_floor_bound_GB_per_s": nbytes / statistics.median(floor) / 1e6 if floor else None,
        "over_launch_floor": statistics.median(ms) / statistics.median(floor) if floor else None,
    }


def gemm_rows(meta: dict[str, dict[str, Any]], samples: dict[str, list[float]], checks: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (m, n, k): our TFLOP/s, cuBLAS's, and cuBLAS time / ours (paired by round)."""
    rows = []
    for name, m in meta.items():
        if m.get("kind") != "sgemm" or name not in samples or m["peer"] not in samples:
            continue
        flops = 2.0 * m["m"] * m["n"] * m["k"]
        ours, theirs = samples[name], samples[m["peer"]]
        rows.append(
            {
                "name": name,
                **{k: v for k, v in m.items() if k not in ("kind", "peer")},
                "kernel": "sgemm",
                "ms": spread(ours),
                "TFLOP_per_s": rate(flops, ours, 1e9),
                "cublas_ms": spread(theirs),
                "cublas_TFLOP_per_s": rate(flops, theirs, 1e9),
                "fraction_of_cublas": paired(ours, theirs, flops, flops),
                "check": checks.get(name),
                "correct": bool(checks.get(name, {}).get("ok")),
            }
        )
    return rows


def goals(rows: list[dict[str, Any]], sgemm: list[dict[str, Any]], ceil: dict[str, Any]) -> dict[str, Any]:
    """saxpy float32 and row_softmax at 2 GiB >= GOAL_STREAMING of the streaming ceiling; SGEMM
    >= GOAL_SGEMM of cuBLAS; every result correct. A missing figure is a miss."""
    out: dict[str, Any] = {
        "streaming_fraction_min": GOAL_STREAMING,
        "sgemm_fraction_of_cublas_min": {str(k): v for k, v in GOAL_SGEMM.items()},
    }
    checks: dict[str, bool] = {}
    for r in rows:
        if r["section"] != SEC_BIG or (r["kernel"] == "saxpy" and r.get("dtype") != "float32"):
            continue
        f = (r.get("fraction_of_streaming") or {}).get("median")
        checks[r["name"]] = f is not None and r["correct"] and f >= GOAL_STREAMING
    for size, goal in GOAL_SGEMM.items():
        hit = [g for g in sgemm if g["m"] == g["n"] == g["k"] == size]
        f = (hit[0].get("fraction_of_cublas") or {}).get("median") if hit else None
        checks[f"sgemm {size}^3"] = f is not None and hit[0]["correct"] and f >= goal
    out["checks"] = checks
    out["has_ceiling"] = ceil.get("streaming_best") is not None
    out["met"] = bool(checks) and out["has_ceiling"] and all(checks.values())
    return out


def wrong_results(payload: dict[str, Any]) -> list[str]:
    """Names of contenders whose result was checked and found wrong (or that failed to run)."""
    bad = [n for n, v in payload["ceilings"]["contenders"].items() if v.get("correct") is False]
    bad += [r["name"] for r in payload["rows"] + payload["sgemm"] if not r["correct"]]
    return bad + sorted(payload.get("errors", {}))


def table(payload: dict[str, Any]) -> str:
    """The printed summary: ceilings, memory-bound rows, SGEMM rows, goals."""
    c = payload["ceilings"]
    lines = [f"ceilings, {payload['parameters']['big_bytes'] / GiB:g} GiB per array, read + write counted once each:"]
    for name, v in c["contenders"].items():
        g = v["GB_per_s"]
        flag = "" if v["correct"] else "  WRONG"
        mark = "  <- streaming ceiling" if name == c["streaming_best"] else ""
        lines.append(f"  {name:<26} {g['median']:8.0f} GB/s (p25-p75 {g['p25']:.0f}-{g['p75']:.0f}){mark}{flag}")

    def frac(f: dict[str, float] | None) -> str:
        if not f:
            return "   n/a"
        span = f" ({f['min']:.0%}-{f['max']:.0%})" if "min" in f else ""
        return f"{f['median']:6.1%}{span}"

    for section, title in (
        (SEC_BIG, "at >= 2 GiB (interleaved with the ceilings)"),
        (SEC_BUCKET, "declared buckets (L2 flushed before each launch)"),
    ):
        at = section == SEC_BUCKET
        lines.append(
            f"memory bound, {title}: GB/s, of streaming (2 GiB), of memcpy"
            + (", of streaming at the bucket's size, time over the launch floor" if at else "")
            + ", config"
        )
        for r in payload["rows"]:
            if r["section"] != section:
                continue
            tuned = "tuned" if r["tuned"] else "UNTUNED"
            flag = "" if r["correct"] else "  WRONG"
            extra = ""
            if at:
                over = r.get("over_launch_floor")
                extra = f"  {frac(r.get('fraction_of_streaming_at_size')):>18}  {'n/a' if over is None else format(over, '5.2f') + 'x'}"
            lines.append(
                f"  {r['name']:<36} {r['GB_per_s']['median']:8.0f}  {frac(r['fraction_of_streaming']):>18}  "
                f"{frac(r['fraction_of_memcpy']):>18}{extra}  {r['config']} {tuned}{flag}"
            )
        floor = next((r["launch_floor_ms"] for r in payload["rows"] if at and r.get("launch_floor_ms")), None)
        if floor:
            lines.append(f"  launch floor (an empty kernel, the L2 flushed before it, timed alone): {floor['median'] * 1e3:.2f} us")
    lines.append(
        "sgemm vs cuBLAS FP32 (TF32 off), * = headline: TFLOP/s ours, cuBLAS; cuBLAS time / ours; max rel. error vs cuBLAS; config"
    )
    for r in payload["sgemm"]:
        err = (r.get("check") or {}).get("rel_err_vs_cublas")
        f = r["fraction_of_cublas"]
        flag = "" if r["correct"] else "  WRONG"
        size = f"{r['m']}x{r['n']}x{r['k']}{'*' if r['headline'] else ''}"
        lines.append(
            f"  {size:<16} {r['TFLOP_per_s']['median']:7.2f} {r['cublas_TFLOP_per_s']['median']:7.2f}  "
            f"{f['median']:.3f}x ({f['min']:.3f}-{f['max']:.3f})  {'n/a' if err is None else format(err, '.1e')}  "
            f"{r['config']} {'tuned' if r['tuned'] else 'UNTUNED'}{flag}"
        )
    g = payload["goals"]
    lines.append(
        f"goals (2 GiB saxpy float32 and row_softmax >= {GOAL_STREAMING:.0%} of streaming; sgemm "
        + ", ".join(f"{size}^3 >= {goal}x" for size, goal in sorted(GOAL_SGEMM.items(), reverse=True))
        + f" cuBLAS): {'met' if g['met'] else 'MISSED'}"
        + "".join(f"\n  {k}: {'met' if v else 'MISSED'}" for k, v in g["checks"].items())
    )
    wrong = wrong_results(payload)
    if wrong:
        lines.append(f"WRONG results or errors (their times do not count): {', '.join(wrong)}")
    return "\n".join(lines)


def lock_speedups(lock: Path) -> list[dict[str, Any]]:
    """Each tuned entry's winner against the default config, from the lock's own measurements."""
    if not lock.exists():
        return []
    from hatch_autotune.lock import LockFile

    out = []
    for eid, e in LockFile.load(lock).entries.items():
        if e.default_ms and e.winner_ms:
            out.append({"entry": eid, "winner": dict(e.config), "speedup_over_default": e.default_ms / e.winner_ms})
    return out


# ---- measuring (GPU) -----------------------------------------------------------------------------


@dataclass
class Contender:
    """One thing timed: `call` launches it once on the measured stream; `check` (after the
    timing) returns a dict with `ok` and the errors it measured."""

    name: str
    call: Callable[[], Any]
    launches: int  # per sample
    flush: bool  # L2 flushed before each launch, each launch timed alone
    meta: dict[str, Any]
    check: Callable[[], dict[str, Any]] | None = None


class Timer:
    """CUDA events on the measured stream; the L2 flush is a memset on the same stream."""

    def __init__(self, cp: Any, stream: Any, flush_bytes: int):
        self.cp, self.stream = cp, stream
        self.flush_bytes = flush_bytes
        self.flush_buf = cp.empty(flush_bytes, cp.uint8)
        self.start, self.end = cp.cuda.Event(), cp.cuda.Event()

    def flush(self) -> None:
        self.cp.cuda.runtime.memsetAsync(self.flush_buf.data.ptr, 0, self.flush_bytes, self.stream.ptr)

    def sample_ms(self, c: Contender) -> float:
        """Milliseconds per launch of one sample of c."""
        elapsed = self.cp.cuda.get_elapsed_time
        if c.flush:
            total = 0.0
            for _ in range(c.launches):
                self.flush()
                self.start.record(self.stream)
                c.call()
                self.end.record(self.stream)
                self.end.synchronize()
                total += elapsed(self.start, self.end)
            return total / c.launches
        self.start.record(self.stream)
        for _ in range(c.launches):
            c.call()
        self.end.record(self.stream)
        self.end.synchronize()
        return elapsed(self.start, self.end) / c.launches


def run_section(
    label: str, timer: Timer, contenders: list[Contender], rounds: int, errors: dict[str, str]
) -> tuple[dict[str, list[float]], dict[str, dict[str, Any]]]:
    """Interleaved rounds of every contender (after a warm-up round that is not kept), then each
    one's check. A contender whose first call raises is left out and named in `errors`."""
    t0 = time.monotonic()
    live = []
    for c in contenders:  # first calls: module loads, plans, cuBLAS's heuristics, clocks up
        try:
            timer.sample_ms(c)
            live.append(c)
        except Exception as exc:  # a broken contender must not hide the others' figures
            errors[c.name] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            print(f"  [{label}] {c.name}: left out: {errors[c.name]}", flush=True)
    timer.stream.synchronize()  # a sticky CUDA error surfaces here, and ends the run
    samples: dict[str, list[float]] = {c.name: [] for c in live}
    for r in range(rounds):
        shift = r % max(1, len(live))
        for c in live[shift:] + live[:shift]:
            samples[c.name].append(timer.sample_ms(c))
        print(f"  [{label} {r + 1}/{rounds}] {time.monotonic() - t0:.1f} s", flush=True)
    checks: dict[str, dict[str, Any]] = {}
    for c in live:
        if c.check is not None:
            try:
                checks[c.name] = c.check()
            except Exception as exc:
                checks[c.name] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).strip()[:300]}"}
            if not checks[c.name].get("ok"):
                print(f"  [{label}] {c.name}: WRONG: {checks[c.name]}", flush=True)
    timer.stream.synchronize()
    print(f"  [{label}] {len(live)} contenders, {rounds} rounds, checked, in {time.monotonic() - t0:.1f} s", flush=True)
    return samples, checks


def free_memory(cp: Any) -> None:
    cp.cuda.get_current_stream().synchronize()
    cp.get_default_memory_pool().free_all_blocks()


def load_stream_kernels(cp: Any, arch: str) -> tuple[dict[str, Any], dict[str, str]]:
    """entry -> CuPy function, each compiled by this project's NVRTC into a cubin (CuPy's own
    compiler if that fails); entry -> why, for one that compiled neither way."""
    from hatch_autotune.compile.nvrtc import CompileJob, compile_one

    funcs, failed = {}, {}
    folder = Path(tempfile.mkdtemp())
    for entry in STREAM_KERNELS:
        source = stream_source(entry)
        try:
            ok, cubin, log = compile_one(CompileJob(source, arch, entry))
            if not ok or not cubin:
                raise RuntimeError(f"NVRTC: {log.strip()[:500]}")
            path = folder / f"{entry}.cubin"
            path.write_bytes(cubin)
            funcs[entry] = cp.RawModule(path=str(path)).get_function(entry)
        except Exception as exc:
            try:
                funcs[entry] = cp.RawModule(code=source, options=("--std=c++17",)).get_function(entry)
            except Exception as exc2:
                failed[entry] = f"{type(exc).__name__}: {exc}; CuPy: {type(exc2).__name__}: {exc2}"[:800]
    return funcs, failed


def sm_count(cp: Any) -> int:
    try:
        return int(cp.cuda.Device().attributes["MultiProcessorCount"])
    except Exception:
        return int(cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["multiProcessorCount"])


def streaming_contenders(
    np: Any,
    funcs: dict[str, Any],
    src: Any,
    dst: Any,
    sms: int,
    launches: int,
    meta: dict[str, Any],
    copy_check: Callable[[Callable[[], Any]], Callable[[], dict[str, Any]]],
) -> list[Contender]:
    """The streaming ceiling's contenders: each launch shape of STREAM_SHAPES whose kernel
    compiled (`funcs`, from load_stream_kernels) copying float32 `src` to `dst`, checked by
    `copy_check(launch)`; tensor_core.py measures its norms against the same ones."""
    n4 = src.size // 4
    out = []
    for name, entry, block, per_sm in STREAM_SHAPES:
        if entry not in funcs:
            continue
        unroll, hints = STREAM_KERNELS[entry]
        grid = stream_grid(n4, block, per_sm, unroll, sms)
        args = (src, dst, np.int64(n4))

        def launch(fn: Any = funcs[entry], grid: int = grid, block: int = block, args: tuple = args) -> None:
            fn((grid,), (block,), args)

        shape = {
            "entry": entry,
            "grid": grid,
            "block": block,
            "blocks_per_sm": per_sm,
            "float4_per_thread_step": unroll,
            "cache_hints": hints,
        }
        out.append(Contender(f"stream:{name}", launch, launches, False, {**meta, "kind": "streaming", "shape": shape}, copy_check(launch)))
    return out


def big_section(
    cp: Any,
    np: Any,
    kernels: Any,
    timer: Timer,
    arch: str,
    big: int,
    sms: int,
    rounds: int,
    launches: int,
    errors: dict[str, str],
    not_compiled: dict[str, str],
) -> tuple[dict[str, dict[str, Any]], dict[str, list[float]], dict[str, dict[str, Any]]]:
    """The ceilings and the 2 GiB problems, interleaved. Returns (meta, samples, checks); every
    array is gone when it returns."""
    stream = timer.stream
    rng = cp.random.RandomState(2024)
    n = big // 4
    src = rng.random_sample(n, dtype=cp.float32)
    dst = cp.zeros(n, cp.float32)
    contenders: list[Contender] = []

    def copy_check(call: Callable[[], Any]) -> Callable[[], dict[str, Any]]:
        def check() -> dict[str, Any]:
            cp.cuda.runtime.memsetAsync(dst.data.ptr, 0, dst.nbytes, stream.ptr)
            call()
            return {"ok": bool(cp.array_equal(dst, src))}

        return check

    kind = getattr(cp.cuda.runtime, "memcpyDeviceToDevice", 3)

    def memcpy() -> None:
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, kind, stream.ptr)

    def cupy_copy() -> None:
        dst[...] = src

    copy_meta = {"bytes": 2 * big, "section": SEC_BIG}
    contenders.append(Contender("memcpy_d2d", memcpy, launches, False, {**copy_meta, "kind": "memcpy"}, copy_check(memcpy)))
    contenders.append(Contender("cupy_copy", cupy_copy, launches, False, {**copy_meta, "kind": "cupy_copy"}, copy_check(cupy_copy)))
    funcs, failed = load_stream_kernels(cp, arch)
    for entry, why in failed.items():  # its shapes are left out; not an error of what is measured
        not_compiled[entry] = why
        print(f"  [2GiB] streaming kernel {entry} did not compile, its shapes are left out: {why}", flush=True)
    contenders += streaming_contenders(np, funcs, src, dst, sms, launches, copy_meta, copy_check)

    # saxpy: float32 at n = big / 4 (big bytes per array), float16 at the same n
    for dtype in ("float32", "float16"):
        x = rng.random_sample(n, dtype=cp.float32).astype(dtype)
        y = rng.random_sample(n, dtype=cp.float32).astype(dtype)
        contenders.append(saxpy_contender(cp, kernels, stream, x, y, SEC_BIG, launches, False, rng))
    # row_softmax: x of `big` bytes at each cols bucket
    for cols in SOFTMAX_BIG_COLS:
        rows = big // (cols * 4)
        x = rng.standard_normal((rows, cols), dtype=cp.float32)
        y = cp.empty((rows, cols), cp.float32)
        contenders.append(softmax_contender(cp, kernels, stream, x, y, SEC_BIG, launches, False))
    print(
        f"[roofline] {big / GiB:g} GiB section: {len(contenders)} contenders, {rounds} rounds of {launches} back-to-back launches each",
        flush=True,
    )
    samples, checks = run_section(SEC_BIG, timer, contenders, rounds, errors)
    return {c.name: c.meta for c in contenders}, samples, checks


def saxpy_contender(cp: Any, kernels: Any, stream: Any, x: Any, y: Any, section: str, launches: int, flush: bool, rng: Any) -> Contender:
    """kernels.saxpy(a, x, y) on the stream; checked against a * x + y on fresh values."""
    n, dtype = x.size, str(x.dtype)
    sel = kernels.saxpy.select(n=n, T=dtype)

    def call() -> None:
        kernels.saxpy(SAXPY_A, x, y, stream=stream)

    def check() -> dict[str, Any]:
        x[...] = rng.random_sample(n, dtype=cp.float32).astype(dtype)
        y[...] = rng.random_sample(n, dtype=cp.float32).astype(dtype)
        y0 = y.astype(cp.float32)
        call()
        ref = cp.float32(SAXPY_A) * x.astype(cp.float32) + y0
        err = float(cp.abs(y.astype(cp.float32) - ref).max())  # NaN if anything is NaN: not ok
        tol = 1e-5 if dtype == "float32" else 1e-2  # values in [0, 3): a few ulps
        return {"ok": err <= tol, "max_abs_err": err, "tol": tol}

    meta = {
        "kind": "saxpy",
        "section": section,
        "dtype": dtype,
        "n": n,
        "bytes": 3 * n * x.itemsize,
        "bytes_counted": "x read, y read, y written: once each",
        "config": sel.config,
        "tuned": sel.tuned,
        "bucket": sel.bucket,
    }
    return Contender(f"saxpy {dtype} n={n}", call, launches, flush, meta, check)


def softmax_contender(cp: Any, kernels: Any, stream: Any, x: Any, y: Any, section: str, launches: int, flush: bool) -> Contender:
    """kernels.row_softmax(x, y) on the stream; checked: every row sums to 1, and a sample of rows
    (the first and last CHECK_ROWS) against CuPy's softmax."""
    rows, cols = x.shape
    sel = kernels.row_softmax.select(rows=rows, cols=cols)

    def call() -> None:
        kernels.row_softmax(x, y, stream=stream)

    def check() -> dict[str, Any]:
        y.fill(float("nan"))  # an element the kernel does not write stays NaN
        call()
        sums_err = float(cp.abs(y.sum(axis=1, dtype=cp.float64) - 1.0).max())
        idx = cp.concatenate([cp.arange(min(CHECK_ROWS, rows)), cp.arange(max(0, rows - CHECK_ROWS), rows)])
        xs = x[idx].astype(cp.float64)
        ref = cp.exp(xs - xs.max(axis=1, keepdims=True))
        ref /= ref.sum(axis=1, keepdims=True)
        got = y[idx].astype(cp.float64)
        rel = float((cp.abs(got - ref) / ref).max())
        return {"ok": sums_err <= 1e-3 and rel <= 1e-3, "row_sum_max_err": sums_err, "sample_rows_max_rel_err": rel, "tol": 1e-3}

    meta = {
        "kind": "row_softmax",
        "section": section,
        "dtype": "float32",
        "rows": rows,
        "cols": cols,
        "bytes": 2 * rows * cols * 4,
        "bytes_counted": "x read once, y written once (the second pass over a row is not a DRAM byte)",
        "config": sel.config,
        "tuned": sel.tuned,
        "bucket": sel.bucket,
    }
    return Contender(f"row_softmax {rows}x{cols}", call, launches, flush, meta, check)


def bucket_section(
    cp: Any, np: Any, kernels: Any, timer: Timer, arch: str, sms: int, rounds: int, launches: int, errors: dict[str, str]
) -> tuple[dict[str, dict[str, Any]], dict[str, list[float]], dict[str, dict[str, Any]]]:
    """saxpy (float32, float16) and row_softmax at their declared buckets, the L2 flushed before
    each launch; in the same rounds, the streaming shapes at each bucket's byte count and the
    launch floor (`at_size_contenders`)."""
    stream, rng = timer.stream, cp.random.RandomState(2025)
    contenders = []
    for dtype in ("float32", "float16"):
        for n in kernels.saxpy.buckets["n"]:
            x = rng.random_sample(n, dtype=cp.float32).astype(dtype)
            y = rng.random_sample(n, dtype=cp.float32).astype(dtype)
            c = saxpy_contender(cp, kernels, stream, x, y, SEC_BUCKET, launches, True, rng)
            c.name = f"bucket {c.name}"
            contenders.append(c)
    for rows in kernels.row_softmax.buckets["rows"]:
        for cols in kernels.row_softmax.buckets["cols"]:
            x = rng.standard_normal((rows, cols), dtype=cp.float32)
            c = softmax_contender(cp, kernels, stream, x, cp.empty_like(x), SEC_BUCKET, launches, True)
            c.name = f"bucket {c.name}"
            contenders.append(c)
    contenders += at_size_contenders(cp, np, arch, sms, sorted({c.meta["bytes"] for c in contenders}), launches)
    print(
        f"[roofline] bucket section: {len(contenders)} contenders, {rounds} rounds of {launches} launches, each after an L2 flush",
        flush=True,
    )
    samples, checks = run_section(SEC_BUCKET, timer, contenders, rounds, errors)
    return {c.name: c.meta for c in contenders}, samples, checks


def at_size_contenders(cp: Any, np: Any, arch: str, sms: int, sizes: list[int], launches: int) -> list[Contender]:
    """Per byte count (read + write), every streaming shape copying half of it to the other
    half's array, each after an L2 flush; and the launch floor: an empty kernel, one warp."""
    funcs, _ = load_stream_kernels(cp, arch)  # the 2 GiB section says which did not compile
    out = []
    for nbytes in sizes:
        n = nbytes // 8  # floats per array: the copy reads n * 4 bytes and writes as many
        src, dst = cp.arange(n, dtype=cp.float32), cp.zeros(n, cp.float32)

        def copy_check(call: Callable[[], Any], src: Any = src, dst: Any = dst) -> Callable[[], dict[str, Any]]:
            def check() -> dict[str, Any]:
                dst.fill(-1.0)
                call()
                return {"ok": bool(cp.array_equal(dst, src))}

            return check

        meta = {"bytes": 2 * n * 4, "section": SEC_BUCKET}
        for c in streaming_contenders(np, funcs, src, dst, sms, launches, meta, copy_check):
            c.name = f"at size {nbytes} B {c.name}"
            c.flush = True
            c.meta["kind"] = "streaming_at_size"
            out.append(c)
    empty = cp.RawModule(code=EMPTY_KERNEL).get_function("roofline_empty")
    floor = Contender(FLOOR_NAME, lambda: empty((1,), (32,), ()), launches, True, {"kind": "launch_floor", "section": SEC_BUCKET})
    return [*out, floor]


def gemm_sizes(kernels: Any) -> list[tuple[int, int, int]]:
    b = kernels.sgemm.buckets
    sizes = list(SGEMM_HEADLINE)
    sizes += [(m, n, k) for m in b["m"] for n in b["n"] for k in b["k"] if (m, n, k) not in sizes]
    return sizes


def sgemm_section(
    cp: Any, kernels: Any, timer: Timer, rounds: int, launches: int, errors: dict[str, str]
) -> tuple[dict[str, dict[str, Any]], dict[str, list[float]], dict[str, dict[str, Any]]]:
    """Ours and cuBLAS (CuPy matmul, FP32) at each size, interleaved, the L2 flushed before each launch."""
    stream, rng = timer.stream, cp.random.RandomState(2026)
    contenders = []
    for m, n, k in gemm_sizes(kernels):
        a = rng.uniform(-1.0, 1.0, (m, k)).astype(cp.float32)
        b = rng.uniform(-1.0, 1.0, (k, n)).astype(cp.float32)
        c_ours, c_blas = cp.empty((m, n), cp.float32), cp.empty((m, n), cp.float32)
        sel = kernels.sgemm.select(m=m, n=n, k=k)
        tag = f"{m}x{n}x{k}"

        def ours(a: Any = a, b: Any = b, c: Any = c_ours) -> None:
            kernels.sgemm(a, b, c, stream=stream)

        def cublas(a: Any = a, b: Any = b, c: Any = c_blas) -> None:
            cp.matmul(a, b, out=c)

        def check(
            a: Any = a, b: Any = b, c: Any = c_ours, ref: Any = c_blas, ours: Callable = ours, cublas: Callable = cublas
        ) -> dict[str, Any]:
            c.fill(float("nan"))
            ours()
            cublas()
            scale = float(cp.abs(ref).max())
            rel = float(cp.abs(c - ref).max()) / scale  # NaN anywhere: NaN, not ok
            rows = a.shape[0]
            idx = cp.concatenate([cp.arange(min(32, rows)), cp.arange(max(0, rows - 32), rows)])
            exact = a[idx].astype(cp.float64) @ b.astype(cp.float64)
            top = float(cp.abs(exact).max())
            vs64 = {
                "ours": float(cp.abs(c[idx] - exact).max()) / top,
                "cublas": float(cp.abs(ref[idx] - exact).max()) / top,
            }
            return {"ok": rel <= GEMM_TOL, "rel_err_vs_cublas": rel, "tol": GEMM_TOL, "rel_err_vs_float64_sample_rows": vs64}

        meta = {
            "m": m,
            "n": n,
            "k": k,
            "headline": (m, n, k) in SGEMM_HEADLINE,
            "config": sel.config,
            "tuned": sel.tuned,
            "bucket": sel.bucket,
        }
        contenders.append(Contender(f"sgemm {tag}", ours, launches, True, {**meta, "kind": "sgemm", "peer": f"cublas {tag}"}, check))
        contenders.append(Contender(f"cublas {tag}", cublas, launches, True, {**meta, "kind": "cublas"}))
    print(f"[roofline] sgemm section: {len(contenders) // 2} sizes, ours and cuBLAS, {rounds} rounds of {launches} launches", flush=True)
    samples, checks = run_section("sgemm", timer, contenders, rounds, errors)
    return {c.name: c.meta for c in contenders}, samples, checks


def main() -> None:
    ap = options(__doc__)
    ap.add_argument(
        "--lock", type=Path, default=EXAMPLE / "autotune.lock.json", help="the lock file whose speedups over default are reported"
    )
    opts = ap.parse_args()
    rounds = QUICK_ROUNDS if opts.quick else ROUNDS
    big_launches = QUICK_BIG_LAUNCHES if opts.quick else BIG_LAUNCHES
    small_launches = QUICK_SMALL_LAUNCHES if opts.quick else SMALL_LAUNCHES
    gemm_launches = QUICK_GEMM_LAUNCHES if opts.quick else GEMM_LAUNCHES
    arch = require_gpu("roofline.py")  # before importing CuPy: one clear line without a GPU
    t0 = time.monotonic()
    import cupy as cp
    import numpy as np
    from cuda.core import Device

    Device(0).set_current()  # the primary context, which CuPy shares
    print(f"[roofline] building example_pkg's kernels for {arch}", flush=True)
    kernels = import_generated(example_project(env={"HATCH_AUTOTUNE_ARCHS": arch}), Path(tempfile.mkdtemp()))
    stream = cp.cuda.get_current_stream()  # every call and event below is on this stream
    sms = sm_count(cp)
    try:
        l2 = int(cp.cuda.Device().attributes["L2CacheSize"])
    except Exception:
        l2 = None
    timer = Timer(cp, stream, max(FLUSH_BYTES, 4 * (l2 or 0)))
    free, total = cp.cuda.runtime.memGetInfo()
    big = BIG_BYTES
    while big > MIN_BIG_BYTES and (BIG_ARRAYS + CHECK_ARRAYS) * big > 0.9 * free:
        big //= 2
    if big < BIG_BYTES:
        print(f"[roofline] only {free / GiB:.1f} GiB free: {big / GiB:g} GiB per array instead of {BIG_BYTES / GiB:g}", flush=True)
    print(
        f"[roofline] {sms} SMs, L2 {l2} B, {free / GiB:.1f} of {total / GiB:.1f} GiB free; setup {time.monotonic() - t0:.1f} s", flush=True
    )

    errors: dict[str, str] = {}
    not_compiled: dict[str, str] = {}
    meta: dict[str, dict[str, Any]] = {}
    samples: dict[str, list[float]] = {}
    checks: dict[str, dict[str, Any]] = {}
    for section in (
        lambda: big_section(cp, np, kernels, timer, arch, big, sms, rounds, big_launches, errors, not_compiled),
        lambda: bucket_section(cp, np, kernels, timer, arch, sms, rounds, small_launches, errors),
        lambda: sgemm_section(cp, kernels, timer, rounds, gemm_launches, errors),
    ):
        m, s, c = section()
        meta.update(m)
        samples.update(s)
        checks.update(c)
        free_memory(cp)  # the section's arrays went with its frame

    ceil = ceilings(meta, samples, {n: bool(checks.get(n, {}).get("ok")) for n in meta})
    rows = memory_rows(meta, samples, checks, ceil)
    sgemm = gemm_rows(meta, samples, checks)
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "method": (
            "interleaved rounds, CUDA events on the calls' stream; ceilings and 2 GiB problems in one section, "
            "bytes counted once (saxpy 3 n itemsize, row_softmax 2 rows cols 4); buckets and GEMMs with the L2 flushed before each launch"
        ),
        "quick": opts.quick,
        "parameters": {
            "rounds": rounds,
            "launches_per_sample": {SEC_BIG: big_launches, SEC_BUCKET: small_launches, "sgemm": gemm_launches},
            "big_bytes": big,
            "flush_bytes": timer.flush_bytes,
            "sms": sms,
            "l2_bytes": l2,
            "free_bytes_at_start": free,
            "stream": int(stream.ptr),
            "tf32": {"CUPY_TF32": os.environ.get("CUPY_TF32"), "NVIDIA_TF32_OVERRIDE": os.environ.get("NVIDIA_TF32_OVERRIDE")},
            "gemm_tol": GEMM_TOL,
            "wall_s": None,
        },
        "ceilings": ceil,
        "rows": rows,
        "sgemm": sgemm,
        "goals": goals(rows, sgemm, ceil),
        "errors": errors,
        "stream_kernels_not_compiled": not_compiled,
        "lock": str(opts.lock) if opts.lock.exists() else None,
        "speedup_over_default": lock_speedups(opts.lock),
        "samples_ms": samples,
        "machine": machine(),
    }
    payload["parameters"]["wall_s"] = round(time.monotonic() - t0, 1)
    out = write_result("roofline.json", payload, opts.out)
    print(table(payload))
    print(f"wrote {out} ({payload['parameters']['wall_s']} s)")
    wrong = wrong_results(payload)
    if wrong:
        raise SystemExit(f"roofline.py: wrong results or errors from {', '.join(wrong)}: their times do not count")


if __name__ == "__main__":
    main()
