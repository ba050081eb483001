"""The one exception type a build reports as a clear message (no traceback): every stage raises
a subclass of BuildError when the project, not hatch-autotune, has to change."""


class BuildError(RuntimeError):
    """The build cannot produce a correct wheel; the message says why and what to do."""
