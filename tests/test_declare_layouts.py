"""Issue #52's declarations as the hook reads them: strided and optional arrays, tensor-map
arguments, free dims (`dims`), thread-block clusters and constraints over the key and `arch`;
what each becomes in the runtime's records (and their JSON), and every refusal naming its key."""

from __future__ import annotations

import copy

import pytest
from conftest import errors_for

from hatch_autotune.declare.config import parse_project
from hatch_autotune.declare.kernel_decl import kernel_decl
from hatch_autotune.lock.checksum import entry_checksum
from hatch_autotune.runtime import KernelDecl

ROPE = {
    "template": "scale.cu.j2",
    "entry": "rope",
    "dims": {"cache_len": 4096},
    "args": [
        {"name": "q", "dtype": "float32", "shape": ["tokens", "heads", "HEAD_DIM"], "intent": "inout", "strides": "inner"},
        {"name": "cos_sin", "dtype": "float32", "shape": ["cache_len", "HEAD_DIM"], "intent": "in"},
        {"name": "bias", "dtype": "float32", "shape": ["HEAD_DIM"], "intent": "in", "optional": True},
        {"name": "q_map", "tensor-map": {"array": "q", "box": [1, "ROWS", "HEAD_DIM"], "swizzle": "128B"}},
        {"name": "ld_tok", "dtype": "int64", "value": "q_stride0"},
        {"name": "ld_head", "dtype": "int64", "value": "q_stride1"},
        {"name": "cache", "dtype": "int32", "value": "cache_len"},
    ],
    "key": {"tokens": {"buckets": [64, 4096]}, "heads": {"buckets": [8, 32]}},
    "constants": {"HEAD_DIM": [128]},
    "space": {"ROWS": [1, 2, 4], "CLUSTER": [1, 2]},
    "default": {"ROWS": 1, "CLUSTER": 1},
    "constraints": ["tokens % ROWS == 0", "arch >= 90 or CLUSTER == 1", "ROWS <= 4"],
    "grid": ["cdiv(tokens, ROWS) * CLUSTER", "heads"],
    "block": [128],
    "shared": "ROWS * HEAD_DIM * 4 + cache_len * 0",
    "cluster": ["CLUSTER", 1, 1],
}


def _table(good, **changes):
    root, table = good
    table = copy.deepcopy(table)
    kernel = copy.deepcopy(ROPE)
    kernel.update(changes)
    table["kernels"] = {"rope": kernel}
    return root, table


def _spec(good, **changes):
    root, table = _table(good, **changes)
    return parse_project(table, root, env={}).kernels["rope"]


def test_every_new_key_reaches_the_spec_and_the_runtime_records(good):
    spec = _spec(good)
    q, cos_sin, bias, q_map = spec.args[:4]
    assert (q.strides, q.optional, q.stride_names()) == ("inner", False, ("q_stride0", "q_stride1", "q_stride2"))
    assert (cos_sin.strides, cos_sin.stride_names()) == ("contiguous", ())
    assert bias.optional and not bias.computed
    assert q_map.computed and q_map.tensor_map is not None and q_map.tensor_map.swizzle == "128B"
    assert dict(spec.dims) == {"cache_len": 4096}
    assert [e.text for e in spec.cluster] == ["CLUSTER", "1", "1"]
    assert [c.text for c in spec.instance_constraints] == ["ROWS <= 4"]
    assert [(i, c.text) for i, c in spec.point_constraints] == [(0, "tokens % ROWS == 0"), (1, "arch >= 90 or CLUSTER == 1")]
    # the instance's configs are filtered by the instance constraints only
    assert len(spec.configs({"HEAD_DIM": 128})) == 6

    decl = kernel_decl(spec)
    assert [a.name for a in decl.user_args] == ["q", "cos_sin", "bias"]  # tensor maps and computed scalars are not passed
    again = KernelDecl.from_json("rope", decl.to_json())
    assert again == decl
    assert again.dims == {"cache_len": 4096} and again.launch.cluster == (["n", "CLUSTER"], 1, 1)
    assert again.arg("q").strides == "inner" and again.arg("bias").optional and again.arg("q_map").is_tensor_map
    doc = decl.call_doc()
    assert "any strides with the innermost one 1" in doc and "GPU array, or None" in doc
    assert "q_map of q" in doc and "Free dims" in doc and "cache_len" in doc


