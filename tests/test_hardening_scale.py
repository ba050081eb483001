"""Hardening round 2 (#33), the scale items: the total work of a kernel and of a tuning run is
bounded before anything is compiled, the space is walked in bounded memory whatever
`max-configs` allows (#1), and a lock entry's provenance cannot bloat the wheel (#17)."""

from __future__ import annotations

import copy
import json
import resource
import tracemalloc
from pathlib import Path

import pytest
from conftest import SCALE_TEMPLATE, build, hook_table, in_forked_child, load_project, write_tiny_project

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.declare.config import ConfigError, parse_project
from hatch_autotune.errors import BuildError
from hatch_autotune.lock import LockEntry, LockFile, Measurement
from hatch_autotune.plan import planner
from hatch_autotune.plan.planner import make_plan
from hatch_autotune.runtime import TableEntry, table_bytes

P = "tool.hatch.build.targets.wheel.hooks.autotune"
K = f"{P}.kernels.scale"
BOUND_S = 60.0  # far above what a refused config takes (well under a second); the old walk ran for minutes
MEMORY_BOUND = 1 << 30  # bytes the config check may allocate (traced); the old walk of 68M configs took 19 GB
ADDRESS_SPACE = 4 << 30  # more than the child's own, a guard so that a regression cannot take the machine


def quiet(_: str) -> None:
    pass


def _check_in_child(root, table, queue):
    """parse_project in a forked child, its address space capped, its allocations traced."""
    with open("/proc/self/status") as f:
        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + ADDRESS_SPACE, vm + ADDRESS_SPACE))
    tracemalloc.start()
    try:
        parse_project(table, root, env={})
        result = ("ok", [])
    except ConfigError as exc:
        result = ("errors", exc.errors)
    except BaseException as exc:  # a MemoryError or a traceback is a defect: report it, do not hang the parent
        result = ("raised", [f"{type(exc).__name__}: {str(exc)[:500]}"])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    queue.put((*result, peak))


def checked(root, table) -> tuple[str, list[str], int]:
    """(outcome, errors, peak bytes traced) of the config check, from a forked child killed
    after BOUND_S: a case that walks for minutes fails here instead of hanging the suite."""
    kind, errors, peak = in_forked_child(_check_in_child, (root, table), BOUND_S, "the config check")
    assert kind != "raised", errors
    return kind, errors, peak


@pytest.fixture
def project(tmp_path):
    root = write_tiny_project(tmp_path / "p")
    return root, hook_table(root)


# --- #1: the total work is bounded, the walk streams ------------------------------------------


def test_configs_times_instances_is_refused_at_once_with_the_count(project):
    """100,000 configs (the default max-configs) x 1,000 instances (the most allowed) passed
    both limits and walked 100 million configs; the product is what max-configs bounds."""
    root, table = project
    kernel = table["kernels"]["scale"]
    kernel["space"] = {"BLOCK": [64, 128, 256, 512], "FACTOR": list(range(2, 252)), "W": list(range(100))}
    kernel["default"] = {"BLOCK": 128, "FACTOR": 2, "W": 0}
    kernel["constants"] = {"R": list(range(1000))}
    _kind, errors, _ = checked(root, table)
    expected = (
        f"{K}.space: 100,000 configs (4 BLOCK x 250 FACTOR x 100 W) before constraints x 1,000 instances (1,000 R) "
        "= 100,000,000, more than the 1,000,000 a kernel may walk over its instances (`max-configs` or 1,000,000, the larger)"
    )
    assert any(e.startswith(expected) for e in errors), errors
    assert any("Shrink the axes, the type parameters or the constants, or raise `max-configs`" in e for e in errors), errors


