"""The package's structure, drawn from its real imports (every `import` statement, at module level,
inside functions and under TYPE_CHECKING alike): stages in one order with no arrow from an
earlier stage to a later one, no import circles between modules, a self-contained runtime, and
no folder named as tools name output or tests."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hatch_autotune"

# The stages in the order data flows through them; a module may import its own stage and
# earlier ones only. Rank 0 is what every stage shares.
STAGES = [
    ("shared", {"hatch_autotune", "hatch_autotune.errors", "hatch_autotune.text", "hatch_autotune.files", "hatch_autotune.runtime"}),
    ("declare", {"hatch_autotune.declare"}),
    ("compile", {"hatch_autotune.compile"}),
    ("lock", {"hatch_autotune.lock"}),
    ("plan", {"hatch_autotune.plan"}),
    ("tuning", {"hatch_autotune.tuning"}),
    ("wheel", {"hatch_autotune.wheel"}),
    ("inspection", {"hatch_autotune.inspection"}),
    ("command", {"hatch_autotune.cli", "hatch_autotune.__main__"}),
    ("hatch", {"hatch_autotune.hatch"}),
]
TOOL_SKIPPED_NAMES = {"build", "dist", "spec", "specs", "test", "tests", "out", "vendor"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def resolve(name: str, known: dict[str, Path]) -> str:
    """The module a dotted name refers to: itself, or its longest prefix that is a module."""
    while name not in known and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports_of(mod: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules that `mod` imports, anywhere in its body."""
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names]  # a submodule, or a name in `base`
        else:
            continue
        for name in names:
            if name.split(".")[0] == "hatch_autotune":
                target = resolve(name, known)
                if target != mod:
                    found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def stage_of(mod: str) -> tuple[int, str]:
    for rank, (name, roots) in enumerate(STAGES):
        if any(mod == r or (r != "hatch_autotune" and mod.startswith(r + ".")) for r in roots):
            return rank, name
    raise AssertionError(f"{mod} belongs to no stage: add it to STAGES")


def test_the_walker_sees_relative_function_level_and_type_checking_imports(tmp_path):
    """The checks below are only as good as this: every kind of import statement is an edge."""
    known = {
        "hatch_autotune.a.x": tmp_path / "x.py",
        "hatch_autotune.a.y": tmp_path / "y.py",
        "hatch_autotune.b": tmp_path / "b.py",
        "hatch_autotune.c": tmp_path / "c.py",
        "hatch_autotune.d": tmp_path / "d.py",
    }
    src = tmp_path / "x.py"
    src.write_text(
        "from typing import TYPE_CHECKING\nfrom . import y\nif TYPE_CHECKING:\n    from ..b import Thing\n"
        "def f():\n    from hatch_autotune.c import g\n    import hatch_autotune.d\n"
    )
    assert imports_of("hatch_autotune.a.x", src, known) == {
        "hatch_autotune.a.y",
        "hatch_autotune.b",
        "hatch_autotune.c",
        "hatch_autotune.d",
    }


def test_every_module_belongs_to_a_stage():
    for mod in graph():
        stage_of(mod)


def backward_arrows(g: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{mod} ({stage_of(mod)[1]}) imports {dep} ({stage_of(dep)[1]})"
        for mod, deps in g.items()
        for dep in deps
        if stage_of(dep)[0] > stage_of(mod)[0]
    )


