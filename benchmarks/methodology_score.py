"""The comparison methodology's own score: its package run on our default strategy and Kernel Tuner's.

Willemsen et al., "A Methodology for Comparing Optimization Algorithms for Auto-Tuning" (2024),
ships as the package `autotuning_methodology`. Its `get_strategy_scores` runs every strategy
through Kernel Tuner's simulation mode on brute-forced data, `repeats` times, over a tuning-time
range it chooses per file: up to the time random search is expected to need to find a config 95%
of the way from the median config's time to the optimum (`cutoff_percentile`; configs needed
times the median time a config costs, plus 10%). That is long where the median is close to the
optimum (A100: about 1,000 configs) and short where most configs are far slower than the best
(W6600's convolution: 8 configs). It scores each strategy by its mean best time found,
standardised against the exact expectation of random search (0 = random search, 1 = the
optimum at once), averaged over the range and the files. `search_quality.py` computes a
score of the same form over measurement budgets; this one is the package's, with the package's
time axis: simulated compile and benchmark time from the recordings plus each strategy's own
time (our Gaussian process's arithmetic counts against it, as bayes_opt's does).

Our `auto` enters as a Kernel Tuner custom strategy (`HatchAutotuneSearch` below, an `OptAlg`):
it proposes configs of Kernel Tuner's enumerated space through the same `ask`/`tell` interface
the tuner uses, and Kernel Tuner's cost function measures them (from the recording) and stops it
when the time budget is spent. Each repeat draws its seed from the process's random state, as
Kernel Tuner's strategies do.

The package wants a T1 input file per kernel and a T4 file per GPU; both are made here from the
benchmark_hub files and the spaces of `kernel_tuner_sim.py` (the kernel's source is never
compiled in simulation mode: a placeholder stands in). Runs in the venv of `kernel_tuner_sim.py`
with the package and this project added:

    python3 -m venv /tmp/atmvenv
    /tmp/atmvenv/bin/pip install kernel_tuner==1.5.0 autotuning_methodology==1.1.0 -e .
    /tmp/atmvenv/bin/python benchmarks/methodology_score.py [--repeats 10] [--work /tmp/atm_work]

The runs are the slow part (about 50 minutes on 2 cores; bayes_opt on the W6600's dedispersion
takes 4 minutes a run) and the package runs them one by one. To use two cores, run disjoint
strategies with `--run-only` at once (the package keeps each strategy's runs per file in the
work folder), then once without it, which finds them all there and only scores:

    python benchmarks/methodology_score.py --run-only --strategies auto genetic_algorithm pso random_sample simulated_annealing &
    python benchmarks/methodology_score.py --run-only --strategies bayes_opt dual_annealing diff_evo firefly_algorithm; wait
    python benchmarks/methodology_score.py
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import KT_STRATEGIES  # noqa: E402

from hatch_autotune.tuning.search import SearchSpace, make_strategy  # noqa: E402

try:
    from kernel_tuner.strategies.wrapper import OptAlg
except ImportError:  # only the adapter below is usable then (the tests drive it without Kernel Tuner)
    OptAlg = object


class HatchAutotuneSearch(OptAlg):
    """One of our strategies as a Kernel Tuner custom strategy (loaded by class name from this file)."""

    def __init__(self, strategy: str = "auto"):
        super().__init__()
        self.costfunc_kwargs = {"scaling": False, "snap": False}  # configs as they are, not points of a unit cube
        self.strategy = strategy
        self.constraint_aware = True  # it proposes only configs of the enumerated (valid) space

    def __call__(self, func, searchspace):
        axes = dict(searchspace.tune_params)
        configs = [dict(zip(axes, values)) for values in searchspace.list]
        search = make_strategy(self.strategy, SearchSpace(axes, configs), random.getrandbits(31))
        best = (None, math.inf)
        while batch := search.ask():
            for i in batch:
                cost = func(list(searchspace.list[i]))  # raises StopCriterionReached past the budget
                ok = isinstance(cost, (int, float)) and math.isfinite(cost) and cost < sys.float_info.max
                search.tell(i, float(cost) if ok else None)
                if ok and cost < best[1]:
                    best = (searchspace.list[i], float(cost))
        return best


def _t1_input(kernel: str, spec: dict, folder: Path) -> Path:
    """A T1 input file for the kernel (the package reads the space, conditions and sizes from it)."""
    source = folder / f"{kernel}.cu"
    source.write_text("// never compiled: Kernel Tuner's simulation mode answers from the recordings\n")
    t1 = {
        "General": {"BenchmarkName": kernel, "OutputFormat": "JSON"},
        "ConfigurationSpace": {
            "TuningParameters": [
                {"Name": k, "Type": "int", "Values": json.dumps(v), "Default": v[0]} for k, v in spec["tune_params"].items()
            ],
            "Conditions": [{"Expression": e, "Parameters": [k for k in spec["tune_params"] if k in e]} for e in spec["restrictions"]],
        },
        "KernelSpecification": {
            "Language": "CUDA",
            "CompilerOptions": [],
            "BenchmarkName": kernel,
            "KernelName": spec["kernel_name"],
            "KernelFile": source.name,
            "GlobalSizeType": "CUDA",
            "LocalSize": {"X": "block_size_x", "Y": "block_size_y", "Z": "1"},
            "GlobalSize": {"X": "1", "Y": "1", "Z": "1"},
            "ProblemSize": list(spec["problem_size"]),
            "SharedMemory": 0,
            "Stream": None,
            "Arguments": [],
        },
    }
    path = folder / f"{kernel}.json"
    path.write_text(json.dumps(t1, indent=1))
    return path


def _recordings(dataset: Path, kernel: str, gpu: str, spec: dict, folder: Path) -> None:
    """The GPU's recording twice: as Kernel Tuner's cache (what its simulation mode replays) and
    in the T4 format (what the package's statistics read)."""
    from kernel_tuner import util
    from kernel_tuner.file_utils import get_t4_results

    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(dataset / kernel / f"{gpu}.json.gz", "rb") as src, open(folder / f"{gpu}.json", "wb") as dst:
        shutil.copyfileobj(src, dst)
    cache = json.loads((folder / f"{gpu}.json").read_text())["cache"]
    results = []
    for entry in cache.values():
        entry = dict(entry)
        if not isinstance(entry.get("time"), (int, float)):  # an error's class name, as the cache stores it
            entry["__error__"] = getattr(util, entry["time"])(entry["time"])
        results.append(entry)
    t4 = get_t4_results(results, spec["tune_params"], "time")
    (folder / f"{gpu}_T4.json").write_text(json.dumps(t4))


def _strategies(names: list[str], max_fevals: int) -> list[dict]:
    """The package's strategy entries. Kernel Tuner's strategies get a `max_fevals` as large as
    the largest space (Kernel Tuner lowers it to each space's size): given only the package's time
    limit, several would stop at their own defaults instead (bayes_opt after 100 configs,
    random_sample after 10% of the space), and be judged on a run cut short by a setting."""
    out = []
    for name in names:
        if name in KT_STRATEGIES:
            out.append(
                {
                    "name": f"kt:{name}",
                    "search_method": name,
                    "display_name": f"Kernel Tuner {name}",
                    "autotuner": "KernelTuner",
                    "search_method_hyperparameters": [{"name": "max_fevals", "value": max_fevals}],
                }
            )
        else:
            out.append(
                {
                    "name": name,
                    "search_method": "HatchAutotuneSearch",
                    "display_name": f"hatch-autotune {name}",
                    "autotuner": "KernelTuner",
                    "custom_search_method_path": str(Path(__file__).resolve()),
                    "search_method_hyperparameters": [{"name": "strategy", "value": name}],
                }
            )
    return out


def _experiment(work: Path, name: str, kernels: list[str], gpus: list[str], strategies: list[dict], repeats: int) -> Path:
    """An experiments file of the package (its defaults, our files and strategies), in `work`."""
    from autotuning_methodology.experiments import generate_experiment_file

    applications = [
        {"name": k, "folder": str(work / "kernels"), "input_file": f"{k}.json", "objective_performance_keys": ["time"]} for k in kernels
    ]
    os.chdir(work)  # the package writes the file into the working directory
    return generate_experiment_file(
        name,
        work,
        strategies,
        applications=applications,
        gpus=gpus,
        override={
            "experimental_groups_defaults": {
                "repeats": repeats,
                "pattern_for_full_search_space_filenames": {"regex": str(work / "cachefiles" / "${applications}" / "${gpus}_T4.json")},
            }
        },
        overwrite_existing_file=True,
    )


def main() -> None:
    from kernel_tuner_sim import GPUS, KERNELS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/atm_work"), help="inputs, runs and the package's result caches")
    ap.add_argument("--dataset", type=Path, default=HERE.parent.parent / "shared" / "datasets" / "benchmark_hub")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    ap.add_argument("--gpus", nargs="+", default=list(GPUS), choices=list(GPUS))
    ap.add_argument("--strategies", nargs="+", default=["auto", *KT_STRATEGIES])
    ap.add_argument(
        "--run-only",
        action="store_true",
        help="run these strategies into the package's cache and stop "
        "(several such runs at once on disjoint strategies, then one without it to score them all)",
    )
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    work = args.work.resolve()

    (work / "kernels").mkdir(parents=True, exist_ok=True)
    for kernel in args.kernels:
        _t1_input(kernel, KERNELS[kernel], work / "kernels")
        for gpu in args.gpus:
            if not (work / "cachefiles" / kernel / f"{gpu}_T4.json").exists():
                _recordings(args.dataset, kernel, gpu, KERNELS[kernel], work / "cachefiles" / kernel)
    largest = max(len(json.loads((work / "cachefiles" / k / f"{g}.json").read_text())["cache"]) for k in args.kernels for g in args.gpus)
    strategies = _strategies(args.strategies, largest)
    started = time.perf_counter()
    if args.run_only:
        from autotuning_methodology.experiments import execute_experiment

        execute_experiment(str(_experiment(work, f"run_{os.getpid()}", args.kernels, args.gpus, strategies, args.repeats)))
        print(f"ran {args.strategies} in {time.perf_counter() - started:.0f} s")
        return

    from autotuning_methodology.report_experiments import get_strategy_scores

    scores = {"all files": get_strategy_scores(str(_experiment(work, "all", args.kernels, args.gpus, strategies, args.repeats)))}
    for kernel in args.kernels:  # from the same runs (the package's cache), scored per kernel and per file
        scores[kernel] = get_strategy_scores(str(_experiment(work, kernel, [kernel], args.gpus, strategies, args.repeats)))
    for kernel in args.kernels:
        for gpu in args.gpus:
            scores[f"{kernel}|{gpu}"] = get_strategy_scores(
                str(_experiment(work, f"{kernel}_{gpu}", [kernel], [gpu], strategies, args.repeats))
            )
    cutoff_s = {}
    for kernel in args.kernels:
        for gpu in args.gpus:
            setup = json.loads((work / "setup" / f"{gpu}_{kernel}_{strategies[0]['name']}_input.json").read_text())
            cutoff_s[f"{kernel}|{gpu}"] = round(setup["Budget"][0]["BudgetValue"], 1)
    from importlib.metadata import version

    from _common import machine, write_result

    order = sorted(scores["all files"], key=lambda s: -scores["all files"][s]["score"])

    def table(columns: list[str], cell) -> str:
        rows = [
            "| strategy | " + " | ".join(c.replace("_milo", "").replace("|", " ") for c in columns) + " |",
            "|---|" + "---|" * len(columns),
        ]
        return "\n".join(rows + [f"| {s} | " + " | ".join(cell(scores[c][s]) for c in columns) + " |" for s in order])

    tables = {
        "scores": table(["all files", *args.kernels], lambda v: f"{v['score']:.3f} ± {v['error']:.3f}"),
        "per_file": table([f"{k}|{g}" for k in args.kernels for g in args.gpus], lambda v: f"{v['score']:.2f}"),
    }
    print(tables["scores"], tables["per_file"], sep="\n\n")
    write_result(
        "methodology_score.json",
        {
            "machine": {**machine(), "cpus": os.cpu_count()},
            "packages": {p: version(p) for p in ("autotuning_methodology", "kernel_tuner", "numpy", "scipy", "scikit-learn")},
            "repeats": args.repeats,
            "kernels": args.kernels,
            "gpus": args.gpus,
            "cutoff_s": cutoff_s,
            "scores": scores,
            "tables": tables,
            "scoring_s": round(time.perf_counter() - started, 1),
        },
        args.out,
    )


if __name__ == "__main__":
    main()
