"""Kernel Tuner's own search strategies replayed on brute-forced data, as a baseline for ours.

Each run is `kernel_tuner.tune_kernel(..., simulation_mode=True)` on a benchmark_hub cache file
(unzipped under /tmp/kt_cache/): Kernel Tuner's SimulationRunner answers every config from the
file and compiles nothing, so no kernel source is needed: a code generator that is never called
stands in (a string would be parsed to check it against the arguments). The spaces and restrictions
are those of the original tuning scripts (benchmark_hub/kernels/), so every config Kernel Tuner asks
for is in the file; kernel name and problem size must match the file's too.

How Kernel Tuner 1.5.0 counts `max_fevals` (util.TuningBudget, runners/simulation.py,
strategies/common.py): one per *unique* config served from the cache, failed ones
(RuntimeFailedConfig, CompilationFailedConfig) included. A config asked for again costs nothing
but is returned again; a config that breaks a restriction never reaches the runner and costs
nothing. A batch (a GA generation, a PSO swarm) is cut off where the budget runs out. `max_fevals`
above the space's size is lowered to it.

`run` follows the mean time ("time" in the file, ms) of each unique config in the order Kernel
Tuner first evaluated it (its results list is in evaluation order; repeats are dropped; a failed
config counts as infinitely slow) and keeps each improvement of the best so far as [k, ms]: the
best it had found after spending k is the last improvement at or before k. A strategy may stop
before spending its budget (`evaluated` is smaller then), which is real behaviour: genetic_algorithm after its 90 generations (later ones mostly
repeat configs), pso after 190 iterations, simulated_annealing when its schedule ends (~75%),
dual_annealing because Kernel Tuner passes max_fevals as scipy's `maxfun`, which counts every call
(repeats and restricted points too): it spends a quarter to a third of the budget.

Randomness: the strategies draw from the global `random` and `numpy.random` states (no strategy
here has a seed option; tune_kernel's `seed` is only used by the pymoo strategies), so both are
seeded. Their Latin hypercube samples (scipy.stats.qmc, in diff_evo and bayes_opt) would draw from
fresh OS entropy; they are made to draw from numpy's global state too, so that a run is
reproducible.

    /tmp/ktvenv/bin/python benchmarks/kernel_tuner_sim.py --out FILE.json [--seeds 20]
        [--budget-fraction 0.20] [--kernels ...] [--gpus ...] [--strategies ...] [--jobs 2]

runs every (kernel, gpu, strategy, seed) once at the budget ceil(fraction * configs). Results for
smaller budgets are read off the same trajectory: with the same seed, a smaller max_fevals gives a
prefix of it (the budget only decides where the run stops; checked for every strategy at 2% vs
20%), except for simulated_annealing, whose cooling schedule is stretched to max_fevals (read off a
larger run, it cools slower than it would). Mind dual_annealing: the best of its first k configs
is more than max_fevals=k would give it, which stops near k/3 unique configs.
bayes_opt is the slow one (its Gaussian process predicts over the whole space): ~10 s a run on
convolution at 20%, ~2.5 min on dedispersion.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import math
import os
import platform
import random
import shutil
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import kernel_tuner
import numpy as np
from scipy.stats import qmc
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import KT_STRATEGIES

# Kernel Tuner's Latin hypercube samples (Searchspace.get_LHS_sample, used by diff_evo; bayes_opt's
# initial sample) draw from fresh OS entropy; draw them from numpy's global state, seeded per run.
# Set before any strategy module is imported: bayes_opt imports the name when it is loaded.
qmc.LatinHypercube = functools.partial(qmc.LatinHypercube, seed=np.random.mtrand._rand)

DATA = Path(os.environ.get("BENCHMARK_HUB", "/work/shared/datasets/benchmark_hub"))
CACHE_DIR = Path("/tmp/kt_cache")
GPUS = ("A100", "A4000", "MI250X", "W6600")

# The spaces of benchmark_hub/kernels/*.py, key order included (it is the cache key's order).
KERNELS = {
    "convolution_milo": dict(
        kernel_name="convolution_kernel",
        problem_size=(4096, 4096),
        tune_params={
            "block_size_x": [16 * i for i in range(1, 17)],
            "block_size_y": [2**i for i in range(5)],
            "tile_size_x": [1, 2, 3, 4],
            "tile_size_y": [1, 2, 3, 4],
            "read_only": [0, 1],
            "use_padding": [0, 1],
            "use_shmem": [0, 1],
            "use_cmem": [1],
            "filter_height": [15],
            "filter_width": [15],
        },
        restrictions=[
            "use_padding==0 or block_size_x % 32 != 0",
            "block_size_x*block_size_y<=1024",
            "use_padding==0 or use_shmem != 0",
            "use_shmem == 0 or (((block_size_x*tile_size_x+(filter_width-1)))*((block_size_y*tile_size_y+(filter_height-1)))) < 12*1024",
        ],
    ),
    "dedispersion_milo": dict(
        kernel_name="dedispersion_kernel",
        problem_size=(25000, 2048, 1),
        tune_params={
            "block_size_x": [1, 2, 4, 8, 16, 32],
            "block_size_y": [8 * i for i in range(4, 33)],
            "block_size_z": [1],
            "tile_size_x": [1, 2, 3, 4],
            "tile_size_y": [1, 2, 3, 4, 5, 6, 7, 8],
            "tile_stride_x": [0, 1],
            "tile_stride_y": [0, 1],
            "loop_unroll_factor_channel": [0],
        },
        restrictions=[
            "32 <= block_size_x * block_size_y <= 1024",
            "tile_size_x > 1 or tile_stride_x == 0",
            "tile_size_y > 1 or tile_stride_y == 0",
        ],
    ),
}


def cache_file(kernel: str, gpu: str) -> Path:
    """The unzipped cache file (Kernel Tuner reads only plain JSON), written once, atomically."""
    path = CACHE_DIR / kernel / f"{gpu}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with gzip.open(DATA / kernel / f"{gpu}.json.gz", "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(tmp, path)
    return path


def space_size(kernel: str, gpu: str) -> int:
    with open(cache_file(kernel, gpu)) as f:
        return len(json.load(f)["cache"])


def run(kernel: str, gpu: str, strategy: str, seed: int, max_fevals: int) -> dict:
    """One search: how many unique configs it evaluated and, as [k, ms] pairs, each time the
    best so far improved (at its k-th config): the best of any first k, in a few numbers."""
    spec = KERNELS[kernel]
    random.seed(seed)
    np.random.seed(seed)
    # One BLAS thread: bayes_opt's Gaussian process is 3-4x slower with more (small matrices), and
    # far slower again when --jobs processes share the cores.
    with warnings.catch_warnings(), threadpool_limits(1):
        warnings.simplefilter("ignore")  # numpy/sklearn overflow warnings inside the strategies
        results, _ = kernel_tuner.tune_kernel(
            spec["kernel_name"],
            lambda params: "",
            spec["problem_size"],
            [],
            spec["tune_params"],
            restrictions=spec["restrictions"],
            lang="CUDA",
            cache=str(cache_file(kernel, gpu)),
            simulation_mode=True,
            strategy=strategy,
            strategy_options={"max_fevals": max_fevals},
            seed=seed,
            quiet=True,
            verbose=False,
        )
    keys = list(spec["tune_params"])
    seen: set[tuple] = set()
    improvements: list[list[float]] = []
    best = math.inf
    for r in results:
        config = tuple(r[k] for k in keys)
        if config not in seen:
            seen.add(config)
            ms = math.inf if "__error__" in r else float(r["time"])
            if ms < best:
                best = ms
                improvements.append([len(seen), ms])
    return {"evaluated": len(seen), "improvements": improvements}


def _timed(kernel: str, gpu: str, strategy: str, seed: int, max_fevals: int) -> dict:
    start = time.perf_counter()
    out = run(kernel, gpu, strategy, seed, max_fevals)
    return dict(kernel=kernel, gpu=gpu, strategy=strategy, seed=seed, max_fevals=max_fevals, **out, wall_s=time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--budget-fraction", type=float, default=0.20)
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    ap.add_argument("--gpus", nargs="+", default=list(GPUS), choices=list(GPUS))
    ap.add_argument("--strategies", nargs="+", default=list(KT_STRATEGIES))
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()

    tasks = []
    for kernel in args.kernels:
        for gpu in args.gpus:
            budget = math.ceil(args.budget_fraction * space_size(kernel, gpu))  # also unzips, before the pool
            tasks += [(kernel, gpu, s, seed, budget) for s in args.strategies for seed in range(args.seeds)]
    runs, start = [], time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        for fut in as_completed([pool.submit(_timed, *t) for t in tasks]):
            runs.append(fut.result())
            r = runs[-1]
            print(
                f"{len(runs)}/{len(tasks)} {time.perf_counter() - start:.0f}s  {r['kernel']} {r['gpu']} {r['strategy']} seed {r['seed']}: "
                f"{r['evaluated']} evals, {r['wall_s']:.1f}s",
                file=sys.stderr,
                flush=True,
            )
    runs.sort(key=lambda r: (r["kernel"], r["gpu"], r["strategy"], r["seed"]))
    machine = dict(system=platform.platform(), processor=platform.processor() or platform.machine(), cpus=os.cpu_count(), jobs=args.jobs)
    out = {"kernel_tuner": kernel_tuner.__version__, "python": platform.python_version(), "machine": machine, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
