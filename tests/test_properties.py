"""Property-based tests (Hypothesis) of what reads untrusted text: the expression language, the
config table and lock files. Random and mutated inputs never raise anything but the project's
own error types, stay within a time bound (Hypothesis' deadline), and never change a valid
lock entry. The cache entry has its own in tests/test_damage.py."""

from __future__ import annotations

import copy
import json
import math
import os
import re

import pytest
from conftest import hook_table, write_tiny_project
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_formats import ENTRY

from hatch_autotune.declare.config import ConfigError, parse_project
from hatch_autotune.declare.expr import ExprSyntaxError, parse
from hatch_autotune.lock import LockFile, LockFormatError
from hatch_autotune.runtime import ExpressionError, compile_expr

# HATCH_AUTOTUNE_EXAMPLES=5000 for a longer hunt (CI keeps the default)
EXAMPLES = int(os.environ.get("HATCH_AUTOTUNE_EXAMPLES", "300"))
FAST = settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# ---- the expression language -----------------------------------------------------------------

NAMES = ["n", "BLOCK", "S", "FLAG", "T_size"]
TOKENS = [
    *NAMES, "0", "1", "2", "9", "10", "1024", "2.5", "1e308", "-", "+", "*", "/", "//", "%", "**", "(", ")", " ", ",",
    "<", "<=", "==", "!=", ">", " and ", " or ", "not ", " if ", " else ", "cdiv(", "min(", "max(", "True",
    "'x'", "[", "]", "lambda", ".", "__class__", "\n", "x" * 50,
]  # fmt: skip
ENV = st.fixed_dictionaries(
    {
        "n": st.integers(min_value=-(2**70), max_value=2**70),
        "BLOCK": st.integers(min_value=0, max_value=1024),
        "S": st.text(max_size=8),  # a string axis
        "FLAG": st.booleans(),
        "T_size": st.sampled_from([1, 2, 4, 8]),
    }
)


@FAST
@given(text=st.lists(st.sampled_from(TOKENS), max_size=40).map("".join), env=ENV)
def test_any_expression_text_parses_or_is_refused_and_evaluates_or_is_refused(text, env):
    try:
        e = parse(text)
    except ExprSyntaxError as exc:
        assert str(exc) and len(str(exc)) < 2000
        return
    try:
        value = e(env)
    except ExpressionError as exc:
        assert str(exc) and len(str(exc)) < 2000
        return
    assert isinstance(value, (bool, int, float, str))
    if isinstance(value, int):
        assert value.bit_length() <= 1024
    assert compile_expr(json.loads(json.dumps(e.tree)))(env) == value or (isinstance(value, float) and math.isnan(value))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=30,
)
TREE = st.recursive(
    st.integers(min_value=-(2**40), max_value=2**40) | st.sampled_from([["n", name] for name in NAMES]) | JSON,
    lambda inner: st.tuples(
        st.sampled_from(["+", "-", "*", "/", "//", "%", "**", "neg", "not", "and", "or", "cmp", "if", "call", "n", "cdiv", "min"]),
        st.lists(inner | st.sampled_from(["min", "cdiv", "max", "<", "=="]), max_size=4),
    ).map(lambda t: [t[0], *t[1]]),
    max_leaves=40,
)


@FAST
@given(tree=TREE, env=ENV)
def test_any_tree_from_a_table_compiles_or_is_refused_and_evaluates_within_bounds(tree, env):
    """What a wheel's table.json may hold: a corrupt or foreign tree never escapes as anything
    but ExpressionError, when compiled or when evaluated."""
    try:
        fn = compile_expr(tree)
    except ExpressionError:
        return
    try:
        value = fn(env)
    except ExpressionError:
        return
    if isinstance(value, int):
        assert value.bit_length() <= 1024


# ---- the config table ------------------------------------------------------------------------

TOML_VALUE = st.recursive(
    st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["9**9**9", "n\n", "../x", "sm_90\n", "S * 10**10", ""]),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner, max_size=5),
    max_leaves=20,
)


def _paths(node, prefix=()):
    """Every (path) into a decoded TOML table, containers included."""
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


