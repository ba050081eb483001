"""Strict readers of what a user has at hand, each into a `Source` (model.py).

A project (pyproject.toml), its lock file, a built wheel, a selection table, a generated package
or an installed package: `load_source` tells which it is and reads it, so that every subcommand
of the `hatch-autotune` command works on all of them. The formats have one reader each, owned
by their stage (build.lock for lock files, runtime.parse_table for tables, the planner for what a
project would ship); this module only turns them into rows. A missing, foreign, corrupt or
newer-schema input is a `CliError` with one line to show, never a traceback (the build hook, by
contrast, only warns and falls back). Every file is read as a regular file of at most
MAX_JSON_BYTES (a pipe or a device is named, never waited on), every archive member likewise.
"""

from __future__ import annotations

import importlib.util
import io
import os
import re
import struct
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..declare.project import load_project
from ..declare.settings import Mode
from ..errors import CliError
from ..files import UnreadableFile, read_capped, read_regular
from ..lock import LOCK_FILE_LIMIT, Bucket, EntryId, LockEntry, LockFile, LockFormatError
from ..runtime import load_json, sha256_hex
from .model import LOCK_NO_RESOURCES, PROJECT_NO_RESOURCES, TABLE_NO_TIMES, Row, Source, finite_ms

# The most bytes the command reads of one JSON input (a lock file, a selection table, an outcome
# record), from a file or from a wheel's member: the lock file's bound, as a table or a record is
# smaller than the lock it was built from. A bigger input is refused, not read.
MAX_JSON_BYTES = LOCK_FILE_LIMIT


def _unreadable(path: Path | str, exc: OSError, what: str) -> CliError:
    """One line for a file that cannot be read as the `what` expected: absent, a pipe or a
    device ('is a named pipe, expected a lock file'), too large, or an OS error."""
    if isinstance(exc, FileNotFoundError):
        return CliError(f"{path}: no such file")
    if isinstance(exc, UnreadableFile):  # what it is instead, and what this reader expected
        return CliError(f"{path}: is {exc.found}, expected a {what}" if exc.found else f"{path}: {exc}")
    return CliError(f"{path}: cannot read it ({exc.strerror or exc})")


def read_json(path: Path, what: str) -> Any:
    """A JSON file, or CliError saying why it is not the `what` expected (absent, a directory,
    a pipe or a device, larger than MAX_JSON_BYTES, a zip archive, not text, not JSON)."""
    try:
        data = read_regular(path, MAX_JSON_BYTES)
    except OSError as exc:
        raise _unreadable(path, exc, what) from None
    if zipfile.is_zipfile(io.BytesIO(data)):
        raise CliError(f"{path}: is a zip archive (a wheel?), expected a {what}")
    try:
        return load_json(data)
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a {what} (not JSON text)") from None
    except ValueError as exc:
        raise CliError(f"{path}: corrupt {what}: not valid JSON ({exc})") from None


# What reading a damaged archive member raises: the zip module's own error, the decompressors'
# (zlib, and EOFError for a cut stream), and NotImplementedError / RuntimeError for a member
# compressed with a method this Python lacks or encrypted.
_MEMBER_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError, OSError)


def read_member(zf: zipfile.ZipFile, name: str, archive: Path, limit: int) -> bytes:
    """The bytes of one archive member, at most `limit` of them: refused by its declared size
    (a zip bomb says how big it inflates), and read in chunks that stop past `limit` (a header
    can lie about it); CliError naming the archive and the member."""
    where = f"{archive}!{name}"
    info = zf.getinfo(name)
    if info.file_size > limit:
        raise CliError(f"{where}: inflates to {info.file_size} bytes, more than the {limit} bytes read from an archive member")
    try:
        with zf.open(info) as member:
            data = read_capped(member.read, limit)
    except _MEMBER_ERRORS as exc:
        raise CliError(f"{where}: damaged archive member, cannot be read ({type(exc).__name__}: {exc})") from None
    if data is None:
        raise CliError(f"{where}: inflates to more than the {limit} bytes read from an archive member (its header says {info.file_size})")
    return data


# --------------------------------------------------------------------------------------------
# Lock files.


def parse_lock(data: Any, label: str) -> LockFile:
    """Decoded JSON to a lock file, or CliError naming what is wrong with it."""
    try:
        return LockFile.parse(data, label)
    except LockFormatError as exc:
        raise CliError(str(exc)) from None


def read_lock(path: Path) -> LockFile:
    return parse_lock(read_json(path, "lock file"), str(path))


