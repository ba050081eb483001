"""What one bucket's tuning found, summed up: the winner, every config's measurement (skipped ones
too), the log line that says how the bucket went and the lock entry it becomes."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..lock import LockEntry, Measurement, Runoff, Status
from ..plan.planner import PROVENANCE_MAX_CHARS
from ..text import Log, log_excerpt
from .choice import RunoffResult, choose_winner, measured
from .errors import TuningError


@dataclass(frozen=True)
class BucketResult:
    """One bucket's tuning once its search and runoff are done (bucket.py's `BucketTuning`)."""

    eid: str
    checksum: str  # the point's, which the entry records
    configs: Sequence[Mapping[str, Any]]
    default_index: int
    default: Mapping[str, Any]  # the kernel's default config
    measurements: Mapping[int, Measurement]  # by config index: every config tried
    runoff: RunoffResult | None  # the runoff among the search's contenders, if one was run
    strategy: str  # the search, in words (bucket.strategy_text)
    seconds: float  # the search's clock: compiling and measuring
    prior: int  # earlier results the search took as its prior
    phases: Mapping[str, float]  # the worker's seconds per phase
    costs: Mapping[str, float]  # the bucket's wall time, by where it went (bucket.COSTS)
    reference: str  # what every variant was verified against
    provenance: Mapping[str, Any]  # where and with what it was tuned (bucket.provenance)
    candidates: Sequence[int] | None = None  # the configs that may serve the point (None: every one)
    excluded: Mapping[str, int] = field(default_factory=dict)  # the others, counted by what excluded them

    def entry(self, compile_log: Callable[[int], str], log: Log) -> LockEntry:
        """The lock entry: the winner, every config's measurement (skipped ones too), the
        default's time and where it was measured; TuningError when nothing ran. `compile_log`
        is config i's NVRTC log, quoted when the first config that failed did not compile."""
        configs, default_index, measurements = self.configs, self.default_index, self.measurements
        skipped = f"not tried by the search ({self.strategy})"
        cand = range(len(configs)) if self.candidates is None else self.candidates
        ordered = [measurements.get(i) or measured(i, configs[i], Status.SKIPPED, reason=skipped) for i in cand]
        winner = self.runoff.winner if self.runoff is not None and self.runoff.winner is not None else choose_winner(ordered, default_index)
        if winner is None or winner.median_ms is None:
            first = next((m for m in ordered if m.status in (Status.FAILED, Status.REJECTED, Status.PRUNED)), ordered[0])
            detail = f":\n{log_excerpt(compile_log(first.index))}" if first.reason == "did not compile" and first.index is not None else ""
            tried = "tried " if len(measurements) < len(ordered) else ""
            raise TuningError(
                f"{self.eid}: every variant {tried}failed or was rejected; the first ({first.config}): {first.reason}{detail}"
            )
        default = measurements.get(default_index)
        default_ms = default.median_ms if default is not None and default.status == Status.OK else None
        counted = (Status.OK, Status.ELIMINATED, Status.REJECTED, Status.FAILED, Status.PRUNED)
        counts = {s: sum(m.status == s for m in ordered) for s in counted}
        searched = f", {len(measurements)} tried ({self.strategy}, {self.seconds:.1f} s)" if len(measurements) < len(ordered) else ""
        n_excluded = sum(self.excluded.values())
        excluded = f" ({n_excluded} more may not run here: {'; '.join(self.excluded)})" if n_excluded else ""
        costs = self.costs
        log(
            f"tuned {self.eid}: {len(ordered)} configs{excluded}{searched}, {counts[Status.OK] + counts[Status.ELIMINATED]} measured "
            f"({counts[Status.ELIMINATED]} eliminated early), {counts[Status.REJECTED]} rejected, {counts[Status.FAILED]} failed, "
            f"{counts[Status.PRUNED]} pruned; best {winner.config} {winner.median_ms:.4f} ms"
            + (f" ({default_ms / winner.median_ms:.2f}x the default)" if default_ms else "")
            + (f"; prior: the times of {self.prior} earlier result(s)" if self.prior else "")
            + (f"; worker {', '.join(f'{k} {v:.1f} s' for k, v in self.phases.items())}" if self.phases else "")
            + f"; fixed cost {costs['overhead']:.2f} s (setup {costs['setup']:.2f}, reference {costs['reference']:.2f}, search {costs['search']:.2f})"
            + f"; verified against {self.reference}"
            + (f"; {runoff_text(self.runoff.record)}" if self.runoff is not None else "")
        )
        return LockEntry(
            checksum=self.checksum,
            config=winner.config,
            tuned=True,
            index=winner.index,
            default=dict(self.default),
            default_ms=round(default_ms, 6) if default_ms else None,
            measurements=tuple(m.as_recorded() for m in ordered),
            provenance={
                **self.provenance,
                "reference": self.reference[:PROVENANCE_MAX_CHARS],
                "phases": {k: round(v, 4) for k, v in {**costs, **self.phases}.items()},
            },
            runoff=self.runoff.record if self.runoff is not None else None,
            excluded=dict(self.excluded),
        )


def runoff_text(record: Runoff) -> str:
    """'runoff of 3 configs, 5 rounds: the winner 1.2% ahead of the next, fastest in 4 rounds'."""
    n = len(record.contenders)
    if record.margin is None:
        return f"runoff of {n} configs, {record.rounds} rounds: the others failed"
    lead = (
        f"{record.margin:.1%} ahead of the next"
        if record.margin >= 0
        else f"chosen within {-record.margin:.1%} of a faster one (a near-tie)"
    )
    return f"runoff of {n} configs, {record.rounds} rounds: the winner {lead}, fastest in {record.rounds_won} round(s)"
