"""The build machine's GPUs, asked of the driver directly: the planner takes its target archs
from them when none are declared, and the tuner measures on them."""

from __future__ import annotations

from typing import Any, NamedTuple


class Gpu(NamedTuple):
    """One device of the build machine."""

    ordinal: int
    arch: str  # 'sm_90'
    name: str | None  # 'NVIDIA H100 80GB HBM3'; None where the driver would not say


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
