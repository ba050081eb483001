"""The one planner (plan/planner.py): what each mode compiles and ships, and the build, the tuner
and `hatch-autotune show` agreeing because they all ask it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import load_project, write_tiny_project

from hatch_autotune.compile import render
from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.lock import EntryId, LockEntry, LockFile, entry_checksum
from hatch_autotune.plan.planner import make_plan
from hatch_autotune.tuning import tune
from hatch_autotune.tuning.worker_client import WorkerClient
from hatch_autotune.wheel.assemble import build_payload

FAKE = [sys.executable, str(Path(__file__).with_name("fake_worker.py"))]
WINNER = {"BLOCK": 256, "FACTOR": 3, "BAD": False}
BROKEN = {"BLOCK": 64, "FACTOR": 3, "BAD": True}  # renders `this_is_not_cuda`: never compiles


def quiet(_: str) -> None:
    pass


@pytest.fixture
def project(tmp_path):
    return load_project(write_tiny_project(tmp_path / "p", bad="[false, true]"))


def lock_with(plan, configs: dict[str, dict]) -> LockFile:
    """A lock whose entry for each listed point (by id) names the given config, tuned."""
    lock = LockFile()
    for inst in plan.instances:
        for points in inst.points.values():
            for p in points:
                if p.eid in configs:
                    lock.entries[p.eid] = LockEntry(p.checksum, configs[p.eid], tuned=True)
    return lock


def test_the_plan_renders_once_and_names_every_point(project):
    plan = make_plan(project, project.archs, log=quiet, lock=LockFile())
    (inst,) = plan.instances
    assert len(inst.variants) == 12 and inst.configs[inst.default_index] == {"BLOCK": 128, "FACTOR": 2, "BAD": False}
    assert [str(p.id) for p in inst.points["sm_80"]] == ["scale|-|sm_80|n=1024", "scale|-|sm_80|n=65536", "scale|-|sm_80|n=1048576"]
    p = inst.points["sm_90"][1]
    assert p.key == (65536,) and p.id == EntryId.of("scale", "-", "sm_90", {"n": 65536})
    assert p.checksum == entry_checksum(inst.spec, "-", [v.source_hash for v in inst.variants], "sm_90", {"n": 65536})
    assert plan.ptx == {"sm_90": "compute_90"}


def test_a_build_ships_the_valid_winners_and_the_default(project):
    plan = make_plan(project, project.archs, log=quiet, lock=LockFile())
    (inst,) = plan.instances
    points = inst.points["sm_90"]
    plan.lock = lock_with(plan, {points[0].eid: WINNER, points[1].eid: {"BLOCK": 999, "FACTOR": 2, "BAD": False}})
    plan.lock.entries[points[2].eid] = LockEntry("stale", WINNER, tuned=True)
    winner = inst.configs.index(WINNER)
    assert plan.shipped(inst, "sm_90") == {inst.default_index, winner}  # not the config outside the space, nor the stale one
    assert plan.shipped(inst, "sm_80") == {inst.default_index}


def test_choose_takes_the_winner_else_the_default_else_the_first_that_compiled(project):
    plan = make_plan(project, project.archs, log=quiet, lock=LockFile())
    (inst,) = plan.instances
    p = inst.points["sm_90"][0]
    d, w, b = inst.default_index, inst.configs.index(WINNER), inst.configs.index(BROKEN)
    plan.lock = lock_with(plan, {p.eid: WINNER})
    assert plan.choose(inst, p, {d: True, w: True}).variant_index == w
    assert plan.choose(inst, p, {d: True, w: True}).tuned
    assert plan.choose(inst, p, {d: True}) is None  # the winner is not compiled yet: no answer
    fell = plan.choose(inst, p, {d: True, w: False})
    assert (fell.variant_index, fell.tuned, fell.status) == (d, False, "default")
    assert fell.reason == f"the lock's winner {inst.variants[w].label} failed to compile"
    plan.lock = lock_with(plan, {p.eid: {**WINNER, "BLOCK": 512}})  # a config the space no longer has
    assert plan.choose(inst, p, {d: True}).reason == "the lock's winner is no longer in the space"
    plan.lock = lock_with(plan, {p.eid: BROKEN})
    assert plan.choose(inst, p, {d: False, b: False}) is None  # the fallback needs the rest compiled
    everything = {i: not inst.configs[i]["BAD"] for i in range(len(inst.variants))}
    everything[d] = False
    first = min(i for i, ok in everything.items() if ok)
    fell = plan.choose(inst, p, everything)
    assert (fell.variant_index, fell.status) == (first, "fallback") and fell.fallback and not fell.tuned
    assert fell.reason.endswith("the default config does not compile, so the first config that does (default-may-fail = true)")
    assert plan.choose(inst, p, dict.fromkeys(everything, False)) is None


def test_the_default_failure_names_kernel_instance_arch_config_and_log(project):
    plan = make_plan(project, project.archs, log=quiet, lock=LockFile())
    (inst,) = plan.instances
    log = "\n".join(f"scale.cu({n}): error: number {n}" for n in range(40))
    message = plan.default_failure([(inst, "sm_80", log), (inst, "sm_90", log)])
    first, *rest = message.splitlines()
    assert first == (
        "hatch-autotune: the default config of kernel 'scale' (no type parameters or constants) does not compile for sm_80: "
        f"{inst.variants[inst.default_index].label}; NVRTC said:"
    )
    assert rest[0] == "  scale.cu(0): error: number 0" and "  scale.cu(11): error: number 11" in rest
    assert "scale.cu(12)" not in message and "  [...]" in rest  # the log's first lines only
    assert "The default config does not compile either for: scale (no type parameters or constants) on sm_90." in rest
    assert "`default-may-fail = true`" in rest[-1]


def test_to_tune_takes_what_a_build_could_not_use(project):
    plan = make_plan(project, project.archs, log=quiet, lock=LockFile())
    (inst,) = plan.instances
    valid = inst.points["sm_90"][0]
    plan.lock = lock_with(plan, {valid.eid: WINNER})
    todo, skipped = plan.to_tune(["sm_90"], "tune")
    assert skipped == 1 and [(a, [p.eid for p in ps]) for a, _, ps in todo] == [("sm_90", [p.eid for p in inst.points["sm_90"][1:]])]
    todo, skipped = plan.to_tune(["sm_90"], "retune")
    assert skipped == 0 and len(todo[0][2]) == 3
    assert make_plan(project, project.archs, log=quiet, lock=LockFile(), kernels=["other"]).instances == []
    plan.lock.entries[valid.eid] = LockEntry(valid.checksum, WINNER, tuned=False)  # an untuned entry is not a result
    assert plan.to_tune(["sm_90"], "tune")[1] == 0


def test_tuning_and_building_share_one_plan(project, tmp_path, monkeypatch):
    """The hook's pass: one plan, tuned, then built from the same plan, rendering nothing again."""
    cache = CompileCache(tmp_path / "cache")
    summary = tune(project, gpu_arch="sm_90", client_factory=lambda d: WorkerClient(FAKE), cache=cache, log=quiet)
    plan = summary.plan
    assert len(summary.tuned) == 3 and all(eid in plan.lock.entries for eid, _ in summary.tuned)
    assert plan.archs == project.archs  # planned for every target, tuned where a device is
    assert (
        tune(project, kernels=["scale"], gpu_arch="sm_90", client_factory=lambda d: WorkerClient(FAKE), cache=cache, log=quiet).plan is None
    )

    def no_rendering(*a, **k):
        raise AssertionError("the build rendered again")

    monkeypatch.setattr(render, "render_kernel", no_rendering)
    monkeypatch.setattr("hatch_autotune.plan.planner.render_kernel", no_rendering)
    logs: list[str] = []
    result = build_payload(project, cache=cache, log=logs.append, plan=plan)
    choices = result.kernels[0].choices
    assert all(c.tuned for (_, arch, _), c in choices.items() if arch == "sm_90")
    assert not any(c.tuned for (_, arch, _), c in choices.items() if arch == "sm_80")
    assert LockFile.load(project.lock_file).entries == plan.lock.entries  # what was built is what was saved


