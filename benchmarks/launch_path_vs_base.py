"""The fast path's per-call cost, this tree's runtime against a base commit's, side by side in one
process: did a change to the call path make a contiguous call slower?

The base commit's runtime (from a git worktree) is loaded beside this tree's under another module
name; both serve the same generated example_pkg table (saxpy), each over its own driver stand-in
with the launch made a no-op, exactly as benchmarks/launch_path_cpu.py sets them up (its
`setup`): a raw pre-packed cuLaunchKernel and the generated call with the stand-in's CAI arrays
and imitations of CuPy arrays and PyTorch tensors. All contenders of both sides are interleaved
within each repetition (the order rotated); "our layer" = generated - raw, per side; medians over
the repetitions, and head / base. Then the same with two GPUs (arrays on the second; CAI arrays,
whose device the driver is asked for), in a phase of its own.

    python benchmarks/launch_path_vs_base.py [--base REV] [--quick] [--out DIR]   # writes launch_path_vs_base.json
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, commit, example_project, import_generated, machine, options, write_result

BASE = "362fbf3"  # main before issue #52 (strided arrays, free dims, optional arrays, launch features)
CALLS, REPEATS = 20_000, 9


def load_runtime(name: str, folder: Path):
    """A runtime package's folder imported under another module name, beside this tree's."""
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py", submodule_search_locations=[str(folder)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = options(__doc__)
    ap.add_argument("--base", default=BASE, help=f"the commit to compare against (default {BASE})")
    opts = ap.parse_args()
    calls, repeats = (CALLS // 10, 5) if opts.quick else (CALLS, REPEATS)
    sys.path.insert(0, str(ROOT / "tests"))
    import launch_path_cpu as bench
    import pytest

    host = machine()  # before the stand-in is installed
    scratch = Path(tempfile.mkdtemp(prefix="launch-vs-base-"))
    base_tree = scratch / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_tree), opts.base], check=True, capture_output=True)
    try:
        base_rt = load_runtime("hatch_autotune_base_runtime", base_tree / "hatch_autotune" / "runtime")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False, capture_output=True)
    kernels = import_generated(example_project(), Path(tempfile.mkdtemp()))
    patch = pytest.MonkeyPatch()
    contenders = {}
    samples: dict[str, list[float]] = {}
    for gpus, prefix in ((1, ""), (2, "two_gpus_")):  # a phase each: setting up two GPUs drops the one-GPU plans
        contenders = {}
        for side, rt in (("head", kernels._runtime), ("base", base_rt)):
            for name, fn in bench.setup(rt, kernels, gpus, patch).items():
                if name != "checked_path":
                    contenders[f"{side}:{prefix}{name}"] = fn
        samples.update(bench.interleaved(contenders, calls, repeats, f"head and base, {gpus} GPU(s)"))
    patch.undo()
    medians = {name: statistics.median(values) for name, values in samples.items()}
    ours = {
        side: {
            f"{prefix}{name.split(':', 1)[1].removeprefix(prefix).removeprefix('generated_')}": us
            - medians[f"{side}:{prefix}raw_prepacked"]
            for prefix in ("", "two_gpus_")
            for name, us in medians.items()
            if name.startswith(f"{side}:{prefix}generated_")
        }
        for side in ("head", "base")
    }
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "base": opts.base,
        "head": commit(),
        "calls_per_loop": calls,
        "repeats": repeats,
        "quick": opts.quick,
        "results_us_per_call_median": medians,
        "our_layer_us": ours,
        "head_over_base": {n: ours["head"][n] / ours["base"][n] for n in ours["head"]},
        "head_minus_base_us": {n: ours["head"][n] - ours["base"][n] for n in ours["head"]},
        "samples_us": samples,
        "machine": host,
    }
    print(write_result("launch_path_vs_base.json", payload, opts.out).read_text())


if __name__ == "__main__":
    main()