def row_from_lock(where: EntryId, entry: LockEntry) -> Row:
    """The row a lock entry records: its winner, times, measurements and provenance. The
    measurements are the entry's own (read-only here): a copy of each was a third of the time
    of reading a big lock file."""
    ms = list(entry.measurements)
    default_config = dict(entry.default) if entry.default is not None else None
    if default_config is None and entry.default_ms is not None:  # older entries: the default's time identifies it
        same = [dict(m.config) for m in ms if m.timed and m.median_ms == entry.default_ms]
        if len(same) == 1:
            default_config = same[0]
    return Row(
        kernel=where.kernel,
        types=where.types,
        arch=where.arch,
        bucket=where.bucket,
        config=dict(entry.config),
        tuned=entry.tuned,
        note="" if entry.tuned else "lock entry is untuned",
        time_ms=finite_ms(entry.winner_ms),
        default_ms=finite_ms(entry.default_ms),
        default_config=default_config,
        measurements=ms,
        checksum=entry.checksum,
        provenance=dict(entry.provenance),
        excluded=dict(entry.excluded),
    )


def lock_source(path: Path, data: Any = None) -> Source:
    """A lock file's rows; `data`: its already-decoded JSON, if the caller read it."""
    lock = parse_lock(data, str(path)) if data is not None else read_lock(path)
    rows = {eid: row_from_lock(EntryId.parse(eid), e) for eid, e in lock.entries.items()}  # ids checked by parse
    kernels = sorted({r.kernel for r in rows.values()})
    return Source(str(path), "lock", rows, kernels, [LOCK_NO_RESOURCES])


# --------------------------------------------------------------------------------------------
# Selection tables: of a wheel, a generated package, an installed package, or a table.json.


def table_source(table: Any, label: str, kind: str) -> Source:
    """The rows of a selection table (bytes or decoded JSON of a table.json)."""
    from ..runtime import KernelTable, TableError, parse_table

    try:
        table = parse_table(table, label)
    except TableError as exc:
        raise CliError(str(exc)) from None
    rows: dict[str, Row] = {}
    try:
        for name, data in table["kernels"].items():
            kernel = KernelTable.from_json(name, data)
            names = [k.name for k in kernel.decl.key]
            for tkey, arch, e in kernel.entries():
                variant = kernel.variants[e.variant]
                binary = variant.binaries.get(arch)
                r = Row(
                    kernel=name,
                    types=tkey,
                    arch=arch,
                    bucket=Bucket.from_values(names, e.bucket),
                    config=dict(variant.config),
                    tuned=e.tuned,
                    note="" if e.tuned else e.reason or "default config",
                    time_ms=finite_ms(e.median_ms),
                    default_ms=finite_ms(e.default_ms),
                    resources=_resources(variant.resources.get(arch)),
                    variant=e.variant,
                    binary=binary.sha256 if binary is not None and binary.sha256 else None,
                    provenance=dict(e.provenance),
                )
                rows[r.eid] = r
        ptx = {str(t): str(a) for t, a in dict(table.get("ptx", {})).items()}
        drivers = {str(a): str(v) for a, v in dict(table.get("drivers", {})).items()}
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise CliError(f"{label}: malformed selection table ({type(exc).__name__}: {exc})") from None
    return Source(label, kind, rows, list(table["kernels"]), [TABLE_NO_TIMES], ptx=ptx, drivers=drivers)


def _resources(value: Any) -> dict[str, int] | None:
    """A variant's resource usage on one arch: ptxas' counts by name, the counts only (what the
    report draws; the runtime never reads them, so a table is not refused for them)."""
    if not isinstance(value, dict):
        return None
    return {k: v for k, v in value.items() if type(v) is int and 0 <= v < 1 << 48} or None


# What marks a generated package next to its table.json: the vendored runtime, a package
# (`_runtime/`) since the runtime was split by concept, one `_runtime.py` in older wheels.
_RUNTIME_MARKERS = ("_runtime/__init__.py", "_runtime.py")


def _is_generated_dir(d: Path) -> bool:
    return (d / "table.json").is_file() and any((d / m).is_file() for m in _RUNTIME_MARKERS)


def generated_dirs(root: Path) -> list[Path]:
    """Generated packages (table.json next to the vendored runtime) at or below root, nearest first."""
    if _is_generated_dir(root):
        return [root]
    return sorted({p.parent for p in root.rglob("table.json") if _is_generated_dir(p.parent)}, key=lambda p: (len(p.parts), p))


def generated_tables(names: Iterable[str]) -> list[str]:
    """The selection tables among a file list (a wheel's, an installed distribution's: '/'
    separated) that sit next to a vendored runtime, i.e. generated packages; shallowest first, as
    generated_dirs orders them."""
    listed = set(names)
    tables = [
        n for n in listed if n.rpartition("/")[2] == "table.json" and any(n[: -len("table.json")] + m in listed for m in _RUNTIME_MARKERS)
    ]
    return sorted(tables, key=lambda n: (n.count("/"), n))


