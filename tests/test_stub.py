"""Typed kernels: the generated package's `__init__.pyi` and `py.typed` (issue #12, item 7).

The stub's text is checked for example_pkg, for stencil_kit (constants) and for a table of edge
cases; its call signatures are compared with the runtime's own; and mypy checks consumer scripts
against it: a package on MYPYPATH for the edge cases, and example_pkg's real wheel installed in
a fresh virtual environment (PEP 561), where right code passes and wrong code gets the expected
errors."""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from conftest import EXAMPLE, copy_example, load_project
from hypothesis import given, settings
from hypothesis import strategies as st

from hatch_autotune.declare.config import parse_project
from hatch_autotune.wheel.payload import runtime_files
from hatch_autotune.wheel.stub import _docstring, module_docstring, render_stub, stub_files

STENCIL = Path(__file__).parent / "consumers" / "stencil_kit"


def stub_tree(text: str) -> ast.Module:
    compile(text, "__init__.pyi", "exec")  # valid Python, not only a valid AST
    return ast.parse(text)


def kernel_class(tree: ast.Module, name: str) -> ast.ClassDef:
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == f"_{name}_kernel"]
    return cls


def method(tree: ast.Module, kernel: str, name: str) -> ast.FunctionDef:
    (fn,) = [n for n in kernel_class(tree, kernel).body if isinstance(n, ast.FunctionDef) and n.name == name]
    return fn


def sig(tree: ast.Module, kernel: str, name: str) -> str:
    """A method's signature as written in the stub: `(self, a: T, *, k: U = v) -> R`."""
    fn = method(tree, kernel, name)
    return f"({ast.unparse(fn.args)}) -> {ast.unparse(fn.returns)}"


def runtime_signature(fn: ast.FunctionDef) -> str:
    """What inspect.signature() of the runtime's Kernel says, from a stub method: the names,
    kinds and defaults (no annotations, no self)."""
    P = inspect.Parameter
    params = [P(a.arg, P.POSITIONAL_OR_KEYWORD) for a in fn.args.args[1:]]
    for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults):
        params.append(P(a.arg, P.KEYWORD_ONLY, default=P.empty if d is None else ast.literal_eval(d)))
    return str(inspect.Signature(params))


# ---- the stub's text ------------------------------------------------------------------------


