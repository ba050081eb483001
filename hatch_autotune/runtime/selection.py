"""Selection: which bucket a run-time key falls into (`map_to_bucket`), which binary of a wheel
serves a device (`choose_arch`, and the driver a PTX needs), and a kernel's choice of variant
(`KernelSelector`: its `select()` answers a `Selection`; `Binaries` finds the compiled code). The
build side plans with the same functions, so there is one copy."""

from __future__ import annotations

import re

from .cuda_seam import current_device
from .drivers import driver_refusal
from .errors import DriverTooOldError, ExpressionError, short_repr
from .expr import compile_expr, tree_text
from .pins import TUNED, PinError, Pins, pinned_variant
from .record import Record
from .scalars import as_constant
from .values import MAX_SIZE, instance_env, types_key

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from .table import KernelTable, Variant

MAPPINGS = ("nearest", "floor", "ceil", "exact")


def map_to_bucket(value: int, buckets: Sequence[int], mapping: str = "nearest", dim: str = "key") -> int:
    """The bucket a run-time key value falls into; values outside the range clamp to the ends.

    ``nearest`` is nearest in log2 (ties go to the smaller bucket), ``floor`` the largest bucket
    not above the value, ``ceil`` the smallest not below it, ``exact`` only a declared bucket.
    """
    if mapping == "exact":
        if value in buckets:
            return value
        raise ValueError(f"{dim}={value} is not one of the exact buckets {list(buckets)}")
    if value <= buckets[0]:
        return buckets[0]
    if value >= buckets[-1]:
        return buckets[-1]
    lo = max(b for b in buckets if b <= value)
    if lo == value:
        return lo
    hi = min(b for b in buckets if b > value)
    if mapping == "floor":
        return lo
    if mapping == "ceil":
        return hi
    if mapping != "nearest":
        raise ValueError(f"unknown bucket mapping {mapping!r} for {dim}; expected one of {MAPPINGS}")
    from math import log2  # here, not at import: an extension module that importing needs not load

    lv = log2(value)
    return lo if (lv - log2(lo)) <= (log2(hi) - lv) else hi


# fullmatch: no trailing newline. A pattern, not compiled here: re caches it at the first use,
# and compiling costs a tenth of a millisecond of an import that needs no arch.
_ARCH_PATTERN = r"(sm|compute)_([0-9]+)([0-9])([af]?)"


MIN_SM = 75  # the oldest arch NVRTC 13 targets (sm_75): no build can serve an older GPU
# The oldest arch NVRTC takes each suffix for (NVRTC 13.5 compiles sm_90a but not sm_80a, and
# sm_100f but not sm_90f): 'a' is arch-specific (exactly that compute capability), 'f' the family
# (the same major, that minor or a newer one).
SUFFIX_FLOOR = {"a": 90, "f": 100}

# Why a binary serves a device, most specific first (`binary_reason`; `Selection.reason`)
REASONS = ("exact", "arch-specific", "family", "same-major older minor", "PTX JIT")


def parse_arch(arch: str) -> tuple[str, int, int, str]:
    """'sm_90a' -> ('sm', 9, 0, 'a'); 'compute_80' -> ('compute', 8, 0, '')."""
    m = re.fullmatch(_ARCH_PATTERN, arch) if isinstance(arch, str) else None
    if not m:
        raise ValueError(f"not a CUDA arch: {arch!r} (expected e.g. 'sm_90', 'sm_90a', 'sm_100f' or 'compute_90')")
    return m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)


def runs_on(arch: str, device_cc: tuple[int, int]) -> bool:
    """Whether a binary of `arch` runs on a device, by NVIDIA's rules: 'a' only on exactly its
    compute capability; 'f' and a plain cubin on the same major with a minor not above the
    device's; plain PTX on any device not older than it (JIT). The one copy of the rule: the
    run-time choice and the build's choice of tuning devices both ask it."""
    kind, major, minor, suffix = parse_arch(arch)
    if suffix == "a":
        return (major, minor) == tuple(device_cc)
    if suffix == "f" or kind == "sm":
        return major == device_cc[0] and minor <= device_cc[1]
    return (major, minor) <= tuple(device_cc)


