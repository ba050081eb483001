"""A declared kernel: what one `kernels.<name>` table of the hook says, validated (kernel_table.py
reads it, checks.py checks it whole)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..runtime import instance_env
from ..runtime.selection import ARCH_NAMES
from .args import ArgSpec
from .expr import Expr
from .headers import HeaderSetSpec
from .keys import KeyDim
from .search import SearchSpec, TimingSpec
from .space import enumerate_configs

DEFAULT_MAX_CONFIGS = 100_000  # axis combinations before constraints, per kernel (`max-configs`)


@dataclass(frozen=True)
class KernelSpec:
    name: str
    template: Path
    template_ref: str
    entry: str
    doc: str
    args: tuple[ArgSpec, ...]
    key: tuple[KeyDim, ...]
    types: Mapping[str, tuple[str, ...]]
    space: Mapping[str, tuple[Any, ...]]
    constraints: tuple[Expr, ...]
    default: Mapping[str, Any]
    grid: tuple[Expr, ...]
    block: tuple[Expr, ...]
    shared: Expr
    nvrtc_options: tuple[str, ...]
    reference: str | None = None  # "module:function" computing expected outputs with NumPy
    inputs: str | None = None  # "module:function" generating a bucket's inputs
    tolerance: tuple[float, float] | None = None  # (rtol, atol); None: by dtype
    search: SearchSpec = SearchSpec()
    max_configs: int = DEFAULT_MAX_CONFIGS  # a larger space is refused before it is enumerated
    # Caller-chosen constants: name -> the values a caller may pass (integers or booleans). Each
    # value is a specialisation like a type parameter's dtype: rendered, compiled, tuned and
    # selected exactly, never tuned over.
    constants: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    root: Path | None = None  # the project folder: `#include "..."` may reach headers inside it
    # The header sets its `#include <...>` may reach, in search order (declare/headers.py).
    header_sets: tuple[HeaderSetSpec, ...] = ()
    # Free dims: array axes that are not key dims -> the size tuning inputs and checks use.
    dims: Mapping[str, int] = field(default_factory=dict)
    cluster: tuple[Expr, ...] | None = None  # thread-block cluster dims; None: no cluster
    nvrtc: int = 13  # the major of the NVRTC that compiles its variants: the project's `min-cuda`
    # how its variants are timed: its `timing` table over the project's `tuning` (resolved by the project)
    timing: TimingSpec = TimingSpec("eager", "cold", 20)

    @property
    def instance_constraints(self) -> tuple[Expr, ...]:
        """The constraints over the space, <T>_size and constants alone: a config failing one
        is no variant of the instance."""
        return tuple(c for c in self.constraints if not self.is_point_constraint(c))

    @property
    def point_constraints(self) -> tuple[tuple[int, Expr], ...]:
        """(index in `constraints`, constraint) of those that read a key dim or `arch`: checked
        per (arch, bucket), a config failing one is not a candidate there."""
        return tuple((i, c) for i, c in enumerate(self.constraints) if self.is_point_constraint(c))

    def is_point_constraint(self, c: Expr) -> bool:
        return any(n in c.names for n in ARCH_NAMES) or any(k.name in c.names for k in self.key)

    @property
    def toolkit_headers(self) -> bool:
        """Whether it declares the toolkit's headers: its dtypes are then the toolkit's C types
        (`__half`, `__nv_bfloat16`, ...), and the toolkit-only dtypes are allowed."""
        return any(s.is_toolkit for s in self.header_sets)

    def type_instances(self) -> list[dict[str, Any]]:
        """Every assignment of the type parameters (dtype names) and the constants (their
        values), in declaration order: the instances that are rendered, tuned and selected."""
        out: list[dict[str, Any]] = [{}]
        for name, values in [*self.types.items(), *self.constants.items()]:
            out = [{**o, name: v} for o in out for v in values]
        return out

    def type_env(self, types: Mapping[str, Any]) -> dict[str, Any]:
        """Names that expressions may use for an instance: `<T>_size` in bytes and each
        constant's value (the runtime's own rule, so the build and the wheel agree)."""
        return instance_env(types)

    def configs(self, types: Mapping[str, str]) -> list[dict[str, Any]]:
        """The search space of one type instance, in canonical order."""
        return enumerate_configs(self.space, self.instance_constraints, self.type_env(types))
