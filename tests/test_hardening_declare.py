"""Issue #33, the declaration's share: numbers finite and in range (table and environment),
addresses checked before anything connects, ASCII digits only, every problem of a kernel table
at once, templates inside their folder, a target arch NVRTC cannot compile for named as such,
and a bad constant reported once. Property tests at the end: random constants tables and
HATCH_AUTOTUNE_* values are accepted or refused with the project's own error, naming the key."""

from __future__ import annotations

import copy
import math
import os
import re
import shutil

import pytest
from conftest import SCALE_TEMPLATE, build, errors_for, hook_table, write_tiny_project
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hatch_autotune.declare.config import ConfigError, builtin_templates_dir, parse_project
from hatch_autotune.declare.settings import SettingsError, read_cache_settings, read_settings
from hatch_autotune.errors import BuildError
from hatch_autotune.runtime import short_repr

P = "tool.hatch.build.targets.wheel.hooks.autotune"
K = f"{P}.kernels.scale"
EXAMPLES = int(os.environ.get("HATCH_AUTOTUNE_EXAMPLES", "300"))
FAST = settings(max_examples=EXAMPLES, deadline=2000, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def with_kernel(table, **keys):
    table = copy.deepcopy(table)
    table["kernels"]["scale"].update(keys)
    return table


# ---- #4: NaN, infinities and huge numbers ----------------------------------------------------


def test_a_nan_tolerance_is_refused_rather_than_turning_verification_off(good):
    root, table = good
    errors = errors_for(root, with_kernel(table, tolerance={"rtol": math.nan, "atol": math.nan}))
    assert [e.split(":")[0] for e in errors] == [f"{K}.tolerance.rtol", f"{K}.tolerance.atol"]
    assert "expected a number >= 0 and <= 1,000,000, got a float nan" in errors[0], errors
    assert "expected a finite number >= 0, got a float nan" in errors[1], errors  # atol: in the outputs' units


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e300, 10**400], ids=["nan", "inf", "-inf", "1e300", "10**400"])
@pytest.mark.parametrize("key", ["timeout-s", "budget-ms", "eliminate"])
def test_every_float_of_the_tuning_table_is_finite_and_bounded(good, key, value):
    root, table = good
    table = copy.deepcopy(table)
    table["tuning"] = {key: value}
    (error,) = errors_for(root, table)
    assert error.startswith(f"{P}.tuning.{key}: expected a number >= ") and "<= 1,000,000" in error, error


@pytest.mark.parametrize("value", [math.nan, math.inf, 1e300])
def test_the_search_seconds_are_finite_and_bounded(good, value):
    root, table = good
    (error,) = errors_for(root, with_kernel(table, search={"seconds": value}))
    assert error.startswith(f"{K}.search.seconds: expected a number >= 0.001 and <= 1,000,000"), error


def test_large_but_bounded_numbers_are_still_accepted(good):
    root, table = good
    table = with_kernel(table, tolerance={"rtol": 1e-6, "atol": 0})
    table["tuning"] = {"timeout-s": 1_000_000, "budget-ms": 0.5}
    project = parse_project(table, root)
    assert project.tuning.timeout_s == 1e6 and project.kernels["scale"].tolerance == (1e-6, 0.0)


@pytest.mark.parametrize("value", [-1, 101, 2.5, True, "5"])
def test_the_runoff_rounds_are_a_bounded_integer(good, value):
    root, table = good
    table["tuning"] = {"runoff-rounds": value}
    (error,) = errors_for(root, table)
    assert error.startswith(f"{P}.tuning.runoff-rounds: expected an integer"), error
    table["tuning"] = {"runoff-rounds": 0}
    assert parse_project(table, root).tuning.runoff_rounds == 0


@pytest.mark.parametrize("expression", ["BLOCK < 1e999", "-1e999 < BLOCK"])
def test_an_infinite_number_in_an_expression_is_refused(good, expression):
    root, table = good
    (error,) = errors_for(root, with_kernel(table, constraints=[expression]))
    assert error == f"{K}.constraints[0]: the number 1e999 in expression {expression!r} is not finite", error


@pytest.mark.parametrize("value", ["1e308", "1e10", "nan", "inf", "0", "1" * 5000])
def test_the_cache_timeout_variable_is_finite_and_bounded(value):
    with pytest.raises(SettingsError) as info:
        read_cache_settings({"HATCH_AUTOTUNE_CACHE_TIMEOUT": value})
    (problem,) = info.value.problems
    assert problem.startswith("HATCH_AUTOTUNE_CACHE_TIMEOUT=") and "expected a number of seconds > 0" in problem, problem
    assert len(problem) < 300


