"""The wheel payload: a generated package holding the module, the vendored runtime, the
selection table (JSON) and only the binaries the table refers to.

Everything written here is a pure function of the build result (no dates, no absolute paths,
sorted JSON), so two builds from the same lock file give byte-identical wheels.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .config import ArgSpec, ProjectSpec
from .errors import BuildError
from .runtime import TABLE_FILE, TABLE_SCHEMA, sha256_hex

if TYPE_CHECKING:  # the pipeline's result types; package itself sits below the pipeline
    from .pipeline import BuildResult, KernelBuild

DATA_DIR = Path(__file__).resolve().parent / "data"
RUNTIME_SOURCE = Path(__file__).resolve().parent / "runtime.py"
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


def kernel_json(spec: Any) -> dict[str, Any]:
    """A kernel's declaration as the runtime reads it: entry, arguments, key, types, launch."""
    return {
        "entry": spec.entry,
        "doc": spec.doc,
        "args": [_arg_json(a) for a in spec.args],
        "key": [
            {"name": k.name, "from": k.source, "axis": k.axis, "buckets": list(k.buckets), "mapping": k.mapping}
            for k in spec.key
        ],
        "type_params": {tp: list(values) for tp, values in spec.types.items()},
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


def _signature(spec: Any) -> str:
    user_args = [a.name for a in spec.args if a.value is None]
    return ", ".join(user_args)


def module_docstring(project: ProjectSpec) -> str:
    """The generated module's docstring, as a Python literal (repr), whatever a `doc` contains."""
    lines = [
        f"{project.module}: GPU kernels pre-tuned at build time by hatch-autotune {__version__}.",
        "",
        "Generated file; do not edit. Importing it touches no GPU and needs neither hatch-autotune nor",
        "a CUDA compiler: the binaries were compiled and chosen when the wheel was built.",
        "",
        "Kernels:",
    ]
    for s in project.kernels.values():
        lines.append(f"- {s.name}({_signature(s)}): {s.doc or '(no description)'}")
        lines.append("  key: " + ", ".join(f"{k.name} in {list(k.buckets)}" for k in s.key))
    return repr("\n".join(lines) + "\n")


def render_module(project: ProjectSpec, table_sha256: str) -> str:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(DATA_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template("generated_module.py.j2").render(
        docstring=module_docstring(project), kernels=[{"name": s.name} for s in project.kernels.values()], table_sha256=table_sha256
    )


def write_package(out_dir: Path, project: ProjectSpec, result: BuildResult) -> list[str]:
    """Write the generated package into out_dir (emptied first); return the relative paths written."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    table, files = build_table(project, result)
    table_bytes = (json.dumps(table, sort_keys=True, indent=1) + "\n").encode()
    files[TABLE_FILE] = table_bytes
    files["_runtime.py"] = RUNTIME_SOURCE.read_bytes()
    files["__init__.py"] = render_module(project, sha256_hex(table_bytes)).encode()
    for rel, data in sorted(files.items()):
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return sorted(files)


def module_relpath(module: str) -> str:
    """'example_pkg.kernels' -> 'example_pkg/kernels' (the generated package's path in the wheel)."""
    return module.replace(".", "/")
