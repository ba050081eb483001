"""SASS of compiled cubins, read without a GPU: the CUDA binary utilities from PyPI
(nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm; the `test` extra installs them through
cuda-toolkit[cuobjdump,nvdisasm], at NVRTC's own release) disassemble what NVRTC wrote, so tests
can assert what the machine code does: 128-bit loads, no local memory, registers, FFMA density.

The helpers here know nothing of hatch-autotune; tests/test_sass.py applies them to the showcase
kernels. Instruction patterns are written as SASS spells them, `OPCODE.MOD.MOD`, and match an
instruction with that opcode and at least those modifiers, in any order: `LDG.E.128` matches
`LDG.E.128.CONSTANT` (a __restrict__ const load on sm_80+), `LDGSTS.128` matches
`LDGSTS.E.BYPASS.128` (a 16-byte cp.async.cg).
"""

from __future__ import annotations

import ast
import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

# tool -> the PyPI distribution that ships it (bin/<tool> inside the package's files)
TOOL_DISTRIBUTIONS = {"cuobjdump": "nvidia-cuda-cuobjdump", "nvdisasm": "nvidia-cuda-nvdisasm"}


@functools.cache
def find_tool(name: str) -> Path | None:
    """The `cuobjdump` or `nvdisasm` executable: from the installed PyPI distribution's own file
    list (where pip put it: nvidia/cu13/bin/ today, another folder in another CUDA major), else
    from PATH (a CUDA toolkit installed the other way); None when neither has it."""
    try:
        dist = distribution(TOOL_DISTRIBUTIONS[name])
    except PackageNotFoundError:
        dist = None
    if dist is not None:
        for file in dist.files or []:
            if file.parts[-2:] in (("bin", name), ("bin", f"{name}.exe")):
                path = Path(str(dist.locate_file(file)))
                if path.is_file() and os.access(path, os.X_OK):
                    return path
    found = shutil.which(name)
    return Path(found) if found else None


def missing_tools() -> str | None:
    """Why SASS cannot be read here (a tool not installed), or None when it can: a skip reason."""
    missing = [f"{tool} ({dist})" for tool, dist in TOOL_DISTRIBUTIONS.items() if find_tool(tool) is None]
    if not missing:
        return None
    return f"CUDA binary utilities not installed: {', '.join(missing)}; pip install -e '.[test]' installs them"


