"""What a block may ask of each arch, known at build time: the dynamic shared memory a block may
opt into (cuFuncSetAttribute MAX_DYNAMIC_SHARED_SIZE_BYTES up to the device's
MAX_SHARED_MEMORY_PER_BLOCK_OPTIN), and the oldest arch with thread-block clusters. The build
excludes a config that asks more at a point (plan/exclusions.py) before anything is compiled;
the tuner and the runtime check the device's own figure again."""

from __future__ import annotations

from ..runtime.selection import arch_number

# The per-block opt-in limit of dynamic shared memory in bytes, by compute capability
# (major * 10 + minor), from the CUDA C++ Programming Guide's table of technical specifications.
SHARED_OPTIN: dict[int, int] = {
    70: 98304,
    75: 65536,
    80: 166912,
    86: 101376,
    87: 166912,
    89: 101376,
    90: 232448,
    100: 232448,
    103: 232448,
    110: 232448,
    120: 101376,
    121: 101376,
}
# Without the opt-in, a block gets at most 48 KiB of shared memory (static and dynamic).
SHARED_DEFAULT = 48 * 1024
CLUSTER_MIN_ARCH = 90  # thread-block clusters: compute capability 9.0 and newer


def shared_optin_limit(arch: str | int) -> int:
    """The most dynamic shared memory a block may opt into on `arch` ('sm_80' or 80). An arch
    the table does not know takes the newest known one of its major not above it (else the
    oldest of its major); an unknown major, the newest known arch's."""
    number = arch if isinstance(arch, int) else arch_number(arch)
    if number in SHARED_OPTIN:
        return SHARED_OPTIN[number]
    same_major = sorted(n for n in SHARED_OPTIN if n // 10 == number // 10)
    if same_major:
        below = [n for n in same_major if n < number]
        return SHARED_OPTIN[below[-1] if below else same_major[0]]
    return SHARED_OPTIN[max(SHARED_OPTIN)]
