"""The small expression language of the config (constraints, shapes, grid, block, shared).

Strings are parsed with ``ast`` and only a whitelist of nodes is accepted: numbers, names,
arithmetic, comparisons, and/or/not, a ternary, and calls of cdiv/min/max. The result is a
JSON-able tree (see runtime.compile_expr) that the wheel ships, so nothing is ever eval'd.
"""

from __future__ import annotations

import ast
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..runtime import FUNCTIONS, MAX_EXPR_DEPTH, ExpressionError, compile_expr, short_repr, tree_names

_BINOPS = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}
_CMPOPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


MAX_EXPR_CHARS = 1000  # a config expression is a line, not a program


class ExprSyntaxError(ValueError):
    """An expression outside the whitelist or its bounds; the message says what is allowed."""


@dataclass(frozen=True)
class Expr:
    """A parsed expression: its text, its tree, the names it reads, and a compiled closure."""

    text: str
    tree: Any
    names: frozenset[str]
    _fn: Callable[[Mapping[str, Any]], Any] = field(repr=False, compare=False, hash=False)

    def __call__(self, env: Mapping[str, Any]) -> Any:
        return self._fn(env)


def parse(text: str | int | float | bool) -> Expr:
    """Parse one expression (a literal number is accepted as its own expression)."""
    if isinstance(text, float) and not math.isfinite(text):
        raise ExprSyntaxError(f"expected a finite number, got {text}")
    if isinstance(text, (bool, int, float)):
        return _expr(str(text), text)
    if not isinstance(text, str):
        raise ExprSyntaxError(f"expected an expression string or a number, got {type(text).__name__}")
    if len(text) > MAX_EXPR_CHARS:
        raise ExprSyntaxError(f"expression of {len(text)} characters; at most {MAX_EXPR_CHARS} are allowed")
    try:
        with warnings.catch_warnings():  # e.g. "invalid decimal literal" for `1if`: the error below says more
            warnings.simplefilter("ignore", SyntaxWarning)
            node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ExprSyntaxError(f"invalid expression {short_repr(text)}: {exc.msg}") from None
    except (RecursionError, MemoryError):  # CPython's parser gives up on deep nesting this way
        raise ExprSyntaxError(f"expression {short_repr(text)} is nested too deeply (at most {MAX_EXPR_DEPTH} levels)") from None
    return _expr(text, _to_tree(node, text, 0))


def _expr(text: str, tree: Any) -> Expr:
    """The Expr of a whitelisted tree; the runtime's bounds (e.g. on literals) apply, as they
    will when the wheel compiles the same tree."""
    try:
        return Expr(text, tree, frozenset(tree_names(tree)), compile_expr(tree))
    except ExpressionError as exc:
        raise ExprSyntaxError(f"{exc} in expression {short_repr(text)}") from None


def _to_tree(node: ast.AST, text: str, depth: int) -> Any:
    def bad(what: str) -> ExprSyntaxError:
        return ExprSyntaxError(
            f"{what} is not allowed in expression {short_repr(text)}; allowed: integers, names, "
            "+ - * / // % **, comparisons, and/or/not, `a if c else b`, cdiv(), min(), max()"
        )

    if depth > MAX_EXPR_DEPTH:
        raise ExprSyntaxError(f"expression {short_repr(text)} is nested too deeply (at most {MAX_EXPR_DEPTH} levels)")
    d = depth + 1
    if isinstance(node, ast.Constant):
        if isinstance(node.value, float) and not math.isfinite(node.value):  # `1e999` reads as inf
            raise ExprSyntaxError(
                f"the number {ast.get_source_segment(text.strip(), node) or node.value} in expression {short_repr(text)} is not finite"
            )
        if isinstance(node.value, (bool, int, float)):
            return node.value
        raise bad(f"the constant {node.value!r}")
    if isinstance(node, ast.Name):
        return ["n", node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return [_BINOPS[type(node.op)], _to_tree(node.left, text, d), _to_tree(node.right, text, d)]
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.USub):
            return ["neg", _to_tree(node.operand, text, d)]
        if isinstance(node.op, ast.UAdd):
            return _to_tree(node.operand, text, d)
        if isinstance(node.op, ast.Not):
            return ["not", _to_tree(node.operand, text, d)]
    if isinstance(node, ast.BoolOp):
        op = "and" if isinstance(node.op, ast.And) else "or"
        return [op, *(_to_tree(v, text, d) for v in node.values)]
    if isinstance(node, ast.Compare) and all(type(o) in _CMPOPS for o in node.ops):
        return [
            "cmp",
            _to_tree(node.left, text, d),
            *([_CMPOPS[type(o)], _to_tree(c, text, d)] for o, c in zip(node.ops, node.comparators)),
        ]
    if isinstance(node, ast.IfExp):
        return ["if", _to_tree(node.test, text, d), _to_tree(node.body, text, d), _to_tree(node.orelse, text, d)]
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise bad(f"calling {ast.unparse(node.func)}()")
        if node.keywords or not node.args:
            raise bad(f"{node.func.id}() with keywords or no arguments")
        if node.func.id == "cdiv" and len(node.args) != 2:
            raise bad("cdiv() with other than 2 arguments")
        if node.func.id in ("min", "max") and len(node.args) < 2:
            raise bad(f"{node.func.id}() with fewer than 2 arguments")
        return ["call", node.func.id, *(_to_tree(a, text, d) for a in node.args)]
    raise bad(type(node).__name__)
