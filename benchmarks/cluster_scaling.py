"""Tuning spread over GPUs: wall time and scaling efficiency on 1, 2 and 4 workers, this machine's engine and Ray clusters of 1 and 2 nodes (CPU only).

Every run tunes example_pkg's spaces for sm_90 (every kernel, type instance and bucket: 30
buckets, 2,106 configs) in mode retune, with the stand-in worker (tests/fake_worker.py): each
measurement takes a fixed wall time (--measure-ms, 50 ms by default) and returns a SYNTHETIC
timing. So what is measured is the engine around the GPU: the scheduler, each bucket's inputs
made on the host, the lock written after every bucket, and Ray's round trips; not a GPU. The
compile cache is filled before the first run, so NVRTC is not timed (compiling overlaps
measuring in the engine; here it would only add the same CPU time to every run).

The runs, interleaved per repetition:
  local   this machine's engine (tuner.tune) with 1, 2, 4 stand-in GPUs
  ray-1   a Ray cluster of one node with 1, 2, 4 logical GPUs (tune_on_ray)
  ray-2   a Ray cluster of two nodes with 1 + 1 and 2 + 2 logical GPUs
Every Ray process runs on 127.0.0.1 (ray.cluster_utils.Cluster); the clusters are started once
and reused, so their start-up is not timed, while each run's ray.init, actor start-up and
project rendering in the actors are (`wall_s`; `tuning_s` is the scheduler's part alone).

Scaling efficiency at N workers = T(1) / (N * T(N)), T(1) the same engine's one-worker run.
`ideal_s` is the measuring time alone divided by N (configs measured * measure-ms / N).
Overhead per job: the time a GPU's worker waits between the end of one bucket and the start of
the next (locally: the lock saved, the next job fetched; on Ray, on the actor's own clock: the
round trip, which a queued next bucket hides); the scheduler alone (no engine: jobs that return
at once) is timed too. Every run's lock must equal the first run's,
or the benchmark stops: the lock does not depend on the engine or the order of arrival.

    python benchmarks/cluster_scaling.py [--out DIR] [--quick] [--repeats N] [--measure-ms MS]

--quick: saxpy and row_softmax only (12 buckets), one repetition. Writes cluster_scaling_cpu.json.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import EXAMPLE, ROOT, machine, options, write_result

# Ray stays on loopback: read when Ray is first imported (see ray_engine._ray)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

FAKE_WORKER = [sys.executable, str(ROOT / "tests" / "fake_worker.py")]
ARCH = "sm_90"
WORKERS = (1, 2, 4)
RAY_NODES = {"ray-1": lambda n: [n], "ray-2": lambda n: [n // 2, n // 2] if n >= 2 else None}
GOALS = {"efficiency_at_4": 0.90, "overhead_per_job_ms": 5.0}


def project_copy(dest: Path, kernels: list[str] | None) -> Path:
    """example_pkg cut to sm_90 (and to `kernels`), without its lock: every run tunes it all."""
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("autotune.lock.json", "build", "dist", "*.whl", "__pycache__"))
    text = (dest / "pyproject.toml").read_text()
    assert 'archs = ["sm_80", "sm_90"]' in text
    text = text.replace('archs = ["sm_80", "sm_90"]', f'archs = ["{ARCH}"]')
    if kernels:
        sections = text.split("\n[tool.hatch.build.targets.wheel.hooks.autotune.kernels.")
        text = "\n[tool.hatch.build.targets.wheel.hooks.autotune.kernels.".join(
            [sections[0]] + [s for s in sections[1:] if s.split("]", 1)[0] in kernels]
        )
    (dest / "pyproject.toml").write_text(text)
    return dest


def load(root: Path) -> Any:
    from hatch_autotune.declare.project import load_project  # as the command and the Ray actors read it

    return load_project(root)


def worker_env(measure_ms: float) -> dict[str, str]:
    return {"FAKE_WORKER": json.dumps({"cc": [9, 0], "sleep_ms": measure_ms, "ms": {"BLOCK=64": -0.2, "ITEMS=2": -0.1, "BM=128": -0.3}})}


def comparable(lock_file: Path) -> dict[str, Any]:
    """The lock's entries without the tuning date."""
    raw = json.loads(lock_file.read_text())["entries"]
    for entry in raw.values():
        entry["provenance"].pop("date", None)
    return raw


def run_local(root: Path, n: int, measure_ms: float, cache_dir: Path) -> tuple[float, Any]:
    from hatch_autotune.compile.cache import CompileCache
    from hatch_autotune.plan.devices import Gpu
    from hatch_autotune.tuning import tune
    from hatch_autotune.tuning.worker_client import WorkerClient

    env = {**os.environ, **worker_env(measure_ms)}
    gpus = [Gpu(i, ARCH, "stand-in") for i in range(n)]
    t0 = time.perf_counter()
    summary = tune(
        load(root),
        mode="retune",
        gpus=gpus,
        client_factory=lambda d: WorkerClient(FAKE_WORKER, env=env),
        cache=CompileCache(cache_dir),
        log=lambda m: None,
    )
    return time.perf_counter() - t0, summary


