"""The wheel payload: a generated package holding the module, the vendored runtime (the whole
`hatch_autotune.runtime` package, as `_runtime/`), the selection table (table.py fills it), only
the binaries the table refers to, and the build's outcome record (outcome.py).

Everything written here is a pure function of the build result (no dates, no absolute paths,
sorted JSON), so two builds from the same lock file give byte-identical wheels.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..declare.config import ProjectSpec
from ..runtime import TABLE_FILE, sha256_hex, table_bytes
from .outcome import OUTCOME_FILE
from .stub import module_docstring, stub_files
from .table import build_table
from .torch_module import torch_files

if TYPE_CHECKING:  # the pipeline's result type; the payload sits below the pipeline
    from .assemble import BuildResult

DATA_DIR = Path(__file__).resolve().parent / "data"
RUNTIME_PACKAGE = Path(__file__).resolve().parent.parent / "runtime"
RUNTIME_DIR = "_runtime"  # the vendored runtime's name inside the generated package


def runtime_requirements() -> list[str]:
    """What the generated module needs at run time, added to the wheel's Requires-Dist by the
    hook: NumPy. Not cuda-bindings nor cuda-core: the runtime calls libcuda through ctypes
    (runtime/libcuda.py), whichever driver major a user has."""
    return ["numpy>=1.24"]


def runtime_files() -> dict[str, bytes]:
    """The vendored runtime, by path inside the generated package: every .py file of the
    runtime package, sorted (no __pycache__, nothing else), so the wheel stays reproducible.
    Its modules import each other relatively, so they work under any package name."""
    sources = sorted(p for p in RUNTIME_PACKAGE.rglob("*.py") if "__pycache__" not in p.relative_to(RUNTIME_PACKAGE).parts)
    return {f"{RUNTIME_DIR}/{p.relative_to(RUNTIME_PACKAGE).as_posix()}": p.read_bytes() for p in sources}


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
    files[TABLE_FILE] = table_bytes(table)
    files.update(runtime_files())
    files["__init__.py"] = render_module(project, sha256_hex(files[TABLE_FILE])).encode()
    files.update(stub_files(project))
    files.update(torch_files(project))
    files[OUTCOME_FILE] = result.outcome.to_bytes()  # for `hatch-autotune show`; the runtime never reads it
    for rel, data in sorted(files.items()):
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return sorted(files)


def module_relpath(module: str) -> str:
    """'example_pkg.kernels' -> 'example_pkg/kernels' (the generated package's path in the wheel)."""
    return module.replace(".", "/")
