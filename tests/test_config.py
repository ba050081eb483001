"""Config validation: each bad input gets a message naming its key path and what was expected."""

from __future__ import annotations

import copy

import pytest
from conftest import EXAMPLE, errors_for, hook_table

from hatch_autotune.declare.config import ConfigError, parse_project

P = "tool.hatch.build.targets.wheel.hooks.autotune"
K = f"{P}.kernels.scale"


def test_example_pkg_config_is_valid():
    project = parse_project(hook_table(EXAMPLE), EXAMPLE)
    assert set(project.kernels) == {"saxpy", "row_softmax", "sgemm", "gemm", "rmsnorm", "add_rmsnorm"}
    for spec in project.kernels.values():
        for types in spec.type_instances():
            assert len(spec.configs(types)) >= 12, spec.name
        n_buckets = 1
        for k in spec.key:
            n_buckets *= len(k.buckets)
        assert n_buckets >= 3
    assert project.kernels["saxpy"].types == {"T": ("float32", "float16")}
    sgemm = project.kernels["sgemm"]
    assert [(k.name, k.source, k.axis) for k in sgemm.key] == [("m", "A", 0), ("n", "B", 1), ("k", "A", 1)]


def test_good_table_parses(good):
    root, table = good
    project = parse_project(table, root)
    spec = project.kernels["scale"]
    assert spec.entry == "scale" and spec.template == (root / "scale.cu.j2").resolve()
    assert project.lock_file == root / "autotune.lock.json" and project.mode == "auto" and not project.strict
    assert [c["BLOCK"] for c in spec.configs({})] == [64, 64, 128, 128, 256, 256]


def _set(table, dotted, value):
    """Set (or with value=DELETE, remove) a nested key given 'a.b.c' relative to the hook table."""
    node = table
    parts = dotted.split(".")
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node[p]
    last = parts[-1]
    if value is DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


class _Delete:
    """The marker for a key to remove; its repr names it, so test ids are the same in every
    process (pytest-xdist's workers must collect identical ids)."""

    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()

