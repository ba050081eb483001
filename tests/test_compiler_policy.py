"""Compiler versions: the NVRTC version is recorded with each tuned entry and reported by the
build, but it is not part of the entry's checksum, so a lock tuned where NVRTC 13.0 was installed
still gives its winners on a builder that resolved another 13.x; `exact-nvrtc = true` makes such
entries stale instead (the build falls back to the defaults, `tune` re-tunes them).

"Another NVRTC" is made by tuning with `compile.nvrtc_version` patched (the compiles are real,
the stand-in worker's timings synthetic)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import build, load_project, write_tiny_project

import hatch_autotune.compile.nvrtc as compile_mod
from hatch_autotune import cli
from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.declare.config import ConfigError
from hatch_autotune.lock import LockFile, NvrtcPolicy
from hatch_autotune.tuning import tune
from hatch_autotune.tuning.worker_client import WorkerClient

FAKE = [sys.executable, str(Path(__file__).with_name("fake_worker.py"))]
SM90 = {"HATCH_AUTOTUNE_ARCHS": "sm_90"}  # the arch the stand-in worker "is": every entry tuned
NOW = compile_mod.nvrtc_version()
OLD = "13.0" if NOW != "13.0" else "13.1"  # the NVRTC the lock was "tuned with"


def tune_with(root: Path, tmp_path: Path, monkeypatch, nvrtc: str | None = None):
    """tune() on the stand-in worker, as if NVRTC `nvrtc` (default: the real one) were installed."""
    logs: list[str] = []
    with monkeypatch.context() as m:
        if nvrtc is not None:
            m.setattr(compile_mod, "nvrtc_version", lambda major=13: nvrtc)
        summary = tune(
            load_project(root, SM90),
            log=logs.append,
            gpu_arch="sm_90",
            client_factory=lambda device: WorkerClient(FAKE),
            cache=CompileCache(tmp_path / "cache"),
        )
    return summary, logs


def set_exact(root: Path, value: str) -> None:
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(
        text.replace('archs = ["sm_80", "sm_90"]\n', f'archs = ["sm_80", "sm_90"]\nexact-nvrtc = {value}\n')
    )


@pytest.fixture
def old_lock(tmp_path, monkeypatch) -> Path:
    """A tiny project whose lock file was tuned where NVRTC `OLD` was installed."""
    root = write_tiny_project(tmp_path / "p")
    summary, _ = tune_with(root, tmp_path, monkeypatch, nvrtc=OLD)
    assert len(summary.tuned) == 3
    entries = json.loads((root / "autotune.lock.json").read_text())["entries"]
    assert {e["provenance"]["nvrtc"] for e in entries.values()} == {OLD}
    assert {e["provenance"]["nvrtc_build"] for e in entries.values()} == {compile_mod.nvrtc_build()}
    return root


def test_a_lock_tuned_with_another_nvrtc_keeps_its_winners_with_one_warning(old_lock, tmp_path, monkeypatch):
    logs: list[str] = []
    result = build(old_lock, tmp_path / "cache", logs, env=SM90)
    choices = result.kernels[0].choices
    assert len(choices) == 3 and all(c.tuned for c in choices.values())
    assert all(c.provenance["nvrtc"] == OLD for c in choices.values())
    assert logs[0].endswith(
        f"(NVRTC {NOW}, build {compile_mod.nvrtc_build()}; binaries for CUDA 13 drivers and newer)"
    )  # what this build used
    assert f"hatch-autotune: 3 entries use tuned winners from autotune.lock.json, tuned with NVRTC {OLD}" in logs
    assert [m for m in logs if m.startswith("warning:")] == [
        f"warning: 3 lock entries were tuned with NVRTC {OLD} and this build uses NVRTC {NOW}: their winners are used "
        f"(exact-nvrtc = true re-tunes them instead; pin nvidia-cuda-nvrtc=={OLD}.* in build-system.requires for byte-identical binaries)"
    ]
    # and `tune` finds nothing to do: the entries are valid
    summary, _ = tune_with(old_lock, tmp_path, monkeypatch)
    assert summary.tuned == [] and summary.skipped == 3


def test_exact_nvrtc_makes_them_stale_and_tune_redoes_them(old_lock, tmp_path, monkeypatch):
    set_exact(old_lock, "true")
    logs: list[str] = []
    result = build(old_lock, tmp_path / "cache", logs, env=SM90)
    kb = result.kernels[0]
    reason = f"tuned with NVRTC {OLD}, this build uses {NOW} and exact-nvrtc = true"
    assert not any(c.tuned for c in kb.choices.values())
    assert {c.reason for c in kb.choices.values()} == {reason}
    assert [m for m in logs if m.startswith("warning:")] == [
        f"warning: scale: 3 untuned entries use the default config ({reason}): "
        "scale|-|sm_90|n=1024, scale|-|sm_90|n=65536, scale|-|sm_90|n=1048576"
    ]
    project = load_project(old_lock, SM90)
    lock = LockFile.load(project.lock_file)
    policy = NvrtcPolicy(NOW, exact=project.exact_nvrtc)
    assert all(lock.valid(eid, checksum, policy) is None for eid, checksum in kb.lock_ids.values())  # so tune redoes them

    summary, _ = tune_with(old_lock, tmp_path, monkeypatch)
    assert len(summary.tuned) == 3 and summary.skipped == 0
    assert all(c.tuned for c in build(old_lock, tmp_path / "cache", env=SM90).kernels[0].choices.values())


def test_the_checksum_does_not_depend_on_the_compiler_version(tiny, tmp_path, monkeypatch):
    now = build(tiny, tmp_path / "cache").kernels[0].lock_ids
    monkeypatch.setattr(compile_mod, "nvrtc_version", lambda major=13: OLD)
    assert build(tiny, tmp_path / "cache").kernels[0].lock_ids == now


def test_show_applies_the_builds_rule(old_lock, capsys):
    assert cli.main(["show", str(old_lock)]) == 0
    out = capsys.readouterr().out
    assert "3 tuned, 3 default" in out  # sm_90 tuned; sm_80 never was
    assert f"3 lock entries were tuned with NVRTC {OLD} and this build uses NVRTC {NOW}" in out
    set_exact(old_lock, "true")
    assert cli.main(["show", str(old_lock)]) == 0
    out = capsys.readouterr().out
    assert "0 tuned, 6 default" in out
    assert f"tuned with NVRTC {OLD}, this build uses {NOW} and exact-nvrtc = true" in out


def test_exact_nvrtc_must_be_a_boolean(tmp_path):
    root = write_tiny_project(tmp_path / "p", extra='exact-nvrtc = "yes"')
    with pytest.raises(ConfigError) as info:
        load_project(root)
    assert info.value.errors == [
        "tool.hatch.build.targets.wheel.hooks.autotune.exact-nvrtc: expected a boolean (true or false), got a string 'yes'"
    ]
    assert load_project(write_tiny_project(tmp_path / "q", extra="exact-nvrtc = true")).exact_nvrtc is True
    assert load_project(write_tiny_project(tmp_path / "r")).exact_nvrtc is False


def test_diff_reports_an_nvrtc_change_without_a_checksum_change(old_lock, tmp_path, capsys):
    data = json.loads((old_lock / "autotune.lock.json").read_text())
    for e in data["entries"].values():
        e["provenance"]["nvrtc"] = NOW
    (tmp_path / "new.json").write_text(json.dumps(data))
    assert cli.main(["diff", str(old_lock / "autotune.lock.json"), str(tmp_path / "new.json")]) == 0
    out = capsys.readouterr().out
    assert out.count(f"NVRTC {OLD} -> {NOW}") == 3 and "checksum" not in out