def with_outcome(src: Source, data: bytes | None, label: str) -> Source:
    """The source with the build's outcome record (outcome.json next to the table) read into
    it, leniently: rows learn which are fallbacks; a missing or damaged record is a note."""
    from ..wheel.outcome import EntryStatus, Outcome

    outcome = Outcome.read(data, label)
    if outcome is None:
        src.notes.append(
            "no outcome record (outcome.json) next to the table: built by an older hatch-autotune, so its compile failures are not recorded"
        )
        return src
    src.outcome = outcome
    src.notes += outcome.notes
    for e in outcome.entries:
        row = src.rows.get(e.eid)
        if row is not None and e.status == EntryStatus.FALLBACK:
            row.fallback = True
    return src


def _open_wheel(path: Path) -> zipfile.ZipFile:
    """The wheel's archive, or CliError: not a zip archive, or one whose directory is damaged."""
    try:
        return zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise CliError(f"{path}: not a wheel (not a zip archive)") from None
    except OSError as exc:
        raise _unreadable(path, exc, "wheel") from None
    except (ValueError, EOFError, struct.error, NotImplementedError) as exc:  # a directory entry it cannot use ('zip file version 23.5')
        raise CliError(f"{path}: not a wheel (a damaged zip archive: {exc})") from None


def wheel_source(path: Path) -> Source:
    """A wheel's selection table and outcome record, each read up to MAX_JSON_BYTES."""
    from ..wheel.outcome import OUTCOME_FILE

    with _open_wheel(path) as zf:
        names = set(zf.namelist())
        tables = generated_tables(names)
        if not tables:
            raise CliError(f"{path}: no hatch-autotune selection table in this wheel (no */table.json next to a vendored _runtime)")
        data = read_member(zf, tables[0], path, MAX_JSON_BYTES)
        outcome_name = tables[0][: -len("table.json")] + OUTCOME_FILE
        outcome = read_member(zf, outcome_name, path, MAX_JSON_BYTES) if outcome_name in names else None
    return with_outcome(table_source(data, f"{path}!{tables[0]}", "wheel"), outcome, f"{path}!{outcome_name}")


def find_installed(name: str) -> Path | None:
    """The directory of an installed package, by its import name (`stencil_kit`, found
    without importing it) or its distribution name (`stencil-kit`, any case and spelling that
    PEP 503 normalises alike: the distribution's files hold the generated package)."""
    found = _find_importable(name)
    return found if found is not None else _find_distribution(name)


def _find_distribution(name: str) -> Path | None:
    """The generated package (table.json next to the vendored runtime) among an installed
    distribution's files; importlib.metadata normalises the name as PEP 503 does."""
    import importlib.metadata

    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name):
        return None
    try:
        dist = importlib.metadata.distribution(name)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    tables = generated_tables(f.as_posix() for f in dist.files or ())
    if not tables:
        raise CliError(
            f"{name}: an installed distribution ({dist.metadata['Name']} {dist.version}) without a generated hatch-autotune package"
        )
    return Path(str(dist.locate_file(Path(tables[0]).parent)))


def _find_importable(name: str) -> Path | None:
    """The directory of an installed package by import name, found without importing it (nor
    its parents: only the top-level name is looked up, the rest is walked as directories)."""
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
        return None
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not spec.submodule_search_locations:
        raise CliError(f"{name}: an installed module, not a package; hatch-autotune generates packages")
    for base in spec.submodule_search_locations:
        d = Path(base).joinpath(*rest)
        if d.is_dir():
            return d
    return None


def package_source(d: Path, label: str) -> Source:
    from ..wheel.outcome import OUTCOME_FILE

    dirs = generated_dirs(d)
    if not dirs:
        raise CliError(f"{label}: no generated hatch-autotune package in {d} (no table.json next to a vendored _runtime)")
    src = table_source(read_json(dirs[0] / "table.json", "selection table"), str(dirs[0] / "table.json"), "package")
    outcome = dirs[0] / OUTCOME_FILE
    try:
        data = read_regular(outcome, MAX_JSON_BYTES) if outcome.is_file() else None  # none, or not a file: no record
    except OSError as exc:
        raise _unreadable(outcome, exc, "build outcome record") from None
    return with_outcome(src, data, str(outcome))


# --------------------------------------------------------------------------------------------
# Projects: what a build would ship now, as the build's planner decides it.


