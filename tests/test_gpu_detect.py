"""Every GPU of the build machine, detected without a GPU: the functions of the real
cuda.bindings.driver module are replaced by small fakes that answer as a driver would.

Then: the archs a build targets without declared `archs`, which target archs the build tunes
(each on its own devices), and what it warns about."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import load_project, write_tiny_project
from cuda.bindings import driver
from cuda.pathfinder import DynamicLibNotFoundError

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.plan.devices import Gpu, detect_gpu_arch, detect_gpus
from hatch_autotune.plan.planner import resolve_archs
from hatch_autotune.tuning import TuningError, tune
from hatch_autotune.tuning.tuner import plan_tuning
from hatch_autotune.tuning.worker_client import WorkerClient

OK = driver.CUresult.CUDA_SUCCESS
MAJOR = driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
FAKE = [sys.executable, str(Path(__file__).with_name("fake_worker.py"))]
H100, L4, A100 = ("NVIDIA H100", (9, 0)), ("NVIDIA L4", (8, 9)), ("NVIDIA A100", (8, 0))


def fake_driver(monkeypatch, *devices: tuple[str, tuple[int, int]]) -> None:
    """A driver that reports `devices` (name, compute capability), by ordinal."""
    monkeypatch.setattr(driver, "cuInit", lambda flags: (OK,))
    monkeypatch.setattr(driver, "cuDeviceGetCount", lambda: (OK, len(devices)))

    def attribute(attrib, dev):
        major, minor = devices[int(dev)][1]
        return OK, major if attrib == MAJOR else minor

    monkeypatch.setattr(driver, "cuDeviceGetAttribute", attribute)
    monkeypatch.setattr(driver, "cuDeviceGetName", lambda length, dev: (OK, devices[int(dev)][0].encode().ljust(length, b"\0")))


def test_every_device_is_detected_with_its_arch(monkeypatch):
    fake_driver(monkeypatch, H100, L4)
    assert detect_gpus() == [Gpu(0, "sm_90", "NVIDIA H100"), Gpu(1, "sm_89", "NVIDIA L4")]
    assert detect_gpu_arch() == "sm_90"  # the first device, for callers that want one


def test_a_name_that_cannot_be_read_is_not_a_missing_gpu(monkeypatch):
    fake_driver(monkeypatch, L4)
    monkeypatch.setattr(driver, "cuDeviceGetName", lambda length, dev: (driver.CUresult.CUDA_ERROR_UNKNOWN, b""))
    assert detect_gpus() == [Gpu(0, "sm_89", None)]


def test_no_driver_no_device_or_any_error_means_no_gpu(monkeypatch):
    def no_driver(flags):  # what cuda-bindings raises on this machine: no libcuda at all
        raise DynamicLibNotFoundError('"cuda" is an NVIDIA driver library and can only be found via system search')

    monkeypatch.setattr(driver, "cuInit", no_driver)
    assert detect_gpus() == [] and detect_gpu_arch() is None
    monkeypatch.setattr(driver, "cuInit", lambda flags: (driver.CUresult.CUDA_ERROR_NO_DEVICE,))
    assert detect_gpus() == []
    fake_driver(monkeypatch, H100, L4)
    monkeypatch.setattr(driver, "cuDeviceGetCount", lambda: (OK, 0))
    assert detect_gpus() == []
    fake_driver(monkeypatch, H100, L4)
    monkeypatch.setattr(driver, "cuDeviceGetAttribute", lambda attrib, dev: (driver.CUresult.CUDA_ERROR_INVALID_DEVICE, 0))
    assert detect_gpus() == []


def undeclared(tmp_path: Path) -> Path:
    root = write_tiny_project(tmp_path / "p")
    text = (root / "pyproject.toml").read_text().replace('archs = ["sm_80", "sm_90"]\n', "")
    (root / "pyproject.toml").write_text(text)
    return root


def test_without_declared_archs_the_targets_are_every_gpus_arch(monkeypatch, tmp_path):
    fake_driver(monkeypatch, H100, L4, H100, ("NVIDIA B200", (10, 0)))
    project = load_project(undeclared(tmp_path))
    assert resolve_archs(project, detect_gpus()) == ("sm_89", "sm_90", "sm_100")  # sorted by arch, unique
    assert resolve_archs(load_project(write_tiny_project(tmp_path / "q")), detect_gpus()) == ("sm_80", "sm_90")  # declared win


def gpus(*devices: tuple[str, tuple[int, int]]) -> list[Gpu]:
    return [Gpu(i, f"sm_{cc[0]}{cc[1]}", name) for i, (name, cc) in enumerate(devices)]


def test_the_tuning_plan_takes_every_target_arch_with_a_device(tmp_path):
    declared = load_project(write_tiny_project(tmp_path / "p"))  # archs sm_80, sm_90
    plan = plan_tuning(declared, gpus(H100, L4), "auto")
    assert plan.archs == ("sm_90",)
    assert plan.warnings == (
        "no GPU here is sm_80: its entries are not tuned on this machine",
        "device 1 (NVIDIA L4, sm_89) is not of a target arch (sm_80, sm_90): not tuning on it",
    )
    assert plan_tuning(declared, gpus(H100, A100, H100), "tune") == plan_tuning(declared, gpus(A100, H100), "retune")
    assert plan_tuning(declared, gpus(H100, A100), "tune").archs == ("sm_80", "sm_90")
    assert plan_tuning(declared, gpus(H100, A100), "tune").warnings == ()
    assert plan_tuning(load_project(undeclared(tmp_path / "u")), gpus(H100, L4), "auto").archs == ("sm_89", "sm_90")

    # no device of a target arch: `auto` builds from the lock, saying why; `tune` refuses
    plan = plan_tuning(declared, gpus(L4), "auto")
    assert plan.archs == () and plan.warnings == (
        "no GPU here is of a target arch (sm_80, sm_90); devices: 0 (NVIDIA L4, sm_89); not tuning",
    )
    with pytest.raises(TuningError, match=r"no GPU here is of a target arch \(sm_80, sm_90\); devices: 0 \(NVIDIA L4, sm_89\)"):
        plan_tuning(declared, gpus(L4), "tune")
    # no GPU at all: `auto` quietly builds from the lock; `tune` and `retune` need one
    assert plan_tuning(declared, [], "auto").archs == () and plan_tuning(declared, [], "auto").warnings == ()
    for mode in ("tune", "retune"):
        with pytest.raises(TuningError, match="needs a CUDA GPU on this machine and none was found"):
            plan_tuning(declared, [], mode)


class ReportsCC(WorkerClient):
    """The stand-in worker, as device `device` of compute capability `cc` would answer."""

    def __init__(self, device: int, cc: tuple[int, int], log: Path):
        super().__init__(FAKE, env={**os.environ, "FAKE_WORKER": json.dumps({"log": str(log)})})
        self.cc = cc

    def request(self, message, timeout):
        reply = super().request(message, timeout)
        if message["op"] == "hello" and reply.get("ok"):
            reply["device"]["cc"] = list(self.cc)
        return reply


def test_tune_measures_each_target_arch_on_its_own_devices(monkeypatch, tmp_path):
    fake_driver(monkeypatch, H100, L4, A100)
    root = write_tiny_project(tmp_path / "p")
    ccs = {0: (9, 0), 1: (8, 9), 2: (8, 0)}
    logs: list[str] = []
    summary = tune(
        load_project(root),
        log=logs.append,
        client_factory=lambda d: ReportsCC(d, ccs[d], tmp_path / f"ops{d}.txt"),
        cache=CompileCache(tmp_path / "cache"),
    )
    assert sorted(eid for eid, _ in summary.tuned) == sorted(
        f"scale|-|{a}|n={n}" for a in ("sm_80", "sm_90") for n in (1024, 65536, 1048576)
    )
    assert [m for m in logs if m.startswith("warning:")] == [
        "warning: device 1 (NVIDIA L4, sm_89) is not of a target arch (sm_80, sm_90): not tuning on it"
    ]
    assert not any("not using it" in m for m in logs)  # no worker was started on a device of another arch
    assert "measure" in (tmp_path / "ops0.txt").read_text() and "measure" in (tmp_path / "ops2.txt").read_text()
    assert not (tmp_path / "ops1.txt").exists()