def test_max_configs_bounds_one_instance_and_the_walk_bounds_their_product(project, monkeypatch):
    """`max-configs` keeps its meaning (one instance's space: 114 configs x 2 dtypes passes a
    max-configs of 114); the product of all instances is bounded by the larger of it and
    MAX_WALKED (lowered here to keep the test small; the child is forked with it)."""
    from hatch_autotune.declare import space

    root, table = project
    kernel = table["kernels"]["scale"]
    kernel["space"]["W"] = list(range(1, 20))  # 3 x 2 x 1 x 19 = 114 configs
    kernel["default"]["W"] = 1
    kernel["types"] = {"T": ["float32", "float16"]}
    kernel["max-configs"] = 113
    assert any(
        e.startswith(f"{K}.space: 114 configs (3 BLOCK x 2 FACTOR x 1 BAD x 19 W) before constraints, more than `max-configs` (113)")
        for e in checked(root, table)[1]
    )
    kernel["max-configs"] = 114
    assert checked(root, table)[0] == "ok"
    monkeypatch.setattr(space, "MAX_WALKED", 200)
    assert any(
        f"{K}.space: 114 configs" in e and "x 2 instances (2 T) = 228, more than the 200 a kernel may walk" in e
        for e in checked(root, table)[1]
    )
    kernel["max-configs"] = 228  # a raised max-configs raises the walk too
    assert checked(root, table)[0] == "ok"


def _huge_space(kernel):
    """68,343,750 configs before constraints (the issue's space), every one kept."""
    for i in range(6):
        kernel["space"][f"A{i}"] = list(range(1, 16))
        kernel["default"][f"A{i}"] = 1
    kernel["max-configs"] = 1_000_000_000


def test_a_raised_max_configs_walks_a_huge_space_in_bounded_memory(project):
    """max-configs = 1e9 over 68M configs that the constraints all keep reached 19 GB in 90 s:
    the walk keeps at most MAX_VARIANTS and says so, in bounded memory and time."""
    root, table = project
    _huge_space(table["kernels"]["scale"])
    kind, errors, peak = checked(root, table)
    assert kind == "errors" and peak < MEMORY_BOUND
    from hatch_autotune.declare.space import MAX_VARIANTS

    assert any(e.startswith(f"{K}.constraints: the constraints keep more than {MAX_VARIANTS:,} configs") for e in errors), errors


def test_a_raised_max_configs_walks_a_huge_space_the_constraints_cut_down(project):
    """The same walk over a space the constraints cut to a few configs proceeds, and keeps only those."""
    root, table = project
    kernel = table["kernels"]["scale"]
    for i in range(4):
        kernel["space"][f"A{i}"] = list(range(1, 13))  # 6 x 12**4 = 124,416 configs before constraints
        kernel["default"][f"A{i}"] = 1
    kernel["constraints"] = ["A0 + A1 + A2 + A3 == 4"]
    assert any("124,416 configs" in e for e in checked(root, table)[1])  # over the default max-configs
    kernel["max-configs"] = 1_000_000_000
    kind, errors, peak = checked(root, table)
    assert kind == "ok", errors
    assert peak < MEMORY_BOUND
    assert len(parse_project(copy.deepcopy(table), root, env={}).kernels["scale"].configs({})) == 6


def test_the_walk_streams_and_a_list_of_configs_is_bounded():
    from hatch_autotune.declare.space import SpaceTooLarge, enumerate_configs, iter_configs

    space = {f"A{i}": list(range(10)) for i in range(9)}  # a billion configs: only a stream can start on it
    walk = iter_configs(space, [])
    assert next(walk) == dict.fromkeys(space, 0) and next(walk) == {**dict.fromkeys(space, 0), "A8": 1}
    with pytest.raises(SpaceTooLarge, match="more than 1,000 configs"):
        enumerate_configs(space, [], limit=1000)
    small = {f"A{i}": list(range(10)) for i in range(4)}
    assert len(enumerate_configs(small, [lambda env: env["A0"] + env["A1"] == 0], limit=100)) == 100