def run_ray(address: str, root: Path, measure_ms: float, cache_dir: Path) -> tuple[float, Any]:
    from hatch_autotune.compile.cache import CompileCache
    from hatch_autotune.tuning.ray_engine import tune_on_ray

    workers = {ARCH: {"command": FAKE_WORKER, "env": worker_env(measure_ms)}}
    t0 = time.perf_counter()
    summary = tune_on_ray(load(root), address, mode="retune", workers=workers, cache=CompileCache(cache_dir), log=lambda m: None)
    return time.perf_counter() - t0, summary


def scheduler_overhead(jobs: int = 2000, slots: int = 4) -> float:
    """Milliseconds per job of run_schedule alone: jobs that return at once."""
    from hatch_autotune.lock import LockEntry
    from hatch_autotune.tuning.schedule import Job, run_schedule

    entry = LockEntry(checksum="c", config={}, tuned=True)

    class Instant:
        def __init__(self, i: int):
            self.name, self.arch = f"s{i}", ARCH

        def run(self, job: Job) -> LockEntry:
            return entry

    t0 = time.perf_counter()
    run_schedule(
        [Job(f"k|-|{ARCH}|n={i}", ARCH) for i in range(jobs)], [Instant(i) for i in range(slots)], lambda j, e, s: None, log=lambda m: None
    )
    return (time.perf_counter() - t0) / jobs * 1000


def start_cluster(gpus_per_node: list[int]) -> Any:
    from ray.cluster_utils import Cluster

    cluster = Cluster()
    for n in gpus_per_node:
        cluster.add_node(
            num_cpus=1, num_gpus=n, resources={f"hatch-autotune:{ARCH}": n}, node_ip_address="127.0.0.1", include_dashboard=False
        )
    cluster.wait_for_nodes()
    return cluster


def row_of(wall: float, summary: Any, n: int, measured: int, measure_ms: float) -> dict[str, Any]:
    sched = summary.schedule
    jobs = sum(s.jobs for s in sched.slots)
    busy = sum(s.busy_s for s in sched.slots)
    row = {
        "wall_s": round(wall, 3),
        "tuning_s": round(sched.wall_s, 3),
        "ideal_s": round(measured * measure_ms / 1000 / n, 3),
        "buckets": jobs,
        "buckets_per_worker": [s.jobs for s in sched.slots],
        "utilisation": round(busy / (n * sched.wall_s), 4),
    }
    gaps = sum(max(s.jobs - 1, 0) for s in sched.slots)
    row["overhead_per_job_ms"] = round(sum(s.idle_s for s in sched.slots) / gaps * 1000, 3) if gaps else None
    return row


