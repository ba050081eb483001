"""Reading what a user has at hand into one model, strictly.

A project (pyproject.toml), its lock file, a built wheel, a selection table, a generated package
or an installed package: `load_source` reads any of them into a `Source` (a list of `Entry`, one
per kernel / type instance / arch / bucket), so that every subcommand of the `hatch-autotune`
command works on all of them. A missing, foreign, corrupt or newer-schema file is a `CliError`
with one line to show, never a traceback (the build hook, by contrast, only warns and falls back).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from . import __version__
from .lock import LOCK_SCHEMA, entry_id

TIMED = ("ok", "eliminated")  # measurement statuses that carry a median
LOCK_NO_RESOURCES = "a lock file has no resource usage (registers, shared memory); the wheel has"
PROJECT_NO_RESOURCES = "a project has no resource usage until it is built; its wheel has"
TABLE_NO_TIMES = "a selection table has no measurements (times); the lock file has"



class CliError(Exception):
    """Bad input or a refused operation: printed as one `hatch-autotune: error:` line."""

    def __init__(self, message: str, details: Sequence[str] = ()):
        super().__init__(message)
        self.details = list(details)


# --------------------------------------------------------------------------------------------
# The model every subcommand works on.


@dataclass
class Entry:
    """The choice for one (kernel, type instance, arch, bucket), with what is known about it."""

    kernel: str
    types: str  # types_key: 'T=float32', or '-' for a kernel without type parameters
    arch: str
    bucket: dict[str, int]
    config: dict[str, Any]
    tuned: bool
    note: str = ""  # why an untuned entry took its config
    time_ms: float | None = None  # median of the chosen config
    default_ms: float | None = None  # median of the default config
    default_config: dict[str, Any] | None = None
    measurements: list[dict[str, Any]] = field(default_factory=list)
    resources: dict[str, Any] | None = None  # ptxas usage of the chosen variant (tables only)
    variant: str | None = None  # variant id in a selection table
    checksum: str | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def eid(self) -> str:
        return entry_id(self.kernel, self.types, self.arch, self.bucket)

    @property
    def speedup(self) -> float | None:
        """Default time over chosen time; 1.0 when the default is the choice."""
        if self.time_ms and self.default_ms:
            return self.default_ms / self.time_ms
        if self.default_config is not None and self.config == self.default_config and (self.time_ms or self.default_ms):
            return 1.0
        return None

    def sort_key(self) -> tuple:
        return (self.types, _arch_key(self.arch), tuple(self.bucket.values()))


@dataclass
class Source:
    """Entries read from one input, with where they came from and what is missing from them."""

    label: str
    kind: str  # project | lock | wheel | package | table
    entries: dict[str, Entry]
    kernels: list[str]  # in the input's order
    notes: list[str] = field(default_factory=list)

    @property
    def has_resources(self) -> bool:
        return any(e.resources for e in self.entries.values())

    def by_kernel(self, only: Sequence[str] | None = None) -> list[tuple[str, list[Entry]]]:
        groups: dict[str, list[Entry]] = {k: [] for k in self.kernels}
        for e in self.entries.values():
            groups.setdefault(e.kernel, []).append(e)
        return [
            (k, sorted(rows, key=Entry.sort_key)) for k, rows in groups.items() if rows and (not only or k in only)
        ]


def _arch_key(arch: str) -> tuple:
    from .runtime import parse_arch

    try:
        kind, major, minor, suffix = parse_arch(arch)
    except ValueError:
        return (arch, 0, 0, "")
    return (kind, major, minor, suffix)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def fmt_config(config: dict[str, Any] | None) -> str:
    if config is None:
        return "-"
    return " ".join(f"{k}={config[k]}" for k in sorted(config)) or "-"  # sorted, as in lock and table files


def fmt_bucket(bucket: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in bucket.items())


def fmt_ms(ms: float | None) -> str:
    """Four significant digits: small kernels run in microseconds, big ones in milliseconds."""
    return "-" if ms is None else f"{ms:#.4g}"


def fmt_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError


# --------------------------------------------------------------------------------------------
# Strict readers.


def read_json(path: Path, what: str) -> Any:
    if not path.exists():
        raise CliError(f"{path}: no such file")
    if path.is_dir():
        raise CliError(f"{path}: is a directory, expected a {what}")
    if zipfile.is_zipfile(path):
        raise CliError(f"{path}: is a zip archive (a wheel?), expected a {what}")
    try:
        return json.loads(path.read_bytes())
    except OSError as exc:
        raise CliError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise CliError(f"{path}: not a {what} (not JSON text)") from None
    except ValueError as exc:
        raise CliError(f"{path}: corrupt {what}: not valid JSON ({exc})") from None


def parse_entry_id(eid: Any, label: str) -> tuple[str, str, str, dict[str, int]]:
    """'saxpy|T=float32|sm_90|n=4096' -> ('saxpy', 'T=float32', 'sm_90', {'n': 4096})."""
    parts = eid.split("|") if isinstance(eid, str) else []
    bucket: dict[str, int] = {}
    if len(parts) == 4 and all(parts[:3]):
        for item in parts[3].split(","):
            name, sep, value = item.partition("=")
            if not (sep and name and re.fullmatch(r"-?\d+", value)):
                break
            bucket[name] = int(value)
        else:
            return parts[0], parts[1], parts[2], bucket
    raise CliError(f"{label}: entry id {eid!r} is not 'kernel|types|arch|dim=value,...'")


def _check_schema(data: dict[str, Any], supported: int, label: str, what: str) -> None:
    schema = data.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise CliError(f"{label}: {what} has no valid schema version (got {schema!r})")
    if schema > supported:
        raise CliError(
            f"{label}: {what} schema {schema} is newer than this hatch-autotune {__version__} reads "
            f"(schema {supported}); upgrade hatch-autotune"
        )
    if schema != supported:
        raise CliError(f"{label}: {what} schema {schema} is not supported (this hatch-autotune reads schema {supported})")


def _lock_entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return "not an object"
    if not isinstance(entry.get("checksum"), str):
        return "no checksum"
    if not isinstance(entry.get("config"), dict):
        return "no config"
    if not isinstance(entry.get("tuned"), bool):
        return "no tuned flag"
    if not isinstance(entry.get("provenance", {}), dict):
        return "provenance is not an object"
    ms = entry.get("measurements", [])
    if not isinstance(ms, list) or not all(isinstance(m, dict) and isinstance(m.get("config"), dict) for m in ms):
        return "measurements are not a list of objects with a config"
    if "default_ms" in entry and entry["default_ms"] is not None and _num(entry["default_ms"]) is None:
        return "default_ms is not a number"
    return None


def parse_lock(data: Any, label: str) -> dict[str, dict[str, Any]]:
    """A lock file's entries, or CliError naming what is wrong with it."""
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict) or "schema" not in data:
        raise CliError(f"{label}: not a hatch-autotune lock file (expected a JSON object with \"schema\" and \"entries\")")
    _check_schema(data, LOCK_SCHEMA, label, "lock file")
    for eid, entry in data["entries"].items():
        parse_entry_id(eid, label)
        problem = _lock_entry_problem(entry)
        if problem:
            raise CliError(f"{label}: entry {eid!r} is malformed ({problem})")
    return data["entries"]


