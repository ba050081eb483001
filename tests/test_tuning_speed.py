"""Tuning without fixed costs per bucket, and a reference that is checked before it is trusted
(issue #34), through the real `tune()` and the real worker process over the driver stand-in
(tests/standin_worker.py; timings SYNTHETIC), or the fake worker where only the protocol's
order matters:

- one worker process for the whole run; each bucket's inputs made by the worker from a recipe
  (no array in a file or a message), the next bucket's made while the current one measures;
- verification on the device (the compare kernels, emulated by tests/standin_compare.py), and
  on the host where the device has no room for the reference;
- a wrong default caught by the reference's cross-check, and the lock saying what each entry
  was verified against and where the bucket's time went.

What is NOT shown here: any time on a GPU (the stand-in's clock is synthetic); the phase figures
below are the accounting, checked for consistency, not speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import tune_over_fake_worker, tune_over_standin, write_tiny_project
from test_standin_tuning import EMULATED_TEMPLATE

from hatch_autotune.tuning.bucket import COSTS
from hatch_autotune.tuning.errors import TuningError
from hatch_autotune.tuning.inputs import InputRecipe, bucket_inputs

HERE = Path(__file__).parent


def emulated_project(path: Path, modes: list[str], default_mode: str, factors=(2,), buckets=(5000,), blocks=(64, 128, 256)) -> Path:
    """The tiny project with the stand-in's emulated `scale` kernel: MODE ok writes y = F x,
    wrong writes F x + 1 (see tests/standin_worker.py)."""
    root = write_tiny_project(path, template=EMULATED_TEMPLATE, extra="tuning = { timeout-s = 4 }")
    text = (root / "pyproject.toml").read_text()
    text = text.replace("buckets = [1024, 65536, 1048576]", f"buckets = {list(buckets)}")
    text = text.replace("BLOCK = [64, 128, 256], ", f"BLOCK = {list(blocks)}, ")
    text = text.replace("FACTOR = [2, 3], BAD = [false] }", f"FACTOR = {list(factors)}, MODE = {json.dumps(modes)} }}")
    text = text.replace(
        "default = { BLOCK = 128, FACTOR = 2, BAD = false }",
        f'default = {{ BLOCK = {blocks[-1]}, FACTOR = {factors[0]}, MODE = "{default_mode}" }}',
    )
    (root / "pyproject.toml").write_text(text)
    return root


def lock_entries(root: Path) -> dict:
    return json.loads((root / "autotune.lock.json").read_text())["entries"]


# ---- the reference ----------------------------------------------------------------------

BUG_TEMPLATE = """\
__device__ const char emu_tag[] = "EMU:MODE={{ 'wrong' if BUG else 'ok' }};FACTOR={{ FACTOR }};BLOCK={{ BLOCK }}";
extern "C" __global__ void {{ entry }}(const float* __restrict__ x, float* __restrict__ y, int n)
{
    long long i = (long long)blockIdx.x * {{ BLOCK }} + threadIdx.x;
    if (i < n) y[i] = {{ FACTOR }}.0f * x[i]{{ ' + 1.0f' if BUG else '' }};
}
"""


def bug_project(path: Path, bug_block: int, default_block: int, default_bug: int) -> Path:
    """The emulated `scale` kernel with a BUG axis (y = 2x + 1 instead of 2x) allowed only at
    BLOCK = `bug_block`: BLOCK 64/128/256 with BUG 0, plus one buggy config."""
    root = emulated_project(path, ["ok"], "ok")
    (root / "scale.cu.j2").write_text(BUG_TEMPLATE)
    text = (root / "pyproject.toml").read_text()
    text = text.replace('MODE = ["ok"] }', f'BUG = [0, 1] }}\nconstraints = ["BUG * BLOCK == BUG * {bug_block}"]')
    text = text.replace('MODE = "ok" }', f"BUG = {default_bug} }}").replace("BLOCK = 256, FACTOR", f"BLOCK = {default_block}, FACTOR")
    (root / "pyproject.toml").write_text(text)
    return root


def test_a_wrong_default_is_outvoted_by_configs_that_agree_and_the_lock_says_so(tmp_path):
    """The default (BLOCK 256, BUG 1) writes 2x + 1; the three other configs write 2x. Before,
    the default's outputs were the reference unchecked: every correct config was rejected and
    the wrong default won."""
    root = bug_project(tmp_path / "p", bug_block=256, default_block=256, default_bug=1)
    logs: list[str] = []
    summary = tune_over_standin(root, tmp_path / "cache", log=logs.append)
    ((eid, entry),) = summary.tuned
    assert entry.config["BUG"] == 0, entry.config
    by = {(m.config["BLOCK"], m.config["BUG"]): m for m in entry.measurements}
    assert by[(256, 1)].status == "rejected" and "wrong result" in by[(256, 1)].reason, entry.measurements  # the default
    assert all(by[(b, 0)].status in ("ok", "eliminated") for b in (64, 128, 256)), entry.measurements
    reference = lock_entries(root)[eid]["provenance"]["reference"]
    assert reference.startswith("config ") and "(the default config disagreed with 3 configs)" in reference, reference
    assert any(
        line.startswith(f"warning: {eid}: the outputs of the default config") and "it is rejected as wrong" in line for line in logs
    ), logs


def test_a_right_default_is_kept_against_a_wrong_witness_and_checked_against_an_unlike_config(tmp_path):
    """The most unlike config (BLOCK 64, BUG 1) is wrong and disagrees; the next (unlike both)
    agrees with the default, which stays the reference; the buggy config is rejected."""
    root = bug_project(tmp_path / "p", bug_block=64, default_block=256, default_bug=0)
    summary = tune_over_standin(root, tmp_path / "cache")
    ((eid, entry),) = summary.tuned
    by = {(m.config["BLOCK"], m.config["BUG"]): m for m in entry.measurements}
    assert by[(64, 1)].status == "rejected", entry.measurements
    assert all(by[(b, 0)].status in ("ok", "eliminated") for b in (64, 128, 256)), entry.measurements
    reference = lock_entries(root)[eid]["provenance"]["reference"]
    index = {(m.config["BLOCK"], m.config["BUG"]): i for i, m in enumerate(entry.measurements)}
    assert (
        reference
        == f"the default config, cross-checked with config {index[(128, 0)]}; 1 other config(s) disagreed, first config {index[(64, 1)]}"
    ), reference


def test_configs_that_all_disagree_stop_the_bucket_and_say_to_declare_a_reference(tmp_path):
    root = emulated_project(tmp_path / "p", ["ok"], "ok", factors=(2, 3, 4), blocks=(256,))
    with pytest.raises(TuningError, match=r"all give different results .*declare a `reference` function for kernel 'scale'"):
        tune_over_standin(root, tmp_path / "cache")


def test_a_single_config_is_recorded_as_not_cross_checked(tmp_path):
    root = emulated_project(tmp_path / "p", ["ok"], "ok", blocks=(256,))
    summary = tune_over_standin(root, tmp_path / "cache")
    ((eid, _entry),) = summary.tuned
    assert lock_entries(root)[eid]["provenance"]["reference"] == "the default config, not cross-checked: no other config runs"


# ---- inputs, verification and where the time goes ------------------------------------------


def test_one_worker_makes_every_buckets_inputs_the_next_while_the_current_measures(tmp_path):
    """Three buckets, one worker process (one hello); each bucket after the first finds its
    inputs made (prepared in the background while the one before measured), and each entry's
    provenance accounts for the bucket's wall time."""
    root = emulated_project(tmp_path / "p", ["ok", "wrong"], "ok", buckets=(1000, 5000, 20000))
    ops = tmp_path / "ops.txt"
    summary = tune_over_standin(root, tmp_path / "cache", env={"STANDIN_OPS": str(ops)})
    assert len(summary.tuned) == 3
    seen = ops.read_text().split()
    assert seen.count("hello") == 1, seen  # the worker started once for the run
    assert seen.count("setup") == 3 and seen.count("prepare") == 2, seen
    assert seen.index("prepare") == seen.index("setup") + 1  # right after the first setup, before anything measures
    entries = lock_entries(root)
    made = []
    for eid, _ in summary.tuned:
        phases = entries[eid]["provenance"]["phases"]
        assert set(COSTS) <= set(phases) and all(phases[k] >= 0 for k in COSTS), phases
        assert abs(phases["overhead"] - (phases["wall"] - phases["compile_wait"] - phases["measure"])) < 1e-3, phases
        assert phases["setup"] + phases["reference"] <= phases["overhead"] + 1e-3, phases
        assert {"run", "verify", "time", "inputs", "upload"} <= set(phases), phases
        made.append("made" in phases)  # made at setup (not ahead)
    assert made == [True, False, False], made


