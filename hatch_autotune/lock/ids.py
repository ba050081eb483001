"""Where an entry sits in the lock: `Bucket` (a point of a kernel's key space) and `EntryId`
(kernel, type instance, arch and bucket), each with its one written form and its one reader."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..runtime import MAX_SIZE, short_repr
from .errors import LockFormatError

# fullmatch: no trailing newline; ASCII digits only, and at most MAX_SIZE's 19 of them, so that a
# huge number is refused here rather than by int() (whose limit is 4300 digits, as a ValueError)
_BUCKET_ITEM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(-?[0-9]{1,19})")


@dataclass(frozen=True)
class Bucket:
    """A point of a kernel's key space where tuning happens: each key dim's value, in the
    kernel's key order. The one type of a bucket in the lock, the plan, the tuner and the
    worker; its other forms are conversions: `as_dict` (what expressions and inputs read),
    `values` (the selection table's row and the plan's key), `str` ('m=1024,n=64', the entry
    id's part, read back by `parse`)."""

    dims: tuple[tuple[str, int], ...]  # ((name, value), ...), in key order

    @classmethod
    def of(cls, values: Bucket | Mapping[str, int]) -> Bucket:
        """The bucket of a {dim: value} mapping (in its order), or the bucket itself."""
        if isinstance(values, Bucket):
            return values
        return cls(tuple((k, int(v)) for k, v in values.items()))

    @classmethod
    def from_values(cls, names: Sequence[str], values: Sequence[int]) -> Bucket:
        """The bucket of the key dims `names` at `values` (the table's and the planner's form)."""
        if len(names) != len(values):
            raise ValueError(f"{len(values)} bucket values for {len(names)} key dims ({', '.join(names)})")
        return cls(tuple((k, int(v)) for k, v in zip(names, values)))

    @classmethod
    def parse(cls, text: str) -> Bucket:
        """'m=1024,n=64' back to its bucket; LockFormatError if it is not that form, or a value
        is beyond a key's range (MAX_SIZE either way)."""
        items = [_BUCKET_ITEM.fullmatch(item) for item in text.split(",")]
        dims = tuple((m.group(1), int(m.group(2))) for m in items if m)
        if len(dims) != len(items) or any(abs(v) > MAX_SIZE for _, v in dims):
            raise LockFormatError(f"bucket {short_repr(text)} is not 'dim=value,...' with integer values from -{MAX_SIZE} to {MAX_SIZE}")
        return cls(dims)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.dims)

    @property
    def values(self) -> tuple[int, ...]:
        return tuple(v for _, v in self.dims)

    def as_dict(self) -> dict[str, int]:
        return dict(self.dims)

    def __str__(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.dims)


@dataclass(frozen=True)
class EntryId:
    """Where an entry sits in the lock: kernel, type instance, arch and bucket. Written as
    'saxpy|T=float32|sm_90|n=4096' (readable, and sorts by kernel); `parse` is its one reader."""

    kernel: str
    types: str  # types key: 'T=float32', or '-' for a kernel without type parameters
    arch: str
    bucket: Bucket

    @classmethod
    def of(cls, kernel: str, types: str, arch: str, bucket: Bucket | Mapping[str, int]) -> EntryId:
        return cls(kernel, types, arch, Bucket.of(bucket))

    @property
    def instance(self) -> str:
        """'saxpy|T=float32|sm_90': the type instance on an arch, for messages about all its buckets."""
        return f"{self.kernel}|{self.types}|{self.arch}"

    def __str__(self) -> str:
        return f"{self.instance}|{self.bucket}"

    @classmethod
    def parse(cls, text: Any) -> EntryId:
        parts = text.split("|") if isinstance(text, str) else []
        if len(parts) == 4 and all(parts[:3]):
            try:
                return cls(parts[0], parts[1], parts[2], Bucket.parse(parts[3]))
            except LockFormatError:
                pass
        raise LockFormatError(f"entry id {short_repr(text)} is not 'kernel|types|arch|dim=value,...'")
