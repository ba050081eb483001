"""What the runtime raises, in one place, and how its messages quote values (`short_repr`).

The build side raises some of them too (ExpressionError for a config's expression, TableError
for a table it reads), so a wheel and a build report the same fault the same way.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from typing import Any


class TableError(ValueError):
    """A selection table that cannot be read: not JSON, not a table, or another schema."""


class IntegrityError(RuntimeError):
    """A shipped file does not match the sha256 recorded for it."""


class ExpressionError(ValueError):
    """An expression that cannot be evaluated within bounds, or a malformed tree (a corrupt or
    foreign table)."""


class ArrayInterfaceError(TypeError):
    """An object whose __cuda_array_interface__ is not one (a field missing or of the wrong type)."""


class NoDriverError(RuntimeError):
    """No usable CUDA driver or device. Raised only after every check that needs no driver."""


class DriverTooOldError(RuntimeError):
    """The CUDA driver is older than what is needed: by every binary of the wheel that runs on
    the device (the error names each one's floor), or by the installed cuda-bindings."""


class CudaCallError(RuntimeError):
    """A CUDA driver or NVRTC call returned an error: `call` names the call, `error` the code."""

    def __init__(self, call: str, error: str):
        super().__init__(f"{call} failed: {error}")
        self.call, self.error = call, error


def short_repr(value: Any, limit: int = 80) -> str:
    """A value for an error message, cut to `limit` characters (trees can be huge)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
