"""Tuning time and winner quality against Kernel Tuner's brute force, both verifying (GPU only).

A fair race, per example_pkg kernel (one type instance: float32 where there is a choice) and
each chosen bucket, on one GPU in one run:
- the same work: the same rendered sources (Kernel Tuner's kernel source is a function returning
  our rendered source of each config, no #defines added), the same configs (our axes plus a
  restriction that admits exactly our configs; launch geometry from the kernel's own
  grid/block/shared expressions), the same buckets and inputs (bucket_inputs, the tuner's seed);
- both verify every config against the same expected outputs: those of the kernel's default
  config (what our tuner verifies against), computed once per bucket before anything is timed by
  our compiled default variant on the device and spot-checked against NumPy in float64; Kernel
  Tuner gets them as `answer=` with `atol=` our atol for the dtype (its check is
  numpy.allclose with NumPy's fixed rtol=1e-05: not our rtol + atol rule, see "verification");
- compile time apart from measuring time for both: Kernel Tuner's per-config compile_time,
  verification_time, benchmark_time, framework_time and strategy_time; ours from each lock
  entry's provenance["phases"] (wall, compile_wait, measure, setup, reference, overhead), null
  where the tuner does not record them; and ours run again on its warm compile cache ("ours
  without compiling"), against Kernel Tuner's total minus its compile_time;
- each tool's documented default number of samples, named in the result ("samples");
- every figure the median of `--reps` (3) interleaved repetitions: per kernel, repetition r is
  ours cold (a fresh compile cache), Kernel Tuner (a fresh process with a fresh CUPY_CACHE_DIR:
  CuPy memoizes compiled modules per process, so a new directory alone would not make a later
  repetition cold), ours warm (repetition r's cache); each repetition's raw numbers are kept.

Ours: `tune(mode="retune")` on a copy of the project cut down to the type instance and the chosen
buckets' grid, all of a kernel's buckets in one call, timed end to end. Kernel Tuner:
`tune_kernel(strategy="brute_force", lang="cupy")`, one call per bucket, in one process per
repetition (`--kt-lang nvcuda` for its cuda-python backend), each call timed.

Then every distinct winner of any repetition is re-timed by one timer, ours
(hatch_autotune.tuning.bench.GpuTimer: CUDA events, L2 flushed before each launch), on the same
inputs, interleaved in rounds, from binaries compiled by our NVRTC.

Goals (issue #34): tuning wall time <= 0.5x Kernel Tuner's on every kernel, both verifying;
verification <= 10% of a bucket's measuring time on the largest buckets (ours: the worker's
run + verify over run + verify + time, from the lock's phases when it splits `measure`, else from
the tuner's log line; the lock's `measure` alone does not split it); winners <= 1.00x within noise;
fixed cost (ours: phases `overhead`) <= 0.2 s per bucket.

Buckets: by default the largest bucket of each kernel (by the product of its key sizes);
`--quick`: the largest whose arrays are each at most 64 MiB (saxpy n=16777216, row_softmax
rows=16384 cols=1024, sgemm m=n=k=4096); `--buckets N|all`, `--where DIM=V[,V]` (e.g. k=4096) to
split a sweep of every bucket over several device calls (all of sgemm's 18 buckets x 3 reps do
not fit one 10-minute call). Both tools tune the grid the chosen buckets span (each key dim's
chosen values, crossed): it can hold more buckets than were chosen.

    python benchmarks/tune_vs_kernel_tuner.py [--kernel saxpy] [--reps 3] [--buckets N|all]
        [--where k=4096] [--kt-lang cupy|nvcuda] [--out DIR] [--quick]
    (needs kernel_tuner: benchmarks/fetch_wheels.py carries it to a GPU machine without a registry)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from _common import EXAMPLE, ROOT, commit, example_project, machine, options, require_gpu, write_result

KT_ITERATIONS = 7  # Kernel Tuner's default `iterations` (tune_kernel, its CuPy and nvcuda backends)
KT_RTOL = 1e-05  # numpy.allclose's default rtol, which Kernel Tuner's default verify function keeps
KT_TIMES = ("compile_time", "verification_time", "benchmark_time", "framework_time", "strategy_time")  # ms per config
OURS_PHASES = ("wall", "compile_wait", "measure", "setup", "reference", "overhead")  # s per bucket, provenance["phases"]
RETIME_ROUNDS, RETIME_REPS = 6, 5  # per winner: rounds x reps samples, the winners interleaved
QUICK_MAX_ARRAY_BYTES = 64 << 20
NOISE_FLOOR = 0.005  # a winner ratio within 0.5% is a tie whatever the measured spread (the tuner's TIE_FLOOR)
CHECK_ROWS = 8  # rows of row_softmax and sgemm checked against NumPy
CHECK_MAX_ERR = 1e-3  # normwise: a wrong index is off by O(1), float32 rounding by ~1e-6
GOALS = {
    "tuning_time_ratio": 0.5,  # ours cold / theirs, at most, per kernel
    "verify_share": 0.10,  # of a bucket's measuring time, at most, on the largest bucket
    "winner_time_ratio": 1.0,  # ours / theirs, at most, within noise
    "overhead_per_bucket_s": 0.2,  # ours' fixed cost per bucket, at most
}
METHOD = [
    "Same work: the same rendered sources, configs, buckets and inputs (hatch_autotune.tuning.inputs.bucket_inputs "
    "with the tuner's seed), compiled by NVRTC on both sides: ours through cuda.bindings on every core, Kernel Tuner's "
    "through CuPy's RawModule one config at a time (CuPy appends -ftz=true to its options).",
    "Both verify every config. Expected outputs: the kernel's default config run once per bucket on the device (our "
    "compiled default variant on CuPy arrays) before anything is timed, spot-checked against NumPy in float64 "
    "(`expected` per row); our tuner verifies against the default config's outputs too (cross-checked by another "
    "config). Ours: |got - expected| <= atol + rtol * |expected| per dtype (verify.TOLERANCES). Kernel Tuner: "
    "answer= those outputs, atol= our atol for the dtype; its check is numpy.allclose(expected, got, atol=atol), whose "
    "rtol stays NumPy's 1e-05 (tighter than our float32 rtol 1e-4), and a config failing it aborts its whole "
    "tune_kernel call (recorded as that bucket's error).",
    "Compile apart from measuring. Kernel Tuner: its per-config compile_time, verification_time, benchmark_time, "
    "framework_time and strategy_time summed (ms -> s); call_overhead = a call's wall minus those sums (device set-up, "
    "search space, arguments to the device, and the untimed warm-up run of its first config, whose compile is thus "
    "not in compile_time: its compile-free time still holds one compile per kernel). Ours: each lock entry's "
    "provenance['phases'] (s per bucket: wall, compile_wait = the measuring waited for NVRTC, measure = the worker's "
    "run + verify + time of every variant, setup = inputs made and uploaded, reference = the reference run and its "
    "cross-check, overhead = wall - compile_wait - measure), null where the tuner does not record them; ours again on "
    "the warm compile cache of the same repetition measures 'ours without compiling'; Kernel Tuner's compile-free "
    "time is its wall minus its compile_time.",
    "Samples: each tool's own default, named under 'samples' (ours: the project's [tuning] settings; Kernel Tuner: "
    "iterations=7); the samples each took are in the rows.",
    "Repetitions: per kernel, `reps` interleaved repetitions of (ours cold: a fresh compile-cache directory; Kernel "
    "Tuner: a fresh process with a fresh CUPY_CACHE_DIR, as CuPy memoizes compiled modules per process; ours warm: "
    "the same repetition's cache). Every figure is the median over the repetitions (ratios: of the medians); each "
    "repetition's raw numbers are kept under 'reps'.",
    "Timed spans. Ours: the whole tune() call (planning, starting its worker process and CUDA context, making and "
    "uploading the inputs, compiling, verifying, timing, writing the lock). Kernel Tuner: each tune_kernel call, "
    "given the inputs made; importing CuPy and Kernel Tuner and creating its CUDA context come before and are "
    "recorded apart (theirs_startup_s), as is reading the inputs.",
    "Per bucket and per kernel: ours tunes all of a kernel's buckets in one call, compiling each config once; Kernel "
    "Tuner runs one tune_kernel per bucket in one process, where CuPy's memo also compiles each config once (the "
    "first bucket pays for it). Per bucket, ours is the phases' wall and theirs the call's wall: compare the "
    "compile-free figures bucket by bucket, the totals per kernel.",
    "Winners: every distinct winner of any repetition re-timed by one timer (hatch_autotune GpuTimer: CUDA events, L2 "
    "flushed before each launch) on the same inputs, in interleaved rounds, from our binaries. winner_time_ratio: "
    "ours' (cold) winner over Kernel Tuner's, per repetition, then the median; within noise when <= 1 + max(half the "
    "interquartile range over the median of either winner, 0.5%).",
    "Verification share of measuring: Kernel Tuner verification_time / (verification_time + benchmark_time); ours "
    "(run + verify) / (run + verify + time) of the worker's phases (its run phase is the verification run), from the "
    "lock's phases when they split `measure`, else from the tuner's log line (0.1 s resolution), else null.",
]


def _version(dist: str) -> str | None:
    from importlib.metadata import version

    try:
        return version(dist)
    except Exception:
        return None


# --------------------------------------------------------------------------------------------
# The work: which buckets, the same sources, configs, arguments and geometry for both tools


def cut_down(project: Any, name: str, types: dict[str, str], points: Sequence[tuple[int, ...]]) -> Any:
    """The project with only kernel `name`, one type instance and the buckets spanning `points`."""
    spec = project.kernels[name]
    keys = tuple(dataclasses.replace(k, buckets=tuple(sorted({p[i] for p in points}))) for i, k in enumerate(spec.key))
    spec = dataclasses.replace(spec, key=keys, types={tp: (types[tp],) for tp in spec.types})
    return dataclasses.replace(project, kernels={name: spec})


def label(key: Mapping[str, int]) -> str:
    """'m=4096,n=4096,k=256': a bucket, as the rows name it."""
    return ",".join(f"{k}={v}" for k, v in key.items())


def config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True)


def largest_array_bytes(spec: Any, types: Mapping[str, str], key: Mapping[str, int]) -> int:
    """The bytes of a bucket's largest array argument."""
    import numpy as np

    from hatch_autotune.tuning.inputs import resolved_dtype, shapes

    sizes = shapes(spec, key, types)
    return max((math.prod(sizes[a.name]) * np.dtype(resolved_dtype(a.dtype, types)).itemsize for a in spec.args if a.is_array), default=0)


