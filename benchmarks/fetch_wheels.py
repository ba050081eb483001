#!/usr/bin/env python3
"""Fetch, where PyPI is reachable, the wheels a lent GPU machine lacks for benchmarks/gpu_check.py.

    python3 benchmarks/fetch_wheels.py [DEST]          # DEST defaults to .whl in the repo (git-ignored)

The GPU machines (see the device tool's KINDS.md) run Python 3.12 with numpy, CuPy, cuda-core,
cuda-bindings, NVRTC, jinja2, pytest, rich, packaging, pathspec, pluggy, attrs, scipy, pandas,
scikit-learn ... and no network. Missing there, and carried as CPython 3.12 manylinux x86_64 (or
pure-Python) wheels, each pinned to one version (PINS below):

- hatchling (the build backend of hatch-autotune and example_pkg) and the part of its
  Requires-Dist the machine lacks: tomlkit, trove-classifiers;
- platformdirs (hatch_autotune.compile.tiers's default cache directory);
- kernel_tuner (benchmarks/tune_vs_kernel_tuner.py, through its CuPy backend, which never imports
  `cuda.cuda`) and the part of its Requires-Dist the machine lacks: python-constraint2,
  xmltodict, jsonschema (+ jsonschema-specifications, referencing, rpds-py). Not carried: pymoo,
  which kernel_tuner imports only for multi-objective tuning, not for brute force.

The command downloads them into DEST (`pip download --no-deps --only-binary=:all: --python-version
3.12 --implementation cp --platform manylinux_2_28_x86_64 ...`), removes other versions of the
pinned projects from DEST (two versions of one project stop the install), checks each wheel's
tags and that every Requires-Dist is carried, on the GPU machine, or deliberately left out, and
keeps the total under --max-mib. Then it VERIFIES the set with a Python 3.12 interpreter
(--python): a fresh venv holding only what the GPU machine provides that the set imports
(ON_GPU_MACHINE, from PyPI), the wheels installed exactly as gpu_check.py installs them
(`pip install --no-index --no-deps --target SITE`), and hatchling, platformdirs, kernel_tuner,
kernel_tuner.backends.cupy and hatch_autotune's hook imported from there, with a small Kernel
Tuner search space solved. Anything missing fails loudly (exit 1).

Then, with the device tool: carry `.whl` and run `python3 benchmarks/gpu_check.py $OUT --wheels .whl`.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PINS = [
    # hatchling 1.33.0 Requires-Dist: packaging, pathspec, pluggy (on the machine), tomlkit, trove-classifiers
    "hatchling==1.33.0",
    "tomlkit==0.15.2",
    "trove-classifiers==2026.9.21.13",
    # hatch_autotune.compile.tiers.default_cache_dir()
    "platformdirs==4.14.7",
    # kernel_tuner 1.5.0 imports cuda.bindings (cuda-python 13), not `from cuda import cuda`; the
    # benchmark uses its CuPy backend anyway. Requires-Dist: numpy, packaging, pandas, scipy,
    # scikit-learn (on the machine), python-constraint2, xmltodict, jsonschema, pymoo (not carried)
    "kernel_tuner==1.5.0",
    "python-constraint2==2.9.0",
    "xmltodict==1.0.4",
    # jsonschema 4.26.0 Requires-Dist: attrs (on the machine), jsonschema-specifications, referencing, rpds-py
    "jsonschema==4.26.0",
    "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0",  # + attrs, typing-extensions (on the machine)
    "rpds-py==2026.9.1",
]

# What the GPU machine already has (KINDS.md's package list) that the carried set may require.
ON_GPU_MACHINE = {
    "numpy",
    "packaging",
    "pathspec",
    "pluggy",
    "attrs",
    "typing-extensions",
    "pandas",
    "scipy",
    "scikit-learn",
    "jinja2",
    "rich",
    "pytest",
    "cupy-cuda13x",
    "cuda-core",
    "cuda-bindings",
    "nvidia-ml-py",
    "matplotlib",
}
# Of those, the ones the verification must install to import the carried set (its stand-in for the machine).
VERIFY_BASE = ["numpy", "packaging", "pathspec", "pluggy", "attrs", "typing-extensions"]
# Requires-Dist left out on purpose, and why.
NOT_CARRIED = {
    "pymoo": "imported by kernel_tuner only for multi-objective tuning (util.get_pareto_results, strategies/pymoo_minimize); "
    "brute force with one objective never imports it, and it would bring a dozen more packages",
}

PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]

# Imported by the verification; each must come from the carried site.
VERIFY_IMPORTS = [
    "hatchling",
    "hatchling.build",
    "hatchling.plugin",
    "hatchling.builders.wheel",
    "tomlkit",
    "trove_classifiers",
    "platformdirs",
    "kernel_tuner",
    "kernel_tuner.interface",
    "kernel_tuner.core",
    "kernel_tuner.searchspace",
    "kernel_tuner.strategies.brute_force",
    "kernel_tuner.backends.cupy",
    "constraint",
    "xmltodict",
    "jsonschema",
    "jsonschema_specifications",
    "referencing",
    "rpds",
]

VERIFY_SCRIPT = r"""
import importlib, os, sys
site, root, mods = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
for name in mods:
    mod = importlib.import_module(name)
    where = getattr(mod, "__file__", "") or ""
    if not where.startswith(site):
        raise SystemExit(f"{name} was imported from {where}, not from the carried wheels in {site}")
    print(f"  import {name}: ok")
