"""Run-time pins: a switch that forces a kernel, or one bucket of it, to its default config or to
a named variant the wheel ships, without rebuilding (A/B tests, bit-exact comparisons, bisecting
a regression). Two sources, the program's first: `Kernel.pin()`, and the environment variable
HATCH_AUTOTUNE_PIN, read when the generated module loads. Within a source a bucket's pin comes
before the kernel's, and the kernel's before one for every kernel. `select()` says which pin is
in force (`Selection.pinned`).

HATCH_AUTOTUNE_PIN holds items separated by ';':
  default                          every kernel of every generated module: tuned selection off (each
                                   bucket runs the kernel's default config, or the config that
                                   replaces it where the default may not run there)
  gemm=default                     one kernel, every bucket ('tuned' undoes a broader pin)
  gemm[m=64,n=4096,k=4096]=VARIANT one bucket (its declared key values), a variant id as
                                   `select().variant` and `hatch-autotune show` print it
  mypkg.kernels:gemm=default       only the kernel of that generated module
A variant pin holds for the type instance the variant was built for (its id names it); calls
of the kernel's other instances select as usual.
"""

from __future__ import annotations

import re

from .errors import short_repr
from .record import Record
from .values import types_key

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Mapping, Sequence

    from .table import TableEntry, Variant

PIN_ENV = "HATCH_AUTOTUNE_PIN"
DEFAULT = "default"  # the kernel's default config at the bucket (or the one replacing it where it may not run)
TUNED = "tuned"  # the wheel's own choice: undoes a broader pin
EVERY_KERNEL = "*"
# [module:]kernel[bucket]=choice; the names are Python identifiers, the module a dotted name
_ITEM = r"(?:([A-Za-z_][\w.]*):)?([A-Za-z_]\w*|\*)(?:\[([^\]]*)\])?=(\S+)"
_VARIANT = r"[0-9a-f]{16}"
MAX_ENV_CHARS = 65536


class PinError(ValueError):
    """A pin that cannot hold: malformed, naming a bucket the kernel does not declare, or a
    variant the wheel does not ship (for the device's arch)."""


class Pin(Record):
    """One pin: the choice it forces, the bucket it holds for (None: every bucket) and where it
    was set, as `select()` reports it."""

    __slots__ = ("choice", "bucket", "source")
    choice: str  # DEFAULT, TUNED or a variant id
    bucket: tuple[int, ...] | None
    source: str  # 'HATCH_AUTOTUNE_PIN gemm=default', 'gemm.pin()'


def check_choice(choice: object, where: str) -> str:
    """`choice` if it is 'default', 'tuned' or a variant id (16 hex digits); else PinError."""
    if isinstance(choice, str) and (choice in (DEFAULT, TUNED) or re.fullmatch(_VARIANT, choice)):
        return choice
    raise PinError(
        f"{where}: {short_repr(choice)} is not a pin; expected 'default' (the kernel's default config), 'tuned' (the "
        "wheel's choice) or a variant id of 16 hex digits, as select().variant and `hatch-autotune show` print it"
    )


def parse_bucket(text: str, key_names: Sequence[str], buckets: Mapping[str, Sequence[int]], where: str) -> tuple[int, ...]:
    """'M=64,N=4096' -> the bucket (in key order); every key dim given once, each a declared bucket."""
    given: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in key_names or name in given or not value.strip().isdigit():
            raise PinError(f"{where}: bucket item {short_repr(part)}: expected DIM=VALUE, each key dim of {list(key_names)} once")
        given[name] = int(value)
    return bucket_of(given, key_names, buckets, where)


def bucket_of(given: Mapping[str, object], key_names: Sequence[str], buckets: Mapping[str, Sequence[int]], where: str) -> tuple[int, ...]:
    """The bucket of key dims given by name: each one a declared bucket value (PinError otherwise)."""
    missing = [n for n in key_names if n not in given]
    unknown = sorted(set(given) - set(key_names))
    if missing or unknown:
        raise PinError(f"{where}: a bucket names every key dim {list(key_names)} once" + (f"; unknown {unknown}" if unknown else ""))
    out = []
    for n in key_names:
        value = given[n]
        if isinstance(value, bool) or not isinstance(value, int) or value not in buckets[n]:
            raise PinError(f"{where}: {n}={short_repr(value)} is not a bucket; the buckets of {n} are {list(buckets[n])}")
        out.append(value)
    return tuple(out)


class EnvItem(Record):
    """One item of HATCH_AUTOTUNE_PIN, before it meets a kernel's table."""

    __slots__ = ("module", "kernel", "bucket", "choice", "text")
    module: str | None  # None: every generated module
    kernel: str  # a kernel name, or EVERY_KERNEL
    bucket: str | None  # the bucket's text, checked against the kernel's key when it loads
    choice: str
    text: str