def parse_where(texts: Iterable[str] | None) -> dict[str, set[int]]:
    """['k=256,4096', 'm=1024'] -> {'k': {256, 4096}, 'm': {1024}}; ValueError on a malformed one."""
    where: dict[str, set[int]] = {}
    for text in texts or ():
        dim, sep, values = text.partition("=")
        if not sep or not dim.strip() or not values.strip():
            raise ValueError(f"--where {text!r}: expected DIM=VALUE[,VALUE...], e.g. k=4096")
        try:
            where.setdefault(dim.strip(), set()).update(int(v) for v in values.split(","))
        except ValueError:
            raise ValueError(f"--where {text!r}: bucket values are integers") from None
    return where


def select_points(
    spec: Any, types: Mapping[str, str], n: int | None, where: Mapping[str, set[int]], max_array_bytes: int | None = None
) -> list[tuple[int, ...]]:
    """The chosen buckets of `spec`: those matching `where` (key dim -> allowed bucket values) and
    whose arrays are each at most `max_array_bytes`, then the largest `n` of them (by the product
    of the key sizes; None: all), smallest first."""
    from hatch_autotune.declare.space import bucket_points

    names = [k.name for k in spec.key]
    unknown = sorted(set(where) - set(names))
    if unknown:
        raise ValueError(f"kernel {spec.name!r} has no key dim {', '.join(unknown)} (its dims: {', '.join(names)})")
    points = [p for p in bucket_points([k.buckets for k in spec.key]) if all(p[i] in where[d] for i, d in enumerate(names) if d in where)]
    if max_array_bytes is not None:
        points = [p for p in points if largest_array_bytes(spec, types, dict(zip(names, p))) <= max_array_bytes]
    points.sort(key=lambda p: (math.prod(p), p))
    return points[-n:] if n else points


def launch_args(spec: Any, types: Mapping[str, str], key: Mapping[str, int], inputs: Mapping[str, Any]) -> list[Any]:
    """Host arguments in C order: arrays as NumPy arrays, scalars as NumPy scalars of their C type."""
    import numpy as np

    args = []
    for a in spec.args:
        if a.is_array:
            args.append(inputs[a.name])
        else:
            dtype = types.get(a.dtype, a.dtype)
            value = a.value(key) if a.value is not None else inputs[a.name]
            args.append(np.dtype(dtype).type(value))
    return args


def outputs_of(spec: Any) -> list[Any]:
    """The array arguments a kernel writes (what both tools verify)."""
    return [a for a in spec.args if a.is_array and a.intent in ("out", "inout")]


def kt_answer(spec: Any, expected: Mapping[str, Any]) -> list[Any]:
    """Kernel Tuner's `answer`: one entry per argument, the expected array of each output, else None."""
    names = {a.name for a in outputs_of(spec)}
    return [expected[a.name] if a.name in names else None for a in spec.args]


def kt_atol(spec: Any, types: Mapping[str, str]) -> float:
    """Our atol for the outputs' dtypes (the tightest when they differ), for Kernel Tuner's `atol`."""
    from hatch_autotune.tuning.verify import tolerance

    return min(tolerance(types.get(a.dtype, a.dtype), spec.tolerance)[1] for a in outputs_of(spec))


def geometry(
    spec: Any, types: Mapping[str, str], key: Mapping[str, int], config: Mapping[str, Any]
) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    env = {**key, **config, **spec.type_env(types)}
    return tuple(int(e(env)) for e in spec.grid), tuple(int(e(env)) for e in spec.block), int(spec.shared(env))


