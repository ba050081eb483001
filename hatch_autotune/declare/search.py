"""How a kernel's space is searched (its `search` table) and how each config is measured (the
project's `tuning` table). The search budget is parsed here, once, into a typed value: a count
of configs or a share of each instance's space, which `SearchSpec.budget_for` turns into the
`Budget` a search spends (tuning/search.py)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace
from typing import Any

from .validate import BAD, Table, fail, v_bool, v_choice, v_int, v_number

SEARCH_STRATEGIES = ("exhaustive", "random", "local", "tpe", "gp", "auto")  # tuning/search.py implements each
_PERCENT = re.compile(r"([0-9]+(\.[0-9]+)?)%")  # ASCII digits: "١%" is no share  # noqa: RUF003


@dataclass(frozen=True)
class Share:
    """A budget of configs as a share of each instance's space (`budget = "5%"`). `text` is the
    value as written: the lock checksum hashes it, so "5%" and "5.0%" stay what they were."""

    percent: float
    text: str

    @classmethod
    def parse(cls, text: str) -> Share:
        """The share "N%" names (0 < N <= 100); ValueError otherwise."""
        m = _PERCENT.fullmatch(text)
        if not m or not 0 < float(m.group(1)) <= 100:
            raise ValueError(f"not a share of the space from '0.1%' to '100%': {text!r}")
        return cls(float(m.group(1)), text)

    def configs(self, space_size: int) -> int:
        """The share of a space of this size in configs, at least 1."""
        return max(1, math.ceil(self.percent / 100 * space_size))

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Budget:
    """How much a search may spend: configs tried (each proposed config counts, a failed one
    too) and/or seconds on its clock (compiling and measuring). None: no limit."""

    configs: int | None = None
    seconds: float | None = None

    def spent(self, tried: int, seconds: float) -> bool:
        return (self.configs is not None and tried >= self.configs) or (self.seconds is not None and seconds >= self.seconds)


@dataclass(frozen=True)
class SearchSpec:
    """How much of a space to measure, and in what order (tuning/search.py): every config, or
    what a strategy picks within a budget of configs (a count, or a share of the space) and/or
    seconds. The previous winner and the neighbouring buckets' winners go first (warm start)."""

    strategy: str = "exhaustive"
    budget: int | Share | None = None  # configs: a count, or a share of the instance's space
    seed: int = 0
    seconds: float | None = None  # compile and measuring time per bucket
    warm_start: bool = True

    def configs_budget(self, space_size: int) -> int | None:
        """The budget in configs for a space of this size (at least 1); None: no count limit."""
        if isinstance(self.budget, Share):
            return self.budget.configs(space_size)
        return self.budget

    def configs_tried(self, space_size: int) -> int:
        """How many configs of a space of this size a search measures at most."""
        return min(self.configs_budget(space_size) or space_size, space_size)

    def budget_for(self, space_size: int) -> Budget:
        """What a search of a space of this size may spend."""
        return Budget(self.configs_budget(space_size), self.seconds)

    def learns_from_neighbours(self, space_size: int) -> bool:
        """Whether a bucket's search is better for starting after its neighbours' in the same
        run (tuning/warm.py, transfer_waves): it warm-starts and may stop before it has
        measured the whole space."""
        return self.warm_start and (self.configs_tried(space_size) < space_size or self.seconds is not None)

    def checksum_fields(self) -> list[Any]:
        """What enters a lock entry's checksum: the three fields the first format had (the budget
        as written), then only the settings that differ from their defaults, so that old entries
        stay valid."""
        first = ("strategy", "budget", "seed")
        extra = ([f.name, getattr(self, f.name)] for f in fields(self) if f.name not in first and getattr(self, f.name) != f.default)
        budget = self.budget.text if isinstance(self.budget, Share) else self.budget
        return [self.strategy, budget, self.seed, *extra]


LAUNCHES = ("eager", "graph")  # each launch timed on its own; N launches in one CUDA graph, timed as a whole
L2_STATES = ("cold", "hot")  # the L2 flushed before each launch; left as the previous launch left it
DEFAULT_GRAPH_LAUNCHES = 20
MAX_GRAPH_LAUNCHES = 1000


