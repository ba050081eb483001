"""Hostile and careless input: each gets a clear error, naming the key or argument, in bounded
time. The cases come from an audit of about 150 bad inputs against the build, the lock file and
the runtime; each failed (hang, traceback or silent acceptance) before the fix it tests."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
from conftest import hook_table, in_forked_child, write_tiny_project

from hatch_autotune.declare.config import DEFAULT_MAX_CONFIGS, ConfigError, parse_project
from hatch_autotune.lock import LockFile, LockFormatError
from hatch_autotune.runtime import IntegrityError, Library, as_compute_capability, parse_arch

P = "tool.hatch.build.targets.wheel.hooks.autotune"
K = f"{P}.kernels.scale"
BOUND_S = 10.0  # far above what any case takes (milliseconds); a regression hangs instead


def _errors_in_child(root, table, queue):
    try:
        parse_project(table, root, env={})
        queue.put(("ok", []))
    except ConfigError as exc:
        queue.put(("errors", exc.errors))
    except BaseException as exc:  # anything else is a defect: report it, do not hang the parent
        queue.put(("raised", [f"{type(exc).__name__}: {exc}"]))


def config_errors(root, table) -> list[str]:
    """parse_project's errors, from a forked child that is killed after BOUND_S."""
    kind, errors = in_forked_child(_errors_in_child, (root, table), BOUND_S, "the config check")
    assert kind != "raised", f"not a ConfigError: {errors}"
    return errors


@pytest.fixture
def project(tmp_path):
    root = write_tiny_project(tmp_path / "p")
    return root, hook_table(root)


def _big_space(t, k):
    for i in range(6):
        k["space"][f"A{i}"] = list(range(1, 16))
        k["default"][f"A{i}"] = 1


def _scalar_key(t, k):
    k["args"][2] = {"name": "n", "dtype": "int32"}  # the caller passes n, and n picks the bucket
    k["key"] = {"n": {"from": "n", "buckets": [8, 2**40]}}


def _string_axis(t, k):
    k["space"]["S"] = ["a", "b"]
    k["default"]["S"] = "a"
    k["constraints"] = ["S * 10**10 > 0"]


def _rename_kernel(t, k):
    t["kernels"]["scale\n"] = t["kernels"].pop("scale")