def test_example_pkg_stub_declares_each_kernel_call_and_select():
    project = load_project(EXAMPLE)
    files = stub_files(project)
    assert set(files) == {"__init__.pyi", "py.typed"} and files["py.typed"] == b""  # complete, not partial
    text = files["__init__.pyi"].decode()
    assert stub_files(project) == files  # deterministic
    tree = stub_tree(text)
    assert ast.get_docstring(tree, clean=False) == ast.literal_eval(module_docstring(project))  # the module's own
    assert sig(tree, "saxpy", "__call__") == "(self, a: _SupportsFloat, x: _GpuArray, y: _GpuArray, *, stream: _Stream=None) -> None"
    assert sig(tree, "saxpy", "select") == "(self, arch: _Arch=None, *, n: int, T: _Literal['float32', 'float16']) -> _Selection"
    assert sig(tree, "saxpy", "prepare") == "(self, a: _SupportsFloat, x: _GpuArray, y: _GpuArray) -> _PreparedCall"
    assert sig(tree, "row_softmax", "__call__") == "(self, x: _GpuArray, y: _GpuArray, *, stream: _Stream=None) -> None"
    assert sig(tree, "row_softmax", "select") == "(self, arch: _Arch=None, *, rows: int, cols: int) -> _Selection"
    assert sig(tree, "sgemm", "select") == "(self, arch: _Arch=None, *, m: int, n: int, k: int) -> _Selection"
    assert sig(tree, "sgemm", "binary") == "(self, selection: _Selection) -> bytes"
    assert "saxpy: _saxpy_kernel\nrow_softmax: _row_softmax_kernel\nsgemm: _sgemm_kernel\ngemm: _gemm_kernel\n" in text
    assert '__all__ = ["saxpy", "row_softmax", "sgemm", "gemm", "rmsnorm", "add_rmsnorm", "provenance"]' in text
    # a type parameter and two unit-stride constants: select() takes all three, the call none of the constants
    assert sig(tree, "gemm", "__call__") == "(self, A: _GpuArray, B: _GpuArray, C: _GpuArray, *, stream: _Stream=None) -> None"
    assert sig(tree, "gemm", "select").startswith("(self, arch: _Arch=None, *, m: int, n: int, k: int, T: ")
    assert "A_unit_stride" in sig(tree, "gemm", "select") and "B_unit_stride" in sig(tree, "gemm", "select")
    assert sig(tree, "add_rmsnorm", "__call__") == (
        "(self, x: _GpuArray, residual: _GpuArray, w: _GpuArray, y: _GpuArray, residual_out: _GpuArray, eps: _SupportsFloat, *, stream: _Stream=None) -> None"
    )
    assert "provenance: dict[str, _Any]" in text
    assert (
        "from ._runtime import KernelDecl as _KernelDecl, PreparedCall as _PreparedCall, Selection as _Selection, Variant as _Variant"
        in text
    )
    # dtypes, shapes and the key, which no checker sees, are in the docstrings
    call_doc = ast.get_docstring(method(tree, "saxpy", "__call__"))
    assert call_doc.startswith("saxpy(a, x, y, *, stream=None)\n\ny = a * x + y, elementwise\n")
    assert "  a: scalar, float32\n" in call_doc
    assert "  x: GPU array, T in {float32, float16}, shape (n), C-contiguous, 16-byte aligned, intent in\n" in call_doc
    assert "Key (selects the variant): n = x.shape[0] in [4096, 262144, 16777216] (nearest)" in call_doc
    select_doc = ast.get_docstring(method(tree, "sgemm", "select"))
    assert "  n: buckets [256, 1024, 4096] (nearest); a call reads it from B.shape[1]" in select_doc
    assert "arch: 'sm_86', '8.6', 86 or (8, 6)" in select_doc


def test_constants_are_keywords_required_with_several_values():
    tree = stub_tree(render_stub(load_project(STENCIL)))
    assert sig(tree, "stencil", "__call__") == (
        "(self, x: _GpuArray, y: _GpuArray, *, RADIUS: _Literal[1, 3], PERIODIC: bool, stream: _Stream=None) -> None"
    )
    assert sig(tree, "stencil", "select") == "(self, arch: _Arch=None, *, n: int, RADIUS: _Literal[1, 3], PERIODIC: bool) -> _Selection"
    assert (
        sig(tree, "stencil", "prepare") == "(self, x: _GpuArray, y: _GpuArray, *, RADIUS: _Literal[1, 3], PERIODIC: bool) -> _PreparedCall"
    )
    assert (
        sig(tree, "halo_sum", "__call__") == "(self, x: _GpuArray, y: _GpuArray, *, RADIUS: _Literal[2, 4], stream: _Stream=None) -> None"
    )
    doc = ast.get_docstring(method(tree, "halo_sum", "__call__"))
    assert "  y: GPU array, float32, shape (n - 2 * RADIUS), C-contiguous, intent out\n" in doc
    assert "  RADIUS: constant, keyword only, one of [2, 4]\n" in doc and "Not passed (computed from the call): m = n - 2 * RADIUS" in doc


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(codec="utf-8"), max_size=40) | st.text(alphabet='"\\\n\r\t\x00\x0cN{} ', max_size=12))
def test_any_doc_text_is_one_docstring(text):
    """Whatever a `doc` holds (quotes, backslashes, `\\N{...}`, control characters, line
    breaks), the stub's docstring literal reads back as that text."""
    literal = _docstring(text, "    ")
    tree = ast.parse(f"def f():\n{literal}\n")
    value = ast.get_docstring(tree.body[0], clean=False)
    expected = text.removesuffix("\n")
    assert value.replace("\n    ", "\n").removesuffix("\n") == expected


EDGE_TEMPLATE = 'extern "C" __global__ void {{ entry }}(float* x) {}\n'

