#!/usr/bin/env python3
"""One command that turns a GPU machine (no network needed) into committed evidence.

    python3 benchmarks/gpu_check.py OUTDIR [--wheels DIR] [--quick]

In one invocation, each stage a subprocess with its own timeout, its output shown as it comes
and appended to OUTDIR/logs.txt, going on past a stage that fails:

  wheels                install the carried wheels (DIR, default .whl; see fetch_wheels.py) with
                        `pip install --no-index --no-deps --target SITE`; SITE goes on PYTHONPATH
                        for every later stage (skipped when DIR does not exist)
  env                   nvidia-smi, driver, Python and package versions, GPU name and compute
                        capability -> OUTDIR/env.txt (FAILED when no CUDA GPU answers)
  tests                 pytest tests/test_gpu.py tests/test_gpu_tuning.py tests/test_gpu_torch.py
                        [tests/test_standin*.py]
                        (the stand-in tests need no GPU; --no-standin leaves them out)
                        -> OUTDIR/junit.xml (FAILED unless something passed and nothing failed)
  tune                  python -m hatch_autotune tune example_pkg, for the GPU's arch
                        -> OUTDIR/autotune.lock.json (a copy of example_pkg/autotune.lock.json)
  launch_overhead       benchmarks/launch_overhead.py  \\
  first_call            benchmarks/first_call.py        \\ OUTDIR/results.json (all four)
  roofline              benchmarks/roofline.py          /
  tune_vs_kernel_tuner  benchmarks/tune_vs_kernel_tuner.py

It ends with a table of the stages (name, ok/FAILED/skipped, seconds, one-line result), printed
last and saved as OUTDIR/summary.md and OUTDIR/summary.json (both also rewritten after every
stage, so a run cut short still leaves them), and exits 1 if any stage failed. OUTDIR stays flat
and holds at most 7 files, because the device tool brings back at most 8.

The whole run keeps to --budget-s (default 560 s, inside the device tool's 10 minutes); a stage
gets the smaller of its own timeout and what is left, and a stage with too little left is
skipped. --quick uses smaller benchmark sets and leaves out the pytest that duplicates the tune
stage. --only/--skip pick stages for a second run (wheels and env run unless --skip names them).

After fetching OUTDIR to a development machine, `gpu_check.py --unpack OUTDIR` copies the lock
file into example_pkg/ and the results into benchmarks/results/, named after the GPU.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The package is imported from this checkout (the environment probe, the lock summary): on a GPU
# machine it is not installed, and `python3 benchmarks/gpu_check.py` puts only benchmarks/ on the path.
sys.path.insert(0, str(ROOT))
EXAMPLE = ROOT / "example_pkg"
LOCK = EXAMPLE / "autotune.lock.json"
RESULTS_DIR = ROOT / "benchmarks" / "results"

OK, FAILED, SKIPPED = "ok", "FAILED", "skipped"
BENCHMARKS = ("search_live", "launch_overhead", "first_call", "roofline", "tensor_core", "tune_vs_kernel_tuner")
# (full, --quick) timeouts in seconds; each is also capped by what is left of --budget-s
TIMEOUTS = {
    "wheels": (120, 120),
    "env": (90, 90),
    "tests": (300, 170),
    "tune": (300, 220),
    "wheel": (480, 400),  # pip wheel of example_pkg tuning on this GPU, then installed and called
    "search_live": (480, 330),
    "showcase": (300, 240),  # every config of the showcase kernels (about 450) compiled and checked
    "launch_overhead": (150, 75),
    "first_call": (120, 60),
    "roofline": (180, 90),
    "tensor_core": (240, 150),  # bf16 gemm against cuBLAS, the norms against the streaming ceiling and PyTorch
    "tune_vs_kernel_tuner": (540, 420),  # 3 interleaved repetitions of both tools, both verifying
}
STAGES = tuple(TIMEOUTS)
MIN_STAGE_S = 15  # a stage is not started with less time than this left
RESERVE_S = 5  # kept back from the budget for the summary
DUPLICATE_TEST = "test_tune_example_pkg_end_to_end"  # what the tune stage does; left out by --quick

# The versions env.txt reports (distribution names; the first found of each group).
VERSIONS = [
    ("cuda-core",),
    ("cuda-bindings",),
    ("cuda-pathfinder",),
    ("nvidia-cuda-nvrtc",),
    ("cuda-toolkit",),
    ("numpy",),
    ("cupy-cuda13x", "cupy-cuda12x", "cupy"),
    ("kernel_tuner",),
    ("python-constraint2",),
    ("jsonschema",),
    ("hatchling",),
    ("platformdirs",),
    ("trove-classifiers",),
    ("tomlkit",),
    ("jinja2",),
    ("rich",),
    ("pytest",),
    ("scipy",),
    ("pandas",),
    ("torch",),
    ("jax",),
    ("jaxlib",),
    ("numba-cuda",),
]


# --------------------------------------------------------------------------------------------
# Running one stage


@dataclass
class Stage:
    name: str
    status: str = "pending"
    seconds: float = 0.0
    result: str = ""
    timeout_s: float | None = None
    rc: int | None = None
    command: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 1),
            "result": self.result,
            "timeout_s": self.timeout_s,
            "rc": self.rc,
            "command": self.command,
        }


@dataclass
class Run:
    rc: int | None
    seconds: float
    timed_out: bool
    tail: list[str]


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                text = f.read()
            pid = int(stat.split("/")[2])
            ppid = int(text.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(pid)
    return kids


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc; empty elsewhere), including ones in other sessions."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_tree(proc: subprocess.Popen) -> None:
    """End a stage we started: its process group, then any descendant that left it, by id."""
    below = _descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in below:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=5)
            if sig == signal.SIGTERM:
                time.sleep(0.5)  # let children that saw SIGTERM go; SIGKILL the rest
        except subprocess.TimeoutExpired:
            pass


class Log:
    """OUTDIR/logs.txt and the terminal, line by line."""

    def __init__(self, path: Path):
        self.file = open(path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115 (kept open for the run)
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        with self.lock:
            sys.stdout.write(text)
            sys.stdout.flush()
            self.file.write(text)
            self.file.flush()

    def close(self) -> None:
        self.file.close()


def run_command(cmd: list[str], env: dict[str, str], timeout: float, log: Log) -> Run:
    t0 = time.monotonic()
    tail: deque[str] = deque(maxlen=400)
    try:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
    except OSError as exc:
        log.write(f"cannot start {cmd[0]}: {exc}\n")
        return Run(None, time.monotonic() - t0, False, [f"cannot start {cmd[0]}: {exc}"])

    def pump() -> None:
        assert proc.stdout is not None
        for raw in iter(proc.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if not line.endswith("\n"):
                line += "\n"
            tail.append(line.rstrip("\n"))
            log.write(line)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        log.write(f"[gpu_check] timeout after {timeout:.0f} s: stopping the stage\n")
        _kill_tree(proc)
    reader.join(timeout=10)  # a grandchild may still hold the pipe; do not wait on it forever
    return Run(proc.returncode, time.monotonic() - t0, timed_out, list(tail))


def last_line(tail: list[str], default: str = "no output") -> str:
    """The line that best says why a stage failed: the last error-looking line, else the last."""
    lines = [t.strip() for t in tail if t.strip() and not t.startswith("[gpu_check]")]
    for t in reversed(lines):
        if re.match(r"^(\w+\.)*\w*(Error|Exception|Exit)\b|^(error|fatal|E )|needs a CUDA GPU|^hatch-autotune: ", t):
            return shorten(t)
    return shorten(lines[-1]) if lines else default


def shorten(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


# --------------------------------------------------------------------------------------------
# The environment probe (run as its own subprocess: `gpu_check.py --probe-env TXT JSON`)


def probe_env(txt: Path, js: Path) -> int:
    info: dict[str, Any] = {}
    lines: list[str] = []

    def add(key: str, value: Any) -> None:
        info[key] = value
        lines.append(f"{key}: {value}")

    def attempt(what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except BaseException as exc:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            add(f"{what} error", f"{type(exc).__name__}: {msg}")
            return None

    add("date", datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat())
    add("host", platform.node())
    add("platform", platform.platform())
    add("python", f"{platform.python_version()} ({sys.executable})")
    site = os.environ.get("GPU_CHECK_SITE", "")
    from importlib.metadata import distribution

    versions: dict[str, str] = {}
    for names in VERSIONS:
        for name in names:
            try:
                dist = distribution(name)
            except Exception:
                continue
            where = str(dist.locate_file(""))
            carried = " (carried)" if site and where.startswith(site) else ""
            versions[name] = dist.version
            lines.append(f"  {name} {dist.version}{carried}")
            break
        else:
            lines.append(f"  {names[0]}: not installed")
    info["versions"] = versions
    try:
        from hatch_autotune import __version__

        add("hatch_autotune", __version__)
    except Exception as exc:
        add("hatch_autotune error", repr(exc))

    smi = shutil.which("nvidia-smi")
    smi_text = "nvidia-smi: not found\n"
    if smi:
        out = attempt("nvidia-smi", lambda: subprocess.run([smi], capture_output=True, text=True, timeout=30))
        if out is not None:
            smi_text = out.stdout + out.stderr
        q = attempt(
            "nvidia-smi query",
            lambda: subprocess.run(
                [smi, "--query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            ),
        )
        if q is not None and q.returncode == 0 and q.stdout.strip():
            add("nvidia-smi gpus", q.stdout.strip().replace("\n", " | "))
            first = [c.strip() for c in q.stdout.strip().splitlines()[0].split(",")]
            if len(first) >= 3:
                info["driver"] = first[2]

    def driver_facts() -> None:
        from cuda.bindings import driver

        err, v = driver.cuDriverGetVersion()
        add("driver CUDA version", f"{v // 1000}.{(v % 1000) // 10}")
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuInit: {err}")
        err, n = driver.cuDeviceGetCount()
        add("cuda devices", int(n))

    attempt("cuda driver", driver_facts)

    def nvrtc() -> None:
        from hatch_autotune.compile import nvrtc as comp

        add("nvrtc", f"{comp.nvrtc_version()} ({comp.nvrtc_build()})")

    attempt("nvrtc", nvrtc)

    def device() -> None:
        from cuda.core import Device

        dev = Device(0)
        dev.set_current()
        cc = dev.compute_capability
        add("gpu", dev.name)
        add("compute capability", f"{cc[0]}.{cc[1]}")

    attempt("cuda.core device", device)

    def arch() -> None:
        from hatch_autotune.plan.devices import detect_gpu_arch

        add("arch", detect_gpu_arch())

    attempt("detect_gpu_arch", arch)

    def cupy() -> None:
        import cupy as cp

        add("cupy devices", cp.cuda.runtime.getDeviceCount())
        add("cupy cuda runtime", cp.cuda.runtime.runtimeGetVersion())

    attempt("cupy", cupy)
    for var in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH", "HATCH_AUTOTUNE_CACHE_DIR", "HATCH_AUTOTUNE_MODE", "HATCH_AUTOTUNE_ARCHS"):
        if os.environ.get(var):
            lines.append(f"env {var}={os.environ[var]}")
    text = "\n".join(lines) + "\n\n--- nvidia-smi ---\n" + smi_text
    txt.write_text(text)
    js.write_text(json.dumps(info, indent=1, sort_keys=True, default=str) + "\n")
    print(text, flush=True)
    if not info.get("arch"):
        why = info.get("cuda.core device error") or info.get("cuda driver error") or "no device answered"
        print(f"no CUDA GPU: {why}", flush=True)
        return 3
    return 0


# --------------------------------------------------------------------------------------------
# The check


class Check:
    def __init__(self, opts: argparse.Namespace):
        self.opts = opts
        self.out: Path = opts.outdir.resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.site = self.work / "site"
        self.bench = self.work / "bench"
        self.t0 = time.monotonic()
        self.started = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()
        self.stages = [Stage(n) for n in STAGES]
        self.env_info: dict[str, Any] = {}
        self.results: dict[str, Any] = {}
        (self.out / "logs.txt").write_text("")
        self.log = Log(self.out / "logs.txt")
        env = dict(os.environ)
        env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", PIP_NO_INDEX="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
        env.setdefault("HATCH_AUTOTUNE_CACHE_DIR", str(self.work / "compile-cache"))
        env.setdefault("CUPY_CACHE_DIR", str(self.work / "cupy-cache"))
        self.env = env
        self._set_pythonpath(site=False)

    def _set_pythonpath(self, site: bool) -> None:
        parts = ([str(self.site)] if site else []) + [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        self.env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
        if site:
            self.env["GPU_CHECK_SITE"] = str(self.site)

    # ---- bookkeeping ----

    def left(self) -> float:
        return self.opts.budget_s - (time.monotonic() - self.t0) - RESERVE_S

    def selected(self, name: str) -> bool:
        if self.opts.skip and name in self.opts.skip:
            return False
        # wheels and env set up every later stage (PYTHONPATH, the GPU's arch): --only keeps them
        return not self.opts.only or name in self.opts.only or name in ("wheels", "env")

    def run(self, stage: Stage, cmd: list[str], env: dict[str, str] | None = None) -> Run:
        full, quick = TIMEOUTS[stage.name]
        timeout = min(quick if self.opts.quick else full, self.left())
        if self.opts.stage_timeout:
            timeout = min(timeout, self.opts.stage_timeout)
        stage.timeout_s, stage.command = round(timeout), cmd
        i = STAGES.index(stage.name) + 1
        self.log.write(
            f"\n===== [{i}/{len(STAGES)}] {stage.name} (timeout {timeout:.0f} s, {self.left():.0f} s of the budget left)\n$ {' '.join(cmd)}\n"
        )
        r = run_command(cmd, env or self.env, timeout, self.log)
        stage.rc, stage.seconds = r.rc, r.seconds
        return r

    def finish(self, stage: Stage, status: str, result: str) -> None:
        stage.status, stage.result = status, shorten(result, 200)
        self.log.write(f"===== {stage.name}: {status} in {stage.seconds:.1f} s: {stage.result}\n")
        self.write_summary(final=False)

    def failed_run(self, r: Run, what: str = "") -> str:
        if r.timed_out:
            return f"timed out after {r.seconds:.0f} s; last output: {last_line(r.tail)}"
        return (what + ": " if what else "") + f"exit {r.rc}: {last_line(r.tail)}"

    # ---- stages ----

    def stage_wheels(self, st: Stage) -> None:
        d = self.opts.wheels
        if not d.is_dir():
            return self.finish(
                st, SKIPPED, f"{d} does not exist: nothing installed (hatchling, platformdirs, kernel_tuner must be importable already)"
            )
        wheels = sorted(d.glob("*.whl"))
        if not wheels:
            return self.finish(st, SKIPPED, f"no wheels in {d}")
        self.site.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--quiet",
            "--target",
            str(self.site),
            *map(str, wheels),
        ]
        r = self.run(st, cmd)
        self._set_pythonpath(site=True)  # even after a partial install: what is there may help
        mib = sum(w.stat().st_size for w in wheels) / 2**20
        if r.rc == 0 and not r.timed_out:
            names = ", ".join(w.name.split("-")[0] for w in wheels)
            return self.finish(st, OK, f"{len(wheels)} wheels ({mib:.1f} MiB) on PYTHONPATH: {names}")
        self.finish(st, FAILED, self.failed_run(r, "pip install"))

    def stage_env(self, st: Stage) -> None:
        js = self.work / "env.json"
        r = self.run(st, [sys.executable, str(Path(__file__).resolve()), "--probe-env", str(self.out / "env.txt"), str(js)])
        if js.exists():
            self.env_info = json.loads(js.read_text())
        i = self.env_info
        if r.rc == 0 and i.get("arch"):
            return self.finish(
                st,
                OK,
                f"{i.get('gpu')} ({i.get('arch')}), driver {i.get('driver', '?')} (CUDA {i.get('driver CUDA version', '?')}), "
                f"NVRTC {i.get('nvrtc', '?')}, cuda-core {i.get('versions', {}).get('cuda-core', '?')}",
            )
        if r.rc == 3:
            return self.finish(st, FAILED, last_line(r.tail))
        self.finish(st, FAILED, self.failed_run(r))

    def stage_tests(self, st: Stage) -> None:
        standin = [] if self.opts.no_standin else sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_standin*.py"))
        files = ["tests/test_gpu.py", "tests/test_gpu_tuning.py", "tests/test_gpu_torch.py", *standin]
        # Every test in the GPU files carries the `gpu` mark; no -m filter, so that the
        # stand-in tests (which need no GPU) run too.
        if self.opts.quick:
            self._pytest(
                st, files, self.out / "junit.xml", ["-k", f"not {DUPLICATE_TEST}"], f" ({DUPLICATE_TEST} left out: the tune stage does it)"
            )
        else:
            self._pytest(st, files, self.out / "junit.xml")

    def stage_showcase(self, st: Stage) -> None:
        """Every config of the showcase kernels compiled and checked against NumPy: a stage of its
        own, as it compiles about 450 variants (its junit stays in the work dir: OUTDIR is full)."""
        self._pytest(st, ["tests/test_gpu_showcase.py", "tests/test_gpu_tensor_core.py"], self.work / "junit-showcase.xml")

    def _pytest(self, st: Stage, files: list[str], junit: Path, extra: Sequence[str] = (), note: str = "") -> None:
        """pytest in one process (one GPU) over `files`, its junit counted into the stage's line
        (`note` appended to it)."""
        junit.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "-q",
            "-rfEs",
            "--durations=5",
            f"--junitxml={junit}",
            *files,
            *extra,
        ]  # one process: one GPU
        r = self.run(st, cmd)
        counts = junit_counts(junit)
        if counts is None:
            return self.finish(st, FAILED, self.failed_run(r, "no junit.xml"))
        passed, failed, errors, skipped, first_fail, first_skip = counts
        line = f"{passed} passed, {failed} failed, {errors} errors, {skipped} skipped{note}"
        if r.timed_out:
            return self.finish(st, FAILED, f"timed out after {r.seconds:.0f} s; {line}")
        if failed or errors or r.rc not in (0,):
            return self.finish(st, FAILED, line + (f"; first: {first_fail}" if first_fail else f"; pytest exit {r.rc}"))
        if passed == 0:
            return self.finish(st, FAILED, line + (f"; nothing ran: {first_skip}" if first_skip else "; nothing ran"))
        self.finish(st, OK, line)

    def stage_wheel(self, st: Stage) -> None:
        """The product's own path (benchmarks/wheel_check.py): `pip wheel` of example_pkg with build
        isolation and no lock, the hook tuning on this GPU; the wheel installed into a fresh venv
        with its run-time dependencies only, every kernel called against NumPy."""
        result = self.work / "wheel.json"
        result.unlink(missing_ok=True)
        cmd = [sys.executable, "benchmarks/wheel_check.py", "--wheels", str(self.opts.wheels), "--out", str(result)]
        r, payload = self._run_for_result(st, cmd, result, "wheel")
        if r.rc == 0 and not r.timed_out and payload is not None:
            return self.finish(st, OK, _line_wheel(payload))
        self.finish(st, FAILED, self.failed_run(r) + (f"; {_line_wheel(payload)}" if payload is not None else ""))

    def _run_for_result(self, st: Stage, cmd: list[str], result: Path, key: str) -> tuple[Run, dict[str, Any] | None]:
        """Run a stage's program, then keep the JSON it wrote (if any, even after a failure) in
        results.json under `key`."""
        r = self.run(st, cmd)
        payload = None
        if result.exists():
            try:
                payload = json.loads(result.read_text())
            except ValueError:
                payload = None
        if payload is not None:
            self.results[key] = payload
            self.write_results()
        return r, payload

    def stage_tune(self, st: Stage) -> None:
        before = _digest(LOCK)
        env = dict(self.env)
        arch = self.env_info.get("arch")
        if arch:
            env["HATCH_AUTOTUNE_ARCHS"] = arch  # the lock entries are per arch; tune for this GPU's
        cmd = [sys.executable, "-m", "hatch_autotune", "tune", "example_pkg"] + (["--mode", "retune"] if self.opts.retune else [])
        r = self.run(st, cmd, env)
        after = _digest(LOCK)
        copied = ""
        (self.out / "autotune.lock.json").unlink(missing_ok=True)
        if after and (after != before or r.rc == 0):
            shutil.copyfile(LOCK, self.out / "autotune.lock.json")
            copied = "; " + lock_summary(LOCK, arch)
        if r.rc == 0 and not r.timed_out:
            return self.finish(st, OK, (last_line(r.tail) if not copied else copied[2:]))
        self.finish(st, FAILED, self.failed_run(r) + (copied + " (partial)" if copied else ""))

    def stage_benchmark(self, st: Stage) -> None:
        name = st.name
        self.bench.mkdir(parents=True, exist_ok=True)
        result = self.bench / f"{name}.json"
        result.unlink(missing_ok=True)
        cmd = [sys.executable, f"benchmarks/{name}.py", "--out", str(self.bench)] + (["--quick"] if self.opts.quick else [])
        r, payload = self._run_for_result(st, cmd, result, name)
        if r.rc == 0 and not r.timed_out and payload is not None:
            try:
                line = BENCH_LINES[name](payload)
            except Exception as exc:  # a summary line must not fail the stage
                line = f"results written ({type(exc).__name__} while summarising)"
            return self.finish(st, OK, line)
        self.finish(st, FAILED, self.failed_run(r))

    # ---- outputs ----

    def write_results(self) -> None:
        payload = {"schema": 1, "created": self.started, "quick": self.opts.quick, "machine": self.env_info, "benchmarks": self.results}
        _atomic(self.out / "results.json", json.dumps(payload, indent=1, sort_keys=True, default=str) + "\n")

    def summary_md(self, final: bool) -> str:
        i = self.env_info
        gpu = f"{i.get('gpu', 'no GPU')} ({i.get('arch') or 'no arch'})"
        head = [
            f"# GPU check: {gpu}",
            "",
            f"- host {i.get('host', platform.node())}, driver {i.get('driver', '?')} (CUDA {i.get('driver CUDA version', '?')}), "
            f"NVRTC {i.get('nvrtc', '?')}, Python {platform.python_version()}",
            f"- started {self.started}, {time.monotonic() - self.t0:.0f} s of a {self.opts.budget_s:.0f} s budget"
            + (", --quick" if self.opts.quick else "")
            + ("" if final else " (still running)"),
            f"- command: `{' '.join(self.opts.argv)}`",
            "",
        ]
        rows = [("stage", "status", "seconds", "result")] + [(s.name, s.status, f"{s.seconds:.1f}", s.result) for s in self.stages]
        w = [max(len(r[c]) for r in rows) for c in range(3)]
        table = [f"| {r[0].ljust(w[0])} | {r[1].ljust(w[1])} | {r[2].rjust(w[2])} | {r[3]} |" for r in rows]
        table.insert(1, f"|{'-' * (w[0] + 2)}|{'-' * (w[1] + 2)}|{'-' * (w[2] + 1)}:|---|")
        bad = [s.name for s in self.stages if s.status == FAILED]
        verdict = f"\n{len(bad)} stage(s) FAILED: {', '.join(bad)}" if bad else "\nall stages ok or skipped"
        files = ", ".join(sorted(p.name for p in self.out.iterdir() if p.is_file()))
        return "\n".join(head + table) + "\n" + verdict + f"\n\nfiles in {self.out}: {files}\n"

    def write_summary(self, final: bool) -> None:
        _atomic(
            self.out / "summary.json",
            json.dumps(
                {
                    "schema": 1,
                    "created": self.started,
                    "final": final,
                    "quick": self.opts.quick,
                    "budget_s": self.opts.budget_s,
                    "seconds": round(time.monotonic() - self.t0, 1),
                    "machine": self.env_info,
                    "stages": [s.to_json() for s in self.stages],
                    "failed": [s.name for s in self.stages if s.status == FAILED],
                },
                indent=1,
                default=str,
            )
            + "\n",
        )
        _atomic(self.out / "summary.md", self.summary_md(final))

    # ---- main ----

    def main(self) -> int:
        self.log.write(f"[gpu_check] {len(STAGES)} stages, budget {self.opts.budget_s:.0f} s, into {self.out}; work dir {self.work}\n")
        handlers = {
            "wheels": self.stage_wheels,
            "env": self.stage_env,
            "tests": self.stage_tests,
            "showcase": self.stage_showcase,
            "tune": self.stage_tune,
            "wheel": self.stage_wheel,
        }
        try:
            for st in self.stages:
                if not self.selected(st.name):
                    self.finish(st, SKIPPED, "not selected (--only/--skip)")
                    continue
                if self.left() < MIN_STAGE_S:
                    self.finish(
                        st,
                        SKIPPED,
                        f"out of time: {self.left() + RESERVE_S:.0f} s of the {self.opts.budget_s:.0f} s budget left; rerun with --only {st.name}",
                    )
                    continue
                try:
                    handlers.get(st.name, self.stage_benchmark)(st)
                except Exception as exc:  # a bug in this script must not lose the other stages
                    self.finish(st, FAILED, f"gpu_check error: {type(exc).__name__}: {exc}")
        finally:
            self.write_summary(final=True)
            self.log.close()
            shutil.rmtree(self.work, ignore_errors=True)
        text = (self.out / "summary.md").read_text()
        print("\n" + text, flush=True)
        return 1 if any(s.status == FAILED for s in self.stages) else 0


def junit_counts(path: Path) -> tuple[int, int, int, int, str, str] | None:
    """(passed, failed, errors, skipped, first failure, first skip reason) from a junit XML."""
    if not path.exists():
        return None
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return None
    passed = failed = errors = skipped = 0
    first_fail = first_skip = ""
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        kinds = {child.tag: child for child in case}
        if "failure" in kinds or "error" in kinds:
            tag = "failure" if "failure" in kinds else "error"
            failed += tag == "failure"
            errors += tag == "error"
            first_fail = first_fail or f"{name}: {shorten(kinds[tag].get('message', ''), 100)}"
        elif "skipped" in kinds:
            skipped += 1
            first_skip = first_skip or shorten(kinds["skipped"].get("message", ""), 100)
        else:
            passed += 1
    return passed, failed, errors, skipped, first_fail, first_skip


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def lock_summary(path: Path, arch: str | None) -> str:
    from hatch_autotune.lock import EntryId, LockFile, LockFormatError

    if not path.exists():
        return f"lock file unreadable: {path}: no such file"
    try:
        lock = LockFile.load(path)  # what the build reads: malformed parts are warnings
    except LockFormatError as exc:  # a newer schema
        return f"lock file unreadable: {exc}"
    mine = {k: e for k, e in lock.entries.items() if not arch or EntryId.parse(k).arch == arch}
    tuned = sum(e.tuned for e in mine.values())
    ignored = f"; {len(lock.warnings)} warning(s), the first: {lock.warnings[0]}" if lock.warnings else ""
    return f"lock: {len(mine)} entries for {arch or 'any arch'}, {tuned} tuned ({len(lock.entries)} in all){ignored}"


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _line_launch(p: dict[str, Any]) -> str:
    """Medians of host µs per call (each loop queued behind a kernel that holds the GPU): the
    generated callable with CuPy arrays and PyTorch tensors against a raw cuLaunchKernel with
    pre-packed arguments, CuPy's RawKernel and cuda.core; the goal; loops the GPU limited."""
    r = p["results"]
    us = {name: s["median"] for name, s in r["us_per_call"].items()}
    ratios = r["ratios"]

    def x(key: str) -> str:
        return f"{ratios[key]['median']:.2f}x" if key in ratios else "n/a"

    generated = ", ".join(f"{label} {us[k]:.2f}" for k, label in (("generated_cupy", "CuPy"), ("generated_torch", "PyTorch")) if k in us)
    line = (
        f"generated {generated} µs/call; raw cuLaunchKernel {us['raw_cuLaunchKernel']:.2f}, CuPy RawKernel {us['cupy_rawkernel']:.2f}, "
        f"cuda.core {us['cuda_core_launch']:.2f}; vs raw {x('generated_cupy_vs_raw')}/{x('generated_torch_vs_raw')}: "
        f"goal {'met' if r['goals']['met'] else 'MISSED'}"
    )
    wrong = [name for name, ok in r.get("correct", {}).items() if not ok]
    if wrong:
        line += f"; WRONG results: {', '.join(wrong)}"
    if r.get("gpu_limited_loops"):
        line += f"; {r['gpu_limited_loops']} of {r['loops']} loops GPU-limited"
    return line