BAD_INPUTS = [
    # (key to set, value, expected error fragment)
    ("module", 7, f"{P}.module: expected a dotted module path"),
    ("module", "kernels", f"{P}.module: expected a dotted module path inside your package"),
    ("strict", "yes", f"{P}.strict: expected a boolean"),
    ("archs", ["sm_70"], f"{P}.archs[0]: expected an arch NVRTC 13 can target"),
    ("archs", ["hopper"], f"{P}.archs[0]: expected a CUDA arch 'sm_XY', 'sm_XYa' (arch-specific) or 'sm_XYf' (family)"),
    ("mode", "fast", f"{P}.mode: expected one of 'auto', 'offline', 'tune', 'retune'"),
    ("colour", "blue", f"{P}.colour: unknown key"),
    ("kernels.scale.flavour", 1, f"{K}.flavour: unknown key"),
    ("kernels.scale.template", "missing.cu.j2", f"{K}.template: template file 'missing.cu.j2' not found"),
    ("kernels.scale.template", "builtin:nope.cu.j2", f"{K}.template: no built-in template 'builtin:nope.cu.j2'"),
    ("kernels.scale.entry", "1abc", f"{K}.entry: expected an identifier"),
    ("kernels.scale.space.BLOCK", [], f"{K}.space.BLOCK: expected a non-empty array of values"),
    ("kernels.scale.space.BLOCK", 64, f"{K}.space.BLOCK: expected an array of values, got an integer 64"),
    ("kernels.scale.space.BLOCK", [64, 64], f"{K}.space.BLOCK: expected distinct values"),
    ("kernels.scale.space", {}, f"{K}.space: expected at least one axis"),
    ("kernels.scale.default.BLOCK", 100, f"{K}.default.BLOCK: default 100 is not in the space [64, 128, 256]"),
    ("kernels.scale.default.WIDTH", 1, f"{K}.default.WIDTH: 'WIDTH' is not an axis of the space"),
    ("kernels.scale.default", {"BLOCK": 128}, f"{K}.default: expected a value for every axis; missing FACTOR, BAD"),
    ("kernels.scale.constraints", ["BLOCK > 1024"], f"{K}.constraints: the constraints exclude every config"),
    ("kernels.scale.constraints", ["BLOCK != 128"], f"{K}.default: the default"),
    ("kernels.scale.constraints", ["BLOCK < WIDTH"], f"{K}.constraints[0]: unknown name(s) WIDTH"),
    (
        "kernels.scale.constraints",
        ["__import__('os').system('x')"],
        f"{K}.constraints[0]: calling __import__('os').system() is not allowed",
    ),
    ("kernels.scale.constraints", ["BLOCK <"], f"{K}.constraints[0]: invalid expression 'BLOCK <'"),
    ("kernels.scale.constraints", ["[BLOCK]"], f"{K}.constraints[0]: List is not allowed"),
    ("kernels.scale.constraints", ["BLOCK.bit_length() > 1"], f"{K}.constraints[0]: calling BLOCK.bit_length() is not allowed"),
    ("kernels.scale.grid", ["cdiv(n)"], f"{K}.grid[0]: cdiv() with other than 2 arguments"),
    ("kernels.scale.grid", ["cdiv(m, BLOCK)"], f"{K}.grid[0]: unknown name(s) m"),
    ("kernels.scale.grid", ["1", "1", "1", "1"], f"{K}.grid: expected 1 to 3 expressions"),
    ("kernels.scale.block", DELETE, f"{K}.block: required key is missing"),
    ("kernels.scale.key.n.buckets", [4096, 1024], f"{K}.key.n.buckets: expected strictly increasing integers"),
    ("kernels.scale.key.n.buckets", [0, 8], f"{K}.key.n.buckets[0]: expected an integer >= 1"),
    ("kernels.scale.key.n.mapping", "round", f"{K}.key.n.mapping: expected one of 'nearest', 'floor', 'ceil', 'exact'"),
    ("kernels.scale.key.n.from", "z", f"{K}.key.n.from: 'z' is not an argument of the kernel"),
    ("kernels.scale.key.n.axis", 3, f"{K}.key.n.axis: 'x' has 1 dims, got axis 3"),
    ("kernels.scale.key", {"m": {"buckets": [1, 2]}}, f"{K}.args[0].shape[0]: unknown name(s) n"),
    ("kernels.scale.args.0.dtype", "float8", f"{K}.args[0].dtype: expected one of 'float16', 'float32'"),
    ("kernels.scale.args.0.intent", "read", f"{K}.args[0].intent: expected one of 'in', 'out', 'inout'"),
    ("kernels.scale.args.0.intent", DELETE, f"{K}.args[0].intent: required for arrays"),
    ("kernels.scale.args.2.intent", "in", f"{K}.args[2].intent: only arrays (with a shape) have an intent"),
    ("kernels.scale.args.0.align", 12, f"{K}.args[0].align: expected a power of two"),
    ("kernels.scale.args.2.align", 4, f"{K}.args[2].align: only arrays (with a shape) have an alignment"),
    ("kernels.scale.args.1.name", "x", f"{K}.args[1].name: duplicate argument name 'x'"),
    ("kernels.scale.args", [], f"{K}.args: expected a non-empty array of tables"),
    ("kernels.scale.types", {"T": []}, f"{K}.types.T: expected a non-empty array"),
    ("kernels.scale.types", {"T": ["float32", "bfloat7"]}, f"{K}.types.T[1]: expected one of"),
    ("kernels.scale.types", {"BLOCK": ["float32"]}, f"{K}: axis 'BLOCK' has the same name as type parameter BLOCK"),
    (
        "kernels.scale.key.entry",
        {"from": "x", "axis": 0, "buckets": [1]},
        f"{K}: key dim 'entry' has the same name as the template variable `entry`",
    ),
    ("kernels.scale.key.BLOCK", {"from": "x", "axis": 0, "buckets": [1]}, f"{K}: key dim 'BLOCK' has the same name as axis BLOCK"),
    ("kernels.scale.nvrtc-options", ["-I/usr/include"], f"{K}.nvrtc-options: '-I/usr/include' is not supported"),
    ("kernels.scale.default.BAD", 0, f"{K}.default.BAD: default 0 is not in the space [False]"),
    ("kernels.scale.grid", ["n / BLOCK"], f"{K}: grid expression 'n / BLOCK' gives 16.0 for"),
    ("kernels.scale.grid", ["min(n)"], f"{K}.grid[0]: min() with fewer than 2 arguments"),
    ("kernels.scale.block", ["BLOCK - 128"], f"{K}: block expression 'BLOCK - 128' gives -64 for"),
    ("kernels.scale.timing", {"launches": "graphs"}, f"{K}.timing.launches: expected one of 'eager', 'graph'"),
    ("kernels.scale.timing", {"l2": "warm"}, f"{K}.timing.l2: expected one of 'cold', 'hot'"),
    ("kernels.scale.timing", {"graph-launches": 0}, f"{K}.timing.graph-launches: expected an integer >= 1, got an integer 0"),
    ("kernels.scale.timing", {"graph-size": 4}, f"{K}.timing.graph-size: unknown key (known keys here: graph-launches, l2, launches)"),
    ("tuning", {"launches": "lazy"}, f"{P}.tuning.launches: expected one of 'eager', 'graph'"),
    ("tuning", {"graph-launches": 1001}, f"{P}.tuning.graph-launches: expected an integer <= 1000, got an integer 1001"),
    ("kernels", {}, f"{P}.kernels: expected at least one kernel table"),
    ("kernels", DELETE, f"{P}.kernels: required table is missing"),
]


