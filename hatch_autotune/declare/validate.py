"""The generic validators the configuration is checked with, and how problems are collected.

Every problem in the hook table is collected and reported at once, each with its full TOML key
path and what was expected (the experience of hatch-fancy-pypi-readme). One small set of
validators does the checking, rather than a hand-written property per key: each takes
(value, path, errors) and returns the parsed value, or BAD after adding one line to `errors`.
"""

from __future__ import annotations

import keyword
import re
import sys
from collections.abc import Callable
from typing import Any

from ..runtime import MIN_SM, parse_arch, short_repr
from ..runtime.selection import SUFFIX_FLOOR
from . import expr as expr_mod

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # always fullmatch: `$` would accept a trailing newline
BAD = object()  # a validator's "already reported" result
# The largest number a setting takes unless its own bound is lower (docs/configuration.md):
# seconds, milliseconds and tolerances all stay far below what a timer or a float overflows at.
MAX_NUMBER = 1_000_000.0

Validator = Callable[[Any, str, list[str]], Any]


class ConfigError(ValueError):
    """All problems found in the table; ``errors`` holds one line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        lines = "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(f"hatch-autotune: {len(self.errors)} error(s) in the configuration:\n{lines}")


class UnknownKey(str):
    """An unknown key's line among the errors. It is reported like any other, but the part it
    sits in is still read and checked: a misspelt key must not hide the other problems."""


def problems_since(errors: list[str], start: int) -> int:
    """How many lines from `errors[start]` on make a part unusable: all but unknown keys."""
    return sum(not isinstance(e, UnknownKey) for e in errors[start:])


def type_name(value: Any) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean", int: "an integer", float: "a float"}.get(
        type(value), type(value).__name__
    )


def fail(errors: list[str], path: str, expected: str, value: Any) -> Any:
    errors.append(f"{path}: expected {expected}, got {type_name(value)} {short_repr(value)}")
    return BAD


def v_str(value: Any, path: str, errors: list[str]) -> Any:
    return value if isinstance(value, str) and value else fail(errors, path, "a non-empty string", value)


def v_bool(value: Any, path: str, errors: list[str]) -> Any:
    return value if isinstance(value, bool) else fail(errors, path, "a boolean (true or false)", value)


def v_ident(value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, str) and IDENT.fullmatch(value) and not keyword.iskeyword(value):
        return value
    return fail(errors, path, "an identifier (letters, digits, _; not starting with a digit)", value)


def v_int(minimum: int | None = None, maximum: int | None = None) -> Validator:
    def check(value: Any, path: str, errors: list[str]) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            return fail(errors, path, "an integer", value)
        if minimum is not None and value < minimum:
            return fail(errors, path, f"an integer >= {minimum}", value)
        if maximum is not None and value > maximum:
            return fail(errors, path, f"an integer <= {maximum}", value)
        return value

    return check


def v_choice(choices: tuple[str, ...]) -> Validator:
    def check(value: Any, path: str, errors: list[str]) -> Any:
        if value in choices:
            return value
        return fail(errors, path, "one of " + ", ".join(repr(c) for c in choices), value)

    return check


def v_list(item: Validator, nonempty: bool = True, what: str = "") -> Validator:
    def check(value: Any, path: str, errors: list[str]) -> Any:
        if not isinstance(value, list):
            return fail(errors, path, f"an array{what}", value)
        if nonempty and not value:
            return fail(errors, path, f"a non-empty array{what}", value)
        items = [item(v, f"{path}[{i}]", errors) for i, v in enumerate(value)]
        return BAD if any(i is BAD for i in items) else tuple(items)

    return check


def v_expr(allowed: set[str] | None = None, where: str = "") -> Validator:
    def check(value: Any, path: str, errors: list[str]) -> Any:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return fail(errors, path, "an expression string or an integer", value)
        try:
            e = expr_mod.parse(value)
        except expr_mod.ExprSyntaxError as exc:
            errors.append(f"{path}: {exc}")
            return BAD
        unknown = sorted(e.names - allowed) if allowed is not None else []
        if unknown:
            errors.append(
                f"{path}: unknown name(s) {', '.join(unknown)} in {value!r}; "
                f"{where or 'allowed names'}: {', '.join(sorted(allowed or ())) or 'none'}"
            )
            return BAD
        return e

    return check


def in_range(value: Any, minimum: float, maximum: float) -> bool:
    """The one rule for every number a setting takes, from the table or the environment: a
    number (not a boolean) from `minimum` to `maximum`. `maximum` is finite and NaN compares
    false, so NaN and the infinities never pass (a NaN tolerance would turn verification off);
    a huge integer is compared exactly, never turned into a float that overflows."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and minimum <= value <= maximum