def test_verification_falls_back_to_the_host_where_the_device_has_no_room_and_agrees(tmp_path):
    """The same bucket tuned twice: with room (the reference on the device, compared by the
    compare kernels, no output downloaded), and on a device too small for a copy of the output
    (the reference downloaded, every output compared on the host). The same configs are
    rejected for the same reasons either way."""
    verdicts, counts = [], []
    flush = 2 << 20  # the stand-in's L2 flush buffer (2 x its 1 MiB L2)
    for memory in (None, flush + 3 * 20000 + 10000):  # 5000 floats, 20 kB an array: x, its pristine copy and y fit, a reference does not
        root = bug_project(tmp_path / f"p{memory}", bug_block=64, default_block=256, default_bug=0)
        seen = tmp_path / f"counts{memory}.json"
        env = {"STANDIN_COUNT": str(seen), **({"STANDIN_MEMORY": str(memory)} if memory else {})}
        summary = tune_over_standin(root, tmp_path / f"cache{memory}", env=env)
        ((_eid, entry),) = summary.tuned
        verdicts.append({(m.config["BLOCK"], m.config["BUG"]): (m.status == "rejected", m.reason) for m in entry.measurements})
        counts.append(json.loads(seen.read_text()))
    assert verdicts[0] == verdicts[1], verdicts
    assert sum(rejected for rejected, _ in verdicts[0].values()) == 1, verdicts
    on_device, on_host = counts
    assert on_device["compare_launches"] >= 5 and on_device["output_downloads"] == 0, on_device  # every run verified, nothing came back
    assert on_host["compare_launches"] == 0 and on_host["output_downloads"] >= 5, (
        on_host
    )  # the reference and every variant's output came back


