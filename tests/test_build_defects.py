"""The build-side defects of issue #52, each with the test that failed before its fix: a grid
whose y or z exceeds CUDA's 65535 passed the project check; a cluster that does not divide the
grid, or of more than 8 blocks, was not checked; a bad array dtype also gave a false "is not an
argument of the kernel" error for the key that names the array; a misspelt `reference`/`inputs`
hook passed an offline build and was found only on a GPU builder; an sm_103 device and a wheel
with sm_100f (a family cubin, which runs on 10.0 and 10.3)."""

from __future__ import annotations

import sys

import pytest
from conftest import build, errors_for, load_project, write_tiny_project

from hatch_autotune.declare.config import parse_project
from hatch_autotune.errors import BuildError
from hatch_autotune.plan.hooks import hook_problem
from hatch_autotune.plan.planner import make_plan
from hatch_autotune.runtime.selection import binary_reason, choose_arch, runs_on

K = "tool.hatch.build.targets.wheel.hooks.autotune.kernels.scale"


# ---- (a) the grid's y and z, and clusters ------------------------------------------------------


@pytest.mark.parametrize(
    "grid,fragment",
    [
        (["1", "n // 8"], f"{K}: grid[1] (y) expression 'n // 8' gives 131072 for"),
        (["1", "1", "n // 8"], f"{K}: grid[2] (z) expression 'n // 8' gives 131072 for"),
    ],
)
def test_a_grid_y_or_z_above_65535_is_refused(good, grid, fragment):
    root, table = good
    table["kernels"]["scale"]["grid"] = grid
    (error,) = errors_for(root, table)
    assert error.startswith(fragment), error
    assert (
        "expected an integer from 1 to 65535 (use // or cdiv for division); CUDA allows at most 65535 blocks in a grid's y and z" in error
    )


def test_a_grid_x_may_still_reach_2_31_blocks_and_y_65535(good):
    root, table = good
    table["kernels"]["scale"]["grid"] = ["n * 2048 - 1", "65535", "min(n, 65535)"]  # 2**31 - 1 at the largest bucket
    assert parse_project(table, root, env={}).kernels["scale"].grid[1].text == "65535"


def test_a_grid_y_past_65535_where_a_point_constraint_excludes_the_config_is_no_error(good):
    root, table = good
    k = table["kernels"]["scale"]
    k["grid"] = ["1", "n * 64 // BLOCK"]  # 65536 at n=65536 with BLOCK=64: past 65535
    k["key"]["n"]["buckets"] = [1024, 65536]
    (error,) = errors_for(root, table)
    assert "grid[1] (y) expression 'n * 64 // BLOCK' gives 65536 for {'BLOCK': 64" in error, error
    k["constraints"] = ["n * 64 // BLOCK <= 65535"]  # such a config may not run there, so is never launched there
    spec = parse_project(table, root, env={}).kernels["scale"]
    assert [c.text for _, c in spec.point_constraints] == ["n * 64 // BLOCK <= 65535"]


def _clustered(table, cluster, grid=None, cx=(1, 2)):
    k = table["kernels"]["scale"]
    k["space"]["CX"] = list(cx)
    k["default"]["CX"] = cx[0]
    k["cluster"] = cluster
    if grid is not None:
        k["grid"] = grid


@pytest.mark.parametrize(
    "cluster,grid,cx,fragment",
    [
        (["CX"], ["3"], (1, 2), "grid x (3) is not a multiple of cluster x (2) for"),
        (["1", "CX"], ["cdiv(n, BLOCK)", "5"], (1, 2), "grid y (5) is not a multiple of cluster y (2) for"),
        (["CX", "CX"], ["cdiv(n, BLOCK)", "16"], (1, 4), "cluster ['CX', 'CX'] gives 4x4 = 16 blocks for"),
        (["CX"], None, (1, 16), "cluster expression 'CX' gives 16 for"),
    ],
)
def test_a_cluster_must_divide_the_grid_and_hold_at_most_8_blocks(good, cluster, grid, cx, fragment):
    root, table = good
    _clustered(table, cluster, grid, cx)
    (error,) = errors_for(root, table)
    assert error.startswith(f"{K}: {fragment}"), error


def test_a_cluster_that_divides_the_grid_passes(good):
    root, table = good
    _clustered(table, ["CX", "1"], ["cdiv(n, BLOCK)", "3"], (1, 2, 4))
    assert parse_project(table, root, env={}).kernels["scale"].cluster is not None


# ---- (b) a bad array dtype and the key that names the array ----------------------------------------


def test_a_bad_dtype_of_the_key_array_is_its_only_error(good):
    root, table = good
    k = table["kernels"]["scale"]
    k["args"][0]["dtype"] = "float33"
    k["key"]["n"]["from"] = "x"
    errors = errors_for(root, table)
    assert len(errors) == 1 and errors[0].startswith(f"{K}.args[0].dtype: expected one of"), errors