from kernel_tuner.searchspace import Searchspace
space = Searchspace({"A": [1, 2, 4], "B": [1, 2]}, lambda p: p["A"] * p["B"] <= 4, 1024)
assert space.size == 5, space.size
print(f"  kernel_tuner Searchspace with a callable restriction (python-constraint2): {space.size} configs, ok")
from kernel_tuner.backends import cupy as kt_cupy
print(f"  kernel_tuner.backends.cupy imported (CuPy here: {kt_cupy.cp is not None})")
sys.path.insert(0, root)
import hatch_autotune.hatch.hooks, hatch_autotune.compile.cache, hatch_autotune.compile.tiers
print(f"  hatch_autotune.hatch.hooks (hatchling hook) ok; default cache dir {hatch_autotune.compile.tiers.default_cache_dir()}")
print("verified: python " + sys.version.split()[0])
"""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(pins: list[str] = PINS) -> list[tuple[str, str]]:
    """[(name, version)]; every pin must be exactly `name==version`, one per project."""
    out, seen = [], set()
    for pin in pins:
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)", pin)
        if not m:
            raise ValueError(f"pin {pin!r} is not name==version")
        if normalize(m[1]) in seen:
            raise ValueError(f"{m[1]} is pinned twice")
        seen.add(normalize(m[1]))
        out.append((m[1], m[2]))
    return out


def wheel_name_version(path: Path) -> tuple[str, str, str]:
    """(normalized name, version, tags) from a wheel's file name."""
    parts = path.name[: -len(".whl")].split("-")
    return normalize(parts[0]), parts[1], "-".join(parts[-3:])


def tags_ok(tags: str) -> bool:
    """Pure Python 3, or CPython 3.12 (or abi3) manylinux x86_64."""
    py, abi, plat = tags.split("-")
    pys = py.split(".")
    if plat == "any":
        return abi == "none" and any(p.startswith("py3") for p in pys)
    right_abi = ("cp312" in pys and abi == "cp312") or (abi == "abi3" and any(p.startswith("cp3") for p in pys))
    return right_abi and all(p.startswith("manylinux") and p.endswith("_x86_64") for p in plat.split("."))