def _line_first_call(p: dict[str, Any]) -> str:
    """Fresh-process medians: the import, the first call split into its parts, with PyTorch
    tensors, CuPy's RawModule; the goals; cuda.core imported by the first call, if it was."""
    r = p["results"]
    torch = r.get("torch")
    line = (
        f"import {r['import_ms']:.1f} ms, first call {r['first_call_ms']:.1f} ms (load {r['module_load_ms']:.1f}, launch {r['launch_ms']:.2f}, "
        f"selection+checks {r['selection_and_checks_ms']:.1f}, sync {r['sync_ms']:.2f}; driver import {r['driver_import_ms']:.1f})"
        + (f", PyTorch {torch['first_call_ms']:.1f}" if torch else "")
        + f"; CuPy RawModule {r['cupy_rawmodule_first_call_ms']:.2f}; goals {'met' if r['goals']['met'] else 'MISSED'}"
    )
    if r.get("cuda_core_imported_by_first_call"):
        line += "; cuda.core imported by the first call"
    return line


def _line_roofline(p: dict[str, Any]) -> str:
    """The streaming-kernel ceiling (and memcpy) at 2 GiB; saxpy and row_softmax at 2 GiB as a
    share of that ceiling, each DRAM byte counted once; the buckets' shares of the ceiling at
    their own sizes; SGEMM against cuBLAS FP32 at 4096³ and 1024³ (cuBLAS time / ours); the
    goals; results found wrong."""
    c = p["ceilings"]

    def share(r: dict[str, Any]) -> str:
        f = r.get("fraction_of_streaming") or {}
        return f"{f['median']:.0%}" if f.get("median") is not None else "n/a"

    big = [r for r in p["rows"] if r["section"] == "2GiB"]
    saxpy = ", ".join(f"{r['dtype']} {share(r)}" for r in big if r["kernel"] == "saxpy")
    softmax = [r for r in big if r["kernel"] == "row_softmax"]
    streaming = f"{c['streaming_GB_per_s']:.0f} GB/s" if c.get("streaming_GB_per_s") else "n/a"
    memcpy = f"{c['memcpy_GB_per_s']:.0f}" if c.get("memcpy_GB_per_s") else "n/a"
    parts = [
        f"streaming ceiling {streaming} ({c.get('streaming_best')}), memcpy {memcpy}",
        f"2 GiB, bytes once, of streaming: saxpy {saxpy or 'n/a'}; row_softmax cols "
        + "/".join(str(r["cols"]) for r in softmax)
        + " "
        + ("/".join(share(r) for r in softmax) or "n/a"),
    ]
    at_size = sorted(
        f["median"] for r in p["rows"] if r["section"] == "bucket" and (f := r.get("fraction_of_streaming_at_size") or {}).get("median")
    )
    if at_size:
        mid = at_size[len(at_size) // 2]
        parts.append(f"buckets of streaming at their own size {at_size[0]:.0%}-{at_size[-1]:.0%} (median {mid:.0%})")
    gemm = {r["m"]: r for r in p["sgemm"] if r.get("headline")}
    vs = [f"{m}³ {gemm[m]['fraction_of_cublas']['median']:.2f}x" for m in (4096, 1024) if m in gemm]
    parts.append(f"sgemm vs cuBLAS {', '.join(vs) or 'n/a'}")
    line = "; ".join(parts) + f"; goals {'met' if p['goals']['met'] else 'MISSED'}"
    wrong = [n for n, v in c["contenders"].items() if v.get("correct") is False]
    wrong += [r["name"] for r in p["rows"] + p["sgemm"] if not r.get("correct")] + sorted(p.get("errors") or {})
    if wrong:
        line += f"; WRONG or failed: {', '.join(wrong[:4])}" + (f" (+{len(wrong) - 4})" if len(wrong) > 4 else "")
    return line


def _line_kt(p: dict[str, Any]) -> str:
    """Per kernel, ours / Kernel Tuner's tuning time (medians): cold, and without compiling (ours on a
    warm compile cache, theirs minus its compile_time); the worst bucket's winner time ratio."""

    def x(v: Any, digits: int = 2) -> str:
        return f"{v:.{digits}f}x" if isinstance(v, (int, float)) else "n/a"

    parts = [
        f"{k['kernel']}: cold {x(k.get('tuning_time_ratio'))}, no-compile {x(k.get('tuning_time_ratio_no_compile'))}, "
        f"winner <= {x(k.get('winner_time_ratio_max'), 3)}"
        for k in p.get("kernels", [])
    ]
    if not parts:
        return "no kernels compared"
    return f"ours/Kernel Tuner, both verifying, median of {p.get('reps', '?')}: " + "; ".join(parts)


def _line_wheel(p: dict[str, Any]) -> str:
    """The build's wall time and what it tuned; the calls in the fresh venv; the step that failed."""
    calls = p.get("calls") or []
    ok_calls = sum(bool(c.get("ok")) for c in calls)
    failed = [n for n, st in (p.get("steps") or {}).items() if not st.get("ok")]
    return (
        f"pip wheel (isolated, no lock) {p.get('build_wall_s') or 0:.1f} s: {p.get('tuned')} entries tuned, "
        f"{p.get('default')} on the default config, lock {p.get('lock_entries')} entries; "
        f"fresh venv: {ok_calls}/{len(calls)} calls right" + (f"; FAILED step(s): {', '.join(failed)}" if failed else "")
    )


def _line_search_live(p: dict[str, Any]) -> str:
    """Per search at 10% (and warm): the worst bucket's winner over exhaustive's and the wall-time
    ratio; the goals."""
    rows = {s["name"]: s for s in p["summaries"]}
    parts = [
        f"{n} worst {rows[n]['worst']:.3f}x, wall {rows[n]['wall_ratio']:.2f}x"
        for n in ("auto 10%", "tpe 10%", "random 10%", "warm auto 10%")
        if n in rows
    ]
    missed = [k for k, ok in p["goals"].items() if not ok]
    return f"exhaustive {p['exhaustive_wall_s']:.0f} s; " + "; ".join(parts) + ("; goals MISSED" if missed else "; goals met")


def _line_tensor_core(p: dict[str, Any]) -> str:
    """gemm against cuBLAS at 4096³ and the skinny shapes (bf16, row-major B), the norms as a
    share of the streaming ceiling and against PyTorch eager; results found wrong."""
    parts = []
    for r in p["rows"]:
        if "vs_cublas" in r and r["dtype"] == "bfloat16" and r["layout"] == "NN" and r.get("vs_cublas"):
            parts.append(f"gemm {r['m']}x{r['n']}x{r['k']} {r['vs_cublas']['median']:.2f}x cuBLAS")
        elif r.get("of_streaming"):
            torch_ratio = (r.get("vs_torch") or {}).get("median")
            parts.append(
                f"{r['kernel']} {r['cols']} {r['of_streaming']['median']:.0%} of streaming"
                + (f", {torch_ratio:.2f}x torch" if torch_ratio else "")
            )
    wrong = p.get("wrong") or []
    return "; ".join(parts or ["no results"]) + (f"; WRONG: {', '.join(wrong)}" if wrong else "")


BENCH_LINES: dict[str, Callable[[dict[str, Any]], str]] = {
    "search_live": _line_search_live,
    "launch_overhead": _line_launch,
    "first_call": _line_first_call,
    "roofline": _line_roofline,
    "tensor_core": _line_tensor_core,
    "tune_vs_kernel_tuner": _line_kt,
}


# --------------------------------------------------------------------------------------------
# --unpack: the fetched OUTDIR -> files to commit


def slug(gpu: str) -> str:
    s = re.sub(r"^nvidia\s+", "", gpu.strip(), flags=re.I).lower()
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-") or "unknown-gpu"


def unpack(src: Path) -> int:
    summary = json.loads((src / "summary.json").read_text())
    machine = summary.get("machine") or {}
    name = slug(str(machine.get("gpu") or "unknown-gpu"))
    stages = {s["name"]: s for s in summary.get("stages", [])}
    written = []
    lock = src / "autotune.lock.json"
    if lock.exists():
        if stages.get("tune", {}).get("status") == OK:
            shutil.copyfile(lock, LOCK)
            written.append(LOCK)
        else:
            print(f"not copying {lock}: the tune stage was {stages.get('tune', {}).get('status')} (a partial lock)", file=sys.stderr)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    if (src / "results.json").exists():
        for bench, payload in json.loads((src / "results.json").read_text()).get("benchmarks", {}).items():
            path = RESULTS_DIR / f"{bench}_{name}.json"
            path.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
            written.append(path)
    md = RESULTS_DIR / f"gpu_check_{name}.md"
    env = (src / "env.txt").read_text() if (src / "env.txt").exists() else "(no env.txt)\n"
    md.write_text((src / "summary.md").read_text() + "\n## Environment\n\n```\n" + env + "```\n")
    written.append(md)
    for p in written:
        print(p.relative_to(ROOT))
    print(f"commit them: git add {' '.join(str(p.relative_to(ROOT)) for p in written)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--probe-env"] and len(argv) == 3:
        return probe_env(Path(argv[1]), Path(argv[2]))
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2]
    )
    ap.add_argument("outdir", type=Path, nargs="?", help="where the evidence goes (flat, at most 7 files); $OUT on the device machine")
    ap.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="carried wheels to install first (default: .whl in the repo)")
    ap.add_argument("--quick", action="store_true", help="smaller benchmark sets; leave out the pytest that the tune stage duplicates")
    ap.add_argument("--retune", action="store_true", help="tune every lock entry again, not only missing or stale ones")
    ap.add_argument(
        "--no-standin", action="store_true", help="leave tests/test_standin*.py (CPU tests of the launch path) out of the tests stage"
    )
    ap.add_argument("--budget-s", type=float, default=560.0, help="the whole run's time limit (default 560)")
    ap.add_argument("--stage-timeout", type=float, default=None, help="cap every stage's timeout at this many seconds")
    ap.add_argument(
        "--only",
        type=lambda s: s.split(","),
        default=None,
        help=f"comma-separated stages to run ({','.join(STAGES)}); wheels and env always run unless --skip names them",
    )
    ap.add_argument("--skip", type=lambda s: s.split(","), default=None, help="comma-separated stages to leave out")
    ap.add_argument(
        "--unpack", type=Path, metavar="FETCHED_OUTDIR", help="copy a fetched OUTDIR's lock file and results into the repo, then exit"
    )
    opts = ap.parse_args(argv)
    if opts.unpack:
        return unpack(opts.unpack)
    if opts.outdir is None:
        ap.error("OUTDIR is required (or --unpack FETCHED_OUTDIR)")
    for picked in (opts.only or []) + (opts.skip or []):
        if picked not in STAGES:
            ap.error(f"no stage named {picked!r}; stages: {', '.join(STAGES)}")
    opts.argv = ["python3", "benchmarks/gpu_check.py", *argv]
    return Check(opts).main()


if __name__ == "__main__":
    sys.exit(main())
