"""`hatch-autotune show`, `diff` and `report` on big lock files (CPU only, no GPU needed).

A lock file of N entries is made up by `big_lock` from example_pkg's real kernels, type
instances, buckets and configs, copied as many times as N needs over seven archs, with
measurement lists of the tuner's format (made-up times, marked so in each entry's provenance).
Each command runs in a fresh interpreter (so imports and JSON decoding count, as they do for a
user) with output to a file; the median wall time of a few runs is recorded per N. `--old REF`
also times the command as it was at a git revision (its `hatch_autotune` extracted with
`git show` into a temporary directory), side by side.

    python benchmarks/inspect_scale.py [--out DIR] [--quick] [--old HEAD] [--sizes 1000,10000,50000]
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "example_pkg"

ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
GPUS = {  # arch -> (GPU, cc) for the made-up provenance
    "sm_75": ("NVIDIA T4", "7.5"),
    "sm_80": ("NVIDIA A100-SXM4-80GB", "8.0"),
    "sm_86": ("NVIDIA A10", "8.6"),
    "sm_89": ("NVIDIA L4", "8.9"),
    "sm_90": ("NVIDIA H100 80GB HBM3", "9.0"),
    "sm_100": ("NVIDIA B200", "10.0"),
    "sm_120": ("NVIDIA RTX PRO 6000", "12.0"),
}
SYNTHETIC = " (SYNTHETIC benchmark data, not a measurement)"
# Configs a kernel copy's space keeps: with 4, a 50k-entry lock is about 77 MB, near the 65 MB
# lock file the audit found slow (20 s in show, 23 s in diff, over 300 s in report).
CONFIGS_PER_KERNEL = 4


def _example_kernels() -> list[tuple[str, Any]]:
    """example_pkg's kernel specs, parsed by the build's own reader."""
    import tomllib

    sys.path.insert(0, str(ROOT))
    from hatch_autotune.declare.config import parse_project

    table = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["autotune"]
    return list(parse_project(table, EXAMPLE, env={}).kernels.items())


def big_lock(
    n_entries: int, *, seed: int = 0, configs_per_kernel: int = CONFIGS_PER_KERNEL, archs: tuple[str, ...] = ARCHS
) -> dict[str, Any]:
    """A lock file's JSON with exactly `n_entries` entries: example_pkg's kernels copied as
    `saxpy_000`, `row_softmax_000`, ... until there are enough, each copy a seeded sample of
    its kernel's configs (the default always in), every type instance x arch x bucket an entry
    whose measurements follow the tuner's format: mostly timed, some eliminated early, a few
    rejected, failed or pruned; about 1% untuned. Deterministic for a seed."""
    from hatch_autotune.declare.space import bucket_points
    from hatch_autotune.lock import LOCK_SCHEMA, EntryId

    rng = random.Random(seed)
    kernels = _example_kernels()
    entries: dict[str, Any] = {}
    copy_no = 0
    while len(entries) < n_entries:
        for base, spec in kernels:
            name = f"{base}_{copy_no:03d}"
            per_config = {}  # a config's speed, the same in every bucket up to noise
            for types in spec.type_instances():
                configs = spec.configs(types)
                default = dict(spec.default)
                others = [c for c in configs if c != default]
                sample = [default, *rng.sample(others, min(configs_per_kernel - 1, len(others)))]
                sample.sort(key=configs.index)
                tkey = ",".join(f"{k}={v}" for k, v in types.items()) or "-"
                for c in sample:
                    per_config[json.dumps(c, sort_keys=True)] = rng.uniform(0.6, 2.2)
                names = [d.name for d in spec.key]
                points = bucket_points([d.buckets for d in spec.key])
                for arch in archs:
                    arch_speed = {"sm_75": 3.0, "sm_80": 1.6, "sm_86": 2.2, "sm_89": 1.8, "sm_90": 1.0, "sm_100": 0.7, "sm_120": 1.2}.get(
                        arch, 1.0
                    )
                    for point in points:
                        if len(entries) >= n_entries:
                            break
                        bucket = dict(zip(names, point))
                        eid = str(EntryId.of(name, tkey, arch, bucket))
                        work = 1
                        for v in point:
                            work *= v
                        entries[eid] = _entry(rng, eid, sample, configs, default, per_config, arch, arch_speed, work, point == points[-1])
        copy_no += 1
    return {"schema": LOCK_SCHEMA, "entries": entries}


def _entry(rng: random.Random, eid: str, sample, configs, default, per_config, arch, arch_speed, work, largest) -> dict[str, Any]:
    checksum = hashlib.sha256(eid.encode()).hexdigest()
    gpu, cc = GPUS.get(arch, ("NVIDIA GPU", "?"))
    provenance = {
        "gpu": gpu + SYNTHETIC,
        "cc": cc,
        "driver": "580.82.07",
        "nvrtc": "13.0",
        "nvrtc_build": "13.0.88",
        "cuda_bindings": "13.0.3",
        "hatch_autotune": "0.1.0",
        "date": f"2025-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}T12:00:00+00:00",
    }
    if rng.random() < 0.01:  # untuned: the default, nothing measured
        return {"checksum": checksum, "config": dict(default), "tuned": False, "provenance": provenance}
    base = (0.004 + work * 2.5e-9) * arch_speed
    measurements = []
    for c in sample:
        index = configs.index(c)
        m: dict[str, Any] = {"config": dict(c), "index": index}
        roll = rng.random()
        if c != default and roll < 0.04:
            m.update(status="rejected", samples=0, reason="wrong result: max abs error 0.031 > atol 1e-05")
        elif c != default and largest and roll < 0.08:
            m.update(status="failed", samples=0, reason="CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch")
        elif c != default and roll < 0.1:
            m.update(status="pruned", samples=0, reason="needs 72 registers per thread x 1024 threads, the device allows 65536")
        else:
            speed = per_config[json.dumps(c, sort_keys=True)]
            median = round(base * speed * rng.uniform(0.97, 1.03), 6) or 1e-6
            eliminated = c != default and speed > 1.6 and roll > 0.5  # clearly slower than the leader
            m.update(
                status="eliminated" if eliminated else "ok",
                samples=3 if eliminated else rng.randint(8, 100),
                median_ms=median,
                spread_ms=round(median * rng.uniform(0.002, 0.03), 6),
            )
        measurements.append(m)
    ok = [m for m in measurements if m["status"] == "ok"]
    win = min(ok, key=lambda m: (m["median_ms"], m["index"]))
    default_ms = next(m["median_ms"] for m in measurements if m["config"] == default)
    return {
        "checksum": checksum,
        "config": win["config"],
        "index": win["index"],
        "tuned": True,
        "default": dict(default),
        "default_ms": default_ms,
        "measurements": measurements,
        "provenance": provenance,
    }


def retuned(lock: dict[str, Any], *, every: int = 50) -> tuple[dict[str, Any], dict[str, int]]:
    """A copy of `lock` as a re-tune would leave it, and the changes `diff` must report: of
    every `every` entries, one got another winner 20% slower (a regression), one got 30%
    faster, one was removed, and for each of these one entry was added (a new bucket of the
    same instance). Returns (new lock, {'added', 'removed', 'changed', 'regressions'})."""
    new = copy.deepcopy(lock)
    entries = new["entries"]
    ids = sorted(entries)
    counts = dict(added=0, removed=0, changed=0, regressions=0)
    for i in range(0, len(ids) - 2, every):
        slower, faster, gone = ids[i], ids[i + 1], ids[i + 2]
        for eid, factor in ((slower, 1.2), (faster, 0.7)):
            e = entries[eid]
            timed = [m for m in e.get("measurements", []) if m.get("status") == "ok"]
            if not e["tuned"] or not timed:
                continue
            for m in timed:
                if m["config"] == e["config"]:
                    m["median_ms"] = round(m["median_ms"] * factor, 6)
            counts["changed"] += 1
            counts["regressions"] += factor > 1
        entries[f"{gone}0"] = entries.pop(gone)  # 'n=4096' -> 'n=40960': one removed, one added
        counts["added"] += 1
        counts["removed"] += 1
    return new, counts


def write_lock(path: Path, data: dict[str, Any]) -> Path:
    """As the tuner writes it: sorted keys, one-space indent."""
    path.write_text(json.dumps(data, sort_keys=True, indent=1) + "\n")
    return path


# --------------------------------------------------------------------------------------------
# Timing.


def _old_tree(ref: str, into: Path) -> Path:
    """hatch_autotune (and templates) as they were at git `ref`, extracted into `into`."""
    files = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", ref, "hatch_autotune", "templates"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        blob = subprocess.run(["git", "show", f"{ref}:{name}"], cwd=ROOT, capture_output=True, check=True).stdout
        (into / name).parent.mkdir(parents=True, exist_ok=True)
        (into / name).write_bytes(blob)
    return into


def time_command(argv: list[str], code_root: Path, repeats: int, timeout: float) -> dict[str, Any]:
    """Median wall time of `python -m hatch_autotune ARGV` in fresh interpreters, output to a file."""
    env = {**os.environ, "PYTHONPATH": str(code_root), "NO_COLOR": "1"}
    samples, out_bytes = [], 0
    for _ in range(repeats):
        with tempfile.TemporaryFile() as sink:
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "hatch_autotune", *argv],
                    stdout=sink,
                    stderr=subprocess.PIPE,
                    env=env,
                    timeout=timeout,
                    cwd=code_root,
                )
            except subprocess.TimeoutExpired:
                return {"timed_out_after_s": timeout}
            samples.append(time.perf_counter() - t0)
            out_bytes = sink.seek(0, 2)
        if proc.returncode not in (0, 1):
            raise RuntimeError(f"{argv} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    return {"median_s": round(statistics.median(samples), 3), "runs_s": [round(s, 3) for s in samples], "stdout_bytes": out_bytes}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import machine, options, write_result

    from hatch_autotune.cli import LIST_LIMIT

    ap = options(__doc__)
    ap.add_argument("--sizes", default="1000,10000,50000", help="entries per lock file, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--old", metavar="REF", help="also time hatch_autotune as it was at this git revision")
    ap.add_argument("--old-timeout", type=float, default=120.0, help="seconds before an old run counts as timed out")
    opts = ap.parse_args()
    sizes = [int(s) for s in opts.sizes.split(",")]
    if opts.quick:
        sizes = [s for s in sizes if s <= 10_000] or sizes[:1]
    repeats = 1 if opts.quick else opts.repeats
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="inspect-scale-") as tmp:
        tmp = Path(tmp)
        trees = {"new": ROOT}
        if opts.old:
            trees["old"] = _old_tree(opts.old, tmp / "old")
        for n in sizes:
            lock = big_lock(n)
            a = write_lock(tmp / f"a{n}.json", lock)
            b = write_lock(tmp / f"b{n}.json", retuned(lock)[0])
            row: dict[str, Any] = {"lock_mib": round(a.stat().st_size / 2**20, 1)}
            commands = {
                "show": ["show", str(a)],
                "show_all": ["show", str(a), "--all"],
                "diff": ["diff", str(a), str(b)],
                "diff_all": ["diff", str(a), str(b), "--all"],
                "report": ["report", str(a), "-o", str(tmp / "r.html")],
            }
            for label, code_root in trees.items():
                for what, argv in commands.items():
                    if label == "old":
                        if what.endswith("_all"):
                            continue  # the old command printed everything, always: that is "show"/"diff"
                        timing = time_command(argv, code_root, 1, opts.old_timeout)
                    else:
                        timing = time_command(argv, code_root, repeats, 600)
                    if what == "report" and "median_s" in timing:
                        timing["html_mib"] = round((tmp / "r.html").stat().st_size / 2**20, 1)
                    row[f"{what}_{label}"] = timing
                    print(f"{n} entries, {what} ({label}): {timing}", flush=True)
            results[str(n)] = row
    old = None
    if opts.old:
        sha = subprocess.run(["git", "rev-parse", "--short", opts.old], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        old = f"{opts.old} ({sha}): one run each, as the command was there"
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "goal": "50k entries: show and diff under 3 s each, report under 30 s, on the 2-core development VM",
        "commands": {
            "show, diff": f"as a user runs them: now the first {LIST_LIMIT} rows and a line saying how many more",
            "show_all, diff_all": "with --all: every entry or change, what the old code always printed",
            "report": "report LOCK -o r.html (html_mib: its size)",
        },
        "lock": {"configs_per_kernel": CONFIGS_PER_KERNEL, "archs": list(ARCHS), "generator": "big_lock in this script (made-up times)"},
        "old": old,
        "repeats": repeats,
        "results": results,
        "machine": {**machine(), "cpus": os.cpu_count()},
    }
    print(write_result("inspect_scale_cpu.json", payload, opts.out).read_text())


if __name__ == "__main__":
    main()
