"""The build's outcome, recorded in the wheel as `outcome.json` next to the selection table: per
entry whether it runs a tuned winner, the default config or a fallback, and why; per kernel,
type instance and arch the variants that failed to compile, with the first lines of their logs.

pip shows a build backend's output only with `-v` (or when the build fails), so a plain
`pip wheel .` says nothing about untuned entries or failed variants; this record is how they
are seen afterwards (`hatch-autotune show WHEEL`). The runtime never reads it.

One owner of the format: `Outcome` (schema, writer `to_bytes`, lenient reader `read`), plus
the groupings the build log and `show` both print. Everything in it is a pure function of the
plan and what compiled (no dates, no absolute paths, nothing that depends on the compile
cache), so two builds from the same lock file still give byte-identical wheels.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..lock import EntryId, LockFormatError
from ..runtime import load_json
from ..text import log_excerpt

OUTCOME_FILE = "outcome.json"
OUTCOME_SCHEMA = 1
LOGS_PER_GROUP = 5  # failures per kernel, type instance and arch whose log is kept; the rest by name


class EntryStatus(StrEnum):
    """What an entry runs in the wheel; the record writes the value."""

    TUNED = "tuned"  # its tuned winner
    DEFAULT = "default"  # the default config
    FALLBACK = "fallback"  # not the default: the plain arch's winner (sm_90a: sm_90's), or the default may not run or compile

    @classmethod
    def of(cls, tuned: bool, fallback: bool) -> EntryStatus:
        """The status of a choice that is tuned or not, and a fallback or not."""
        return cls.TUNED if tuned else cls.FALLBACK if fallback else cls.DEFAULT


@dataclass(frozen=True)
class EntryOutcome:
    """What one entry (kernel, type instance, arch, bucket) runs in the wheel, and why."""

    id: EntryId
    status: EntryStatus
    config: Mapping[str, Any]
    reason: str = ""  # why it is not tuned; "" for a tuned entry

    @property
    def eid(self) -> str:
        return str(self.id)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.eid, "status": str(self.status), "config": dict(self.config), "reason": self.reason}


@dataclass(frozen=True)
class CompileFailure:
    """A variant binary that NVRTC could not compile for one arch: not in the wheel."""

    kernel: str
    types: str  # types key
    arch: str
    variant: str  # its (first) config's label, 'scale[BLOCK=64, BAD=true]'
    config: Mapping[str, Any]
    log: str = ""  # the log's first lines; "" where it was not kept (see LOGS_PER_GROUP)
    configs: int = 1  # configs that render this source (they differ only in launch geometry), so share its failure

    @property
    def group(self) -> tuple[str, str, str]:
        return (self.kernel, self.types, self.arch)

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "types": self.types,
            "arch": self.arch,
            "variant": self.variant,
            "config": dict(self.config),
            "log": self.log,
            "configs": self.configs,
        }


@dataclass(frozen=True)
class Outcome:
    """Everything a build decided that the selection table does not say: which entries fell
    back and why, and what failed to compile."""

    entries: tuple[EntryOutcome, ...]
    failures: tuple[CompileFailure, ...] = ()
    shipped: int | None = None  # binaries (cubins and PTX) in the wheel; None: not built (a project)
    default_may_fail: bool = False
    notes: tuple[str, ...] = field(default=(), compare=False)  # what the reader skipped; never written

    @staticmethod
    def failures_of(results: Sequence[tuple[str, str, str, str, Mapping[str, Any], str, str]]) -> tuple[CompileFailure, ...]:
        """(kernel, types, arch, label, config, source hash, log) of each config that failed to
        compile, in build order, to one failure per binary (configs of one source share it, as
        the build's counts do), the log kept (its first lines) for the first LOGS_PER_GROUP of
        each kernel, type instance and arch, so that a space where everything fails stays small."""
        by_binary: dict[tuple[str, str, str, str], CompileFailure] = {}
        logged: dict[tuple[str, str, str], int] = {}
        for kernel, types, arch, label, config, source, log in results:
            seen = by_binary.get((kernel, types, arch, source))
            if seen is not None:
                by_binary[(kernel, types, arch, source)] = dataclasses.replace(seen, configs=seen.configs + 1)
                continue
            n = logged.get((kernel, types, arch), 0)
            logged[(kernel, types, arch)] = n + 1
            by_binary[(kernel, types, arch, source)] = CompileFailure(
                kernel, types, arch, label, dict(config), log_excerpt(log) if n < LOGS_PER_GROUP else ""
            )
        return tuple(by_binary.values())

    # ---- what the build log and `show` print ------------------------------------------------

    def count(self, status: EntryStatus) -> int:
        return sum(e.status == status for e in self.entries)

    def untuned(self) -> dict[tuple[str, EntryStatus, str], list[str]]:
        """Entry ids that are not tuned, by (kernel, status, reason), in entry order."""
        groups: dict[tuple[str, EntryStatus, str], list[str]] = {}
        for e in self.entries:
            if e.status != EntryStatus.TUNED:
                groups.setdefault((e.id.kernel, e.status, e.reason), []).append(e.eid)
        return groups

    def failure_groups(self) -> dict[tuple[str, str, str], list[CompileFailure]]:
        """Compile failures by (kernel, types key, arch), in build order."""
        groups: dict[tuple[str, str, str], list[CompileFailure]] = {}
        for f in self.failures:
            groups.setdefault(f.group, []).append(f)
        return groups

    def summary(self) -> str:
        """'36 entries: 30 tuned, 6 on the default config; 12 variant binaries failed to compile'."""
        n = len(self.entries)
        tuned, default, fallback = (self.count(s) for s in (EntryStatus.TUNED, EntryStatus.DEFAULT, EntryStatus.FALLBACK))
        parts = [f"{tuned} tuned", f"{default} on the default config"]
        if fallback:
            parts.append(
                f"{fallback} on a fallback (an arch-specific target's plain arch's winner, or the default config does not compile "
                "or may not run at that bucket and arch)"
            )
        text = f"{n} entr{'y' if n == 1 else 'ies'}: " + ", ".join(parts)
        if self.failures:
            text += f"; {len(self.failures)} variant binar{'y' if len(self.failures) == 1 else 'ies'} failed to compile"
        return text

    # ---- the format --------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": OUTCOME_SCHEMA,
            "default_may_fail": self.default_may_fail,
            "shipped": self.shipped,
            "entries": [e.to_json() for e in self.entries],
            "failures": [f.to_json() for f in self.failures],
        }

    def to_bytes(self) -> bytes:
        """The one writer: sorted keys, a fixed layout, entries in build order."""
        return (json.dumps(self.to_json(), sort_keys=True, indent=1) + "\n").encode()

    @classmethod
    def read(cls, data: bytes | str | None, label: str) -> Outcome | None:
        """The lenient reader (for `show`, never the runtime): None for no record (a wheel of an
        older hatch-autotune); an unreadable, foreign or newer record is an empty Outcome whose
        note says so; a malformed item is skipped, and counted in a note."""
        if data is None:
            return None
        try:
            raw = load_json(data)
        except (ValueError, UnicodeDecodeError) as exc:
            return cls((), notes=(f"{label}: damaged outcome record, not read ({exc})",))
        if not isinstance(raw, dict) or not isinstance(raw.get("schema"), int) or isinstance(raw.get("schema"), bool):
            return cls((), notes=(f"{label}: not a hatch-autotune outcome record; not read",))
        if raw["schema"] > OUTCOME_SCHEMA:
            return cls(
                (),
                notes=(
                    f"{label}: outcome record schema {raw['schema']} is newer than this hatch-autotune reads ({OUTCOME_SCHEMA}); upgrade hatch-autotune",
                ),
            )
        entries, failures, skipped = [], [], 0
        listed = {k: raw[k] if isinstance(raw.get(k), list) else [] for k in ("entries", "failures")}
        for item in listed["entries"]:
            try:
                status = EntryStatus(item["status"])  # ValueError for a status this version does not know
                if not isinstance(item["config"], dict) or not isinstance(item.get("reason", ""), str):
                    raise ValueError(status)
                entries.append(EntryOutcome(EntryId.parse(item["id"]), status, item["config"], item.get("reason", "")))
            except (KeyError, TypeError, ValueError, LockFormatError):
                skipped += 1
        for item in listed["failures"]:
            try:
                texts = [item[k] for k in ("kernel", "types", "arch", "variant", "log")]
                configs = item.get("configs", 1)
                if not all(isinstance(t, str) for t in texts) or not isinstance(item["config"], dict) or type(configs) is not int:
                    raise ValueError(item)
                kernel, types, arch, variant, log = texts
                failures.append(CompileFailure(kernel, types, arch, variant, item["config"], log, configs))
            except (KeyError, TypeError, ValueError):
                skipped += 1
        shipped = raw.get("shipped")
        notes = (f"{label}: {skipped} malformed item(s) of the outcome record skipped",) if skipped else ()
        return cls(
            tuple(entries),
            tuple(failures),
            shipped if isinstance(shipped, int) and not isinstance(shipped, bool) else None,
            raw.get("default_may_fail") is True,
            notes,
        )
