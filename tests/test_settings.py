"""The environment's settings (declare/settings.py): every HATCH_AUTOTUNE_* variable read in one
place, each bad value one problem that names its variable, all of them reported together."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import hook_table, write_tiny_project

from hatch_autotune.declare.config import ConfigError, parse_project
from hatch_autotune.declare.settings import SettingsError, read_cache_settings, read_jobs, read_settings
from hatch_autotune.tuning.engine import cluster_address

PACKAGE = Path(__file__).resolve().parents[1] / "hatch_autotune"

EVERY_VARIABLE = {
    "HATCH_AUTOTUNE_MODE": "offline",
    "HATCH_AUTOTUNE_ARCHS": "sm_80, sm_90",
    "HATCH_AUTOTUNE_JOBS": "3",
    "HATCH_AUTOTUNE_RAY": "127.0.0.1:6379",
    "HATCH_AUTOTUNE_DEBUG": "1",
    "HATCH_AUTOTUNE_CACHE_DIR": "/tmp/hatch-autotune-cache",
    "HATCH_AUTOTUNE_CACHE_URL": "redis://127.0.0.1:6379/0",
    "HATCH_AUTOTUNE_CACHE_TIMEOUT": "0.5",
    "HATCH_AUTOTUNE_CACHE_MAX_BYTES": "10",
    "HATCH_AUTOTUNE_CACHE_TTL": "0",
}


def test_every_variable_reaches_its_field():
    s = read_settings(EVERY_VARIABLE)
    assert (s.mode, s.archs, s.jobs, s.ray_address, s.debug) == ("offline", ("sm_80", "sm_90"), 3, "127.0.0.1:6379", True)
    c = s.cache
    assert (str(c.dir), c.url, c.timeout_s, c.max_bytes, c.ttl_s) == ("/tmp/hatch-autotune-cache", "redis://127.0.0.1:6379/0", 0.5, 10, 0)


def test_unset_or_empty_variables_take_the_defaults():
    assert read_settings({}) == read_settings({name: "" for name in EVERY_VARIABLE})
    assert read_settings({}).cache.url is None and read_jobs({}) >= 1


def test_every_bad_variable_is_reported_at_once_by_name():
    bad = {"HATCH_AUTOTUNE_JOBS": "0", "HATCH_AUTOTUNE_CACHE_TIMEOUT": "nan", "HATCH_AUTOTUNE_CACHE_TTL": "-1"}
    with pytest.raises(SettingsError) as info:
        read_settings(bad)
    assert [p.split("=")[0] for p in info.value.problems] == [
        "HATCH_AUTOTUNE_JOBS",
        "HATCH_AUTOTUNE_CACHE_TIMEOUT",
        "HATCH_AUTOTUNE_CACHE_TTL",
    ]
    assert "expected a number of seconds > 0" in str(info.value)


def test_the_cache_settings_are_checked_without_a_cache_url():
    """A bad timeout is an error even before a URL turns the shared tier on."""
    with pytest.raises(SettingsError, match=r"HATCH_AUTOTUNE_CACHE_MAX_BYTES='-5': expected a whole number of bytes > 0"):
        read_cache_settings({"HATCH_AUTOTUNE_CACHE_MAX_BYTES": "-5"})


def test_problems_go_to_a_callers_list_and_the_field_keeps_its_default():
    problems: list[str] = []
    s = read_settings({"HATCH_AUTOTUNE_MODE": "sometimes", "HATCH_AUTOTUNE_JOBS": "many"}, problems)
    assert s.mode is None and s.jobs == read_jobs({})
    assert len(problems) == 2 and "HATCH_AUTOTUNE_MODE" in problems[0] and "HATCH_AUTOTUNE_JOBS='many'" in problems[1]


def test_a_bad_archs_variable_does_not_hide_the_tables_own_errors(tmp_path):
    root = write_tiny_project(tmp_path / "p")
    table = hook_table(root)
    table["archs"] = ["sm_90", "sm_90"]
    with pytest.raises(ConfigError) as info:
        parse_project(table, root, env={"HATCH_AUTOTUNE_ARCHS": "sm_1"})
    text = "\n".join(info.value.errors)
    assert "HATCH_AUTOTUNE_ARCHS" in text and "expected distinct archs" in text


def test_the_command_line_cluster_wins_over_the_variable(tmp_path):
    root = write_tiny_project(tmp_path / "p")
    table = hook_table(root)
    project = parse_project(table, root, env={"HATCH_AUTOTUNE_RAY": "127.0.0.1:6379"})
    assert cluster_address(project) == "127.0.0.1:6379"
    assert cluster_address(project, "127.0.0.1:7000") == "127.0.0.1:7000"
    assert cluster_address(parse_project(table, root, env={})) is None


def test_only_the_settings_module_reads_the_variables():
    """No module looks a HATCH_AUTOTUNE_* name up (x[...], x.get(...), getenv(...)), written out or
    through a module constant: declare/settings.py reads them all, by its fields' names."""
    readers = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {
            target.id: node.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            key = None
            if isinstance(node, ast.Subscript):
                key = node.slice
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "getenv", "pop", "setdefault")
            ):
                key = node.args[0] if node.args else None
            if isinstance(key, ast.Name):
                key = constants.get(key.id)
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.startswith("HATCH_AUTOTUNE_"):
                readers.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {key.value}")
    assert readers == [], readers