def test_a_kernel_without_the_new_keys_has_the_json_and_checksum_it_had(good):
    """Old tables and lock files read as before: no new JSON key, no new checksum field."""
    root, table = good
    spec = next(iter(parse_project(table, root, env={}).kernels.values()))
    data = kernel_decl(spec).to_json()
    assert "dims" not in data and "cluster" not in data["launch"]
    assert all(k not in a for a in data["args"] for k in ("strides", "optional", "tensor_map"))
    plain = entry_checksum(spec, "T=float32", ["h"], "sm_90", {"n": 1024})
    import dataclasses

    strided = dataclasses.replace(spec, args=tuple(dataclasses.replace(a, strides="any") if a.shape else a for a in spec.args))
    assert entry_checksum(strided, "T=float32", ["h"], "sm_90", {"n": 1024}) != plain


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"dims": {"cache_len": 0}}, "kernels.rope.dims.cache_len: expected an integer"),
        ({"dims": {"cache_len": 4096, "unused": 8}}, "kernels.rope.dims.unused: no array the caller must pass has 'unused' as an axis"),
        ({"cluster": [1, 1, 1, 1]}, "kernels.rope.cluster: expected 1 to 3 expressions"),
        ({"cluster": ["NOPE"]}, "kernels.rope.cluster[0]: unknown name(s) NOPE"),
        ({"constraints": ["cache_len > 2"]}, "kernels.rope.constraints[0]: unknown name(s) cache_len"),
        ({"space": {"ROWS": [1], "CLUSTER": [1], "cache_len": [1]}, "default": {"ROWS": 1, "CLUSTER": 1, "cache_len": 1}},
         "free dim 'cache_len' has the same name as axis cache_len"),
        ({"space": {"ROWS": [1], "CLUSTER": [1], "q_stride0": [1]}, "default": {"ROWS": 1, "CLUSTER": 1, "q_stride0": 1}},
         "stride 'q_stride0' has the same name as axis q_stride0"),
    ],
)  # fmt: skip
def test_bad_kernel_keys_are_refused_by_name(good, change, expected):
    root, table = _table(good, **change)
    errors = errors_for(root, table)
    assert any(expected in e for e in errors), errors


@pytest.mark.parametrize(
    ("index", "arg", "expected"),
    [
        (0, {"strides": "rows"}, "kernels.rope.args[0].strides: expected one of 'contiguous', 'inner', 'any'"),
        (0, {"optional": "yes"}, "kernels.rope.args[0].optional: expected a boolean (true or false)"),
        (6, {"optional": True}, "kernels.rope.args[6].optional: only arrays (with a shape) have `optional`"),
        (6, {"strides": "any"}, "kernels.rope.args[6].strides: only arrays (with a shape) have strides"),
        (4, {"value": "cos_sin_stride0"}, "kernels.rope.args[4].value: unknown name(s) cos_sin_stride0"),
        (3, {"dtype": "float32"}, "kernels.rope.args[3].dtype: a tensor map has no dtype"),
        (3, {"tensor-map": {"array": "nope", "box": [1]}}, "kernels.rope.args[3].tensor-map.array: 'nope' is not an argument"),
        (3, {"tensor-map": {"array": "ld_tok", "box": [1]}}, "'ld_tok' is a scalar"),
        (3, {"tensor-map": {"array": "q", "box": [1, 2]}}, "kernels.rope.args[3].tensor-map.box: expected one expression per dim of 'q' (3"),
        (3, {"tensor-map": {"array": "q", "box": [1, 1, "BOGUS"]}}, "kernels.rope.args[3].tensor-map.box[2]: unknown name(s) BOGUS"),
        (3, {"tensor-map": {"array": "q", "box": [1, 1, 1], "swizzle": "256B"}}, "tensor-map.swizzle: expected one of 'none', '32B'"),
        (3, {"tensor-map": {"array": "bias", "box": [1]}}, "'bias' is optional; a tensor map needs an array every call passes"),
        (3, {"tensor-map": {"array": "q", "box": [1, 1, 1], "mode": 1}}, "kernels.rope.args[3].tensor-map.mode: unknown key"),
        (3, {"tensor-map": {"array": "q", "box": [1, 1, 1], "order": "fortran"}}, "tensor-map.order: expected one of 'declared', 'memory'"),
        (3, {"tensor-map": {"array": "q", "box": [1, 1, 1], "when": "tokens > 64"}}, "kernels.rope.args[3].tensor-map.when: unknown name(s) tokens"),
        (3, {"tensor-map": {"array": "q", "box": [1, 1, 1], "when": "ROWS >"}}, "kernels.rope.args[3].tensor-map.when"),
        (3, {"tensor-map": {"array": "q", "box": [1, 1, 1], "when": "ROWS == 1"}}, "kernels.rope.default: the default config reads tensor map 'q_map'"),
    ],
)  # fmt: skip
def test_bad_arguments_are_refused_by_name(good, index, arg, expected):
    root, table = _table(good)
    kernel = table["kernels"]["rope"]
    if "tensor-map" in arg:
        kernel["args"][index] = {"name": kernel["args"][index]["name"], **arg}
    else:
        kernel["args"][index] = {**kernel["args"][index], **arg}
    errors = errors_for(root, table)
    assert any(expected in e for e in errors), errors


