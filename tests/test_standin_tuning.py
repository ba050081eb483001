"""The real tuning worker process, driven by the real `tune()`, over the driver stand-in with
emulated kernels (tests/standin_worker.py): an out-of-bounds variant ends failed with the
driver's illegal-address error, a wrong one is rejected by verification, a hanging one is killed
at its timeout, and the bucket still gets a verified winner in the lock file.

The worker's code runs unchanged: device setup, uploads and downloads, poisoned outputs, CUDA
event timing with the L2 flush, and its JSON protocol. Timings are SYNTHETIC (the emulator's)."""

from __future__ import annotations

import json

from conftest import tune_over_standin, write_tiny_project

EMULATED_TEMPLATE = """\
__device__ const char emu_tag[] = "EMU:MODE={{ MODE }};FACTOR={{ FACTOR }};BLOCK={{ BLOCK }}";
extern "C" __global__ void {{ entry }}(const float* __restrict__ x, float* __restrict__ y, int n)
{
    long long i = (long long)blockIdx.x * {{ BLOCK }} + threadIdx.x;
{% if MODE == "oob" %}
    if (i < n) y[i + (1LL << 40)] = x[i];
{% elif MODE == "wrong" %}
    if (i < n) y[i] = {{ FACTOR }}.0f * x[i] + 1.0f;
{% elif MODE == "hang" %}
    while (i < n) { }
{% elif MODE == "clobber" %}
    if (i < n) { y[i] = {{ FACTOR }}.0f * x[i]; ((float*)x)[i] = -1.0f; }
{% else %}
    if (i < n) y[i] = {{ FACTOR }}.0f * x[i];
{% endif %}
}
"""


def test_tune_through_the_real_worker_fails_rejects_kills_and_still_picks_a_verified_winner(tmp_path):
    root = write_tiny_project(tmp_path / "p", template=EMULATED_TEMPLATE, extra="tuning = { timeout-s = 4 }")
    text = (root / "pyproject.toml").read_text()
    text = text.replace("buckets = [1024, 65536, 1048576]", "buckets = [5000]")
    text = text.replace("FACTOR = [2, 3], BAD = [false] }", 'FACTOR = [2], MODE = ["ok", "oob", "wrong", "hang"] }')
    text = text.replace("BAD = false }", 'MODE = "ok" }')
    (root / "pyproject.toml").write_text(text)
    logs: list[str] = []
    summary = tune_over_standin(root, tmp_path / "cache", log=logs.append)
    assert len(summary.tuned) == 1
    eid, entry = summary.tuned[0]
    statuses = {(m.config["MODE"], m.config["BLOCK"]): m for m in entry.measurements}
    for block in (64, 128, 256):
        oob, wrong, hang, ok = (statuses[(mode, block)] for mode in ("oob", "wrong", "hang", "ok"))
        assert oob.status == "failed" and "CUDA_ERROR_ILLEGAL_ADDRESS" in oob.reason, oob
        assert wrong.status == "rejected" and "wrong result" in wrong.reason, wrong
        assert hang.status == "failed" and "timed out after 4 s" in hang.reason, hang
        assert ok.status in ("ok", "eliminated") and ok.samples >= 5, ok
    assert entry.config == {"BLOCK": 256, "FACTOR": 2, "MODE": "ok"}  # the fastest that verified
    lock = json.loads((root / "autotune.lock.json").read_text())
    assert lock["entries"][eid]["config"] == entry.config and lock["entries"][eid]["tuned"] is True
    assert lock["entries"][eid]["provenance"]["gpu"] == "Stand-in GPU 0 (sm_90)"
    tuned_line = next(line for line in logs if line.startswith("tuned "))
    assert "; worker inputs " in tuned_line and " run " in tuned_line and " verify " in tuned_line and " time " in tuned_line, tuned_line
    phases = lock["entries"][eid]["provenance"]["phases"]
    # a hang the cross-check ran into would add its 4 s timeout: below that, it was counted as measuring time (a
    # loaded 2-core machine takes up to ~2.5 s for the reference itself)
    assert phases["reference"] < 3.5, phases
    assert 0 <= phases["search"] <= phases["overhead"], phases  # the strategy's own time, a part of the fixed cost
    # what the run records beside the device: the run, the code that tuned, the settings, the search
    prov = lock["entries"][eid]["provenance"]
    assert prov["settings"]["timeout_s"] == 4 and prov["settings"]["runoff_rounds"] == 5, prov
    assert prov["code"].startswith("0.1.0 (git ") and " pid " in prov["run"] and prov["search"] == "strategy exhaustive", prov
    assert prov["driver_release"] == "unknown", prov  # the stand-in's host has no NVIDIA kernel module
    print("\n".join(logs))
    print(json.dumps([m.to_json() for m in entry.measurements], indent=None))


def test_every_variant_starts_from_the_bucket_inputs_even_after_one_overwrote_them(tmp_path):
    """The worker restores inputs from a pristine copy on the device before each variant: a
    variant that writes into its input (a bug the tuner must survive) is measured, and every
    correct variant after it still verifies against the reference."""
    root = write_tiny_project(tmp_path / "p", template=EMULATED_TEMPLATE)
    text = (root / "pyproject.toml").read_text()
    text = text.replace("buckets = [1024, 65536, 1048576]", "buckets = [5000]")
    text = text.replace("FACTOR = [2, 3], BAD = [false] }", 'FACTOR = [2], MODE = ["clobber", "ok"] }')
    text = text.replace("BAD = false }", 'MODE = "ok" }')
    (root / "pyproject.toml").write_text(text)
    summary = tune_over_standin(root, tmp_path / "cache")
    ((_eid, entry),) = summary.tuned
    order = [m.config["MODE"] for m in entry.measurements]
    assert "clobber" in order[: order.index("ok", order.index("clobber"))], order  # an ok variant runs after a clobbering one
    assert all(m.status in ("ok", "eliminated") for m in entry.measurements), entry.measurements
