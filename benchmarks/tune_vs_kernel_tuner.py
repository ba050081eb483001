"""Tuning time and winner quality against Kernel Tuner's brute force (GPU only).

For every example_pkg kernel (the float32 instance of saxpy), on the same GPU in one run: the
same rendered sources, spaces, constraints and bucket sizes are tuned by Kernel Tuner's brute
force (its cuda-python backend, `lang="nvcuda"`) and by hatch-autotune (`tune(mode="retune")`).
Reported per kernel: tuning wall time of each (ours / theirs), and each winner's kernel time
re-measured with one timer (ours, CUDA events, L2 flushed) on the same inputs (ours / theirs).
Goals: tuning time <= 0.5x, winner within 2% or faster.

    pip install kernel_tuner        # carry the wheel to the GPU machine if it has no registry
    python benchmarks/tune_vs_kernel_tuner.py [--kernel saxpy] [--buckets 2]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import EXAMPLE, example_project, machine, write_result


def kernel_tuner_brute_force(spec: Any, variants: list[Any], types: dict[str, str], key: dict[str, int], inputs: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(wall seconds, best config) from Kernel Tuner over exactly our configs."""
    import numpy as np
    from kernel_tuner import tune_kernel

    by_config = {tuple(sorted(v.config_dict.items())): v.source for v in variants}
    space = {axis: list(values) for axis, values in spec.space.items()}
    allowed = set(by_config)

    def source(params: dict[str, Any]) -> str:
        return by_config[tuple(sorted((k, params[k]) for k in space))]

    def restrict(params: dict[str, Any]) -> bool:  # the same constraints: only our configs
        return tuple(sorted((k, params[k]) for k in space)) in allowed

    args = []
    for a in spec.args:
        if a.is_array:
            args.append(inputs[a.name])
        else:
            dtype = types.get(a.dtype, a.dtype)
            value = a.value(key) if a.value is not None else inputs[a.name]
            args.append(np.dtype(dtype).type(value))
    # Geometry: Kernel Tuner derives grid = ceil(problem_size / prod(grid_div)), block from names.
    if spec.name == "saxpy":
        geometry = dict(problem_size=key["n"], grid_div_x=["BLOCK", "VEC", "ITEMS"], block_size_names=["BLOCK"])
    elif spec.name == "row_softmax":
        geometry = dict(problem_size=key["rows"], grid_div_x=[], block_size_names=["BLOCK"])
    elif spec.name == "sgemm":
        space["NT"] = sorted({(c["BM"] // c["TM"]) * (c["BN"] // c["TN"]) for c in (v.config_dict for v in variants)})
        base = restrict

        def restrict(params: dict[str, Any]) -> bool:  # noqa: F811 - NT is the derived block size
            return base(params) and params["NT"] == (params["BM"] // params["TM"]) * (params["BN"] // params["TN"])

        geometry = dict(problem_size=(key["n"], key["m"]), grid_div_x=["BN"], grid_div_y=["BM"], block_size_names=["NT"])
    else:
        raise ValueError(spec.name)
    t0 = time.perf_counter()
    results, env = tune_kernel(
        spec.entry, source, arguments=args, tune_params=space, restrictions=restrict, lang="nvcuda",
        strategy="brute_force", verbose=False, quiet=True, iterations=7,
        # our sources already carry their parameters (no #defines, which would clash with their
        # constexprs), and use C++17 (`if constexpr`)
        defines={}, compiler_options=[*spec.nvrtc_options, "--std=c++17"], **geometry,
    )
    wall = time.perf_counter() - t0
    best = min((r for r in results if isinstance(r.get("time"), float)), key=lambda r: r["time"])
    return wall, {k: best[k] for k in spec.space}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", action="append", help="kernel(s) to compare (default: all)")
    ap.add_argument("--buckets", type=int, default=2, help="buckets per kernel (the largest ones)")
    opts = ap.parse_args()

    from hatch_autotune.cache import CompileCache, default_cache_dir
    from hatch_autotune.pipeline import detect_gpu_arch
    from hatch_autotune.render import render_kernel
    from hatch_autotune.space import bucket_points
    from hatch_autotune.tuning import tune
    from hatch_autotune.tuning.inputs import bucket_inputs

    arch = detect_gpu_arch()
    assert arch, "needs a GPU"
    work = Path(tempfile.mkdtemp()) / "example"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("dist", "kernels", "autotune.lock.json"))
    rows = []
    project = example_project(work, env={"HATCH_AUTOTUNE_ARCHS": arch})
    for name, spec in project.kernels.items():
        if opts.kernel and name not in opts.kernel:
            continue
        variants = render_kernel(spec)
        tkey = sorted(variants)[0] if "T=float32" not in variants else "T=float32"
        types = variants[tkey][0].types_dict
        points = bucket_points([k.buckets for k in spec.key])[-opts.buckets :]
        # ours: the whole kernel (all its buckets of this type), timed end to end
        t0 = time.perf_counter()
        summary = tune(project, kernels=[name], mode="retune", log=print, gpu_arch=arch, cache=CompileCache(default_cache_dir()))
        ours_wall_all = time.perf_counter() - t0
        n_entries = len(summary.tuned)
        for point in points:
            key = dict(zip((k.name for k in spec.key), point))
            inputs = bucket_inputs(spec, types, key, work)
            theirs_wall, theirs_best = kernel_tuner_brute_force(spec, variants[tkey], types, key, inputs)
            eid = next(e for e, _ in summary.tuned if e.startswith(f"{name}|{tkey}|") and e.endswith(",".join(f"{k}={v}" for k, v in key.items())))
            ours = dict(summary.tuned)[eid]
            ours_ms = next(m["median_ms"] for m in ours["measurements"] if m["config"] == ours["config"])
            theirs_ms = next((m.get("median_ms") for m in ours["measurements"] if m["config"] == theirs_best), None)
            rows.append({
                "kernel": name, "types": tkey, "bucket": key,
                "ours_tuning_s_per_bucket": ours_wall_all / max(1, n_entries), "theirs_tuning_s": theirs_wall,
                "tuning_time_ratio": (ours_wall_all / max(1, n_entries)) / theirs_wall,
                "ours_winner": ours["config"], "theirs_winner": theirs_best,
                "ours_winner_ms": ours_ms, "theirs_winner_ms_by_our_timer": theirs_ms,
                "winner_time_ratio": (ours_ms / theirs_ms) if theirs_ms else None,
            })
            print(rows[-1])
    print(write_result("tune_vs_kernel_tuner.json", {"what": __doc__.strip().splitlines()[0], "rows": rows, "machine": machine()}).read_text())


if __name__ == "__main__":
    main()
