"""mkdocs hook (mkdocs.yml `hooks:`) that keeps the docs tied to the code and the measurements.

A table marked `<!-- results: FILE KEY -->` must equal the markdown table that the results file
FILE stores under KEY (dotted); every repository path a page or the README names (`benchmarks/...`,
`hatch_autotune/...`, `tests/...`, `example_pkg/...`, `templates/...`) must exist; and the
architecture page must name every module of the package. So a re-run benchmark, a moved file or a
new module fails the build instead of leaving a stale page. mkdocs checks links between the pages;
this also checks the README's links into docs/, which mkdocs does not build, against the pages and
their headings' anchors.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

MARK = re.compile(r"^<!-- results: (\S+) (\S+) -->$")
RESULTS_PATH = re.compile(r"benchmarks/results/[\w.*/-]*[\w*]")
REPO_PATH = re.compile(r"`((?:hatch_autotune|tests|benchmarks|example_pkg|templates)/[^`\s]*)`")
README_LINK = re.compile(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)")

_anchors: dict[str, set[str]] = {}


def _root(config: Any) -> Path:
    return Path(config.config_file_path).parent


def _missing_paths(text: str, root: Path) -> list[str]:
    missing = []
    named = set(RESULTS_PATH.findall(text)) | {p.rstrip("/") for p in REPO_PATH.findall(text) if "..." not in p}
    for path in sorted(named):
        found = list(root.glob(path)) if "*" in path else [root / path] if (root / path).exists() else []
        if not found:
            missing.append(f"{path} does not exist")
    return missing


def _table_problems(markdown: str, root: Path) -> list[str]:
    problems = []
    lines = markdown.split("\n")
    for i, line in enumerate(lines):
        m = MARK.match(line.strip())
        if not m:
            continue
        file, key = m.groups()
        try:
            value: Any = json.loads((root / file).read_text(encoding="utf-8"))
            for part in key.split("."):
                value = value[part]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"line {i + 1}: cannot read {key} from {file} ({exc!r})")
            continue
        table = []
        for row in lines[i + 1 :]:
            if not row.startswith("|"):
                break
            table.append(row.rstrip())
        expected = [row.rstrip() for row in str(value).strip().split("\n")]
        if table != expected:
            problems.append(f"line {i + 1}: the table differs from {key} in {file}; copy it from there")
    return problems


def _unnamed_modules(markdown: str, root: Path) -> list[str]:
    modules = sorted(p.relative_to(root).as_posix() for p in (root / "hatch_autotune").rglob("*.py") if p.name != "__init__.py")
    return [f"{m} is not named" for m in modules if f"`{m}`" not in markdown]


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    root = _root(config)
    problems = _table_problems(markdown, root) + _missing_paths(markdown, root)
    if page.file.src_path == "architecture.md":
        problems += _unnamed_modules(markdown, root)
    if problems:
        raise PluginError(f"{page.file.src_path}: " + "; ".join(problems))
    return markdown


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    ids: set[str] = set()
    stack = list(page.toc)
    while stack:
        item = stack.pop()
        ids.add(item.id)
        stack.extend(item.children)
    _anchors[page.file.src_path] = ids
    return html


def on_post_build(config: Any) -> None:
    root = _root(config)
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8")
    problems = _missing_paths(text, root)
    for target, anchor in README_LINK.findall(text):
        page = target.removeprefix("docs/")
        if page not in _anchors:
            problems.append(f"link to {target}: no such page")
        elif anchor and anchor not in _anchors[page]:
            problems.append(f"link to {target}#{anchor}: no such heading")
    if problems:
        raise PluginError("README.md: " + "; ".join(problems))
