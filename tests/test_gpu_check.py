"""benchmarks/gpu_check.py on a machine without a GPU (CI), and fetch_wheels.py's pins (no network).

gpu_check is meant for GPU machines: without one, every stage that needs the GPU must say FAILED
with its own reason, the run must go on past the first failure, write its environment file,
summary and logs into a flat OUTDIR, and exit non-zero."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_benchmark

from hatch_autotune.plan.devices import detect_gpu_arch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@pytest.mark.skipif(detect_gpu_arch() is not None, reason="checks gpu_check's behaviour without a GPU")
def test_gpu_check_without_a_gpu_fails_every_gpu_stage_and_goes_on(tmp_path):
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(BENCH / "gpu_check.py"),
        str(out),
        "--quick",
        "--no-standin",
        "--wheels",
        str(tmp_path / "no-wheels-here"),
        "--stage-timeout",
        "45",
        "--budget-s",
        "240",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]

    files = sorted(p.name for p in out.iterdir())
    assert all((out / f).is_file() for f in files), files  # flat
    assert len(files) <= 8, files  # the device tool brings back at most 8 files
    assert {"env.txt", "summary.md", "summary.json", "logs.txt"} <= set(files), files

    env = (out / "env.txt").read_text()
    assert "python:" in env and "cuda-core" in env and "nvidia-smi" in env

    summary = json.loads((out / "summary.json").read_text())
    assert summary["final"] is True
    stages = {s["name"]: s for s in summary["stages"]}
    gpu_stages = [
        "tests",
        "tune",
        "wheel",
        "search_live",
        "showcase",
        "launch_overhead",
        "first_call",
        "roofline",
        "tensor_core",
        "tune_vs_kernel_tuner",
    ]
    assert list(stages) == ["wheels", "env", *gpu_stages]
    assert stages["wheels"]["status"] == "skipped" and "does not exist" in stages["wheels"]["result"]
    assert stages["env"]["status"] == "FAILED" and "no CUDA GPU" in stages["env"]["result"]
    # every later stage still ran, and failed with its own reason (not skipped for want of time)
    for name in gpu_stages:
        st = stages[name]
        assert st["status"] == "FAILED", st
        assert st["result"] and st["command"], st
    for name in ("tests", "showcase"):
        assert "nothing ran" in stages[name]["result"] and "needs a CUDA GPU" in stages[name]["result"], stages[name]
    assert "GPU" in stages["tune"]["result"]  # hatch-autotune's own message
    assert "no CUDA GPU answers" in stages["wheel"]["result"], stages["wheel"]
    for name in ("search_live", "launch_overhead", "first_call", "roofline", "tensor_core", "tune_vs_kernel_tuner"):
        assert "needs a CUDA GPU" in stages[name]["result"], stages[name]
    assert summary["failed"] == ["env", *gpu_stages]

    # the table comes last on stdout, and is the same as summary.md
    md = (out / "summary.md").read_text()
    assert proc.stdout.rstrip().endswith(md.rstrip())
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(stages)
    assert re.search(r"\| tune_vs_kernel_tuner +\| FAILED +\| +[0-9.]+ \| ", md)
    logs = (out / "logs.txt").read_text()
    assert "===== [12/12] tune_vs_kernel_tuner" in logs and "===== tune: FAILED" in logs


def test_gpu_check_rejects_an_unknown_stage(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(BENCH / "gpu_check.py"), str(tmp_path), "--only", "tunes"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "no stage named 'tunes'" in proc.stderr


def test_fetch_wheels_pins_are_exact_and_unique():
    fw = load_benchmark("fetch_wheels")
    pins = fw.parse_pins()
    assert len(pins) == len(fw.PINS) >= 4
    for pin in fw.PINS:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][A-Za-z0-9.+!-]*", pin), pin
    names = [fw.normalize(n) for n, _ in pins]
    assert len(set(names)) == len(names)
    assert {"hatchling", "trove-classifiers", "platformdirs", "kernel-tuner"} <= set(names)
    assert not set(names) & set(fw.ON_GPU_MACHINE), "a package the GPU machine has is carried again"
    for bad in (["hatchling>=1.26"], ["hatchling"], ["hatchling==1.33.0", "Hatchling==1.32.0"]):
        with pytest.raises(ValueError):
            fw.parse_pins(bad)


def test_gpu_check_reads_a_lock_where_the_package_is_not_installed(tmp_path):
    """On a GPU machine hatch-autotune is not installed: gpu_check imports it from the checkout
    (`-S`: no site-packages, so the editable install here is not seen either). Without that, the
    tune stage's summary failed on an H200 with ModuleNotFoundError."""
    script = (
        "import runpy, sys\nfrom pathlib import Path\n"
        f"m = runpy.run_path({str(BENCH / 'gpu_check.py')!r}, run_name='probe')\n"
        f"print(m['lock_summary'](Path({str(ROOT / 'example_pkg' / 'autotune.lock.json')!r}), 'sm_90'))\n"
    )
    proc = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "lock: 30 entries for sm_90, 30 tuned (30 in all)"


