#!/usr/bin/env python3
"""The product's real path on a GPU machine without network, checked end to end.

    python3 benchmarks/wheel_check.py --wheels DIR --out FILE.json [--work DIR] [--keep-lock PATH]
                                      [--timeout 400] [--step-timeout 240]

Steps (each one must pass for the next to run; exit 0 only if all pass, 1 otherwise; FILE.json
is written after every step, so a run cut short still says how far it got):

  gpu         a CUDA GPU answers (cuda.bindings, in this process): without one the build cannot
              tune and the kernels cannot be called, so nothing here could be proved
  plugin      hatch-autotune's wheel built from this checkout (`pip wheel --no-build-isolation`:
              hatchling comes from this interpreter's path, e.g. gpu_check's SITE; isolation for
              the plugin itself would need the wheelhouse that the next step makes from its
              metadata)
  wheelhouse  HOUSE: the carried wheels (--wheels) and, for every other requirement in the
              closure of example_pkg's build requirements, hatch-autotune's Requires-Dist and
              example_pkg's run-time dependencies, a wheel repacked from the distribution this
              machine has installed (no network: the isolated build environment and the fresh
              venv are filled from what the machine has, byte for byte)
  build       `pip wheel -v --no-deps` of a copy of example_pkg with build isolation ON, its lock
              file deleted, HATCH_AUTOTUNE_MODE=auto, an empty compile cache, PIP_NO_INDEX and
              PIP_FIND_LINKS=HOUSE, PYTHONPATH dropped (so the build environment has only what
              pip installed into it); the hook must detect the GPU and tune every entry of its
              arch (example_pkg on an H200: 30 sm_90 entries tuned, 30 sm_80 on the default
              config), and write those 30 entries into the copy's lock file
  venv        the wheel installed into a fresh `venv --without-pip` from HOUSE: only its
              run-time dependencies (numpy; no hatch-autotune, hatchling or jinja2 there),
              then cuda-bindings for the calls script's memory (HARNESS: not the wheel's)
  calls       in that venv, every kernel called on GPU memory from cuda.bindings' cuMemAlloc
              (shown through __cuda_array_interface__) at odd sizes, checked against NumPy in
              float64, each selection tuned

Progress lines are printed as the steps go (the build's own log streamed, with its tuning
progress); the last line printed is a one-line summary.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import importlib.metadata as md
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from email.parser import Parser
from pathlib import Path, PurePosixPath
from typing import Any

from _common import EXAMPLE, ROOT, machine
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import sys_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

SCHEMA = 1
STEPS = ("gpu", "plugin", "wheelhouse", "build", "venv", "calls")
HARNESS = "cuda-bindings"  # in the fresh venv beside the wheel: the calls script's GPU memory (the wheel needs numpy alone)
# Not in the venv that has only example_pkg's run-time dependencies (distribution names).
BUILD_ONLY = ("hatch-autotune", "hatchling", "jinja2")
SUMMARY_RE = re.compile(r"(\d+) entr(?:y|ies): (\d+) tuned, (\d+) on the default config(?:, (\d+) on a fallback)?")
# Files of an installed .dist-info that say how it was installed, not what it is: pip writes them
# again when it installs the repacked wheel (a stale direct_url.json would misreport its origin).
INSTALL_MARKERS = ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")


class CheckError(Exception):
    """A step failed: the message says what failed and what was expected."""


class Interrupted(BaseException):
    """SIGTERM (gpu_check's stage timeout): stop, kill our subprocess, write the JSON."""


def log(line: str) -> None:
    print(f"wheel_check: {line}", flush=True)


# --------------------------------------------------------------------------------------------
# Subprocesses: bounded, killed with their process group, output kept (and streamed if asked)


def run(cmd: list[str], *, env: dict[str, str], timeout: float, what: str, stream: bool = False, cwd: Path | None = None) -> str:
    """Run `cmd` (its own session, so that a timeout ends it and its children); stdout and stderr
    together, printed line by line as they come when `stream`. A non-zero exit or a timeout is a
    CheckError naming `what`, with the output's tail."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if stream:
                print("  | " + line, end="", flush=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        reader.join(5)
        raise CheckError(f"{what} ran past its {timeout:.0f} s timeout; its last lines:\n{tail(lines)}") from None
    finally:
        if proc.poll() is None:  # Interrupted (SIGTERM) or another exception while waiting
            _kill_group(proc)
    reader.join(10)
    if proc.returncode != 0:
        raise CheckError(f"{what} failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n{tail(lines)}")
    return "".join(lines)


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def tail(lines: list[str] | str, n: int = 40) -> str:
    if isinstance(lines, str):
        lines = lines.splitlines(keepends=True)
    return "".join(lines[-n:]).rstrip()


def clean_env(keep_pythonpath: bool) -> dict[str, str]:
    """This environment without pip's and hatch-autotune's settings (a pip.conf or an inherited
    HATCH_AUTOTUNE_CACHE_URL would change what is proved), and without PYTHONPATH unless
    `keep_pythonpath`: a build environment or venv that sees gpu_check's SITE is not isolated."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "HATCH_AUTOTUNE_"))}
    for k in ("PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE") + (() if keep_pythonpath else ("PYTHONPATH",)):
        env.pop(k, None)
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_ROOT_USER_ACTION="ignore",
        PIP_NO_INPUT="1",
        PYTHONNOUSERSITE="1",
    )
    return env


