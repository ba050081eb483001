"""What a change of NVRTC version does to a lock entry (`NvrtcPolicy`), and the version an
entry was tuned with, as its provenance records it (`tuned_with`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .entry import LockEntry

NOT_RECORDED = "(not recorded)"


def tuned_with(provenance: Mapping[str, Any]) -> str:
    """The NVRTC major.minor an entry was tuned with, as its provenance records it."""
    return str(provenance.get("nvrtc") or NOT_RECORDED)


@dataclass(frozen=True)
class NvrtcPolicy:
    """What a change of NVRTC version does to a lock entry. The version an entry was tuned with
    is recorded in its provenance; by default another one is reported, not invalidating (a
    winner measured with 13.0 is still the best guess under 13.5). `exact-nvrtc = true` makes an
    entry tuned with another major.minor stale, for projects that want every shipped winner
    measured with the compiler that built it."""

    nvrtc: str  # this build's NVRTC, 'major.minor'
    exact: bool = False

    def problem(self, entry: LockEntry) -> str | None:
        """Why exact-nvrtc refuses this (tuned, checksum-valid) entry; None if it does not."""
        version = tuned_with(entry.provenance)
        if not self.exact or version == self.nvrtc:
            return None
        return f"tuned with NVRTC {version}, this build uses {self.nvrtc} and exact-nvrtc = true"

    def warning(self, versions: Counter[str]) -> str | None:
        """One line about the winners in use that another NVRTC measured, or None;
        `versions`: NVRTC version -> how many of the entries in use were tuned with it."""
        others = {v: n for v, n in versions.most_common() if v not in (self.nvrtc, NOT_RECORDED)}
        if not others:
            return None
        n, most = sum(others.values()), next(iter(others))
        named = most if len(others) == 1 else " and ".join(f"{v} ({k})" for v, k in others.items())
        return (
            f"{n} lock entr{'y was' if n == 1 else 'ies were'} tuned with NVRTC {named} and this build uses NVRTC {self.nvrtc}: "
            f"{'its winner is' if n == 1 else 'their winners are'} used (exact-nvrtc = true re-tunes them instead; "
            f"pin nvidia-cuda-nvrtc=={most}.* in build-system.requires for byte-identical binaries)"
        )