@pytest.fixture(scope="module")
def tiny_table(tmp_path_factory):
    root = write_tiny_project(tmp_path_factory.mktemp("props") / "p")
    return root, hook_table(root)


@FAST
@given(data=st.data())
def test_a_mutated_config_table_is_accepted_or_refused_with_config_errors(tiny_table, data):
    root, table = tiny_table
    table = copy.deepcopy(table)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3))):
        paths = [p for p in _paths(table) if p]
        path = data.draw(st.sampled_from(paths))
        node = table
        for part in path[:-1]:
            node = node[part]
        if data.draw(st.booleans()) and isinstance(node, dict):
            del node[path[-1]]
        else:
            node[path[-1]] = data.draw(TOML_VALUE)
    try:
        parse_project(table, root, env={})
    except ConfigError as exc:
        assert exc.errors and all(isinstance(e, str) and len(e) < 2000 for e in exc.errors)


# ---- lock files ------------------------------------------------------------------------------

IDS = [f"scale|-|sm_90|n={n}" for n in (1024, 65536, 1048576)]
VALID_LOCK = {"schema": 1, "entries": {eid: {**ENTRY, "checksum": f"{i:02x}" * 32} for i, eid in enumerate(IDS)}}
VALID_BYTES = LockFile.parse(VALID_LOCK, "x").to_json()


@settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_lock_bytes_are_a_warning_and_never_change_a_valid_entry(tmp_path_factory, data):
    raw = bytearray(VALID_BYTES)
    kind = data.draw(st.sampled_from(["truncate", "flip", "insert", "replace"]))
    at = data.draw(st.integers(min_value=0, max_value=len(raw) - 1))
    if kind == "truncate":
        raw = raw[:at]
    elif kind == "flip":
        raw[at] ^= 1 << data.draw(st.integers(min_value=0, max_value=7))
    elif kind == "insert":
        raw[at:at] = data.draw(st.binary(min_size=1, max_size=8))
    else:
        raw = bytearray(data.draw(st.binary(max_size=64)))
    assume(bytes(raw) != VALID_BYTES)
    path = tmp_path_factory.mktemp("lock") / "autotune.lock.json"
    path.write_bytes(bytes(raw))
    try:
        lock = LockFile.load(path)  # the build's reader
    except LockFormatError as exc:  # only for a newer schema, which a flipped digit can make
        assert "is newer than" in str(exc)
        return
    try:
        decoded = json.loads(bytes(raw))
    except ValueError:
        assert lock.entries == {} and len(lock.warnings) == 1 and "not JSON" in lock.warnings[0]
        return
    entries = decoded.get("entries") if isinstance(decoded, dict) else None
    if not isinstance(entries, dict):
        assert lock.entries == {} and lock.warnings
        return
    for eid, entry in lock.entries.items():  # read exactly as written, nothing changed
        assert _canonical(entry.to_json()) == _canonical(entries[eid])
    for eid in set(entries) - set(lock.entries):  # what is dropped is said, by name
        assert any(repr(eid) in w or ("ignoring it" in w and "entry" not in w) for w in lock.warnings), (eid, lock.warnings)
    if not lock.warnings:
        assert LockFile.load(path).to_json() == lock.to_json()


def _canonical(value) -> str:
    return json.dumps(value, sort_keys=True)


@settings(max_examples=EXAMPLES, deadline=2000)
@given(victim=st.sampled_from(IDS), value=JSON)
def test_one_damaged_entry_leaves_the_others_exactly_as_they_were(victim, value):
    data = copy.deepcopy(VALID_LOCK)
    data["entries"][victim] = value
    lock = LockFile.parse(json.loads(json.dumps(data)), "lock.json", strict=False)
    for eid in IDS:
        if eid != victim:
            assert lock.entries[eid].to_json() == VALID_LOCK["entries"][eid]
    if victim not in lock.entries:
        assert any(victim in w for w in lock.warnings)
        with pytest.raises(LockFormatError, match=re.escape(f"lock.json: entry '{victim}' is malformed")):
            LockFile.parse(json.loads(json.dumps(data)), "lock.json")