def _run_on_cubin(tool: str, args: Sequence[str], cubin: bytes) -> str:
    """`tool args FILE` over the cubin written to a temporary file: the tools read files only."""
    path = find_tool(tool)
    if path is None:
        raise RuntimeError(missing_tools())
    with tempfile.TemporaryDirectory(prefix="sass-") as tmp:
        file = Path(tmp) / "kernel.cubin"
        file.write_bytes(cubin)
        proc = subprocess.run([str(path), *args, str(file)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{path.name} {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout[-2000:]}")
    return proc.stdout


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: its byte offset in the function, predicate guard (`@!P0`, or ''),
    opcode with modifiers (`LDG.E.128.CONSTANT`) and operand text (labels resolved to offsets
    in `target`, for branches)."""

    offset: int
    guard: str
    opcode: str
    operands: str
    target: int | None = None  # a branch's destination offset

    @property
    def base(self) -> str:
        """The opcode without modifiers: `LDG` of `LDG.E.128`."""
        return self.opcode.split(".", 1)[0]

    @property
    def modifiers(self) -> frozenset[str]:
        return frozenset(self.opcode.split(".")[1:])

    def matches(self, pattern: str) -> bool:
        """The pattern's opcode, with at least its modifiers (see the module's docstring)."""
        base, *mods = pattern.split(".")
        return self.base == base and self.modifiers.issuperset(mods)

    @property
    def is_branch(self) -> bool:
        return self.base == "BRA"


# `        /*0120*/      @!P0 BRA `(.L_x_2) ;` (nvdisasm) or `... BRA 0x170 ;` (cuobjdump -sass)
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-fA-F]+)\*/\s+(?:(@!?U?P(?:T|\d+))\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\s*([^;]*);")
_LABEL = re.compile(r"^(\.L_x_\d+|[A-Za-z_.$][\w.$]*):\s*$")
_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_LABEL_TARGET = re.compile(r"`\(([^)]+)\)")
_HEX_TARGET = re.compile(r"^(0x[0-9a-fA-F]+)\b")


def parse_sass(text: str) -> dict[str, list[Instruction]]:
    """Function name -> its instructions in address order, from nvdisasm's or cuobjdump -sass's
    text; a branch's `target` is its destination offset (a label resolved, or the hex address)."""
    raw: dict[str, list[tuple[int, str, str, str]]] = {}
    labels: dict[str, dict[str, int]] = {}
    pending: list[str] = []  # labels waiting for the next instruction's offset
    current = ""
    for line in text.splitlines():
        m = _SECTION.match(line) or _FUNCTION.match(line)
        if m:
            current = m.group(1)
            raw.setdefault(current, [])
            labels.setdefault(current, {})
            pending = []
            continue
        m = _LABEL.match(line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTRUCTION.match(line)
        if m:
            offset = int(m.group(1), 16)
            for label in pending:
                labels.setdefault(current, {})[label] = offset
            pending = []
            raw.setdefault(current, []).append((offset, m.group(2) or "", m.group(3), m.group(4).strip()))
    out: dict[str, list[Instruction]] = {}
    for name, rows in raw.items():
        instructions = []
        for offset, guard, opcode, operands in rows:
            target = None
            if opcode.split(".", 1)[0] == "BRA":
                by_label = _LABEL_TARGET.search(operands)
                by_hex = _HEX_TARGET.match(operands)
                if by_label and by_label.group(1) in labels.get(name, {}):
                    target = labels[name][by_label.group(1)]
                elif by_hex:
                    target = int(by_hex.group(1), 16)
            instructions.append(Instruction(offset, guard, opcode, operands, target))
        out[name] = instructions
    return out


@functools.lru_cache(maxsize=512)
def disassemble(cubin: bytes) -> dict[str, list[Instruction]]:
    """Each function of a cubin as instructions (nvdisasm, without its dataflow pass: a third
    faster, and branch targets are printed either way). Cached by content: a winner that is
    also the default is disassembled once."""
    return parse_sass(_run_on_cubin("nvdisasm", ["--print-code", "--no-dataflow"], cubin))


def function_sass(cubin: bytes, function: str | None = None) -> list[Instruction]:
    """The instructions of one function of a cubin (its only one when `function` is None)."""
    functions = disassemble(cubin)
    if function is None:
        if len(functions) != 1:
            raise ValueError(f"the cubin has {len(functions)} functions ({', '.join(functions)}); name one")
        return next(iter(functions.values()))
    return functions[function]


@dataclass(frozen=True)
class Usage:
    """What `cuobjdump -res-usage` reports for a function: registers per thread, shared memory
    per block, local memory and stack per thread (bytes)."""

    registers: int
    shared: int
    local: int
    stack: int


_USAGE_FUNCTION = re.compile(r"^\s*Function\s+(\S+?):\s*$")
_USAGE_FIELD = re.compile(r"\b(REG|SHARED|LOCAL|STACK):(\d+)")


def parse_usage(text: str) -> dict[str, Usage]:
    """Function name -> Usage, from `cuobjdump -res-usage` text."""
    out: dict[str, Usage] = {}
    name = None
    for line in text.splitlines():
        m = _USAGE_FUNCTION.match(line)
        if m:
            name = m.group(1)
            continue
        fields = dict(_USAGE_FIELD.findall(line))
        if name and "REG" in fields:
            out[name] = Usage(int(fields["REG"]), int(fields.get("SHARED", 0)), int(fields.get("LOCAL", 0)), int(fields.get("STACK", 0)))
            name = None
    return out


@functools.lru_cache(maxsize=512)
def resource_usage(cubin: bytes) -> dict[str, Usage]:
    """Each function's Usage, read from the cubin itself (not ptxas's log): what ships."""
    return parse_usage(_run_on_cubin("cuobjdump", ["-res-usage"], cubin))


def count(instructions: Iterable[Instruction], pattern: str) -> int:
    """How many instructions match the pattern (see Instruction.matches)."""
    return sum(1 for i in instructions if i.matches(pattern))


def opcodes(instructions: Iterable[Instruction]) -> dict[str, int]:
    """Opcode (with modifiers) -> count: what an assertion message shows instead of the SASS."""
    out: dict[str, int] = {}
    for i in instructions:
        out[i.opcode] = out.get(i.opcode, 0) + 1
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Loop:
    """A loop as laid out in SASS: a branch back to an earlier offset `start`, the body being
    the instructions from `start` to the branch (`end`) inclusive."""

    start: int
    end: int
    body: tuple[Instruction, ...] = field(repr=False)

    @property
    def ffma(self) -> int:
        """FP32 fused multiply-adds in the body (FFMA with any modifier; not HFMA2, DFMA)."""
        return count(self.body, "FFMA")

    @property
    def size(self) -> int:
        """Instructions in the body, NOPs (alignment padding) left out."""
        return sum(1 for i in self.body if i.base != "NOP")

    @property
    def ffma_density(self) -> float:
        """FFMA / instructions of the body: how much of the loop is the math."""
        return self.ffma / self.size if self.size else 0.0

    def contains(self, other: Loop) -> bool:
        return other is not self and self.start <= other.start and other.end <= self.end


def loops(instructions: Sequence[Instruction]) -> list[Loop]:
    """Every backward branch as a Loop, in the order of the branches. A branch to itself (the
    `BRA` trap after a function's last EXIT) is no loop."""
    out = []
    for i in instructions:
        if i.is_branch and i.target is not None and i.target < i.offset:
            body = tuple(x for x in instructions if i.target <= x.offset <= i.offset)
            out.append(Loop(i.target, i.offset, body))
    return out


def hot_loop(instructions: Sequence[Instruction]) -> Loop | None:
    """The innermost loop (one holding no other loop) with the most FFMA, ties to the smaller
    body: a GEMM's main loop. Innermost, so that an outer loop around it (the k-slice loop
    around a partially unrolled inner loop) does not dilute the density with its loads. None
    when no innermost loop has an FFMA."""
    found = loops(instructions)
    innermost = [lp for lp in found if not any(lp.contains(other) for other in found)]
    best = max(innermost, key=lambda lp: (lp.ffma, -lp.size), default=None)
    return best if best is not None and best.ffma > 0 else None


def launch_bounds(source: str, entry: str | None = None) -> tuple[int, int] | None:
    """(maxThreadsPerBlock, minBlocksPerMultiprocessor) of the `__launch_bounds__(...)` in a
    rendered CUDA source (of the function named `entry` when given; minBlocks 1 when not
    written); None when it has none. ValueError when an argument is not an integer expression
    of literals (a macro: the test cannot know its value)."""
    for m in re.finditer(r"__launch_bounds__\s*\(", source):
        depth, pos = 1, m.end()
        while depth and pos < len(source):
            depth += {"(": 1, ")": -1}.get(source[pos], 0)
            pos += 1
        declared = re.search(r"(\w+)\s*\(", source[pos : pos + 400])  # the function it is written on
        if entry is not None and (declared is None or declared.group(1) != entry):
            continue
        args = _split_args(source[m.end() : pos - 1])
        values = [_int_expression(a) for a in args]
        return values[0], values[1] if len(values) > 1 else 1
    return None


def _split_args(text: str) -> list[str]:
    """A macro argument list split at its top-level commas."""
    parts, depth, start = [], 0, 0
    for pos, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(text[start:pos])
            start = pos + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _int_expression(text: str) -> int:
    """An integer expression of literals, + - * / % and parentheses, as C++ reads it (/ on
    integers truncates)."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            a, b = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, (ast.Div, ast.FloorDiv)):
                return int(a / b)
            if isinstance(node.op, ast.Mod):
                return a - int(a / b) * b
        raise ValueError(f"__launch_bounds__ argument {text!r} is not an integer expression of literals")

    try:
        return value(ast.parse(re.sub(r"\b(\d+)[uUlL]+\b", r"\1", text), mode="eval").body)
    except SyntaxError:
        raise ValueError(f"__launch_bounds__ argument {text!r} is not an integer expression of literals") from None