def number_text(value: float) -> str:
    """A bound as the messages and the docs write it: 0.001, 3,600, 1,000,000."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def v_number(minimum: float = 0.0, maximum: float = MAX_NUMBER) -> Validator:
    """A finite number from `minimum` to `maximum` (default MAX_NUMBER; sys.float_info.max: any
    finite one), as a float."""

    def check(value: Any, path: str, errors: list[str]) -> Any:
        if not in_range(value, minimum, maximum):
            most = "" if maximum == sys.float_info.max else f" and <= {number_text(maximum)}"
            return fail(errors, path, f"a {'finite ' if not most else ''}number >= {minimum:g}{most}", value)
        return float(value)

    return check


def v_entry_point(value: Any, path: str, errors: list[str]) -> Any:
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
        return value
    return fail(errors, path, "'module:function' (e.g. 'mypkg.reference:saxpy')", value)


def v_arch(value: Any, path: str, errors: list[str]) -> Any:
    """A cubin target: plain 'sm_XY', arch-specific 'sm_XYa' or family 'sm_XYf', each from the
    oldest arch NVRTC takes it for (MIN_SM, SUFFIX_FLOOR); whether the installed NVRTC knows the
    arch is the compiler's check (compile/nvrtc.py check_archs)."""
    try:
        kind, major, minor, suffix = parse_arch(value) if isinstance(value, str) else ("", 0, 0, "")
    except ValueError:
        kind = ""
    if kind != "sm":
        return fail(
            errors, path, "a CUDA arch 'sm_XY', 'sm_XYa' (arch-specific) or 'sm_XYf' (family), e.g. 'sm_80', 'sm_90a' or 'sm_100f'", value
        )
    number = major * 10 + minor
    if number < MIN_SM:
        return fail(errors, path, f"an arch NVRTC 13 can target (sm_{MIN_SM} or newer)", value)
    floor = SUFFIX_FLOOR.get(suffix, 0)
    if number < floor:
        what = "an arch-specific" if suffix == "a" else "a family"
        instead = " or ".join(f"'sm_{number}{s}'" for s in ("", *SUFFIX_FLOOR) if number >= SUFFIX_FLOOR.get(s, 0))
        return fail(
            errors,
            path,
            f"{what} '{suffix}' target of sm_{floor} or newer (NVRTC takes '{suffix}' from sm_{floor}{suffix} up); "
            f"for compute capability {major}.{minor} use {instead}",
            value,
        )
    return value


class Table:
    """A TOML table under validation: typed getters that record errors, then unknown keys."""

    def __init__(self, value: Any, path: str, errors: list[str]):
        self.path, self.errors = path, errors
        self.ok = isinstance(value, dict)
        self.data: dict[str, Any] = value if self.ok else {}
        if not self.ok:
            fail(errors, path, "a table", value)
        self.seen: set[str] = set()

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if IDENT.fullmatch(key.replace("-", "_")) else f'{self.path}."{key}"'

    def get(self, key: str, validator: Validator, default: Any = BAD, required: bool = False) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if required and self.ok:
                self.errors.append(f"{self.sub(key)}: required key is missing")
            return default
        return validator(self.data[key], self.sub(key), self.errors)

    def table(self, key: str, required: bool = False) -> Table | None:
        self.seen.add(key)
        if key not in self.data:
            if required and self.ok:
                self.errors.append(f"{self.sub(key)}: required table is missing")
            return None
        return Table(self.data[key], self.sub(key), self.errors)

    def finish(self, ignored: frozenset[str] = frozenset()) -> None:
        for key in self.data:
            if key not in self.seen and key not in ignored:
                known = ", ".join(sorted(self.seen)) or "none"
                self.errors.append(UnknownKey(f"{self.sub(key)}: unknown key (known keys here: {known})"))
