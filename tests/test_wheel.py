"""End to end, as a user runs it: hatch-autotune built into a wheel, example_pkg built with
`pip wheel` (build isolation, hatch-autotune from that local wheel), the result installed in a
fresh virtual environment that has only the run-time dependencies. No GPU: selection, file
integrity and import are checked; launching is not."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from conftest import copy_example, pip_constraints
from cuda_standin import cubin_sm

from hatch_autotune.runtime import parse_arch

pytestmark = pytest.mark.slow


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def pip_env(plugin_dist: Path, cache: Path, tmp: Path) -> dict[str, str]:
    """pip finds hatch-autotune in `plugin_dist`; its build environments get this environment's
    hatchling and NVRTC (so that a build here and one in isolation agree, and share the cache)."""
    env = {
        **os.environ,
        "HATCH_AUTOTUNE_CACHE_DIR": str(cache),
        "PIP_FIND_LINKS": str(plugin_dist),
        "PIP_CONSTRAINT": str(pip_constraints(tmp / "constraints.txt")),
    }
    env.pop("HATCH_AUTOTUNE_MODE", None)
    return env


def pip_wheel_example(env: dict, out: Path, src: Path, isolated: bool = True) -> tuple[Path, str]:
    copy_example(src)
    flags = [] if isolated else ["--no-build-isolation"]  # no isolation: this environment's hatchling and hatch-autotune
    proc = run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", *flags, "-w", str(out), str(src)], env=env)
    wheels = list(out.glob("example_pkg-*.whl"))
    assert len(wheels) == 1
    return wheels[0], proc.stdout + proc.stderr


def fresh_venv(path: Path) -> Path:
    """A virtual environment without pip (pip runs from here with --python: seconds faster)."""
    run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    return path / "bin" / "python"


def pip_into(py: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", *args], env=env)


@pytest.fixture(scope="module")
def example_wheels(plugin_dist, session_cache, tmp_path_factory):
    """example_pkg built twice from one lock file, in two source trees: as a user builds it (pip,
    build isolation, hatch-autotune from its wheel), then without isolation (hatch-autotune of
    this checkout) from the compile cache the first build filled."""
    tmp = tmp_path_factory.mktemp("example")
    env = pip_env(plugin_dist, session_cache, tmp)
    first, log1 = pip_wheel_example(env, tmp / "out1", tmp / "src1")
    second, log2 = pip_wheel_example(env, tmp / "out2", tmp / "src2", isolated=False)
    return first, second, log1, log2


def test_wheel_is_pure_and_reproducible(example_wheels):
    first, second, log1, log2 = example_wheels
    assert first.name == "example_pkg-0.1.0-py3-none-any.whl"
    assert first.read_bytes() == second.read_bytes()  # same lock file -> byte-identical wheels
    # example_pkg's committed lock has sm_90 winners for all 30 entries (tuned on an H200,
    # benchmarks/results/gpu_runs/h200_2026-11-26_run4); sm_80 has none. Its 18 sgemm entries are
    # stale since split-K joined sgemm's space: those run the default until a GPU re-tunes them.
    totals = re.search(
        r"hatch-autotune: in all, (\d+) variant binaries compiled, (\d+) from the cache, (\d+) failed; (\d+) shipped in the wheel", log2
    )
    assert totals and totals[1] == totals[3] == "0" and int(totals[4]) >= 12, log2[-2000:]
    assert "compiling" not in log2  # everything from the cache: no progress lines
    # untuned entries grouped per kernel and reason: a count and a few of them (the wheel's record has all)
    assert (
        "warning: saxpy: 6 untuned entries use the default config (no lock entry): "
        "saxpy|T=float32|sm_80|n=4096, saxpy|T=float32|sm_80|n=262144, saxpy|T=float32|sm_80|n=16777216 and 3 more"
    ) in log1
    assert "warning: sgemm: 36 untuned entries use the default config (no lock entry): sgemm|-|sm_80|m=256,n=256,k=256, " in log1
    assert (
        "warning: sgemm: 18 untuned entries use the default config (stale lock entry (checksum mismatch)): sgemm|-|sm_90|m=256,n=256,k=256, "
    ) in log1
    assert "hatch-autotune: 12 entries use tuned winners from autotune.lock.json" in log1
    assert (
        "hatch-autotune: 426 entries: 12 tuned, 402 on the default config, 12 on a fallback (an arch-specific target's plain arch's "
        "winner, or the default config does not compile or may not run at that bucket and arch)"
    ) in log1
    assert (
        "warning: saxpy: 6 untuned entries use a fallback config (no lock entry; sm_90's tuned winner of the bucket): "
        "saxpy|T=float32|sm_90a|n=4096, "
    ) in log1
    # the tensor-core kernels: no lock entry yet (not tuned on a GPU), both archs on their defaults
    assert "warning: gemm: 192 untuned entries use the default config (no lock entry): " in log1
    assert "warning: rmsnorm: 72 untuned entries use the default config (no lock entry): " in log1
    assert f"`hatch-autotune show {first.name}`" in log1


def test_wheel_ships_exactly_the_referenced_binaries_each_valid(example_wheels):
    wheel = example_wheels[0]
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        table = json.loads(zf.read("example_pkg/kernels/table.json"))
        init = zf.read("example_pkg/kernels/__init__.py").decode()
        assert hashlib.sha256(zf.read("example_pkg/kernels/table.json")).hexdigest() in init
        assert "example_pkg/kernels/_runtime/__init__.py" in names and "example_pkg/kernels/_runtime/kernel.py" in names
        referenced = set()
        for kname, kernel in table["kernels"].items():
            used = {e["variant"] for per_arch in kernel["select"].values() for entries in per_arch.values() for e in entries}
            assert used == set(kernel["variants"]), kname  # no unreferenced variants either
            for _vid, variant in kernel["variants"].items():
                for arch, info in variant["binaries"].items():
                    data = zf.read(f"example_pkg/kernels/{info['file']}")
                    assert hashlib.sha256(data).hexdigest() == info["sha256"]
                    kind, major, minor, _ = parse_arch(arch)
                    if kind == "sm":
                        assert cubin_sm(data) == major * 10 + minor, info["file"]
                    else:
                        assert data.startswith(b"//") and f".target sm_{major}{minor}".encode() in data
                    referenced.add(f"example_pkg/kernels/{info['file']}")
        shipped = {n for n in names if n.startswith("example_pkg/kernels/bin/")}
        assert shipped == referenced
        assert table["archs"] == ["sm_80", "sm_90", "sm_90a"] and table["ptx"] == {"sm_90": "compute_90"}
        assert set(table["kernels"]) == {"saxpy", "row_softmax", "sgemm", "gemm", "rmsnorm", "add_rmsnorm"}
        outcome = json.loads(zf.read("example_pkg/kernels/outcome.json"))
    # the build's outcome, recorded: every entry of the table, why it is untuned, nothing failed
    selected = {
        (k, t, a, tuple(e["bucket"]))
        for k, kernel in table["kernels"].items()
        for t, per in kernel["select"].items()
        for a, es in per.items()
        for e in es
    }
    assert len(outcome["entries"]) == len(selected) == 426
    by_arch = {(e["id"].split("|")[2], e["status"], e["reason"]) for e in outcome["entries"]}
    inherited = ("sm_90a", "fallback", "no lock entry; sm_90's tuned winner of the bucket")
    stale = ("sm_90", "default", "stale lock entry (checksum mismatch)")  # sgemm's: its space grew split-K
    assert by_arch == {
        ("sm_80", "default", "no lock entry"), ("sm_90", "tuned", ""), ("sm_90", "default", "no lock entry"),
        ("sm_90a", "default", "no lock entry"), inherited, stale,
    }, by_arch  # fmt: skip
    assert {e["id"].split("|")[0] for e in outcome["entries"] if (e["id"].split("|")[2], e["status"], e["reason"]) == stale} == {"sgemm"}
    fallback = {e["id"].split("|")[0] for e in outcome["entries"] if e["status"] == "fallback"}
    assert fallback == {"saxpy", "row_softmax"}  # the kernels sm_90 has valid winners of
    for kname in fallback:  # and each sm_90a entry runs sm_90's winner of its bucket
        for per in table["kernels"][kname]["select"].values():
            assert {tuple(e["bucket"]): e["variant"] for e in per["sm_90a"]} == {tuple(e["bucket"]): e["variant"] for e in per["sm_90"]}
    untuned_sm_90 = {e["id"].split("|")[0] for e in outcome["entries"] if e["status"] == "default" and e["id"].split("|")[2] == "sm_90"}
    assert untuned_sm_90 == {"gemm", "rmsnorm", "add_rmsnorm", "sgemm"}
    assert {e["id"].split("|")[0] for e in outcome["entries"] if e["status"] == "tuned"} == {"saxpy", "row_softmax"}
    assert outcome["failures"] == [] and outcome["shipped"] == len(shipped) >= 12


CHECK_SCRIPT = textwrap.dedent(
    """
    import importlib.util, json, sys, time
    t0 = time.perf_counter()
    from example_pkg import kernels
    import_ms = (time.perf_counter() - t0) * 1e3
    out = {"import_ms": import_ms, "cuda_loaded": any(m.startswith("cuda") for m in sys.modules)}
    out["absent"] = [m for m in ("hatch_autotune", "jinja2", "hatchling") if importlib.util.find_spec(m) is None]
    sel = []
    for arch in ("sm_80", "sm_90", "sm_86", "sm_89", "sm_100", "sm_120"):
        for n in (1, 4096, 5000, 262144, 10**6, 2**24, 2**30):
            for T in ("float32", "float16"):
                s = kernels.saxpy.select(arch=arch, n=n, T=T)
                sel.append(["saxpy", arch, n, T, s.bucket["n"], s.arch, s.binary, s.tuned, len(kernels.saxpy.binary(s))])
        for rows, cols in ((1, 1), (256, 128), (300, 129), (10**5, 10**5)):
            s = kernels.row_softmax.select(arch=arch, rows=rows, cols=cols)
            sel.append(["row_softmax", arch, [rows, cols], s.bucket, s.arch, s.binary])
        s = kernels.sgemm.select(arch=arch, m=2000, n=3, k=4096)
        sel.append(["sgemm", arch, s.bucket, s.config, s.binary])
    out["selections"] = sel
    try:
        kernels.saxpy.select(arch="sm_75", n=1, T="float32")
    except RuntimeError as e:
        out["sm_75"] = str(e)
    print(json.dumps(out))
    """
)


TORCH_SCRIPT = """
import torch
from example_pkg.kernels import torch_ops
print(torch.ops.example_pkg.sgemm.default._schema)
print(list(torch_ops.sgemm(torch.empty(300, 7, device="meta"), torch.empty(7, 40, device="meta")).shape))
print(torch_ops.__file__.endswith("site-packages/example_pkg/kernels/torch_ops.py"))
"""


def test_installs_and_selects_in_a_fresh_runtime_only_venv(example_wheels, tmp_path):
    py = fresh_venv(tmp_path / "venv")
    pip_into(py, str(example_wheels[0]))
    proc = run([str(py), "-c", CHECK_SCRIPT], cwd=tmp_path)
    out = json.loads(proc.stdout)
    assert out["absent"] == ["hatch_autotune", "jinja2", "hatchling"]
    assert out["cuda_loaded"] is False  # importing touched no CUDA library
    by = {}
    for row in out["selections"]:
        by.setdefault(row[0], []).append(row)
    saxpy = {(r[1], r[2], r[3]): r for r in by["saxpy"]}
    # on, between and outside the buckets (nearest in log2, clamped)
    assert saxpy[("sm_90", 1, "float32")][4] == 4096
    assert saxpy[("sm_90", 4096, "float32")][4] == 4096
    assert saxpy[("sm_90", 5000, "float16")][4] == 4096
    assert saxpy[("sm_90", 10**6, "float32")][4] == 262144
    assert saxpy[("sm_90", 2**24, "float32")][4] == 2**24
    assert saxpy[("sm_90", 2**30, "float32")][4] == 2**24
    # arch fallback: 8.6/8.9 run sm_80 cubins, 10.0/12.0 JIT the sm_90 PTX
    assert saxpy[("sm_86", 1, "float32")][5:7] == ["sm_80", "sm_80"]
    assert saxpy[("sm_89", 1, "float32")][5:7] == ["sm_80", "sm_80"]
    assert saxpy[("sm_90", 1, "float32")][5:7] == ["sm_90a", "sm_90a"]  # 9.0 runs the arch-specific cubins first
    assert saxpy[("sm_120", 1, "float32")][5:7] == ["sm_90", "compute_90"]
    # tuned where the sm_90 entries serve (newer GPUs through its PTX; 9.0 runs sm_90a's entries, untuned:
    # sm_90's winners, inherited), binaries load
    assert all(r[7] is (r[5] == "sm_90") and r[8] > 0 for r in by["saxpy"])
    softmax = {(r[1], tuple(r[2])): r for r in by["row_softmax"]}
    assert softmax[("sm_90", (300, 129))][3] == {"rows": 256, "cols": 1024}  # cols maps by ceil
    assert softmax[("sm_90", (10**5, 10**5))][3] == {"rows": 16384, "cols": 8192}
    assert by["sgemm"][0][2] == {"m": 1024, "n": 256, "k": 4096}
    assert "compute capability 7.5" in out["sm_75"]
    # the PyTorch operators: said to need PyTorch where it is missing; with this environment's
    # PyTorch on the path (a .pth file: the directory alone, not its own .pth files), registered
    missing = subprocess.run([str(py), "-c", "from example_pkg.kernels import torch_ops"], cwd=tmp_path, capture_output=True, text=True)
    assert missing.returncode == 1 and "ImportError: the kernels' PyTorch operators need PyTorch 2.4 or newer" in missing.stderr
    import torch

    purelib = run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    (Path(purelib) / "outer.pth").write_text(str(Path(torch.__file__).parents[1]) + "\n")
    shapes = run([str(py), "-c", TORCH_SCRIPT], cwd=tmp_path).stdout.split()
    assert shapes == ["example_pkg::sgemm(Tensor", "A,", "Tensor", "B)", "->", "Tensor", "[300,", "40]", "True"]


def test_editable_install_generates_in_tree(plugin_dist, session_cache, tmp_path):
    src = copy_example(tmp_path / "example")
    py = fresh_venv(tmp_path / "venv")
    env = pip_env(plugin_dist, session_cache, tmp_path)
    pip_into(py, "-e", str(src), env=env)  # build isolation, hatch-autotune from its wheel
    generated = src / "src" / "example_pkg" / "kernels"
    assert (generated / "table.json").is_file() and (generated / ".gitignore").read_text().endswith("*\n")
    proc = run(
        [str(py), "-c", "from example_pkg import kernels; print(kernels.sgemm.select(arch='sm_90', m=1, n=1, k=1).bucket)"], cwd=tmp_path
    )
    assert proc.stdout.strip() == "{'m': 256, 'n': 256, 'k': 256}"
    # A regular wheel built from the same tree would pack the in-tree copy a second time: refused.
    wheel = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "w"), str(src)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert wheel.returncode != 0
    assert "holds the generated package of an editable install" in wheel.stdout + wheel.stderr
    assert not (tmp_path / "w").exists() or not list((tmp_path / "w").glob("*.whl"))
