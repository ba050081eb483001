"""The selection table's contents (the runtime's table module owns its schema, reader, byte
layout and records): per kernel a `KernelTable` of its declaration (declare/kernel_decl.py), the
variants chosen with the binaries they ship, and per type instance, arch and bucket the variant
chosen (a `TableEntry`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..declare.config import ProjectSpec
from ..declare.kernel_decl import kernel_decl
from ..errors import BuildError
from ..runtime import TABLE_SCHEMA, BinaryRef, KernelTable, TableEntry, Variant, ptx_driver_needed, sha256_hex

if TYPE_CHECKING:  # the pipeline's result types; the table sits below the pipeline
    from ..plan.planner import Choice
    from .assemble import BuildResult, KernelBuild

BINARY_DIR = "bin"


_PTX_VERSION = re.compile(rb"^[ \t]*\.version[ \t]+(\d+\.\d+)", re.MULTILINE)


def ptx_isa(ptx: bytes, what: str) -> str:
    """The PTX ISA version from the `.version` directive ('9.5'): a driver JIT-compiles PTX only up
    to its own ISA (CUDA 13.0: 9.0), so the runtime compares it before loading."""
    m = _PTX_VERSION.search(ptx)
    if m is None:
        raise BuildError(f"hatch-autotune: PTX {what} has no `.version` directive, so no runtime could tell which drivers can JIT it")
    return m.group(1).decode()


def kernel_table(kb: KernelBuild, result: BuildResult, files: dict[str, bytes]) -> KernelTable:
    """One kernel's part of the selection table; adds the binaries it refers to into `files`."""
    spec = kb.spec
    variants: dict[str, Variant] = {}
    select: dict[str, dict[str, list[TableEntry]]] = {}

    def ship(index: int, tkey: str, arch: str) -> str:
        """Add variant `index`'s binaries for `arch` (and its PTX) to the wheel; its id."""
        v = kb.variants[tkey][index]
        binaries: dict[str, BinaryRef] = dict(variants[v.id].binaries) if v.id in variants else {}
        resources: dict[str, Any] = dict(variants[v.id].resources) if v.id in variants else {}
        for bin_arch in [arch] + ([result.ptx[arch]] if arch in result.ptx else []):
            r = kb.binaries[(v.source_hash, bin_arch)]
            ext = "ptx" if bin_arch.startswith("compute_") else "cubin"
            rel = f"{BINARY_DIR}/{spec.name}-{v.source_hash[:16]}.{bin_arch}.{ext}"  # shared by configs of one source
            if r.binary is None:  # the planner chooses only variants that compiled
                raise BuildError(f"internal error: {v.label} is chosen for {arch} but {bin_arch} did not compile")
            files[rel] = r.binary
            ptx = ext == "ptx"  # PTX is only as portable as the NVRTC that made it
            isa = ptx_isa(r.binary, f"{rel} ({v.label})") if ptx else None
            binaries[bin_arch] = BinaryRef(rel, sha256_hex(r.binary), isa, result.compiler if ptx else None)
            if r.resources is not None:
                resources[bin_arch] = r.resources.__dict__
        variants[v.id] = Variant(config=v.config_dict, types=v.types_dict, index=v.index, binaries=binaries, resources=resources)
        return v.id

    for (tkey, arch, point), choice in sorted(kb.choices.items()):
        vid = ship(choice.variant_index, tkey, arch)
        default = None if choice.default_index is None else ship(choice.default_index, tkey, arch)
        select.setdefault(tkey, {}).setdefault(arch, []).append(table_entry(point, vid, choice, default))
    return KernelTable(kernel_decl(spec), variants, select)


def table_entry(point: tuple[int, ...], variant: str, choice: Choice, default: str | None = None) -> TableEntry:
    """A point's row, the planner's choice field for field (`default`: its default_index's id)."""
    return TableEntry(
        bucket=tuple(point),
        variant=variant,
        tuned=choice.tuned,
        median_ms=choice.median_ms,
        default_ms=choice.default_ms,
        provenance=dict(choice.provenance) if choice.tuned else {},
        reason="" if choice.tuned else choice.reason,
        default_variant=default,
    )


def driver_floors(result: BuildResult, kernels: Iterable[KernelTable]) -> dict[str, str]:
    """Each binary arch's driver floor, the oldest CUDA driver that loads it: for a cubin the
    first of its NVRTC's major (cubins of NVRTC 13 are ELF ABI 8, which CUDA 12 drivers refuse;
    within a major, minor-version compatibility), for PTX that of the newest ISA shipped."""
    nvrtc_major = int(result.compiler.split(".")[0])
    floors = {arch: (nvrtc_major, 0) for arch in result.archs}
    for kt in kernels:
        for variant in kt.variants.values():
            for arch, ref in variant.binaries.items():
                if ref.ptx_isa is not None:
                    floors[arch] = max(floors.get(arch, (0, 0)), ptx_driver_needed(ref.ptx_isa, ref.nvrtc))
    return {arch: f"{v[0]}.{v[1]}" for arch, v in sorted(floors.items())}


def build_table(project: ProjectSpec, result: BuildResult) -> tuple[dict[str, Any], dict[str, bytes]]:
    files: dict[str, bytes] = {}
    kernels = [kernel_table(kb, result, files) for kb in result.kernels]
    table = {
        "schema": TABLE_SCHEMA,
        "module": project.module,
        "archs": list(result.archs),
        "ptx": dict(result.ptx),
        "drivers": driver_floors(result, kernels),
        "provenance": {"hatch_autotune": __version__, "nvrtc": result.compiler},
        "kernels": {kt.decl.name: kt.to_json() for kt in kernels},
    }
    return table, files