# --------------------------------------------------------------------------------------------
# Numbers: medians, ratios, what the tools report


def figure(values: Sequence[float | None]) -> dict[str, Any]:
    """{'reps': the raw values, 'median': of those that are known (None when none is)}."""
    known = [v for v in values if v is not None]
    return {"reps": list(values), "median": statistics.median(known) if known else None}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def total(values: Iterable[float | None]) -> float | None:
    """The sum, or None when any part is unknown."""
    values = list(values)
    return None if not values or any(v is None for v in values) else float(sum(values))  # type: ignore[arg-type]


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


TUNED_LINE = re.compile(r"^tuned (?P<eid>\S+): (?P<rest>.*)$")
WORKER_PART = re.compile(r"; worker (?P<phases>[^;]*)")


def worker_phases_from_log(lines: Iterable[str]) -> dict[str, dict[str, float]]:
    """{entry id: {phase: seconds}} from the tuner's 'tuned <eid>: ...; worker run 1.2 s, verify
    0.3 s, time 0.5 s' lines (0.1 s resolution); entries without one are left out."""
    out: dict[str, dict[str, float]] = {}
    for line in lines:
        m = TUNED_LINE.match(line.strip())
        w = WORKER_PART.search(m["rest"]) if m else None
        if m and w:
            phases = {k: float(v) for k, v in re.findall(r"(\w+) ([0-9]+(?:\.[0-9]*)?) s\b", w["phases"])}
            if phases:
                out[m["eid"]] = phases
    return out


def verify_share_ours(worker: Mapping[str, float] | None) -> float | None:
    """(run + verify) / (run + verify + time) of the worker's phases: its run is the verification run."""
    if not worker or any(k not in worker for k in ("run", "verify", "time")):
        return None
    return ratio(worker["run"] + worker["verify"], worker["run"] + worker["verify"] + worker["time"])


def ours_bucket(entry: Any, worker_from_log: Mapping[str, float] | None) -> dict[str, Any]:
    """One bucket of one of our runs, from its lock entry (and the tuner's log line)."""
    prov = entry.provenance if isinstance(entry.provenance, Mapping) else {}
    raw = prov.get("phases")
    phases = {k: _number(v) for k, v in raw.items()} if isinstance(raw, Mapping) else None
    split = {k: phases[k] for k in ("run", "verify", "time") if phases and phases.get(k) is not None}
    worker = split if len(split) == 3 else (dict(worker_from_log) if worker_from_log else None)
    ms = entry.measurements
    return {
        "phases": phases,
        "worker": worker,
        "worker_from": None if worker is None else ("lock" if worker is split else "log"),
        "winner": dict(entry.config),
        "winner_ms": entry.winner_ms,
        "samples": sum(m.samples or 0 for m in ms),
        "configs_timed": sum(m.status in ("ok", "eliminated") for m in ms),
        "configs_rejected": sum(m.status == "rejected" for m in ms),
        "configs_failed_or_pruned": sum(m.status in ("failed", "pruned") for m in ms),
        "reference": prov.get("reference") if isinstance(prov.get("reference"), str) else None,
    }


def _plain(v: Any) -> Any:
    """A NumPy scalar as its Python value (a config's values must match ours and write as JSON numbers)."""
    return v.item() if hasattr(v, "item") and not isinstance(v, (str, bytes)) else v


def summarize_kt(results: Sequence[Mapping[str, Any]], wall: float, axes: Sequence[str], iterations: int) -> dict[str, Any]:
    """One tune_kernel call: its wall (s), its per-config times summed (s), its winner."""
    sums = {k.removesuffix("_time"): sum(_number(r.get(k)) or 0.0 for r in results) / 1000 for k in KT_TIMES}
    timed = [r for r in results if "__error__" not in r and _number(r.get("time")) is not None]
    best = min(timed, key=lambda r: r["time"]) if timed else None
    samples = sum(len(r["times"]) if isinstance(r.get("times"), list) else iterations for r in timed)
    return {
        "wall": wall,
        **sums,
        "call_overhead": wall - sum(sums.values()),
        "winner": {a: _plain(best[a]) for a in axes} if best else None,
        "winner_ms": float(best["time"]) if best else None,
        "configs_run": len(results),
        "configs_timed": len(timed),
        "configs_failed": len(results) - len(timed),
        "samples": samples,
        "error": None if best else f"Kernel Tuner timed none of {len(results)} configs",
    }


def verify_share_theirs(b: Mapping[str, Any] | None) -> float | None:
    if not b or b.get("verification") is None or b.get("benchmark") is None:
        return None
    return ratio(b["verification"], b["verification"] + b["benchmark"])


def numpy_check(kernel: str, inputs: Mapping[str, Any], outputs: Mapping[str, Any], rows: int = CHECK_ROWS) -> dict[str, Any] | None:
    """The expected outputs (our default config's) against NumPy in float64, for example_pkg's
    three kernels (None for another): saxpy's whole y, `rows` rows of row_softmax and sgemm (the
    first, the last, the rest drawn). normwise_err: the largest |got - numpy| over the largest
    |numpy|; ok when <= CHECK_MAX_ERR (a wrong index is off by O(1))."""
    import numpy as np

    def picked(n: int) -> Any:
        drawn = np.random.default_rng(0).integers(0, n, size=max(0, rows - 2)) if n else []
        return np.array(sorted({0, n - 1, *map(int, drawn)}) if n else [], dtype=np.int64)

    if kernel == "saxpy":
        got = outputs["y"]
        want = float(inputs["a"]) * inputs["x"].astype(np.float64) + inputs["y"].astype(np.float64)
        what = "every element of y"
    elif kernel == "row_softmax":
        idx = picked(inputs["x"].shape[0])
        x = inputs["x"][idx].astype(np.float64)
        e = np.exp(x - x.max(axis=1, keepdims=True)) if x.size else x
        want, got = (e / e.sum(axis=1, keepdims=True) if x.size else x), outputs["y"][idx]
        what = f"rows {idx.tolist()} of y"
    elif kernel == "sgemm":
        idx = picked(inputs["A"].shape[0])
        want, got = inputs["A"][idx].astype(np.float64) @ inputs["B"].astype(np.float64), outputs["C"][idx]
        what = f"rows {idx.tolist()} of C"
    else:
        return None
    diff = np.abs(np.asarray(got, dtype=np.float64) - want)
    err = float(np.max(diff)) if diff.size else 0.0
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    rel = err / scale if scale else err
    ok = math.isfinite(rel) and rel <= CHECK_MAX_ERR
    return {
        "against": f"NumPy in float64, {what}",
        "max_abs_err": err if math.isfinite(err) else None,
        "normwise_err": rel if math.isfinite(rel) else None,
        "ok": ok,
    }


# --------------------------------------------------------------------------------------------
# The result: rows per bucket, kernels, fixed costs


def _get(d: Mapping[str, Any] | None, *path: str) -> Any:
    for p in path:
        if not isinstance(d, Mapping):
            return None
        d = d.get(p)
    return d