EDGE_TABLE = r"""
module = "edgepkg.kernels"
archs = ["sm_90"]

# Named like a builtin the stub uses; a default type parameter and constants; integer, key and
# type-parameter scalars; a doc that is hard to quote.
[kernels.int]
template = "edge.cu.j2"
doc = "tricky \"\"\"doc\"\"\" \\ backslash, a\ttab, a \u0007 bell,\nanother line and a closing quote\""
types = { T = ["float64"] }
constants = { SCALE = [2], NEG = [-1, 5], FAST = [true] }
args = [
  { name = "x", dtype = "T", shape = ["n"], intent = "inout" },
  { name = "count", dtype = "int64" },
  { name = "alpha", dtype = "T" },
  { name = "n", dtype = "int32", value = "n" },
]
key = { n = { buckets = [64, 1024] }, c = { from = "count", buckets = [1, 8] } }
space = { BLOCK = [64] }
default = { BLOCK = 64 }
grid = ["cdiv(n, BLOCK)"]
block = ["BLOCK"]
"""


@pytest.fixture(scope="module")
def edge_project(tmp_path_factory):
    root = tmp_path_factory.mktemp("edge")
    (root / "edge.cu.j2").write_text(EDGE_TEMPLATE)
    return parse_project(tomllib.loads(EDGE_TABLE), root)


def test_edge_cases_give_a_valid_stub(edge_project):
    text = render_stub(edge_project)
    tree = stub_tree(text)
    # a kernel named `int` shadows the builtin in the stub's namespace: builtins are spelled out
    assert "import builtins as _builtins" in text and "int: _int_kernel" in text
    assert sig(tree, "int", "__call__") == (
        "(self, x: _GpuArray, count: _SupportsIndex, alpha: _SupportsFloat, *, SCALE: _Literal[2]=2, NEG: _Literal[-1, 5], "
        "FAST: _Literal[True]=True, stream: _Stream=None) -> None"
    )
    assert sig(tree, "int", "select") == (
        "(self, arch: _Arch=None, *, n: _builtins.int, c: _builtins.int, T: _Literal['float64']='float64', "
        "SCALE: _Literal[2]=2, NEG: _Literal[-1, 5], FAST: _Literal[True]=True) -> _Selection"
    )
    doc = edge_project.kernels["int"].doc
    assert "\t" in doc and "\x07" in doc and '"""' in doc and "\\" in doc and "\n" in doc and doc.endswith('"')
    class_doc = ast.get_docstring(kernel_class(tree, "int"), clean=False).replace("\n    ", "\n")
    assert class_doc.startswith(f"int(x, count, alpha): {doc}\n")
    assert f"\n{doc}\n" in ast.get_docstring(method(tree, "int", "__call__"), clean=False).replace("\n        ", "\n")


def test_the_stub_says_what_the_runtime_signature_says(session_cache, tmp_path):
    """write_package ships the stub next to the module, and each kernel's call in it has the
    names, kinds and defaults of inspect.signature() of the runtime's kernel."""
    from hatch_autotune.compile.cache import CompileCache
    from hatch_autotune.wheel.assemble import build_payload
    from hatch_autotune.wheel.payload import write_package

    project = load_project(STENCIL, {"HATCH_AUTOTUNE_ARCHS": "sm_90"})
    result = build_payload(project, cache=CompileCache(session_cache), log=lambda m: None)
    shutil.copytree(STENCIL / "src" / "stencil_kit", tmp_path / "stencil_kit")
    written = write_package(tmp_path / "stencil_kit" / "kernels", project, result)
    assert {"__init__.pyi", "py.typed", "__init__.py", "_runtime/__init__.py"} <= set(written)
    stub = (tmp_path / "stencil_kit" / "kernels" / "__init__.pyi").read_text()
    assert stub == render_stub(project) and (tmp_path / "stencil_kit" / "kernels" / "py.typed").read_bytes() == b""
    script = "import inspect, json; from stencil_kit import kernels; print(json.dumps({n: str(inspect.signature(getattr(kernels, n))) for n in kernels.__all__[:-1]}))"
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tmp_path)}
    )
    assert proc.returncode == 0, proc.stderr
    runtime = json.loads(proc.stdout)
    tree = stub_tree(stub)
    assert set(runtime) == set(project.kernels)
    for name, expected in runtime.items():
        assert runtime_signature(method(tree, name, "__call__")) == expected, name
    assert runtime["stencil"] == "(x, y, *, RADIUS, PERIODIC, stream=None)"