# --------------------------------------------------------------------------------------------
# Step gpu


def probe_gpu() -> dict[str, Any]:
    """Device 0's name and arch through cuda.bindings, or CheckError saying why there is none."""
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:
        raise CheckError(f"cuda.bindings is not importable in {sys.executable} ({e}); the GPU cannot be asked") from None
    try:
        (err,) = cu.cuInit(0)
        if err == cu.CUresult.CUDA_SUCCESS:
            err, count = cu.cuDeviceGetCount()
    except Exception as e:  # no driver library at all: cuda.pathfinder raises
        raise CheckError(
            f"no CUDA GPU answers: cuInit raised {type(e).__name__}: {e}; this check needs one (the build tunes on it)"
        ) from None
    if err != cu.CUresult.CUDA_SUCCESS or count < 1:
        why = cu.cuGetErrorName(err)[1].decode() if err != cu.CUresult.CUDA_SUCCESS else "0 devices"
        raise CheckError(f"no CUDA GPU answers ({why}); this check needs one (the build tunes on it)")
    attr = cu.CUdevice_attribute
    _, dev = cu.cuDeviceGet(0)
    _, name = cu.cuDeviceGetName(128, dev)
    _, major = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    _, minor = cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return {"device": name.split(b"\0", 1)[0].decode(errors="replace"), "arch": f"sm_{major}{minor}", "devices": count}


# --------------------------------------------------------------------------------------------
# Step plugin


def _ignore_for_copy(skip_root: set[str], skip_paths: set[Path]) -> Callable[[str, list[str]], set[str]]:
    everywhere = {".git", ".venv", ".whl", "dist", "build", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"}

    def ignore(directory: str, names: list[str]) -> set[str]:
        here = Path(directory).resolve()
        out = {n for n in names if n in everywhere or n.endswith(".egg-info") or (here / n) in skip_paths}
        if here == ROOT:
            out |= {n for n in names if n in skip_root}
        return out

    return ignore


def build_plugin(house: Path, work: Path, timeout: float) -> Path:
    """hatch-autotune's wheel from this checkout, into `house`."""
    src = work / "plugin-src"
    skip = {ROOT / "benchmarks" / "results", work.resolve()}  # --work inside the checkout is not copied into itself
    shutil.copytree(ROOT, src, ignore=_ignore_for_copy({"example_pkg", "tests", "site"}, skip))
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(house), str(src)],
        env=clean_env(keep_pythonpath=True),
        timeout=timeout,
        what="pip wheel of hatch-autotune",
    )
    wheels = sorted(house.glob("hatch_autotune-*.whl"))
    if len(wheels) != 1:
        raise CheckError(f"expected one hatch_autotune-*.whl in {house} after pip wheel, found {[w.name for w in wheels]}")
    return wheels[0]


# --------------------------------------------------------------------------------------------
# Step wheelhouse: the requirement closure, and wheels repacked from installed distributions


@dataclass
class Provider:
    """Where a distribution of the closure comes from: a wheel (carried, or built here) or what
    this machine has installed (repacked)."""

    name: str  # canonical
    version: str
    source: str  # "carried", "built" or "installed"
    requires: list[str]
    wheel: Path | None = None
    dist: md.Distribution | None = None
    required_by: list[str] = field(default_factory=list)
    extras: set[str] = field(default_factory=set)

    def label(self) -> str:
        return f"{self.name} {self.version}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "source": self.source, "required_by": self.required_by}


def wheel_metadata(path: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist) from a wheel's METADATA."""
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise CheckError(f"{path.name}: expected one *.dist-info/METADATA, found {names}")
        meta = Parser().parsestr(zf.read(names[0]).decode("utf-8", "replace"))
    return str(meta["Name"]), str(meta["Version"]), list(meta.get_all("Requires-Dist") or [])


def wheel_providers(paths: list[Path], source: str) -> dict[str, list[Provider]]:
    """The wheels among `paths` that this interpreter can install, by canonical name."""
    supported = set(sys_tags())
    out: dict[str, list[Provider]] = {}
    for path in paths:
        try:
            _, _, _, tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if not tags & supported:
            continue
        name, version, requires = wheel_metadata(path)
        key = canonicalize_name(name)
        out.setdefault(key, []).append(Provider(key, version, source, requires, wheel=path))
    return out


def _satisfies(version: str, req: Requirement) -> bool:
    try:
        return req.specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _wanted(req: Requirement, extras: set[str]) -> bool:
    """Whether a requirement applies, for the requirer requested with `extras` ('' for none)."""
    return req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras)


