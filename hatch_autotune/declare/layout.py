"""The checks across a kernel's arguments that the layouts of issue #52 bring: each free dim is
an axis of an array the caller must pass (so every call can read it), no key dim is read from an
optional array (a call without it would have no bucket), and each tensor map describes an array
whose innermost stride is one element, with a box of one expression per dim over the names the
launch geometry may use. Each problem is one line naming its key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
        if target.strides == "any":
            errors.append(
                f'{path}.array: {target.name!r} is declared with strides = "any"; a tensor map needs the innermost stride to be '
                'one element: declare it "inner" or "contiguous"'
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
