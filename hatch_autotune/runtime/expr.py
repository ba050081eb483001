"""Expression trees: the runtime's evaluator of config expressions (constraints, shapes, grid
and block), with bounds that keep every evaluation cheap.

Expressions are parsed and whitelisted at build time by hatch_autotune.declare.expr and shipped
as JSON trees: a number or bool is a literal; a list is [op, *operands] with op one of the keys
of _OPS, "n" (a name), "neg", "not", "and", "or", "cmp" (chained comparison: [cmp, a, [op, b],
[op, c], ...]), "if" (ternary) and "call". Nothing read from a data file is ever passed to eval().
"""

from __future__ import annotations

import json

from .errors import ExpressionError, short_repr

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs a cold import time
if TYPE_CHECKING:  # pragma: no cover - for type checkers and linters only
    from collections.abc import Callable, Mapping
    from typing import Any


def cdiv(a: int, b: int) -> int:
    """Ceiling division of integers, the usual grid-size helper."""
    return -(-a // b)


FUNCTIONS: dict[str, Callable[..., Any]] = {"cdiv": cdiv, "min": min, "max": max}

# Bounds that keep every evaluation cheap, whatever a config or a table holds: `9**9**9` or a
# product of huge sizes stops at MAX_INT_BITS instead of taking the machine's time and memory,
# a string axis never meets arithmetic (`S * 10**10` would build a 10 GB string), and trees
# deeper than MAX_EXPR_DEPTH are refused before anything recurses into them.
MAX_INT_BITS = 1024
MAX_EXPR_DEPTH = 64
_INT_LIMIT = 1 << MAX_INT_BITS


def _power(a: Any, b: Any) -> Any:
    """a ** b, refused before it is computed when an integer result would exceed the bound."""
    if type(a) is int and type(b) is int and b > 0 and (abs(a).bit_length() - 1) * b >= MAX_INT_BITS:
        raise ExpressionError(f"{short_repr(a)} ** {short_repr(b)} has more than {MAX_INT_BITS} bits")
    return a**b


def _arithmetic(op: str, f: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def run(a: Any, b: Any) -> Any:
        if type(a) is str or type(b) is str:
            raise ExpressionError(f"`{op}` applied to a string ({short_repr(a)} {op} {short_repr(b)}); arithmetic takes numbers")
        value = f(a, b)
        if type(value) is int:
            if not -_INT_LIMIT < value < _INT_LIMIT:
                raise ExpressionError(f"{op} gives an integer of more than {MAX_INT_BITS} bits")
        elif type(value) is complex:  # a negative base to a fractional power
            raise ExpressionError(f"{short_repr(a)} ** {short_repr(b)} is not a real number")
        return value

    return run


_OPS: dict[str, Callable[[Any, Any], Any]] = {
    op: _arithmetic(op, f)
    for op, f in {
        "+": lambda a, b: a + b,
        "-": lambda a, b: a - b,
        "*": lambda a, b: a * b,
        "/": lambda a, b: a / b,
        "//": lambda a, b: a // b,
        "%": lambda a, b: a % b,
        "**": _power,
    }.items()
}
_CMPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _negate(a: Any) -> Any:
    if type(a) is str:
        raise ExpressionError(f"`-` applied to a string ({a!r}); arithmetic takes numbers")
    return -a


def compile_expr(tree: Any) -> Callable[[Mapping[str, Any]], Any]:
    """Turn a tree into a closure over an environment mapping; built once, called per launch.
    Building raises ExpressionError for a malformed or too deep tree; evaluating raises only
    ExpressionError (a division by zero, a bound exceeded, a string in arithmetic...)."""
    fn = _compile(tree, 0)

    def evaluate(env: Mapping[str, Any]) -> Any:
        try:
            return fn(env)
        except ExpressionError:
            raise
        except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
            raise ExpressionError(f"{type(exc).__name__}: {exc}") from None

    return evaluate


def _compile(tree: Any, depth: int) -> Callable[[Mapping[str, Any]], Any]:
    if depth > MAX_EXPR_DEPTH:
        raise ExpressionError(f"expression tree nested deeper than {MAX_EXPR_DEPTH} levels")
    if isinstance(tree, (bool, int, float)):
        if isinstance(tree, int) and not -_INT_LIMIT < tree < _INT_LIMIT:
            raise ExpressionError(f"an integer literal of more than {MAX_INT_BITS} bits")
        return lambda env: tree
    if not isinstance(tree, list) or not tree or not isinstance(tree[0], str):
        raise ExpressionError(f"not an expression tree: {short_repr(tree)}")
    op, args = tree[0], tree[1:]
    d = depth + 1
    if op == "n" and len(args) == 1 and isinstance(args[0], str):
        name = args[0]
        return lambda env: env[name]
    if op in _OPS and len(args) == 2:
        f, a, b = _OPS[op], _compile(args[0], d), _compile(args[1], d)
        return lambda env: f(a(env), b(env))
    if op == "neg" and len(args) == 1:
        a = _compile(args[0], d)
        return lambda env: _negate(a(env))
    if op == "not" and len(args) == 1:
        a = _compile(args[0], d)
        return lambda env: not a(env)
    if op in ("and", "or") and len(args) >= 2:
        parts = [_compile(x, d) for x in args]
        if op == "and":
            return lambda env: all(p(env) for p in parts)
        return lambda env: any(p(env) for p in parts)
    if op == "cmp" and len(args) >= 2:
        first = _compile(args[0], d)
        rest = []
        for item in args[1:]:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and item[0] in _CMPS):
                raise ExpressionError(f"bad comparison in expression tree: {short_repr(item)}")
            rest.append((_CMPS[item[0]], _compile(item[1], d)))

        def chained(env: Mapping[str, Any]) -> bool:
            left = first(env)
            for cmp, right_fn in rest:
                right = right_fn(env)
                if not cmp(left, right):
                    return False
                left = right
            return True

        return chained
    if op == "if" and len(args) == 3:
        c, a, b = (_compile(x, d) for x in args)
        return lambda env: a(env) if c(env) else b(env)
    if op == "call" and len(args) >= 1 and isinstance(args[0], str) and args[0] in FUNCTIONS:
        f = FUNCTIONS[args[0]]
        parts = [_compile(x, d) for x in args[1:]]
        return lambda env: f(*(p(env) for p in parts))
    raise ExpressionError(f"unknown expression node {short_repr(op)} with {len(args)} operand(s)")


def tree_names(tree: Any) -> set[str]:
    """The free names an expression tree reads (of a tree that compile_expr accepted)."""
    if not isinstance(tree, list) or not tree:
        return set()
    if tree[0] == "n":
        return {tree[1]}
    names: set[str] = set()
    for item in tree[1:]:
        if isinstance(item, list) and len(item) == 2 and tree[0] == "cmp" and item[0] in _CMPS:
            names |= tree_names(item[1])
        else:
            names |= tree_names(item)
    return names


_PRECEDENCE = {"+": 6, "-": 6, "*": 7, "/": 7, "//": 7, "%": 7, "**": 9}


def tree_text(tree: Any) -> str:
    """An expression tree written back as Python would read it (`cdiv(n, BLOCK * VEC)`), for
    docstrings and messages: parentheses only where precedence needs them."""
    return _text(tree, 0)


def _text(tree: Any, outer: int) -> str:
    """`tree` as text, parenthesised when its operator binds looser than `outer`."""
    if not isinstance(tree, list) or not tree or not isinstance(tree[0], str):
        return json.dumps(tree) if isinstance(tree, (list, dict)) else str(tree)
    op, args = tree[0], tree[1:]
    if op == "n" and len(args) == 1:
        return str(args[0])
    if op == "call" and args:
        return f"{args[0]}({', '.join(_text(a, 0) for a in args[1:])})"
    if op in _PRECEDENCE and len(args) == 2:
        level = _PRECEDENCE[op]
        right_assoc = op == "**"  # 2 ** 3 ** 2 is 2 ** (3 ** 2)
        left = _text(args[0], level + (1 if right_assoc else 0))
        right = _text(args[1], level + (0 if right_assoc else 1))
        return _wrap(f"{left} {op} {right}", level, outer)
    if op == "neg" and len(args) == 1:
        return _wrap(f"-{_text(args[0], 8)}", 8, outer)
    if op == "not" and len(args) == 1:
        return _wrap(f"not {_text(args[0], 3)}", 3, outer)
    if op in ("and", "or") and len(args) >= 2:
        level = 2 if op == "and" else 1
        return _wrap(f" {op} ".join(_text(a, level + 1) for a in args), level, outer)
    if op == "cmp" and len(args) >= 2:
        rest = " ".join(f"{c[0]} {_text(c[1], 5)}" if isinstance(c, list) and len(c) == 2 else str(c) for c in args[1:])
        return _wrap(f"{_text(args[0], 5)} {rest}", 4, outer)
    if op == "if" and len(args) == 3:
        return _wrap(f"{_text(args[1], 1)} if {_text(args[0], 1)} else {_text(args[2], 0)}", 0, outer)
    return json.dumps(tree)


def _wrap(text: str, level: int, outer: int) -> str:
    return f"({text})" if level < outer else text
