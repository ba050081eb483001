"""The hatchling adapter (hatch/plugin.py) in this process, built by hatchling's own classes: the
WheelBuilder/SdistBuilder of a small project in tmp_path give the hook its root, config,
build_config, metadata, directory, target name and app through hatchling's plugin manager (so the
`hatch` entry point in hooks.py is what finds it). Offline, one kernel, one arch, one config:
NVRTC compiles for real, no GPU is needed, and each test takes well under a second."""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from pathlib import Path

import pytest
from conftest import SCALE_TEMPLATE, write_tiny_project
from hatchling.builders.sdist import SdistBuilder
from hatchling.builders.wheel import WheelBuilder

from hatch_autotune.hatch.plugin import EDITABLE_MARKER, AutotuneBuildHook

TARGET_TABLE = "[tool.hatch.build.targets.wheel.hooks.autotune]"
GLOBAL_TABLE = "[tool.hatch.build.hooks.autotune]"


def small_project(root: Path, *, extra: str = "", template: str = SCALE_TEMPLATE, global_table: bool = False) -> Path:
    """The tests' tiny `scale` kernel cut to one arch, one bucket and one config, built offline."""
    write_tiny_project(root, extra=extra if "mode =" in extra else 'mode = "offline"\n' + extra, template=template)
    text = (root / "pyproject.toml").read_text()
    for old, new in [
        ('archs = ["sm_80", "sm_90"]', 'archs = ["sm_90"]'),
        ("buckets = [1024, 65536, 1048576]", "buckets = [1024]"),
        ("BLOCK = [64, 128, 256], FACTOR = [2, 3]", "BLOCK = [128], FACTOR = [2]"),
    ]:
        assert old in text
        text = text.replace(old, new)
    if global_table:  # the table every target's hooks get (hatchling: a target's own table replaces it)
        text = text.replace(TARGET_TABLE, GLOBAL_TABLE).replace(
            "[tool.hatch.build.targets.wheel.hooks.autotune.", "[tool.hatch.build.hooks.autotune."
        )
    (root / "pyproject.toml").write_text(text)
    return root


@pytest.fixture(autouse=True)
def build_env(monkeypatch, session_cache, tmp_path):
    """The shared compile cache, no mode or arch override from the environment, and a private
    temporary directory, so that staging directories left behind would show."""
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(session_cache))
    monkeypatch.delenv("HATCH_AUTOTUNE_MODE", raising=False)
    monkeypatch.delenv("HATCH_AUTOTUNE_ARCHS", raising=False)
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    return private


def hook_of(builder, directory: Path) -> AutotuneBuildHook:
    """The hook as hatchling makes it for `builder` (its plugin manager, our entry point)."""
    hooks = builder.get_build_hooks(str(directory))
    assert type(hooks["autotune"]) is AutotuneBuildHook
    return hooks["autotune"]


def fresh_build_data(builder) -> dict:
    build_data = builder.get_default_build_data()
    builder.set_build_data_defaults(build_data)
    return build_data


def staged(build_env: Path) -> list[Path]:
    return sorted(build_env.glob("hatch-autotune-*"))


# ---- a regular wheel ---------------------------------------------------------------------------


def test_initialize_stages_the_package_and_finalize_removes_it(tmp_path, build_env, capsys):
    root = small_project(tmp_path / "p")
    builder = WheelBuilder(str(root))
    hook = hook_of(builder, tmp_path / "dist")
    assert hook.target_name == "wheel" and hook.root == str(root)
    build_data = fresh_build_data(builder)
    hook.initialize("standard", build_data)

    ((source, dest),) = build_data["force_include"].items()
    assert dest == "tinypkg/kernels" and build_data["tag"] == "py3-none-any"
    assert build_data["infer_tag"] is False  # never tied to this interpreter's ABI
    package = Path(source)
    (staging,) = staged(build_env)
    assert package.parent == staging
    table = json.loads((package / "table.json").read_text())
    assert table["archs"] == ["sm_90"] and list(table["kernels"]) == ["scale"]
    assert (package / "__init__.py").is_file() and (package / "_runtime" / "__init__.py").is_file()
    binaries = [v["binaries"] for v in table["kernels"]["scale"]["variants"].values()]
    assert binaries and all((package / info["file"]).is_file() for b in binaries for info in b.values())
    out = capsys.readouterr()
    assert "hatch-autotune: packed tinypkg.kernels (1 kernel(s), archs sm_90)" in out.out + out.err
    warning = next(line for line in (out.out + out.err).splitlines() if line.startswith("hatch-autotune warning: "))
    assert warning.startswith("hatch-autotune warning: scale: 1 untuned entr") and warning.endswith("scale|-|sm_90|n=1024"), warning

    hook.finalize("standard", build_data, str(tmp_path / "dist" / "tinypkg.whl"))
    assert not staging.exists() and staged(build_env) == []
    out = capsys.readouterr()
    assert out.err.startswith("hatch-autotune: the wheel records this build's outcome: `hatch-autotune show tinypkg.whl`")
    hook.finalize("standard", build_data, "again")  # a second finalize is harmless
    assert capsys.readouterr().err == ""


