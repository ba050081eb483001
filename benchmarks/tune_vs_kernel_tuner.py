"""Tuning time and winner quality against Kernel Tuner's brute force (GPU only).

Per example_pkg kernel (one type instance: float32 where there is a choice) and its largest
`--buckets` buckets, on the same GPU in one run, both tuners get the same work:
- the same rendered sources (Kernel Tuner's kernel source is a function returning our rendered
  source of each config, with no #defines added),
- the same configs (Kernel Tuner's space is our axes plus a restriction that admits exactly our
  configs after constraints; launch geometry comes from the kernel's own grid/block/shared
  expressions), the same bucket sizes and the same inputs,
- a cold compile cache each (ours: a fresh hatch-autotune cache; theirs: a fresh CUPY_CACHE_DIR).

hatch-autotune: `tune(mode="retune")` on a copy of the project cut down to that type instance and
those buckets, timed end to end (compile, verify every variant, time, choose, write the lock).
Kernel Tuner: `tune_kernel(strategy="brute_force", lang="cupy")` per bucket (its CuPy backend,
which never touches `cuda.cuda`; `--kt-lang nvcuda` for its cuda-python backend), timed end to
end; it verifies nothing here (no `answer`), which favours it.

Then both winners are re-timed by one timer, ours (hatch_autotune.tuning.bench.GpuTimer: CUDA
events, L2 flushed before each launch), on the same inputs, interleaved in rounds, from cubins
compiled by the same NVRTC. Reported per bucket: tuning wall time of each (ours / theirs), and
winner time (ours / theirs). Goals: tuning time <= 0.5x, winner within 2% or faster.

    python benchmarks/tune_vs_kernel_tuner.py [--kernel saxpy] [--buckets 2] [--out DIR] [--quick]
    (needs kernel_tuner: benchmarks/fetch_wheels.py carries it to a GPU machine without a registry)
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

from _common import EXAMPLE, example_project, machine, options, require_gpu, write_result


def _version(dist: str) -> str | None:
    from importlib.metadata import version

    try:
        return version(dist)
    except Exception:
        return None


RETIME_ROUNDS, RETIME_REPS = 6, 5  # per winner: rounds x reps samples, the two winners interleaved


def cut_down(project: Any, name: str, types: dict[str, str], points: list[tuple[int, ...]]) -> Any:
    """The project with only kernel `name`, one type instance and the buckets spanning `points`."""
    spec = project.kernels[name]
    keys = tuple(dataclasses.replace(k, buckets=tuple(sorted({p[i] for p in points}))) for i, k in enumerate(spec.key))
    spec = dataclasses.replace(spec, key=keys, types={tp: (types[tp],) for tp in spec.types})
    return dataclasses.replace(project, kernels={name: spec})


def launch_args(spec: Any, types: dict[str, str], key: dict[str, int], inputs: dict[str, Any]) -> list[Any]:
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


def geometry(spec: Any, types: dict[str, str], key: dict[str, int], config: dict[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    env = {**key, **config, **spec.type_env(types)}
    return tuple(int(e(env)) for e in spec.grid), tuple(int(e(env)) for e in spec.block), int(spec.shared(env))


def kernel_tuner_brute_force(
    spec: Any, variants: list[Any], types: dict[str, str], key: dict[str, int], inputs: dict[str, Any], lang: str
) -> tuple[float, dict[str, Any], dict[str, Any]]:
    """(wall seconds, best config, facts) from Kernel Tuner over exactly our configs."""
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
    results, env = tune_kernel(
        spec.entry,
        source,
        problem_size,
        launch_args(spec, types, key, inputs),
        space,
        grid_div_x=[],
        grid_div_y=[],
        grid_div_z=[],
        block_size_names=block_names,
        restrictions=restrict,
        lang=lang,
        strategy="brute_force",
        verbose=False,
        quiet=True,
        iterations=7,
        # our sources carry their parameters already (no #defines, which would clash with their
        # constexprs); the options our compile uses besides the arch (C++17 for `if constexpr`)
        defines={},
        compiler_options=["--std=c++17", *spec.nvrtc_options],
        **extra,
    )
    wall = time.perf_counter() - t0
    timed = [r for r in results if isinstance(r.get("time"), float)]
    if not timed:
        first = results[0] if results else {}
        raise RuntimeError(f"Kernel Tuner timed no config of {spec.name} at {key}: first result {first}")
    best = min(timed, key=lambda r: r["time"])
    facts = {"configs_run": len(results), "configs_timed": len(timed), "own_winner_ms": best["time"]}
    return wall, {a: best[a] for a in axes}, facts


class Retimer:
    """Both winners on one timer: our GpuTimer (events, L2 flush), interleaved rounds."""

    def __init__(self, arch: str, cache: Any):
        from cuda.core import Device

        from hatch_autotune.declare.config import TuningSpec
        from hatch_autotune.tuning.bench import GpuTimer

        self.arch, self.cache = arch, cache
        self.timer = GpuTimer(0, flush_l2=True)
        self.settings = TuningSpec(budget_ms=1e12, warmup=1, min_reps=RETIME_REPS, max_reps=RETIME_REPS)
        self.device = Device(0)

    def kernel(self, spec: Any, variant: Any) -> Any:
        from cuda.core import ObjectCode

        from hatch_autotune.compile.nvrtc import compile_all

        (result,) = compile_all([variant.compile_job(self.arch, spec.entry, spec.nvrtc_options)], self.cache)
        if not result.ok:
            raise RuntimeError(f"{variant.label} does not compile: {result.log}")
        return ObjectCode.from_cubin(result.binary).get_kernel(spec.entry)

    def time(
        self, spec: Any, types: dict[str, str], key: dict[str, int], inputs: dict[str, Any], configs: list[tuple[Any, dict[str, Any]]]
    ) -> list[float]:
        """Median ms of each (variant, config), on fresh device copies of the same inputs."""
        import cupy as cp
        import numpy as np
        from cuda.core import LaunchConfig, launch

        host = launch_args(spec, types, key, inputs)
        dev_arrays = [cp.asarray(a) if isinstance(a, np.ndarray) else None for a in host]
        c_args = [d.data.ptr if d is not None else a for a, d in zip(host, dev_arrays)]
        cp.cuda.Device(0).synchronize()
        launches = []
        for variant, config in configs:
            grid, block, shared = geometry(spec, types, key, config)
            k, lc = self.kernel(spec, variant), LaunchConfig(grid=grid, block=block, shmem_size=shared)
            launches.append(lambda stream, k=k, lc=lc: launch(stream, lc, k, *c_args))
        samples: list[list[float]] = [[] for _ in configs]
        for _ in range(RETIME_ROUNDS):
            for i, fn in enumerate(launches):
                samples[i].extend(self.timer.time(fn, self.settings, None).samples)
        self.timer.stream.sync()
        del dev_arrays
        return [statistics.median(s) for s in samples]


def main() -> None:
    ap = options(__doc__)
    ap.add_argument("--kernel", action="append", help="kernel(s) to compare (default: all)")
    ap.add_argument("--buckets", type=int, default=None, help="buckets per kernel, the largest ones (default 2; 1 with --quick)")
    ap.add_argument("--kt-lang", default="cupy", choices=["cupy", "nvcuda"], help="Kernel Tuner backend (default cupy)")
    opts = ap.parse_args()
    n_buckets = opts.buckets or (1 if opts.quick else 2)

    arch = require_gpu("tune_vs_kernel_tuner.py")  # before importing CuPy: one clear line without a GPU
    scratch = Path(tempfile.mkdtemp(prefix="tune-vs-kt-"))
    os.environ["CUPY_CACHE_DIR"] = str(scratch / "cupy-cache")  # theirs starts cold, like ours
    try:
        importlib.import_module("kernel_tuner")
    except ImportError as exc:
        raise SystemExit(f"tune_vs_kernel_tuner.py: needs kernel_tuner ({exc}); carry it with benchmarks/fetch_wheels.py") from None
    import cupy as cp

    from hatch_autotune.compile.cache import CompileCache
    from hatch_autotune.compile.render import render_kernel
    from hatch_autotune.declare.space import bucket_points
    from hatch_autotune.lock import EntryId
    from hatch_autotune.tuning import tune
    from hatch_autotune.tuning.inputs import bucket_inputs

    cp.zeros(1).sum()  # CuPy's context and kernels up before either tuner is timed
    work = scratch / "example"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("dist", "kernels", "__pycache__", "autotune.lock.json"))
    project = example_project(work, env={"HATCH_AUTOTUNE_ARCHS": arch})
    retimer = Retimer(arch, CompileCache(scratch / "retime-cache"))
    rows, kernels_summary = [], []
    machine_facts = machine()

    def save(complete: bool) -> Path:
        return write_result(
            "tune_vs_kernel_tuner.json",
            {
                "what": __doc__.strip().splitlines()[0],
                "complete": complete,
                "quick": opts.quick,
                "buckets_per_kernel": n_buckets,
                "kernel_tuner": {"version": _version("kernel_tuner"), "lang": opts.kt_lang, "strategy": "brute_force", "iterations": 7},
                "retime": {
                    "timer": "hatch_autotune GpuTimer (CUDA events, L2 flushed)",
                    "rounds": RETIME_ROUNDS,
                    "reps_per_round": RETIME_REPS,
                },
                "kernels": kernels_summary,
                "rows": rows,
                "machine": machine_facts,
            },
            opts.out,
        )

    for name, spec in project.kernels.items():
        if opts.kernel and name not in opts.kernel:
            continue
        all_variants = render_kernel(spec)
        tkey = "T=float32" if "T=float32" in all_variants else sorted(all_variants)[0]
        types = all_variants[tkey][0].types_dict
        points = bucket_points([k.buckets for k in spec.key])[-n_buckets:]
        small = cut_down(project, name, types, points)
        spec = small.kernels[name]
        points = bucket_points([k.buckets for k in spec.key])  # the cut-down grid (a superset, in general)
        variants = render_kernel(spec)[tkey]
        print(f"{name} ({tkey}): {len(variants)} configs x {len(points)} bucket(s): {points}", flush=True)

        # ours: every bucket of the cut-down kernel, end to end, from a cold compile cache
        t0 = time.perf_counter()
        summary = tune(small, kernels=[name], mode="retune", log=print, gpu_arch=arch, cache=CompileCache(scratch / f"cache-{name}"))
        ours_wall = time.perf_counter() - t0
        tuned = dict(summary.tuned)
        theirs_wall_total = 0.0
        for point in points:
            key = dict(zip((k.name for k in spec.key), point))
            eid = str(EntryId.of(name, tkey, arch, key))
            inputs = bucket_inputs(spec, types, key, work, seed=zlib.crc32(eid.encode()))  # the data our tuner used
            theirs_wall, theirs_best, kt = kernel_tuner_brute_force(spec, variants, types, key, inputs, opts.kt_lang)
            theirs_wall_total += theirs_wall
            ours_cfg = dict(tuned[eid].config)
            by_cfg = {tuple(sorted(v.config_dict.items())): v for v in variants}
            same = ours_cfg == theirs_best
            pairs = [(by_cfg[tuple(sorted(ours_cfg.items()))], ours_cfg)]
            if not same:
                pairs.append((by_cfg[tuple(sorted(theirs_best.items()))], theirs_best))
            ms = retimer.time(spec, types, key, inputs, pairs)
            ours_ms, theirs_ms = ms[0], ms[-1]
            ours_own = tuned[eid].winner_ms
            rows.append(
                {
                    "kernel": name,
                    "types": tkey,
                    "bucket": key,
                    "configs": len(variants),
                    "ours_tuning_s_per_bucket": ours_wall / len(points),
                    "theirs_tuning_s": theirs_wall,
                    "tuning_time_ratio": (ours_wall / len(points)) / theirs_wall,
                    "ours_winner": ours_cfg,
                    "theirs_winner": theirs_best,
                    "same_winner": same,
                    "ours_winner_ms": ours_ms,
                    "theirs_winner_ms": theirs_ms,
                    "winner_time_ratio": ours_ms / theirs_ms,
                    "ours_own_measurement_ms": ours_own,
                    "theirs_own_measurement_ms": kt["own_winner_ms"],
                    "theirs_configs_timed": kt["configs_timed"],
                }
            )
            print(rows[-1], flush=True)
        kernels_summary.append(
            {
                "kernel": name,
                "types": tkey,
                "buckets": len(points),
                "configs": len(variants),
                "ours_tuning_s": ours_wall,
                "theirs_tuning_s": theirs_wall_total,
                "tuning_time_ratio": ours_wall / theirs_wall_total,
            }
        )
        save(complete=False)  # what is done so far survives a timeout
    print(save(complete=True).read_text())
    shutil.rmtree(scratch, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
