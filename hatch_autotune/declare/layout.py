"""The checks across a kernel's arguments that the layouts of issue #52 bring: each free dim is
an axis of an array the caller must pass (so every call can read it), no key dim is read from an
optional array (a call without it would have no bucket), and each tensor map describes an array
whose innermost stride is one element, with a box of one expression per dim over the names the
launch geometry may use. Each problem is one line naming its key."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from ..runtime import ExpressionError
from ..runtime.selection import ARCH_NAMES, arch_env
from ..runtime.values import instance_env
from .args import ArgSpec
from .keys import KeyDim
from .validate import Table


def check_layout(
    t: Table, args: Sequence[ArgSpec], key: Sequence[KeyDim], dims: Mapping[str, int], geometry_names: set[str], declared: set[str]
) -> None:
    """Every cross-argument problem of free dims, optional arrays and tensor maps, added to
    t.errors. `declared`: every argument's name, the ones whose own problems were reported too
    (nothing is said about those twice)."""
    errors = t.errors
    by_name = {a.name: a for a in args}
    # what selects a variant, not what a call's sizes say: a map's `when` is decided per variant
    when_names = (geometry_names - {k.name for k in key} - set(dims)) | set(ARCH_NAMES)
    arg_paths = {a.name: f"{t.sub('args')}[{i}]" for i, a in enumerate(args)}
    for dim in dims:
        bound_by = [a.name for a in args if a.shape is not None and not a.optional and any(e.tree == ["n", dim] for e in a.shape)]
        if not bound_by and len(args) == len(declared):  # (an argument with a problem may be the one)
            errors.append(
                f"{t.sub('dims')}.{dim}: no array the caller must pass has {dim!r} as an axis of its shape "
                "(a free dim is read from such an array at every call); use it as an axis, e.g. shape = "
                f'["{dim}", ...], of a non-optional array argument'
            )
    for k in key:
        source = by_name.get(k.source)
        if source is not None and source.optional:
            errors.append(f"{t.sub('key')}.{k.name}: {k.source!r} is optional; a key dim must be read from an argument every call passes")
    for a in args:
        if a.tensor_map is None:
            continue
        path = f"{arg_paths[a.name]}.tensor-map"
        target = by_name.get(a.tensor_map.array)
        if target is None and a.tensor_map.array in declared:
            continue  # the array's own problem is reported
        if target is None or target.shape is None:
            what = "not an argument of the kernel" if target is None else "a scalar"
            arrays = ", ".join(b.name for b in args if b.shape is not None) or "none"
            errors.append(f"{path}.array: {a.tensor_map.array!r} is {what}; a tensor map describes an array argument (arrays: {arrays})")
            continue
        tm = a.tensor_map
        if target.strides == "any" and tm.when is None and tm.order == "declared":
            errors.append(
                f'{path}.array: {target.name!r} is declared with strides = "any"; a tensor map needs the innermost stride to be '
                'one element: declare it "inner" or "contiguous", give the map order = "memory" (its unit-stride axis '
                "innermost), or a `when` (a call TMA cannot serve then runs a variant that reads no map)"
            )
        if tm.when is not None:
            unknown = sorted(tm.when.names - when_names)
            if unknown:
                errors.append(
                    f"{path}.when: unknown name(s) {', '.join(unknown)} in {tm.when.text!r}; `when` may use space axes, "
                    f"<T>_size, constants and {', '.join(ARCH_NAMES)}: {', '.join(sorted(when_names)) or 'none'}"
                )
        if target.optional:
            errors.append(f"{path}.array: {target.name!r} is optional; a tensor map needs an array every call passes")
        if len(a.tensor_map.box) != len(target.shape):
            errors.append(
                f"{path}.box: expected one expression per dim of {target.name!r} ({len(target.shape)}, outermost first), "
                f"got {len(a.tensor_map.box)}"
            )
        for i, e in enumerate(a.tensor_map.box):
            unknown = sorted(e.names - geometry_names)
            if unknown:
                errors.append(
                    f"{path}.box[{i}]: unknown name(s) {', '.join(unknown)} in {e.text!r}; a box may use key dims, free dims, "
                    f"space axes, <T>_size and constants: {', '.join(sorted(geometry_names)) or 'none'}"
                )


# The archs a `when` is tried on for the default config: one of each kind a point constraint tells apart.
_PROBE_ARCHS = ("sm_80", "sm_90", "sm_90a", "sm_100f")


def check_default_reads_no_conditional_map(
    t: Table, args: Sequence[ArgSpec], default: Mapping[str, Any], types: Mapping[str, Any], constants: Mapping[str, Any]
) -> None:
    """A kernel whose maps have a `when` must have a default config that reads none of them: a
    call TMA cannot serve falls back to a variant that reads no map, and the default is the one
    every row of the wheel may end up with (an untuned entry runs it)."""
    maps = [a for a in args if a.tensor_map is not None and a.tensor_map.when is not None]
    if not maps:
        return
    choices = {**types, **constants}
    instances = [instance_env(dict(zip(choices, values))) for values in itertools.product(*choices.values())]
    for a in maps:
        assert a.tensor_map is not None and a.tensor_map.when is not None
        when = a.tensor_map.when
        for inst, arch in itertools.product(instances, _PROBE_ARCHS):
            try:
                reads = bool(when({**default, **inst, **arch_env(arch)}))
            except ExpressionError:
                continue  # what cannot be evaluated here is reported with its names
            if reads:
                t.errors.append(
                    f"{t.sub('default')}: the default config reads tensor map {a.name!r} (its when {when.text!r} holds for "
                    f"{arch}); a kernel whose maps have a `when` needs a default that reads none of them, for the calls TMA "
                    "cannot serve"
                )
                break