CASES = [
    # (what, mutation of (project table, kernel table), expected fragment)
    (
        "unbounded power in a constraint",
        lambda t, k: k.update(constraints=["9**9**9 > 0"]),
        f"{K}.constraints[0]: '9**9**9 > 0' cannot be evaluated for",
    ),
    ("... and the bound is named", lambda t, k: k.update(constraints=["9**9**9 > 0"]), "has more than 1024 bits"),
    ("unbounded power in the grid", lambda t, k: k.update(grid=["9**9**9"]), f"{K}: grid expression '9**9**9' fails for"),
    (
        "unbounded power in shared",
        lambda t, k: k.update(shared="2 ** (BLOCK * 1000)"),
        f"{K}: shared expression '2 ** (BLOCK * 1000)' fails",
    ),
    ("a string axis in arithmetic", _string_axis, "`*` applied to a string ('a' * 10000000000); arithmetic takes numbers"),
    (
        "a huge literal",
        lambda t, k: k.update(constraints=["1" + "0" * 400 + " > 0"]),
        f"{K}.constraints[0]: an integer literal of more than 1024 bits",
    ),
    (
        "a huge number as an expression",
        lambda t, k: k.update(grid=[10**400]),
        f"{K}.grid[0]: an integer literal of more than 1024 bits in expression '1000",
    ),
    (
        "5000 unary minuses",
        lambda t, k: k.update(constraints=["-" * 5000 + "1"]),
        f"{K}.constraints[0]: expression of 5001 characters; at most 1000",
    ),
    ("100k terms", lambda t, k: k.update(constraints=["+".join(["1"] * 100_000)]), f"{K}.constraints[0]: expression of 199999 characters"),
    ("deep unary nesting", lambda t, k: k.update(constraints=["-" * 900 + "1"]), "is nested too deeply (at most 64 levels)"),
    ("deep not nesting", lambda t, k: k.update(grid=["not " * 200 + "1"]), f"{K}.grid[0]: expression 'not not"),
    ("deep parentheses", lambda t, k: k.update(constraints=["(" * 400 + "1" + ")" * 400]), f"{K}.constraints[0]: invalid expression"),
    ("float overflow", lambda t, k: k.update(constraints=["10.0 ** 400 > 1"]), "cannot be evaluated for"),
    ("complex power", lambda t, k: k.update(constraints=["(0 - 8) ** 0.5 > 1"]), "is not a real number"),
    ("division by zero", lambda t, k: k.update(constraints=["BLOCK // (FACTOR - 2) > 1"]), "ZeroDivisionError"),
    ("a space too large to walk", _big_space, f"{K}.space: 68,343,750 configs (3 BLOCK x 2 FACTOR x 1 BAD x 15 A0"),
    ("... and how to allow it", _big_space, f"more than `max-configs` ({DEFAULT_MAX_CONFIGS:,}) allows"),
    (
        "too many tuning points",
        lambda t, k: k["key"]["n"].update(buckets=list(range(1, 20_001))),
        f"{K}.key: the buckets make 20,000 tuning points",
    ),
    (
        "a bucket above int64",
        lambda t, k: k["key"]["n"].update(buckets=[1024, 2**63]),
        f"{K}.key.n.buckets[1]: expected an integer <= {2**63 - 1}",
    ),
    (
        "a bucket overflowing an int32 value",
        lambda t, k: k["key"]["n"].update(buckets=[1024, 2**62]),
        f"{K}: value of argument 'n' (int32): 'n' gives {2**62}, outside [-2147483648, 2147483647]",
    ),
    (
        "a bucket overflowing an int32 key scalar",
        _scalar_key,
        f"{K}: key dim 'n' has bucket {2**40}, which does not fit in argument 'n' (int32",
    ),
    ("a negative shape", lambda t, k: k["args"][0].update(shape=["n - 2048"]), f"{K}: shape[0] of argument 'x': 'n - 2048' gives -1024"),
    ("a grid of more than 2**32 blocks", lambda t, k: k.update(grid=["n * 2**30"]), "expected an integer from 1 to 2147483647"),
    ("a block of more than 1024 threads", lambda t, k: k.update(block=["BLOCK * 64"]), "expected an integer from 1 to 1024"),
    ("kernel name with a newline", _rename_kernel, f'{P}.kernels."scale\n": expected an identifier'),
    ("module with a newline", lambda t, k: t.update(module="tinypkg.kernels\n"), f"{P}.module: expected a dotted module path"),
    ("entry with a newline", lambda t, k: k.update(entry="scale\n"), f"{K}.entry: expected an identifier"),
    ("argument with a newline", lambda t, k: k["args"][0].update(name="x\n"), f"{K}.args[0].name: expected an identifier"),
    (
        "axis with a newline",
        lambda t, k: (k["space"].update({"W\n": [1]}), k["default"].update({"W\n": 1})),
        f'{K}.space."W\n": expected an identifier',
    ),
    ("key dim with a newline", lambda t, k: k["key"].update({"n\n": k["key"].pop("n")}), f'{K}.key."n\n": expected an identifier'),
    ("type parameter with a newline", lambda t, k: k.update(types={"T\n": ["float32"]}), f'{K}.types."T\n": expected an identifier'),
    ("arch with a newline", lambda t, k: t.update(archs=["sm_90\n"]), f"{P}.archs[0]: expected a CUDA arch"),
    (
        "a wheel tag that is a path",
        lambda t, k: t.update({"wheel-tag": "../../evil"}),
        f"{P}.wheel-tag: expected a wheel tag 'python-abi-platform'",
    ),
    (
        "a lock file outside the project",
        lambda t, k: t.update({"lock-file": "/etc/passwd"}),
        f"{P}.lock-file: '/etc/passwd' is outside the project",
    ),
    (
        "... also through ..",
        lambda t, k: t.update({"lock-file": "../elsewhere.json"}),
        "unless `lock-file-outside-project = true` says otherwise",
    ),
    ("a lock file that is a directory", lambda t, k: t.update({"lock-file": "tinypkg"}), f"{P}.lock-file: 'tinypkg' is a directory"),
    ("a huge value in a message is cut", lambda t, k: t.update(module="x" * 100_000), "xxx..."),
]


