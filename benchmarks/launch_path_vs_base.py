"""The fast path's per-call cost, this tree against a base commit, side by side: did a change to
the call path make a contiguous call slower?

Runs benchmarks/launch_path_cpu.py (the generated saxpy's fast path on the driver stand-in,
against a raw pre-packed launch in the same process) alternately in a git worktree of the base
commit and in this tree, `--rounds` times (the order rotated each round, so neither side is always
first), and compares "our layer" (generated - raw, µs per call) per contender: medians over the
rounds, and head / base. Each side's own raw launch is its reference, so a machine that is busier
during one run moves both of its numbers.

    python benchmarks/launch_path_vs_base.py [--base REV] [--rounds 3] [--out DIR]   # writes launch_path_vs_base.json
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, commit, machine, options, write_result

BASE = "362fbf3"  # main before issue #52 (strided arrays, free dims, optional arrays, launch features)


def run_once(tree: Path, out: Path) -> dict[str, float]:
    """One quick launch_path_cpu run in `tree`: its "our layer" µs per contender."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, str(tree / "benchmarks" / "launch_path_cpu.py"), "--quick", "--out", str(out)],
        check=True,
        cwd=tree,
        env={**_env(), "PYTHONPATH": str(tree)},
        stdout=subprocess.DEVNULL,
    )
    return json.loads((out / "launch_path_cpu.json").read_text())["our_layer_us"]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def main() -> None:
    ap = options(__doc__)
    ap.add_argument("--base", default=BASE, help=f"the commit to compare against (default {BASE})")
    ap.add_argument("--rounds", type=int, default=3)
    opts = ap.parse_args()
    host = machine()
    scratch = Path(tempfile.mkdtemp(prefix="launch-vs-base-"))
    base_tree = scratch / "base"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_tree), opts.base], check=True, capture_output=True)
    try:
        sides = {"base": base_tree, "head": ROOT}
        samples: dict[str, dict[str, list[float]]] = {"base": {}, "head": {}}
        for r in range(opts.rounds):
            order = ["base", "head"] if r % 2 == 0 else ["head", "base"]
            for side in order:
                got = run_once(sides[side], scratch / f"{side}-{r}")
                for name, us in got.items():
                    samples[side].setdefault(name, []).append(us)
                print(f"  round {r + 1}/{opts.rounds} {side}: " + ", ".join(f"{n} {v:.3f}" for n, v in got.items()), flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], check=False, capture_output=True)
    medians = {side: {n: statistics.median(v) for n, v in per.items()} for side, per in samples.items()}
    shared = [n for n in medians["head"] if n in medians["base"]]
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "base": opts.base,
        "head": commit(),
        "rounds": opts.rounds,
        "our_layer_us_median": medians,
        "head_over_base": {n: medians["head"][n] / medians["base"][n] for n in shared},
        "head_minus_base_us": {n: medians["head"][n] - medians["base"][n] for n in shared},
        "samples_us": samples,
        "machine": host,
    }
    print(write_result("launch_path_vs_base.json", payload, opts.out).read_text())


if __name__ == "__main__":
    main()
