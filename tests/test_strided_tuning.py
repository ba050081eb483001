"""Tuning follows the declared layout (issue #52), through the real worker process over the
driver stand-in (tests/standin_worker.py emulates `scale_rows`): an in-place kernel on an array
declared `strides = "any"` with `unit-stride-variants` is tuned per variant on inputs laid out as
that variant takes them (padded rows with a unit innermost stride; column-major), its
strides reaching it as computed scalars; each variant is verified against a NumPy reference and
wins its bucket. Timings are SYNTHETIC."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from conftest import tune_over_standin

from hatch_autotune.tuning.errors import TuningError

TEMPLATE = """\
__device__ const char emu_tag[] = "EMU:UNIT={{ x_unit_stride }};FACTOR={{ FACTOR }};BLOCK={{ BLOCK }}";
extern "C" __global__ void scale_rows(float* x, int rows, int cols, long long s0, long long s1)
{
    long long i = (long long)blockIdx.x * {{ BLOCK }} + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    long long r = i / cols, c = i % cols;
{% if x_unit_stride %}
    x[r * s0 + c] *= {{ FACTOR }}.0f;
{% else %}
    x[r * s0 + c * s1] *= {{ FACTOR }}.0f;
{% endif %}
}
"""

PYPROJECT = """\
[build-system]
requires = ["hatchling", "hatch-autotune"]
build-backend = "hatchling.build"

[project]
name = "rowpkg"
version = "0.1.0"

[tool.hatch.build.targets.wheel]
packages = ["rowpkg"]

[tool.hatch.build.targets.wheel.hooks.autotune]
module = "rowpkg.kernels"
archs = ["sm_90"]

[tool.hatch.build.targets.wheel.hooks.autotune.kernels.scale_rows]
template = "scale_rows.cu.j2"
reference = "rowpkg.ref:scale_rows"
args = [
  { name = "x", dtype = "float32", shape = ["rows", "cols"], intent = "inout", strides = "any", unit-stride-variants = true },
  { name = "rows", dtype = "int32", value = "rows" },
  { name = "cols", dtype = "int32", value = "cols" },
  { name = "s0", dtype = "int64", value = "x_stride0" },
  { name = "s1", dtype = "int64", value = "x_stride1" },
]
key = { rows = { buckets = [8] }, cols = { buckets = [48] } }
space = { BLOCK = [64, 128], FACTOR = [3] }
default = { BLOCK = 64, FACTOR = 3 }
grid = ["cdiv(rows * cols, BLOCK)"]
block = ["BLOCK"]
"""

REFERENCE = """\
def scale_rows(x):
    return {"x": x * 3.0}
"""


def write_project(root: Path) -> Path:
    """The project: its pyproject.toml, template and reference module."""
    (root / "rowpkg").mkdir(parents=True)
    (root / "rowpkg" / "__init__.py").write_text("")
    (root / "rowpkg" / "ref.py").write_text(REFERENCE)
    (root / "scale_rows.cu.j2").write_text(TEMPLATE)
    (root / "pyproject.toml").write_text(textwrap.dedent(PYPROJECT))
    return root


def test_each_unit_stride_variant_is_tuned_on_its_own_layout_and_verified(tmp_path):
    root = write_project(tmp_path / "p")
    logs: list[str] = []
    tune_over_standin(root, tmp_path / "cache", log=logs.append)
    lock = json.loads((root / "autotune.lock.json").read_text())
    entries = {eid: e for eid, e in lock["entries"].items() if eid.startswith("scale_rows|")}
    assert sorted(eid.split("|")[1] for eid in entries) == ["x_unit_stride=false", "x_unit_stride=true"], sorted(entries)
    for eid, entry in entries.items():
        assert entry["tuned"] is True, (eid, entry)
        assert "rowpkg.ref:scale_rows" in entry["provenance"]["reference"], entry["provenance"]
        statuses = {m["status"] for m in entry["measurements"]}
        assert statuses == {"ok"}, (eid, entry["measurements"])  # each variant right on its own layout


def test_the_unit_variant_on_a_non_unit_layout_is_wrong_and_rejected(tmp_path, monkeypatch):
    """The test above could pass with inputs that ignore the layout; this one gives the unit
    variant's bucket non-unit inputs (the other variant's layout) and sees it rejected."""
    from hatch_autotune.tuning import input_layout

    original = input_layout.tuning_layout
    monkeypatch.setattr(
        input_layout, "tuning_layout", lambda a, types: input_layout.NON_UNIT if a.unit_stride_variants else original(a, types)
    )
    import hatch_autotune.tuning.inputs as inputs

    monkeypatch.setattr(inputs, "tuning_layout", input_layout.tuning_layout)
    root = write_project(tmp_path / "p")
    logs: list[str] = []
    with pytest.raises(TuningError) as info:  # every config of the unit variant is wrong: its bucket has no winner
        tune_over_standin(root, tmp_path / "cache", log=logs.append)
    assert "x_unit_stride=true" in str(info.value) and re.search(r"wrong result: x: \d+ element\(s\) differ", str(info.value)), info.value
