"""Which CUDA driver loads what: the oldest driver of each binary (a cubin: the first of its
NVRTC's major; PTX: the one whose JIT knows its ISA), of the installed cuda-bindings, and the
errors that name the driver or the bindings a user needs. The build writes the floors into the
table (wheel/table.py), the selection reads them (selection.choose_arch), the CUDA seam checks
the bindings against the driver at start."""

from __future__ import annotations

import re

from .errors import short_repr

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Mapping


# The first driver branch of each CUDA version (NVIDIA's CUDA toolkit release notes, table 3):
# what an error tells a user to install.
DRIVER_BRANCHES = {
    (12, 0): 525, (12, 1): 530, (12, 2): 535, (12, 3): 545, (12, 4): 550, (12, 5): 555,
    (12, 6): 560, (12, 8): 570, (12, 9): 575, (13, 0): 580, (13, 1): 590,
}  # fmt: skip


def cuda_version(text: str) -> tuple[int, int]:
    """'12.0' -> (12, 0): a CUDA version as the table writes a driver floor; ValueError otherwise."""
    m = re.fullmatch(r"([0-9]{1,3})\.([0-9]{1,3})", text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"not a CUDA version: {short_repr(text)} (expected 'MAJOR.MINOR', e.g. '12.0')")
    return int(m.group(1)), int(m.group(2))


def driver_words(version: tuple[int, int]) -> str:
    """'CUDA 13.0 (driver R580 or newer)': a CUDA driver version as a user installs it."""
    branch = DRIVER_BRANCHES.get((version[0], version[1]))
    return f"CUDA {version[0]}.{version[1]}" + (f" (driver R{branch} or newer)" if branch else "")


def driver_refusal(device_cc: tuple[int, int], driver: tuple[int, int], needs: Mapping[str, tuple[int, int]]) -> str:
    """Why no binary that runs on the device loads with this driver: each one's floor, the
    least upgrade that serves, and the two fixes (a newer driver, or a build for this one)."""
    least = min(needs.values())
    listing = ", ".join(f"{a} needs {driver_words(v)}" for a, v in sorted(needs.items()))
    fix = f"update the NVIDIA driver to {driver_words(least)}"
    if driver[0] == 12:
        fix += '; or ask for a wheel built with `min-cuda = "12"` (compiled by NVRTC 12, whose cubins load on every CUDA 12 driver)'
    if any(a.startswith("compute_") for a in needs):
        fix += (
            f"; or, for the PTX, a wheel built with an NVRTC no newer than the driver (pin nvidia-cuda-nvrtc=={driver[0]}.{driver[1]}.* "
            "in build-system.requires), or with this device's arch in `archs`"
        )
    return (
        f"no binary of this wheel that runs on a device of compute capability {device_cc[0]}.{device_cc[1]} loads with this driver, "
        f"CUDA {driver[0]}.{driver[1]}: {listing} (a cubin loads on drivers of the CUDA major of the NVRTC that made it or newer, "
        f"PTX on drivers as new as its ISA). Fixes: {fix}"
    )


def ptx_driver_needed(isa: str, nvrtc: str | None = None) -> tuple[int, int]:
    """The oldest CUDA driver (major, minor) that JIT-compiles PTX of ISA `isa` ('9.5').

    ISA 9.x came with CUDA 13.x, 8.0-8.5 with 12.0-12.5, 8.6-8.8 with 12.7-12.9, 7.x with
    11.x. For an ISA newer than this table, the NVRTC that wrote it is the safe answer."""
    major, minor = (int(p) for p in isa.split(".")[:2])
    if major == 9:
        return 13, minor
    if major == 8:
        return 12, minor if minor <= 5 else minor + 1
    if major == 7:
        return 11, minor
    if nvrtc:
        n_major, n_minor = (int(p) for p in nvrtc.split(".")[:2])
        return n_major, n_minor
    return major + 4, minor


# The oldest cuda-bindings of each major that the runtime supports (12.8: the first cuda-bindings
# 12 on PyPI), as a user's pin would say it.
BINDINGS_FOR_DRIVER = {12: "cuda-bindings>=12.8,<13", 13: "cuda-bindings>=13,<14"}


def installed_bindings() -> tuple[int, int] | None:
    """The installed cuda-bindings' (major, minor), from its version module (cheap: the driver
    module is imported anyway); None where it cannot be told."""
    try:
        from cuda.bindings import __version__
    except ImportError:
        return None
    m = re.match(r"(\d+)\.(\d+)", str(__version__))
    return (int(m.group(1)), int(m.group(2))) if m else None


def bindings_refusal(bindings: tuple[int, int], driver: tuple[int, int]) -> str | None:
    """Why cuda-bindings of version `bindings` cannot serve a driver of CUDA version `driver`
    (a major's bindings need a driver of that major: cuda-bindings 13 needs R580), with the pin
    that can; None when they can."""
    if bindings[0] <= driver[0]:
        return None
    pin = BINDINGS_FOR_DRIVER.get(driver[0])
    fix = f"install the bindings for this driver (pip install '{pin}')" if pin else "install cuda-bindings of this driver's major"
    return (
        f"cuda-bindings {bindings[0]}.{bindings[1]} needs a CUDA {bindings[0]} driver; this driver is CUDA {driver[0]}.{driver[1]}: "
        f"{fix}, or update the NVIDIA driver"
    )
