"""Output: rich tables and progress on a terminal, plain text otherwise."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

RICH_MAX_ROWS = 1000  # a terminal gets rich's tables up to this size; they take about 2 ms a row to lay out
PROGRESS_LINES = 100  # plain progress (not a terminal) prints about this many lines, however many steps


class TextTable:
    """A table drawn as rich draws it with its ASCII box (what a pipe or a file gets), in one
    pass: rich measures and lays out every cell, about 2 ms a row, which made `show` of a
    50k-entry lock take half a minute. Cells are never wrapped or cut."""

    def __init__(self, title: str | None, columns: Sequence[str], right: Sequence[str] = (), header: bool = True):
        self.title, self.columns, self.header = title, list(columns), header
        self.right = [c in right for c in columns]
        self.rows: list[Sequence[str]] = []

    def add_row(self, *cells: str, style: str | None = None) -> None:  # style: a terminal's; none here
        self.rows.append(cells)

    def text(self) -> str:
        from rich.cells import cell_len

        def width(s: str) -> int:
            return len(s) if s.isascii() else cell_len(s)

        body = ([self.columns] if self.header else []) + [list(map(str, r)) for r in self.rows]
        widths = [max((width(r[i]) for r in body), default=0) for i in range(len(self.columns))]

        def line(cells: Sequence[str]) -> str:
            padded = (" " * (w - width(c)) + c if right else c + " " * (w - width(c)) for c, w, right in zip(cells, widths, self.right))
            return "| " + " | ".join(padded) + " |"

        border = "+" + "-" * (sum(widths) + 3 * len(widths) - 1) + "+"
        out = ([self.title] if self.title else []) + [border]
        if self.header:
            out += [line(self.columns), "|" + "+".join("-" * (w + 2) for w in widths) + "|"]
        out += [line(r) for r in body[1 if self.header else 0 :]]
        out.append(border)
        return "\n".join(out) + "\n"


class UI:
    """stdout for results, stderr for progress and errors; plain when not on a terminal."""

    def __init__(self) -> None:
        from rich.console import Console

        self.out = Console(highlight=False, markup=False, emoji=False)
        self.err = Console(stderr=True, highlight=False, markup=False, emoji=False)
        self.tty = self.out.is_terminal
        if not self.tty:
            self.out.width = max(self.out.width, 200)  # a pipe or a file: never wrap table cells
        if not self.err.is_terminal:
            self.err.width = max(self.err.width, 200)

    def table(self, title: str | None, columns: Sequence[str], right: Sequence[str] = (), header: bool = True, rows: int = 0) -> Any:
        """A table to fill with add_row and print: rich's on a terminal, unless it will hold
        more than RICH_MAX_ROWS `rows`; the same ASCII lines as rich's otherwise, written at once."""
        if not self.tty or rows > RICH_MAX_ROWS:
            return TextTable(title, columns, right, header)
        from rich import box
        from rich.table import Table

        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, header_style="bold", show_header=header)
        for c in columns:
            t.add_column(c, justify="right" if c in right else "left")
        return t

    def print(self, *things: Any, style: str | None = None) -> None:
        if len(things) == 1 and isinstance(things[0], TextTable):
            self.out.file.write(things[0].text())
            return
        self.out.print(*things, style=style, soft_wrap=True)

    @contextlib.contextmanager
    def progress(self, total: int | None, what: str) -> Iterator[Callable[[str], None]]:
        """advance(label) per finished step; a bar on a terminal, one line per step otherwise.
        With total=None, each call is a log line under a spinner."""
        if not self.err.is_terminal:
            done = [0]
            every = max(1, math.ceil((total or 0) / PROGRESS_LINES))

            def step(label: str) -> None:
                done[0] += 1
                if total is None:
                    self.err.print(label, soft_wrap=True)
                elif done[0] % every == 0 or done[0] == total:
                    self.err.print(f"{what}: {done[0]}/{total} {label}", soft_wrap=True)

            yield step
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        columns = [SpinnerColumn(), TextColumn("{task.description}")]
        if total is not None:
            columns += [BarColumn(), MofNCompleteColumn()]
        columns.append(TimeElapsedColumn())
        with Progress(*columns, console=self.err, transient=True) as bar:
            task = bar.add_task(what, total=total)

            def step(label: str) -> None:
                if total is None:
                    bar.console.print(label, soft_wrap=True)
                else:
                    bar.update(task, advance=1, description=f"{what}: {label}")

            yield step
