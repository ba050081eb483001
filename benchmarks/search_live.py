#!/usr/bin/env python3
"""Search on a live GPU: example_pkg's buckets tuned by `auto`, `tpe` and `random` within 5% and 10%
of each bucket's space, and by `auto` warm-started from the other buckets' exhaustive results,
against exhaustive; every winner re-timed against the exhaustive winner on one timer.

    python benchmarks/search_live.py [--out DIR] [--quick] [--seeds N] [--kernel K]

Each run is one `tune()` of example_pkg (every kernel and bucket, the GPU's arch, mode retune) in a
copy of the project whose kernels all get `search = {strategy, budget, seed}`. The runs share one
compile cache, filled first by an exhaustive run (`exhaustive-cold`, which is also the reference
lock of the warm starts); the exhaustive run whose wall time the searches are compared with runs
on that warm cache like them, so the comparison is of measuring and the search's own cost, not of
compiling (a real build, compiling only what it measures, saves more).

Warm starts (`warm`): the lock holds the exhaustive results of half of the buckets (every other
bucket of each type instance); a run tunes every bucket, and the results kept are those of the
other half, whose searches saw their neighbours' winners and times, never their own. A second run
with the halves swapped covers the rest. Its wall time is the sum of the kept buckets' walls (the
lock's provenance), against exhaustive's of the same buckets.

Then, per bucket, every distinct winner (exhaustive's and each run's) is re-timed by one timer
(hatch_autotune's GpuTimer: CUDA events, L2 flushed) in interleaved rounds, on the inputs the
tuner uses; a run's winner counts by its re-timed median over the exhaustive winner's. The
search's own time (ask, tell, look-ahead; the provenance phase `search`) is reported per
suggestion beside the measuring time.

Goal (issue #39): `auto` at 10% within 1.02x of the exhaustive winner on every bucket, at <= 0.2x
of exhaustive's wall time.
"""

from __future__ import annotations

import copy
import json
import shutil
import statistics
import tempfile
import time
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from _common import EXAMPLE, machine, options, require_gpu, write_result
from tune_vs_kernel_tuner import Retimer, config_key

SEARCHES = (("auto", "5%"), ("auto", "10%"), ("tpe", "5%"), ("tpe", "10%"), ("random", "5%"), ("random", "10%"))
WARM_BUDGETS = ("5%", "10%")
SEEDS = 100  # the first seed (search_quality.py's reported half starts there too)
GOAL_RUN = "auto 10%"
GOAL_WORST, GOAL_WALL = 1.02, 0.2  # GOAL_RUN's worst winner, and its wall time, over exhaustive's
CLIENT_FACTORY = None  # tune()'s worker; tests/test_search_live.py sets a stand-in (no GPU there)


def project_with(root: Path, arch: str, search: Mapping[str, Any] | None, kernels: Sequence[str] | None) -> Any:
    """example_pkg's project in `root`, every kernel searched by `search` (None: exhaustive),
    only `kernels` if named."""
    from hatch_autotune.declare.config import parse_project
    from hatch_autotune.declare.project import hook_table

    table = copy.deepcopy(hook_table(root / "pyproject.toml")[0])
    for name in list(table["kernels"]):
        if kernels and name not in kernels:
            del table["kernels"][name]
        elif search is not None:
            table["kernels"][name]["search"] = dict(search)
    return parse_project(table, root, env={"HATCH_AUTOTUNE_ARCHS": arch})


def halves(eids: Sequence[str]) -> tuple[set[str], set[str]]:
    """Every other bucket of each type instance, in bucket order: (first half, second half)."""
    from hatch_autotune.lock import EntryId

    by_instance: dict[str, list[str]] = {}
    for eid in eids:
        by_instance.setdefault(EntryId.parse(eid).instance, []).append(eid)
    a: set[str] = set()
    for members in by_instance.values():
        ordered = sorted(members, key=lambda e: tuple(v for _, v in EntryId.parse(e).bucket.dims))
        a.update(ordered[::2])
    return a, set(eids) - a