@pytest.mark.parametrize(
    "var, value",
    [
        ("HATCH_AUTOTUNE_CACHE_TTL", "9" * 30),  # Redis refuses such an expiry
        ("HATCH_AUTOTUNE_CACHE_MAX_BYTES", str(1 << 40)),  # larger than any value Redis stores
        ("HATCH_AUTOTUNE_JOBS", "1000000"),
    ],
)
def test_whole_number_variables_have_an_upper_bound(var, value):
    with pytest.raises(SettingsError) as info:
        read_settings({var: value})
    (problem,) = info.value.problems
    assert problem.startswith(f"{var}=") and ", from " in problem, problem


def test_bounded_variables_keep_their_values():
    s = read_settings({"HATCH_AUTOTUNE_CACHE_TIMEOUT": "3600", "HATCH_AUTOTUNE_CACHE_TTL": "0", "HATCH_AUTOTUNE_JOBS": " 16 "})
    assert (s.cache.timeout_s, s.cache.ttl_s, s.jobs) == (3600.0, 0, 16)


# ---- #6 and #12: addresses and digits --------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        ("127.0.0.1:99999", "port '99999' is not a TCP port; expected a port from 1 to 65535"),
        ("head:0", "port '0' is not a TCP port"),
        ("127.0.0.1:²", "expected the Ray head node's HOST:PORT"),
        ("127.0.0.1:١٢٣", "expected the Ray head node's HOST:PORT"),
        ("::1:6379", "an IPv6 host in brackets, e.g. [::1]:6379"),
        ("[::zz]:6379", "expected the Ray head node's HOST:PORT"),
        ("head", "expected the Ray head node's HOST:PORT"),
    ],
)
def test_a_bad_ray_address_is_refused_before_anything_connects(value, expected):
    with pytest.raises(SettingsError) as info:
        read_settings({"HATCH_AUTOTUNE_RAY": value})
    (problem,) = info.value.problems
    assert problem.startswith("HATCH_AUTOTUNE_RAY=") and expected in problem, problem


def test_a_bracketed_ipv6_ray_address_is_accepted_and_split():
    from hatch_autotune.declare.settings import ray_host_port

    assert read_settings({"HATCH_AUTOTUNE_RAY": "[::1]:6379"}).ray_address == "[::1]:6379"
    assert ray_host_port("[::1]:6379") == ("::1", 6379)
    assert ray_host_port("head.cluster.internal:6379") == ("head.cluster.internal", 6379)
    assert read_settings({"HATCH_AUTOTUNE_RAY": "10.0.0.5:6379"}).ray_address == "10.0.0.5:6379"


@pytest.mark.parametrize("value", ["²", "١٢", "1_000", "+", "0x10", "4.0"])
def test_jobs_takes_ascii_digits_only(value):
    with pytest.raises(SettingsError, match=r"^hatch-autotune: HATCH_AUTOTUNE_JOBS=.*: expected a whole number of compiles"):
        read_settings({"HATCH_AUTOTUNE_JOBS": value})


@pytest.mark.parametrize("value", ["٣٦٠٠", "1_0", "nan"])
def test_the_cache_numbers_take_ascii_digits_only(value):
    with pytest.raises(SettingsError) as info:
        read_cache_settings({"HATCH_AUTOTUNE_CACHE_TTL": value, "HATCH_AUTOTUNE_CACHE_MAX_BYTES": value})
    assert [p.split("=")[0] for p in info.value.problems] == ["HATCH_AUTOTUNE_CACHE_MAX_BYTES", "HATCH_AUTOTUNE_CACHE_TTL"]


def test_a_cache_url_with_port_zero_is_refused():
    with pytest.raises(SettingsError, match=r"HATCH_AUTOTUNE_CACHE_URL=redis://\*\*\*@h:0/0: port 0 cannot be connected to"):
        read_cache_settings({"HATCH_AUTOTUNE_CACHE_URL": "redis://secret@h:0/0"})