def circles(g: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(g.get(m, ())):
            if state.get(d) == 1:
                found.append(" -> ".join([*path[path.index(d) :], d]))
            elif d not in state:
                visit(d, [*path, d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    return found


def test_the_checks_find_a_circle_and_a_backward_arrow():
    """The two checks below can fail."""
    g = {
        "hatch_autotune.compile.a": {"hatch_autotune.compile.b"},
        "hatch_autotune.compile.b": {"hatch_autotune.compile.a"},
        "hatch_autotune.declare.x": set(),
    }
    assert circles(g) == ["hatch_autotune.compile.a -> hatch_autotune.compile.b -> hatch_autotune.compile.a"]
    g["hatch_autotune.declare.x"] = {"hatch_autotune.wheel.stub"}
    assert backward_arrows(g) == ["hatch_autotune.declare.x (declare) imports hatch_autotune.wheel.stub (wheel)"]


def test_no_stage_imports_a_later_one():
    problems = backward_arrows(graph())
    assert not problems, "\n".join(problems)


def test_no_import_circles():
    found = circles(graph())
    assert not found, "\n".join(found)


def test_the_runtime_imports_nothing_of_the_build_side():
    """It is vendored whole into every wheel, where hatch_autotune is not installed."""
    g = graph()
    runtime = [m for m in g if m == "hatch_autotune.runtime" or m.startswith("hatch_autotune.runtime.")]
    assert runtime
    outside = {m: sorted(d for d in g[m] if d not in runtime) for m in runtime}
    assert not any(outside.values()), outside


def test_the_tuner_does_not_import_the_wheel_writer_nor_the_command():
    g = graph()
    for mod, deps in g.items():
        if mod.startswith("hatch_autotune.tuning"):
            assert not {d for d in deps if d.startswith(("hatch_autotune.wheel", "hatch_autotune.cli", "hatch_autotune.inspection"))}, mod


def test_no_folder_is_named_as_tools_name_output_or_tests():
    folders = {p.name for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"}
    assert not folders & TOOL_SKIPPED_NAMES


# ---- sizes: rooms a reader can hold in mind ----------------------------------------------------

MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 300


def oversized(paths: dict[str, Path]) -> list[str]:
    """Modules over MAX_MODULE_LINES lines and classes over MAX_CLASS_LINES, as `where: lines`."""
    found = []
    for mod, path in sorted(paths.items()):
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{mod}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    found.append(f"{mod}.{node.name}: {size} lines")
    return found


def test_the_size_check_finds_a_big_module_and_a_big_class(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("class C:\n" + "    x = 1\n" * MAX_CLASS_LINES + "y = 2\n" * (MAX_MODULE_LINES - MAX_CLASS_LINES))
    small = tmp_path / "small.py"
    small.write_text("class C:\n    x = 1\n")
    assert oversized({"big": big, "small": small}) == [f"big: {MAX_MODULE_LINES + 1} lines", f"big.C: {MAX_CLASS_LINES + 1} lines"]


def test_no_module_or_class_is_too_big_to_read_whole():
    found = oversized(modules())
    assert not found, "\n".join(found)


# ---- the kernel declaration: typed records, its JSON read in one place -------------------------

# Keys that only the declaration's and the table's JSON forms have (runtime/declaration.py and
# runtime/table.py read and write them); declare/ reads the pyproject table, whose TOML spells some
# of them too, and tuning/inputs.py the input recipe's own `intent`. (Not "kind", which the
# worker's failures have too, nor "args" and "key", which other records have.)
DECLARATION_KEYS = {"intent", "type_params", "launch", "axis", "mapping", "buckets", "variants", "select"}
DECLARATION_OWNERS = (
    "hatch_autotune.runtime.declaration",
    "hatch_autotune.runtime.table",
    "hatch_autotune.declare",
    "hatch_autotune.tuning.inputs",
)


def key_reads(path: Path, keys: set[str]) -> list[int]:
    """Lines where `path` reads one of `keys` by string: `x["kind"]`, `x.get("kind")`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in keys) or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "pop", "setdefault")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in keys
        ):
            found.append(node.lineno)
    return found


def test_the_key_read_check_finds_a_read(tmp_path):
    src = tmp_path / "m.py"
    src.write_text('a = spec["args"][0]["intent"]\nb = spec.get("launch")\nc = spec.name\n')
    assert key_reads(src, DECLARATION_KEYS) == [1, 2]


def test_the_declaration_is_read_by_key_in_one_place():
    """Every stage reads a kernel's declaration as typed records (runtime/declaration.py)."""
    found = [
        f"{mod}:{line}"
        for mod, path in sorted(modules().items())
        if not mod.startswith(DECLARATION_OWNERS)
        for line in key_reads(path, DECLARATION_KEYS)
    ]
    assert not found, found
