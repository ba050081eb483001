"""Text that several stages print: compiler-log excerpts, indented quotes, type instances in
words, a few examples of a long list, and where a stage's log lines go (`Log`). One copy, so the
planner, the tuner, the wheel's outcome and the command word these things alike."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .runtime import short_repr

Log = Callable[[str], None]  # where a stage's progress lines go: print, stderr, the hook's app

LOG_LINES = 12  # of a failed compile's log, kept in the record
LOG_CHARS = 1500
EXAMPLES = 3  # entry ids a build log line names before "and N more"


def log_excerpt(log: str, lines: int = LOG_LINES, chars: int = LOG_CHARS) -> str:
    """The first `lines` lines of a compiler log, at most `chars` characters, saying what was cut."""
    kept = log.strip().splitlines()
    text = "\n".join(kept[:lines])
    cut = len(kept) > lines
    if len(text) > chars:
        text, cut = text[:chars].rstrip(), True
    return text + ("\n[...]" if cut else "")


def indent(text: str, by: str = "  ") -> str:
    """Each line of a log indented under the message that quotes it (blank lines left blank)."""
    return "\n".join(by + line if line.strip() else "" for line in text.splitlines())


def instance_text(types_key: str) -> str:
    """A type instance in words: its types key ('T=float32'), or what '-' stands for."""
    return "no type parameters or constants" if types_key == "-" else types_key


def examples(items: Sequence[str], n: int = EXAMPLES) -> str:
    """'a, b, c and 9 more': a few of a long list, for one log line."""
    shown = ", ".join(items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


def shown(text: str, limit: int) -> str:
    """A name or value from the user in a one-line message: as given, or escaped and cut
    (short_repr) when it holds a control character (a NUL, a line break) or is over `limit`."""
    return text if text.isprintable() and len(text) <= limit else short_repr(text, limit)
