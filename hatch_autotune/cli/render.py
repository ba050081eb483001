"""`render`: one variant's source as NVRTC compiles it, its types and config chosen on the
command line and checked against the kernel's declaration."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..declare.project import load_project
from ..errors import CliError
from ..text import shown
from .common import EXIT_OK, PROG
from .ui import UI

_PAIR = re.compile(r"(\w+)=(.*)", re.DOTALL)


def _shown(value: str) -> str:
    """A value from the command line for a one-line message."""
    return shown(value, 100)


def _pairs(option: str, texts: Sequence[str]) -> dict[str, str]:
    """NAME=VALUE pairs of a repeatable option, several to an argument separated by commas or
    spaces, as `show` prints configs (`BLOCK=64 VEC=2`) and types (`CAUSAL=true,T=float16`);
    a separator counts only before the next NAME=, so a string value may hold one."""
    from ..runtime.errors import short_repr

    pairs: dict[str, str] = {}
    for text in texts:
        for piece in re.split(r"[,\s]+(?=\w+=)", text.strip(", \t\n")):
            m = _PAIR.fullmatch(piece)
            if m is None:
                raise CliError(f"{option} {short_repr(text, 100)}: expected NAME=VALUE pairs, such as {option} BLOCK=128,VEC=2")
            name, value = m.group(1), m.group(2).rstrip(", \t\n")
            if name in pairs:
                raise CliError(f"{option}: {name} is given twice ({name}={_shown(pairs[name])} and {name}={_shown(value)})")
            pairs[name] = value
    return pairs


def _chosen(option: str, given: dict[str, str], allowed: dict[str, tuple[Any, ...]], kind: tuple[str, str], kernel: str) -> dict[str, Any]:
    """The given values as the kernel declares them: each name one of `allowed`'s, each value
    one of that name's values (matched by how TOML and `show` write it: `true`, `128`, `float16`)."""
    from ..runtime import value_text
    from ..text import examples

    out = {}
    for name, text in given.items():
        if name not in allowed:
            has = f"its {kind[1]}: {', '.join(allowed)}" if allowed else f"it has no {kind[1]}"
            raise CliError(f"{option} {name}={_shown(text)}: kernel {kernel} has no {kind[0]} named {name}; {has}")
        by_text = {value_text(v): v for v in allowed[name]}
        if text not in by_text:
            raise CliError(f"{option} {name}={_shown(text)}: not one of {name}'s values ({examples(list(by_text), 20)})")
        out[name] = by_text[text]
    return out


def _check_constraints(spec: Any, types: dict[str, Any], config: dict[str, Any]) -> None:
    """The config must be in the instance's space: each constraint holds (the space's own
    evaluation, one constraint at a time so that the message names the one broken)."""
    from ..declare.space import ConstraintError, enumerate_configs
    from ..runtime import value_text

    point = {k: (v,) for k, v in config.items()}
    shown = ",".join(f"{k}={value_text(v)}" for k, v in config.items())
    for_types = f" with {','.join(f'{k}={value_text(v)}' for k, v in types.items())}" if types else ""
    for i, constraint in enumerate(spec.constraints):
        if spec.is_point_constraint(constraint):  # per bucket and arch: not a property of the variant
            continue
        try:
            holds = enumerate_configs(point, [constraint], spec.type_env(types))
        except ConstraintError as exc:
            raise CliError(f"--config {shown}{for_types}: constraints[{i}] {constraint.text!r} cannot be evaluated: {exc.cause}") from None
        if not holds:
            raise CliError(f"--config {shown}{for_types}: violates kernel {spec.name}'s constraints[{i}] {constraint.text!r}")


def cmd_render(args: argparse.Namespace, ui: UI) -> int:
    """One variant's source as NVRTC compiles it, with line numbers: NVRTC's `<entry>.cu(91)`
    is line 91 of this, not of the template."""
    from ..compile.render import render_config
    from ..errors import BuildError

    root = Path(args.project)
    project = load_project(root)
    spec = project.kernels.get(args.kernel)
    if spec is None:
        raise CliError(f"no kernel named {_shown(args.kernel)} in {root}; its kernels: {', '.join(project.kernels)}")
    type_values = {**spec.types, **spec.constants}
    types = {name: values[0] for name, values in type_values.items()}
    types.update(
        _chosen(
            "--types",
            _pairs("--types", args.types or ()),
            type_values,
            ("type parameter or constant", "type parameters and constants"),
            spec.name,
        )
    )
    config = {axis: spec.default[axis] for axis in spec.space}  # in the space's order, as the build labels variants
    config.update(_chosen("--config", _pairs("--config", args.config or ()), dict(spec.space), ("axis", "axes"), spec.name))
    _check_constraints(spec, types, config)
    try:
        variant, header_files = render_config(spec, types, config)
    except BuildError as exc:  # a template error: file:line: message (kernel, config)
        raise CliError(str(exc).strip().splitlines()[0].removeprefix(f"{PROG}: ")) from None
    if args.plain:
        sys.stdout.write(variant.source)
        return EXIT_OK
    out = [f"// {variant.label}: {spec.entry}.cu as NVRTC compiles it, rendered from {spec.template}"]
    out += _numbered(variant.source)
    for name, text in variant.headers:
        out.append(f'// #include "{name}": {header_files[name]}' + ("" if args.headers else " (--headers prints it)"))
        if args.headers:
            out += _numbered(text)
    if not variant.headers:
        out.append('// no headers (#include "...")')
    for header_set in variant.header_sets:
        out.append(
            f"// header set {header_set.name}: {header_set.label}; sha256 {header_set.identity[:16]}; {' '.join(header_set.folders)}"
        )
    if not variant.header_sets:
        out.append('// no header sets (#include <...>): `headers = ["cuda"]` adds the toolkit\'s')
    sys.stdout.write("\n".join(out) + "\n")
    return EXIT_OK


def _numbered(text: str) -> list[str]:
    """The lines of a source, each after its number as NVRTC counts them (newlines only)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    width = len(str(len(lines)))
    return [f"{n:>{width}}  {line}" if line else f"{n:>{width}}" for n, line in enumerate(lines, 1)]