def test_a_whole_in_process_wheel_build(tmp_path, build_env):
    root = small_project(tmp_path / "p", extra='wheel-tag = "py3-none-manylinux_2_28_x86_64"')
    (artifact,) = WheelBuilder(str(root)).build(directory=str(tmp_path / "dist"), versions=["standard"])
    assert Path(artifact).name == "tinypkg-0.1.0-py3-none-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(artifact) as zf:
        names = set(zf.namelist())
        table = json.loads(zf.read("tinypkg/kernels/table.json"))
        wheel_meta = zf.read("tinypkg-0.1.0.dist-info/WHEEL").decode()
    assert {"tinypkg/__init__.py", "tinypkg/kernels/__init__.py", "tinypkg/kernels/_runtime/__init__.py"} <= names
    shipped = {n for n in names if n.startswith("tinypkg/kernels/bin/")}
    assert shipped == {
        f"tinypkg/kernels/{info['file']}" for v in table["kernels"]["scale"]["variants"].values() for info in v["binaries"].values()
    }
    assert "Tag: py3-none-manylinux_2_28_x86_64" in wheel_meta and "Root-Is-Purelib: true" in wheel_meta
    assert staged(build_env) == []  # finalize ran


def test_a_non_wheel_target_is_a_no_op(tmp_path, build_env):
    # The global table reaches every target; even a broken one is not read for an sdist.
    root = small_project(tmp_path / "p", extra='mode = "sometimes"', global_table=True)
    builder = SdistBuilder(str(root))
    hook = hook_of(builder, tmp_path / "dist")
    build_data = fresh_build_data(builder)
    before = json.dumps(build_data, sort_keys=True, default=str)
    hook.initialize("standard", build_data)
    hook.finalize("standard", build_data, "x.tar.gz")
    assert json.dumps(build_data, sort_keys=True, default=str) == before
    assert staged(build_env) == [] and not (root / "tinypkg" / "kernels").exists()
    (sdist,) = SdistBuilder(str(root)).build(directory=str(tmp_path / "dist"))  # and hatchling builds it
    assert Path(sdist).name == "tinypkg-0.1.0.tar.gz"


@pytest.mark.parametrize("global_table", [False, True])
def test_a_config_error_is_a_system_exit_naming_the_key(tmp_path, build_env, global_table):
    root = small_project(tmp_path / "p", extra='mode = "sometimes"\nstrict = "yes"', global_table=global_table)
    builder = WheelBuilder(str(root))
    with pytest.raises(SystemExit) as info:
        hook_of(builder, tmp_path / "dist").initialize("standard", fresh_build_data(builder))
    message = str(info.value)
    table = "tool.hatch.build.hooks.autotune" if global_table else "tool.hatch.build.targets.wheel.hooks.autotune"
    assert f"{table}.mode" in message and "'sometimes'" in message, message
    assert f"{table}.strict" in message, message  # every error at once
    assert staged(build_env) == []