def test_the_command_says_a_unicode_digit_ray_port_is_bad_in_one_line(tmp_path, monkeypatch, capsys):
    from hatch_autotune.cli import main

    root = write_tiny_project(tmp_path / "p")
    monkeypatch.setenv("HATCH_AUTOTUNE_RAY", "127.0.0.1:²")
    assert main(["tune", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hatch-autotune: error: HATCH_AUTOTUNE_RAY='127.0.0.1:²': expected") and "internal error" not in err, err
    assert err.count("\n") == 1


# ---- #13: an unknown key hides nothing ------------------------------------------------------


def test_an_unknown_key_does_not_hide_the_other_problems_of_its_kernel(good):
    root, table = good
    errors = errors_for(root, with_kernel(table, blok=3, **{"nvrtc-options": ["-Icuda/common"]}))
    assert len(errors) == 2, errors
    assert any(e.startswith(f"{K}.blok: unknown key") for e in errors)
    assert any(e.startswith(f"{K}.nvrtc-options: '-Icuda/common' is not supported") for e in errors)


def test_an_unknown_key_does_not_hide_the_whole_kernel_checks(good):
    root, table = good
    errors = errors_for(root, with_kernel(table, blok=3, block=["BLOCK - 128"]))
    assert errors[0].startswith(f"{K}.blok: unknown key")
    assert errors[1].startswith(f"{K}: block expression 'BLOCK - 128' gives -64"), errors
    assert len(errors) == 2


def test_an_unknown_key_in_an_argument_or_key_dim_adds_no_spurious_error(good):
    root, table = good
    table = copy.deepcopy(table)
    table["kernels"]["scale"]["args"][0]["blok"] = 3
    table["kernels"]["scale"]["key"]["n"]["blok"] = 3
    table["kernels"]["scale"]["grid"] = ["n / BLOCK"]  # a whole-kernel problem, still found
    errors = errors_for(root, table)
    assert [e.split(":")[0] for e in errors] == [f"{K}.args[0].blok", f"{K}.key.n.blok", K], errors


# ---- #9: templates stay inside their folder ---------------------------------------------------


def test_a_builtin_template_escaping_the_builtin_folder_is_refused(good):
    root, table = good
    escape = os.path.relpath(root / "scale.cu.j2", builtin_templates_dir())  # ../../tmp/.../scale.cu.j2: a real file
    (error,) = errors_for(root, with_kernel(table, template=f"builtin:{escape}"))
    assert error.startswith(f"{K}.template: 'builtin:../") and "is outside hatch-autotune's built-in templates folder" in error, error


@pytest.mark.parametrize("where", ["absolute", "relative", "symlink"])
def test_a_template_outside_the_project_is_refused(tmp_path, where):
    root = write_tiny_project(tmp_path / "p")
    outside = tmp_path / "elsewhere.cu.j2"
    outside.write_text(SCALE_TEMPLATE)
    ref = {"absolute": str(outside), "relative": "../elsewhere.cu.j2", "symlink": "linked.cu.j2"}[where]
    if where == "symlink":
        (root / "linked.cu.j2").symlink_to(outside)
    (error,) = errors_for(root, with_kernel(hook_table(root), template=ref))
    assert error.startswith(f"{K}.template: {short_repr(ref)} is outside the project ({root}); expected a file inside it"), error


@pytest.mark.parametrize("ref", ["sc\0ale.cu.j2", "x" * 5000, "builtin:sax\0py.cu.j2"], ids=["nul", "long", "builtin-nul"])
def test_an_unusable_template_name_is_one_error_not_a_traceback(good, ref):
    root, table = good
    (error,) = errors_for(root, with_kernel(table, template=ref))
    assert error.startswith(f"{K}.template: ") and len(error) < 400, error


def test_a_template_in_a_project_subfolder_and_a_builtin_one_still_work(tmp_path):
    root = write_tiny_project(tmp_path / "p")
    (root / "cuda").mkdir()
    shutil.copy(root / "scale.cu.j2", root / "cuda" / "scale.cu.j2")
    spec = parse_project(with_kernel(hook_table(root), template="cuda/../cuda/scale.cu.j2"), root).kernels["scale"]
    assert spec.template == (root / "cuda" / "scale.cu.j2").resolve()
    assert parse_project(with_kernel(hook_table(root), template="builtin:saxpy.cu.j2"), root)


# ---- an arch NVRTC cannot compile for -----------------------------------------------------


def test_an_arch_nvrtc_does_not_support_is_named_before_anything_compiles(tmp_path):
    root = write_tiny_project(tmp_path / "p")
    logs: list[str] = []
    with pytest.raises(BuildError) as info:
        build(root, tmp_path / "cache", logs, env={"HATCH_AUTOTUNE_ARCHS": "sm_90,sm_999"})
    message = str(info.value)
    assert re.match(r"hatch-autotune: NVRTC \d+\.\d+ does not support sm_999 \(", message), message
    assert "it supports sm_75, " in message and "sm_90" in message.split("it supports")[1]
    assert "does not compile" not in message and "\n" not in message
    assert not any("compiled" in line for line in logs), logs  # refused before any compile


def test_compile_all_refuses_an_unsupported_arch_before_compiling():
    from hatch_autotune.compile.nvrtc import CompileJob, check_archs, compile_all

    job = CompileJob('extern "C" __global__ void k() {}', "sm_999", "k")
    with pytest.raises(BuildError, match=r"does not support sm_999 .*; it supports sm_75, sm_80"):
        compile_all([job], None)
    check_archs(["sm_80", "sm_90a", "compute_90"])  # what NVRTC 13 compiles for passes


# ---- a bad constant is reported once ------------------------------------------------------


@pytest.mark.parametrize("values", [[256, 1024, 256], [256, True], [1.5], []], ids=["duplicate", "mixed", "float", "empty"])
def test_a_bad_constant_is_reported_once_without_unknown_name_errors(good, values):
    root, table = good
    table = with_kernel(
        table,
        constants={"SEG": values},
        constraints=["SEG > 0"],
        grid=["cdiv(n, BLOCK * SEG)"],
    )
    table["kernels"]["scale"]["args"][0]["shape"] = ["n + SEG - SEG"]
    (error,) = errors_for(root, table)
    assert error.startswith(f"{K}.constants.SEG"), error


# ---- property tests ------------------------------------------------------------------------

NAME = st.sampled_from(["SEG", "R", "CAUSAL", "float32", "T", "n", "BLOCK", "class", "1x", "a-b", "stream", "x"])
VALUE = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.lists(st.integers(), max_size=2),
    st.none(),
)
CONSTANTS = st.dictionaries(NAME, st.one_of(st.lists(VALUE, max_size=5), VALUE), max_size=4)


@FAST
@given(constants=CONSTANTS)
def test_any_constants_table_is_accepted_or_refused_naming_its_key(good, constants):
    root, table = good
    table = with_kernel(table, constants={k: v for k, v in constants.items() if v is not None})
    declared = [k for k in table["kernels"]["scale"]["constants"] if re.fullmatch(r"[A-Za-z_]\w*", k)]
    if declared:  # every declared name is used by an expression: none may be reported as unknown
        table["kernels"]["scale"]["constraints"] = [" + ".join(declared) + " == " + " + ".join(declared)]
    try:
        project = parse_project(table, root)
    except ConfigError as exc:
        assert exc.errors
        for e in exc.errors:
            assert e.startswith(K) and "\n" not in e, e
            assert not re.search(rf"unknown name\(s\) .*\b({'|'.join(declared)})\b", e) or not declared, e
        return
    for _name, values in project.kernels["scale"].constants.items():
        assert len(set(values)) == len(values) and len({type(v) for v in values}) == 1


VARIABLES = [
    "HATCH_AUTOTUNE_MODE",
    "HATCH_AUTOTUNE_ARCHS",
    "HATCH_AUTOTUNE_JOBS",
    "HATCH_AUTOTUNE_RAY",
    "HATCH_AUTOTUNE_CACHE_URL",
    "HATCH_AUTOTUNE_CACHE_TIMEOUT",
    "HATCH_AUTOTUNE_CACHE_MAX_BYTES",
    "HATCH_AUTOTUNE_CACHE_TTL",
]
PIECES = ["1", "0", "9" * 30, "²", "١", "٣", "nan", "inf", "-", "+", ".", "e", "1e308", " ", "\t", ":", "[", "]", "::1", "_", "sm_90",  # noqa: RUF001 (digits int() takes)
          "redis://", "h", "6379", "65536", ",", "\u00a0", "%", "x" * 40]  # fmt: skip
TEXT = st.one_of(st.lists(st.sampled_from(PIECES), max_size=8).map("".join), st.text(max_size=12))


@FAST
@given(env=st.dictionaries(st.sampled_from(VARIABLES), TEXT.filter(lambda t: "\0" not in t), max_size=4))
def test_any_environment_is_accepted_or_refused_naming_each_variable(env):
    try:
        s = read_settings(env)
    except SettingsError as exc:
        assert exc.problems and all(any(var in p.split(":")[0] for var in env) for p in exc.problems), exc.problems
        assert all("\n" not in p and len(p) < 600 for p in exc.problems)
        return
    for value in (s.cache.timeout_s, s.cache.max_bytes, s.cache.ttl_s, s.jobs):
        assert math.isfinite(value) and value >= 0
    assert s.cache.timeout_s <= 3600 and 1 <= s.jobs <= 1024


@FAST
@given(env=st.dictionaries(st.sampled_from(VARIABLES), TEXT.filter(lambda t: "\0" not in t), max_size=4))
def test_a_projects_environment_problems_are_configuration_errors_naming_the_variable(good, env):
    root, table = good
    try:
        parse_project(table, root, env=env)
    except ConfigError as exc:
        assert all(any(var in e for var in env) for e in exc.errors), exc.errors
