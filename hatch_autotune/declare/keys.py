"""A kernel's key (`key`): the named integers, read from its arguments at call time, whose
buckets are tuned apart and selected between."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ..runtime import MAPPINGS, MAX_SIZE
from .args import ArgSpec
from .validate import BAD, Table, problems_since, v_choice, v_ident, v_int, v_list


@dataclass(frozen=True)
class KeyDim:
    """A named integer that drives selection, read at run time from an argument."""

    name: str
    source: str  # argument name
    axis: int | None  # axis of the source array; None when the source is a scalar
    buckets: tuple[int, ...]
    mapping: str


def parse_keys(
    key_t: Table, key_names: list[str], args: Mapping[str, ArgSpec], args_ok: bool, declared: Collection[str] = ()
) -> list[KeyDim]:
    """Every key dim of the `key` table (a table: checked by the caller). `declared`: every
    argument's name, also those whose own problems were reported (so left out of `args`): a key
    dim read from one of those says nothing more (its argument is declared, only broken)."""
    key: list[KeyDim] = []
    if not key_t.data:
        key_t.errors.append(f"{key_t.path}: expected at least one key dim, got an empty table")
    for dim in key_names:
        key_t.seen.add(dim)
        kd = parse_key_dim(dim, Table(key_t.data[dim], key_t.sub(dim), key_t.errors), args, args_ok, declared)
        if kd is not None:
            key.append(kd)
    return key


def parse_key_dim(dim: str, t: Table, args: Mapping[str, ArgSpec], args_ok: bool, declared: Collection[str] = ()) -> KeyDim | None:
    if not t.ok:  # not a table: reported when the Table was made
        return None
    errors = t.errors
    n = len(errors)
    if v_ident(dim, t.path, errors) is BAD:
        return None
    source = t.get("from", v_ident, default=None)
    axis = t.get("axis", v_int(0), default=None)
    buckets = t.get("buckets", v_list(v_int(1, MAX_SIZE), what=" of positive integers"), required=True)
    mapping = t.get("mapping", v_choice(MAPPINGS), default="nearest")
    t.finish()
    if buckets not in (BAD, None) and list(buckets) != sorted(set(buckets)):
        errors.append(f"{t.sub('buckets')}: expected strictly increasing integers, got {list(buckets)!r}")
    if not args_ok or problems_since(errors, n):  # an unknown key alone leaves the dim usable
        return None
    if source is None:  # infer: the first array whose shape names this dim bare
        for a in args.values():
            if a.shape is not None and not a.optional and any(e.tree == ["n", dim] for e in a.shape):
                source = a.name
                break
        if source is None:
            if set(declared) - set(args):  # an argument with a problem (reported) may be the one
                return None
            errors.append(f"{t.path}: no array has {dim!r} as an axis of its shape; set `from` (an argument name)")
            return None
    arg = args.get(source)
    if arg is None and source in declared:  # declared, and its own problem reported: not "not an argument"
        return None
    if arg is None:
        errors.append(f"{t.sub('from')}: {source!r} is not an argument of the kernel (arguments: {', '.join(args)})")
        return None
    if arg.shape is not None:
        if axis is None:
            axes = [i for i, e in enumerate(arg.shape) if e.tree == ["n", dim]]
            if not axes:
                errors.append(f"{t.sub('axis')}: {source!r} has no axis named {dim!r}; give `axis`")
                return None
            axis = axes[0]
        elif axis >= len(arg.shape):
            errors.append(f"{t.sub('axis')}: {source!r} has {len(arg.shape)} dims, got axis {axis}")
            return None
    else:
        if axis is not None:
            errors.append(f"{t.sub('axis')}: {source!r} is a scalar; `axis` applies to arrays only")
            return None
        if arg.value is not None:
            errors.append(f"{t.sub('from')}: {source!r} is computed from the key; it cannot also define it")
            return None
        if not arg.dtype.startswith(("int", "uint")):
            errors.append(f"{t.sub('from')}: scalar {source!r} is {arg.dtype}; a key dim needs an integer scalar")
            return None
    return KeyDim(name=dim, source=source, axis=axis, buckets=tuple(buckets), mapping=mapping)