@pytest.mark.parametrize("mutate,fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_config_gets_a_clear_error_in_bounded_time(project, mutate, fragment):
    root, table = project
    table = copy.deepcopy(table)
    mutate(table, table["kernels"]["scale"])
    errors = config_errors(root, table)
    assert any(fragment in e for e in errors), errors
    assert all(len(e) < 2000 for e in errors), "an error line repeats a huge input"


def test_max_configs_raises_the_limit_per_kernel(project):
    root, table = project
    kernel = table["kernels"]["scale"]
    kernel["space"]["W"] = list(range(1, 20))  # 3 * 2 * 1 * 19 = 114 configs
    kernel["default"]["W"] = 1
    kernel["max-configs"] = 100
    assert any(f"{K}.space: 114 configs" in e for e in config_errors(root, table))
    kernel["max-configs"] = 114
    assert len(parse_project(table, root).kernels["scale"].configs({})) == 114
    kernel["max-configs"] = 0
    assert any(f"{K}.max-configs: expected an integer >= 1" in e for e in config_errors(root, table))


def test_a_lock_file_outside_the_project_when_asked(project, tmp_path):
    root, table = project
    table["lock-file"] = str(tmp_path / "shared" / "lock.json")
    table["lock-file-outside-project"] = True
    assert parse_project(table, root).lock_file == tmp_path / "shared" / "lock.json"


# ---- lock files ------------------------------------------------------------------------------


def test_a_lock_file_nested_100k_deep_is_a_warning_for_the_build_and_an_error_for_the_command(tmp_path):
    path = tmp_path / "autotune.lock.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    lock = LockFile.load(path)  # the build's reader
    assert lock.entries == {} and len(lock.warnings) == 1 and "nested deeper than" in lock.warnings[0]
    from hatch_autotune.errors import CliError
    from hatch_autotune.inspection.readers import read_json

    with pytest.raises((CliError, LockFormatError)) as info:  # the command's reader
        LockFile.parse(read_json(path, "lock file"), str(path))
    assert "nested deeper than" in str(info.value)


def test_the_command_says_one_line_for_a_deep_lock_file(tmp_path, capsys):
    from hatch_autotune.cli import main

    path = tmp_path / "deep.json"
    path.write_text('{"schema": 1, "entries": ' + "[" * 50_000 + "]" * 50_000 + "}")
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert "nested deeper than" in err and "internal error" not in err and len(err.strip().splitlines()) == 1


# ---- the runtime -----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", [-1, 5, 1000, (0, 0), (9, 10), (-1, 9), "0.0", "sm_-19", (9.0, 0)])
def test_select_refuses_an_arch_no_gpu_has(example_kernels, arch):
    with pytest.raises((ValueError, TypeError)) as info:
        example_kernels.saxpy.select(arch=arch, n=4096, T="float32")
    assert "arch" in str(info.value)
    assert isinstance(arch, str) or "sm_-" not in str(info.value)  # never a made-up arch name


def test_as_compute_capability_keeps_what_gpus_have():
    assert as_compute_capability(90) == as_compute_capability("9.0") == as_compute_capability((9, 0)) == (9, 0)
    assert as_compute_capability("sm_120") == (12, 0) and as_compute_capability(100) == (10, 0)
    with pytest.raises(ValueError):
        parse_arch("sm_90\n")


@pytest.mark.parametrize(
    "n,fragment",
    [(-1, "n=-1 is not a problem size"), (0, "an empty array launches nothing"), (10**30, "expected 1 to 9223372036854775807")],
)
def test_select_refuses_sizes_that_are_not_sizes(example_kernels, n, fragment):
    with pytest.raises(ValueError) as info:
        example_kernels.saxpy.select(arch="sm_90", n=n, T="float32")
    assert fragment in str(info.value) and str(info.value).startswith("saxpy.select(): key dim n=")


class _Interface:
    def __init__(self, **cai):
        self.__cuda_array_interface__ = cai


GOOD_CAI = {"shape": (8,), "typestr": "<f4", "data": (0x7F0000100000, False), "strides": None, "version": 3}


@pytest.mark.parametrize(
    "cai,fragment",
    [
        ({k: v for k, v in GOOD_CAI.items() if k != "typestr"}, "lacks 'typestr'"),
        ({k: v for k, v in GOOD_CAI.items() if k not in ("shape", "data")}, "lacks 'shape', 'data'"),
        ({**GOOD_CAI, "typestr": 4}, "['typestr'] is 4, not a string"),
        ({**GOOD_CAI, "shape": (-8,)}, "['shape'] is (-8,), not a tuple of sizes"),
        ({**GOOD_CAI, "data": None}, "['data'] is None, not (pointer, read_only)"),
        ({**GOOD_CAI, "strides": (4, 4)}, "['strides'] is (4, 4)"),
    ],
)
def test_a_broken_array_interface_names_the_argument(example_kernels, cai, fragment):
    x, y = _Interface(**cai), _Interface(**GOOD_CAI)
    for call in (lambda: example_kernels.saxpy.prepare(1.0, x, y), lambda: example_kernels.saxpy(1.0, x, y)):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value).startswith("saxpy(): argument 'x': __cuda_array_interface__") and fragment in str(info.value)


