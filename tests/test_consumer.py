"""The consumer project of issue #12 (tests/consumers/stencil_kit: `#include`d helper headers,
caller-chosen constants, boolean tunables, a two-dimensional key) as its author ships it:
`pip wheel` with build isolation and hatch-autotune from its wheel, then installed in a fresh
virtual environment with only the run-time dependencies. No GPU: selections, signatures and the
checks before a launch are run; launching is not (tests/test_constants.py drives that through
the driver stand-in)."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from test_wheel import fresh_venv, pip_env, pip_into, run

pytestmark = pytest.mark.slow

CONSUMER = Path(__file__).parent / "consumers" / "stencil_kit"


@pytest.fixture(scope="module")
def stencil_wheel(plugin_dist, session_cache, tmp_path_factory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("stencil")
    src = tmp / "src"
    shutil.copytree(CONSUMER, src)
    env = pip_env(plugin_dist, session_cache, tmp)
    proc = run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp / "dist"), str(src)], env=env)
    (wheel,) = (tmp / "dist").glob("stencil_kit-*.whl")
    return wheel, proc.stdout + proc.stderr


def test_the_wheel_ships_each_instance_and_no_header(stencil_wheel):
    wheel, _log = stencil_wheel
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        table = json.loads(zf.read("stencil_kit/kernels/table.json"))
    assert not any(n.endswith(".cuh") or n.endswith(".j2") for n in names)  # headers are compiled in, not shipped
    stencil = table["kernels"]["stencil"]
    assert stencil["constants"] == [{"name": "RADIUS", "values": [1, 3]}, {"name": "PERIODIC", "values": [False, True]}]
    assert sorted(stencil["select"]) == [
        "PERIODIC=false,RADIUS=1",
        "PERIODIC=false,RADIUS=3",
        "PERIODIC=true,RADIUS=1",
        "PERIODIC=true,RADIUS=3",
    ]
    assert sorted(table["kernels"]["halo_sum"]["select"]) == ["RADIUS=2", "RADIUS=4"]


CHECK = textwrap.dedent(
    """
    import inspect, json
    from stencil_kit import kernels

    class Arr:  # a GPU array as far as the checks before a launch can tell
        def __init__(self, shape):
            self.__cuda_array_interface__ = {"shape": shape, "typestr": "<f4", "data": (1 << 40, False), "strides": None, "version": 3}

    out = {"signature": {k: str(inspect.signature(getattr(kernels, k))) for k in ("stencil", "halo_sum", "transpose")}}
    sels = {}
    for radius in (1, 3):
        for periodic in (False, True):
            s = kernels.stencil.select(arch="sm_90", n=5000, RADIUS=radius, PERIODIC=periodic)
            sels[f"{radius},{periodic}"] = [s.constants, s.config, s.bucket, s.tuned, s.arch, len(kernels.stencil.binary(s))]
    out["stencil"] = sels
    h = kernels.halo_sum.select(arch="sm_86", n=70000, RADIUS=4)
    out["halo_sum"] = [h.constants, h.bucket, h.arch, h.binary]
    t = kernels.transpose.select(arch="sm_120", rows=300, cols=5000)
    out["transpose"] = [t.config, t.bucket, t.binary]
    errors = {}
    for name, call in {
        "missing": lambda: kernels.stencil.select(arch="sm_90", n=5000, PERIODIC=True),
        "undeclared": lambda: kernels.halo_sum.select(arch="sm_90", n=5000, RADIUS=3),
        "shape": lambda: kernels.halo_sum(Arr((100,)), Arr((96,)), RADIUS=4),
        "right_call": lambda: kernels.halo_sum(Arr((100,)), Arr((96,)), RADIUS=2),
    }.items():
        try:
            call()
        except Exception as exc:
            errors[name] = [type(exc).__name__, str(exc)]
    out["errors"] = errors
    print(json.dumps(out))
    """
)


def test_installed_in_a_fresh_venv_it_selects_by_constant_and_checks_calls(stencil_wheel, tmp_path):
    py = fresh_venv(tmp_path / "venv")
    pip_into(py, str(stencil_wheel[0]))
    out = json.loads(run([str(py), "-c", CHECK], cwd=tmp_path).stdout)
    assert out["signature"] == {
        "stencil": "(x, y, *, RADIUS, PERIODIC, stream=None)",
        "halo_sum": "(x, y, *, RADIUS, stream=None)",
        "transpose": "(a, b, *, stream=None)",
    }
    for key, (constants, config, bucket, tuned, arch, size) in out["stencil"].items():
        radius, periodic = key.split(",")
        assert constants == {"RADIUS": int(radius), "PERIODIC": periodic == "True"}
        assert config == {"BLOCK": 256, "USE_SMEM": True} and bucket == {"n": 4096} and tuned is False and arch == "sm_90" and size > 0
    assert out["halo_sum"] == [{"RADIUS": 4}, {"n": 65536}, "sm_80", "sm_80"]
    assert out["transpose"] == [{"TILE": 32, "PAD": True}, {"rows": 256, "cols": 4096}, "compute_90"]
    errors = out["errors"]
    assert errors["missing"] == ["TypeError", "stencil.select() needs constant RADIUS= (one of [1, 3])"]
    assert errors["undeclared"] == ["ValueError", "halo_sum.select(): constant RADIUS=3; expected one of [2, 4]"]
    assert errors["shape"][0] == "ValueError" and "argument 'y' has shape (96,); expected (92,)" in errors["shape"][1]
    assert errors["right_call"][0] == "NoDriverError"  # every check passed; only the driver is missing here