def read_lock(path: Path) -> dict[str, dict[str, Any]]:
    return parse_lock(read_json(path, "lock file"), str(path))


def time_of(measurements: list[dict[str, Any]], config: dict[str, Any]) -> float | None:
    times = [(m.get("status") != "ok", _num(m.get("median_ms"))) for m in measurements if m.get("config") == config and m.get("status") in TIMED]
    times = [t for t in times if t[1] is not None]
    return min(times)[1] if times else None


def lock_entry(eid: str, raw: dict[str, Any], label: str) -> Entry:
    kernel, types, arch, bucket = parse_entry_id(eid, label)
    ms = list(raw.get("measurements", []))
    default_ms = _num(raw.get("default_ms"))
    default_config = dict(raw["default"]) if isinstance(raw.get("default"), dict) else None
    if default_config is None and default_ms is not None:  # older entries: the default's time identifies it
        same = [m["config"] for m in ms if m.get("status") in TIMED and _num(m.get("median_ms")) == default_ms]
        if len(same) == 1:
            default_config = same[0]
    return Entry(
        kernel=kernel,
        types=types,
        arch=arch,
        bucket=bucket,
        config=dict(raw["config"]),
        tuned=raw["tuned"],
        note="" if raw["tuned"] else "lock entry is untuned",
        time_ms=time_of(ms, raw["config"]),
        default_ms=default_ms,
        default_config=default_config,
        measurements=ms,
        checksum=raw["checksum"],
        provenance=dict(raw.get("provenance", {})),
    )


