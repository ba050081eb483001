"""Rendering a template always ends: a bound on range() and on the source of one variant, each
a one-line TemplateError naming the template, the kernel and the bound; and an include that
leaves the template's folder says so.

Templates are the package author's trusted code (no sandbox), but a loop that never ends must
not hang a build. Each render that could hang runs in a child process with a timeout, so a
regression fails in seconds instead of hanging the test session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, SCALE_TEMPLATE, load_project, write_tiny_project

from hatch_autotune.compile.render import TemplateError, render_kernel

HANG_S = 30  # the bounded renders below take well under a second; a hang is a failure, not a wait

RENDER = """
import sys
from pathlib import Path
from conftest import load_project
from hatch_autotune.compile.render import TemplateError, render_kernel
try:
    variants = render_kernel(load_project(Path(sys.argv[1])).kernels["scale"])
except TemplateError as exc:
    print(exc)
    sys.exit(3)
print("rendered", sum(len(v.source) for vs in variants.values() for v in vs))
"""


def render_in_child(root: Path) -> str:
    """The one-line error of rendering the tiny project's kernel in a fresh process; fails the
    test (instead of hanging it) when rendering does not end within HANG_S."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", RENDER, str(root)], capture_output=True, text=True, timeout=HANG_S, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"rendering did not end within {HANG_S} s: no bound stopped it")
    assert proc.returncode == 3, f"expected a TemplateError, got exit {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    assert time.monotonic() - t0 < HANG_S
    return lines[0]


def with_body(body: str) -> str:
    """The tiny kernel's template with `body` on line 4 (inside the function)."""
    lines = SCALE_TEMPLATE.splitlines(keepends=True)
    return "".join([*lines[:3], body + "\n", *lines[3:]])


def test_a_huge_range_is_refused_at_once(tmp_path):
    root = write_tiny_project(tmp_path / "p", template=with_body("{% for i in range(10**10) %}x{% endfor %}"))
    msg = render_in_child(root)
    assert msg.startswith(f"{root / 'scale.cu.j2'}:4: "), msg
    assert "range()" in msg and "10000000000" in msg and "100000" in msg, msg
    assert "kernel scale" in msg and "BLOCK=64" in msg, msg


def test_nested_ranges_that_print_nothing_still_end(tmp_path):
    """Each range is small, the loops make 10**10 turns and no output: the budget counts every
    range() item a variant's rendering asks for, so this ends too."""
    body = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    root = write_tiny_project(tmp_path / "p", template=with_body(body))
    msg = render_in_child(root)
    assert msg.startswith(f"{root / 'scale.cu.j2'}:4: "), msg
    assert "range()" in msg and "100000" in msg and "kernel scale" in msg, msg


def test_a_variant_of_more_than_the_source_bound_is_refused(tmp_path):
    from hatch_autotune.compile.render import MAX_SOURCE_MIB

    chunks = MAX_SOURCE_MIB + 4  # of 1 MiB each: just past the bound, so that an unbounded render still ends
    body = f'{{% for i in range({chunks}) %}}{{{{ "x" * 1048576 }}}}{{% endfor %}}'
    root = write_tiny_project(tmp_path / "p", template=with_body(body))
    msg = render_in_child(root)
    assert msg.startswith(f"{root / 'scale.cu.j2'}: "), msg
    assert f"more than {MAX_SOURCE_MIB} MiB of source" in msg and "kernel scale" in msg and "BLOCK=64" in msg, msg


def test_loops_within_the_bound_render_as_before(tmp_path):
    """range() is Python's up to the bound, which is inclusive and counted per variant."""
    from hatch_autotune.compile.render import MAX_RANGE_ITEMS

    rest = MAX_RANGE_ITEMS - 3 - 3 - 5 - 3  # what the other range() calls take: all together, exactly the bound
    body = (
        "// {% for i in range(3) %}{{ i }}{% endfor %} {% for i in range(1, 9, 3) %}{{ i }}{% endfor %} {{ range(5)|length }}"
        f" {{% for i in range({rest}) %}}{{% endfor %}}{{{{ range(9, 0, -4)|list }}}}"
    )
    root = write_tiny_project(tmp_path / "p", template=with_body(body))
    variants = render_kernel(load_project(root).kernels["scale"])["-"]
    assert len(variants) == 6  # each variant has the whole budget
    assert all("// 012 147 5 [9, 5, 1]\n" in v.source for v in variants)
    assert "this_is_not_cuda" not in variants[0].source and "{{" not in variants[0].source


@pytest.mark.parametrize("name", ["../shared.cuh", "sub/../../shared.cuh"])
def test_an_include_outside_the_template_folder_says_why(tmp_path, name):
    (tmp_path / "shared.cuh").write_text("#define SHARED 1\n")  # exists, but outside the folder
    root = write_tiny_project(tmp_path / "p", template=with_body(f'{{% include "{name}" %}}'))
    with pytest.raises(TemplateError) as info:
        render_kernel(load_project(root).kernels["scale"])
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{root / 'scale.cu.j2'}:4: "), msg
    assert f"include {name!r}" in msg and "'..'" in msg and str(root) in msg and "kernel scale" in msg, msg


def test_a_missing_include_names_where_it_was_looked_for(tmp_path):
    root = write_tiny_project(tmp_path / "p", template=with_body('{% include "nope.cuh" %}'))
    with pytest.raises(TemplateError) as info:
        render_kernel(load_project(root).kernels["scale"])
    msg = str(info.value)
    assert msg.startswith(f"{root / 'scale.cu.j2'}:4: "), msg
    assert "include 'nope.cuh' not found in" in msg and str(root) in msg and "built-in templates" in msg, msg
