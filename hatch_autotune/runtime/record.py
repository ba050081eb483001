"""The base of the runtime's small immutable records (Selection, TableEntry, PreparedCall,
ArrayView, CudaApi): what a frozen dataclass gives, without importing dataclasses and typing,
which together were about half of a cold import of the runtime."""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from typing import Any


class Record:
    """A small immutable record: fields named by `__slots__`, given by position or keyword."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any):
        values = dict(zip(self.__slots__, args), **kwargs)
        for name in self.__slots__:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __hash__(self) -> int:
        return hash(tuple(repr(getattr(self, n)) for n in self.__slots__))

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"{type(self).__name__}({fields})"