def resolve_closure(roots: list[tuple[str, str]], wheels: dict[str, list[Provider]] | None = None) -> dict[str, Provider]:
    """Every distribution that installing `roots` ((requirement, who requires it) pairs) needs,
    for this interpreter: from `wheels` (canonical name -> providers) where one satisfies the
    specifier, else this machine's installed distribution (importlib.metadata). Markers are
    evaluated with the extras each requirer is requested with. A requirement nothing here
    satisfies is a CheckError naming it and its requirer."""
    wheels = wheels or {}
    chosen: dict[str, Provider] = {}
    todo: list[tuple[Requirement, str]] = []
    for text, requirer in roots:
        try:
            req = Requirement(text)
        except InvalidRequirement as e:
            raise CheckError(f"cannot parse requirement {text!r} of {requirer}: {e}") from None
        if _wanted(req, {""}):
            todo.append((req, requirer))
    while todo:
        req, requirer = todo.pop(0)
        key = canonicalize_name(req.name)
        prov = chosen.get(key)
        if prov is None:
            prov = _provider(req, requirer, wheels.get(key, []))
            chosen[key] = prov
        elif not _satisfies(prov.version, req):
            raise CheckError(
                f"{req} (required by {requirer}) conflicts with {prov.label()} ({prov.source}), already chosen for "
                f"{', '.join(prov.required_by)}"
            )
        if requirer not in prov.required_by:
            prov.required_by.append(requirer)
        new = ({""} | set(req.extras)) - prov.extras
        if not new:
            continue
        prov.extras |= new
        for text in prov.requires:
            try:
                dep = Requirement(text)
            except InvalidRequirement as e:
                raise CheckError(f"{prov.label()} ({prov.source}) has a Requires-Dist that cannot be parsed, {text!r}: {e}") from None
            if _wanted(dep, new):
                todo.append((dep, prov.label() + (f" [{','.join(sorted(new - {''}))}]" if new - {""} else "")))
    return chosen


def _provider(req: Requirement, requirer: str, candidates: list[Provider]) -> Provider:
    good = [p for p in candidates if _satisfies(p.version, req)]
    if good:
        best = max(good, key=lambda p: Version(p.version))
        return Provider(best.name, best.version, best.source, list(best.requires), wheel=best.wheel)
    try:
        dist = md.distribution(req.name)
    except md.PackageNotFoundError:
        offered = f"; the wheels offer {', '.join(p.label() for p in candidates)}" if candidates else ""
        raise CheckError(
            f"{req} (required by {requirer}) is not installed on this machine and no carried wheel provides it{offered}: "
            "without network the build environment and the venv cannot get it"
        ) from None
    version = dist.version
    if not _satisfies(version, req):
        where = dist.locate_file("")
        offered = f"; nor do the wheels ({', '.join(p.label() for p in candidates)})" if candidates else ""
        raise CheckError(
            f"{req} (required by {requirer}): this machine has {dist.metadata['Name']} {version} (in {where}), "
            f"which does not satisfy {req.specifier}{offered}"
        )
    return Provider(canonicalize_name(req.name), version, "installed", list(dist.requires or []), dist=dist)


def _record_hash(digest: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def wheel_tag(dist: md.Distribution) -> str:
    """The compressed tag set of the wheel a distribution was installed from (its WHEEL file's
    Tag lines, e.g. 'py2.py3-none-any' from 'py2-none-any' and 'py3-none-any': the first line
    alone would make cuda-toolkit's wheel a Python 2 one that pip skips); 'py3-none-any' when
    the WHEEL file names none."""
    lines = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines() if line.startswith("Tag:")]
    parts: list[list[str]] = [[], [], []]
    for line in lines:
        for i, part in enumerate(line.split("-", 2)):
            for value in part.split("."):
                if value not in parts[i]:
                    parts[i].append(value)
    tag = "-".join(".".join(p) for p in parts) if lines else "py3-none-any"
    if not parse_wheel_filename(f"x-0-{tag}.whl")[3] & set(sys_tags()):
        raise CheckError(
            f"{dist.metadata['Name']} {dist.version} was installed from a wheel tagged {tag}, which this interpreter does not support"
        )
    return tag


def repack_installed(dist: md.Distribution, house: Path) -> Path:
    """A wheel of an installed distribution, written into `house`: every file of its RECORD that
    lies in site-packages (not scripts or data outside it, `..`; not bytecode), its .dist-info
    with a fresh RECORD (sha256, size), named as pip expects. Why: the GPU machine has no network,
    so the isolated build environment and the fresh venv are filled from what the machine has
    installed, byte for byte, through `pip install --no-index --find-links HOUSE`."""
    files = list(dist.files or [])
    infos = {f.parts[0] for f in files if len(f.parts) == 2 and f.parts[0].endswith(".dist-info") and f.name == "METADATA"}
    if len(infos) != 1:
        raise CheckError(
            f"{dist.metadata['Name']} {dist.version}: its RECORD names no single *.dist-info/METADATA (not installed from a wheel?)"
        )
    info = infos.pop()
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    version = str(Version(dist.version)).replace("-", "_")
    target = house / f"{name}-{version}-{wheel_tag(dist)}.whl"
    site = Path(str(dist.locate_file("")))
    partial = target.with_suffix(".partial")
    record: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for rel in files:
            if not rel.parts or rel.parts[0] == ".." or rel.is_absolute() or "__pycache__" in rel.parts or rel.suffix == ".pyc":
                continue
            arc = PurePosixPath(*rel.parts)
            text = str(arc)
            if (arc.parts[0] == info and len(arc.parts) == 2 and arc.name in INSTALL_MARKERS) or text in seen:
                continue
            src = site / text
            if not src.is_file():
                continue  # listed but gone (a file removed after install): nothing to copy
            seen.add(text)
            zinfo = zipfile.ZipInfo(text, date_time=(1980, 1, 1, 0, 0, 0))
            zinfo.external_attr = (src.stat().st_mode & 0xFFFF) << 16
            zinfo.file_size = src.stat().st_size
            digest = hashlib.sha256()
            with src.open("rb") as f, zf.open(zinfo, "w") as out:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
                    out.write(chunk)
            record.append((text, _record_hash(digest.digest()), str(zinfo.file_size)))
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerows(record)
        writer.writerow((f"{info}/RECORD", "", ""))
        zinfo = zipfile.ZipInfo(f"{info}/RECORD", date_time=(1980, 1, 1, 0, 0, 0))
        zinfo.external_attr = 0o644 << 16
        zf.writestr(zinfo, buf.getvalue())
    partial.replace(target)
    return target