# ---- mypy on consumer scripts ---------------------------------------------------------------


@pytest.fixture(scope="session")
def mypy_run(tmp_path_factory):
    """mypy_run(files, cwd, *options) -> {(file name, line): [messages]}; one cache per session."""
    pytest.importorskip("mypy", reason="mypy is in the `test` extra")
    cache = tmp_path_factory.mktemp("mypy-cache")
    config = cache / "mypy.ini"
    config.write_text("[mypy]\n")  # not this checkout's settings, if it ever has some

    def run(files: list[Path], cwd: Path, *options: str, mypypath: Path | None = None) -> dict[tuple[str, int], list[str]]:
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir", str(cache), "--strict",
               "--no-error-summary", "--show-error-codes", "--hide-error-context", *options, *map(str, files)]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"} | ({"MYPYPATH": str(mypypath)} if mypypath else {})
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env, timeout=600)
        assert proc.returncode in (0, 1) and not proc.stderr.strip(), proc.stdout + proc.stderr
        out: dict[tuple[str, int], list[str]] = {}
        for line in proc.stdout.splitlines():
            m = re.match(r"(.+?):(\d+): (error|note): (.*)", line)
            assert m, line
            out.setdefault((Path(m.group(1)).name, int(m.group(2))), []).append(f"{m.group(3)}: {m.group(4)}")
        return out

    return run


def bad_script(cases: list[tuple[str, str]], prelude: str) -> tuple[str, dict[int, str]]:
    """A script of one wrong line per case, and {line: the error expected on it}."""
    lines = prelude.strip("\n").splitlines()
    expected = {}
    for code, error in cases:
        lines.append(code)
        expected[len(lines)] = error
    return "\n".join(lines) + "\n", expected


def check_bad(found: dict, name: str, expected: dict[int, str]) -> None:
    got = {line: msgs for (f, line), msgs in found.items() if f == name}
    for line, error in expected.items():
        assert any(error in m for m in got.get(line, [])), f"{name}:{line}: expected {error!r}, got {got.get(line)}"
    assert set(got) <= set(expected), {k: v for k, v in got.items() if k not in expected}


EDGE_GOOD = """\
from edgepkg import kernels
from edgepkg.kernels._runtime import Selection


class Array:
    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        return {}


a = Array()
kernels.int(a, 3, 0.5, NEG=-1)
kernels.int(a, count=3, alpha=1, NEG=5, SCALE=2, FAST=True, stream=None)
s: Selection = kernels.int.select(n=100, c=3, NEG=-1)
kernels.int.select(None, n=100, c=3, T="float64", NEG=5)
count: int = 3
"""

EDGE_BAD = [
    (
        "kernels.int(a, 3.5, 0.5, NEG=-1)",
        'Argument 2 to "__call__" of "_int_kernel" has incompatible type "float"; expected "SupportsIndex"',
    ),
    (
        "kernels.int(a, 3, 0.5, NEG=2)",
        'Argument "NEG" to "__call__" of "_int_kernel" has incompatible type "Literal[2]"; expected "Literal[-1, 5]"',
    ),
    ("kernels.int(a, 3, 0.5)", 'Missing named argument "NEG" for "__call__" of "_int_kernel"'),
    (
        "kernels.int.select(n=1, c=1, NEG=5, SCALE=3)",
        'Argument "SCALE" to "select" of "_int_kernel" has incompatible type "Literal[3]"; expected "Literal[2]"',
    ),
    (
        "kernels.int.select(n=1, c=1, NEG=5, FAST=False)",
        'Argument "FAST" to "select" of "_int_kernel" has incompatible type "Literal[False]"; expected "Literal[True]"',
    ),
]