def test_a_broken_array_gives_its_own_error_not_a_false_one_about_its_tensor_map(good):
    root, table = _table(good)
    table["kernels"]["rope"]["args"][0]["dtype"] = "float99"
    errors = errors_for(root, table)
    assert any("args[0].dtype" in e for e in errors) and not any("not an argument" in e for e in errors), errors


def test_a_tensor_map_of_an_any_strided_array_is_refused(good):
    root, table = _table(good)
    table["kernels"]["rope"]["args"][0]["strides"] = "any"
    assert any('declared with strides = "any"' in e for e in errors_for(root, table))


@pytest.mark.parametrize("extra", [{"order": "memory"}, {"when": "ROWS > 1 and arch_specific == 1"}])
def test_a_map_in_memory_order_or_with_a_when_may_read_an_any_strided_array(good, extra):
    """(The call checks TMA's rules; with a `when`, a call they refuse runs a variant that reads no map.)"""
    root, table = _table(good)
    table["kernels"]["rope"]["args"][0]["strides"] = "any"
    table["kernels"]["rope"]["args"][3]["tensor-map"].update(extra)
    spec = parse_project(table, root, env={}).kernels["rope"]
    decl = kernel_decl(spec).arg("q_map").tensor_map
    assert (decl.order, decl.when is not None) == (extra.get("order", "declared"), "when" in extra)
    assert KernelDecl.from_json("rope", kernel_decl(spec).to_json()).arg("q_map").tensor_map == decl
    table["kernels"]["rope"]["args"][3]["tensor-map"].update(when="ROWS == 4", order="memory")  # another when (and order)
    other = parse_project(table, root, env={}).kernels["rope"]
    checksum = lambda s: entry_checksum(s, "-", ["h"], "sm_90", {"tokens": 64, "heads": 8})  # noqa: E731
    assert checksum(spec) != checksum(other)  # what a measurement depends on


def test_a_key_dim_is_never_read_from_an_optional_array(good):
    root, table = _table(good)
    table["kernels"]["rope"]["key"]["hd"] = {"from": "bias", "axis": 0, "buckets": [128]}
    assert any("kernels.rope.key.hd: 'bias' is optional" in e for e in errors_for(root, table))


def test_a_free_dim_only_an_optional_array_has_is_refused(good):
    root, table = _table(good)
    args = table["kernels"]["rope"]["args"]
    args[2]["shape"] = ["extra"]
    table["kernels"]["rope"]["dims"] = {"cache_len": 4096, "extra": 16}
    assert any("dims.extra: no array the caller must pass" in e for e in errors_for(root, table))


def test_unit_stride_variants_make_a_constant_the_call_sets_from_the_layout(good):
    root, table = _table(good)
    q = table["kernels"]["rope"]["args"][0]
    q.update(strides="any", **{"unit-stride-variants": True})
    del table["kernels"]["rope"]["args"][3]  # its tensor map needs "inner"
    spec = parse_project(table, root, env={}).kernels["rope"]
    assert spec.constants["q_unit_stride"] == (True, False)
    assert len(spec.type_instances()) == 2  # HEAD_DIM=128 x q_unit_stride in {True, False}
    decl = kernel_decl(spec)
    assert decl.layout_constants == {"q_unit_stride": "q"}
    assert list(decl.call_constants) == ["HEAD_DIM"]
    assert KernelDecl.from_json("rope", decl.to_json()).arg("q").unit_stride_variants
    doc = decl.call_doc()
    assert "q_unit_stride: not passed" in doc and "q_unit_stride," not in doc.splitlines()[0]


def test_unit_stride_variants_need_strides_any(good):
    root, table = _table(good)
    table["kernels"]["rope"]["args"][0]["unit-stride-variants"] = True  # strides "inner": always unit
    assert any('args[0].unit-stride-variants: only an array declared with strides = "any"' in e for e in errors_for(root, table))