def example_requirements(project: Path) -> tuple[list[str], list[str], list[str]]:
    """(build-system requires, run-time dependencies, declared archs) of a consumer project."""
    import tomllib

    data = tomllib.loads((project / "pyproject.toml").read_text())
    hook = data["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["autotune"]
    return list(data["build-system"]["requires"]), list(data["project"].get("dependencies", [])), list(hook.get("archs", []))


def make_house(house: Path, wheels_dir: Path, plugin: Path, project: Path = EXAMPLE) -> dict[str, Any]:
    """Fill `house` (which holds the plugin's wheel): the carried wheels, then a repacked wheel for
    every requirement of the closure that no carried wheel provides."""
    carried = sorted(wheels_dir.glob("*.whl")) if wheels_dir.is_dir() else []
    for whl in carried:
        shutil.copy2(whl, house / whl.name)
    available = wheel_providers([house / w.name for w in carried], "carried")
    pname, pversion, prequires = wheel_metadata(plugin)
    built = Provider(canonicalize_name(pname), pversion, "built", prequires, wheel=plugin)
    available[built.name] = [built]
    build_requires, runtime, _ = example_requirements(project)
    roots = [(r, f"{project.name} [build-system] requires") for r in build_requires]
    roots += [(r, f"{project.name} dependencies") for r in runtime]
    closure = resolve_closure(roots, available)
    if built.name not in closure:
        raise CheckError(f"{project.name}'s build requirements {build_requires} do not name {pname}: the build would not use the plugin")
    repacked, total = [], 0
    for prov in closure.values():
        if prov.source == "installed":
            assert prov.dist is not None
            whl = repack_installed(prov.dist, house)
            repacked.append(whl.name)
            total += whl.stat().st_size
    return {
        "house": str(house),
        "wheels_dir": str(wheels_dir) + ("" if wheels_dir.is_dir() else " (does not exist: nothing carried)"),
        "carried": [w.name for w in carried],
        "repacked": repacked,
        "repacked_mib": round(total / 2**20, 1),
        "closure": [p.to_json() for p in closure.values()],
    }


# --------------------------------------------------------------------------------------------
# Step build


def build_example(src: Path, house: Path, out: Path, cache: Path, timeout: float, mode: str = "auto") -> tuple[Path, str, float]:
    """`pip wheel` of the project at `src` with build isolation, from HOUSE only; (wheel, log,
    wall seconds). PYTHONPATH is dropped so that the build environment holds only what pip
    installed into it (pip itself comes with the interpreter)."""
    env = clean_env(keep_pythonpath=False)
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(house), HATCH_AUTOTUNE_MODE=mode, HATCH_AUTOTUNE_CACHE_DIR=str(cache))
    t0 = time.monotonic()
    text = run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-cache-dir", "--no-deps", "-w", str(out), str(src)],
        env=env,
        timeout=timeout,
        what="pip wheel of example_pkg (build isolation, from the wheelhouse)",
        stream=True,
        cwd=out.parent,
    )
    wall = time.monotonic() - t0
    wheels = sorted(out.glob("example_pkg-*.whl"))
    if len(wheels) != 1:
        raise CheckError(f"expected one example_pkg-*.whl in {out}, found {[w.name for w in wheels]}")
    return wheels[0], text, wall


def build_counts(wheel: Path, text: str) -> dict[str, Any]:
    """What the build says it did (its log's last summary line) and what its wheel records
    (outcome.json: each entry's status, by arch); the two must agree."""
    found = SUMMARY_RE.findall(text)
    if not found:
        raise CheckError("the build log has no 'hatch-autotune: N entries: T tuned, D on the default config' line (was the hook run?)")
    n, t, d, f = (int(v or 0) for v in found[-1])
    with zipfile.ZipFile(wheel) as zf:
        names = [x for x in zf.namelist() if x.endswith("/kernels/outcome.json")]
        if len(names) != 1:
            raise CheckError(f"{wheel.name}: expected one */kernels/outcome.json, found {names}")
        outcome = json.loads(zf.read(names[0]))
    by_arch: dict[str, dict[str, int]] = {}
    for entry in outcome["entries"]:
        arch = entry["id"].split("|")[2]
        by_arch.setdefault(arch, {}).setdefault(entry["status"], 0)
        by_arch[arch][entry["status"]] += 1
    recorded = {s: sum(c.get(s, 0) for c in by_arch.values()) for s in ("tuned", "default", "fallback")}
    if (len(outcome["entries"]), recorded["tuned"], recorded["default"], recorded["fallback"]) != (n, t, d, f):
        raise CheckError(f"the log says {n} entries: {t} tuned, {d} default, {f} fallback, but the wheel's outcome.json records {by_arch}")
    return {"entries": n, "tuned": t, "default": d, "fallback": f, "by_arch": by_arch}