def _diff(a: Any, b: Any) -> float | None:
    return a - b if a is not None and b is not None else None


def bucket_row(
    kernel: str,
    types: str,
    key: Mapping[str, int],
    configs: int,
    ours_cold: Sequence[Mapping[str, Any] | None],
    theirs: Sequence[Mapping[str, Any] | None],
    ours_warm: Sequence[Mapping[str, Any] | None],
    retimed: Mapping[str, Mapping[str, float]] | None,
    expected: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """One bucket: every repetition's numbers (ours_cold, theirs, ours_warm: one entry each, None
    when that run failed), their medians and ratios, and the re-timed winners."""
    walls = [_get(o, "phases", "wall") for o in ours_cold]
    no_compile = [_diff(_get(o, "phases", "wall"), _get(o, "phases", "compile_wait")) for o in ours_cold]
    warm = [_get(o, "phases", "wall") for o in ours_warm]
    t_wall = [_get(t, "wall") for t in theirs]
    t_free = [_diff(_get(t, "wall"), _get(t, "compile")) for t in theirs]
    t_fixed = [total((_get(t, "framework"), _get(t, "strategy"))) if t else None for t in theirs]
    t_measure = [total((_get(t, "verification"), _get(t, "benchmark"))) if t else None for t in theirs]
    med = {
        "ours_cold_s": figure(walls)["median"],
        "ours_cold_no_compile_s": figure(no_compile)["median"],
        "ours_warm_s": figure(warm)["median"],
        "theirs_s": figure(t_wall)["median"],
        "theirs_no_compile_s": figure(t_free)["median"],
        "ours_compile_wait_s": figure([_get(o, "phases", "compile_wait") for o in ours_cold])["median"],
        "theirs_compile_s": figure([_get(t, "compile") for t in theirs])["median"],
        "ours_measure_s": figure([_get(o, "phases", "measure") for o in ours_cold])["median"],
        "theirs_measure_s": figure(t_measure)["median"],
        "ours_setup_s": figure([_get(o, "phases", "setup") for o in ours_cold])["median"],
        "ours_reference_s": figure([_get(o, "phases", "reference") for o in ours_cold])["median"],
        "ours_overhead_s": figure([_get(o, "phases", "overhead") for o in ours_cold])["median"],
        "theirs_framework_strategy_s": figure(t_fixed)["median"],
        "theirs_call_overhead_s": figure([_get(t, "call_overhead") for t in theirs])["median"],
        "ours_verify_share": figure([verify_share_ours(_get(o, "worker")) for o in ours_cold])["median"],
        "theirs_verify_share": figure([verify_share_theirs(t) for t in theirs])["median"],
        "ours_samples": figure([_get(o, "samples") for o in ours_cold])["median"],
        "theirs_samples": figure([_get(t, "samples") for t in theirs])["median"],
    }
    med["tuning_time_ratio"] = ratio(med["ours_cold_s"], med["theirs_s"])
    med["tuning_time_ratio_no_compile"] = ratio(med["ours_warm_s"], med["theirs_no_compile_s"])
    return {
        "kernel": kernel,
        "types": types,
        "bucket": dict(key),
        "configs": configs,
        "expected": expected,
        "reps": {"ours_cold": list(ours_cold), "theirs": list(theirs), "ours_warm": list(ours_warm)},
        "median": med,
        "winners": winner_summary(ours_cold, theirs, ours_warm, retimed),
    }


def winner_summary(
    ours_cold: Sequence[Mapping[str, Any] | None],
    theirs: Sequence[Mapping[str, Any] | None],
    ours_warm: Sequence[Mapping[str, Any] | None],
    retimed: Mapping[str, Mapping[str, float]] | None,
) -> dict[str, Any]:
    """Per repetition, ours' (cold) winner re-timed over Kernel Tuner's; the median, and whether it
    is within the noise of the two winners' re-timing."""
    retimed = retimed or {}

    def timed(run: Mapping[str, Any] | None) -> Mapping[str, float] | None:
        w = _get(run, "winner")
        return retimed.get(config_key(w)) if isinstance(w, Mapping) else None

    per_rep, noise = [], []
    for o, t in zip(ours_cold, theirs):
        a, b = timed(o), timed(t)
        per_rep.append(ratio(_get(a, "ms"), _get(b, "ms")))
        for x in (a, b):
            if x and x.get("ms"):
                noise.append(x.get("spread_ms", 0.0) / x["ms"])
    r = figure(per_rep)["median"]
    band = max([NOISE_FLOOR, *noise])
    return {
        "retimed_ms": {k: dict(v) for k, v in retimed.items()},
        "ours_winners": [_get(o, "winner") for o in ours_cold],
        "ours_warm_winners": [_get(o, "winner") for o in ours_warm],
        "theirs_winners": [_get(t, "winner") for t in theirs],
        "same_winner": [_get(o, "winner") == _get(t, "winner") if o and t else None for o, t in zip(ours_cold, theirs)],
        "ours_own_ms": [_get(o, "winner_ms") for o in ours_cold],
        "theirs_own_ms": [_get(t, "winner_ms") for t in theirs],
        "winner_time_ratio_reps": per_rep,
        "winner_time_ratio": r,
        "noise": band,
        "within_noise": None if r is None else r <= GOALS["winner_time_ratio"] + band,
    }


def kernel_summary(
    kernel: str,
    types: str,
    configs: int,
    rows: Sequence[Mapping[str, Any]],
    ours_cold_calls: Sequence[float | None],
    ours_warm_calls: Sequence[float | None],
    theirs_startup: Sequence[float | None],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the kernel's totals, medians and ratios; its fixed costs), from its rows and the wall of
    each of our tune() calls."""
    reps = len(ours_cold_calls)

    def per_rep(side: str, fn: Any) -> list[float | None]:
        return [total(fn(row["reps"][side][r]) for row in rows) for r in range(reps)]

    theirs = per_rep("theirs", lambda t: _get(t, "wall"))
    t_compile = per_rep("theirs", lambda t: _get(t, "compile"))
    t_free = [_diff(a, b) for a, b in zip(theirs, t_compile)]
    ours_buckets = per_rep("ours_cold", lambda o: _get(o, "phases", "wall"))
    cold, warm, free = figure(ours_cold_calls), figure(ours_warm_calls), figure(t_free)
    their = figure(theirs)
    largest = max(rows, key=lambda r: (math.prod(r["bucket"].values()), tuple(r["bucket"].values()))) if rows else None
    winners = [r["winners"]["winner_time_ratio"] for r in rows]
    within = [r["winners"]["within_noise"] for r in rows]
    overhead = per_rep("ours_cold", lambda o: _get(o, "phases", "overhead"))
    per_bucket_overhead = {label(r["bucket"]): r["median"]["ours_overhead_s"] for r in rows}
    known_overheads = [v for v in per_bucket_overhead.values() if v is not None]
    summary = {
        "kernel": kernel,
        "types": types,
        "configs": configs,
        "buckets": len(rows),
        "bucket_list": [label(r["bucket"]) for r in rows],
        "ours_cold_s": cold,
        "ours_warm_s": warm,
        "theirs_s": their,
        "theirs_compile_s": figure(t_compile),
        "theirs_no_compile_s": free,
        "ours_cold_minus_warm_s": _diff(cold["median"], warm["median"]),
        "ours_compile_wait_s": figure(per_rep("ours_cold", lambda o: _get(o, "phases", "compile_wait"))),
        "ours_measure_s": figure(per_rep("ours_cold", lambda o: _get(o, "phases", "measure"))),
        "theirs_measure_s": figure(per_rep("theirs", lambda t: total((_get(t, "verification"), _get(t, "benchmark"))) if t else None)),
        "theirs_startup_s": figure(theirs_startup),
        "tuning_time_ratio": ratio(cold["median"], their["median"]),
        "tuning_time_ratio_no_compile": ratio(warm["median"], free["median"]),
        "tuning_time_ratio_reps": [ratio(a, b) for a, b in zip(ours_cold_calls, theirs)],
        "tuning_time_ratio_no_compile_reps": [ratio(a, b) for a, b in zip(ours_warm_calls, t_free)],
        "winner_time_ratio_max": max((w for w in winners if w is not None), default=None),
        "winners_within_noise": None if any(w is None for w in within) or not within else all(within),
        "largest_bucket": label(largest["bucket"]) if largest else None,
        "ours_verify_share_largest": largest["median"]["ours_verify_share"] if largest else None,
        "theirs_verify_share_largest": largest["median"]["theirs_verify_share"] if largest else None,
    }
    ours_v = summary["ours_verify_share_largest"]
    summary["goals"] = {
        f"tuning_time_ratio <= {GOALS['tuning_time_ratio']}": None
        if summary["tuning_time_ratio"] is None
        else summary["tuning_time_ratio"] <= GOALS["tuning_time_ratio"],
        f"ours verify share on the largest bucket <= {GOALS['verify_share']}": None if ours_v is None else ours_v <= GOALS["verify_share"],
        "winners <= 1.00x within noise": summary["winners_within_noise"],
        f"ours overhead <= {GOALS['overhead_per_bucket_s']} s per bucket": None
        if not known_overheads or len(known_overheads) < len(rows)
        else max(known_overheads) <= GOALS["overhead_per_bucket_s"],
    }
    fixed = {
        "kernel": kernel,
        "ours_overhead_s": {
            "total": figure(overhead),
            "per_bucket": per_bucket_overhead,
            "max_per_bucket": max(known_overheads, default=None),
            "goal_per_bucket_s": GOALS["overhead_per_bucket_s"],
        },
        "ours_setup_s": figure(per_rep("ours_cold", lambda o: _get(o, "phases", "setup"))),
        "ours_reference_s": figure(per_rep("ours_cold", lambda o: _get(o, "phases", "reference"))),
        # what a tune() call costs beyond its buckets' walls: planning, the worker's start, the lock
        "ours_call_fixed_s": figure([_diff(c, b) for c, b in zip(ours_cold_calls, ours_buckets)]),
        "theirs_framework_strategy_s": {
            "total": figure(per_rep("theirs", lambda t: total((_get(t, "framework"), _get(t, "strategy"))) if t else None)),
            "per_bucket": {label(r["bucket"]): r["median"]["theirs_framework_strategy_s"] for r in rows},
        },
        "theirs_call_overhead_s": {
            "total": figure(per_rep("theirs", lambda t: _get(t, "call_overhead"))),
            "per_bucket": {label(r["bucket"]): r["median"]["theirs_call_overhead_s"] for r in rows},
        },
    }
    return summary, fixed


# --------------------------------------------------------------------------------------------
# Kernel Tuner, in a process of its own per repetition (`--kt-child JOB.json`)


def kernel_tuner_brute_force(
    spec: Any,
    variants: Sequence[Any],
    types: Mapping[str, str],
    key: Mapping[str, int],
    args: list[Any],
    answer: list[Any],
    atol: float,
    lang: str,
    iterations: int,
) -> tuple[float, list[dict[str, Any]]]:
    """(wall seconds, results) of Kernel Tuner's brute force over exactly our configs, verifying each."""
    from kernel_tuner import tune_kernel

    axes = list(spec.space)
    by_config = {tuple(v.config_dict[a] for a in axes): v for v in variants}
    space: dict[str, list[Any]] = {a: list(values) for a, values in spec.space.items()}
    # Launch geometry from our expressions: the grid is Kernel Tuner's problem size with no
    # divisors; each block dim is an axis, or a derived parameter pinned by the restriction.
    block_names, derived = [], {}
    for i, expr in enumerate(spec.block):
        if expr.text.strip() in space:
            block_names.append(expr.text.strip())
        else:
            pname = f"kt_block_{'xyz'[i]}"
            block_names.append(pname)
            derived[pname] = i
            space[pname] = sorted({geometry(spec, types, key, v.config_dict)[1][i] for v in variants})

    def ours(params: dict[str, Any]) -> Any:
        return by_config.get(tuple(params[a] for a in axes))

    def restrict(params: dict[str, Any]) -> bool:  # the same constraints: only our configs
        v = ours(params)
        if v is None:
            return False
        block = geometry(spec, types, key, v.config_dict)[1]
        return all(params[p] == block[i] for p, i in derived.items())

    def source(params: dict[str, Any]) -> str:
        return ours(params).source

    def problem_size(params: dict[str, Any]) -> tuple[int, ...]:
        return geometry(spec, types, key, ours(params).config_dict)[0]

    extra: dict[str, Any] = {}
    if any(geometry(spec, types, key, v.config_dict)[2] for v in variants):
        extra["smem_args"] = {"size": lambda p: geometry(spec, types, key, ours(p).config_dict)[2]}
    t0 = time.perf_counter()
    results, _env = tune_kernel(
        spec.entry,
        source,
        problem_size,
        args,
        space,
        grid_div_x=[],
        grid_div_y=[],
        grid_div_z=[],
        block_size_names=block_names,
        restrictions=restrict,
        answer=answer,
        atol=atol,
        lang=lang,
        strategy="brute_force",
        verbose=False,
        quiet=True,
        iterations=iterations,
        # our sources carry their parameters already (no #defines, which would clash with their
        # constexprs); the options our compile uses besides the arch (C++17 for `if constexpr`)
        defines={},
        compiler_options=["--std=c++17", *spec.nvrtc_options],
        **extra,
    )
    return time.perf_counter() - t0, results


def kt_child(job_file: Path) -> int:
    """One repetition of Kernel Tuner: every bucket of one kernel, one tune_kernel call each, in
    this fresh process (CUPY_CACHE_DIR set fresh by the parent); writes job['out']."""
    t_start = time.perf_counter()
    job = json.loads(job_file.read_text())
    importlib.import_module("kernel_tuner")
    import cupy as cp
    import numpy as np

    cp.cuda.Device(0).use()
    cp.cuda.runtime.free(cp.cuda.runtime.malloc(1))  # the CUDA context up before anything is timed
    startup = time.perf_counter() - t_start

    from hatch_autotune.compile.render import render_kernel

    project = example_project(Path(job["work"]), env={"HATCH_AUTOTUNE_ARCHS": job["arch"]})
    types = dict(job["types"])
    small = cut_down(project, job["kernel"], types, [tuple(p) for p in job["points"]])
    spec = small.kernels[job["kernel"]]
    variants = render_kernel(spec)[job["tkey"]]
    axes = list(spec.space)
    out: dict[str, Any] = {"startup_s": startup, "buckets": {}}
    for b in job["buckets"]:
        key = {k: int(v) for k, v in b["key"].items()}
        t_read = time.perf_counter()
        inputs: dict[str, Any] = {name: np.load(path) for name, path in b["arrays"].items()}
        inputs.update(b["scalars"])
        expected = {name: np.load(path) for name, path in b["expected"].items()}
        args = launch_args(spec, types, key, inputs)
        read_s = time.perf_counter() - t_read
        try:
            wall, results = kernel_tuner_brute_force(
                spec, variants, types, key, args, kt_answer(spec, expected), float(b["atol"]), job["lang"], int(job["iterations"])
            )
            got = summarize_kt(results, wall, axes, int(job["iterations"]))
        except Exception as exc:  # a failed verification aborts the whole call: keep going with the next bucket
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            got = {"error": f"{type(exc).__name__}: {first}"[:500]}
        got["read_inputs_s"] = read_s
        out["buckets"][label(key)] = got
        print(f"  Kernel Tuner {job['kernel']} {label(key)}: " + json.dumps(got, sort_keys=True, default=str)[:400], flush=True)
        del inputs, expected, args
    Path(job["out"]).write_text(json.dumps(out, indent=1, sort_keys=True, default=str) + "\n")
    return 0


def run_theirs(job: dict[str, Any], job_file: Path, cupy_cache: Path) -> dict[str, Any]:
    """One repetition of Kernel Tuner in a fresh process with a fresh CUPY_CACHE_DIR."""
    job_file.write_text(json.dumps(job, indent=1))
    out = Path(job["out"])
    out.unlink(missing_ok=True)
    env = dict(os.environ, CUPY_CACHE_DIR=str(cupy_cache), PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--kt-child", str(job_file)], env=env, cwd=ROOT)
    if proc.returncode != 0 or not out.exists():
        return {"error": f"the Kernel Tuner process exited with {proc.returncode}" + ("" if out.exists() else ", no result"), "buckets": {}}
    got = json.loads(out.read_text())
    got["error"] = None
    return got


# --------------------------------------------------------------------------------------------
# On the GPU, in this process: expected outputs and the winners' re-timing


class Retimer:
    """Our compiled variants on the device: the default config's outputs (the expected ones) and
    winners on one timer (our GpuTimer: events, L2 flush), interleaved rounds."""

    def __init__(self, arch: str, cache: Any):
        from cuda.core import Device

        from hatch_autotune.declare.config import TuningSpec
        from hatch_autotune.tuning.bench import GpuTimer

        self.arch, self.cache = arch, cache
        self.device = Device(0)
        self.device.set_current()
        self.timer = GpuTimer(0, flush_l2=True)
        self.settings = TuningSpec(budget_ms=1e12, warmup=1, min_reps=RETIME_REPS, max_reps=RETIME_REPS)

    def kernel(self, spec: Any, variant: Any) -> Any:
        from cuda.core import ObjectCode

        from hatch_autotune.compile.nvrtc import compile_all

        (result,) = compile_all([variant.compile_job(self.arch, spec.entry, spec.nvrtc_options)], self.cache)
        if not result.ok:
            raise RuntimeError(f"{variant.label} does not compile: {result.log}")
        return ObjectCode.from_cubin(result.binary).get_kernel(spec.entry)

    def _upload(
        self, spec: Any, types: Mapping[str, str], key: Mapping[str, int], inputs: Mapping[str, Any]
    ) -> tuple[list[Any], list[Any]]:
        import cupy as cp
        import numpy as np

        host = launch_args(spec, types, key, inputs)
        dev = [cp.asarray(a) if isinstance(a, np.ndarray) else None for a in host]
        cp.cuda.Device(0).synchronize()
        return dev, [d.data.ptr if d is not None else a for a, d in zip(host, dev)]

    @staticmethod
    def _free() -> None:
        import cupy as cp

        cp.cuda.Device(0).synchronize()
        cp.get_default_memory_pool().free_all_blocks()  # nothing of ours held while the tools run

    def outputs(
        self, spec: Any, types: Mapping[str, str], key: Mapping[str, int], inputs: Mapping[str, Any], variant: Any
    ) -> dict[str, Any]:
        """The outputs of one launch of `variant` on device copies of `inputs` (an inout array
        starts from its input, as in both tools' verification runs)."""
        import cupy as cp
        from cuda.core import LaunchConfig, launch

        dev, c_args = self._upload(spec, types, key, inputs)
        grid, block, shared = geometry(spec, types, key, variant.config_dict)
        launch(self.timer.stream, LaunchConfig(grid=grid, block=block, shmem_size=shared), self.kernel(spec, variant), *c_args)
        self.timer.stream.sync()
        written = {a.name for a in outputs_of(spec)}
        out = {a.name: cp.asnumpy(d) for a, d in zip(spec.args, dev) if d is not None and a.name in written}
        del dev
        self._free()
        return out

    def time(
        self, spec: Any, types: Mapping[str, str], key: Mapping[str, int], inputs: Mapping[str, Any], variants: Sequence[Any]
    ) -> list[dict[str, float]]:
        """{'ms': median, 'spread_ms': half the IQR} of each variant, on the same device copies of `inputs`."""
        from cuda.core import LaunchConfig, launch

        from hatch_autotune.tuning.bench import spread

        dev, c_args = self._upload(spec, types, key, inputs)
        launches = []
        for variant in variants:
            grid, block, shared = geometry(spec, types, key, variant.config_dict)
            k, lc = self.kernel(spec, variant), LaunchConfig(grid=grid, block=block, shmem_size=shared)
            launches.append(lambda stream, k=k, lc=lc: launch(stream, lc, k, *c_args))
        samples: list[list[float]] = [[] for _ in variants]
        for _ in range(RETIME_ROUNDS):
            for i, fn in enumerate(launches):
                samples[i].extend(self.timer.time(fn, self.settings, None).samples)
        self.timer.stream.sync()
        del dev
        self._free()
        return [{"ms": statistics.median(s), "spread_ms": spread(s)} for s in samples]


# --------------------------------------------------------------------------------------------
# Ours


def run_ours(project: Any, name: str, arch: str, cache_dir: Path) -> dict[str, Any]:
    """One tune() of every bucket of `project` (cut down to kernel `name`): its wall and, per
    bucket (label), what its lock entry and log line say."""
    from hatch_autotune.compile.cache import CompileCache
    from hatch_autotune.lock import EntryId
    from hatch_autotune.tuning import tune

    lines: list[str] = []

    def log(message: str) -> None:
        lines.append(message)
        print(message, flush=True)

    t0 = time.perf_counter()
    try:
        summary = tune(project, kernels=[name], mode="retune", log=log, gpu_arch=arch, cache=CompileCache(cache_dir))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"call_s": None, "error": f"{type(exc).__name__}: {first}"[:500], "buckets": {}}
    wall = time.perf_counter() - t0
    workers = worker_phases_from_log(lines)
    buckets = {}
    for eid, entry in summary.tuned:
        buckets[label(EntryId.parse(eid).bucket.as_dict())] = ours_bucket(entry, workers.get(eid))
    return {"call_s": wall, "error": None, "buckets": buckets}


# --------------------------------------------------------------------------------------------


def main() -> None:
    ap = options(__doc__)
    ap.add_argument("--kernel", action="append", help="kernel(s) to compare (default: all)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions per kernel, each figure their median (default 3)")
    ap.add_argument(
        "--buckets",
        default=None,
        help="the largest N buckets per kernel, or 'all' (default 1: the largest; --quick: the largest whose arrays are each <= 64 MiB)",
    )
    ap.add_argument(
        "--where", action="append", metavar="DIM=V[,V]", help="only buckets with these values of a key dim (e.g. k=4096); repeatable"
    )
    ap.add_argument("--kt-lang", default="cupy", choices=["cupy", "nvcuda"], help="Kernel Tuner backend (default cupy)")
    ap.add_argument("--kt-child", type=Path, help=argparse.SUPPRESS)  # one repetition of Kernel Tuner, in its own process
    opts = ap.parse_args()
    if opts.kt_child:
        sys.exit(kt_child(opts.kt_child))
    if opts.reps < 1:
        ap.error("--reps must be at least 1")
    try:
        where = parse_where(opts.where)
    except ValueError as exc:
        ap.error(str(exc))
    if opts.buckets in (None, ""):
        n_buckets: int | None = 1
    elif str(opts.buckets).lower() == "all":
        n_buckets = None
    elif str(opts.buckets).isdigit() and int(opts.buckets) >= 1:
        n_buckets = int(opts.buckets)
    else:
        ap.error(f"--buckets {opts.buckets!r}: expected a number >= 1 or 'all'")
    cap = QUICK_MAX_ARRAY_BYTES if opts.quick and opts.buckets is None else None
    selection = {
        "buckets": "all" if n_buckets is None else n_buckets,
        "where": {k: sorted(v) for k, v in where.items()},
        "max_array_bytes": cap,
        "rule": (
            "per kernel, the buckets matching `where`"
            + (f" whose arrays are each at most {cap >> 20} MiB" if cap else "")
            + ("" if n_buckets is None else f", the largest {n_buckets} by the product of the key sizes")
            + "; both tools tune the grid they span (each key dim's chosen values, crossed)"
        ),
    }

    arch = require_gpu("tune_vs_kernel_tuner.py")  # before importing CuPy: one clear line without a GPU
    scratch = Path(tempfile.mkdtemp(prefix="tune-vs-kt-"))
    os.environ["CUPY_CACHE_DIR"] = str(scratch / "cupy-cache-parent")  # this process's CuPy kernels, apart from Kernel Tuner's
    try:
        importlib.import_module("kernel_tuner")
    except ImportError as exc:
        raise SystemExit(f"tune_vs_kernel_tuner.py: needs kernel_tuner ({exc}); carry it with benchmarks/fetch_wheels.py") from None
    import cupy as cp
    import numpy as np

    from hatch_autotune.compile.cache import CompileCache
    from hatch_autotune.compile.render import render_kernel
    from hatch_autotune.declare.space import bucket_points
    from hatch_autotune.lock import EntryId
    from hatch_autotune.tuning.inputs import bucket_inputs
    from hatch_autotune.tuning.verify import TOLERANCES

    cp.zeros(1).sum()  # CuPy's context and kernels up before anything is timed
    work = scratch / "example"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("dist", "kernels", "__pycache__", "autotune.lock.json"))
    project = example_project(work, env={"HATCH_AUTOTUNE_ARCHS": arch})
    for k in opts.kernel or ():
        if k not in project.kernels:
            raise SystemExit(f"tune_vs_kernel_tuner.py: no kernel {k!r} in example_pkg (its kernels: {', '.join(project.kernels)})")
    retimer = Retimer(arch, CompileCache(scratch / "retime-cache"))
    rows: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    fixed_costs: list[dict[str, Any]] = []
    errors: list[str] = []
    facts = {"machine": machine(), "commit": commit()}

    def save(complete: bool) -> Path:
        return write_result(
            "tune_vs_kernel_tuner.json",
            {
                "what": __doc__.strip().splitlines()[0],
                "method": METHOD,
                "goals": GOALS,
                "complete": complete,
                "quick": opts.quick,
                "selection": selection,
                "reps": opts.reps,
                "order": "per kernel, per repetition: ours cold, Kernel Tuner, ours warm",
                "samples": {
                    "ours": {
                        "source": "the project's [tuning] settings (project.tuning; example_pkg sets none: hatch-autotune's defaults)",
                        "rule": "per config: warmup launches, then timed until max_reps samples or budget_ms of GPU time (at "
                        "least min_reps), stopped early when eliminate says it clearly loses to the leader",
                        **dataclasses.asdict(project.tuning),
                    },
                    "theirs": {
                        "source": "Kernel Tuner's default iterations",
                        "rule": "per config: one verification run, then `iterations` launches timed with CUDA events (L2 not "
                        "flushed), its time their mean (ours: the median, L2 flushed before each); the first config of each "
                        "call is also run once before, untimed (its warm-up)",
                        "iterations": KT_ITERATIONS,
                    },
                    "retime": {
                        "timer": "hatch_autotune GpuTimer (CUDA events, L2 flushed)",
                        "rounds": RETIME_ROUNDS,
                        "reps_per_round": RETIME_REPS,
                    },
                },
                "verification": {
                    "expected_outputs": "the kernel's default config, run once per bucket on the device (our compiled default "
                    "variant on CuPy arrays) before anything is timed; spot-checked against NumPy in float64 (rows' `expected`)",
                    "ours": "every config: |got - expected| <= atol + rtol * |expected| (per dtype), against the default "
                    "config's outputs cross-checked by another config",
                    "theirs": f"every config: numpy.allclose(expected, got, atol=atol, rtol={KT_RTOL}) (Kernel Tuner's default "
                    "verify function; its rtol cannot be set), atol = ours for the dtype; a failure aborts the call",
                    "tolerances": {d: {"rtol": r, "atol": a} for d, (r, a) in TOLERANCES.items()},
                    "theirs_rtol": KT_RTOL,
                },
                "kernel_tuner": {
                    "version": _version("kernel_tuner"),
                    "lang": opts.kt_lang,
                    "strategy": "brute_force",
                    "iterations": KT_ITERATIONS,
                },
                "kernels": kernels,
                "fixed_costs": fixed_costs,
                "rows": rows,
                "errors": errors,
                **facts,
            },
            opts.out,
        )

    for name, spec0 in project.kernels.items():
        if opts.kernel and name not in opts.kernel:
            continue
        all_variants = render_kernel(spec0)
        tkey = "T=float32" if "T=float32" in all_variants else sorted(all_variants)[0]
        types = all_variants[tkey][0].types_dict
        try:
            chosen = select_points(spec0, types, n_buckets, where, cap)
        except ValueError as exc:
            print(f"{name}: skipped: {exc}", flush=True)
            continue
        if not chosen:
            print(f"{name}: skipped: no bucket matches {selection['rule']}", flush=True)
            continue
        small = cut_down(project, name, types, chosen)
        spec = small.kernels[name]
        names = [k.name for k in spec.key]
        points = bucket_points([k.buckets for k in spec.key])  # the grid the chosen buckets span
        variants = render_kernel(spec)[tkey]
        by_cfg = {config_key(v.config_dict): v for v in variants}
        default = by_cfg.get(config_key(spec.default))
        if default is None:
            raise SystemExit(f"tune_vs_kernel_tuner.py: {name}'s default config {dict(spec.default)} is not among its configs")
        print(f"{name} ({tkey}): {len(variants)} configs x {len(points)} bucket(s): {points}; {opts.reps} repetition(s)", flush=True)

        # Per bucket, before anything is timed: the inputs (our tuner's, by its seed) and the
        # default config's outputs, written for Kernel Tuner's processes.
        data = scratch / "data" / name
        buckets, checks = [], {}
        for i, point in enumerate(points):
            key = dict(zip(names, point))
            eid = str(EntryId.of(name, tkey, arch, key))
            inputs = bucket_inputs(spec, types, key, work, seed=zlib.crc32(eid.encode()))  # the data our tuner uses
            expected = retimer.outputs(spec, types, key, inputs, default)
            checks[label(key)] = check = numpy_check(name, inputs, expected)
            if check is not None and not check["ok"]:
                errors.append(f"{name} {label(key)}: the default config's outputs disagree with NumPy: {check}")
                print(f"warning: {errors[-1]}", flush=True)
            folder = data / str(i)
            folder.mkdir(parents=True, exist_ok=True)
            arrays, scalars = {}, {}
            for arg, value in inputs.items():
                if isinstance(value, np.ndarray):
                    np.save(folder / f"in_{arg}.npy", value)
                    arrays[arg] = str(folder / f"in_{arg}.npy")
                else:
                    scalars[arg] = value.item() if isinstance(value, np.generic) else value
            for arg, value in expected.items():
                np.save(folder / f"expected_{arg}.npy", value)
            buckets.append(
                {
                    "key": key,
                    "arrays": arrays,
                    "scalars": scalars,
                    "expected": {arg: str(folder / f"expected_{arg}.npy") for arg in expected},
                    "atol": kt_atol(spec, types),
                }
            )
            del inputs, expected
        job = {
            "kernel": name,
            "tkey": tkey,
            "types": types,
            "arch": arch,
            "work": str(work),
            "points": [list(p) for p in points],
            "lang": opts.kt_lang,
            "iterations": KT_ITERATIONS,
            "buckets": buckets,
            "out": str(scratch / f"kt-{name}.json"),
        }

        ours_cold, theirs, ours_warm = [], [], []
        for rep in range(opts.reps):
            cache_dir, cupy_cache = scratch / f"cache-{name}-{rep}", scratch / f"cupy-cache-{name}-{rep}"
            print(f"--- {name}, repetition {rep + 1}/{opts.reps}: ours cold", flush=True)
            ours_cold.append(run_ours(small, name, arch, cache_dir))
            print(
                f"--- {name}, repetition {rep + 1}/{opts.reps}: Kernel Tuner ({opts.kt_lang}, fresh process and CUPY_CACHE_DIR)", flush=True
            )
            theirs.append(run_theirs(job, scratch / f"kt-job-{name}.json", cupy_cache))
            print(f"--- {name}, repetition {rep + 1}/{opts.reps}: ours warm (the same compile cache)", flush=True)
            ours_warm.append(run_ours(small, name, arch, cache_dir))
            for run, who in ((ours_cold[-1], "ours cold"), (theirs[-1], "Kernel Tuner"), (ours_warm[-1], "ours warm")):
                if run.get("error"):
                    errors.append(f"{name} repetition {rep + 1}, {who}: {run['error']}")
            for b in theirs[-1].get("buckets", {}).values():
                if b.get("error"):
                    errors.append(f"{name} repetition {rep + 1}, Kernel Tuner: {b['error']}")
            shutil.rmtree(cache_dir, ignore_errors=True)
            shutil.rmtree(cupy_cache, ignore_errors=True)
            print(
                f"{name} repetition {rep + 1}: ours cold {ours_cold[-1]['call_s']} s, warm {ours_warm[-1]['call_s']} s; Kernel Tuner "
                + str(total(b.get("wall") for b in theirs[-1].get("buckets", {}).values()))
                + " s",
                flush=True,
            )

        # Every distinct winner of any repetition, re-timed on one timer, per bucket.
        kernel_rows = []
        for b in buckets:
            key, lab = b["key"], label(b["key"])
            per = [[run.get("buckets", {}).get(lab) for run in runs] for runs in (ours_cold, theirs, ours_warm)]
            winners = {}
            for run in (x for side in per for x in side):
                w = _get(run, "winner")
                if isinstance(w, Mapping) and config_key(w) in by_cfg:
                    winners[config_key(w)] = by_cfg[config_key(w)]
            retimed = None
            if winners:
                inputs = {arg: np.load(path) for arg, path in b["arrays"].items()}
                inputs.update(b["scalars"])
                retimed = dict(zip(winners, retimer.time(spec, types, key, inputs, list(winners.values()))))
                del inputs
            row = bucket_row(name, tkey, key, len(variants), *per, retimed, checks.get(lab))
            kernel_rows.append(row)
            rows.append(row)
            m = row["median"]
            print(
                f"{name} {lab}: ours {m['ours_cold_s']} s (warm {m['ours_warm_s']}), Kernel Tuner {m['theirs_s']} s "
                f"(no compile {m['theirs_no_compile_s']}); winner ratio {row['winners']['winner_time_ratio']}",
                flush=True,
            )
        summary, fixed = kernel_summary(
            name,
            tkey,
            len(variants),
            kernel_rows,
            [r["call_s"] for r in ours_cold],
            [r["call_s"] for r in ours_warm],
            [r.get("startup_s") for r in theirs],
        )
        kernels.append(summary)
        fixed_costs.append(fixed)
        print(json.dumps(summary, indent=1, default=str), flush=True)
        shutil.rmtree(data, ignore_errors=True)
        save(complete=False)  # what is done so far survives a timeout
    print(save(complete=True).read_text())
    shutil.rmtree(scratch, ignore_errors=True)
    sys.stdout.flush()
    if errors:
        print(f"tune_vs_kernel_tuner.py: {len(errors)} error(s), the first: {errors[0]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