def test_a_tuning_run_too_big_is_refused_before_any_compile_or_worker(tmp_path, monkeypatch):
    """configs x buckets x archs x instances: what a tuning run measures, counted before any
    compile; the error names the count, the factors, the limit and how to lower it."""
    from hatch_autotune.tuning import tune

    monkeypatch.setattr(planner, "MAX_TUNING_RUNS", 40)
    root = write_tiny_project(
        tmp_path / "p", extra='[tool.hatch.build.targets.wheel.hooks.autotune.kernels.scale.types]\nT = ["float32", "float16"]'
    )
    project = load_project(root)
    plan = make_plan(project, project.archs, log=quiet, lock=LockFile())
    with pytest.raises(BuildError) as info:
        plan.to_tune(["sm_80", "sm_90"], "tune")
    message = str(info.value)
    assert message.startswith(
        "hatch-autotune: this tuning run would measure 72 configs, more than the 40 one run may (each up to `budget-ms` of GPU time); "
        "kernel 'scale' alone: 72 (6 configs per bucket x 3 buckets x 2 arch(s) x 2 instance(s))."
    ), message
    assert 'search = { budget = "5%" }' in message and "--kernel NAME" in message
    assert len(plan.to_tune(["sm_90"], "tune")[0]) == 2  # 36: within

    def no_worker(device):
        raise AssertionError("a worker was started")

    cache = tmp_path / "cache"
    with pytest.raises(BuildError, match="would measure 36 configs"):
        monkeypatch.setattr(planner, "MAX_TUNING_RUNS", 10)
        tune(project, gpu_arch="sm_90", log=quiet, cache=CompileCache(cache), client_factory=no_worker)
    assert not cache.exists() or not any(p.is_file() for p in cache.rglob("*"))  # nothing compiled


def test_a_search_budget_lowers_the_tuning_run(tmp_path, monkeypatch):
    monkeypatch.setattr(planner, "MAX_TUNING_RUNS", 10)
    root = write_tiny_project(tmp_path / "p")
    path = root / "pyproject.toml"
    path.write_text(path.read_text().replace('block = ["BLOCK"]', 'block = ["BLOCK"]\nsearch = { budget = 1 }'))
    project = load_project(root)
    plan = make_plan(project, project.archs, log=quiet, lock=LockFile())
    assert len(plan.to_tune(["sm_80", "sm_90"], "tune")[0]) == 2  # 1 config x 3 buckets x 2 archs


def test_rendering_a_big_kernel_says_so(project, monkeypatch):
    monkeypatch.setattr(planner, "RENDER_NOTICE_AT", 6)
    root, _ = project
    logs: list[str] = []
    make_plan(load_project(root), ["sm_90"], log=logs.append, lock=LockFile())
    assert logs[0] == "hatch-autotune: rendering kernel 'scale': 6 configs before constraints, over its type instances"
    assert logs[1].startswith("hatch-autotune: rendered kernel 'scale': 6 variants in ")
    monkeypatch.setattr(planner, "RENDER_NOTICE_AT", 7)
    logs.clear()
    make_plan(load_project(root), ["sm_90"], log=logs.append, lock=LockFile())
    assert logs == []


def test_the_lock_winner_is_found_by_its_config_as_before(project):
    root, _ = project
    plan = make_plan(load_project(root), ["sm_90"], log=quiet, lock=LockFile())
    (inst,) = plan.instances
    assert inst.configs is inst.configs  # made once
    for i, c in enumerate(inst.configs):
        assert inst.index_of(c) == i == inst.configs.index(c)
        assert inst.index_of(dict(reversed(list(c.items())))) == i  # a lock's keys may come in any order
    assert inst.index_of({"BLOCK": 128, "FACTOR": 2, "BAD": 0}) == inst.configs.index({"BLOCK": 128, "FACTOR": 2, "BAD": 0})
    assert inst.index_of({"BLOCK": [128], "FACTOR": 2, "BAD": False}) is None
    assert inst.index_of({"BLOCK": 999, "FACTOR": 2, "BAD": False}) is None


# --- #17: the provenance a wheel copies from the lock is bounded -----------------------------


