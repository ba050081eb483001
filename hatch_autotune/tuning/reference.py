"""A bucket's reference: what every variant's outputs are verified against, settled before the
search. The kernel's reference function when it declares one; else the default config's outputs
(or, if it cannot run, the first config's that runs), trusted once a structurally different
config agrees with them: a wrong default would otherwise make every variant "verified"."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..declare.config import KernelSpec
from ..lock import Measurement, Status
from ..text import Log
from .choice import measured
from .errors import TuningError
from .worker_client import WorkerDied

WITNESS_LOOKS = 64  # configs looked at (compiled) for a second opinion on the reference, at most
DISSENT = 3  # witnesses that may disagree with the default before the majority is asked


class Candidates(Protocol):
    """The bucket being tuned (bucket.py's `BucketTuning`), as settling its reference uses it."""

    @property
    def configs(self) -> Sequence[Mapping[str, Any]]: ...

    def runnable(self, ranked: Sequence[int], limit: int) -> Iterator[int]:
        """The configs of `ranked` that can run, in order, at most `limit` looked at."""
        ...

    def check(self, i: int) -> tuple[bool, str | None]:
        """Whether config i ran against the reference, and why its outputs disagree."""
        ...

    def adopt(self, i: int) -> None:
        """Config i's outputs made the reference in the worker (WorkerDied: it died)."""
        ...

    def record(self, m: Measurement) -> float | None:
        """Keep a config's measurement."""
        ...


@dataclass(frozen=True)
class Settled:
    """The reference a bucket's variants are verified against."""

    index: int | None  # the config whose outputs are the reference (None: the user's function, or nothing runs)
    text: str  # what the lock records: what every variant was verified against


def settle_reference(bucket: Candidates, spec: KernelSpec, eid: str, default: int, log: Log) -> Settled:
    """The kernel's reference function, when it declares one; else the outputs of the default
    config (`default`; or, if it cannot run, the first config that runs), trusted once a
    structurally different config agrees with them. Witnesses are checked until one agrees, at
    most DISSENT disagreeing; when all of those disagree with the default but agree among
    themselves, the default is the odd one out and the first of them becomes the reference;
    with no agreement anywhere nothing can be trusted, and the bucket is an error that says to
    declare a reference function."""
    configs = bucket.configs
    if spec.reference is not None:
        return Settled(None, f"the kernel's reference function {spec.reference}")
    anchor = None
    for i in bucket.runnable([default, *(i for i in range(len(configs)) if i != default)], len(configs)):
        try:
            bucket.adopt(i)
        except WorkerDied as exc:
            bucket.record(measured(i, configs[i], Status.FAILED, reason=str(exc)))
            continue
        anchor = i
        break
    if anchor is None:
        return Settled(None, "")  # nothing runs: the search finds every config failed or pruned, and says so
    name = "the default config" if anchor == default else f"config {anchor} (the default cannot run)"
    skip: set[int] = set()
    dissent: list[tuple[int, str]] = []
    while len(dissent) < DISSENT:
        found = _witness(bucket, [anchor, *(i for i, _ in dissent)], skip)
        if found is None:
            break
        i, why = found
        if why is None:
            others = f"; {len(dissent)} other config(s) disagreed, first config {dissent[0][0]}" if dissent else ""
            return Settled(anchor, f"{name}, cross-checked with config {i}{others}")
        dissent.append((i, why))
    if not dissent:
        return Settled(anchor, f"{name}, not cross-checked: no other config runs")

    def described(ix: Iterable[int]) -> str:
        return ", ".join(f"config {i} {dict(configs[i])}" for i in ix)

    if len(dissent) == 1:
        raise TuningError(
            f"{eid}: the outputs of {described([anchor, dissent[0][0]])} differ ({dissent[0][1]}) and no third config "
            f"runs to tell which is right; declare a `reference` function for kernel {spec.name!r}"
        )
    first = dissent[0][0]
    bucket.adopt(first)  # is it the default that is wrong?
    agreeing = [i for i, _ in dissent[1:] if bucket.check(i) == (True, None)]
    if agreeing:
        log(
            f"warning: {eid}: the outputs of {name} {dict(configs[anchor])} differ from those of configs "
            f"{', '.join(str(i) for i, _ in dissent)}, which agree with one another: it is rejected as wrong "
            f"(declare a `reference` function for kernel {spec.name!r} to verify against known-good outputs)"
        )
        return Settled(first, f"config {first}, cross-checked with config {agreeing[0]} ({name} disagreed with {len(dissent)} configs)")
    raise TuningError(
        f"{eid}: {described([anchor, *(i for i, _ in dissent)])} all give different results "
        f"({'; '.join(why for _, why in dissent)}): no output can be trusted as the reference; declare a `reference` "
        f"function for kernel {spec.name!r}"
    )


def _witness(bucket: Candidates, chosen: Sequence[int], skip: set[int]) -> tuple[int, str | None] | None:
    """The runnable config most unlike the configs `chosen` so far (the most axes that differ,
    summed over them: each witness differs from the reference and from the other witnesses, so
    that a bug tied to one parameter value cannot outvote it), and its check against the
    reference (None: it agrees); None when no other config runs."""
    configs = bucket.configs

    def unlike(i: int) -> int:
        return sum(configs[i].get(k) != v for c in chosen for k, v in configs[c].items())

    ranked = sorted((i for i in range(len(configs)) if i not in skip and i not in chosen), key=lambda i: (-unlike(i), i))
    for i in bucket.runnable(ranked, WITNESS_LOOKS - len(skip)):
        ran, why = bucket.check(i)
        skip.add(i)
        if ran:
            return i, why
    return None