# ---- inputs are made where they are used ----------------------------------------------------


def test_the_recipe_makes_the_same_inputs_as_before_and_crosses_as_plain_json(tmp_path):
    from conftest import load_project as load

    root = write_tiny_project(tmp_path / "p")
    spec = load(root).kernels["scale"]
    recipe = InputRecipe.of(spec, {}, {"n": 1048576}, root, seed=11)
    wire = json.dumps(recipe.to_json())
    assert len(wire) < 2000  # a bucket of 1M elements: the message names how to make them, it does not carry them
    again = InputRecipe.from_json(json.loads(wire))
    assert again == recipe and again.identity() == recipe.identity()
    made, direct = again.make(), bucket_inputs(spec, {}, {"n": 1048576}, root, seed=11)
    assert set(made) == {"x", "y"} and all(np.array_equal(made[k], direct[k]) for k in made)
    assert recipe.nbytes() == 2 * 1048576 * 4


def test_a_broken_generator_is_the_builds_error_even_though_the_worker_runs_it(tmp_path):
    """The user's generator runs in the worker now; its error still stops the run with the
    kernel's message (a Failure of kind "input"), not as a failed variant."""
    root = write_tiny_project(tmp_path / "p")
    (root / "gen.py").write_text("def make(key, types, rng):\n    raise RuntimeError('no data for this bucket')\n")
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(text + 'inputs = "gen:make"\n')
    with pytest.raises(Exception, match=r"kernel 'scale': inputs = 'gen:make' \(n=\d+\): raised RuntimeError: no data for this bucket"):
        tune_over_fake_worker(root, tmp_path / "cache")