def test_a_build_error_is_a_system_exit_with_one_prefix(tmp_path, build_env):
    root = small_project(tmp_path / "p", template=SCALE_TEMPLATE.replace("{% endif %}", ""))
    builder = WheelBuilder(str(root))
    with pytest.raises(SystemExit) as info:
        hook_of(builder, tmp_path / "dist").initialize("standard", fresh_build_data(builder))
    message = str(info.value)
    assert message.startswith("hatch-autotune: ") and not message.startswith("hatch-autotune: hatch-autotune"), message
    assert "scale.cu.j2:" in message, message  # the template's file:line
    assert staged(build_env) == []


@pytest.mark.parametrize("mode", ["auto", "offline"])
def test_auto_mode_without_a_gpu_says_it_found_none(tmp_path, build_env, monkeypatch, capsys, mode):
    """One line, not a warning: building from the lock is what a CPU builder is for."""
    import hatch_autotune.tuning.tuner as tuner

    root = small_project(tmp_path / "p", extra=f'mode = "{mode}"\n')
    monkeypatch.setattr("hatch_autotune.plan.devices.detect_gpus", lambda: [])
    monkeypatch.setattr(tuner, "detect_gpus", lambda: [])
    builder = WheelBuilder(str(root))
    hook_of(builder, tmp_path / "dist").initialize("standard", fresh_build_data(builder))
    lines = capsys.readouterr().err.splitlines()
    said = [line for line in lines if "no GPU found" in line]
    if mode == "offline":  # offline never looks for one
        assert said == []
    else:
        assert said == [
            "hatch-autotune: mode auto: no GPU found on this machine, so nothing is tuned; the build takes the valid winners "
            "of autotune.lock.json and the default configs elsewhere"
        ]
        assert lines.index(said[0]) < next(i for i, line in enumerate(lines) if "variant binar" in line)  # before the build's lines


@pytest.mark.parametrize("mode", ["tune", "retune"])
def test_tune_mode_without_a_gpu_says_so_before_anything_else(tmp_path, build_env, monkeypatch, mode):
    """Even without `archs`: the tuner's own error, not advice to declare archs."""
    import hatch_autotune.tuning.tuner as tuner

    root = small_project(tmp_path / "p", extra=f'mode = "{mode}"\n')
    text = (root / "pyproject.toml").read_text().replace('archs = ["sm_90"]\n', "")
    (root / "pyproject.toml").write_text(text)
    monkeypatch.setattr("hatch_autotune.plan.devices.detect_gpus", lambda: [])
    monkeypatch.setattr(tuner, "detect_gpus", lambda: [])
    builder = WheelBuilder(str(root))
    with pytest.raises(SystemExit, match=f"hatch-autotune: tuning \\(mode '{mode}'\\) needs a CUDA GPU on this machine and none was found"):
        hook_of(builder, tmp_path / "dist").initialize("standard", fresh_build_data(builder))


@pytest.mark.parametrize("mode", ["auto", "retune", "offline"])
def test_with_hatch_autotune_ray_set_the_cluster_tunes_and_the_build_packs_its_plan(tmp_path, build_env, monkeypatch, mode):
    """HATCH_AUTOTUNE_RAY is the build hook's `tune --ray`: the Ray engine (tested on real local
    clusters in test_cluster) tunes, never this machine's GPUs; offline touches neither."""
    from hatch_autotune import tuning
    from hatch_autotune.plan.planner import make_plan
    from hatch_autotune.tuning import TuneSummary, ray_engine

    root = small_project(tmp_path / "p", extra=f'mode = "{mode}"\n')
    calls = []

    def fake_ray(project, address, *, kernels, mode, log, cache):
        calls.append((address, mode))
        return TuneSummary(plan=make_plan(project, ["sm_90"], log=lambda m: None))

    monkeypatch.setenv("HATCH_AUTOTUNE_RAY", "127.0.0.1:6379")
    monkeypatch.setattr(ray_engine, "tune_on_ray", fake_ray)
    monkeypatch.setattr(tuning, "tune", lambda *a, **k: pytest.fail("this machine's GPUs were asked to tune"))
    monkeypatch.setattr("hatch_autotune.plan.devices.detect_gpus", lambda: [])
    builder = WheelBuilder(str(root))
    build_data = fresh_build_data(builder)
    hook_of(builder, tmp_path / "dist").initialize("standard", build_data)
    assert calls == ([] if mode == "offline" else [("127.0.0.1:6379", mode)])  # tune_on_ray reads auto as tune (test_cluster)
    assert build_data["force_include"]  # the wheel is packed either way