def check_tuned(counts: dict[str, Any], archs: list[str], gpu_arch: str | None) -> list[str]:
    """Every entry of the archs that run on the GPU tuned (its plain arch and its arch-specific and
    family targets: sm_90 and sm_90a on a 9.0 GPU, where the project declares them), none of
    another: the build tuned on this GPU. The tuned archs are returned."""
    by_arch = counts["by_arch"]
    tuned = sorted(a for a, c in by_arch.items() if c.get("tuned"))
    if counts["tuned"] == 0:
        raise CheckError(
            f"the build tuned nothing ({counts['entries']} entries: {by_arch}); in auto mode with a GPU of a target arch it must tune"
        )
    expected = sorted(a for a in archs if re.sub(r"[af]$", "", a) == gpu_arch) if gpu_arch is not None else tuned
    if not tuned or tuned != expected:
        raise CheckError(f"expected tuned entries for the archs that run on the GPU ({', '.join(expected)}) only, got {by_arch}")
    for arch in tuned:
        if set(by_arch[arch]) != {"tuned"}:
            raise CheckError(f"expected every {arch} entry tuned (an empty lock, auto mode, on a {gpu_arch} GPU), got {by_arch[arch]}")
    if sorted(by_arch) != sorted(archs) or len({sum(c.values()) for c in by_arch.values()}) != 1:
        raise CheckError(f"expected the same number of entries for each declared arch {archs}, got {by_arch}")
    return tuned


def check_lock(lock: Path, tuned: int, tuned_archs: list[str]) -> int:
    """The lock the build wrote: one entry per tuned entry, all for the tuned archs."""
    if not lock.is_file():
        raise CheckError(f"the build wrote no lock file {lock} (tuning writes its winners there)")
    entries = json.loads(lock.read_text()).get("entries", {})
    archs = sorted({k.split("|")[2] if k.count("|") >= 3 else "?" for k in entries})
    if len(entries) != tuned or archs != sorted(tuned_archs):
        raise CheckError(f"expected {tuned} lock entries for {', '.join(tuned_archs)} in {lock}, found {len(entries)} for {archs}")
    return len(entries)


# --------------------------------------------------------------------------------------------
# Step venv


LIST_SCRIPT = """
import importlib.metadata as md, importlib.util, json, sys
names = {d.metadata["Name"]: d.version for d in md.distributions()}
mods = {m: importlib.util.find_spec(m) is not None for m in ("hatch_autotune", "hatchling", "jinja2", "example_pkg")}
print(json.dumps({"packages": dict(sorted(names.items(), key=lambda kv: kv[0].lower())), "importable": mods, "prefix": sys.prefix}))
"""


def pip_version() -> str:
    proc = subprocess.run([sys.executable, "-m", "pip", "--version"], env=clean_env(False), capture_output=True, text=True, timeout=60)
    return proc.stdout.split()[1] if proc.returncode == 0 and proc.stdout.startswith("pip ") else "unknown"


def install_venv(venv: Path, house: Path, wheel: Path, timeout: float) -> dict[str, Any]:
    """A fresh venv without pip, the wheel installed from HOUSE only: (listing). pip runs from
    this interpreter (--python, pip >= 22.3; else --target into the venv's site-packages)."""
    env = clean_env(keep_pythonpath=False)
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], env=env, timeout=timeout, what="python -m venv")
    py = venv / "bin" / "python"
    version = pip_version()
    try:
        modern = Version(version) >= Version("22.3")
    except InvalidVersion:
        modern = False
    where = ["--python", str(py)] if modern else []
    install = [sys.executable, "-m", "pip", *where, "install", "--no-cache-dir", "--no-index", "--find-links", str(house)]
    if not modern:
        site = run(
            [str(py), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], env=env, timeout=60, what="the venv's site"
        )
        install += ["--target", site.strip()]
    run([*install, str(wheel)], env=env, timeout=timeout, what="pip install of the wheel into the fresh venv", stream=True)
    # the calls script's own GPU memory comes from cuda-bindings, which the wheel does not need (its
    # runtime calls libcuda through ctypes): installed after the wheel, for the script alone
    run([*install, HARNESS], env=env, timeout=timeout, what="pip install of the calls script's cuda-bindings", stream=True)
    # -I: neither the current directory (gpu_check runs in the checkout, which holds hatch_autotune/)
    # nor PYTHON* variables on the venv's path; it sees what is installed in it and nothing else.
    listing = json.loads(run([str(py), "-I", "-c", LIST_SCRIPT], env=env, timeout=60, what="listing the venv", cwd=venv).splitlines()[-1])
    canon = {canonicalize_name(n) for n in listing["packages"]}
    present = [n for n in BUILD_ONLY if n in canon] + [m for m in ("hatch_autotune", "hatchling", "jinja2") if listing["importable"][m]]
    if present:
        raise CheckError(
            f"the venv that should hold only example_pkg's run-time dependencies has build-side packages: {sorted(set(present))}"
        )
    if "example-pkg" not in canon or not listing["importable"]["example_pkg"]:
        raise CheckError(f"example_pkg is not installed in {venv}: {listing['packages']}")
    return {"packages": listing["packages"], "pip_install": "--python" if modern else "--target", "harness": HARNESS}