def requires(path: Path) -> list[tuple[str, str]]:
    """(name, requirement line) for every Requires-Dist that applies on CPython 3.12 / Linux x86_64."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    out = []
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a plain interpreter: drop marker lines that name an extra, keep the rest
        Requirement = None
    env = {
        "python_version": "3.12",
        "python_full_version": "3.12.3",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        spec = line.split(":", 1)[1].strip()
        if Requirement is not None:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            out.append((normalize(req.name), spec))
        elif "extra ==" not in spec:
            out.append((normalize(re.match(r"[A-Za-z0-9._-]+", spec)[0]), spec))
    return out


def default_python() -> str | None:
    """The first Python 3.12 that answers: $FETCH_WHEELS_PYTHON, python3.12 on PATH, ~/.pyenv's."""
    for cand in [
        os.environ.get("FETCH_WHEELS_PYTHON"),
        shutil.which("python3.12"),
        *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3")), reverse=True),
    ]:
        if not cand or not os.path.exists(cand):
            continue
        try:
            out = subprocess.run(
                [cand, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == "3.12":
            return cand
    return None


def run(cmd: list[str], **kw) -> None:
    print("$ " + " ".join(c if len(c) < 300 else "<script>" for c in cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def download(dest: Path) -> None:
    pins = parse_pins()
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
    ]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    run([*cmd, "-d", str(dest), *(f"{n}=={v}" for n, v in pins)])


def check(dest: Path, max_mib: float) -> list[Path]:
    pins = {normalize(n): v for n, v in parse_pins()}
    problems, keep = [], []
    for whl in sorted(dest.glob("*.whl")):
        name, version, tags = wheel_name_version(whl)
        if name not in pins:
            print(f"warning: {whl.name} is not pinned here; gpu_check.py installs every wheel in {dest}", file=sys.stderr)
            keep.append(whl)
        elif version != pins[name]:
            print(f"removing {whl.name}: {name} is pinned to {pins[name]}")
            whl.unlink()
        else:
            keep.append(whl)
            if not tags_ok(tags):
                problems.append(f"{whl.name}: tags {tags} do not install on CPython 3.12 manylinux x86_64")
    have = {wheel_name_version(w)[0] for w in keep}
    for name in pins:
        if name not in have:
            problems.append(f"{name}=={pins[name]}: no wheel in {dest}")
    for whl in keep:
        for req, line in requires(whl):
            if req not in pins and req not in ON_GPU_MACHINE and req not in NOT_CARRIED:
                problems.append(f"{whl.name} requires `{line}`: neither carried, nor on the GPU machine, nor left out on purpose")
    total = sum(w.stat().st_size for w in keep)
    print(f"\n{'wheel':<96} {'KiB':>8}")
    for w in keep:
        print(f"{w.name:<96} {w.stat().st_size / 1024:>8.0f}")
    print(f"{len(keep)} wheels, {total / 2**20:.1f} MiB in {dest}")
    for name, why in NOT_CARRIED.items():
        print(f"not carried: {name}: {why}")
    if total > max_mib * 2**20:
        problems.append(f"{total / 2**20:.1f} MiB is over --max-mib {max_mib} (the device tool carries 64 MiB with the repo)")
    if problems:
        raise SystemExit("fetch_wheels: " + "\n  ".join(["the wheel set is not complete:", *problems]))
    return keep


def verify(wheels: list[Path], python: str) -> None:
    """Install the set as gpu_check.py does into a venv that stands in for the GPU machine, import it."""
    print(f"\nverifying with {python}", flush=True)
    with tempfile.TemporaryDirectory(prefix="fetch-wheels-verify-") as tmp:
        venv, site = Path(tmp) / "venv", Path(tmp) / "site"
        run([python, "-m", "venv", str(venv)])
        py = str(venv / "bin" / "python")
        out = subprocess.run(
            [py, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if out != "3.12":
            raise SystemExit(f"fetch_wheels: {python} is Python {out}; the GPU machine runs 3.12 (pass --python)")
        run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *VERIFY_BASE])
        run(
            [
                py,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--target",
                str(site),
                *map(str, wheels),
            ]
        )
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(PYTHONPATH=str(site), HATCH_AUTOTUNE_CACHE_DIR="", PYTHONNOUSERSITE="1")
        try:
            run([py, "-c", VERIFY_SCRIPT, str(site), str(ROOT), ",".join(VERIFY_IMPORTS)], env=env, cwd=tmp)
        except subprocess.CalledProcessError:
            raise SystemExit("fetch_wheels: VERIFICATION FAILED: the carried set does not import on Python 3.12 (see above)") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "dest", nargs="?", type=Path, default=ROOT / ".whl", help="where the wheels go (default: .whl in the repo, git-ignored)"
    )
    ap.add_argument(
        "--python", default=None, help="a Python 3.12 interpreter for the verification (default: python3.12 or ~/.pyenv/versions/3.12*)"
    )
    ap.add_argument("--max-mib", type=float, default=30.0, help="fail if the set is larger (default 30)")
    ap.add_argument("--no-download", action="store_true", help="check and verify what DEST holds")
    ap.add_argument("--no-verify", action="store_true", help="skip the Python 3.12 import check")
    opts = ap.parse_args(argv)
    if not opts.no_download:
        download(opts.dest)
    wheels = check(opts.dest, opts.max_mib)
    if not opts.no_verify:
        python = opts.python or default_python()
        if not python:
            raise SystemExit("fetch_wheels: no Python 3.12 found for the verification; pass --python /path/to/python3.12 (or --no-verify)")
        verify(wheels, python)
    rel = os.path.relpath(opts.dest.resolve(), ROOT)
    print(f'\nready: carry {rel} (device tool: carry=["{rel}"]) and run `python3 benchmarks/gpu_check.py $OUT --wheels {rel}`')
    return 0


if __name__ == "__main__":
    sys.exit(main())