class Runner:
    """Tunes copies of example_pkg on one compile cache and keeps what each run's lock says."""

    def __init__(self, scratch: Path, arch: str, kernels: Sequence[str] | None):
        from hatch_autotune.compile.cache import CompileCache

        self.scratch, self.arch, self.kernels = scratch, arch, kernels
        self.base = scratch / "example"
        shutil.copytree(EXAMPLE, self.base, ignore=shutil.ignore_patterns("dist", "kernels", "__pycache__", "autotune.lock.json"))
        self.cache = CompileCache(scratch / "compile-cache")
        self.count = 0

    def tune(self, name: str, search: Mapping[str, Any] | None, lock: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One tune() of every bucket (mode retune) in a fresh copy holding `lock` (a lock file's
        JSON) or none; its wall time and, per entry, what the lock it wrote says."""
        from hatch_autotune.tuning import tune

        self.count += 1
        root = self.scratch / f"run{self.count}"
        shutil.copytree(self.base, root)
        if lock is not None:
            (root / "autotune.lock.json").write_text(json.dumps(lock))
        project = project_with(root, self.arch, search, self.kernels)
        print(f"--- {name}: tuning {', '.join(project.kernels)} ({'exhaustive' if search is None else search})", flush=True)

        def log(message: str) -> None:
            if message.startswith(("tuned ", "warning", "tuning ")) and not message.startswith("tuning summary"):
                print("  " + message[:400], flush=True)

        t0 = time.perf_counter()
        tune(project, mode="retune", log=log, gpu_arch=self.arch, cache=self.cache, client_factory=CLIENT_FACTORY)
        wall = time.perf_counter() - t0
        written = json.loads((root / "autotune.lock.json").read_text())
        entries = {}
        for eid, e in written["entries"].items():
            phases = e.get("provenance", {}).get("phases", {})
            entries[eid] = {
                "config": e["config"],
                "ms": next((m["median_ms"] for m in e["measurements"] if m["config"] == e["config"]), None),
                "tried": sum(m["status"] != "skipped" for m in e["measurements"]),  # skipped: not tried by the search
                "runoff": len(e.get("runoff", {}).get("contenders", [])) if e.get("runoff") else 0,
                "phases": {k: phases.get(k) for k in ("wall", "compile_wait", "measure", "search", "overhead")},
            }
        print(f"--- {name}: {wall:.1f} s, {len(entries)} entries", flush=True)
        shutil.rmtree(root, ignore_errors=True)
        return {"name": name, "search": dict(search) if search else None, "wall_s": wall, "entries": entries, "lock": written}


def retime(arch: str, base: Path, cache: Any, kernels: Mapping[str, Any], winners: Mapping[str, set[str]]) -> dict[str, dict[str, Any]]:
    """Per entry, each distinct winner's re-timed median (ms) and spread, interleaved on one timer."""
    from hatch_autotune.compile.render import render_kernel
    from hatch_autotune.lock import EntryId
    from hatch_autotune.tuning.inputs import bucket_inputs

    timer = Retimer(arch, cache)
    rendered = {name: render_kernel(spec) for name, spec in kernels.items()}
    out: dict[str, dict[str, Any]] = {}
    for eid, configs in sorted(winners.items()):
        e = EntryId.parse(eid)
        spec = kernels[e.kernel]
        by_cfg = {config_key(v.config_dict): v for v in rendered[e.kernel][e.types]}
        order = sorted(configs)
        variants = [by_cfg[c] for c in order]
        types = variants[0].types_dict
        key = e.bucket.as_dict()
        inputs = bucket_inputs(spec, types, key, base, seed=zlib.crc32(eid.encode()))
        times = timer.time(spec, types, key, inputs, variants)
        out[eid] = dict(zip(order, times))
        print(f"  re-timed {eid}: " + ", ".join(f"{t['ms']:.4f}" for t in times), flush=True)
    return out


def summarize(
    run: Mapping[str, Any], exhaustive: Mapping[str, Any], retimed: Mapping[str, Mapping[str, Any]], keep: set[str] | None = None
) -> dict[str, Any]:
    """A run against exhaustive: per bucket its re-timed winner over exhaustive's; wall ratios
    (the run's, and the sum of the kept buckets' walls); the search's own time per suggestion."""
    rows = {}
    for eid, e in run["entries"].items():
        if keep is not None and eid not in keep:
            continue
        mine, best = retimed[eid][config_key(e["config"])], retimed[eid][config_key(exhaustive["entries"][eid]["config"])]
        rows[eid] = {
            "ratio": mine["ms"] / best["ms"],
            "ms": mine["ms"],
            "exhaustive_ms": best["ms"],
            "tried": e["tried"],
            "space": len(exhaustive["lock"]["entries"][eid]["measurements"]),
            "wall_s": e["phases"]["wall"],
            "search_s": e["phases"]["search"],
            "measure_s": e["phases"]["measure"],
            "config": e["config"],
        }
    ratios = [r["ratio"] for r in rows.values()]
    tried = sum(r["tried"] for r in rows.values())
    search_s = sum(r["search_s"] or 0.0 for r in rows.values())
    bucket_wall = sum(r["wall_s"] or 0.0 for r in rows.values())
    exh_bucket_wall = sum(exhaustive["entries"][eid]["phases"]["wall"] or 0.0 for eid in rows)
    per_kernel: dict[str, list[float]] = {}
    for eid, r in rows.items():
        per_kernel.setdefault(eid.split("|")[0], []).append(r["ratio"])
    return {
        "name": run["name"],
        "buckets": len(rows),
        "worst": max(ratios),
        "median": statistics.median(ratios),
        "within_1.02": sum(x <= 1.02 for x in ratios),
        "worst_per_kernel": {k: max(v) for k, v in per_kernel.items()},
        "wall_s": run["wall_s"] if keep is None else None,
        "wall_ratio": run["wall_s"] / exhaustive["wall_s"] if keep is None else bucket_wall / exh_bucket_wall,
        "bucket_wall_ratio": bucket_wall / exh_bucket_wall,
        "configs_tried": tried,
        "configs_in_spaces": sum(r["space"] for r in rows.values()),
        "search_s": search_s,
        "search_ms_per_suggestion": 1000 * search_s / tried if tried else None,
        "measure_s": sum(r["measure_s"] or 0.0 for r in rows.values()),
        "rows": rows,
    }


def table(summaries: Sequence[Mapping[str, Any]]) -> str:
    head = ("run", "worst", "median", "<=1.02x", "wall/exh", "configs", "search ms/sugg.", "measure s")
    lines = [head]
    for s in summaries:
        lines.append(
            (
                s["name"],
                f"{s['worst']:.3f}",
                f"{s['median']:.3f}",
                f"{s['within_1.02']}/{s['buckets']}",
                f"{s['wall_ratio']:.3f}",
                f"{s['configs_tried']}/{s['configs_in_spaces']}",
                f"{s['search_ms_per_suggestion']:.2f}" if s["search_ms_per_suggestion"] is not None else "-",
                f"{s['measure_s']:.1f}",
            )
        )
    w = [max(len(r[c]) for r in lines) for c in range(len(head))]
    return "\n".join("  ".join(r[c].ljust(w[c]) for c in range(len(head))) for r in lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = options(__doc__)
    ap.add_argument("--seeds", type=int, default=None, help="seeds per search (default 3, --quick 1)")
    ap.add_argument("--kernel", action="append", help="only this kernel (repeatable)")
    opts = ap.parse_args(argv)
    arch = require_gpu("search_live.py")
    seeds = list(range(SEEDS, SEEDS + (opts.seeds or (1 if opts.quick else 3))))
    facts = {"machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    scratch = Path(tempfile.mkdtemp(prefix="search-live-"))
    try:
        runner = Runner(scratch, arch, opts.kernel)
        reference = runner.tune("exhaustive-cold", None)  # fills the compile cache; the warm starts' lock
        exhaustive = runner.tune("exhaustive", None)
        runs = []
        for seed in seeds:
            for strategy, budget in SEARCHES:
                runs.append(
                    (
                        f"{strategy} {budget}",
                        seed,
                        runner.tune(f"{strategy} {budget} seed {seed}", {"strategy": strategy, "budget": budget, "seed": seed}),
                    )
                )
        first, second = halves(sorted(reference["entries"]))
        warm = []
        for budget in WARM_BUDGETS:
            search = {"strategy": "auto", "budget": budget, "seed": seeds[0]}
            for held, kept in ((first, second), (second, first)):
                lock = dict(reference["lock"], entries={k: v for k, v in reference["lock"]["entries"].items() if k in held})
                warm.append(
                    (f"warm auto {budget}", kept, runner.tune(f"warm auto {budget} (lock: {len(held)} other buckets)", search, lock))
                )
        winners: dict[str, set[str]] = {}
        for run in [reference, exhaustive] + [r for _, _, r in runs] + [r for _, _, r in warm]:
            for eid, e in run["entries"].items():
                winners.setdefault(eid, set()).add(config_key(e["config"]))
        print("--- re-timing every distinct winner, per bucket", flush=True)
        kernels = project_with(runner.base, arch, None, opts.kernel).kernels
        retimed = retime(arch, runner.base, runner.cache, kernels, winners)

        summaries = [summarize(reference, exhaustive, retimed)]
        summaries[0]["name"] = "exhaustive-cold (compiling)"
        by_name: dict[str, list[dict[str, Any]]] = {}
        for name, seed, run in runs:
            s = summarize(run, exhaustive, retimed)
            s["seed"] = seed
            by_name.setdefault(name, []).append(s)
        for budget in WARM_BUDGETS:
            parts = [(kept, run) for name, kept, run in warm if name == f"warm auto {budget}"]
            merged = {"name": f"warm auto {budget}", "wall_s": None, "entries": {}}
            for kept, run in parts:
                merged["entries"].update({k: v for k, v in run["entries"].items() if k in kept})
            by_name[f"warm auto {budget}"] = [summarize(merged, exhaustive, retimed, keep=set(merged["entries"]))]
        for name, group in by_name.items():
            # the seed whose worst bucket is worst stands for the strategy (all seeds are in `runs`)
            summaries.append(max(group, key=lambda s: s["worst"]) | {"name": name, "seeds": [s.get("seed") for s in group]})
        goal = next(s for s in summaries if s["name"] == GOAL_RUN)
        goals = {
            f"{GOAL_RUN}: worst winner <= {GOAL_WORST}x exhaustive's": goal["worst"] <= GOAL_WORST,
            f"{GOAL_RUN}: wall time <= {GOAL_WALL}x exhaustive's": goal["wall_ratio"] <= GOAL_WALL,
        }
        text = table(summaries)
        print("\n" + text, flush=True)
        print(f"exhaustive: {exhaustive['wall_s']:.1f} s on a warm compile cache, {reference['wall_s']:.1f} s compiling", flush=True)
        for k, ok in goals.items():
            print(f"goal {k}: {'met' if ok else 'MISSED'}", flush=True)
        payload = {
            "what": __doc__.strip().splitlines()[0],
            "method": __doc__.strip(),
            "arch": arch,
            "seeds": seeds,
            "exhaustive_wall_s": exhaustive["wall_s"],
            "exhaustive_cold_wall_s": reference["wall_s"],
            "goals": goals,
            "table": text,
            "summaries": [{k: v for k, v in s.items() if k != "rows"} for s in summaries],
            "rows": {s["name"]: s["rows"] for s in summaries},
            "runs": [
                {"name": r["name"], "search": r["search"], "wall_s": r["wall_s"], "entries": r["entries"]}
                for r in [reference, exhaustive] + [r for _, _, r in runs] + [r for _, _, r in warm]
            ],
            "retimed": retimed,
            **facts,
        }
        write_result("search_live.json", payload, opts.out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return payload


if __name__ == "__main__":
    main()