def runs_where(arch: str) -> str:
    """Where a binary of `arch` runs (`runs_on`), in words for `show`: 'sm_90a: 9.0 only
    (arch-specific)', 'sm_100f: 10.0 and later 10.x (family)', 'compute_90: 9.0 and later (PTX JIT)'."""
    kind, major, minor, suffix = parse_arch(arch)
    if suffix == "a":
        where = f"{major}.{minor} only"
    elif suffix == "f" or kind == "sm":
        where = f"{major}.{minor} and later {major}.x"
    else:
        where = f"{major}.{minor} and later"
    tags = [{"a": "arch-specific", "f": "family"}.get(suffix, ""), "PTX JIT" if kind == "compute" else ""]
    return f"{arch}: {where}" + (f" ({', '.join(t for t in tags if t)})" if any(tags) else "")


def binary_reason(binary: str, device_cc: tuple[int, int]) -> str:
    """Why `binary` (one that runs there) serves the device, one of REASONS: 'exact' (a plain
    cubin of its compute capability), 'arch-specific' (sm_90a on 9.0), 'family' (sm_100f on 10.3),
    'same-major older minor' (sm_80 on 8.6) or 'PTX JIT'."""
    kind, major, minor, suffix = parse_arch(binary)
    if kind == "compute":
        return "PTX JIT"
    if suffix == "a":
        return "arch-specific"
    if suffix == "f":
        return "family"
    return "exact" if (major, minor) == tuple(device_cc) else "same-major older minor"


def _rank(arch: str) -> tuple[int, int, int]:
    """Preference among the binaries that run on a device: the newest minor first (a binary made
    for exactly the device's compute capability before one for an older minor, as DESIGN.md's
    fallback order says), and at the same minor arch-specific > family > plain."""
    _, major, minor, suffix = parse_arch(arch)
    return (major, minor, {"a": 2, "f": 1}.get(suffix, 0))