def test_the_tuner_writes_only_the_provenance_the_wheel_copies():
    from hatch_autotune.tuning.bucket import provenance
    from hatch_autotune.tuning.protocol import DeviceInfo

    info = DeviceInfo(name="GPU", cc=(9, 0), driver="13.0", limits=None)  # the provenance reads no limit
    assert set(provenance(info, "13.0")) <= set(planner.PROVENANCE_FIELDS)


def test_example_pkg_provenance_is_copied_whole():
    """The example's lock holds what the tuner writes: the table keeps it unchanged but for the
    tuner's own bookkeeping (where the time went), without a warning, so its wheel stays byte-identical."""
    lock = LockFile.load(Path(__file__).parents[1] / "example_pkg" / "autotune.lock.json")
    for entry in lock.entries.values():
        kept = {k: v for k, v in entry.provenance.items() if k not in planner.LOCK_ONLY_PROVENANCE}
        assert planner.shipped_provenance(entry.provenance) == (kept, []) and "gpu" in kept


def test_a_huge_provenance_in_the_lock_does_not_bloat_the_wheel(tmp_path, session_cache):
    from hatch_autotune.wheel.table import build_table

    root = write_tiny_project(tmp_path / "p", template=SCALE_TEMPLATE)
    first = build(root, session_cache)
    winner = {"BLOCK": 256, "FACTOR": 3, "BAD": False}
    honest = {"gpu": "NVIDIA H200", "cc": "9.0", "nvrtc": first.compiler}
    lock = LockFile()
    for _key, (eid, checksum) in first.kernels[0].lock_ids.items():
        provenance = {**honest, "notes": "x" * 5_000_000, "driver": "d" * 100_000, "date": 7, "median_ms": "0.001"}
        measured = (Measurement.from_json({"config": winner, "median_ms": 0.01, "status": "ok"}),)
        lock.entries[eid] = LockEntry(checksum=checksum, config=winner, tuned=True, measurements=measured, provenance=provenance)
    lock.save(root / "autotune.lock.json")
    logs: list[str] = []
    result = build(root, session_cache, logs)
    table, _ = build_table(load_project(root), result)
    data = table_bytes(table)
    assert len(data) < 100_000  # each entry's provenance was over 5 MB
    for rows in table["kernels"]["scale"]["select"].values():
        for row in (r for by_arch in rows.values() for r in by_arch):
            entry = TableEntry.from_json(json.loads(json.dumps(row)))
            assert entry.tuned and entry.provenance == honest and entry.median_ms == 0.01
    n = len(lock.entries)
    warning = next(line for line in logs if "provenance" in line)
    assert warning.startswith(f"warning: {n} tuned entries of autotune.lock.json carry provenance that the wheel leaves out (e.g. scale|")
    assert ": date (not a string), driver (100,000 characters), field 'median_ms' and 1 more); it copies only gpu, cc," in warning
    assert len(warning) < 1000


def test_a_walk_past_the_default_bound_says_so_while_it_runs(project, monkeypatch, capsys):
    """A raised max-configs can make the config check walk for minutes: it says so on stderr
    before and after (MAX_WALKED is lowered here so that a tiny space is such a walk)."""
    from hatch_autotune.declare import space

    root, table = project
    kernel = table["kernels"]["scale"]
    kernel["space"]["W"] = list(range(1, 20))  # 114 configs
    kernel["default"]["W"] = 1
    kernel["types"] = {"T": ["float32", "float16"]}
    kernel["max-configs"] = 1000
    parse_project(table, root, env={})
    assert capsys.readouterr().err == ""  # within the default bound: quiet
    monkeypatch.setattr(space, "MAX_WALKED", 100)
    parse_project(table, root, env={})
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "hatch-autotune: checking kernel 'scale': 228 configs over its 2 instance(s), at a few µs each", err
    assert err[1].startswith("hatch-autotune: checked kernel 'scale': 228 configs kept of 228 in "), err