def test_show_agrees_with_the_build_when_a_winner_no_longer_compiles(project, tmp_path, monkeypatch):
    """`show` used to assume every variant compiled; it now asks the build's planner."""
    from hatch_autotune.inspection import readers

    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    plan = make_plan(project, project.archs, log=quiet, lock=LockFile())
    points = plan.instances[0].points["sm_90"]
    lock_with(plan, {points[0].eid: BROKEN, points[1].eid: WINNER}).save(project.lock_file)
    result = build_payload(project, cache=CompileCache(tmp_path / "cache"), log=quiet)
    built = {
        eid: result.kernels[0].variants["-"][result.kernels[0].choices[key].variant_index].config_dict
        for key, (eid, _) in result.kernels[0].lock_ids.items()
    }
    shown = readers.load_source(str(project.root)).rows
    assert {eid: row.config for eid, row in shown.items()} == built
    assert built[points[0].eid] == dict(project.kernels["scale"].default) and built[points[1].eid] == WINNER
    assert (
        shown[points[0].eid].note
        == f"the lock's winner {plan.instances[0].variants[plan.instances[0].configs.index(BROKEN)].label} failed to compile"
    )
    assert shown[points[0].eid].status == "default"


def test_show_without_archs_or_a_gpu_shows_the_archs_of_the_lock(tmp_path, monkeypatch):
    """A build here would stop for want of targets; `show` still shows what the lock holds."""
    from hatch_autotune.inspection import readers

    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("hatch_autotune.plan.devices.detect_gpus", lambda: [])
    root = write_tiny_project(tmp_path / "p")
    text = (root / "pyproject.toml").read_text().replace('archs = ["sm_80", "sm_90"]\n', "")
    (root / "pyproject.toml").write_text(text)
    empty = readers.load_source(str(root))
    assert empty.rows == {} and "no archs declared, no GPU here and none in the lock file: nothing to show" in empty.notes
    project = load_project(root)
    plan = make_plan(project, ["sm_90"], log=quiet, lock=LockFile())
    points = plan.instances[0].points["sm_90"]
    lock_with(plan, {points[0].eid: WINNER}).save(project.lock_file)
    shown = readers.load_source(str(root))
    assert sorted(shown.rows) == sorted(p.eid for p in points)
    assert shown.rows[points[0].eid].tuned and shown.rows[points[0].eid].config == WINNER
    assert "no archs declared and no GPU here: showing the archs of the lock file (sm_90)" in shown.notes
