"""A kernel's declaration as JSON: what the selection table ships for the runtime and what the
tuning worker reads. One writer, so the two readers never disagree."""

from __future__ import annotations

from typing import Any

from .args import ArgSpec
from .kernel import KernelSpec


def _arg_json(a: ArgSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"name": a.name, "dtype": a.dtype, "kind": "array" if a.is_array else "scalar"}
    if a.shape is not None:
        out.update(shape=[e.tree for e in a.shape], intent=a.intent)
        if a.align:
            out["align"] = a.align
    if a.value is not None:
        out["value"] = a.value.tree
    return out


def kernel_json(spec: KernelSpec) -> dict[str, Any]:
    """A kernel's declaration as the runtime reads it: entry, arguments, key, types, constants, launch."""
    return {
        "entry": spec.entry,
        "doc": spec.doc,
        "args": [_arg_json(a) for a in spec.args],
        "key": [{"name": k.name, "from": k.source, "axis": k.axis, "buckets": list(k.buckets), "mapping": k.mapping} for k in spec.key],
        "type_params": {tp: list(values) for tp, values in spec.types.items()},
        "constants": [{"name": c, "values": list(values)} for c, values in spec.constants.items()],  # a list: declared order
        "launch": {"grid": [e.tree for e in spec.grid], "block": [e.tree for e in spec.block], "shared": spec.shared.tree},
    }
