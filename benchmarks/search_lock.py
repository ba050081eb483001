"""Search on a GPU's exhaustive lock, replayed: example_pkg's own buckets, without a GPU.

A lock tuned exhaustively (example_pkg's, on an H200) records every config of every bucket with
its median and spread (half the IQR). Each bucket becomes replay data: a config's samples are
drawn from a normal with that median and IQR (the lock keeps no samples; the noise is modelled,
not recorded), configs that failed or were rejected fail, and an eliminated config keeps the
median of its few samples, slower than the leader as it was on the GPU. Each strategy then
searches every bucket through the tuner's own loop and runoff (search_quality.replayed_search),
the default measured first as the tuner does, and is judged by the true (recorded) time of the
config it would ship: ratio = shipped / optimum, >= 1 (search_live.py's direction).

A space that grew an axis since the lock was tuned (sgemm's SPLITK) is replayed as it was then:
the configs at the new axes' default values.

Two ways to tune an instance's buckets: `alone`, each from an empty lock; and `waves`, as the
tuner does since within-run transfer (tuning/warm.transfer_waves): the middle bucket first,
the others in waves, each warm-started (warm.warm_start) from what the waves before it wrote.
The live counterpart is search_live.py (`auto 10%` on the H200: median 1.012, 18 of 30 within
1.02x); this replay of the same kernels is what a session without a GPU can improve the search
against. Seeds come in halves as in search_quality.py: settings are chosen on the development
seeds (0, ...), the tables report the others (100, ...).

    python benchmarks/search_lock.py [--lock FILE] [--arch sm_90] [--seeds N] [--strategies ...]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread per process (search_quality.py)

import contextlib
import math
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from _common import EXAMPLE, ROOT, machine, options, quantile, write_result
from replay import Record, ReplayData
from search_quality import replayed_search

from hatch_autotune.declare.config import parse_project
from hatch_autotune.declare.project import hook_table
from hatch_autotune.lock import TIMED, EntryId, LockEntry, LockFile, Status
from hatch_autotune.plan.planner import Point
from hatch_autotune.runtime.values import types_key
from hatch_autotune.tuning.search import WarmStart
from hatch_autotune.tuning.warm import transfer_waves, warm_start

SAMPLES = 20  # samples drawn per config: what the GPU timer keeps of a stable config
NORMAL_IQR = 1.349  # a normal's IQR in standard deviations
BUDGETS = (0.05, 0.10)
MODES = ("alone", "waves")
STRATEGIES = ("auto", "tpe", "random")
DEV_SEED0, REPORT_SEED0 = 0, 100


class LockReplayError(ValueError):
    """The lock cannot be replayed: an entry that did not measure its whole space, or none of the arch."""


def bucket_data(eid: str, entry: LockEntry, axes: Mapping[str, Sequence[Any]], configs: Sequence[Mapping[str, Any]]) -> ReplayData:
    """One exhaustively tuned entry as replay data, its configs (`configs`, the instance's space)
    in canonical order."""
    ms = sorted(entry.measurements, key=lambda m: m.index if m.index is not None else -1)
    if [m.config for m in ms] != list(configs) or any(m.status == Status.SKIPPED for m in ms):
        raise LockReplayError(f"{eid}: not every config of its space was measured (tune it with strategy exhaustive first)")
    records = []
    for m in ms:
        if m.status not in TIMED or m.median_ms is None:
            records.append(Record((), None, f"{m.status} when tuned: {m.reason}", 0.0))
            continue
        sd = (2 * (m.spread_ms or 0.0)) / NORMAL_IQR
        rng = random.Random(f"{eid}:{m.index}")
        times = tuple(max(0.5 * m.median_ms, m.median_ms + sd * rng.gauss(0.0, 1.0)) for _ in range(SAMPLES))
        records.append(Record(times, m.median_ms, "", 0.0))
    return ReplayData(eid, eid.split("|")[0], axes, [m.config for m in ms], records)


def space_as_tuned(
    space: Mapping[str, Sequence[Any]], configs: Sequence[Mapping[str, Any]], default: dict[str, Any], entry: LockEntry
) -> tuple[dict[str, list[Any]], list[dict[str, Any]], dict[str, Any]]:
    """(axes, configs, default) of the space as `entry` was tuned over it: where axes were added
    to the space since (sgemm's SPLITK), the configs that hold them at the default's values,
    without them, as the lock's measurements name them; the space itself otherwise."""
    measured = set(entry.measurements[0].config) if entry.measurements else set(space)
    added = [a for a in space if a not in measured]
    if not added:
        return {a: list(v) for a, v in space.items()}, [dict(c) for c in configs], default
    then = [{a: v for a, v in c.items() if a not in added} for c in configs if all(c[a] == default[a] for a in added)]
    return {a: list(v) for a, v in space.items() if a not in added}, then, {a: v for a, v in default.items() if a not in added}


def load(lock_path: Path, project_root: Path, arch: str) -> dict[str, list[tuple[str, ReplayData, int]]]:
    """Per type instance, its buckets of `arch`: (entry id, replay data, the default's index)."""
    if not lock_path.is_file():
        raise LockReplayError(f"{lock_path}: no such lock file")
    lock = LockFile.load(lock_path)
    if lock.warnings:  # the build's reader is lenient (a damaged lock is tuned again); a replay needs every entry
        raise LockReplayError("; ".join(lock.warnings))
    project = parse_project(hook_table(project_root / "pyproject.toml")[0], project_root, env={"HATCH_AUTOTUNE_ARCHS": arch})
    out: dict[str, list[tuple[str, ReplayData, int]]] = {}
    for eid, entry in sorted(lock.entries.items()):
        parsed = EntryId.parse(eid)
        if parsed.arch != arch or parsed.kernel not in project.kernels:
            continue
        spec = project.kernels[parsed.kernel]
        types = next(t for t in spec.type_instances() if types_key(t) == parsed.types)
        axes, configs, default = space_as_tuned(spec.space, spec.configs(types), dict(spec.default), entry)
        data = bucket_data(eid, entry, axes, configs)
        out.setdefault(parsed.instance, []).append((eid, data, data.configs.index(default) if default in data.configs else 0))
    if not out:
        raise LockReplayError(f"{lock_path}: no entry of {arch} for a kernel of {project_root / 'pyproject.toml'}")
    return out


def tune_instance(buckets: Sequence[tuple[str, ReplayData, int]], strategy: str, seed: int, share: float, mode: str) -> dict[str, dict]:
    """Every bucket of one instance searched within `share` of its space, `alone` or in `waves`
    (the tuner's order and warm starts); per bucket, the shipped config's ratio and the best found."""
    by_eid = {eid: (data, default) for eid, data, default in buckets}
    points = [Point(EntryId.parse(eid), "-") for eid in by_eid]
    waves = transfer_waves(points) if mode == "waves" else [points]
    lock = LockFile()
    out = {}
    for wave in waves:
        starts = {p.eid: warm_start(lock, p, by_eid[p.eid][0].configs, strategy) if mode == "waves" else WarmStart() for p in wave}
        for p in wave:
            data, default = by_eid[p.eid]
            k = math.ceil(share * len(data.configs))
            run = replayed_search(data, strategy, seed, starts[p.eid], k, first=[default])
            winner = run.shipped(k)
            optimum = data.optimum_ms()
            shipped_ms = data.records[winner.index].mean_ms if winner is not None else math.inf
            out[p.eid] = {"ratio": shipped_ms / optimum, "found": run.best_found_ms(k) / optimum}
            if winner is not None:  # what the tuner would write: the later waves' warm starts read it
                lock.entries[p.eid] = LockEntry(checksum="-", config=winner.config, tuned=True, measurements=tuple(run.measured))
    return out


def _one(job: tuple[Sequence[tuple[str, ReplayData, int]], str, int, float, str]) -> dict[str, dict]:
    return tune_instance(*job)


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Over every bucket and seed: the shipped ratio's median, 90th percentile, worst, the share
    within 1.02x, and the median over seeds of a seed's worst bucket (what one run's goal sees)."""
    ratios = [r for run in runs for r in (b["ratio"] for b in run["buckets"].values())]
    per_seed: dict[int, float] = {}
    for run in runs:
        per_seed[run["seed"]] = max(per_seed.get(run["seed"], 1.0), *(b["ratio"] for b in run["buckets"].values()))
    return {
        "median": round(statistics.median(ratios), 4),
        "p90": round(quantile(ratios, 0.9), 4),
        "worst": round(max(ratios), 4),
        "within_1.02": round(sum(r <= 1.02 for r in ratios) / len(ratios), 3),
        "seed_worst_median": round(statistics.median(per_seed.values()), 4),
        "bucket_runs": len(ratios),
    }


def table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """The reported seeds' summaries as a markdown table (docs/research.md shows it)."""
    lines = [
        "| strategy | budget | buckets | median | 90th pct. | worst | within 1.02x | a seed's worst bucket (median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, s in summaries.items():
        strategy, budget, mode = key.split("|")
        cells = (f"{s['median']:.3f}", f"{s['p90']:.3f}", f"{s['worst']:.3f}", f"{s['within_1.02']:.0%}", f"{s['seed_worst_median']:.3f}")
        lines.append(f"| {strategy} | {budget} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = options(__doc__)
    ap.add_argument("--lock", type=Path, default=EXAMPLE / "autotune.lock.json", help="an exhaustively tuned lock (default example_pkg's)")
    ap.add_argument("--project", type=Path, default=EXAMPLE, help="the project whose lock it is (default example_pkg)")
    ap.add_argument("--arch", default="sm_90", help="the arch whose entries are replayed (default sm_90, the H200's)")
    ap.add_argument("--seeds", type=int, default=10, help="seeds per half (default 10)")
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    try:
        instances = load(args.lock, args.project, args.arch)
    except LockReplayError as exc:
        sys.exit(f"search_lock: {exc}")
    halves = {"dev": range(DEV_SEED0, DEV_SEED0 + args.seeds), "report": range(REPORT_SEED0, REPORT_SEED0 + args.seeds)}
    work = [
        (half, s, seed, share, mode, inst)
        for half, seeds in halves.items()
        for s in args.strategies
        for share in BUDGETS
        for mode in MODES
        for seed in seeds
        for inst in instances
    ]
    started = time.time()
    runs: dict[tuple, dict] = {}
    jobs = [(instances[inst], s, seed, share, mode) for _, s, seed, share, mode, inst in work]
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else contextlib.nullcontext() as pool:  # --jobs 1: in this process
        results = pool.map(_one, jobs, chunksize=4) if pool is not None else map(_one, jobs)
        for n, ((half, s, seed, share, mode, _), buckets) in enumerate(zip(work, results), 1):
            run = runs.setdefault(
                (half, s, seed, share, mode), {"half": half, "strategy": s, "seed": seed, "budget": share, "mode": mode, "buckets": {}}
            )
            run["buckets"].update(buckets)
            if n % 50 == 0 or n == len(work):
                print(f"search_lock: {n}/{len(work)} instance runs, {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    summaries = {
        half: {
            f"{s}|{share:.0%}|{mode}": summarize(
                [r for r in runs.values() if (r["half"], r["strategy"], r["budget"], r["mode"]) == (half, s, share, mode)]
            )
            for s in args.strategies
            for share in BUDGETS
            for mode in MODES
        }
        for half in halves
    }
    result = {
        "what": __doc__.split("\n\n")[0],
        "method": __doc__,
        "machine": machine(),
        "lock": str(args.lock.resolve().relative_to(ROOT)) if args.lock.resolve().is_relative_to(ROOT) else str(args.lock),
        "arch": args.arch,
        "buckets": sum(len(b) for b in instances.values()),
        "seeds": {half: list(seeds) for half, seeds in halves.items()},
        "reported": "report",
        "summaries": summaries,
        "tables": {"report": table(summaries["report"])},
        "runs": list(runs.values()),
    }
    path = write_result(f"search_lock_{args.arch}.json", result, args.out)
    print(result["tables"]["report"])
    print(f"search_lock: wrote {path}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
