"""Issue #33, rendering: odd `#include` names and header graphs are one template error
(`file:line: message (kernel, config)`), never a traceback; an `#include` that NVRTC's
preprocessor skips (`#if 0`) is no header; and `hatch-autotune render` shows a variant's source
with the line numbers NVRTC's `<entry>.cu(N)` refers to.

Names new in this round (render_config, Variant.render_command) are imported inside the tests,
so that each test fails on its own against the code before them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, SCALE_TEMPLATE, load_project, write_tiny_project
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hatch_autotune import cli
from hatch_autotune.compile.render import TemplateError, render_kernel

EXAMPLES = int(os.environ.get("HATCH_AUTOTUNE_EXAMPLES", "300"))
FAST = settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
STENCIL_KIT = ROOT / "tests" / "consumers" / "stencil_kit"
DEFAULT_LABEL = "(kernel scale, BLOCK=128, FACTOR=2, BAD=false)"  # the tiny kernel's default config, as errors name it
FIRST_LABEL = "(kernel scale, BLOCK=64, FACTOR=2, BAD=false)"  # its first config: where rendering them all stops
ONE_TEMPLATE_ERROR = re.compile(r"^\S[^\n]*:\d+: [^\n]+ \(kernel scale, [^\n]*\)$")


@pytest.fixture(autouse=True)
def plain_output(monkeypatch):
    """The command's output as a pipe gets it, whatever the CI environment forces."""
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE", "HATCH_AUTOTUNE_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