def as_compute_capability(arch: Any) -> tuple[int, int]:
    """Accepts 'sm_86', '8.6', 86, (8, 6) and returns (8, 6); ValueError for what no GPU has
    (a major below 1 or above 99, a minor above 9: -1 is not 'sm_-19')."""
    if isinstance(arch, tuple) and len(arch) == 2 and all(type(v) is int for v in arch):
        cc = arch
    elif isinstance(arch, int) and not isinstance(arch, bool):
        cc = (arch // 10, arch % 10) if arch >= 0 else (-1, 0)
    elif isinstance(arch, str):
        if re.fullmatch(r"[0-9]{1,2}\.[0-9]", arch):
            major_text, minor_text = arch.split(".")
            cc = (int(major_text), int(minor_text))
        else:
            _, major, minor, _ = parse_arch(arch)
            cc = (major, minor)
    else:
        raise TypeError(f"arch: expected 'sm_XY', 'X.Y', an int XY or a (major, minor) tuple, got {short_repr(arch)}")
    if not (1 <= cc[0] <= 99 and 0 <= cc[1] <= 9):
        raise ValueError(f"arch: {short_repr(arch)} is not a compute capability (expected e.g. 'sm_90', '9.0', 90 or (9, 0))")
    return cc


def choose_arch(
    device_cc: tuple[int, int],
    cubin_archs: Sequence[str],
    ptx_archs: Sequence[str],
    driver: tuple[int, int] | None = None,
    floors: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[str, str]:
    """Pick the binary for a device: (arch of the binary, 'cubin' or 'ptx').

    Of the cubins that run on it (`runs_on`), the one of the newest minor (its own compute
    capability's first), and of that minor the most specific (arch-specific, then family, then
    plain): on 10.3, sm_103a > sm_103f > sm_103 > sm_100f > sm_100; else the PTX that runs (JIT),
    in the same order; else an error naming the device's arch, the wheel's archs and the fix.
    With the `driver`'s CUDA version (major, minor), a binary whose floor (`floors`: binary arch
    -> the oldest driver that loads it) is newer is skipped; where only such binaries run on the
    device, the error names the driver they need (DriverTooOldError).
    """
    major, minor = device_cc
    loads = (lambda a: True) if driver is None or not floors else (lambda a: floors.get(a, (0, 0)) <= driver)
    cubins = [a for a in cubin_archs if runs_on(a, device_cc)]
    usable = [a for a in ptx_archs if runs_on(a, device_cc)]
    if any(map(loads, cubins)):
        return max(filter(loads, cubins), key=_rank), "cubin"
    if any(map(loads, usable)):
        return max(filter(loads, usable), key=_rank), "ptx"
    if cubins or usable:
        assert driver is not None and floors is not None  # only a driver's floor stops a binary that runs there
        raise DriverTooOldError(driver_refusal(device_cc, driver, {a: floors[a] for a in [*cubins, *usable]}))
    fix = (
        f"rebuild the wheel with sm_{major}{minor} in `archs`"
        if major * 10 + minor >= MIN_SM
        else f"no wheel can: NVRTC 13, which hatch-autotune builds with, targets sm_{MIN_SM} and newer, so kernels "
        f"of such a wheel need a GPU of compute capability {MIN_SM // 10}.{MIN_SM % 10} or newer"
    )
    if any(parse_arch(a)[1] == major and parse_arch(a)[3] for a in [*cubin_archs, *ptx_archs]):  # why its own major's did not run
        fix += " (an 'a' binary runs only on its own compute capability, an 'f' one on its major with a minor not below its own)"
    raise RuntimeError(
        f"no binary in this wheel runs on a device of compute capability {major}.{minor} "
        f"(sm_{major}{minor}): it has cubins for {', '.join(cubin_archs) or 'no arch'} and PTX for "
        f"{', '.join(ptx_archs) or 'no arch'}; {fix}"
    )


class Selection(Record):
    """What `Kernel.select` answers: which variant runs, with which config, and why."""

    __slots__ = ("kernel", "variant", "config", "types", "constants", "bucket", "tuned", "arch", "binary", "reason", "pinned")
    kernel: str
    variant: str
    config: Mapping[str, Any]
    types: Mapping[str, str]  # type parameter -> dtype
    constants: Mapping[str, Any]  # caller-chosen constant -> its value
    bucket: Mapping[str, int]
    tuned: bool
    arch: str  # the table arch whose choice this is (e.g. 'sm_80' on an sm_86 device)
    binary: str  # the binary that runs: 'sm_80' (cubin) or 'compute_90' (PTX, JIT-compiled)
    reason: str  # why that binary serves the device, one of REASONS (binary_reason): 'family', ...
    pinned: str  # the run-time pin in force ('HATCH_AUTOTUNE_PIN gemm=default', 'gemm.pin()'), or ''


class Binaries:
    """What a kernel needs to find its compiled code: which binary serves a device, and the
    bytes of a binary. The wheel's `Library` is one; the tuning worker brings its own."""

    cubin_archs: Sequence[str] = ()  # the archs that have cubins (for error messages)

    def binary_for(self, cc: tuple[int, int], driver: tuple[int, int] | None = None) -> tuple[str, str]:
        """(table arch, binary arch) for a compute capability: ('sm_80', 'sm_80') runs a cubin,
        ('sm_90', 'compute_90') JIT-compiles the PTX made from sm_90's winners. With the
        driver's CUDA version, only binaries that driver loads (DriverTooOldError if none)."""
        raise NotImplementedError

    def read(self, table: KernelTable, variant: str, binary: str) -> bytes:
        """The bytes of `variant`'s binary for arch `binary` (e.g. 'sm_90' or 'compute_90')."""
        raise NotImplementedError


class KernelSelector:
    """A kernel's choice of variant: the type instance and constants of a call or a `select()`,
    the bucket of its key, and the table's entry for the device's arch."""

    def __init__(self, table: KernelTable, binaries: Binaries):
        self.table = table
        self.decl = decl = table.decl
        self.name = decl.name
        self.binaries = binaries
        self.key_names = tuple(k.name for k in decl.key)
        # The constraints that read key dims, checked at a call's own sizes: a bucket's config was
        # chosen where they hold at the bucket's value, and a call mapped to it may have others.
        self._key_checks = tuple((tree_text(t), compile_expr(t)) for t in decl.key_constraints)
        self.pins = Pins(self.name)  # run-time pins (pins.py): Library sets the environment's

    def variant(self, vid: str) -> Variant:
        return self.table.variants[vid]

    @property
    def buckets(self) -> dict[str, list[int]]:
        return {k.name: list(k.buckets) for k in self.decl.key}

    @property
    def provenance(self) -> dict[str, Any]:
        """Per (types, arch, bucket): the variant, tuned or default, and where it was tuned."""
        out: dict[str, Any] = {}
        for tkey, arch, e in self.table.entries():
            label = " ".join(f"{n}={b}" for n, b in zip(self.key_names, e.bucket))
            out[f"{tkey} {arch} {label}"] = {"variant": e.variant, "tuned": e.tuned, "provenance": e.provenance_json()}
        return out

    def resolve_constants(self, given: dict[str, Any], where: str) -> dict[str, Any]:
        """Each constant's value: given by keyword (taken out of `given`), exactly one of the
        declared values (an int for an integer constant, a bool for a boolean one), or the
        only declared value when it has one."""
        out: dict[str, Any] = {}
        for c, allowed in self.decl.constants.items():
            if c not in given:
                if len(allowed) != 1:
                    raise TypeError(f"{where} needs constant {c}= (one of {list(allowed)!r})")
                out[c] = allowed[0]
                continue
            value = given.pop(c)
            kind = bool if type(allowed[0]) is bool else int
            exact = as_constant(value, kind)
            if exact is None or exact not in allowed:
                raise ValueError(f"{where}: constant {c}={short_repr(value)}; expected one of {list(allowed)!r}")
            out[c] = exact
        return out

    def _resolve_instance(self, given: dict[str, Any]) -> dict[str, Any]:
        types: dict[str, Any] = {}
        for tp, allowed in self.decl.type_params.items():
            if tp in given:
                value = str(given.pop(tp))
                if value not in allowed:
                    raise ValueError(f"{self.name}: type parameter {tp}={value!r}; expected one of {list(allowed)}")
                types[tp] = value
            elif len(allowed) == 1:
                types[tp] = allowed[0]
            else:
                raise TypeError(f"{self.name}.select() needs type parameter {tp}= (one of {list(allowed)})")
        types.update(self.resolve_constants(given, f"{self.name}.select()"))
        return types

    def select(self, arch: Any, extra: tuple[Any, ...], key: Mapping[str, Any]) -> Selection:
        """Kernel.select: the variant for key dims (and type parameters and constants) on an arch."""
        if extra:
            names = [*self.key_names, *self.decl.type_params, *self.decl.constants]
            raise TypeError(
                f"{self.name}.select() takes one positional argument (arch), got {1 + len(extra)}; "
                f"key dims, type parameters and constants are passed by keyword ({', '.join(f'{n}=' for n in names)})"
            )
        given = dict(key)
        types = self._resolve_instance(given)
        missing = [n for n in self.key_names if n not in given]
        unknown = sorted(set(given) - set(self.key_names))
        if unknown:
            raise TypeError(f"{self.name}.select(): unknown key {unknown}; the key dims are {list(self.key_names)}")
        if missing:
            raise TypeError(f"{self.name}.select(): missing key dim(s) {missing}")
        for n in self.key_names:
            value = given[n]
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{self.name}.select(): key dim {n} must be an int, got {short_repr(value)}")
            if not 1 <= value <= MAX_SIZE:
                raise ValueError(
                    f"{self.name}.select(): key dim {n}={short_repr(value)} is not a problem size: expected 1 to {MAX_SIZE}"
                    + (" (a call with an empty array launches nothing, so nothing is selected)" if value == 0 else "")
                )
        bucket = self.bucket(given)  # a miss of an exact key is said before the device is asked
        if arch is not None:  # a question about an arch: answered for a driver new enough for every binary
            return self.selection(as_compute_capability(arch), types, given, bucket)
        cc, driver = current_device()
        return self.selection(cc, types, given, bucket, driver)

    def bucket(self, key: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(map_to_bucket(key[k.name], k.buckets, k.mapping, k.name) for k in self.decl.key)

    def selection(
        self,
        cc: tuple[int, int],
        types: Mapping[str, Any],
        key: Mapping[str, int],
        bucket: tuple[int, ...] | None = None,
        driver: tuple[int, int] | None = None,
    ) -> Selection:
        """The selection of an instance (`types`: its type parameters and constants) at a key on
        a device of compute capability `cc`, among the binaries `driver` (CUDA version) loads."""
        if bucket is None:
            bucket = self.bucket(key)
        table_arch, binary = self.binaries.binary_for(cc, driver)
        tkey = types_key(types)
        entry = self.table.entry(tkey, table_arch, bucket)
        vid, tuned = entry.variant, entry.tuned
        pin = self.pins.find(bucket) if self.pins else None
        forced = None if pin is None else pinned_variant(pin, entry, tkey, self.table.variants, binary, self.name)
        if forced is not None:
            vid, tuned = forced, tuned and forced == entry.variant
        if self._key_checks and (broken := self._broken(vid, types, key, table_arch)):
            if pin is not None and pin.choice == forced:  # a named variant is run as named, or not at all
                raise PinError(f"{pin.source}: variant {vid} breaks the constraint {broken!r} at {dict(key)}")
            vid, tuned = self._substitute(tkey, types, key, table_arch, bucket), False
        variant = self.table.variants[vid]
        return Selection(
            kernel=self.name,
            variant=vid,
            config=dict(variant.config),
            types={tp: types[tp] for tp in self.decl.type_params},
            constants={c: types[c] for c in self.decl.constants},
            bucket=dict(zip(self.key_names, bucket)),
            tuned=tuned,
            arch=table_arch,
            binary=binary,
            reason=binary_reason(binary, cc),
            pinned="" if pin is None or (forced is None and pin.choice != TUNED) else pin.source,
        )

    def serving(
        self, sel: Selection, types: Mapping[str, Any], key: Mapping[str, int], ok: Callable[[Mapping[str, Any]], bool]
    ) -> Selection | None:
        """The selection of the first variant the instance ships for `sel`'s arch (the buckets'
        choices, in bucket order) whose config `ok` accepts and whose key constraints hold at the
        call's sizes; None when none does. For a call whose variant reads a tensor map that its
        arrays cannot give (launch.py): what runs instead."""
        for vid in self.table.row_variants(types_key(types), sel.arch):
            config = self.table.variants[vid].config
            if ok(config) and (not self._key_checks or self._broken(vid, types, key, sel.arch) is None):
                return Selection(
                    kernel=sel.kernel, variant=vid, config=dict(config), types=sel.types, constants=sel.constants,
                    bucket=sel.bucket, tuned=False, arch=sel.arch, binary=sel.binary, reason=sel.reason, pinned=sel.pinned,
                )  # fmt: skip
        return None

    def _broken(self, vid: str, types: Mapping[str, Any], key: Mapping[str, int], arch: str) -> str | None:
        """The first key constraint that variant `vid` breaks at a call's own sizes, or None."""
        env = {**key, **self.table.variants[vid].config, **instance_env(types), **arch_env(arch)}
        for text, check in self._key_checks:
            try:
                if not check(env):
                    return text
            except ExpressionError:
                return text
        return None

    def _substitute(self, tkey: str, types: Mapping[str, Any], key: Mapping[str, int], arch: str, bucket: tuple[int, ...]) -> str:
        """The variant a call runs where its bucket's breaks a key constraint at the call's sizes:
        the first that holds among those the instance ships for the arch (the buckets' choices, in
        bucket order); a ValueError naming the constraint where none does."""
        entry = self.table.entry(tkey, arch, bucket)
        broken = self._broken(entry.variant, types, key, arch)
        for vid in self.table.row_variants(tkey, arch):
            if self._broken(vid, types, key, arch) is None:
                return vid
        sizes = ", ".join(f"{n}={v}" for n, v in key.items())
        raise ValueError(
            f"{self.name}(): no variant the wheel ships for {arch} satisfies the constraint {broken!r} at {sizes} (the bucket's "
            f"config was chosen where it holds at {dict(zip(self.key_names, bucket))}); pass sizes that are buckets, or ask the "
            "kernel's author for a bucket at these sizes or an `exact` mapping"
        )

    def binary(self, selection: Selection) -> bytes:
        """The cubin (or PTX) bytes of a selection (a Library checks them against their sha256)."""
        return self.binaries.read(self.table, selection.variant, selection.binary)


def arch_number(arch: str) -> int:
    """`arch` as constraints read it: major * 10 + minor ('sm_90a' -> 90, 'sm_100f' -> 100)."""
    _, major, minor, _ = parse_arch(arch)
    return major * 10 + minor


# What a point constraint reads of a target arch (arch_env); `arch` alone cannot tell sm_90a's
# wgmma from plain sm_90, so the suffix is read as NVRTC's two macros say it.
ARCH_NAMES = ("arch", "arch_specific", "arch_family")


def arch_env(arch: str) -> dict[str, int]:
    """The names ARCH_NAMES of a target: `arch` (arch_number), `arch_specific` (1 on an `a` target,
    where NVRTC defines __CUDA_ARCH_SPECIFIC__) and `arch_family` (1 on `a` and `f` targets, where it
    defines __CUDA_ARCH_FAMILY_SPECIFIC__); 0 otherwise."""
    suffix = parse_arch(arch)[3]
    return {"arch": arch_number(arch), "arch_specific": int(suffix == "a"), "arch_family": int(suffix in ("a", "f"))}