@pytest.mark.parametrize("key,value,expected", BAD_INPUTS, ids=[f"{k}={v!r}"[:60] for k, v, _ in BAD_INPUTS])
def test_bad_input_is_reported_with_key_path(good, key, value, expected):
    root, table = good
    table = copy.deepcopy(table)
    _set(table, key, value)
    errors = errors_for(root, table)
    assert any(expected in e for e in errors), errors


def test_reserved_kernel_names(good):
    root, table = good
    for name in ("provenance", "_private"):
        t = copy.deepcopy(table)
        t["kernels"][name] = t["kernels"].pop("scale")
        assert any("may not be named 'provenance' or start with '_'" in e for e in errors_for(root, t))


def test_hatchling_hook_keys_are_not_unknown(good):
    root, table = good
    table.update({"dependencies": ["x"], "enable-by-default": True, "require-runtime-dependencies": False, "require-runtime-features": []})
    parse_project(table, root)


def test_several_errors_reported_together(good):
    root, table = good
    table["strict"] = "no"
    table["bogus"] = 1
    table["kernels"]["scale"]["space"]["BLOCK"] = []
    table["kernels"]["scale"]["grid"] = ["open('x')"]
    with pytest.raises(ConfigError) as info:
        parse_project(table, root)
    errors = info.value.errors
    assert len(errors) >= 4, errors
    text = str(info.value)
    assert text.startswith("hatch-autotune: ") and f"{len(errors)} error(s)" in text
    for fragment in (f"{P}.strict", f"{P}.bogus", f"{K}.space.BLOCK", f"{K}.grid[0]"):
        assert fragment in text


def test_environment_overrides_mode_and_archs(good):
    root, table = good
    project = parse_project(table, root, env={"HATCH_AUTOTUNE_MODE": "offline", "HATCH_AUTOTUNE_ARCHS": "sm_86, sm_90a"})
    assert project.mode == "offline" and project.archs == ("sm_86", "sm_90a")
    errors = errors_for(root, table, env={"HATCH_AUTOTUNE_MODE": "sometimes"})
    assert any("HATCH_AUTOTUNE_MODE: expected one of" in e for e in errors)


def test_key_dim_from_a_scalar(good):
    root, table = good
    kernel = table["kernels"]["scale"]
    kernel["args"][2] = {"name": "n", "dtype": "int32"}  # caller passes n
    kernel["key"] = {"n": {"from": "n", "buckets": [8, 64]}}
    spec = parse_project(table, root).kernels["scale"]
    assert spec.key[0].source == "n" and spec.key[0].axis is None
    kernel["args"][2] = {"name": "n", "dtype": "float32"}
    assert any("a key dim needs an integer scalar" in e for e in errors_for(root, table))


def test_timing_resolves_over_the_project_and_enters_the_checksum_only_when_not_eager_and_cold(good):
    """A kernel's `timing` over the project's `tuning`; the lock checksum of a kernel timed eagerly
    with a cold L2 (how every kernel was timed before timing modes) is what it was, any other
    mode's differs, and so does each mode's from the others'."""
    from hatch_autotune.declare.config import parse_project
    from hatch_autotune.declare.search import TimingSpec
    from hatch_autotune.lock import entry_checksum

    root, table = good

    def spec(kernel_timing=None, tuning=None):
        t = copy.deepcopy(table)
        if kernel_timing is not None:
            t["kernels"]["scale"]["timing"] = kernel_timing
        if tuning is not None:
            t["tuning"] = tuning
        return parse_project(t, root, env={}).kernels["scale"]

    def checksum(s):
        return entry_checksum(s, "-", ["h"], "sm_90", {"n": 1024})

    plain = spec()
    assert plain.timing == TimingSpec("eager", "cold", 20) and plain.timing.checksum_fields is None
    assert spec(tuning={"flush-l2": False}).timing == TimingSpec("eager", "hot", 20)
    assert spec({"l2": "cold"}, tuning={"flush-l2": False, "launches": "graph"}).timing == TimingSpec("graph", "cold", 20)
    assert spec({"graph-launches": 7}, tuning={"launches": "graph"}).timing.text() == "CUDA graph of 7 launches, L2 cold"
    assert checksum(spec({"launches": "eager", "l2": "cold"})) == checksum(plain)
    assert checksum(spec({"graph-launches": 7})) == checksum(plain)  # eager: the graph's size does not matter
    others = [
        spec({"l2": "hot"}),
        spec({"launches": "graph"}),
        spec({"launches": "graph", "graph-launches": 7}),
        spec(tuning={"flush-l2": False}),
    ]
    sums = {checksum(s) for s in others}
    assert checksum(plain) not in sums and len(sums) == 3  # flush-l2 = false and l2 = "hot" are one mode