def tiny_with_head(root: Path, head: str, headers: dict[str, str] | None = None) -> Path:
    """The tiny project, its template starting with `head` (line 1 on), and these header files."""
    write_tiny_project(root, template=head + "\n" + SCALE_TEMPLATE)
    for rel, text in (headers or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def template_error(root: Path) -> str:
    """The one-line TemplateError of rendering the tiny project's kernel (fails on any other)."""
    with pytest.raises(TemplateError) as info:
        render_kernel(load_project(root).kernels["scale"])
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    return message


def default_variant(root: Path, kernel: str = "scale", types_key: str = "-"):
    spec = load_project(root).kernels[kernel]
    variants = render_kernel(spec)[types_key]
    return next(v for v in variants if v.config_dict == dict(spec.default))


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------------------------
# #9: odd #include names are one template error.


@pytest.mark.parametrize(
    "name,problem",
    [
        ("loop/x.cuh", "its path is a loop of symbolic links"),
        ("a\0b.cuh", "a file name cannot hold a NUL character"),
        ("x" * 5000 + ".cuh", "file name too long"),
    ],
    ids=["symlink-loop", "nul", "5000-characters"],
)
def test_an_odd_include_name_is_one_template_error(tmp_path, name, problem):
    root = tiny_with_head(tmp_path / "p", f'#include "{name}"')
    os.symlink("loop", root / "loop")  # loop -> loop
    message = template_error(root)
    assert message.startswith(f"{root / 'scale.cu.j2'} (as rendered):1: #include "), message
    assert problem in message and message.endswith(FIRST_LABEL), message
    assert "\0" not in message and len(message) < 1000, message  # the name escaped and cut, not 5000 characters


def test_an_odd_include_name_in_a_header_names_the_header_and_its_line(tmp_path):
    root = tiny_with_head(tmp_path / "p", '#include "common.cuh"', {"common.cuh": '// shared\n#include "a\0b.cuh"\n'})
    message = template_error(root)
    assert message.startswith(f"{root / 'common.cuh'}:2: #include 'a\\x00b.cuh' cannot name a header"), message


# --------------------------------------------------------------------------------------------
# #9: an #include NVRTC's preprocessor skips is no header.


def test_an_include_inside_if_0_is_no_header(tmp_path):
    head = '#if 0\n#include "disabled.cuh"\n#endif\n#include "common.cuh"'
    root = tiny_with_head(tmp_path / "p", head, {"common.cuh": '#if 0\n#  include "gone.cuh"\n#endif\n'})
    variant = default_variant(root)
    assert [name for name, _ in variant.headers] == ["common.cuh"]


def test_groups_nested_in_if_0_are_tracked_and_its_else_counts(tmp_path):
    skipped = '#if 0\n#ifdef X\n#else\n#include "gone1.cuh"\n#endif\n#include "gone2.cuh"\n#endif'
    root = tiny_with_head(tmp_path / "p", skipped)
    assert default_variant(root).headers == ()
    root = tiny_with_head(tmp_path / "q", '#if 0\n#include "gone.cuh"\n#else\n#include "missing.cuh"\n#endif')
    message = template_error(root)
    assert ':4: #include "missing.cuh" not found' in message and "gone.cuh" not in message, message


@pytest.mark.parametrize(
    "head,reached",
    [
        ('#if 1\n#else\n#include "gone.cuh"\n#endif', []),  # the #else of a true literal is skipped
        ('#if {{ BAD }}\n#include "gone.cuh"\n#endif', []),  # `{{ flag }}` renders as C++'s false
        ('#if (0)\n#include "gone.cuh"\n#elif 1\n#include "h.cuh"\n#else\n#include "gone.cuh"\n#endif', ["h.cuh"]),
        ('#ifdef USE_H\n#include "h.cuh"\n#endif', ["h.cuh"]),  # a macro takes a preprocessor: counted
        ('#if SOME_MACRO\n#include "h.cuh"\n#else\n#include "h2.cuh"\n#endif', ["h.cuh", "h2.cuh"]),
    ],
    ids=["if-1-else", "if-false", "elif", "ifdef", "unknown-condition"],
)
def test_only_branches_a_literal_rules_out_are_skipped(tmp_path, head, reached):
    root = tiny_with_head(tmp_path / "p", head, {"h.cuh": "", "h2.cuh": ""})
    assert [name for name, _ in default_variant(root).headers] == reached


# --------------------------------------------------------------------------------------------
# `hatch-autotune render`.


def numbered_body(out: str) -> list[str]:
    """The numbered source lines of `render`'s output, without the notes around them."""
    return [line for line in out.split("\n")[:-1] if not line.startswith("// ")]


def numbered(text: str) -> list[str]:
    """A source's lines as `render` numbers them: NVRTC's count, newlines only."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    width = len(str(len(lines)))
    return [f"{n:>{width}}  {line}" if line else f"{n:>{width}}" for n, line in enumerate(lines, 1)]


def test_render_prints_the_default_variant_with_line_numbers(tmp_path, capsys):
    root = write_tiny_project(tmp_path / "p")
    variant = default_variant(root)
    code, out, err = run_cli(capsys, "render", "scale", root)
    assert code == 0, err
    assert numbered_body(out) == numbered(variant.source)
    assert out.startswith(f"// {variant.label}: scale.cu as NVRTC compiles it, rendered from {root / 'scale.cu.j2'}\n"), out


def test_render_plain_is_the_source_nvrtc_compiles_byte_for_byte(capsys):
    root = ROOT / "example_pkg"
    spec = load_project(root).kernels["saxpy"]
    variant = next(v for v in render_kernel(spec)["T=float16"] if v.config_dict == {"BLOCK": 64, "VEC": 2, "ITEMS": 4})
    code, out, err = run_cli(
        capsys, "render", "saxpy", root, "--types", "T=float16", "--config", "BLOCK=64,VEC=2", "-c", "ITEMS=4", "--plain"
    )
    assert code == 0, err
    assert out == variant.source
    job = variant.compile_job("sm_90", spec.entry, spec.nvrtc_options)
    assert job.source == out  # what NVRTC is given


def test_render_takes_pairs_as_show_prints_them_and_options_anywhere(tmp_path, capsys):
    root = write_tiny_project(tmp_path / "p")
    expected = next(
        v for v in render_kernel(load_project(root).kernels["scale"])["-"] if v.config_dict["BLOCK"] == 256 and v.config_dict["FACTOR"] == 3
    )
    code, out, err = run_cli(capsys, "render", "-c", "BLOCK=256 FACTOR=3", "scale", "--plain", root)
    assert code == 0, err
    assert out == expected.source


def test_render_names_the_headers_and_prints_them_on_request(capsys):
    variant = default_variant(STENCIL_KIT, "halo_sum", "RADIUS=2")
    code, out, err = run_cli(capsys, "render", "halo_sum", STENCIL_KIT)
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("// #include")]
    assert notes == [
        f'// #include "{name}": {path} (--headers prints it)'
        for name, path in [
            ("common.cuh", STENCIL_KIT / "cuda" / "common.cuh"),
            ("detail/weights.cuh", STENCIL_KIT / "cuda" / "detail" / "weights.cuh"),
            ("scale.cuh", STENCIL_KIT / "cuda" / "detail" / "scale.cuh"),
        ]
    ]
    code, out, err = run_cli(capsys, "render", "halo_sum", STENCIL_KIT, "--headers")
    assert code == 0, err
    body = numbered_body(out)
    assert body[: len(numbered(variant.source))] == numbered(variant.source)
    for _, text in variant.headers:
        lines = numbered(text)
        assert any(body[i : i + len(lines)] == lines for i in range(len(body))), text


def test_render_line_numbers_are_the_ones_nvrtc_cites(tmp_path, capsys):
    """The BAD variant's NVRTC error cites `scale.cu(N)`; line N of `render` is the broken line."""
    from hatch_autotune.compile.nvrtc import compile_one

    root = write_tiny_project(tmp_path / "p", template="{# a comment line #}\n{% set pad = 1 %}\n" + SCALE_TEMPLATE, bad="[false, true]")
    spec = load_project(root).kernels["scale"]
    bad = next(v for v in render_kernel(spec)["-"] if v.config_dict["BAD"])
    ok, _, log = compile_one(bad.compile_job("sm_90", spec.entry, spec.nvrtc_options))
    assert not ok
    cited = int(re.search(r"scale\.cu\((\d+)\)", log).group(1))
    code, out, err = run_cli(capsys, "render", "scale", root, "--config", "BAD=true")
    assert code == 0, err
    by_number = {int(m.group(1)): m.group(2) for m in map(re.compile(r" *(\d+)(?:  (.*))?").fullmatch, numbered_body(out))}
    assert "this_is_not_cuda(;" in by_number[cited], (cited, out)


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["nope"], ["no kernel named nope in", "its kernels: scale"]),
        (["scale", "--config", "BLOK=64"], ["--config BLOK=64", "kernel scale has no axis named BLOK", "its axes: BLOCK, FACTOR, BAD"]),
        (["scale", "--config", "BLOCK=65"], ["--config BLOCK=65", "not one of BLOCK's values (64, 128, 256)"]),
        (["scale", "--config", "BLOCK"], ["--config 'BLOCK'", "expected NAME=VALUE pairs"]),
        (["scale", "-c", "BLOCK=64", "-c", "BLOCK=128"], ["--config: BLOCK is given twice"]),
        (
            ["scale", "--types", "T=float32"],
            ["--types T=float32", "kernel scale has no type parameter or constant named T", "it has no type parameters"],
        ),
    ],
    ids=["unknown-kernel", "unknown-axis", "bad-value", "not-a-pair", "twice", "no-such-type"],
)
def test_render_bad_arguments_are_one_line(tmp_path, capsys, argv, needles):
    root = write_tiny_project(tmp_path / "p")
    code, out, err = run_cli(capsys, "render", *argv[:1], root, *argv[1:])
    assert_one_line(code, out, err, *needles)


