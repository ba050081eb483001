"""The errors a user sees as a clear message, never a traceback.

BuildError: the build cannot produce a correct wheel; every stage raises a subclass of it when
the project, not hatch-autotune, has to change. CliError: bad input or a refused operation of
the command (or of a project read outside a build), shown as one `hatch-autotune: error:` line
plus indented details.
"""

from __future__ import annotations

from collections.abc import Sequence


class BuildError(RuntimeError):
    """The build cannot produce a correct wheel; the message says why and what to do."""


class CliError(Exception):
    """Bad input or a refused operation: printed as one `hatch-autotune: error:` line."""

    def __init__(self, message: str, details: Sequence[str] = ()):
        super().__init__(message)
        self.details = list(details)
