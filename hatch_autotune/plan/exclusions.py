"""Which configs of a type instance are no candidates at a point (arch, bucket), and why: a point
constraint (one that reads a key dim or `arch`) that fails there, dynamic shared memory above the
arch's opt-in limit (plan/limits.py), a thread-block cluster on an arch without clusters. The
planner asks it for each point's default and fallback, the tuner for a bucket's candidates, and
`show` for the reasons; nothing excluded is measured or compiled for a point it cannot serve.

A point's verdicts depend only on the key dims the rules read, so they are worked out once per
distinct value of those (a constraint on `hidden` is evaluated once per `hidden` bucket, not once
per bucket of the whole key grid), config by config as they are asked."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..declare.config import KernelSpec
from ..errors import BuildError
from ..runtime import ExpressionError, short_repr
from ..runtime.selection import ARCH_NAMES, arch_env
from .limits import CLUSTER_MIN_ARCH, shared_optin_limit


@dataclass(frozen=True)
class Exclusion:
    """Why one config is no candidate at a point: `group`, what configs excluded alike share (the
    text `show` counts them under), and `reason`, this config's own words."""

    group: str
    reason: str
    shared: int | None = None  # a shared-memory exclusion: the bytes it asks (group: what the arch allows)


class PointRules:
    """The rules of one type instance on one arch: `exclusion(i, bucket)` for config i,
    `candidates(bucket)` for all, both cached per distinct value of the key dims they read."""

    def __init__(self, spec: KernelSpec, types: Mapping[str, Any], configs: Sequence[Mapping[str, Any]], arch: str):
        self.spec, self.configs, self.arch = spec, configs, arch
        self.arch_env = arch_env(arch)
        self.number = self.arch_env["arch"]
        self.limit = shared_optin_limit(self.number)
        self.env = {**dict(getattr(spec, "dims", {}) or {}), **spec.type_env(types)}
        self.constraints: tuple[tuple[int, Any], ...] = tuple(getattr(spec, "point_constraints", ()))
        self.cluster = getattr(spec, "cluster", None) if self.number < CLUSTER_MIN_ARCH else None
        read: set[str] = set(spec.shared.names)
        for _, c in self.constraints:
            read |= c.names
        for e in self.cluster or ():
            read |= e.names
        self.read = tuple(k.name for k in spec.key if k.name in read)
        self._verdicts: dict[tuple[int, ...], dict[int, Exclusion | None]] = {}
        self._all: dict[tuple[int, ...], dict[int, Exclusion]] = {}

    def _view(self, bucket: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(bucket[n] for n in self.read)

    def exclusion(self, index: int, bucket: Mapping[str, int]) -> Exclusion | None:
        """Why config `index` is no candidate at `bucket` (None: it is one); BuildError when a
        rule cannot be evaluated there."""
        verdicts = self._verdicts.setdefault(self._view(bucket), {})
        if index not in verdicts:
            verdicts[index] = self._judge(self.configs[index], bucket)
        return verdicts[index]

    def excluded(self, bucket: Mapping[str, int]) -> dict[int, Exclusion]:
        """Every config excluded at `bucket`, by index in canonical order."""
        view = self._view(bucket)
        if view not in self._all:
            out = {}
            for i in range(len(self.configs)):
                why = self.exclusion(i, bucket)
                if why is not None:
                    out[i] = why
            self._all[view] = out
        return self._all[view]

    def candidates(self, bucket: Mapping[str, int]) -> list[int]:
        """The configs that may serve `bucket`, in canonical order."""
        out = self.excluded(bucket)
        return [i for i in range(len(self.configs)) if i not in out]

    def allowed(self, bucket: Mapping[str, int], order: Sequence[int] | None = None) -> Iterator[int]:
        """The candidates at `bucket` in `order` (canonical by default), judged as they are asked:
        the first of them costs one config's rules, not the whole space's."""
        for i in order if order is not None else range(len(self.configs)):
            if self.exclusion(i, bucket) is None:
                yield i

    def _judge(self, config: Mapping[str, Any], bucket: Mapping[str, int]) -> Exclusion | None:
        env = {**self.env, **bucket, **config, **self.arch_env}
        for i, c in self.constraints:
            if not self._value(c, env, config, bucket, f"constraints[{i}] {c.text!r}"):
                at = ", ".join(f"{n}={bucket[n]}" for n in bucket if n in c.names)
                where = (f" at {at}" if at else "") + ("" if c.names.isdisjoint(ARCH_NAMES) else f" on {self.arch}")
                text = f"constraints[{i}] {c.text!r}{where}"
                return Exclusion(text, f"fails {text}")
        if self.cluster is not None:
            dims = [self._value(e, env, config, bucket, f"cluster expression {e.text!r}") for e in self.cluster]
            if math.prod(int(d) for d in dims) > 1:
                group = f"a thread-block cluster needs sm_{CLUSTER_MIN_ARCH} or newer ({self.arch} has none)"
                return Exclusion(group, f"cluster {'x'.join(str(d) for d in dims)}: {group}")
        need = self._value(self.spec.shared, env, config, bucket, f"shared expression {self.spec.shared.text!r}")
        if isinstance(need, int) and need > self.limit:
            reason = f"needs {need} bytes of dynamic shared memory; {self.arch} allows at most {self.limit} per block"
            return Exclusion(f"{self.arch} allows at most {self.limit} per block", reason, need)
        return None

    def _value(self, e: Any, env: Mapping[str, Any], config: Mapping[str, Any], bucket: Mapping[str, int], what: str) -> Any:
        try:
            return e(env)
        except ExpressionError as exc:
            raise BuildError(
                f"hatch-autotune: kernel {self.spec.name!r}: {what} cannot be evaluated for {dict(config)} at "
                f"{', '.join(f'{k}={v}' for k, v in bucket.items())} on {self.arch}: {exc}"
            ) from None


def summary(excluded: Mapping[int, Exclusion]) -> dict[str, int]:
    """The exclusions of one point grouped as `show` and the lock record them: text -> how many
    configs, in canonical order of their first config ("constraints[2] 'hidden % VEC == 0' at
    hidden=4000": 3; "needs 172032 to 262144 bytes of dynamic shared memory; sm_80 allows at most
    166912 per block": 5)."""
    groups: dict[str, list[Exclusion]] = {}
    for i in sorted(excluded):
        groups.setdefault(excluded[i].group, []).append(excluded[i])
    out: dict[str, int] = {}
    for group, members in groups.items():
        needs = sorted(m.shared for m in members if m.shared is not None)
        if needs:
            lo, hi = needs[0], needs[-1]
            asked = f"{lo}" if lo == hi else f"{lo} to {hi}"
            group = f"needs {asked} bytes of dynamic shared memory; {group}"
        out[group] = len(members)
    return out


def summary_lines(counts: Mapping[str, int]) -> list[str]:
    """'constraints[2] 'hidden % VEC == 0' at hidden=4000: 3 configs', one per group."""
    return [f"{text}: {n} config{'' if n == 1 else 's'}" for text, n in counts.items()]


def no_candidate(spec: KernelSpec, instance: str, arch: str, bucket: Mapping[str, int], excluded: Mapping[int, Exclusion]) -> str:
    """The project error of a point that no config may serve, naming it and what excluded them."""
    where = ", ".join(f"{k}={v}" for k, v in bucket.items())
    of = f" ({instance})" if instance else ""
    return (
        f"hatch-autotune: no config of kernel {spec.name!r}{of} may run at {where} on {arch}: "
        + "; ".join(summary_lines(summary(excluded)))
        + ". Loosen the constraints, add configs that fit there, or drop the bucket (or the arch); "
        f"`hatch-autotune show` lists what each entry excludes. (default: {short_repr(dict(spec.default), 200)})"
    )