def lock_source(path: Path, data: Any = None) -> Source:
    raw = parse_lock(data, str(path)) if data is not None else read_lock(path)
    entries = {eid: lock_entry(eid, e, str(path)) for eid, e in raw.items()}
    kernels = sorted({e.kernel for e in entries.values()})
    return Source(str(path), "lock", entries, kernels, [LOCK_NO_RESOURCES])


def table_source(table: Any, label: str, kind: str) -> Source:
    """Entries of a selection table (table.json of a wheel or an installed package)."""
    from .runtime import TABLE_SCHEMA

    if not isinstance(table, dict) or not isinstance(table.get("kernels"), dict) or "schema" not in table:
        raise CliError(f"{label}: not a hatch-autotune selection table (expected \"schema\" and \"kernels\")")
    _check_schema(table, TABLE_SCHEMA, label, "selection table")
    entries: dict[str, Entry] = {}
    try:
        for name, kernel in table["kernels"].items():
            names = [k["name"] for k in kernel["key"]]
            for tkey, per_arch in kernel["select"].items():
                for arch, rows in per_arch.items():
                    for row in rows:
                        variant = kernel["variants"][row["variant"]]
                        prov = dict(row.get("provenance") or {})
                        e = Entry(
                            kernel=name,
                            types=tkey,
                            arch=arch,
                            bucket={n: int(b) for n, b in zip(names, row["bucket"], strict=True)},
                            config=dict(variant["config"]),
                            tuned=bool(row["tuned"]),
                            note="" if row["tuned"] else str(prov.pop("reason", "default config")),
                            time_ms=_num(prov.get("median_ms")),
                            default_ms=_num(prov.get("default_ms")),
                            resources=(variant.get("resources") or {}).get(arch),
                            variant=row["variant"],
                            provenance=prov,
                        )
                        entries[e.eid] = e
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CliError(f"{label}: malformed selection table ({type(exc).__name__}: {exc})") from None
    return Source(label, kind, entries, list(table["kernels"]), [TABLE_NO_TIMES])


def _is_generated_dir(d: Path) -> bool:
    return (d / "table.json").is_file() and (d / "_runtime.py").is_file()


def generated_dirs(root: Path) -> list[Path]:
    """Generated packages (table.json next to _runtime.py) at or below root, nearest first."""
    if _is_generated_dir(root):
        return [root]
    found = sorted({p.parent for p in root.rglob("table.json") if _is_generated_dir(p.parent)}, key=lambda p: (len(p.parts), p))
    return found


def wheel_source(path: Path) -> Source:
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            tables = sorted(n for n in names if n.endswith("/table.json") and n[: -len("table.json")] + "_runtime.py" in names)
            if not tables:
                raise CliError(f"{path}: no hatch-autotune selection table in this wheel (no */table.json next to _runtime.py)")
            data = zf.read(tables[0])
    except zipfile.BadZipFile:
        raise CliError(f"{path}: not a wheel (not a zip archive)") from None
    except OSError as exc:
        raise CliError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    label = f"{path}!{tables[0]}"
    try:
        table = json.loads(data)
    except ValueError as exc:
        raise CliError(f"{label}: corrupt selection table: not valid JSON ({exc})") from None
    return table_source(table, label, "wheel")