def parse_env(text: str | None) -> list[EnvItem]:
    """HATCH_AUTOTUNE_PIN's items; PinError naming the variable and the item that is malformed."""
    if not text:
        return []
    if len(text) > MAX_ENV_CHARS:
        raise PinError(f"{PIN_ENV}: {len(text)} characters; expected at most {MAX_ENV_CHARS}")
    items = []
    for raw in filter(None, (p.strip() for p in text.split(";"))):
        if raw in (DEFAULT, TUNED):
            raw_item = f"{EVERY_KERNEL}={raw}"
        else:
            raw_item = raw
        m = re.fullmatch(_ITEM, raw_item)
        if m is None:
            raise PinError(
                f"{PIN_ENV}: item {short_repr(raw)} is malformed; expected 'default', 'KERNEL=CHOICE', "
                "'KERNEL[DIM=VALUE,...]=CHOICE' or 'MODULE:KERNEL=CHOICE', items separated by ';'"
            )
        module, kernel, bucket, choice = m.groups()
        if bucket is not None and kernel == EVERY_KERNEL:
            raise PinError(f"{PIN_ENV}: item {short_repr(raw)}: a bucket pins one kernel, not '*'")
        choice = check_choice(choice, f"{PIN_ENV} item {short_repr(raw)}")
        if kernel == EVERY_KERNEL and choice not in (DEFAULT, TUNED):
            raise PinError(f"{PIN_ENV}: item {short_repr(raw)}: a variant id pins one kernel, not '*'")
        items.append(EnvItem(module, kernel, bucket, choice, raw))
    return items


class Pins:
    """One kernel's pins: those of its program (Kernel.pin and unpin write `program`) and of the
    environment, and the one that holds for a call (`find`)."""

    __slots__ = ("kernel", "program", "env")

    def __init__(self, kernel: str, env: Sequence[Pin] = ()):
        self.kernel = kernel
        self.program: dict[tuple[int, ...] | None, Pin] = {}
        self.env: dict[tuple[int, ...] | None, Pin] = {}
        for pin in env:  # the variable's later items win, as a later assignment would
            self.env[pin.bucket] = pin

    def __bool__(self) -> bool:
        return bool(self.program or self.env)

    def find(self, bucket: tuple[int, ...]) -> Pin | None:
        """The pin in force at `bucket`: the program's bucket pin, its kernel pin, then the
        environment's (a 'tuned' pin is returned too: it says the wheel's choice holds)."""
        for source in (self.program, self.env):
            pin = source.get(bucket) or source.get(None)
            if pin is not None:
                return pin
        return None


def env_pins(
    items: Sequence[EnvItem], module: str, kernel: str, key_names: Sequence[str], buckets: Mapping[str, Sequence[int]]
) -> list[Pin]:
    """The items of HATCH_AUTOTUNE_PIN that hold for `module`'s `kernel`, the most general first
    (every kernel, the kernel, its buckets), each bucket checked against the kernel's key."""
    ranked: list[tuple[int, Pin]] = []
    for item in items:
        if item.module not in (None, module) or item.kernel not in (EVERY_KERNEL, kernel):
            continue
        bucket = None if item.bucket is None else parse_bucket(item.bucket, key_names, buckets, f"{PIN_ENV} item {short_repr(item.text)}")
        ranked.append(((item.kernel != EVERY_KERNEL) + (bucket is not None), Pin(item.choice, bucket, f"{PIN_ENV} {item.text}")))
    return [pin for _, pin in sorted(ranked, key=lambda rank_pin: rank_pin[0])]


def check_variant(choice: str, kernel: str, variants: Mapping[str, Variant], where: str) -> None:
    """PinError when `choice` is a variant id that the kernel's wheel does not ship."""
    if choice not in (DEFAULT, TUNED) and choice not in variants:
        shipped = sorted(variants)
        raise PinError(
            f"{where}: kernel {kernel!r} ships no variant {choice!r}; it ships {len(shipped)}: {', '.join(shipped[:8])}"
            + (" ..." if len(shipped) > 8 else "")
            + " (select().variant and `hatch-autotune show` name them)"
        )


def pinned_variant(pin: Pin, entry: TableEntry, tkey: str, variants: Mapping[str, Variant], binary: str, kernel: str) -> str | None:
    """The variant `pin` forces at a bucket whose table entry is `entry`, for a call of type
    instance `tkey` run by `binary` (an arch); None where it forces nothing (a 'tuned' pin, a
    variant pin of another instance). PinError where the wheel cannot run what it forces."""
    if pin.choice == TUNED:
        return None
    if pin.choice == DEFAULT:  # the entry's own variant where it runs the default (or its replacement) already
        if entry.default_variant is None and entry.tuned:
            raise PinError(
                f"{pin.source}: the wheel holds no default config for {kernel} at {tkey} bucket {list(entry.bucket)} (it did not compile)"
            )
        return entry.default_variant or entry.variant
    variant = variants[pin.choice]  # checked when the pin was set (check_variant)
    if types_key(variant.types) != tkey:
        return None
    if binary not in variant.binaries:
        raise PinError(
            f"{pin.source}: variant {pin.choice} of {kernel} ships for {', '.join(sorted(variant.binaries))}, not for {binary}, which "
            "this device runs; pin one that `hatch-autotune show` lists for this arch"
        )
    return pin.choice