def test_a_negative_scalar_key_is_refused_before_the_launch(example_kernels):
    """saxpy with n passed by the caller (as a scalar key would be) instead of computed."""
    from hatch_autotune.runtime import Kernel, KernelTable

    spec = copy.deepcopy(example_kernels._LIBRARY.table["kernels"]["saxpy"])
    spec["args"] = [{k: v for k, v in a.items() if k != "value"} for a in spec["args"]]
    spec["key"] = [{**d, "from": "n", "axis": None} for d in spec["key"]]
    kernel = Kernel(KernelTable.from_json("saxpy", spec), example_kernels._LIBRARY)
    x, y = _Interface(**GOOD_CAI), _Interface(**GOOD_CAI)
    with pytest.raises(ValueError, match=r"saxpy\(\): argument 'n'=-1 defines key dim n, a size: expected 0 to"):
        kernel.prepare(1.0, x, y, -1)
    with pytest.raises(ValueError, match=r"argument 'n'=8 .*|argument 'x' has shape"):
        kernel.prepare(1.0, x, y, 9)  # a right size goes on to the shape check


@pytest.mark.parametrize(
    "table",
    [
        [],
        {"schema": 1, "kernels": {}},  # no module, no archs
        {"schema": 1, "kernels": {"saxpy": []}, "module": "m", "archs": []},
        {"schema": 1, "kernels": {"saxpy": {"entry": "saxpy"}}, "module": "m", "archs": []},
        {"schema": 1, "kernels": {}, "module": "m", "archs": 5},
    ],
    ids=["list", "no-module", "kernel-a-list", "kernel-missing-keys", "archs-not-a-list"],
)
def test_a_malformed_table_with_a_matching_checksum_is_an_integrity_error(tmp_path, table):
    raw = json.dumps(table).encode()
    (tmp_path / "table.json").write_bytes(raw)
    with pytest.raises(IntegrityError) as info:
        Library.load(str(tmp_path), hashlib.sha256(raw).hexdigest())
    assert str(tmp_path / "table.json") in str(info.value)
