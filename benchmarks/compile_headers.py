"""Compile throughput with the toolkit's headers: NVRTC's precompiled headers against none, and
our compile path against a bare NVRTC loop with the same options (goal: >= 2x faster with PCH
than without; within 1.1x of the bare loop).

The kernel: tests/consumers/llm_kit's RMSNorm (cuda_bf16.h + CUB's BlockReduce), its space
widened to 20 variants (BLOCK 64-1024 x VEC 1-8), for sm_90. Each contender compiles all 20
in a fresh interpreter (a PCH lives as long as its process), serially (one core: the pool's
workers each build their own PCH, so the ratio per worker is the same), without the compile
cache. Contenders, interleaved and rotated, `--reps` (default 3) repetitions, medians:
  - ours, PCH:     compile_all(jobs, cache=None, workers=1) (adds -pch on the main thread)
  - ours, no PCH:  the same with HATCH_AUTOTUNE_PCH=0
  - bare NVRTC:    nvrtcCreateProgram/CompileProgram/GetCUBIN in a loop with the same command
                   line (our options, the bundle's include option, -pch), its PCH heap sized up
                   front as ours is (left at NVRTC's 256 MiB, the first PCH does not fit and one
                   more variant compiles without it: 20.2 s against ours 16.5 s in a first run)
Every contender's cubins are hashed: all three must give the same 20 binaries.

    python benchmarks/compile_headers.py [--reps 3] [--out DIR]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from _common import ROOT, machine, options, spread, write_result

CHILD = r"""
import hashlib, json, os, sys, time
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from pathlib import Path
from conftest import load_project
from hatch_autotune.compile.render import render_kernel
from hatch_autotune.compile import nvrtc as ours
import dataclasses

project = load_project(Path({project!r}))
spec = project.kernels["rmsnorm"]
spec = dataclasses.replace(spec, space={{"BLOCK": (64, 128, 256, 512, 1024), "VEC": (1, 2, 4, 8)}})
(variants,) = render_kernel(spec).values()
jobs = [v.compile_job("sm_90", spec.entry, spec.nvrtc_options) for v in variants]
assert len(jobs) == 20, len(jobs)
ours.ensure_nvrtc()
mode = {mode!r}
t0 = time.perf_counter()
if mode == "bare":
    from cuda.bindings import nvrtc
    from hatch_autotune.compile.pch import PCH_HEAP_BYTES
    nvrtc.nvrtcSetPCHHeapSize(PCH_HEAP_BYTES)  # sized up front as ours is: fair to the bare loop
    binaries = []
    for job in jobs:
        err, prog = nvrtc.nvrtcCreateProgram(job.source.encode(), f"{{job.entry}}.cu".encode(), 0, [], [])
        opts = [o.encode() for o in job.command_line(precompiled=True)]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        assert result == nvrtc.nvrtcResult.NVRTC_SUCCESS, result
        if nvrtc.nvrtcGetPCHCreateStatus(prog)[0] == nvrtc.nvrtcResult.NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED:
            nvrtc.nvrtcSetPCHHeapSize(nvrtc.nvrtcGetPCHHeapSizeRequired(prog)[1] + (16 << 20))
        n = nvrtc.nvrtcGetProgramLogSize(prog)[1]; log = bytearray(n); nvrtc.nvrtcGetProgramLog(prog, log)
        cubin = bytearray(nvrtc.nvrtcGetCUBINSize(prog)[1]); nvrtc.nvrtcGetCUBIN(prog, cubin)
        nvrtc.nvrtcDestroyProgram(prog)
        binaries.append(bytes(cubin))
else:
    results = ours.compile_all(jobs, None, workers=1)
    assert all(r.ok for r in results), [r.log for r in results if not r.ok]
    binaries = [r.binary for r in results]
elapsed = time.perf_counter() - t0
print(json.dumps({{"seconds": elapsed, "binaries": hashlib.sha256(b"".join(hashlib.sha256(b).digest() for b in binaries)).hexdigest()}}))
"""

CONTENDERS = {"ours_pch": ("ours", "1"), "ours_no_pch": ("ours", "0"), "bare_nvrtc_pch": ("bare", "1")}


def run_once(name: str) -> dict[str, float | str]:
    mode, pch = CONTENDERS[name]
    code = CHILD.format(root=str(ROOT), tests=str(ROOT / "tests"), project=str(ROOT / "tests" / "consumers" / "llm_kit"), mode=mode)
    env = {**os.environ, "HATCH_AUTOTUNE_PCH": pch}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = options(__doc__)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    reps = 2 if args.quick else args.reps
    names = list(CONTENDERS)
    samples: dict[str, list[float]] = {n: [] for n in names}
    hashes: dict[str, set[str]] = {n: set() for n in names}
    for rep in range(reps):
        order = names[rep % len(names) :] + names[: rep % len(names)]  # rotated: no contender always first
        for name in order:
            t = time.perf_counter()
            result = run_once(name)
            samples[name].append(float(result["seconds"]))
            hashes[name].add(str(result["binaries"]))
            print(f"rep {rep + 1}/{reps} {name}: {result['seconds']:.2f} s (process {time.perf_counter() - t:.1f} s)", flush=True)
    medians = {n: statistics.median(v) for n, v in samples.items()}
    same = len(set().union(*hashes.values())) == 1
    payload = {
        "benchmark": "compile_headers",
        "machine": machine(),
        "kernel": "llm_kit rmsnorm (cuda_bf16.h + cub BlockReduce), 20 variants, sm_90, one process each, serial",
        "cores": os.cpu_count(),
        "samples_s": samples,
        "spread_s": {n: spread(v) for n, v in samples.items()},
        "median_s": medians,
        "pch_speedup": medians["ours_no_pch"] / medians["ours_pch"],
        "ours_vs_bare": medians["ours_pch"] / medians["bare_nvrtc_pch"],
        "same_binaries": same,
        "goals": {"pch_speedup_at_least": 2.0, "ours_vs_bare_at_most": 1.1},
    }
    payload["met"] = payload["pch_speedup"] >= 2.0 and payload["ours_vs_bare"] <= 1.1 and same
    labels = {
        "ours_pch": "hatch-autotune, precompiled headers",
        "ours_no_pch": "hatch-autotune, `HATCH_AUTOTUNE_PCH=0`",
        "bare_nvrtc_pch": "a bare NVRTC loop, same options and `-pch`",
    }
    rows = [f"| {labels[n]} | {medians[n]:.1f} s | {min(samples[n]):.1f}-{max(samples[n]):.1f} s |" for n in names]
    payload["table"] = "\n".join(
        [
            "| 20 variants, serial | median | range |",
            "|---|---|---|",
            *rows,
            f"| PCH speedup (goal >= 2x) | {payload['pch_speedup']:.2f}x | |",
            f"| ours / bare NVRTC (goal <= 1.1x) | {payload['ours_vs_bare']:.3f}x | |",
        ]
    )
    path = write_result("compile_headers_cpu.json", payload, args.out)
    print(
        f"PCH speedup {payload['pch_speedup']:.2f}x (goal >= 2), ours vs bare {payload['ours_vs_bare']:.3f}x (goal <= 1.1), "
        f"same binaries: {same} -> {path}"
    )


if __name__ == "__main__":
    main()
