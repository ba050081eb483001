"""`show`, `diff` and `report` on a big lock file: what they print and draw at scale (how fast
is measured by benchmarks/inspect_scale.py, not here).

The lock files are made up by the benchmark's own generator (`big_lock`: example_pkg's kernels
copied many times over seven archs; made-up times, marked so in their provenance).
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict

import pytest
from conftest import ROOT

from hatch_autotune import cli
from hatch_autotune.inspection.fmt import fmt_bucket
from hatch_autotune.lock import EntryId

sys.path.insert(0, str(ROOT / "benchmarks"))
from inspect_scale import big_lock, retuned, write_lock

N = 2000


@pytest.fixture(autouse=True)
def plain_output(monkeypatch):
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE", "HATCH_AUTOTUNE_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.fixture(scope="module")
def locks(tmp_path_factory):
    """A 2k-entry lock file, a re-tune of it, and the changes between them."""
    d = tmp_path_factory.mktemp("big")
    lock = big_lock(N)
    new, changes = retuned(lock)
    return write_lock(d / "a.json", lock), write_lock(d / "b.json", new), lock["entries"], changes


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def body_rows(out: str) -> list[list[str]]:
    """The body rows of the plain tables in `out`, as cells."""
    header = ("| arch", "| entry", "|-")
    return [
        [c.strip() for c in line[1:-1].split(" | ")] for line in out.splitlines() if line.startswith("|") and not line.startswith(header)
    ]


def test_show_prints_a_limit_and_says_how_many_more(locks, capsys):
    a, _, entries, _ = locks
    code, out, err = run_cli(capsys, "show", a, "--limit", 40)
    assert code == 0, err
    assert len(body_rows(out)) == 40
    assert f"... {N - 40} more entries not shown (the first 40 of {N}): --all shows every one" in out
    tuned = sum(e["tuned"] for e in entries.values())
    assert f"{a} (lock): {N} entries, {tuned} tuned, {N - tuned} default" in out  # the totals count them all

    code, out, _ = run_cli(capsys, "show", a)  # by default, cli.LIST_LIMIT rows
    assert code == 0 and len(body_rows(out)) == cli.LIST_LIMIT < N
    assert f"{N - cli.LIST_LIMIT} more entries not shown" in out

    code, out, _ = run_cli(capsys, "show", a, "--all")
    rows = body_rows(out)
    assert code == 0 and len(rows) == N and "more entries not shown" not in out
    measured = [tuple(r) for r in rows if "default" not in r]  # untuned rows of two copies of a kernel may read the same
    assert len(set(measured)) == len(measured) > N / 2  # every entry once

    kernel = "sgemm_001"  # a copy that the N entries include (example_pkg has six kernels to copy)
    code, out, _ = run_cli(capsys, "show", a, "--kernel", kernel)
    assert code == 0 and len(body_rows(out)) == sum(eid.startswith(kernel + "|") for eid in entries)

    code, _, err = run_cli(capsys, "show", a, "--limit", 0)
    assert code == 2 and "expected a positive integer" in err
    code, _, err = run_cli(capsys, "show", a, "--limit", 5, "--all")
    assert code == 2 and "not allowed with" in err


def test_diff_of_two_big_locks_counts_every_change(locks, capsys):
    a, b, _entries, changes = locks
    listed = changes["added"] + changes["removed"] + changes["changed"]
    unchanged = N - changes["removed"] - changes["changed"]
    summary = (
        f"{changes['added']} added, {changes['removed']} removed, {changes['changed']} changed, {unchanged} unchanged; "
        f"{changes['regressions']} regression(s) over 5%"
    )
    code, out, err = run_cli(capsys, "diff", a, b, "--all")
    assert code == 0, err
    rows = body_rows(out)
    assert len(rows) == listed and summary in out
    assert sum(r[-1] == "REGRESSION" for r in rows) == changes["regressions"] > 0

    code, out, _ = run_cli(capsys, "diff", a, b, "--limit", 50, "--fail-on-regression")
    assert code == 1  # the regressions count whether listed or not
    assert body_rows(out) == rows[:50] and summary in out
    hidden_regressions = sum(r[-1] == "REGRESSION" for r in rows[50:])
    assert (
        f"... {listed - 50} more changes not shown (the first 50 of {listed}; {hidden_regressions} of those not shown are regressions)"
        in out
    )


def test_report_draws_one_chart_per_kernel_and_arch_with_every_bucket(locks, tmp_path, capsys):
    a, _, entries, _ = locks
    out = tmp_path / "report.html"
    code, stdout, err = run_cli(capsys, "report", a, "-o", out)
    assert code == 0, err
    html = out.read_text()
    for external in ("http://", "https://", "<script", "<link", "src=", "url("):
        assert external not in html, external

    instances: dict[str, dict[str, int]] = defaultdict(dict)  # chart title -> bucket -> timed configs
    kernels = set()
    for eid, e in entries.items():
        i = EntryId.parse(eid)
        kernels.add(i.kernel)
        timed = sum(m.get("status") in ("ok", "eliminated") for m in e.get("measurements", []))
        if timed:
            title = " ".join([i.kernel] + ([i.types] if i.types != "-" else []) + [i.arch])
            instances[title][fmt_bucket(i.bucket)] = timed
    charts = dict(re.findall(r'<svg class="chart" id="[^"]*"[^>]*aria-label="([^"]*)"[^>]*>(.*?)</svg>', html, re.S))
    assert html.count('<svg class="chart"') == len(charts) == len(instances) + len(kernels)  # + a speedup chart per kernel
    assert len(instances) < N / 5  # far fewer charts than entries
    for title, buckets in instances.items():
        chart = charts[title]
        for bucket in buckets:
            assert f">{bucket}:" in chart, (title, bucket)  # its panel's title
        assert len(re.findall(r"<rect [^>]*><title>", chart)) == sum(buckets.values()), title  # a bar per timed config
    assert f"{out}: {len(charts)} chart(s), {N} entries" in stdout
    progress = [line for line in err.splitlines() if line.startswith("drawing charts: ")]
    assert progress[-1].startswith(f"drawing charts: {len(charts)}/{len(charts)} ")
    assert len(progress) <= cli.PROGRESS_LINES + 1  # not a line per chart


def test_plain_tables_are_the_lines_rich_drew():
    """What a pipe gets from `show` and `diff` stays what it was when rich drew it (box.ASCII,
    no wrapping), so that scripts reading it keep working."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    rows = [("sm_90", "n=4096", "BLOCK=256 VEC=1", "0.01234", "1.25x"), ("sm_100", "n=16777216", "BLOCK=1024", "-", "-")]
    for title, header in (("saxpy", True), (None, True), (None, False)):
        t = Table(title=title, title_justify="left", box=box.ASCII, header_style="", show_header=header)
        plain = cli.TextTable(title, ["arch", "bucket", "config", "time (ms)", "speedup"], right=("time (ms)", "speedup"), header=header)
        for c in ["arch", "bucket", "config", "time (ms)", "speedup"]:
            t.add_column(c, justify="right" if c in ("time (ms)", "speedup") else "left", no_wrap=True)
        for r in rows:
            t.add_row(*r)
            plain.add_row(*r)
        console = Console(file=io.StringIO(), width=200, highlight=False, markup=False, emoji=False, no_color=True)
        console.print(t, soft_wrap=True)
        assert plain.text() == console.file.getvalue(), (title, header)