def test_mypy_checks_calls_against_the_stub(edge_project, mypy_run, tmp_path):
    """The edge cases' package on MYPYPATH (its stub is checked as source, under --strict;
    _runtime/ silently, as mypy treats an installed package)."""
    pkg = tmp_path / "src" / "edgepkg" / "kernels"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    for rel, data in stub_files(edge_project).items():
        (pkg / rel).write_bytes(data)
    for rel, data in runtime_files().items():
        (pkg / rel).parent.mkdir(exist_ok=True)
        (pkg / rel).write_bytes(data)
    (tmp_path / "good.py").write_text(EDGE_GOOD)
    text, expected = bad_script(EDGE_BAD, "\n".join(EDGE_GOOD.splitlines()[:11]))
    (tmp_path / "bad.py").write_text(text)
    found = mypy_run(
        [pkg / "__init__.pyi", tmp_path / "good.py", tmp_path / "bad.py"], tmp_path, "--follow-imports=silent", mypypath=tmp_path / "src"
    )
    assert not [k for k in found if k[0] != "bad.py"], found  # the stub itself and the right script are clean
    check_bad(found, "bad.py", expected)


TORCH_GOOD = """\
import torch
from edgepkg.kernels import torch_ops as edge
from example_pkg.kernels import torch_ops

x = torch.ones(4, 8)
y: torch.Tensor = torch_ops.row_softmax(x)
torch_ops.row_softmax_out(x, y)
c: torch.Tensor = torch_ops.sgemm(x, x.t())
torch_ops.saxpy(2, x, y)
edge.int(x, 3, 0.5, NEG=-1)
edge.int(x, count=3, alpha=1, NEG=5, SCALE=2, FAST=True)
"""

TORCH_BAD = [
    ("torch_ops.sgemm(x)", 'Missing positional argument "B" in call to "sgemm"'),
    ("torch_ops.row_softmax(x, y)", 'Too many arguments for "row_softmax"'),
    ("n: int = torch_ops.row_softmax(x)", 'Incompatible types in assignment (expression has type "Tensor", variable has type "int")'),
    ('torch_ops.saxpy("2", x, y)', 'Argument 1 to "saxpy" has incompatible type "str"; expected "float"'),
    ("torch_ops.saxpy(2.0, [1.0], y)", 'Argument 2 to "saxpy" has incompatible type "list[float]"; expected "Tensor"'),
    ("edge.int(x, 3, 0.5)", 'Missing named argument "NEG" for "int"'),
    ("edge.int(x, 3, 0.5, NEG=2)", 'Argument "NEG" to "int" has incompatible type "Literal[2]"; expected "Literal[-1, 5]"'),
    ("edge.int(x, 3.5, 0.5, NEG=5)", 'Argument 2 to "int" has incompatible type "float"; expected "int"'),
    ("r = edge.int(x, 3, 0.5, NEG=5)", '"int" does not return a value'),
]


def test_mypy_checks_operator_calls_against_the_torch_stub(edge_project, mypy_run, tmp_path):
    """`torch_ops.pyi` of example_pkg and of the edge cases (an operator named `int`, constants),
    with PyTorch's own types: the operators are typed as the functions they are called as."""
    from hatch_autotune.wheel.torch_module import torch_files

    for project, package in ((edge_project, "edgepkg"), (load_project(EXAMPLE), "example_pkg")):
        pkg = tmp_path / "src" / package / "kernels"
        pkg.mkdir(parents=True)
        (pkg.parent / "__init__.py").write_text("")
        for rel, data in {**stub_files(project), **torch_files(project), **runtime_files()}.items():
            (pkg / rel).parent.mkdir(exist_ok=True)
            (pkg / rel).write_bytes(data)
        (pkg / "torch_ops.py").unlink()  # the stub speaks for it
    (tmp_path / "good.py").write_text(TORCH_GOOD)
    text, expected = bad_script(TORCH_BAD, TORCH_GOOD)
    (tmp_path / "bad.py").write_text(text)
    stubs = [tmp_path / "src" / p / "kernels" / "torch_ops.pyi" for p in ("edgepkg", "example_pkg")]
    found = mypy_run([*stubs, tmp_path / "good.py", tmp_path / "bad.py"], tmp_path, "--follow-imports=silent", mypypath=tmp_path / "src")
    assert not [k for k in found if k[0] != "bad.py"], found  # the stubs and the right script are clean
    check_bad(found, "bad.py", expected)