def test_roofline_line_summarises_what_roofline_writes():
    """roofline.py's result, built by its own functions from made-up timings (no GPU), summarised
    by gpu_check's one line: the streaming ceiling, the 2 GiB shares with bytes counted once, and
    SGEMM against cuBLAS at 4096³ and 1024³; a wrong result is named."""
    rl, gc = load_benchmark("roofline"), load_benchmark("gpu_check")
    big, rounds = 2 << 30, (1.0, 0.98, 1.03)
    meta, samples, checks = {}, {}, {}

    def add(name, gb_per_s, **m):
        meta[name] = m
        samples[name] = [m["bytes"] / (gb_per_s * 1e6) * j for j in rounds]  # ms at that rate
        checks[name] = {"ok": True}

    add("memcpy_d2d", 4150, kind="memcpy", section="2GiB", bytes=2 * big)
    add("stream:chunk_b256_u4", 4600, kind="streaming", section="2GiB", bytes=2 * big, shape={})
    sel = {"config": {"BLOCK": 256}, "tuned": True, "bucket": {}}
    add("saxpy float32 n=536870912", 4370, kind="saxpy", section="2GiB", dtype="float32", n=big // 4, bytes=3 * big, **sel)
    for cols in (128, 1024, 8192):
        add(
            f"row_softmax {big // (cols * 4)}x{cols}",
            4186,
            kind="row_softmax",
            section="2GiB",
            rows=big // (cols * 4),
            cols=cols,
            bytes=2 * big,
            **sel,
        )
    add("bucket saxpy float32 n=4096", 14, kind="saxpy", section="bucket", dtype="float32", n=4096, bytes=3 * 4096 * 4, **sel)
    # the ceiling at the bucket's size: two streaming shapes moving its bytes (one wrong), and the launch floor
    add("at size 49152 B stream:chunk_b256_u4", 20, kind="streaming_at_size", section="bucket", bytes=3 * 4096 * 4)
    add("at size 49152 B stream:gs_b512_4perSM_u1", 40, kind="streaming_at_size", section="bucket", bytes=3 * 4096 * 4)
    checks["at size 49152 B stream:gs_b512_4perSM_u1"] = {"ok": False}  # a wrong copy is no ceiling
    meta[rl.FLOOR_NAME], samples[rl.FLOOR_NAME] = {"kind": "launch_floor", "section": "bucket"}, [0.002 * j for j in rounds]
    for size, ours, theirs in ((1024, 0.025, 0.020), (4096, 4.3, 2.7)):
        meta[f"sgemm {size}"] = {"kind": "sgemm", "peer": f"cublas {size}", "m": size, "n": size, "k": size, "headline": True, **sel}
        meta[f"cublas {size}"] = {"kind": "cublas"}
        samples[f"sgemm {size}"], samples[f"cublas {size}"] = [ours * j for j in rounds], [theirs * j for j in rounds]
        checks[f"sgemm {size}"] = {"ok": size == 1024, "rel_err_vs_cublas": 1e-6 if size == 1024 else 0.5}
    ceil = rl.ceilings(meta, samples, {n: True for n in meta})
    rows, sgemm = rl.memory_rows(meta, samples, checks, ceil), rl.gemm_rows(meta, samples, checks)
    payload = {
        "ceilings": ceil,
        "rows": rows,
        "sgemm": sgemm,
        "goals": rl.goals(rows, sgemm, ceil),
        "errors": {},
        "parameters": {"big_bytes": big},
    }
    json.dumps(payload)  # what write_result writes

    (bucket,) = (r for r in rows if r["section"] == "bucket")
    assert bucket["streaming_at_size_best"] == "at size 49152 B stream:chunk_b256_u4"
    assert bucket["fraction_of_streaming_at_size"] == pytest.approx({"median": 0.7, "min": 0.7, "max": 0.7})
    assert bucket["over_launch_floor"] == pytest.approx(49152 / 14e6 / 0.002)
    assert bucket["launch_floor_bound_GB_per_s"] == pytest.approx(49152 / 0.002 / 1e6)
    assert "  launch floor (an empty kernel, the L2 flushed before it, timed alone): 2.00 us" in rl.table(payload)

    line = gc._line_roofline(payload)
    assert "; buckets of streaming at their own size 70%-70% (median 70%); " in line, line
    assert line.startswith("streaming ceiling 4600 GB/s (stream:chunk_b256_u4), memcpy 4150; "), line
    assert "saxpy float32 95%" in line and "row_softmax cols 128/1024/8192 91%/91%/91%" in line, line
    assert "sgemm vs cuBLAS 4096³ 0.63x, 1024³ 0.80x" in line and "goals MISSED" in line, line
    assert line.endswith("WRONG or failed: sgemm 4096"), line
    assert payload["goals"]["checks"] == {
        "saxpy float32 n=536870912": True,
        "row_softmax 4194304x128": True,
        "row_softmax 524288x1024": True,
        "row_softmax 65536x8192": True,
        "sgemm 1024^3": True,
        "sgemm 4096^3": False,
    }
    text = rl.table(payload)
    assert "<- streaming ceiling" in text and "bucket saxpy float32 n=4096" in text and "WRONG" in text


def test_tensor_core_line_summarises_what_tensor_core_writes():
    """tensor_core.py's rows, built by its own `rows_of` from made-up timings (no GPU): gemm as
    our rate over cuBLAS's, the norms as a share of the fastest correct streaming shape (bytes
    counted once) and against PyTorch eager; gpu_check's line says each, and names a wrong one."""
    tc, gc = load_benchmark("tensor_core"), load_benchmark("gpu_check")
    big, rounds = tc.BIG_BYTES, (1.0, 0.98, 1.03)
    meta, samples, checks = {}, {}, {}
    samples["stream:fast"], checks["stream:fast"] = [2 * big / 4.0e9 * j for j in rounds], {"ok": True}  # 4000 GB/s
    samples["stream:wrong"], checks["stream:wrong"] = [1e-3 * j for j in rounds], {"ok": False}  # faster, but wrong: no ceiling
    meta["stream:fast"] = meta["stream:wrong"] = {"kind": "streaming", "bytes": 2 * big}
    gemm = {"m": 4096, "n": 4096, "k": 4096, "dtype": "bfloat16", "layout": "NN", "flop": 2.0 * 4096**3}
    meta["gemm a"] = {**gemm, "kind": "gemm", "peer": "cublas a"}
    meta["cublas a"] = {**gemm, "kind": "cublas"}
    samples["gemm a"], samples["cublas a"] = [0.25 * j for j in rounds], [0.2 * j for j in rounds]
    checks["gemm a"] = {"ok": True}
    norm = {"rows": 131072, "cols": 8192, "dtype": "bfloat16", "kernel": "rmsnorm", "bytes": 2 * big}
    meta["rmsnorm 8192"], meta["torch rmsnorm 8192"] = {**norm, "kind": "ours"}, {**norm, "kind": "torch"}
    samples["rmsnorm 8192"] = [2 * big / 3.6e9 * j for j in rounds]  # 3600 GB/s: 90% of 4000
    samples["torch rmsnorm 8192"] = [2 * big / 1.8e9 * j for j in rounds]
    checks["rmsnorm 8192"] = {"ok": False}
    rows, ceiling = tc.rows_of(meta, samples, checks)
    assert ceiling["name"] == "stream:fast"
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {"gemm a", "rmsnorm 8192"}
    assert abs(by_name["gemm a"]["vs_cublas"]["median"] - 0.8) < 1e-9
    assert abs(by_name["gemm a"]["tflops"]["median"] - 2.0 * 4096**3 / 0.25 / 1e9) < 1e-6
    assert abs(by_name["rmsnorm 8192"]["of_streaming"]["median"] - 0.9) < 1e-9
    assert abs(by_name["rmsnorm 8192"]["vs_torch"]["median"] - 2.0) < 1e-9
    line = gc._line_tensor_core({"rows": rows, "wrong": ["rmsnorm 8192"]})
    assert line == "gemm 4096x4096x4096 0.80x cuBLAS; rmsnorm 8192 90% of streaming, 2.00x torch; WRONG: rmsnorm 8192", line