# --------------------------------------------------------------------------------------------
# Step calls: a script run by the venv's Python


CASES = {
    "saxpy": [{"n": n, "dtype": dt} for dt in ("float32", "float16") for n in (1, 4097, 1000003, 16777217)],
    "row_softmax": [{"rows": r, "cols": c} for r, c in ((3, 77), (1001, 1500), (17, 9000), (300, 129))],
    "sgemm": [{"m": m, "n": n, "k": k} for m, n, k in ((127, 255, 33), (1000, 513, 257), (64, 64, 4096))],
}
TOLERANCES = {"saxpy/float32": 1e-5, "saxpy/float16": 2e-3, "row_softmax/float32": 1e-5, "sgemm/float32": 1e-4}

CALLS_SCRIPT = r'''
"""wheel_check's calls, run by the fresh venv's Python (example_pkg and its run-time deps only).
GPU memory comes from cuda.bindings' driver API alone and reaches the kernels through
__cuda_array_interface__ (no CuPy, no PyTorch): the runtime launches such arrays on the
device's default stream, so cuCtxSynchronize comes before each copy back."""
import json, sys, time, traceback
import numpy as np
from cuda.bindings import driver as cu


def ok(result, what):
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {cu.cuGetErrorName(err)[1].decode()}")
    return result[1] if len(result) > 1 else None


class DeviceArray:
    """cuMemAlloc'd memory as a C-contiguous array (__cuda_array_interface__ version 3)."""

    def __init__(self, host):
        host = np.ascontiguousarray(host)
        self.shape, self.dtype, self.nbytes = tuple(int(d) for d in host.shape), host.dtype, host.nbytes
        self.ptr = int(ok(cu.cuMemAlloc(self.nbytes), "cuMemAlloc"))
        ok(cu.cuMemcpyHtoD(self.ptr, host.ctypes.data, self.nbytes), "cuMemcpyHtoD")

    @property
    def __cuda_array_interface__(self):
        return {"version": 3, "shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "strides": None, "stream": None}

    def get(self):
        ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        host = np.empty(self.shape, self.dtype)
        ok(cu.cuMemcpyDtoH(host.ctypes.data, self.ptr, self.nbytes), "cuMemcpyDtoH")
        return host

    def free(self):
        if self.ptr:
            ok(cu.cuMemFree(self.ptr), "cuMemFree")
            self.ptr = 0


def nonzero(rng, shape, scale=1.0):
    """Uniform in [-scale, -scale/8] u [scale/8, scale]: no zero, both signs."""
    return rng.uniform(scale / 8, scale, shape) * rng.choice([-1.0, 1.0], shape)


def compare(out, ref, tol):
    out64 = out.astype(np.float64)
    bad = int(np.count_nonzero(~np.isfinite(out64)))
    diff = np.abs(out64 - ref)
    rel = float(np.linalg.norm(diff) / np.linalg.norm(ref)) if not bad else float("nan")
    worst = float(diff.max() / np.abs(ref).max()) if not bad else float("nan")
    return {"rel_err": rel, "max_err": worst, "nonfinite": bad, "ok": bad == 0 and rel <= tol and worst <= tol}


def case(kernels, rng, name, sizes, tol):
    arrays = []

    def dev(host):
        arrays.append(DeviceArray(host))
        return arrays[-1]

    try:
        if name == "saxpy":
            n, dt = sizes["n"], np.dtype(sizes["dtype"])
            a = float(np.float32(rng.uniform(0.5, 2.0)))
            x, y = nonzero(rng, n).astype(dt), nonzero(rng, n).astype(dt)
            ref = a * x.astype(np.float64) + y.astype(np.float64)
            dx, dy = dev(x), dev(y)
            sel = kernels.saxpy.select(n=n, T=dt.name)
            t0 = time.perf_counter()
            kernels.saxpy(a, dx, dy)
            out = dy.get()
        elif name == "row_softmax":
            rows, cols = sizes["rows"], sizes["cols"]
            x = nonzero(rng, (rows, cols), 4.0).astype(np.float32)
            e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
            ref = e / e.sum(axis=1, keepdims=True)
            dx, dy = dev(x), dev(np.full((rows, cols), np.nan, np.float32))  # poisoned: unwritten stays NaN
            sel = kernels.row_softmax.select(rows=rows, cols=cols)
            t0 = time.perf_counter()
            kernels.row_softmax(dx, dy)
            out = dy.get()
        else:
            m, n, k = sizes["m"], sizes["n"], sizes["k"]
            A, B = nonzero(rng, (m, k)).astype(np.float32), nonzero(rng, (k, n)).astype(np.float32)
            ref = A.astype(np.float64) @ B.astype(np.float64)
            dA, dB, dC = dev(A), dev(B), dev(np.full((m, n), np.nan, np.float32))
            sel = kernels.sgemm.select(m=m, n=n, k=k)
            t0 = time.perf_counter()
            kernels.sgemm(dA, dB, dC)
            out = dC.get()
        seconds = time.perf_counter() - t0
        result = compare(out, ref, tol)
        result["selection"] = {"tuned": bool(sel.tuned), "arch": sel.arch, "binary": sel.binary, "config": dict(sel.config), "bucket": dict(sel.bucket)}
        if not sel.tuned:
            result["ok"] = False
            result["error"] = f"the selection for this call is not tuned ({sel.config}); the build tuned every entry of this GPU's arch"
        result["call_s"] = round(seconds, 4)
        return result
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
    finally:
        for arr in arrays:
            arr.free()


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    cases, tolerances = spec["cases"], spec["tolerances"]
    ok(cu.cuInit(0), "cuInit")
    device = ok(cu.cuDeviceGet(0), "cuDeviceGet")
    ctx = ok(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    name = ok(cu.cuDeviceGetName(128, device), "cuDeviceGetName").split(b"\0", 1)[0].decode()
    from example_pkg import kernels

    rng = np.random.default_rng(20240917)
    calls = []
    for kernel, sizes_list in cases.items():
        for sizes in sizes_list:
            dtype = sizes.get("dtype", "float32")
            tol = tolerances[f"{kernel}/{dtype}"]
            result = {"kernel": kernel, "sizes": {k: v for k, v in sizes.items() if k != "dtype"}, "dtype": dtype, "tol": tol}
            result.update(case(kernels, rng, kernel, sizes, tol))
            calls.append(result)
            print("CALL " + json.dumps(result), flush=True)
    ok(cu.cuDevicePrimaryCtxRelease(device), "cuDevicePrimaryCtxRelease")
    print("RESULT " + json.dumps({"device": name, "kernels_file": kernels.__file__, "calls": calls}), flush=True)


main()
'''