def assert_one_line(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2 and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hatch-autotune: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_render_refuses_a_config_that_breaks_a_constraint_or_a_bad_type_value(capsys):
    root = ROOT / "example_pkg"
    code, out, err = run_cli(capsys, "render", "saxpy", root, "-t", "T=float16", "-c", "BLOCK=1024,ITEMS=8")
    assert_one_line(
        code, out, err, "--config BLOCK=1024,VEC=1,ITEMS=8 with T=float16", "violates kernel saxpy's constraints[0] 'BLOCK * ITEMS <= 4096'"
    )
    code, out, err = run_cli(capsys, "render", "saxpy", root, "-t", "T=int8")
    assert_one_line(code, out, err, "--types T=int8", "not one of T's values (float32, float16)")


def test_render_of_a_broken_template_is_its_one_line_template_error(tmp_path, capsys):
    root = tiny_with_head(tmp_path / "p", '#include "missing.cuh"')
    code, out, err = run_cli(capsys, "render", "scale", root)
    assert_one_line(code, out, err, f'{root / "scale.cu.j2"} (as rendered):1: #include "missing.cuh" not found', DEFAULT_LABEL)


def test_a_variants_render_command_prints_that_variant(capsys):
    """What a build's compile error can quote: the command that shows the variant it names."""
    spec = load_project(STENCIL_KIT).kernels["halo_sum"]
    variant = render_kernel(spec)["RADIUS=4"][-1]
    command = variant.render_command(str(STENCIL_KIT))
    assert command == f"hatch-autotune render halo_sum {shlex.quote(str(STENCIL_KIT))} --types RADIUS=4 --config BLOCK=256"
    code, out, err = run_cli(capsys, *shlex.split(command)[1:], "--plain")
    assert code == 0, err
    assert out == variant.source
    assert render_kernel(load_project(ROOT / "example_pkg").kernels["saxpy"])["T=float16"][0].render_command() == (
        "hatch-autotune render saxpy --types T=float16 --config BLOCK=64,VEC=1,ITEMS=1"
    )


# --------------------------------------------------------------------------------------------
# Hypothesis: whatever the #include names and the header graph, the renderer succeeds or raises
# the one template error type with a one-line file:line message.


@pytest.fixture(scope="module")
def header_project(tmp_path_factory):
    """The tiny project whose template includes top.cuh; the examples rewrite cuda/ (headers)."""
    root = tiny_with_head(tmp_path_factory.mktemp("headers") / "p", '#include "cuda/top.cuh"')
    return root, load_project(root).kernels["scale"]


def render_default(spec):
    from hatch_autotune.compile.render import render_config

    return render_config(spec, {}, dict(spec.default))[0]


def assert_one_template_error(exc: TemplateError) -> None:
    message = str(exc)
    assert len(message.splitlines()) == 1 and ONE_TEMPLATE_ERROR.match(message), repr(message)


ODD_NAMES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40),  # unicode, NUL, quotes, brackets
    st.builds(lambda c, n: c * n, st.sampled_from(["x", "é", "a/", "../", "./", "\0"]), st.integers(1, 3000)),
    st.builds(
        "".join,
        st.lists(
            st.sampled_from(["..", "/", ".", "cuda", "top.cuh", "h.cuh", "<", ">", '"', "\0", "/etc/passwd", "/dev/zero", "loop"]),
            min_size=1,
            max_size=8,
        ),
    ),
)