def test_the_torch_stub_spells_builtins_out_where_an_operator_shadows_them(edge_project):
    from hatch_autotune.wheel.torch_module import render_torch_stub

    text = render_torch_stub(edge_project)
    tree = stub_tree(text)
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert "import builtins as _builtins" in text
    assert f"def int({ast.unparse(fn.args)}) -> {ast.unparse(fn.returns)}" == (
        "def int(x: _Tensor, count: _builtins.int, alpha: _builtins.float, *, SCALE: _Literal[2]=2, NEG: _Literal[-1, 5], "
        "FAST: _Literal[True]=True) -> None"
    )
    assert ast.get_docstring(fn).startswith(
        "int(Tensor(a0!) x, int count, float alpha, *, int SCALE=2, int NEG, bool FAST=True) -> (): tricky"
    )


# ---- the real wheel -------------------------------------------------------------------------


GOOD = """\
from __future__ import annotations

import numpy as np
from example_pkg import kernels
from example_pkg.kernels._runtime import PreparedCall, Selection


class CupyLike:  # any GPU array with __cuda_array_interface__
    @property
    def __cuda_array_interface__(self) -> dict[str, object]:
        return {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3}


class CudaCoreStreamLike:  # what cuda.core's Stream declares
    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, 0)


class TorchStreamLike:
    cuda_stream: int = 0


x, y = CupyLike(), CupyLike()
host = np.zeros(4, dtype=np.float32)  # DLPack: the checker accepts it (the runtime refuses host memory)
kernels.saxpy(2.0, x, y)
kernels.saxpy(np.float32(2.0), x, y=y, stream=CudaCoreStreamLike())
kernels.saxpy(2, host, host, stream=TorchStreamLike())
kernels.saxpy(a=2.0, x=x, y=y, stream=0)
kernels.row_softmax(x, y, stream=None)
kernels.sgemm(x, x, y)
sel = kernels.saxpy.select(arch="sm_90", n=100_000, T="float16")
reveal_type(sel)
reveal_type(sel.bucket)
kernels.row_softmax.select((8, 6), rows=300, cols=129)
kernels.sgemm.select(90, m=2000, n=3, k=4096)
kernels.sgemm.select("9.0", m=1, n=1, k=1)
kernels.sgemm.select(m=1, n=1, k=1)
blob: bytes = kernels.saxpy.binary(sel)
call: PreparedCall = kernels.row_softmax.prepare(x, y)
buckets: dict[str, list[int]] = kernels.sgemm.buckets
where: dict[str, object] = kernels.provenance
chosen: list[Selection] = [kernels.saxpy.select(arch=a, n=4096, T="float32") for a in ("sm_80", "sm_90")]
"""

