"""Tuning on a real GPU (skipped without one): a bucket with a deliberately out-of-bounds
variant and a deliberately wrong one is tuned, those two are marked failed/rejected with
their reasons, and example_pkg tunes end to end into a lock file that a build then uses."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import EXAMPLE, build, load_project, write_tiny_project

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.plan.devices import detect_gpu_arch
from hatch_autotune.tuning import tune

GPU_ARCH = detect_gpu_arch()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPU_ARCH is None, reason="needs a CUDA GPU")]

BROKEN_TEMPLATE = """\
extern "C" __global__ void {{ entry }}(const float* __restrict__ x, float* __restrict__ y, int n)
{
    long long i = (long long)blockIdx.x * {{ BLOCK }} + threadIdx.x;
{% if MODE == "oob" %}
    if (i < n) y[i + (1LL << 40)] = x[i];   // far out of bounds: an illegal address
{% elif MODE == "wrong" %}
    if (i < n) y[i] = {{ FACTOR }}.0f * x[i] + 1.0f;  // fast and wrong
{% else %}
    if (i < n) y[i] = {{ FACTOR }}.0f * x[i];
{% endif %}
}
"""


def test_out_of_bounds_and_wrong_variants_are_rejected_and_the_rest_tuned(tmp_path):
    root = write_tiny_project(tmp_path / "p", template=BROKEN_TEMPLATE, extra=f'archs = ["{GPU_ARCH}"]')
    text = (root / "pyproject.toml").read_text()
    text = text.replace('archs = ["sm_80", "sm_90"]\n', "")
    text = text.replace("BAD = [false] }", 'MODE = ["ok", "oob", "wrong"] }').replace("BAD = false }", 'MODE = "ok" }')
    text = text.replace("FACTOR = [2, 3]", "FACTOR = [2]")  # FACTOR=3 would be "wrong" against the default's output
    (root / "pyproject.toml").write_text(text)
    logs: list[str] = []
    summary = tune(load_project(root), log=logs.append, gpu_arch=GPU_ARCH, cache=CompileCache(tmp_path / "cache"))
    assert len(summary.tuned) == 3
    for _eid, entry in summary.tuned:
        assert entry.config["MODE"] == "ok"
        for m in entry.measurements:
            if m.config["MODE"] == "oob":
                assert m.status == "failed" and "ILLEGAL_ADDRESS" in m.reason.upper().replace(" ", "_"), m
            elif m.config["MODE"] == "wrong":
                assert m.status == "rejected" and "wrong result" in m.reason, m
            else:
                assert m.status in ("ok", "eliminated"), m
    print("\n".join(logs))


def test_tune_example_pkg_end_to_end(tmp_path, session_cache):
    root = tmp_path / "example"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("dist", "kernels", "__pycache__", "autotune.lock.json"))
    project = load_project(root, env={"HATCH_AUTOTUNE_ARCHS": GPU_ARCH})
    logs: list[str] = []
    summary = tune(project, log=logs.append, gpu_arch=GPU_ARCH, cache=CompileCache(session_cache))
    lock = json.loads((root / "autotune.lock.json").read_text())
    assert len(lock["entries"]) == len(summary.tuned) == 2 * 3 + 6 + 18
    result = build(root, session_cache, env={"HATCH_AUTOTUNE_ARCHS": GPU_ARCH})
    assert all(c.tuned for kb in result.kernels for c in kb.choices.values())
    print("\n".join(logs[-40:]))
