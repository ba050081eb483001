"""Which Pythons the two halves run on: the build side (the hook, the command, the tuner) on what
pyproject.toml's requires-python says, and the runtime vendored into every wheel on 3.10 too,
since the wheels it goes into are installed on Pythons their own authors choose (example_pkg
says >=3.10). Checked from the source, as no 3.10 interpreter is at hand here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hatch_autotune"
RUNTIME_FLOOR = (3, 10)

# What the standard library gained after 3.10 that this codebase could plausibly reach for:
# a module, or a name imported from a module.
NEWER_MODULES = {"tomllib": (3, 11), "wsgiref.types": (3, 11)}
NEWER_NAMES = {
    ("typing", name): (3, 11)
    for name in ("Self", "LiteralString", "Never", "NotRequired", "Required", "Unpack", "TypeVarTuple", "assert_never", "reveal_type")
} | {("enum", "StrEnum"): (3, 11), ("enum", "verify"): (3, 11), ("datetime", "UTC"): (3, 11), ("typing", "override"): (3, 12)}
NEWER_BUILTINS = {"ExceptionGroup": (3, 11), "BaseExceptionGroup": (3, 11)}


def floor_of(requires_python: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*>=\s*3\.(\d+)\s*", requires_python)
    assert m, f"requires-python {requires_python!r}: expected the form '>=3.N'"
    return (3, int(m.group(1)))


def newest_needed(path: Path) -> dict[str, tuple[int, int]]:
    """What in one source file needs a Python newer than 3.10, and which one."""
    needs = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            needs |= {a.name: NEWER_MODULES[a.name] for a in node.names if a.name in NEWER_MODULES}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in NEWER_MODULES:
                needs[node.module] = NEWER_MODULES[node.module]
            needs |= {
                f"{node.module}.{a.name}": NEWER_NAMES[node.module, a.name] for a in node.names if (node.module, a.name) in NEWER_NAMES
            }
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (node.value.id, node.attr) in NEWER_NAMES:
            needs[f"{node.value.id}.{node.attr}"] = NEWER_NAMES[node.value.id, node.attr]
        elif isinstance(node, ast.Name) and node.id in NEWER_BUILTINS:
            needs[node.id] = NEWER_BUILTINS[node.id]
        elif isinstance(node, ast.TryStar):
            needs["except*"] = (3, 11)
    return needs


def test_the_scan_finds_what_is_newer_than_the_floor(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import tomllib\nfrom typing import Self\nimport enum\nx = enum.StrEnum\ny = ExceptionGroup\n")
    assert newest_needed(probe) == {"tomllib": (3, 11), "typing.Self": (3, 11), "enum.StrEnum": (3, 11), "ExceptionGroup": (3, 11)}
    probe.write_text("import json\nfrom typing import Any\n")
    assert newest_needed(probe) == {}
    with pytest.raises(AssertionError, match="expected the form"):
        floor_of("~=3.10")


def test_requires_python_covers_what_the_build_side_imports():
    """A Python that pip lets install hatch-autotune can run every module of it (3.10 could
    not: declare/project.py reads pyproject.toml with tomllib, new in 3.11)."""
    floor = floor_of(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    too_new = {
        f"{path.relative_to(ROOT)}: {what} (Python {v[0]}.{v[1]})": v
        for path in sorted(PACKAGE.rglob("*.py"))
        for what, v in newest_needed(path).items()
        if v > floor
    }
    assert not too_new, f"requires-python >={floor[0]}.{floor[1]} but these need newer: {sorted(too_new)}"


def test_the_runtime_in_the_wheels_runs_on_3_10():
    """The runtime and the generated module's template parse as 3.10 code and use nothing of
    the standard library newer than 3.10."""
    runtime = sorted((PACKAGE / "runtime").rglob("*.py"))
    assert len(runtime) > 5
    for path in runtime:
        ast.parse(path.read_text(), str(path), feature_version=RUNTIME_FLOOR)
        assert newest_needed(path) == {}, path
    template = (PACKAGE / "wheel" / "data" / "generated_module.py.j2").read_text()
    for word in ("tomllib", "ExceptionGroup", "Self", "StrEnum", "except*"):
        assert word not in template, word
