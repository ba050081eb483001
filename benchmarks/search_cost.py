"""The search strategies' own time per suggestion on big spaces (CPU only, synthetic data).

Goal: the search's own time per suggestion stays <= 15 ms on spaces up to 1M configs.

Each strategy of `search.STRATEGIES` but `exhaustive` (read at run time, so a new one is
measured too) searches synthetic product spaces of integer axes (6-7 axes of 2-12 values, mostly
powers of two, `tile_x` and `stages` not; threads per block `block_x * block_y` kept within
32-1024, which removes part of the product) of about 10k, 100k and 1M configs, through the
tuner's own loop (`run_search`) with a budget of S suggestions (300 at 10k and 100k, 200 at
1M). The objective is deterministic: a smooth bowl over each axis's log2 position, a narrow
deeper optimum far from the bowl's bottom, non-powers of two 15% slower, ~3% deterministic
noise, and ~5% of configs failing (None: a hashed 4% and a corner of the space), so that the
strategies behave as on real data (failed configs, a second optimum, refits).

What is timed, with `time.perf_counter` around each call of the strategy (never around the
objective): `ask()` and every `tell()`, and separately `upcoming(8)`, which the tuner calls
after each ask to prefetch compiles (`--ahead`). A batch's ask (and upcoming) is shared evenly
by the suggestions of that batch that were told: `random` asks for the whole space in one batch.
Per (size, strategy): the mean, median, p95 and max over the suggestions of one search, in ms,
the slowest single call, and the strategy's construction (`init`, once per search, not per
suggestion). The strategies refit their models periodically (`auto` every 10 configs, then every
20% more; `tpe` pays per tell), so most suggestions are cheap and a few are expensive: the MEAN
(the search's total own time / suggestions), with the `upcoming` guesses the tuner asks for
after every batch, is the headline number and the one the goal is judged on; median and p95
show how it is spread. Each SearchSpace is built once per size; its
construction time is reported apart (one-off, not per suggestion).

Repetitions are interleaved: repetition r runs every strategy on every size, in an order rotated
per repetition; each uses the same seed (the same searches, so the repetitions differ only by
timing noise, checked: the configs suggested must be equal). Reported: the median over the
repetitions of each statistic (at least 3 repetitions). Before them, one uncounted warm-up search
per strategy on the smallest space: imports (scipy) and first-use costs, paid once per tuner.

Run it on a quiet machine, and record how numpy's BLAS threads were set: `gp` and `auto` refit
with OpenBLAS, whose threads spin; with other busy processes on the cores (another job, or the
tuner's own compile workers) one refit took 6-25 s instead of 0.1-0.5 s on the 2-core VM, and
`OPENBLAS_NUM_THREADS=1` avoided it. The result file keeps the thread variables and the load
average before and after each repetition, and is written after each repetition (`complete`).

    python benchmarks/search_cost.py [--out DIR] [--quick]   # writes search_cost_cpu.json
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import math
import os
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from _common import commit, machine, options, quantile, write_result

from hatch_autotune.tuning import search
from hatch_autotune.tuning.search import Budget, SearchSpace, make_strategy, run_search

GOAL_MS = 15.0  # the search's own time per suggestion (the mean), at every size
AHEAD = 8  # configs `upcoming` is asked for after each ask (the tuner: one per compile worker)
REPS = 3

_BLOCK = [8, 16, 32, 64, 128, 256, 512, 1024]
# name -> axes. With the threads-per-block constraint (`_fits`): 10,400 / 99,840 / 983,040 configs.
SPACES: dict[str, dict[str, list[int]]] = {
    "10k": {
        "block_x": _BLOCK[1:],
        "block_y": [1, 2, 4, 8, 16, 32],
        "tile_x": [1, 2, 3, 4, 6, 8, 12, 16],
        "tile_y": [1, 2, 4, 8, 16],
        "unroll": [1, 2, 4, 8, 16],
        "vector": [1, 2],
    },
    "100k": {
        "block_x": _BLOCK[1:],
        "block_y": [1, 2, 4, 8, 16, 32],
        "tile_x": [1, 2, 3, 4, 6, 8, 12, 16],
        "tile_y": [1, 2, 4, 8, 16],
        "unroll": [1, 2, 4, 8, 16, 32],
        "vector": [1, 2, 4, 8],
        "stages": [1, 2, 3, 4],
    },
    "1M": {
        "block_x": _BLOCK,
        "block_y": [1, 2, 4, 8, 16, 32, 64],
        "tile_x": [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32],
        "tile_y": [1, 2, 4, 8, 16, 32, 64, 128],
        "unroll": [1, 2, 4, 8, 16, 32, 64, 128],
        "vector": [1, 2, 4, 8],
        "stages": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
    },
}
SUGGESTIONS = {"10k": 300, "100k": 300, "1M": 200}
QUICK_SUGGESTIONS = {"10k": 60, "100k": 60, "1M": 40}  # --quick: every size, fewer suggestions (under a minute)


def search_code_sha256() -> str:
    """The strategies' code, every module of tuning/search/ in name order: what a result measured."""
    digest = hashlib.sha256()
    for path in sorted(Path(search.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _fits(config: Mapping[str, int]) -> bool:
    """The constraint: 32 to 1024 threads per block, where the space has both block axes."""
    if "block_x" in config and "block_y" in config:
        return 32 <= config["block_x"] * config["block_y"] <= 1024
    return True


def build_space(axes: Mapping[str, Sequence[int]]) -> tuple[SearchSpace, float]:
    """The space of `axes`' product that `_fits`, and the seconds its SearchSpace took to build
    (the configs' enumeration not included)."""
    names = list(axes)
    configs = [c for c in (dict(zip(names, v)) for v in itertools.product(*axes.values())) if _fits(c)]
    t = time.perf_counter()
    space = SearchSpace(dict(axes), configs)
    return space, time.perf_counter() - t


# the bowl's bottom and the narrow optimum, per axis in order, as positions in [0, 1] of its log2 range
_BOWL = (0.55, 0.2, 0.3, 0.35, 0.4, 0.5, 0.25, 0.45)
_NARROW = (0.3, 0.8, 0.75, 0.9, 0.1, 1.0, 0.7, 0.9)
CORNER = 2.9  # a config fails where its last three axes' positions sum above this


class Objective:
    """A deterministic synthetic time in ms per config of `space` (None: failed)."""

    def __init__(self, space: SearchSpace):
        self.space = space
        self.lo_hi = [(math.log2(v[0]), math.log2(v[-1])) for v in space.ordered]
        # the narrow optimum: on each axis the rank nearest its position
        self.narrow = tuple(
            min(range(len(values)), key=lambda r: abs(self._pos(d, values[r]) - _NARROW[d % len(_NARROW)]))
            for d, values in enumerate(space.ordered)
        )

    def _pos(self, d: int, value: int) -> float:
        lo, hi = self.lo_hi[d]
        return (math.log2(value) - lo) / (hi - lo) if hi > lo else 0.0

    def __call__(self, index: int) -> float | None:
        ranks = self.space.ranks[index]
        steps = sum((r - n) ** 2 for r, n in zip(ranks, self.narrow))  # squared rank steps from the narrow optimum
        h = zlib.crc32(bytes(ranks))
        pos = [self._pos(d, self.space.ordered[d][r]) for d, r in enumerate(ranks)]
        if steps and (h % 100 < 4 or (len(pos) >= 3 and sum(pos[-3:]) > CORNER)):  # did not compile, crashed, too many resources
            return None
        bowl = sum((p - _BOWL[d % len(_BOWL)]) ** 2 for d, p in enumerate(pos))
        broad = (1.0 + 2.0 * bowl) * 1.15 ** sum(1 for d, r in enumerate(ranks) if (v := self.space.ordered[d][r]) & (v - 1))
        narrow = 0.8 * (1.0 + 0.5 * steps)  # 20% faster than the bowl's bottom; 1.2 one step off
        return min(broad, narrow) * (1.0 + 0.03 * ((h >> 8) % 1000 / 500.0 - 1.0))


class Timed:
    """A strategy whose calls are timed, for `run_search`: per batch asked, the ask's and the
    upcoming's seconds and each tell's."""

    def __init__(self, strategy: search.Strategy):
        self.strategy = strategy
        self.batches: list[list[Any]] = []  # [ask s, upcoming s, [tell s, ...]]
        self.calls: list[float] = []  # every call's seconds, for the slowest one
        self.suggested: list[int] = []

    def ask(self) -> list[int]:
        t = time.perf_counter()
        batch = self.strategy.ask()
        dt = time.perf_counter() - t
        self.batches.append([dt, 0.0, []])
        self.calls.append(dt)
        return batch

    def upcoming(self, k: int) -> list[int]:
        t = time.perf_counter()
        out = self.strategy.upcoming(k)
        dt = time.perf_counter() - t
        self.batches[-1][1] += dt
        self.calls.append(dt)
        return out

    def tell(self, index: int, ms: float | None) -> None:
        t = time.perf_counter()
        self.strategy.tell(index, ms)
        dt = time.perf_counter() - t
        self.batches[-1][2].append(dt)
        self.calls.append(dt)
        self.suggested.append(index)

    def per_suggestion(self, with_upcoming: bool) -> tuple[list[float], float]:
        """Each told suggestion's seconds (its tell and its share of its batch's ask, and of the
        upcoming too if asked), and the total, which also counts batches with nothing told."""
        out: list[float] = []
        total = 0.0
        for ask_s, upcoming_s, tells in self.batches:
            shared = ask_s + (upcoming_s if with_upcoming else 0.0)
            total += shared + sum(tells)
            out.extend(shared / len(tells) + t for t in tells)
        return out, total


def one_search(name: str, space: SearchSpace, objective: Callable[[int], float | None], suggestions: int, ahead: int) -> dict[str, Any]:
    """One search of `suggestions` configs by strategy `name`; its per-suggestion costs in ms."""
    first = (len(space) // 2,)  # the tuner always measures the kernel's default config first
    t = time.perf_counter()
    strategy = make_strategy(name, space, seed=0, first=first)
    init_s = time.perf_counter() - t
    timed = Timed(strategy)
    run_search(timed, objective, Budget(configs=suggestions), clock=lambda: 0.0, prefetch=lambda batch: None, ahead=ahead)
    costs, total = timed.per_suggestion(with_upcoming=False)
    with_up, total_up = timed.per_suggestion(with_upcoming=True)
    n = len(costs)
    if n == 0:
        raise RuntimeError(f"{name}: suggested nothing")
    ms = [c * 1e3 for c in costs]
    ok = [objective(i) for i in timed.suggested]
    return {
        "suggestions": n,
        "mean_ms": total * 1e3 / n,
        "median_ms": statistics.median(ms),
        "p95_ms": quantile(ms, 0.95),
        "max_ms": max(ms),
        "max_call_ms": max(timed.calls) * 1e3,
        "ask_ms": sum(b[0] for b in timed.batches) * 1e3 / n,
        "tell_ms": sum(sum(b[2]) for b in timed.batches) * 1e3 / n,
        "upcoming_ms": sum(b[1] for b in timed.batches) * 1e3 / n,
        "mean_with_upcoming_ms": total_up * 1e3 / n,
        "p95_with_upcoming_ms": quantile([c * 1e3 for c in with_up], 0.95),
        "init_ms": init_s * 1e3,
        "batches": len(timed.batches),
        "best_ms": min((t for t in ok if t is not None), default=None),
        "failed": sum(t is None for t in ok),
        "suggested_sha": hashlib.sha256(repr(timed.suggested).encode()).hexdigest()[:16],
    }


def strategies() -> list[str]:
    """Every strategy the project offers but `exhaustive` (its cost is one list, and a budget
    of S makes it a walk through the first S configs)."""
    return [s for s in search.STRATEGIES if s != "exhaustive"]


MEDIAN_KEYS = (
    "mean_ms",
    "median_ms",
    "p95_ms",
    "max_ms",
    "max_call_ms",
    "ask_ms",
    "tell_ms",
    "upcoming_ms",
    "mean_with_upcoming_ms",
    "p95_with_upcoming_ms",
    "init_ms",
)


def summarise(runs: Mapping[str, Mapping[str, Sequence[dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    """Per (space, strategy) with at least one repetition: the median over repetitions of each
    statistic, each repetition's mean, and whether every repetition suggested the same configs."""
    results: dict[str, dict[str, Any]] = {}
    for size, by_name in runs.items():
        for name, per in by_name.items():
            if not per:
                continue
            row = {key: statistics.median(r[key] for r in per) for key in MEDIAN_KEYS}
            row["suggestions"] = min(r["suggestions"] for r in per)
            row["reps"] = len(per)
            row["mean_ms_reps"] = [r["mean_ms"] for r in per]
            row["deterministic"] = len({r["suggested_sha"] for r in per}) == 1
            row["best_ms"] = per[0]["best_ms"]
            row["failed"] = per[0]["failed"]
            row["goal_met"] = row["mean_with_upcoming_ms"] <= GOAL_MS  # the tuner asks for the guesses after every batch: they count
            results.setdefault(size, {})[name] = row
    return results


def measure(
    spaces: Mapping[str, Mapping[str, Sequence[int]]],
    suggestions: Mapping[str, int],
    names: Sequence[str] | None = None,
    reps: int = REPS,
    ahead: int = AHEAD,
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
    checkpoint: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Build each space once, then `reps` interleaved repetitions of every (space, strategy)
    search; the medians over repetitions per (space, strategy), and each repetition's result.
    `checkpoint` gets the result so far after each repetition (a run cut short keeps them)."""
    names = list(names) if names is not None else strategies()
    started = time.perf_counter()
    built: dict[str, tuple[SearchSpace, Objective]] = {}
    space_info: dict[str, Any] = {}
    for size, axes in spaces.items():
        space, build_s = build_space(axes)
        objective = Objective(space)
        sample = range(0, len(space), max(1, len(space) // 20000))  # the failing share, from a sample
        failing = sum(objective(i) is None for i in sample) / len(sample)
        built[size] = (space, objective)
        space_info[size] = {
            "configs": len(space),
            "product": math.prod(len(v) for v in axes.values()),
            "axes": {a: list(v) for a, v in axes.items()},
            "build_ms": build_s * 1e3,
            "failing_share": round(failing, 4),
            "suggestions": suggestions[size],
        }
        log(f"search_cost: space {size}: {len(space):,} configs, SearchSpace built in {build_s * 1e3:.0f} ms, {failing:.1%} failing")
    smallest = min(built, key=lambda size: len(built[size][0]))
    for name in names:  # imports (scipy) and first-use costs, not counted: a tuner pays them once
        one_search(name, *built[smallest], min(30, suggestions[smallest]), ahead)
    pairs = [(size, name) for size in spaces for name in names]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {size: {name: [] for name in names} for size in spaces}
    loads = [_load()]  # the load average before the first repetition and after each
    out: dict[str, Any] = {}
    for rep in range(reps):
        shift = rep * len(pairs) // reps  # rotated: each repetition starts elsewhere
        for size, name in pairs[shift:] + pairs[:shift]:
            space, objective = built[size]
            gc.collect()  # the last search's garbage is not this one's cost
            t = time.perf_counter()
            result = one_search(name, space, objective, suggestions[size], ahead)
            result["rep"] = rep
            runs[size][name].append(result)
            log(
                f"search_cost: rep {rep + 1}/{reps} {size} {name}: {result['suggestions']} suggestions, "
                f"mean {result['mean_ms']:.2f} ms (p95 {result['p95_ms']:.2f}, max call {result['max_call_ms']:.0f}), "
                f"init {result['init_ms']:.0f} ms, search {time.perf_counter() - t:.1f} s, elapsed {time.perf_counter() - started:.0f} s"
            )
        loads.append(_load())
        out = {
            "spaces": space_info,
            "strategies": names,
            "reps": reps,
            "reps_done": rep + 1,
            "ahead": ahead,
            "load_average_1min": loads,
            "results": summarise(runs),
            "runs": runs,
        }
        if checkpoint is not None and rep + 1 < reps:
            checkpoint(out)
    return out


def _load() -> float | None:
    """The 1-minute load average: other processes on the machine slow the searches down."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def table(results: Mapping[str, Mapping[str, Mapping[str, Any]]], spaces: Mapping[str, Any]) -> str:
    lines = [
        "| size | configs | strategy | suggestions | mean ms | median ms | p95 ms | max ms | + upcoming mean ms | init ms | goal (mean + upcoming <= 15 ms) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for size, per in results.items():
        for name, r in per.items():
            lines.append(
                f"| {size} | {spaces[size]['configs']:,} | {name} | {r['suggestions']} | {r['mean_ms']:.2f} | {r['median_ms']:.2f} | "
                f"{r['p95_ms']:.2f} | {r['max_ms']:.2f} | {r['mean_with_upcoming_ms']:.2f} | {r['init_ms']:.0f} | "
                f"{'✓' if r['goal_met'] else '✗'} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = options(__doc__)
    ap.add_argument("--reps", type=int, default=REPS, help=f"interleaved repetitions (default {REPS}, at least 3 for a result)")
    ap.add_argument("--sizes", nargs="+", choices=list(SPACES), help="spaces to search (default: all)")
    ap.add_argument("--strategies", nargs="+", help="strategies (default: every one but exhaustive)")
    ap.add_argument("--suggestions", type=int, help="suggestions per search at every size (default: 300, 200 at 1M; --quick 60, 40 at 1M)")
    ap.add_argument("--ahead", type=int, default=AHEAD, help=f"configs asked of `upcoming` after each ask (default {AHEAD})")
    args = ap.parse_args(argv)
    sizes = args.sizes or list(SPACES)
    counts = {s: args.suggestions or (QUICK_SUGGESTIONS if args.quick else SUGGESTIONS)[s] for s in sizes}
    unknown = set(args.strategies or ()) - set(search.STRATEGIES)
    if unknown:
        raise SystemExit(f"search_cost.py: unknown strategies {sorted(unknown)}: expected some of {list(search.STRATEGIES)}")
    host = machine()
    started = time.perf_counter()
    facts = {
        "what": __doc__.strip().splitlines()[0],
        "goal": f"mean own time (ask + tell + the upcoming guesses the tuner asks for) per suggestion <= {GOAL_MS:g} ms on spaces up to 1M configs",
        "goal_ms": GOAL_MS,
        "quick": args.quick,
        "threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
        "cpu_count": os.cpu_count(),
        "commit": commit(),
        "search_sha256": search_code_sha256(),  # the commit may be +dirty
        "machine": host,
    }

    def checkpoint(partial: dict[str, Any]) -> None:
        write_result(
            "search_cost_cpu.json", {**facts, "complete": False, "wall_s": round(time.perf_counter() - started, 1), **partial}, args.out
        )

    out = measure({s: SPACES[s] for s in sizes}, counts, args.strategies, args.reps, args.ahead, checkpoint=checkpoint)
    wall = time.perf_counter() - started
    md = table(out["results"], out["spaces"])
    print(md)
    met = all(r["goal_met"] for per in out["results"].values() for r in per.values())
    print(
        f"\ngoal (mean own time per suggestion, upcoming guesses included, <= {GOAL_MS:g} ms at every size): {'met' if met else 'MISSED'}; {wall:.0f} s"
    )
    if not all(r["deterministic"] for per in out["results"].values() for r in per.values()):
        print("warning: a strategy suggested other configs in another repetition (same seed)", file=sys.stderr)
    payload = {**facts, "complete": True, "goal_met": met, "wall_s": round(wall, 1), "table": md, **out}
    path = write_result("search_cost_cpu.json", payload, args.out)
    print(f"wrote {path}", file=sys.stderr)
    return payload


if __name__ == "__main__":
    main()