def main() -> None:
    ap = options(__doc__)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--measure-ms", type=float, default=50.0, help="wall time of each stand-in measurement (default 50)")
    opts = ap.parse_args()
    kernels = ["saxpy", "row_softmax"] if opts.quick else None
    repeats = 1 if opts.quick else opts.repeats
    import ray  # noqa: F401 - imported now, after the loopback switch above

    from hatch_autotune.compile import nvrtc as compile_mod
    from hatch_autotune.compile.cache import CompileCache
    from hatch_autotune.plan.planner import make_plan

    runs: dict[str, dict[int, list[dict[str, Any]]]] = {"local": {n: [] for n in WORKERS}}
    runs.update({name: {n: [] for n in WORKERS if shape(n)} for name, shape in RAY_NODES.items()})
    with tempfile.TemporaryDirectory(prefix="cluster-scaling-") as tmp:
        tmp = Path(tmp)
        cache_dir = tmp / "cache"
        os.environ["HATCH_AUTOTUNE_CACHE_DIR"] = str(cache_dir)  # the actors' compile cache too (their environment is this one's)
        template = project_copy(tmp / "example_pkg", kernels)
        project = load(template)
        plan = make_plan(project, [ARCH], log=lambda m: None)
        measured = sum(len(inst.configs) * len(inst.points[ARCH]) for inst in plan.instances)
        buckets = sum(len(inst.points[ARCH]) for inst in plan.instances)
        print(
            f"example_pkg for {ARCH}: {buckets} buckets, {measured} configs to measure at {opts.measure_ms:g} ms; filling the compile cache",
            flush=True,
        )
        t0 = time.perf_counter()
        compile_mod.compile_all(
            [inst.compile_job(i, ARCH) for inst in plan.instances for i in range(len(inst.variants))], CompileCache(cache_dir)
        )
        print(f"  compiled in {time.perf_counter() - t0:.1f} s (not timed below)", flush=True)
        clusters = {}
        reference: dict[str, Any] | None = None
        try:
            for name, shape in RAY_NODES.items():
                for n in WORKERS:
                    if shape(n):
                        clusters[(name, n)] = start_cluster(shape(n))
            for rep in range(repeats):
                for name, by_n in runs.items():
                    for n in by_n:
                        root = project_copy(tmp / f"{name}-{n}-{rep}", kernels)
                        if name == "local":
                            wall, summary = run_local(root, n, opts.measure_ms, cache_dir)
                        else:
                            wall, summary = run_ray(clusters[(name, n)].address, root, opts.measure_ms, cache_dir)
                        lock = comparable(root / "autotune.lock.json")
                        reference = reference or lock
                        if lock != reference:
                            raise SystemExit(f"cluster_scaling.py: {name} with {n} worker(s) wrote another lock than the first run")
                        row = row_of(wall, summary, n, measured, opts.measure_ms)
                        by_n[n].append(row)
                        extra = f", overhead {row['overhead_per_job_ms']:.2f} ms/job" if row["overhead_per_job_ms"] is not None else ""
                        print(
                            f"[{rep + 1}/{repeats}] {name:<5} {n} worker(s): {wall:6.1f} s (tuning {row['tuning_s']:.1f} s, ideal {row['ideal_s']:.1f} s){extra}",
                            flush=True,
                        )
                        shutil.rmtree(root)
        finally:
            for cluster in clusters.values():
                cluster.shutdown()
    sched_ms = statistics.median(scheduler_overhead() for _ in range(5))

    results: dict[str, Any] = {}
    for name, by_n in runs.items():
        med = {n: {k: statistics.median(r[k] for r in rows) for k in ("wall_s", "tuning_s", "utilisation")} for n, rows in by_n.items()}
        base = runs[name].get(1) and med[1]["wall_s"]
        base_tuning = runs[name].get(1) and med[1]["tuning_s"]
        results[name] = {}
        for n, rows in by_n.items():
            out = {"runs": rows, **{f"median_{k}": round(v, 3) for k, v in med[n].items()}, "ideal_s": rows[0]["ideal_s"]}
            if base:
                out["efficiency"] = round(base / (n * med[n]["wall_s"]), 4)
                out["efficiency_tuning"] = round(base_tuning / (n * med[n]["tuning_s"]), 4)
            overheads = [r["overhead_per_job_ms"] for r in rows if r["overhead_per_job_ms"] is not None]
            if overheads:
                out["median_overhead_per_job_ms"] = round(statistics.median(overheads), 3)
            results[name][str(n)] = out
    # two nodes have no one-worker run: their efficiency is against the one-node cluster's
    for n, out in results["ray-2"].items():
        base = results["ray-1"]["1"]
        out["efficiency"] = round(base["median_wall_s"] / (int(n) * out["median_wall_s"]), 4)
        out["efficiency_tuning"] = round(base["median_tuning_s"] / (int(n) * out["median_tuning_s"]), 4)

    lines = [
        f"{'engine':<6} {'workers':>7} {'wall s':>7} {'tuning s':>8} {'ideal s':>7} {'efficiency':>10} {'(tuning)':>8} {'overhead ms/job':>15}"
    ]
    for name, by_n in results.items():
        for n, out in by_n.items():
            over = f"{out['median_overhead_per_job_ms']:.2f}" if "median_overhead_per_job_ms" in out else "-"
            lines.append(
                f"{name:<6} {n:>7} {out['median_wall_s']:>7.1f} {out['median_tuning_s']:>8.1f} {out['ideal_s']:>7.1f} "
                f"{out['efficiency']:>10.1%} {out['efficiency_tuning']:>8.1%} {over:>15}"
            )
    lines.append(f"scheduler alone: {sched_ms * 1000:.1f} us per job (2,000 jobs that return at once, 4 slots)")
    print("\n" + "\n".join(lines))
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "workload": {
            "project": f"example_pkg, {ARCH}" + (f", kernels {', '.join(kernels)}" if kernels else ", every kernel"),
            "buckets": buckets,
            "configs_measured": measured,
            "measure_ms": opts.measure_ms,
            "worker": "tests/fake_worker.py: SYNTHETIC timings, each measurement sleeps measure_ms",
            "compile": "compile cache filled before the runs: NVRTC not timed",
        },
        "repeats": repeats,
        "goals": GOALS,
        "results": results,
        "scheduler_alone_ms_per_job": round(sched_ms, 5),
        "table": lines,
        "machine": {**machine(), "cpus": os.cpu_count(), "ray": __import__("ray").__version__},
    }
    print(write_result("cluster_scaling_cpu.json", payload, opts.out))


if __name__ == "__main__":
    main()