def project_source(root: Path) -> Source:
    """What a build of the project would choose now, by the build's own planner: its target
    archs, checksums, lock validity and fallbacks; the shipped variants are compiled (through
    the compile cache), so a winner that no longer compiles shows as the build's fallback."""
    from collections import Counter

    from ..compile.tiers import open_compile_cache
    from ..errors import BuildError
    from ..lock import tuned_with
    from ..plan.devices import detect_gpus
    from ..plan.exclusions import summary
    from ..plan.planner import make_plan, resolve_archs, target_archs
    from ..wheel.assemble import compile_shipped, record_outcome

    project = load_project(root)
    lock_path = project.lock_file
    lock = read_lock(lock_path) if lock_path.exists() else LockFile()
    notes = [] if lock_path.exists() else [f"no lock file at {lock_path}: every entry uses its default config"]
    gpus = [] if project.archs or project.mode == Mode.OFFLINE else detect_gpus()
    if project.archs or gpus:
        archs = resolve_archs(project, gpus)  # what a build here would target
    else:  # a build here would stop for want of targets; show what the lock was tuned for
        ids = [EntryId.parse(eid) for eid in lock.entries]
        archs = target_archs(project, (i.arch for i in ids if i.kernel in project.kernels))
        notes.append(
            f"no archs declared and no GPU here: showing the archs of the lock file ({', '.join(archs)})"
            if archs
            else "no archs declared, no GPU here and none in the lock file: nothing to show"
        )
    try:
        plan = make_plan(project, archs, lock=lock)
        cache = open_compile_cache(project.settings.cache)
        shipping = compile_shipped(plan, cache, log=lambda _: None, workers=project.settings.jobs)
    except BuildError as exc:
        lines = str(exc).removeprefix("hatch-autotune: ").splitlines()
        raise CliError(lines[0], lines[1:]) from None
    rows: dict[str, Row] = {}
    for (n, arch), chosen in shipping.choices.items():
        inst = plan.instances[n]
        binaries = shipping.binaries.get((n, arch), {})
        for p, choice in chosen.items():
            default = dict(inst.spec.default) if (d := inst.point_default(p)) is None else inst.configs[d]  # what it runs untuned
            if choice.tuned:
                entry = lock.entries[p.eid]
                r = row_from_lock(p.id, entry)
                r.default_config = default
                if r.default_ms is None:
                    r.default_ms = finite_ms(entry.time_of(default))
            else:
                config = inst.configs[choice.variant_index]
                r = Row(
                    inst.spec.name,
                    inst.types_key,
                    p.id.arch,
                    p.id.bucket,
                    config,
                    False,
                    note=choice.reason,
                    fallback=choice.fallback,
                    default_config=default,
                )
            r.excluded = summary(inst.excluded(p))  # what may not run there, as the project declares it now
            r.checksum = p.checksum  # what the build would compile now: equal to a valid entry's
            compiled = binaries.get(choice.variant_index)
            r.binary = sha256_hex(compiled.binary) if compiled is not None and compiled.binary else None
            rows[p.eid] = r
    mixed = plan.policy.warning(Counter(tuned_with(r.provenance) for r in rows.values() if r.tuned))
    if mixed:
        notes.append(mixed)
    orphans = len(set(lock.entries) - set(rows))
    if orphans:
        notes.append(
            f"{orphans} lock entr{'y matches' if orphans == 1 else 'ies match'} nothing the project declares "
            "(kernel, types, arch or bucket removed)"
        )
    notes += cache.warnings()
    notes.append(PROJECT_NO_RESOURCES)
    return Source(str(root), "project", rows, list(project.kernels), notes, outcome=record_outcome(plan, shipping), ptx=dict(plan.ptx))


# --------------------------------------------------------------------------------------------
# Any of the above.


INPUTS = "project, lock file, wheel, selection table or package"  # what load_source reads


def load_source(arg: str) -> Source:
    """A project directory, a lock file, a wheel, a table.json, a generated package directory,
    or the name of an installed package."""
    path = Path(arg)
    if path.is_dir():
        if (path / "pyproject.toml").is_file():
            return project_source(path)
        if generated_dirs(path):
            return package_source(path, arg)
        raise CliError(f"{arg}: neither a project (no pyproject.toml) nor a generated package (no table.json)")
    if path.is_file():
        if path.name == "pyproject.toml":
            return project_source(path.parent)
        if path.suffix == ".whl" or zipfile.is_zipfile(path):
            return wheel_source(path)
        data = read_json(path, "lock file")
        if isinstance(data, dict) and "kernels" in data and "entries" not in data:
            return table_source(data, str(path), "table")
        return lock_source(path, data)
    if path.exists():  # neither a directory nor a regular file: a pipe, a device, a socket
        read_json(path, INPUTS)  # says which, at once (never opened for long: a pipe blocks no one)
    if path.suffix in (".json", ".whl", ".toml") or os.sep in arg:
        raise CliError(f"{arg}: no such file")
    installed = find_installed(arg)
    if installed is None:
        raise CliError(f"{arg}: no such file, directory or installed package")
    return package_source(installed, arg)
