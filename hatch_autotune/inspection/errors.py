"""The one error of the inspection stage and the command: bad input or a refused operation,
shown as one `hatch-autotune: error:` line (plus indented details), never a traceback."""

from __future__ import annotations

from typing import Sequence


class CliError(Exception):
    """Bad input or a refused operation: printed as one `hatch-autotune: error:` line."""

    def __init__(self, message: str, details: Sequence[str] = ()):
        super().__init__(message)
        self.details = list(details)
