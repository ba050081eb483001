"""An entry's checksum: the hash of everything a measurement and its winner depend on, which
decides whether a lock entry still holds for the kernel as declared now."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

from ..declare.config import KernelSpec
from .ids import Bucket


def entry_checksum(
    spec: KernelSpec,
    types_key: str,
    source_hashes: Sequence[str],
    arch: str,
    bucket: Bucket | Mapping[str, int],
) -> str:
    """Hash of what a measurement and its winner depend on: the variant sources (so the template
    and the space), the compile options, the arguments, how key dims are read, the launch
    geometry, what verification compares against, the search, how variants are timed, the arch
    and bucket.
    Expressions enter as parsed trees, so reformatting one does not invalidate the lock; the
    bucket mapping does not enter (it decides which bucket a call uses, not what was measured).
    Nor does the NVRTC version: the dependency allows any 13.x, and a builder that resolved
    another one must not lose every winner; NvrtcPolicy decides what a version change does."""
    from ..compile.nvrtc import CompileJob

    # The header sets enter through the source hashes (compile/render.py source_hash).
    blob = {
        "kernel": spec.name,
        "entry": spec.entry,
        "types": types_key,
        "sources": list(source_hashes),
        "options": CompileJob("", arch, spec.entry, spec.nvrtc_options).full_options(),
        "args": [
            [a.name, a.dtype, [e.tree for e in a.shape] if a.shape else None, a.intent, a.value.tree if a.value else None]
            for a in spec.args
        ],
        "key": [[k.name, k.source, k.axis] for k in spec.key],
        "launch": [[e.tree for e in spec.grid], [e.tree for e in spec.block], spec.shared.tree],
        "verification": [spec.reference, spec.inputs, list(spec.tolerance) if spec.tolerance else None],
        "search": spec.search.checksum_fields(),
        "arch": arch,
        "bucket": Bucket.of(bucket).as_dict(),
    }
    timing = spec.timing.checksum_fields
    if timing is not None:  # only a kernel timed otherwise than eager with a cold L2: other checksums stay
        blob["timing"] = timing
    layout = _layout_fields(spec)
    if layout:  # only a kernel that declares them: the checksums of every other kernel stay as they were
        blob["layout"] = layout
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()


def _layout_fields(spec: KernelSpec) -> dict[str, object]:
    """What issue #52's declarations add to what a measurement depends on: array layouts,
    optional arrays, tensor maps, free dims (their tuning sizes shape the inputs), the cluster
    and the constraints per bucket and arch (they decide the candidates); empty when none."""
    out: dict[str, object] = {}
    arrays = {
        a.name: [a.strides, a.optional, a.unit_stride_variants]
        for a in spec.args
        if a.shape is not None and (a.strides != "contiguous" or a.optional)
    }
    if arrays:
        out["arrays"] = arrays
    maps = {
        a.name: [
            a.tensor_map.array,
            [e.tree for e in a.tensor_map.box],
            a.tensor_map.swizzle,
            a.tensor_map.l2_promotion,
            a.tensor_map.oob_fill,
            # (only when set: the checksums of maps declared before `when` and `order` stay)
            *([["when", a.tensor_map.when.tree]] if a.tensor_map.when is not None else []),
            *([["order", a.tensor_map.order]] if a.tensor_map.order != "declared" else []),
        ]
        for a in spec.args
        if a.tensor_map is not None
    }
    if maps:
        out["tensor_maps"] = maps
    if spec.dims:
        out["dims"] = dict(spec.dims)
    if spec.cluster is not None:
        out["cluster"] = [e.tree for e in spec.cluster]
    if spec.point_constraints:
        out["point_constraints"] = [c.tree for _, c in spec.point_constraints]
    return out
