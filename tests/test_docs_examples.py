"""The worked examples of docs/layouts.md and docs/launch.md are llm_kit's own declarations, which
CI builds (tests/test_headers.py, tests/test_llm_kit_launch.py): each TOML block of a kernel table
in those pages must equal that kernel's table in tests/consumers/llm_kit/pyproject.toml (its
one-line `doc` may be left out), so the pages cannot drift from what is built and tested."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("docs/layouts.md", "docs/launch.md")
HEADER = "[tool.hatch.build.targets.wheel.hooks.autotune.kernels."


def kernel_blocks(page: str) -> list[tuple[str, dict]]:
    """(kernel name, its table) of each ```toml block of `page` that declares one kernel."""
    text = (ROOT / page).read_text()
    out = []
    for block in re.findall(r"```toml\n(.*?)```", text, flags=re.S):
        if block.startswith(HEADER):
            name = block[len(HEADER) : block.index("]")]
            data = tomllib.loads(block)
            out.append((name, data["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["autotune"]["kernels"][name]))
    return out


def llm_kit_kernels() -> dict:
    data = tomllib.loads((ROOT / "tests" / "consumers" / "llm_kit" / "pyproject.toml").read_text())
    return data["tool"]["hatch"]["build"]["targets"]["wheel"]["hooks"]["autotune"]["kernels"]


@pytest.mark.parametrize("page", PAGES)
def test_each_worked_example_is_the_kernel_ci_builds(page):
    blocks = kernel_blocks(page)
    assert blocks, f"{page} has no kernel table"
    built = llm_kit_kernels()
    for name, table in blocks:
        assert name in built, f"{page}: kernel {name!r} is not in llm_kit"
        shown = {k: v for k, v in built[name].items() if k != "doc"}  # a page may leave out the one-line doc
        assert {k: v for k, v in table.items() if k != "doc"} == shown, f"{page}: the {name} table differs from llm_kit's"