def find_installed(name: str) -> Path | None:
    """The directory of an installed package, found without importing it (nor its parents:
    only the top-level name is looked up, the rest is walked as directories)."""
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
    dirs = generated_dirs(d)
    if not dirs:
        raise CliError(f"{label}: no generated hatch-autotune package in {d} (no table.json next to _runtime.py)")
    return table_source(read_json(dirs[0] / "table.json", "selection table"), str(dirs[0] / "table.json"), "package")


def hook_table(pyproject: Path) -> tuple[Any, str]:
    import tomllib

    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError(f"{pyproject}: cannot read it ({exc.strerror or exc})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise CliError(f"{pyproject}: not valid TOML ({exc})") from None
    hatch = data.get("tool", {}).get("hatch", {}) if isinstance(data.get("tool"), dict) else {}
    build = hatch.get("build", {}) if isinstance(hatch, dict) else {}
    target = build.get("targets", {}).get("wheel", {}).get("hooks", {}) if isinstance(build, dict) else {}
    if isinstance(target, dict) and "autotune" in target:
        return target["autotune"], "tool.hatch.build.targets.wheel.hooks.autotune"
    hooks = build.get("hooks", {}) if isinstance(build, dict) else {}
    if isinstance(hooks, dict) and "autotune" in hooks:
        return hooks["autotune"], "tool.hatch.build.hooks.autotune"
    raise CliError(f"{pyproject}: no [tool.hatch.build.targets.wheel.hooks.autotune] table: not a hatch-autotune project")


def load_project(root: Path) -> Any:
    """The project's ProjectSpec; configuration errors become one line listing them all."""
    from .config import ConfigError, parse_project

    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        raise CliError(f"{root}: no pyproject.toml: not a project directory")
    table, path = hook_table(pyproject)
    try:
        return parse_project(table, root, path=path, env=os.environ)
    except ConfigError as exc:
        raise CliError(f"{pyproject}: {len(exc.errors)} configuration error(s): " + "; ".join(exc.errors)) from None


def project_source(root: Path) -> Source:
    """What a build of the project would choose now: the lock's valid winners, else defaults.

    Renders the templates (no compile) to recompute each entry's checksum, as the build does.
    """
    from collections import Counter

    from . import compile as compile_mod
    from .lock import LockFile, NvrtcPolicy, choose, entries_for, tuned_with
    from .render import TemplateError, render_kernel

    project = load_project(root)
    lock_path = project.lock_file
    raw_lock = read_lock(lock_path) if lock_path.exists() else {}
    notes = [] if lock_path.exists() else [f"no lock file at {lock_path}: every entry uses its default config"]
    try:
        policy: NvrtcPolicy | None = NvrtcPolicy(compile_mod.nvrtc_version(), project.exact_nvrtc)
    except Exception:  # no NVRTC here: only the version rule cannot be applied (not in the checksum)
        policy = None
        if project.exact_nvrtc:
            notes.append("NVRTC is not available here: exact-nvrtc = true was not checked")
    lock_archs = {}
    for eid in raw_lock:
        kernel, _, arch, _ = parse_entry_id(eid, str(lock_path))
        lock_archs.setdefault(kernel, set()).add(arch)
    entries: dict[str, Entry] = {}
    used: set[str] = set()
    lock = LockFile(entries=raw_lock)
    for name, spec in project.kernels.items():
        try:
            rendered = render_kernel(spec)
        except TemplateError as exc:
            raise CliError(str(exc)) from None
        archs = project.archs or tuple(sorted(lock_archs.get(name, ()), key=_arch_key))
        for tkey, variants in rendered.items():
            configs = [v.config_dict for v in variants]
            default_index = configs.index(dict(spec.default))
            hashes = [v.source_hash for v in variants]
            for arch in archs:
                for key in entries_for(spec, tkey, hashes, arch):
                    eid, bucket, raw = key.eid, key.bucket, raw_lock.get(key.eid)
                    if raw is not None:
                        used.add(eid)
                    choice = choose(lock, eid, key.checksum, configs, [True] * len(configs), default_index, policy)  # the build's rule
                    if choice.tuned:
                        e = lock_entry(eid, raw, str(lock_path))
                        e.default_config = dict(spec.default)
                        if e.default_ms is None:
                            e.default_ms = time_of(e.measurements, dict(spec.default))
                    else:
                        e = Entry(name, tkey, arch, bucket, dict(spec.default), False, default_config=dict(spec.default))
                        e.note = choice.reason
                    entries[eid] = e
        if not archs:
            notes.append(f"{name}: no archs declared and none in the lock file: nothing to show")
    mixed = policy and policy.warning(Counter(tuned_with(e.provenance) for e in entries.values() if e.tuned))
    if mixed:
        notes.append(mixed)
    orphans = len(set(raw_lock) - used)
    if orphans:
        notes.append(
            f"{orphans} lock entr{'y matches' if orphans == 1 else 'ies match'} nothing the project declares "
            "(kernel, types, arch or bucket removed)"
        )
    notes.append(PROJECT_NO_RESOURCES)
    return Source(str(root), "project", entries, list(project.kernels), notes)


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
    if path.suffix in (".json", ".whl", ".toml") or os.sep in arg:
        raise CliError(f"{arg}: no such file")
    installed = find_installed(arg)
    if installed is None:
        raise CliError(f"{arg}: no such file, directory or installed package")
    return package_source(installed, arg)


def combine(sources: Sequence[Source]) -> Source:
    """One view of several inputs (e.g. a lock file for the times plus a wheel for the
    resources): the first input that knows a field provides it."""
    if len(sources) == 1:
        return sources[0]
    entries: dict[str, Entry] = {}
    kernels: list[str] = []
    notes: list[str] = []
    for src in sources:
        kernels += [k for k in src.kernels if k not in kernels]
        for eid, e in src.entries.items():
            have = entries.get(eid)
            if have is None:
                entries[eid] = dataclasses.replace(e, measurements=list(e.measurements))
            elif have.config != e.config:
                notes.append(f"{eid}: {src.label} chose {fmt_config(e.config)}; shown: {fmt_config(have.config)}")
            else:
                for f in ("time_ms", "default_ms", "default_config", "resources", "variant", "checksum"):
                    if getattr(have, f) is None:
                        setattr(have, f, getattr(e, f))
                have.measurements = have.measurements or list(e.measurements)
    merged = Source(" + ".join(s.label for s in sources), "+".join(s.kind for s in sources), entries, kernels)
    timed = any(e.measurements for e in entries.values())
    for src in sources:  # drop "X is missing" notes that another input made up for
        for n in src.notes:
            if n not in notes and not (merged.has_resources and n in (LOCK_NO_RESOURCES, PROJECT_NO_RESOURCES)) and not (timed and n == TABLE_NO_TIMES):
                notes.append(n)
    merged.notes = notes
    return merged


def provenance_lines(entries: Sequence[Entry]) -> list[str]:
    seen: dict[tuple, list[str]] = {}
    for e in entries:
        p = e.provenance
        if e.tuned and p.get("gpu"):
            key = (p.get("gpu"), p.get("cc"), p.get("driver"), p.get("nvrtc"))
            seen.setdefault(key, []).append(str(p.get("date", "")))
    out = []
    for (gpu, cc, driver, nvrtc), dates in seen.items():
        dates = sorted(d for d in dates if d)
        when = f", {dates[0][:10]}" + (f" to {dates[-1][:10]}" if dates[-1][:10] != dates[0][:10] else "") if dates else ""
        out.append(f"tuned on {gpu} (cc {cc}, driver {driver}, NVRTC {nvrtc}){when}")
    return out