def test_a_bad_dtype_of_every_array_of_an_inferred_key_is_the_only_error(good):
    root, table = good
    k = table["kernels"]["scale"]
    k["args"][0]["dtype"] = "float33"
    k["args"][1]["dtype"] = "float33"
    errors = errors_for(root, table)
    assert all(".dtype: expected one of" in e for e in errors) and len(errors) == 2, errors


def test_a_key_from_an_argument_that_is_not_declared_is_still_an_error(good):
    root, table = good
    table["kernels"]["scale"]["key"]["n"]["from"] = "z"
    (error,) = errors_for(root, table)
    assert error.startswith(f"{K}.key.n.from: 'z' is not an argument of the kernel"), error


def test_keys_say_nothing_of_an_argument_whose_own_problem_was_reported():
    """parse_keys as the kernel table calls it once it passes the declared names."""
    from hatch_autotune.declare.keys import parse_keys
    from hatch_autotune.declare.validate import Table

    errors: list[str] = []
    key_t = Table({"n": {"from": "x", "buckets": [1024]}}, "key", errors)
    assert parse_keys(key_t, ["n"], {}, True, declared={"x", "y"}) == [] and errors == []
    key_t = Table({"n": {"buckets": [1024]}}, "key", errors)
    assert parse_keys(key_t, ["n"], {}, True, declared={"x"}) == [] and errors == []
    key_t = Table({"n": {"from": "z", "buckets": [1024]}}, "key", errors)
    assert parse_keys(key_t, ["n"], {}, True, declared={"x"}) == []
    assert errors == ["key.n.from: 'z' is not an argument of the kernel (arguments: )"], errors


# ---- (c) hooks that do not resolve -----------------------------------------------------------------

HOOKS = """\
import numpy as np
import not_installed_on_the_builder  # the hook's module is read, not run: what it imports is the GPU builder's


def expected(x, y, n):
    return {"y": 2 * x}


def make(key, types, rng):
    return {}


answer = 42
"""


def hooked(tmp_path, ref: str, *, where: str = "", which: str = "reference"):
    root = write_tiny_project(tmp_path / "p")
    folder = root / where
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "myhooks.py").write_text(HOOKS)
    with (root / "pyproject.toml").open("a") as f:
        f.write(f'{which} = "{ref}"\n')
    return root


@pytest.mark.parametrize(
    "ref,fragment",
    [
        ("myhooks:expectd", "module 'myhooks' ({root}/myhooks.py) has no function 'expectd'"),
        ("myhook:expected", "no module named 'myhook' (looked in {root}/src, {root} and sys.path)"),
        ("myhooks:answer", "myhooks.answer is a int, not a function"),
        ("myhooks.sub:expected", "no module named 'myhooks.sub'"),
    ],
)
@pytest.mark.parametrize("which", ["reference", "inputs"])
def test_an_offline_build_stops_at_a_hook_that_does_not_resolve(tmp_path, ref, fragment, which):
    root = hooked(tmp_path, ref, which=which)
    with pytest.raises(BuildError) as info:
        build(root, tmp_path / "cache", env={"HATCH_AUTOTUNE_MODE": "offline"})
    message = str(info.value)
    assert message.startswith(f"hatch-autotune: {K}.{which}: {ref!r} does not resolve: "), message
    assert fragment.format(root=root) in message, message


@pytest.mark.parametrize("where", ["", "src"])
def test_a_hook_that_resolves_passes_without_running_its_module(tmp_path, where):
    root = hooked(tmp_path, "myhooks:expected", where=where)
    project = load_project(root)
    make_plan(project, project.archs, log=lambda _: None, compiler="13.0")  # `import not_installed_on_the_builder` is not run
    assert "myhooks" not in sys.modules


def test_hook_problems_read_the_module_source(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from .impl import ref\n")
    (tmp_path / "pkg" / "impl.py").write_text("def ref():\n    pass\n")
    (tmp_path / "lazy.py").write_text("def __getattr__(name):\n    return print\n")
    (tmp_path / "guarded.py").write_text("try:\n    import cupy\n    def ref(): pass\nexcept ImportError:\n    ref = None\n")
    assert hook_problem("pkg:ref", tmp_path) is None
    assert hook_problem("pkg.impl:ref", tmp_path) is None
    assert hook_problem("lazy:anything", tmp_path) is None  # made at run time: the tuner will tell
    assert hook_problem("guarded:ref", tmp_path) is None
    assert hook_problem("json:loads", tmp_path) is None  # outside the project: left to the tuner
    (tmp_path / "broken.py").write_text("def ref(:\n")
    assert hook_problem("broken:ref", tmp_path).startswith(f"module 'broken' ({tmp_path}/broken.py) does not parse: ")


# ---- (d) sm_100f on an sm_103 device ---------------------------------------------------------------


def test_an_sm_103_device_runs_the_sm_100f_cubin():
    assert runs_on("sm_100f", (10, 3)) and runs_on("sm_100f", (10, 0)) and not runs_on("sm_100f", (12, 0))
    assert choose_arch((10, 3), ["sm_90", "sm_100f"], ["compute_90"]) == ("sm_100f", "cubin")
    assert binary_reason("sm_100f", (10, 3)) == "family"
