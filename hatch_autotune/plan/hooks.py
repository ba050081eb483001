"""Whether a kernel's `reference` and `inputs` hooks ("module:function") resolve, asked by every
build, tuning run and `show` (make_plan): a misspelt hook would otherwise pass an offline build
and be found only on a GPU builder.

The module is looked for where the tuner imports it from (tuning/inputs.py `load_function`: the
project's src/ and root, then sys.path), and its source read, not run: importing it would run the
user's code in the build, whose environment need not have what the hook imports (torch, CuPy),
while the GPU builder's has. A module of the project whose source binds no such name at its top
level is an error; a module outside the project, or one that makes its names at run time
(`__getattr__`, `import *`), is left to the tuner."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from ..declare.config import KernelSpec
from ..errors import BuildError

HOOKS = ("reference", "inputs")
KERNELS_TABLE = "tool.hatch.build.targets.wheel.hooks.autotune.kernels"


def hook_problem(ref: str, root: Path) -> str | None:
    """What is wrong with hook `ref` of a project at `root` (None: it resolves, or cannot be told
    without running it)."""
    module_name, _, func = ref.partition(":")
    source = _module_file(module_name, root)
    if source is None:
        top = module_name.split(".")[0]
        try:
            elsewhere = importlib.util.find_spec(top) is not None  # a top-level name: nothing of it runs
        except (ImportError, ValueError):
            elsewhere = False
        if elsewhere:
            return None
        return (
            f"no module named {module_name!r} (looked in {root / 'src'}, {root} and sys.path); expected 'module:function' "
            "naming a module of the project"
        )
    if source.suffix != ".py":
        return None  # an extension module: only importing it would tell
    try:
        tree = ast.parse(source.read_text(encoding="utf-8", errors="replace"), str(source))
    except SyntaxError as exc:
        return f"module {module_name!r} ({source}) does not parse: {exc.msg} (line {exc.lineno})"
    except (OSError, ValueError) as exc:
        return f"module {module_name!r} ({source}) cannot be read: {exc}"
    bound, dynamic, literal = _top_level_names(tree)
    if func in literal:
        return f"{module_name}.{func} is a {literal[func]}, not a function"
    if func in bound or dynamic:
        return None
    return f"module {module_name!r} ({source}) has no function {func!r}"


def _module_file(module_name: str, root: Path) -> Path | None:
    """The file of a dotted module inside the project (src/ first, as the tuner's sys.path has
    it): a package's __init__.py or a .py file; None when the project has none."""
    parts = module_name.split(".")
    for base in (root / "src", root):
        folder = base.joinpath(*parts[:-1])
        if not folder.is_dir():
            continue
        for candidate in (folder / parts[-1] / "__init__.py", folder / f"{parts[-1]}.py"):
            if candidate.is_file():
                return candidate
        extensions = sorted(folder.glob(f"{parts[-1]}.*.so")) + sorted(folder.glob(f"{parts[-1]}.*.pyd"))
        if extensions:
            return extensions[0]
    return None


def _top_level_names(tree: ast.Module) -> tuple[set[str], bool, dict[str, str]]:
    """The names a module's source binds at its top level (also inside top-level if/try/with
    blocks), whether it may make others at run time, and those only ever bound to a literal
    (name -> its type's name: `make = 42` is no function; `try: def make` ... `except: make =
    None` may well be one)."""
    bound: set[str] = set()
    literal: dict[str, str] = {}
    other: set[str] = set()  # bound to something that may be a function
    dynamic = False
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
            other.add(node.name)
            dynamic = dynamic or node.name == "__getattr__"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    dynamic = True
                else:
                    name = alias.asname or alias.name.split(".")[0]
                    bound.add(name)
                    other.add(name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                    bound.add(name)
                    if isinstance(node.value, ast.Constant) and isinstance(target, ast.Name):
                        literal[name] = type(node.value.value).__name__
                    else:
                        other.add(name)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            body += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            for handler in getattr(node, "handlers", []):
                body += handler.body
        elif not isinstance(node, (ast.Expr, ast.Pass)):  # a loop, a del, a global statement: names it makes cannot be told
            dynamic = dynamic or isinstance(node, (ast.For, ast.While, ast.Global))
    return bound, dynamic, {name: kind for name, kind in literal.items() if name not in other}


def check_hooks(spec: KernelSpec) -> None:
    """BuildError naming the kernel's key when its `reference` or `inputs` hook does not resolve."""
    if spec.root is None:
        return
    for key in HOOKS:
        ref = getattr(spec, key)
        if ref is None:
            continue
        problem = hook_problem(ref, spec.root)
        if problem:
            does = "compute the expected outputs" if key == "reference" else "make each bucket's inputs"
            raise BuildError(
                f"hatch-autotune: {KERNELS_TABLE}.{spec.name}.{key}: {ref!r} does not resolve: {problem}. The tuner imports "
                f"it on a GPU builder to {does}; "
                "fix the name (module path relative to the project root or src/, then ':function')"
            )
