"""The compile cache shared through Redis: example_pkg's build cold, warm from Redis, warm on disk (CPU only).

Two workloads: `build`, example_pkg's wheel build (offline, its declared archs: the compile a
`pip wheel` does, through `build_payload` and `open_compile_cache` as the build hook calls
them), and `all_variants` (not with --quick), every variant of example_pkg for sm_90 through
`compile_all`, what a tuning builder compiles. Each repetition runs a workload three ways,
interleaved: cold (empty local store, empty Redis: NVRTC compiles everything and fills both),
warm from Redis (a new, empty local store: every binary comes from Redis and is written to
disk), warm local (the cold run's store: Redis is never asked). A redis-server is started on
127.0.0.1 for the run (no persistence) and stopped at the end. Redis on the same machine is the
best case: over a network each entry that Redis is asked for costs two round trips (a miss one).

    python benchmarks/redis_cache.py [--out DIR] [--quick] [--repeats N]   # writes redis_cache_cpu.json
"""

from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import example_project, machine, options, write_result

MODES = {
    "cold": "empty local store, empty Redis: NVRTC compiles, both are filled",
    "warm_redis": "empty local store, Redis filled: every binary from Redis (and written to disk)",
    "warm_local": "local store filled: Redis not asked",
}


def start_redis(workdir: Path) -> tuple[subprocess.Popen, int]:
    """redis-server on 127.0.0.1 and a free port, saving nothing; waits at most 10 s for PING."""
    import redis

    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit("redis_cache.py: needs redis-server (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [server, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    probe = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if probe.ping():
                return proc, port
        except redis.RedisError:
            time.sleep(0.05)
    stop_redis(proc)
    raise SystemExit(f"redis_cache.py: redis-server did not answer on 127.0.0.1:{port}")


def stop_redis(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def build(project: Any, cache: Any) -> dict[str, int]:
    from hatch_autotune.wheel.assemble import build_payload

    return build_payload(project, cache=cache, log=lambda m: None).counts


def all_variants(project: Any, cache: Any, arch: str = "sm_90") -> dict[str, int]:
    from hatch_autotune.compile import nvrtc as compile_mod
    from hatch_autotune.plan.planner import make_plan

    plan = make_plan(project, (arch,), log=lambda m: None)
    jobs = [inst.compile_job(i, arch) for inst in plan.instances for i in range(len(inst.variants))]
    return compile_mod.count(compile_mod.compile_all(jobs, cache))


def timed(
    workload: Callable[[Any, Any], dict[str, int]], project: Any, cache_dir: Path, url: str | None
) -> tuple[float, dict[str, int], list[str]]:
    """(seconds, the workload's counts, the cache's warnings) of one run, the cache opened as
    the build hook opens it."""
    from hatch_autotune.compile.tiers import open_compile_cache
    from hatch_autotune.declare.settings import read_cache_settings

    env = {"HATCH_AUTOTUNE_CACHE_DIR": str(cache_dir)} | ({"HATCH_AUTOTUNE_CACHE_URL": url} if url else {})
    t0 = time.perf_counter()
    cache = open_compile_cache(read_cache_settings(env))
    counts = workload(project, cache)
    return time.perf_counter() - t0, counts, cache.warnings()


def main() -> None:
    ap = options(__doc__)
    ap.add_argument("--repeats", type=int, default=5)
    opts = ap.parse_args()
    workloads = {"build": (build, 3 if opts.quick else opts.repeats)}
    if not opts.quick:
        workloads["all_variants"] = (all_variants, 3)  # 228 compiles cold: a minute each on 2 cores
    try:
        import redis
    except ImportError:
        raise SystemExit("redis_cache.py: needs redis-py (pip install 'hatch-autotune[redis]')") from None
    project = example_project(env={"HATCH_AUTOTUNE_MODE": "offline"})
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="redis-cache-bench-") as tmp:
        tmp = Path(tmp)
        (tmp / "redis").mkdir()
        proc, port = start_redis(tmp / "redis")
        url = f"redis://127.0.0.1:{port}/0"
        raw = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
        try:
            timed(build, project, tmp / "warm-up", None)  # NVRTC loaded, modules imported: not timed
            for name, (workload, repeats) in workloads.items():
                runs: dict[str, list[float]] = {m: [] for m in MODES}
                counts: dict[str, dict[str, int]] = {}
                for i in range(repeats):
                    raw.flushall()
                    local = tmp / f"{name}-local-{i}"
                    for mode, cache_dir in [("cold", local), ("warm_redis", tmp / f"{name}-from-redis-{i}"), ("warm_local", local)]:
                        seconds, counts[mode], warnings = timed(workload, project, cache_dir, url)
                        if warnings:
                            raise SystemExit(f"redis_cache.py: {name}, {mode}: {warnings}")
                        runs[mode].append(seconds)
                    print(f"{name} {i + 1}/{repeats}: " + ", ".join(f"{m} {runs[m][-1]:.3f} s" for m in MODES), flush=True)
                cold_counts, from_redis, local_counts = counts["cold"], counts["warm_redis"], counts["warm_local"]
                assert cold_counts["cached"] == 0 and from_redis["compiled"] == local_counts["compiled"] == 0, counts
                keys = list(raw.scan_iter("hatch-autotune:*", count=1000))
                row: dict[str, Any] = {
                    "repeats": repeats,
                    "stored_in_redis": {"entries": sum(k.endswith(b":meta") for k in keys), "bytes": sum(raw.strlen(k) for k in keys)},
                }
                for m in MODES:
                    row[m] = {
                        "median_s": round(statistics.median(runs[m]), 4),
                        "runs_s": [round(s, 4) for s in runs[m]],
                        "counts": counts[m],
                    }
                for m in ("warm_redis", "warm_local"):
                    row[m]["speedup_vs_cold"] = round(row["cold"]["median_s"] / row[m]["median_s"], 1)
                results[name] = row
        finally:
            stop_redis(proc)
    payload = {
        "what": __doc__.strip().splitlines()[0],
        "workloads": {
            name: what
            for name, what in {
                "build": f"example_pkg's build: {len(project.kernels)} kernels, archs {', '.join(project.archs)}, offline (build_payload)",
                "all_variants": "every variant of example_pkg for sm_90 (compile_all): what a tuning builder compiles",
            }.items()
            if name in results
        },
        "modes": MODES,
        "redis": {
            "server": subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip(),
            "where": "127.0.0.1, same machine",
        },
        "results": results,
        "machine": {**machine(), "cpus": os.cpu_count()},
    }
    print(f"\n{'workload':<13} {'mode':<11} {'median s':>9} {'vs cold':>8}  compiled/cached  (Redis holds)")
    for name, row in results.items():
        held = row["stored_in_redis"]
        for m in MODES:
            r = row[m]
            print(
                f"{name:<13} {m:<11} {r['median_s']:>9.3f} {r.get('speedup_vs_cold', 1.0):>7.1f}x  {r['counts']['compiled']:>8}/{r['counts']['cached']:<6}"
                f"  ({held['entries']} entries, {held['bytes'] / 1024:.0f} KiB)"
            )
    print(write_result("redis_cache_cpu.json", payload, opts.out))


if __name__ == "__main__":
    main()