BAD = [
    (
        "kernels.saxpy(2.0, x, y, strem=None)",
        'Unexpected keyword argument "strem" for "__call__" of "_saxpy_kernel"; did you mean "stream"?',
    ),
    ("kernels.saxpy(2.0, x)", 'Missing positional argument "y" in call to "__call__" of "_saxpy_kernel"'),
    ("kernels.sgemm(x, x)", 'Missing positional argument "C" in call to "__call__" of "_sgemm_kernel"'),
    ("kernels.saxpy(2.0, x, y, x)", 'Too many positional arguments for "__call__" of "_saxpy_kernel"'),
    (
        'kernels.saxpy.select(arch="sm_90", n=1, T="float64")',
        'Argument "T" to "select" of "_saxpy_kernel" has incompatible type "Literal[\'float64\']"; expected "Literal[\'float32\', \'float16\']"',
    ),
    ('kernels.saxpy.select(arch="sm_90", n=1)', 'Missing named argument "T" for "select" of "_saxpy_kernel"'),
    ('kernels.row_softmax.select(arch="sm_90", rows=1)', 'Missing named argument "cols" for "select" of "_row_softmax_kernel"'),
    ('kernels.saxpy.select("sm_90", n=1, T="float32", k=2)', 'Unexpected keyword argument "k" for "select" of "_saxpy_kernel"'),
    (
        'kernels.sgemm.select(arch="sm_90", m=1.5, n=1, k=1)',
        'Argument "m" to "select" of "_sgemm_kernel" has incompatible type "float"; expected "int"',
    ),
    ("kernels.sgemm.select(arch=9.0, m=1, n=1, k=1)", 'Argument "arch" to "select" of "_sgemm_kernel" has incompatible type "float"'),
    ('kernels.saxpy("2.0", x, y)', 'Argument 1 to "__call__" of "_saxpy_kernel" has incompatible type "str"; expected "SupportsFloat"'),
    ("kernels.saxpy(2.0, [1.0], y)", 'Argument 2 to "__call__" of "_saxpy_kernel" has incompatible type "list[float]"'),
    ('kernels.saxpy(2.0, x, y, stream="default")', 'Argument "stream" to "__call__" of "_saxpy_kernel" has incompatible type "str"'),
    ("kernels.softmax(x, y)", 'Module has no attribute "softmax"'),
    (
        "n: str = kernels.saxpy.select(n=1, T='float32').bucket['n']",
        'Incompatible types in assignment (expression has type "int", variable has type "str")',
    ),
]


def run_ok(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.mark.slow
def test_mypy_sees_the_kernels_of_the_installed_wheel(session_cache, mypy_run, tmp_path):
    """example_pkg's wheel (pip wheel, this checkout's hatch-autotune) installed in a fresh
    virtual environment; mypy, pointed at that environment's interpreter, finds the package
    through its py.typed (numpy comes from this environment, through a .pth file)."""
    env = {**os.environ, "HATCH_AUTOTUNE_CACHE_DIR": str(session_cache), "HATCH_AUTOTUNE_MODE": "offline"}
    src = copy_example(tmp_path / "example")
    run_ok(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)], env=env
    )
    (wheel,) = (tmp_path / "dist").glob("example_pkg-*.whl")
    project = load_project(EXAMPLE)
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("example_pkg/kernels/__init__.pyi") == stub_files(project)["__init__.pyi"]
        assert zf.read("example_pkg/kernels/py.typed") == b""
        record = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))).decode()
        assert "example_pkg/kernels/__init__.pyi," in record and "example_pkg/kernels/py.typed," in record

    run_ok([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")])
    py = tmp_path / "venv" / "bin" / "python"
    run_ok([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)])
    site = Path(run_ok([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    import numpy

    (site / "_this_env.pth").write_text(str(Path(numpy.__file__).parents[1]) + "\n")
    signatures = run_ok(
        [
            str(py),
            "-c",
            "import inspect, json; from example_pkg import kernels; print(json.dumps({n: str(inspect.signature(getattr(kernels, n))) for n in ('saxpy', 'row_softmax', 'sgemm')}))",
        ],
        cwd=tmp_path,
    )
    tree = stub_tree((site / "example_pkg" / "kernels" / "__init__.pyi").read_text())
    for name, expected in json.loads(signatures.stdout).items():
        assert runtime_signature(method(tree, name, "__call__")) == expected, name

    work = tmp_path / "consumer"
    work.mkdir()
    (work / "good.py").write_text(GOOD)
    text, expected = bad_script(BAD, GOOD.split("\n\n\n")[0] + "\nx = y = host = np.zeros(4, dtype=np.float32)")
    (work / "bad.py").write_text(text)
    found = mypy_run([work / "good.py", work / "bad.py"], work, "--python-executable", str(py))
    good = {k: v for k, v in found.items() if k[0] == "good.py"}
    lines = GOOD.splitlines()
    reveal = {lines[line - 1]: " ".join(msgs).replace("builtins.", "") for (_, line), msgs in good.items()}
    assert reveal == {
        "reveal_type(sel)": 'note: Revealed type is "example_pkg.kernels._runtime.selection.Selection"',
        "reveal_type(sel.bucket)": 'note: Revealed type is "typing.Mapping[str, int]"',
    }, good  # and no error
    check_bad(found, "bad.py", expected)
