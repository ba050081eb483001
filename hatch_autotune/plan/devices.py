"""The build machine's GPUs, asked of the driver directly: the planner takes its target archs
from them when none are declared, and the tuner measures on them (`can_tune`, `tuning_gpus`:
which target archs a GPU measures, by the run-time rule of runtime/selection.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ..runtime.selection import as_compute_capability, binary_reason, runs_on

# What a GPU tunes: a target whose binary runs on it as the binary made for it (`binary_reason`):
# its own compute capability, plain or 'a', or a family target of its family. Not a plain target
# of an older minor: sm_80 runs on an 8.6 GPU, but its entries are the 8.0 GPU's (A100, not
# RTX 3090), and the lock would keep them as valid.
TUNES = ("exact", "arch-specific", "family")


class Gpu(NamedTuple):
    """One device of the build machine."""

    ordinal: int
    arch: str  # 'sm_90'
    name: str | None  # 'NVIDIA H100 80GB HBM3'; None where the driver would not say

    @property
    def cc(self) -> tuple[int, int]:
        return as_compute_capability(self.arch)

    def can_tune(self, target: str) -> bool:
        """Whether this GPU measures the entries of target arch `target`: a 9.0 GPU tunes sm_90 and
        sm_90a, a 10.3 one sm_103, sm_103a, sm_103f and sm_100f, but not sm_100a or sm_100."""
        return runs_on(target, self.cc) and binary_reason(target, self.cc) in TUNES


def tuning_gpus(target: str, gpus: Iterable[Gpu]) -> list[Gpu]:
    """The GPUs that tune `target`: of those that can (`Gpu.can_tune`), the ones of the compute
    capability nearest the target's (an sm_100f entry is measured on 10.0 GPUs when there are
    some, else on 10.3 ones), so that one target's buckets are measured on one kind of GPU."""
    able = [g for g in gpus if g.can_tune(target)]
    if not able:
        return []
    nearest = min(g.cc for g in able)
    return [g for g in able if g.cc == nearest]


def tunable_targets(targets: Sequence[str], gpus: Sequence[Gpu]) -> tuple[str, ...]:
    """The target archs some GPU here tunes, in the targets' order."""
    return tuple(t for t in targets if any(g.can_tune(t) for g in gpus))


def detect_gpus() -> list[Gpu]:
    """Every device of the build machine, by ordinal; [] when there is no usable GPU.

    Straight from the driver (cuInit, then attributes by ordinal: no context is created), so a
    builder with several kinds of GPU shows each, and any failure (no driver, no device, no
    cuda-python, an error code) means "no GPU here" rather than a failed build."""
    try:
        from cuda.bindings import driver

        ok = driver.CUresult.CUDA_SUCCESS
        (err,) = driver.cuInit(0)
        if err != ok:
            return []
        err, count = driver.cuDeviceGetCount()
        if err != ok:
            return []
        attr = driver.CUdevice_attribute
        gpus = []
        for ordinal in range(int(count)):
            err, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, ordinal)
            err2, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, ordinal)
            if err != ok or err2 != ok:
                return []
            gpus.append(Gpu(ordinal, f"sm_{int(major)}{int(minor)}", _device_name(driver, ordinal)))
    except Exception:  # no driver (cuda.pathfinder's DynamicLibNotFoundError), no cuda-python, ...
        return []
    return gpus


def _device_name(driver: Any, ordinal: int) -> str | None:
    """For messages only: a device whose name cannot be read is still a device."""
    try:
        err, raw = driver.cuDeviceGetName(256, ordinal)
    except Exception:
        return None
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    return bytes(raw).split(b"\0", 1)[0].decode(errors="replace").strip() or None


def detect_gpu_arch() -> str | None:
    """The arch of the build machine's first GPU, or None (for callers that use one device)."""
    gpus = detect_gpus()
    return gpus[0].arch if gpus else None