@FAST
@given(name=ODD_NAMES, disabled=st.booleans())
def test_any_include_name_renders_or_is_one_template_error(header_project, name, disabled):
    root, spec = header_project
    folder = root / "cuda"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    (folder / "h.cuh").write_text("// a header\n")
    (folder / "loop").symlink_to("loop")
    directive = f'#include "{name}"'
    (folder / "top.cuh").write_text(f"#if 0\n{directive}\n#endif\n" if disabled else f"// top\n{directive}\n")
    try:
        variant = render_default(spec)
    except TemplateError as exc:
        assert not disabled, exc  # a disabled include is never looked up
        assert_one_template_error(exc)
    else:
        assert "cuda/top.cuh" in dict(variant.headers)


HEADER_COUNT = 5
# How an edge's `#include` is written, and whether NVRTC reads it.
EDGE_FORMS = {
    "plain": ("{inc}", True),
    "if0": ("#if 0\n{inc}\n#endif", False),
    "else-of-if0": ("#if 0\n#else\n{inc}\n#endif", True),
    "nested-in-if0": ("#if 0\n#ifdef X\n#endif\n{inc}\n#endif", False),
    "else-of-if1": ("#if 1\n#else\n{inc}\n#endif", False),
    "ifdef": ("#ifdef X\n{inc}\n#endif", True),
    "comment": ("/* {inc} */", False),
}
HEADER_KIND = st.sampled_from(["file", "symlink", "absent"])
GRAPH = st.tuples(
    st.lists(st.tuples(HEADER_KIND, st.integers(0, HEADER_COUNT - 1)), min_size=HEADER_COUNT, max_size=HEADER_COUNT),
    st.lists(
        st.tuples(st.integers(0, HEADER_COUNT - 1), st.integers(0, HEADER_COUNT - 1), st.sampled_from(sorted(EDGE_FORMS))), max_size=12
    ),
)


def expected_reach(kinds, edges) -> set[str] | None:
    """The header names NVRTC reads from top.cuh's includes of h0, or None where one of them is
    missing or a symlink loop (an error)."""

    def target(i: int, seen=()) -> int | None:  # the file a name stands for, after symlinks
        kind, to = kinds[i]
        if kind == "absent" or i in seen:
            return None
        return i if kind == "file" else target(to, (*seen, i))

    reached, todo = set(), [0]
    while todo:
        i = todo.pop()
        if f"h{i}.cuh" in reached:
            continue
        file = target(i)
        if file is None:
            return None
        reached.add(f"h{i}.cuh")
        todo += [b for a, b, form in edges if a == file and EDGE_FORMS[form][1]]
    return reached


@FAST
@given(graph=GRAPH)
def test_any_header_graph_renders_what_it_reaches_or_is_one_template_error(header_project, graph):
    """Cycles, symlink chains and loops, dangling links, disabled and commented includes."""
    kinds, edges = graph
    root, spec = header_project
    folder = root / "cuda"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    (folder / "top.cuh").write_text('#include "h0.cuh"\n')
    for i, (kind, to) in enumerate(kinds):
        if kind == "file":
            body = [EDGE_FORMS[form][0].format(inc=f'#include "h{b}.cuh"') for a, b, form in edges if a == i]
            (folder / f"h{i}.cuh").write_text("\n".join([f"// h{i}", *body]) + "\n")
        elif kind == "symlink":
            (folder / f"h{i}.cuh").symlink_to(f"h{to}.cuh")
    expected = expected_reach(kinds, edges)
    try:
        variant = render_default(spec)
    except TemplateError as exc:
        assert_one_template_error(exc)
        assert expected is None, (exc, expected)
    else:
        assert expected is not None
        assert set(dict(variant.headers)) == {"cuda/top.cuh"} | expected


def test_the_property_strategies_reach_the_cases_they_are_for():
    """The graph oracle itself: a symlink loop and a disabled include are told apart."""
    assert expected_reach([("symlink", 1), ("symlink", 0)] + [("absent", 0)] * 3, []) is None
    assert expected_reach([("file", 0), ("absent", 0)] + [("absent", 0)] * 3, [(0, 1, "if0")]) == {"h0.cuh"}
    assert expected_reach([("file", 0), ("absent", 0)] + [("absent", 0)] * 3, [(0, 1, "else-of-if0")]) is None