# ---- editable installs -------------------------------------------------------------------------


def test_editable_writes_in_tree_with_its_marker_and_replaces_its_own_copy(tmp_path, build_env, capsys):
    root = small_project(tmp_path / "p")
    builder = WheelBuilder(str(root))
    build_data = fresh_build_data(builder)
    hook_of(builder, tmp_path / "dist").initialize("editable", build_data)
    generated = root / "tinypkg" / "kernels"
    assert (generated / EDITABLE_MARKER).is_file() and (generated / ".gitignore").read_text().endswith("\n*\n")
    assert json.loads((generated / "table.json").read_text())["archs"] == ["sm_90"]
    assert build_data["force_include"] == {} and "tag" not in build_data  # nothing staged for hatchling
    assert staged(build_env) == []
    out = capsys.readouterr()
    assert f"editable install: generated package written to {generated}" in out.out + out.err

    (generated / "stale.txt").write_text("from an older build")
    hook_of(builder, tmp_path / "dist").initialize("editable", fresh_build_data(builder))
    assert not (generated / "stale.txt").exists() and (generated / EDITABLE_MARKER).is_file()
    assert sorted(p.name for p in (root / "tinypkg").iterdir()) == ["__init__.py", "kernels"]  # no swap leftovers


def test_editable_in_a_src_layout(tmp_path, build_env):
    root = small_project(tmp_path / "p")
    (root / "src").mkdir()
    (root / "tinypkg").rename(root / "src" / "tinypkg")
    text = (root / "pyproject.toml").read_text().replace('packages = ["tinypkg"]', 'packages = ["src/tinypkg"]')
    (root / "pyproject.toml").write_text(text)
    builder = WheelBuilder(str(root))
    hook_of(builder, tmp_path / "dist").initialize("editable", fresh_build_data(builder))
    assert (root / "src" / "tinypkg" / "kernels" / EDITABLE_MARKER).is_file()
    assert not (root / "tinypkg").exists()


def test_editable_refuses_to_overwrite_a_directory_it_did_not_generate(tmp_path, build_env):
    root = small_project(tmp_path / "p")
    mine = root / "tinypkg" / "kernels"
    mine.mkdir()
    (mine / "handwritten.py").write_text("VALUE = 1\n")
    builder = WheelBuilder(str(root))
    with pytest.raises(SystemExit, match=r"editable install would overwrite .*kernels, which hatch-autotune did not generate"):
        hook_of(builder, tmp_path / "dist").initialize("editable", fresh_build_data(builder))
    assert sorted(p.name for p in mine.iterdir()) == ["handwritten.py"]  # untouched


def test_editable_without_the_parent_package_says_where_it_looked(tmp_path, build_env):
    root = small_project(tmp_path / "p")
    (root / "tinypkg" / "__init__.py").unlink()
    (root / "tinypkg").rmdir()
    builder = WheelBuilder(str(root))
    with pytest.raises(SystemExit, match="cannot find the source directory of package 'tinypkg'"):
        hook_of(builder, tmp_path / "dist").initialize("editable", fresh_build_data(builder))


def test_a_wheel_build_refuses_an_in_tree_generated_copy(tmp_path, build_env):
    root = small_project(tmp_path / "p")
    builder = WheelBuilder(str(root))
    hook_of(builder, tmp_path / "dist").initialize("editable", fresh_build_data(builder))
    build_data = fresh_build_data(builder)
    with pytest.raises(
        SystemExit, match="holds the generated package of an editable install, and a wheel built now would contain it twice"
    ):
        hook_of(builder, tmp_path / "dist").initialize("standard", build_data)
    assert build_data["force_include"] == {} and staged(build_env) == []
    shutil.rmtree(root / "tinypkg" / "kernels")  # what the message says to do
    hook = hook_of(builder, tmp_path / "dist")
    hook.initialize("standard", build_data)
    assert list(build_data["force_include"].values()) == ["tinypkg/kernels"]
    hook.finalize("standard", build_data, "x.whl")