def describe_call(c: dict[str, Any]) -> str:
    """One line for a call's result."""
    what = f"{'ok' if c['ok'] else 'FAILED'} {c['kernel']} {c['dtype']} {c['sizes']}"
    if "rel_err" in c:
        what += f": rel err {c['rel_err']:.3g}, max err {c['max_err']:.3g} (tol {c['tol']:g})"
        what += f", {c['nonfinite']} non-finite" if c["nonfinite"] else ""
        sel = c.get("selection") or {}
        what += f", {'tuned' if sel.get('tuned') else 'NOT tuned'} {sel.get('binary')} {sel.get('config')}"
    if c.get("error"):
        what += f": {c['error']}"
    return what


def run_calls(venv: Path, work: Path, timeout: float) -> dict[str, Any]:
    """Every case of CASES, called in the venv; each checked against NumPy in float64."""
    script, spec = work / "calls.py", work / "calls.json"
    script.write_text(CALLS_SCRIPT)
    spec.write_text(json.dumps({"cases": CASES, "tolerances": TOLERANCES}))
    text = run(
        [str(venv / "bin" / "python"), "-I", str(script), str(spec)],  # -I: only what the venv has (not the script's folder)
        env=clean_env(keep_pythonpath=False),
        timeout=timeout,
        what="the kernel calls in the fresh venv",
        cwd=work,
    )
    results = [line[len("RESULT ") :] for line in text.splitlines() if line.startswith("RESULT ")]
    if not results:
        raise CheckError(f"the calls script printed no RESULT line:\n{tail(text)}")
    found = json.loads(results[-1])
    calls = found["calls"]
    for c in calls:
        log("  " + describe_call(c))
    if not str(Path(found["kernels_file"]).resolve()).startswith(str(venv.resolve())):
        raise CheckError(f"example_pkg.kernels was imported from {found['kernels_file']}, not from the venv {venv}")
    failed = [c for c in calls if not c["ok"]]
    expected = sum(len(v) for v in CASES.values())
    if failed or len(calls) != expected:
        first = f"; the first: {describe_call(failed[0])}" if failed else ""
        raise CheckError(f"{len(failed)} of {len(calls)} calls failed, {expected} expected to pass{first}")
    return {"device": found["device"], "kernels_file": found["kernels_file"], "calls": calls}


