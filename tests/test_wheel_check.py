"""benchmarks/wheel_check.py without a GPU: the requirement closure and the repacked wheels on
this environment's real distributions, the calls script over a host-memory stand-in of the
driver and of example_pkg's kernels, and the whole command failing clearly where no GPU answers.
The slow test runs the real isolated `pip wheel` of example_pkg from a wheelhouse of repacked
wheels (offline mode in place of auto: no GPU to tune on)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
from conftest import load_benchmark
from packaging.utils import parse_wheel_filename

from hatch_autotune.plan.devices import detect_gpu_arch

ROOT = Path(__file__).resolve().parents[1]
wc = load_benchmark("wheel_check")
no_gpu = pytest.mark.skipif(detect_gpu_arch() is not None, reason="checks wheel_check's behaviour without a GPU")


def test_a_subprocess_past_its_timeout_is_ended_with_its_children(tmp_path):
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $! > {pids}; echo started; wait"
    with pytest.raises(wc.CheckError, match=r"the sleeper ran past its 1 s timeout; its last lines:\nstarted"):
        wc.run(["bash", "-c", script], env=wc.clean_env(False), timeout=1, what="the sleeper")
    grandchild = int(pids.read_text())
    for _ in range(50):  # reaped by init once killed
        if not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split(")")[1][:3]:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the grandchild {grandchild} outlived the timeout")
    with pytest.raises(wc.CheckError, match=r"the failer failed \(exit 3\): bash -c echo oops; exit 3\noops"):
        wc.run(["bash", "-c", "echo oops; exit 3"], env=wc.clean_env(False), timeout=10, what="the failer")


# --------------------------------------------------------------------------------------------
# The closure


def test_closure_follows_requires_dist_and_records_who_required_what():
    closure = wc.resolve_closure([("jinja2>=3.1", "me")])
    assert set(closure) == {"jinja2", "markupsafe"}
    assert closure["jinja2"].source == closure["markupsafe"].source == "installed"
    assert closure["jinja2"].required_by == ["me"]
    assert closure["markupsafe"].required_by == [f"jinja2 {closure['jinja2'].version}"]


def test_closure_evaluates_markers_with_the_requested_extras():
    with_extra = wc.resolve_closure([("cuda-toolkit[nvrtc]==13.*", "me")])
    assert "nvidia-cuda-nvrtc" in with_extra
    assert with_extra["nvidia-cuda-nvrtc"].required_by == [f"cuda-toolkit {with_extra['cuda-toolkit'].version} [nvrtc]"]
    assert "nvidia-cublas" not in with_extra  # the `all` extra's, not requested
    assert set(wc.resolve_closure([("cuda-toolkit==13.*", "me")])) == {"cuda-toolkit"}
    # a root whose marker is false, and requirements of extras nobody asked for (jinja2[i18n]: Babel)
    assert set(wc.resolve_closure([("jinja2", "me"), ("tomli; python_version < '3.0'", "me")])) == {"jinja2", "markupsafe"}


def test_closure_refuses_an_unsatisfied_specifier_a_missing_distribution_and_a_conflict():
    with pytest.raises(wc.CheckError) as info:
        wc.resolve_closure([("jinja2", "the example"), ("numpy<1", "the example's dependencies")])
    text = str(info.value)
    assert "numpy<1" in text and "the example's dependencies" in text and "does not satisfy" in text

    with pytest.raises(wc.CheckError) as info:
        wc.resolve_closure([("jinja2", "me"), ("no-such-distribution-here>=1", "hatch-autotune 0.1.0")])
    text = str(info.value)
    assert "no-such-distribution-here>=1" in text and "hatch-autotune 0.1.0" in text and "not installed" in text

    with pytest.raises(wc.CheckError, match="conflicts with markupsafe"):
        wc.resolve_closure([("markupsafe>=2", "a"), ("markupsafe<2", "b")])


def fake_wheel(path: Path, name: str, version: str, requires: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
        zf.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_a_carried_wheel_provides_its_requirement_and_brings_its_own(tmp_path):
    good = fake_wheel(tmp_path / "carried_thing-1.0-py3-none-any.whl", "carried-thing", "1.0", ["markupsafe>=2"])
    foreign = fake_wheel(tmp_path / "jinja2-99.0-cp27-cp27m-win32.whl", "jinja2", "99.0", [])  # not for this interpreter
    wheels = wc.wheel_providers([good, foreign], "carried")
    assert set(wheels) == {"carried-thing"}
    closure = wc.resolve_closure([("carried-thing>=1", "me"), ("jinja2", "me")], wheels)
    assert closure["carried-thing"].source == "carried" and closure["carried-thing"].wheel == good
    assert closure["markupsafe"].source == "installed"
    assert closure["markupsafe"].required_by == ["carried-thing 1.0", f"jinja2 {closure['jinja2'].version}"]
    # a carried wheel that does not satisfy the specifier is not used; nor is anything else here
    with pytest.raises(wc.CheckError, match=r"carried-thing>=2 .*the wheels offer carried-thing 1\.0"):
        wc.resolve_closure([("carried-thing>=2", "me")], wheels)


# --------------------------------------------------------------------------------------------
# Repacked wheels


def check_record(whl: Path) -> None:
    """Every file of the wheel in its RECORD with the right sha256 and size, and nothing else."""
    with zipfile.ZipFile(whl) as zf:
        names = zf.namelist()
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
        assert sorted(r[0] for r in rows) == sorted(names)
        for path, digest, size in rows:
            if path == record_name:
                assert digest == size == ""
                continue
            data = zf.read(path)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode(), path
            assert int(size) == len(data), path
        assert zf.getinfo(names[0]).compress_type == zipfile.ZIP_STORED


def test_repacked_wheels_install_with_pip_into_a_fresh_venv(tmp_path):
    import importlib.metadata as md

    house = tmp_path / "house"
    house.mkdir()
    wheels = [wc.repack_installed(md.distribution(n), house) for n in ("jinja2", "markupsafe")]
    for whl in wheels:
        check_record(whl)
        name, version, _, tags = parse_wheel_filename(whl.name)
        assert str(version) == md.distribution(str(name)).version and tags
        with zipfile.ZipFile(whl) as zf:
            assert not [n for n in zf.namelist() if "__pycache__" in n or n.endswith((".pyc", "INSTALLER", "direct_url.json"))]
    assert wheels[1].name.startswith("markupsafe-") and "-cp3" in wheels[1].name  # its C speedups: a binary wheel's tags

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    env = wc.clean_env(keep_pythonpath=False)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-index", "--find-links", str(house), "jinja2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = subprocess.run(
        [
            str(py),
            "-c",
            "import jinja2, markupsafe._speedups as s; print(jinja2.Template('{{ x }}!').render(x=s.__name__)); print(s.__file__)",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert out[0] == "markupsafe._speedups!" and out[1].startswith(str(venv))


def test_wheel_tag_keeps_every_tag_of_the_installed_wheel():
    import importlib.metadata as md

    # cuda-toolkit's WHEEL says py2-none-any first: that alone would be a wheel pip skips on Python 3
    pythons = wc.wheel_tag(md.distribution("cuda-toolkit")).split("-")[0].split(".")
    assert "py3" in pythons, pythons
    assert wc.wheel_tag(md.distribution("jinja2")) == "py3-none-any"


# --------------------------------------------------------------------------------------------
# The calls script, over a host-memory stand-in of the driver and of the generated kernels

FAKE_DRIVER = '''
"""cuda.bindings.driver's calls that wheel_check's calls script makes, over host memory."""
import ctypes

class CUresult:
    CUDA_SUCCESS = 0

_buffers = {}

def cuInit(flags): return (0,)
def cuDeviceGet(i): return (0, 0)
def cuDevicePrimaryCtxRetain(dev): return (0, 1)
def cuDevicePrimaryCtxRelease(dev): return (0,)
def cuCtxSetCurrent(ctx): return (0,)
def cuCtxSynchronize(): return (0,)
def cuDeviceGetName(n, dev): return (0, b"Host stand-in" + bytes(n - 13))
def cuGetErrorName(err): return (0, b"CUDA_ERROR_STANDIN")
def cuMemAlloc(n):
    buf = ctypes.create_string_buffer(n)
    _buffers[ctypes.addressof(buf)] = buf
    return (0, ctypes.addressof(buf))
def cuMemFree(ptr):
    del _buffers[ptr]
    return (0,)
def cuMemcpyHtoD(dst, src, n):
    ctypes.memmove(dst, src, n)
    return (0,)
def cuMemcpyDtoH(dst, src, n):
    ctypes.memmove(dst, src, n)
    return (0,)
'''

FAKE_KERNELS = '''
"""example_pkg's three kernels in NumPy, on __cuda_array_interface__ arrays in host memory.
FAKE_KERNEL_BUG=tail: the last element is never written; =untuned: selections say untuned."""
import ctypes, os
from types import SimpleNamespace
import numpy as np

BUG = os.environ.get("FAKE_KERNEL_BUG", "")

def view(arr):
    cai = arr.__cuda_array_interface__
    assert cai["version"] == 3 and cai["strides"] is None and cai["data"][1] is False and "stream" in cai
    dtype = np.dtype(cai["typestr"])
    n = int(np.prod(cai["shape"])) * dtype.itemsize
    return np.frombuffer((ctypes.c_char * n).from_address(cai["data"][0]), dtype).reshape(cai["shape"])

def store(out, value):
    flat, src = out.reshape(-1), value.reshape(-1).astype(out.dtype)
    end = flat.size - 1 if BUG == "tail" else flat.size
    flat[:end] = src[:end]

class Kernel:
    def __init__(self, fn):
        self.fn = fn
    def __call__(self, *args, stream=None):
        self.fn(*args)
    def select(self, arch=None, **key):
        return SimpleNamespace(tuned=BUG != "untuned", arch="sm_90", binary="sm_90", config={"BLOCK": 128}, bucket=key)

def _saxpy(a, x, y):
    store(view(y), np.float32(a) * view(x).astype(np.float32) + view(y).astype(np.float32))

def _softmax(x, y):
    v = view(x)
    e = np.exp(v - v.max(axis=1, keepdims=True))
    store(view(y), e / e.sum(axis=1, keepdims=True))

def _sgemm(A, B, C):
    store(view(C), view(A) @ view(B))

saxpy, row_softmax, sgemm = Kernel(_saxpy), Kernel(_softmax), Kernel(_sgemm)
'''


@pytest.fixture(scope="module")
def standin_venv(tmp_path_factory) -> Path:
    """A venv whose site-packages hold stand-ins of cuda.bindings.driver and example_pkg.kernels,
    and see this environment's NumPy (a .pth line)."""
    venv = tmp_path_factory.mktemp("standin") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(
        subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for rel, text in {
        "cuda/__init__.py": "",
        "cuda/bindings/__init__.py": "",
        "cuda/bindings/driver.py": FAKE_DRIVER,
        "example_pkg/__init__.py": "",
        "example_pkg/kernels.py": FAKE_KERNELS,
    }.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(textwrap.dedent(text))
    (site / "dev_numpy.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


def test_calls_script_checks_every_case_against_numpy(standin_venv, tmp_path):
    info = wc.run_calls(standin_venv, tmp_path, 120)
    calls = info["calls"]
    assert info["device"] == "Host stand-in"
    assert len(calls) == sum(len(v) for v in wc.CASES.values()) == 15
    assert all(c["ok"] and c["nonfinite"] == 0 and c["rel_err"] <= c["tol"] and c["selection"]["tuned"] for c in calls), calls
    half = [c for c in calls if c["dtype"] == "float16"]
    assert len(half) == 4 and all(c["rel_err"] > 1e-5 for c in half if c["sizes"]["n"] > 1)  # float16 rounding shows
    assert [c["sizes"] for c in calls if c["kernel"] == "sgemm"] == [
        {"m": 127, "n": 255, "k": 33},
        {"m": 1000, "n": 513, "k": 257},
        {"m": 64, "n": 64, "k": 4096},
    ]


@pytest.mark.parametrize("bug, says", [("tail", "non-finite|rel err"), ("untuned", "not tuned")])
def test_calls_script_fails_on_an_unwritten_element_or_an_untuned_selection(standin_venv, tmp_path, monkeypatch, bug, says):
    monkeypatch.setenv("FAKE_KERNEL_BUG", bug)
    with pytest.raises(wc.CheckError, match=says) as info:
        wc.run_calls(standin_venv, tmp_path, 120)
    assert str(info.value).startswith("15 of 15 calls failed, 15 expected to pass; the first: FAILED saxpy float32 {'n': 1}")


# --------------------------------------------------------------------------------------------
# The command, and the real isolated build without a GPU


def fake_build(tuned_arch: str | None):
    """build_example's stand-in: a wheel whose outcome.json has 30 entries per arch of example_pkg
    (those of `tuned_arch` and its `a` target tuned, the rest default), the matching log line,
    and the lock tuning writes."""

    def build_example(src: Path, house: Path, out: Path, cache: Path, timeout: float, mode: str = "auto"):
        tuned_archs = (tuned_arch, f"{tuned_arch}a") if tuned_arch else ()
        entries = [
            {"id": f"k|-|{arch}|n={i}", "status": "tuned" if arch in tuned_archs else "default", "config": {}, "reason": ""}
            for arch in ("sm_80", "sm_90", "sm_90a")
            for i in range(30)
        ]
        wheel = out / "example_pkg-0.1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr("example_pkg/kernels/outcome.json", json.dumps({"entries": entries}))
        tuned = [e["id"] for e in entries if e["status"] == "tuned"]
        if tuned:
            (src / "autotune.lock.json").write_text(json.dumps({"schema": 1, "entries": {eid: {} for eid in tuned}}))
        text = f"  hatch-autotune: {len(entries)} entries: {len(tuned)} tuned, {90 - len(tuned)} on the default config\n"
        return wheel, text, 12.34

    return build_example


@pytest.fixture
def steps_stood_in(monkeypatch, tmp_path):
    """main()'s steps over stand-ins that succeed: what main adds (order, checks of the build's
    counts and lock, the JSON and the summary line) runs for real."""
    monkeypatch.setattr(wc, "probe_gpu", lambda: {"device": "Stand-in H200", "arch": "sm_90", "devices": 1})
    monkeypatch.setattr(
        wc, "build_plugin", lambda house, work, timeout: fake_wheel(house / "hatch_autotune-0.1.0-py3-none-any.whl", "x", "1", [])
    )
    monkeypatch.setattr(wc, "make_house", lambda house, wheels, plugin: {"carried": [], "repacked": [], "repacked_mib": 0.0, "closure": []})
    monkeypatch.setattr(wc, "build_example", fake_build("sm_90"))
    packages = {"example-pkg": "0.1.0", "numpy": "2.0"}
    monkeypatch.setattr(wc, "install_venv", lambda venv, house, wheel, timeout: {"packages": packages, "pip_install": "--python"})
    calls = [{"kernel": "saxpy", "ok": True}] * 15
    monkeypatch.setattr(wc, "run_calls", lambda venv, work, timeout: {"device": "Stand-in H200", "kernels_file": "k", "calls": calls})


def test_main_passes_when_every_step_passes(steps_stood_in, tmp_path, capsys):
    out, lock = tmp_path / "r.json", tmp_path / "kept" / "lock.json"
    assert wc.main(["--wheels", str(tmp_path), "--out", str(out), "--work", str(tmp_path / "w"), "--keep-lock", str(lock)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == (
        "wheel_check: ok: example_pkg built with isolation in 12.3 s, 60 entries tuned for sm_90, sm_90a and 30 on the default config; "
        "15 of 15 calls match NumPy in a fresh venv of 2 packages on Stand-in H200"
    )
    result = json.loads(out.read_text())
    assert result["ok"] is True and result["failed_step"] is None and list(result["steps"]) == list(wc.STEPS)
    assert result["machine"]["commit"] and "gpu" in result["machine"]  # the machine and code, as every benchmark says
    assert (result["build_wall_s"], result["tuned"], result["default"], result["lock_entries"]) == (12.3, 60, 30, 60)
    assert result["steps"]["build"]["by_arch"] == {"sm_80": {"default": 30}, "sm_90": {"tuned": 30}, "sm_90a": {"tuned": 30}}
    assert result["steps"]["plugin"]["build_isolation"] is False and len(result["calls"]) == 15
    assert len(json.loads(lock.read_text())["entries"]) == 60


@pytest.mark.parametrize(
    "tuned_arch, says",
    [(None, "the build tuned nothing"), ("sm_80", "expected tuned entries for the archs that run on the GPU (sm_90, sm_90a) only")],
)
def test_main_fails_at_the_build_when_it_did_not_tune_for_the_gpu(steps_stood_in, monkeypatch, tmp_path, capsys, tuned_arch, says):
    monkeypatch.setattr(wc, "build_example", fake_build(tuned_arch))
    out = tmp_path / "r.json"
    assert wc.main(["--wheels", str(tmp_path), "--out", str(out), "--work", str(tmp_path / "w")]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(f"wheel_check: FAILED at step build: {says}")
    result = json.loads(out.read_text())
    assert result["failed_step"] == "build" and says in result["steps"]["build"]["error"]
    assert result["not_run"] == ["venv", "calls"] and result["steps"]["plugin"]["ok"] is True


@no_gpu
def test_the_command_without_a_gpu_fails_at_its_first_step_and_says_why(tmp_path):
    out = tmp_path / "deep" / "result.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "wheel_check.py"), "--wheels", str(tmp_path / "none"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("wheel_check: FAILED at step gpu: no CUDA GPU answers"), proc.stdout
    result = json.loads(out.read_text())
    assert result["schema"] == 1 and result["ok"] is False and result["failed_step"] == "gpu"
    assert result["steps"]["gpu"]["ok"] is False and "needs one" in result["steps"]["gpu"]["error"]
    assert result["not_run"] == ["plugin", "wheelhouse", "build", "venv", "calls"]
    assert result["calls"] == [] and result["tuned"] is None


@pytest.mark.slow
@no_gpu
def test_isolated_build_from_a_repacked_wheelhouse_then_a_runtime_only_venv(tmp_path):
    """The real steps plugin, wheelhouse, build (offline: nothing to tune on), venv; then the
    calls, which fail without a driver instead of passing."""
    house = tmp_path / "house"
    house.mkdir()
    plugin = wc.build_plugin(house, tmp_path, 240)
    info = wc.make_house(house, tmp_path / "nothing-carried", plugin)
    sources = {p["name"]: p["source"] for p in info["closure"]}
    assert sources["hatch-autotune"] == "built" and sources["hatchling"] == "installed"
    assert {"nvidia-cuda-nvrtc", "markupsafe", "cuda-pathfinder", "pathspec"} <= set(sources)
    for whl in house.glob("*.whl"):
        if whl != plugin:
            check_record(whl)

    src, out, cache = tmp_path / "src", tmp_path / "out", tmp_path / "cache"
    shutil.copytree(ROOT / "example_pkg", src, ignore=shutil.ignore_patterns("dist", "kernels", "__pycache__", "build"))
    (src / "autotune.lock.json").unlink()
    out.mkdir()
    wheel, text, _wall = wc.build_example(src, house, out, cache, 600, mode="offline")
    assert "Installing build dependencies: finished with status 'done'" in text and "hatch_autotune-0.1.0" in text
    counts = wc.build_counts(wheel, text)
    assert (counts["entries"], counts["tuned"], counts["default"]) == (
        426,
        0,
        426,
    )  # 30 FP32 ones, 112 of the tensor-core kernels, per arch
    assert counts["by_arch"] == {"sm_80": {"default": 142}, "sm_90": {"default": 142}, "sm_90a": {"default": 142}}
    with pytest.raises(wc.CheckError, match="tuned nothing"):
        wc.check_tuned(counts, ["sm_80", "sm_90", "sm_90a"], "sm_90")

    venv = tmp_path / "venv"
    listing = wc.install_venv(venv, house, wheel, 240)
    assert set(listing["packages"]) == {
        "example-pkg",
        "numpy",
        "cuda-bindings",
        "cuda-pathfinder",
    }  # cuda-bindings (and its cuda-pathfinder) for the calls script's memory only; no cuda-core
    with pytest.raises(wc.CheckError, match="kernel calls in the fresh venv failed"):
        wc.run_calls(venv, tmp_path, 120)
