"""The selection table's contents (runtime.py owns its schema, reader and byte layout): the
kernels' declarations as the runtime reads them, and per type instance, arch and bucket the
variant chosen, with the binaries it ships. `kernel_json` is also what the tuning worker reads.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..errors import BuildError
from ..runtime import TABLE_SCHEMA, sha256_hex
from ..spec.config import ArgSpec, KernelSpec, ProjectSpec

if TYPE_CHECKING:  # the pipeline's result types; the table sits below the pipeline
    from .pipeline import BuildResult, KernelBuild

BINARY_DIR = "bin"


def _arg_json(a: ArgSpec) -> dict[str, Any]:
    out: dict[str, Any] = {"name": a.name, "dtype": a.dtype, "kind": "array" if a.is_array else "scalar"}
    if a.is_array:
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
        "key": [
            {"name": k.name, "from": k.source, "axis": k.axis, "buckets": list(k.buckets), "mapping": k.mapping}
            for k in spec.key
        ],
        "type_params": {tp: list(values) for tp, values in spec.types.items()},
        "constants": [{"name": c, "values": list(values)} for c, values in spec.constants.items()],  # a list: declared order
        "launch": {"grid": [e.tree for e in spec.grid], "block": [e.tree for e in spec.block], "shared": spec.shared.tree},
    }


_PTX_VERSION = re.compile(rb"^[ \t]*\.version[ \t]+(\d+\.\d+)", re.MULTILINE)


def ptx_isa(ptx: bytes, what: str) -> str:
    """The PTX ISA version from the `.version` directive ('9.5'): a driver JIT-compiles PTX only up
    to its own ISA (CUDA 13.0: 9.0), so the runtime compares it before loading."""
    m = _PTX_VERSION.search(ptx)
    if m is None:
        raise BuildError(f"hatch-autotune: PTX {what} has no `.version` directive, so no runtime could tell which drivers can JIT it")
    return m.group(1).decode()


def kernel_table(kb: KernelBuild, result: BuildResult, files: dict[str, bytes]) -> dict[str, Any]:
    """One kernel's part of the selection table; adds the binaries it refers to into `files`."""
    spec = kb.spec
    variants: dict[str, dict[str, Any]] = {}
    select: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for (tkey, arch, point), choice in sorted(kb.choices.items()):
        v = kb.variants[tkey][choice.variant_index]
        vid = v.id
        var = variants.setdefault(
            vid, {"config": v.config_dict, "types": v.types_dict, "index": v.index, "binaries": {}, "resources": {}}
        )
        for bin_arch in [arch] + ([result.ptx[arch]] if arch in result.ptx else []):
            r = kb.binaries[(v.source_hash, bin_arch)]
            ext = "ptx" if bin_arch.startswith("compute_") else "cubin"
            rel = f"{BINARY_DIR}/{spec.name}-{v.source_hash[:16]}.{bin_arch}.{ext}"  # shared by configs of one source
            files[rel] = r.binary
            var["binaries"][bin_arch] = {"file": rel, "sha256": sha256_hex(r.binary)}
            if ext == "ptx":  # PTX is only as portable as the NVRTC that made it
                var["binaries"][bin_arch].update(ptx_isa=ptx_isa(r.binary, f"{rel} ({v.label})"), nvrtc=result.compiler)
            if r.resources is not None:
                var["resources"][bin_arch] = r.resources.__dict__
        entry = {"bucket": list(point), "variant": vid, "tuned": choice.tuned}
        entry["provenance"] = dict(choice.provenance) if choice.tuned else {"reason": choice.reason}
        select.setdefault(tkey, {}).setdefault(arch, []).append(entry)
    return {**kernel_json(spec), "variants": variants, "select": select}


def build_table(project: ProjectSpec, result: BuildResult) -> tuple[dict[str, Any], dict[str, bytes]]:
    files: dict[str, bytes] = {}
    table = {
        "schema": TABLE_SCHEMA,
        "module": project.module,
        "archs": list(result.archs),
        "ptx": dict(result.ptx),
        "provenance": {"hatch_autotune": __version__, "nvrtc": result.compiler},
        "kernels": {kb.spec.name: kernel_table(kb, result, files) for kb in result.kernels},
    }
    return table, files