# --------------------------------------------------------------------------------------------
# The run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", type=Path, required=True, help="the carried wheels (gpu_check's --wheels, normally .whl)")
    ap.add_argument("--out", type=Path, required=True, help="the JSON result, written after every step")
    ap.add_argument("--work", type=Path, help="a folder for the sources, wheelhouse and venv (kept); default: a temporary one, removed")
    ap.add_argument("--keep-lock", type=Path, help="copy the lock file the build wrote here")
    ap.add_argument("--timeout", type=float, default=400, help="seconds for the build (pip wheel of example_pkg, tuning included)")
    ap.add_argument("--step-timeout", type=float, default=240, help="seconds for each other subprocess")
    args = ap.parse_args(argv)

    def on_term(signum: int, frame: Any) -> None:
        raise Interrupted(f"signal {signum}")

    previous_handler = signal.signal(signal.SIGTERM, on_term)
    own_work = args.work is None
    work = Path(tempfile.mkdtemp(prefix="wheel-check-")) if own_work else args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "ok": False,
        "machine": machine(),  # GPU, driver, versions and the commit, as every benchmark records them
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "pip_version": pip_version(),
        "mode": "auto",
        "steps": {},
        "failed_step": None,
        "not_run": [],
        "build_wall_s": None,
        "tuned": None,
        "default": None,
        "lock_entries": None,
        "venv_packages": None,
        "calls": [],
    }
    house, venv = work / "house", work / "venv"
    state: dict[str, Any] = {}

    def step_gpu() -> dict[str, Any]:
        state["gpu"] = probe_gpu()
        return dict(state["gpu"])

    def step_plugin() -> dict[str, Any]:
        house.mkdir(exist_ok=True)
        state["plugin"] = build_plugin(house, work, args.step_timeout)
        return {
            "wheel": state["plugin"].name,
            "build_isolation": False,
            "why": "hatchling from this interpreter's path (gpu_check's SITE): the wheelhouse isolation needs is made from this wheel's metadata",
        }

    def step_wheelhouse() -> dict[str, Any]:
        info = make_house(house, args.wheels.resolve(), state["plugin"])
        log(
            f"  {len(info['carried'])} carried wheels, {len(info['repacked'])} repacked ({info['repacked_mib']} MiB): {', '.join(info['repacked'])}"
        )
        return info

    def step_build() -> dict[str, Any]:
        src, out, cache = work / "example-src", work / "example-dist", work / "compile-cache"
        shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("dist", "kernels", "__pycache__", "build"))
        (src / "autotune.lock.json").unlink(missing_ok=True)
        out.mkdir()
        cache.mkdir()
        wheel, text, wall = build_example(src, house, out, cache, args.timeout)
        result["build_wall_s"] = round(wall, 1)
        (work / "build.log").write_text(text)
        counts = build_counts(wheel, text)
        result["tuned"], result["default"] = counts["tuned"], counts["default"]
        lock = src / "autotune.lock.json"
        if args.keep_lock and lock.is_file():
            args.keep_lock.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lock, args.keep_lock)
        tuned_archs = check_tuned(counts, example_requirements(src)[2], state["gpu"]["arch"])
        result["lock_entries"] = check_lock(lock, counts["tuned"], tuned_archs)
        state["wheel"] = wheel
        return {
            "wheel": wheel.name,
            "wall_s": round(wall, 1),
            "tuned_arch": ", ".join(tuned_archs),
            "lock_entries": result["lock_entries"],
            **counts,
        }

    def step_venv() -> dict[str, Any]:
        info = install_venv(venv, house, state["wheel"], args.step_timeout)
        result["venv_packages"] = info["packages"]
        return {"pip_install": info["pip_install"], "packages": len(info["packages"])}

    def step_calls() -> dict[str, Any]:
        info = run_calls(venv, work, args.step_timeout)
        result["calls"] = info.pop("calls")
        return info

    actions = {
        "gpu": step_gpu,
        "plugin": step_plugin,
        "wheelhouse": step_wheelhouse,
        "build": step_build,
        "venv": step_venv,
        "calls": step_calls,
    }
    summary = ""
    try:
        for i, name in enumerate(STEPS):
            log(f"{name}: started")
            t0 = time.monotonic()
            try:
                info = actions[name]()
                step: dict[str, Any] = {"ok": True, **info}
            except CheckError as e:
                step = {"ok": False, "error": str(e)}
            except Exception as e:
                step = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            except Interrupted as e:
                step = {"ok": False, "error": f"interrupted ({e}) after {time.monotonic() - t0:.0f} s"}
            step["seconds"] = round(time.monotonic() - t0, 1)
            result["steps"][name] = step
            if not step["ok"]:
                result["failed_step"] = name
                result["not_run"] = list(STEPS[i + 1 :])
                log(f"{name}: FAILED after {step['seconds']} s: {step['error']}")
                write_json(args.out, result)
                break
            log(f"{name}: ok ({step['seconds']} s)")
            write_json(args.out, result)
        else:
            result["ok"] = True
        summary = one_line(result)
    finally:
        write_json(args.out, result)
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous_handler)
    log(summary)
    return 0 if result["ok"] else 1


def one_line(result: dict[str, Any]) -> str:
    if result["ok"]:
        build = result["steps"]["build"]
        calls = result["calls"]
        return (
            f"ok: example_pkg built with isolation in {result['build_wall_s']} s, {result['tuned']} entries tuned for "
            f"{build['tuned_arch']} and {result['default']} on the default config; {len(calls)} of {len(calls)} calls "
            f"match NumPy in a fresh venv of {len(result['venv_packages'] or {})} packages on {result['steps']['calls']['device']}"
        )
    name = result["failed_step"]
    error = result["steps"][name]["error"].strip().splitlines()[0] if name else "no step ran"
    return f"FAILED at step {name}: {error}"


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