@dataclass(frozen=True)
class TimingSpec:
    """How a kernel's variants are timed, to match how it runs where it is deployed (a kernel's
    `timing` table; tuning/bench.py times them): `launches` eager (each launch between its own
    events) or graph (`graph_launches` launches captured into one CUDA graph and replayed, the
    replay timed as a whole: no launch overhead between them, as in a serving loop's graph);
    `l2` cold (flushed before each launch) or hot. None: the project's `tuning` setting, which
    `resolved` fills in (the project does it for every kernel, so the rest sees full values)."""

    launches: str | None = None
    l2: str | None = None
    graph_launches: int | None = None

    def resolved(self, tuning: TuningSpec) -> TimingSpec:
        """Every field set: the kernel's own, else the project's."""
        return TimingSpec(
            launches=self.launches or tuning.launches,
            l2=self.l2 or ("cold" if tuning.flush_l2 else "hot"),
            graph_launches=self.graph_launches or tuning.graph_launches,
        )

    def applied(self, tuning: TuningSpec) -> TuningSpec:
        """The measurement settings of a kernel: the project's, timed this way (a resolved spec)."""
        assert self.launches is not None and self.l2 is not None and self.graph_launches is not None
        return replace(tuning, launches=self.launches, flush_l2=self.l2 == "cold", graph_launches=self.graph_launches)

    @property
    def checksum_fields(self) -> list[Any] | None:
        """What the lock checksum hashes (a resolved spec): None for eager launches with the L2
        cold, how every kernel was timed before timing modes, so that those checksums hold."""
        if (self.launches, self.l2) == ("eager", "cold"):
            return None
        return [self.launches, self.l2, self.graph_launches if self.launches == "graph" else None]

    def text(self) -> str:
        """'eager launches, L2 cold' or 'CUDA graph of 20 launches, L2 hot': the lock's provenance
        `timing`, and what `show` says (a resolved spec)."""
        how = "eager launches" if self.launches == "eager" else f"CUDA graph of {self.graph_launches} launches"
        return f"{how}, L2 {self.l2}"


def parse_timing(t: Table) -> TimingSpec:
    spec = TimingSpec(
        launches=t.get("launches", v_choice(LAUNCHES), default=None),
        l2=t.get("l2", v_choice(L2_STATES), default=None),
        graph_launches=t.get("graph-launches", v_int(1, MAX_GRAPH_LAUNCHES), default=None),
    )
    t.finish()
    return spec


@dataclass(frozen=True)
class TuningSpec:
    """Measurement settings (see tuning/bench.py for what each bounds)."""

    budget_ms: float = 100.0  # GPU time spent timing one variant, at most
    warmup: int = 2
    min_reps: int = 5
    max_reps: int = 100
    timeout_s: float = 30.0  # a variant taking longer than this is killed and marked failed
    eliminate: float = 0.25  # stop timing a variant whose fastest sample is this much slower than the leader
    flush_l2: bool = True
    prune_spills: bool = False
    runoff_rounds: int = 5  # interleaved rounds in which the search's contenders are timed again (0: none)
    launches: str = "eager"  # how each variant is launched while timed (TimingSpec; a kernel's `timing` overrides)
    graph_launches: int = DEFAULT_GRAPH_LAUNCHES  # launches per CUDA graph, with launches = "graph"


def v_search_budget(value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str):
        try:
            return Share.parse(value)
        except ValueError:
            pass
    return fail(errors, path, "a number of configs (an integer >= 1) or a share of the space as a string from '0.1%' to '100%'", value)


def parse_search(t: Table) -> SearchSpec:
    budget = t.get("budget", v_search_budget, default=None)
    seconds = t.get("seconds", v_number(0.001), default=None)
    limited = budget is not None or seconds is not None
    strategy = t.get("strategy", v_choice(SEARCH_STRATEGIES), default="auto" if limited else "exhaustive")
    seed = t.get("seed", v_int(0), default=0)
    warm_start = t.get("warm-start", v_bool, default=True)
    t.finish()
    if strategy not in ("exhaustive", BAD) and not limited and t.ok:
        t.errors.append(
            f"{t.sub('budget')}: strategy {strategy!r} needs a budget (configs, e.g. 200 or '5%') or `seconds`; without one it would measure every config"
        )
    return SearchSpec(strategy=strategy, budget=budget, seed=seed, seconds=seconds, warm_start=warm_start)


def parse_tuning(t: Table) -> TuningSpec:
    d = TuningSpec()
    spec = TuningSpec(
        budget_ms=t.get("budget-ms", v_number(0.001), default=d.budget_ms),
        warmup=t.get("warmup", v_int(0), default=d.warmup),
        min_reps=t.get("min-reps", v_int(1), default=d.min_reps),
        max_reps=t.get("max-reps", v_int(1), default=d.max_reps),
        timeout_s=t.get("timeout-s", v_number(0.1), default=d.timeout_s),
        eliminate=t.get("eliminate", v_number(0.0), default=d.eliminate),
        flush_l2=t.get("flush-l2", v_bool, default=d.flush_l2),
        prune_spills=t.get("prune-spills", v_bool, default=d.prune_spills),
        runoff_rounds=t.get("runoff-rounds", v_int(0, 100), default=d.runoff_rounds),
        launches=t.get("launches", v_choice(LAUNCHES), default=d.launches),
        graph_launches=t.get("graph-launches", v_int(1, MAX_GRAPH_LAUNCHES), default=d.graph_launches),
    )
    t.finish()
    if all(v is not BAD for v in (spec.min_reps, spec.max_reps)) and spec.min_reps > spec.max_reps:
        t.errors.append(f"{t.sub('min-reps')}: expected at most max-reps ({spec.max_reps}), got {spec.min_reps}")
    return spec
