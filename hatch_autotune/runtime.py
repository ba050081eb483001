"""Run-time loader, copied verbatim into every wheel that hatch-autotune builds.

It must work with the standard library alone at import time (cuda-python is imported lazily,
only to ask the current device for its arch), and it must never import ``hatch_autotune``:
a built wheel carries this file as ``<module>/_runtime.py``. Logic that the build side needs
too (expression trees, key -> bucket mapping, arch fallback) lives here, so there is one copy.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

TABLE_SCHEMA = 1
TABLE_FILE = "table.json"

# --------------------------------------------------------------------------------------------
# Expression trees.
#
# Config expressions (constraints, shapes, grid/block) are parsed and whitelisted at build time
# by hatch_autotune.expr and shipped as JSON trees: a number or bool is a literal; a list is
# [op, *operands] with op one of the keys of _OPS, "n" (a name), "neg", "not", "and", "or",
# "cmp" (chained comparison: [cmp, a, [op, b], [op, c], ...]), "if" (ternary) and "call".
# Nothing read from a data file is ever passed to eval().


def cdiv(a: int, b: int) -> int:
    """Ceiling division of integers, the usual grid-size helper."""
    return -(-a // b)


FUNCTIONS: dict[str, Callable[..., Any]] = {"cdiv": cdiv, "min": min, "max": max}

_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "//": lambda a, b: a // b,
    "%": lambda a, b: a % b,
    "**": lambda a, b: a**b,
}
_CMPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


class ExpressionError(ValueError):
    """A malformed expression tree (a corrupt or foreign table)."""


def compile_expr(tree: Any) -> Callable[[Mapping[str, Any]], Any]:
    """Turn a tree into a closure over an environment mapping; built once, called per launch."""
    if isinstance(tree, (bool, int, float)):
        return lambda env, v=tree: v
    if not isinstance(tree, list) or not tree or not isinstance(tree[0], str):
        raise ExpressionError(f"not an expression tree: {tree!r}")
    op, args = tree[0], tree[1:]
    if op == "n" and len(args) == 1 and isinstance(args[0], str):
        name = args[0]
        return lambda env: env[name]
    if op in _OPS and len(args) == 2:
        f, a, b = _OPS[op], compile_expr(args[0]), compile_expr(args[1])
        return lambda env: f(a(env), b(env))
    if op == "neg" and len(args) == 1:
        a = compile_expr(args[0])
        return lambda env: -a(env)
    if op == "not" and len(args) == 1:
        a = compile_expr(args[0])
        return lambda env: not a(env)
    if op in ("and", "or") and len(args) >= 2:
        parts = [compile_expr(x) for x in args]
        if op == "and":
            return lambda env: all(p(env) for p in parts)
        return lambda env: any(p(env) for p in parts)
    if op == "cmp" and len(args) >= 2:
        first = compile_expr(args[0])
        rest = []
        for item in args[1:]:
            if not (isinstance(item, list) and len(item) == 2 and item[0] in _CMPS):
                raise ExpressionError(f"bad comparison in expression tree: {item!r}")
            rest.append((_CMPS[item[0]], compile_expr(item[1])))

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
        c, a, b = (compile_expr(x) for x in args)
        return lambda env: a(env) if c(env) else b(env)
    if op == "call" and len(args) >= 1 and args[0] in FUNCTIONS:
        f = FUNCTIONS[args[0]]
        parts = [compile_expr(x) for x in args[1:]]
        return lambda env: f(*(p(env) for p in parts))
    raise ExpressionError(f"unknown expression node {op!r} with {len(args)} operand(s)")


def tree_names(tree: Any) -> set[str]:
    """The free names an expression tree reads."""
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


# --------------------------------------------------------------------------------------------
# Key -> bucket mapping.

MAPPINGS = ("nearest", "floor", "ceil", "exact")


def map_to_bucket(value: int, buckets: Sequence[int], mapping: str = "nearest", dim: str = "key") -> int:
    """The bucket a run-time key value falls into; values outside the range clamp to the ends.

    ``nearest`` is nearest in log2 (ties go to the smaller bucket), ``floor`` the largest bucket
    not above the value, ``ceil`` the smallest not below it, ``exact`` only a declared bucket.
    """
    if mapping == "exact":
        if value in buckets:
            return value
        raise ValueError(f"{dim}={value} is not one of the exact buckets {list(buckets)}")
    if value <= buckets[0]:
        return buckets[0]
    if value >= buckets[-1]:
        return buckets[-1]
    lo = max(b for b in buckets if b <= value)
    if lo == value:
        return lo
    hi = min(b for b in buckets if b > value)
    if mapping == "floor":
        return lo
    if mapping == "ceil":
        return hi
    if mapping != "nearest":
        raise ValueError(f"unknown bucket mapping {mapping!r} for {dim}; expected one of {MAPPINGS}")
    lv = math.log2(value)
    return lo if (lv - math.log2(lo)) <= (math.log2(hi) - lv) else hi


# --------------------------------------------------------------------------------------------
# Archs and fallback.

_ARCH_RE = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")


def parse_arch(arch: str) -> tuple[str, int, int, str]:
    """'sm_90a' -> ('sm', 9, 0, 'a'); 'compute_80' -> ('compute', 8, 0, '')."""
    m = _ARCH_RE.match(arch)
    if not m:
        raise ValueError(f"not a CUDA arch: {arch!r} (expected e.g. 'sm_90' or 'compute_90')")
    return m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)


def as_compute_capability(arch: Any) -> tuple[int, int]:
    """Accepts 'sm_86', '8.6', 86, (8, 6) and returns (8, 6)."""
    if isinstance(arch, tuple) and len(arch) == 2:
        return int(arch[0]), int(arch[1])
    if isinstance(arch, int) and not isinstance(arch, bool):
        return arch // 10, arch % 10
    if isinstance(arch, str):
        if re.fullmatch(r"\d+\.\d", arch):
            major, minor = arch.split(".")
            return int(major), int(minor)
        _, major, minor, _ = parse_arch(arch)
        return major, minor
    raise TypeError(f"arch: expected 'sm_XY', 'X.Y', an int XY or a (major, minor) tuple, got {arch!r}")


def choose_arch(device_cc: tuple[int, int], cubin_archs: Sequence[str], ptx_archs: Sequence[str]) -> tuple[str, str]:
    """Pick the binary for a device: (arch of the binary, 'cubin' or 'ptx').

    Exact cubin (an 'a' arch only on exactly its own device, preferred there) -> a cubin of
    the same major with a lower minor -> PTX of an arch not above the device (JIT) -> error.
    """
    major, minor = device_cc
    best: tuple[int, int, str] | None = None
    for arch in cubin_archs:
        _, a_major, a_minor, suffix = parse_arch(arch)
        if a_major != major or a_minor > minor:
            continue
        if suffix and a_minor != minor:
            continue  # arch-specific cubins run only on their own compute capability
        rank = (a_minor, 1 if suffix else 0)
        if best is None or rank > best[:2]:
            best = (rank[0], rank[1], arch)
    if best is not None:
        return best[2], "cubin"
    usable = [a for a in ptx_archs if parse_arch(a)[1:3] <= (major, minor)]
    if usable:
        return max(usable, key=lambda a: parse_arch(a)[1:3]), "ptx"
    raise RuntimeError(
        f"no binary in this wheel runs on a device of compute capability {major}.{minor} "
        f"(sm_{major}{minor}): it has cubins for {', '.join(cubin_archs) or 'no arch'} and PTX for "
        f"{', '.join(ptx_archs) or 'no arch'}; rebuild the wheel with sm_{major}{minor} in `archs`"
    )


def current_device_cc(device_id: int = 0) -> tuple[int, int]:
    """Compute capability of a CUDA device; the only place this module touches the driver."""
    from cuda.bindings import driver  # lazy: importing the generated module touches no GPU

    (err,) = driver.cuInit(0)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuInit failed: {err}")
    attr = driver.CUdevice_attribute
    err, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_id)
    err2, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_id)
    if err != driver.CUresult.CUDA_SUCCESS or err2 != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cannot read the compute capability of device {device_id}: {err}, {err2}")
    return int(major), int(minor)


def cubin_sm(data: bytes) -> int:
    """The SM number (e.g. 90) a CUDA ELF cubin was built for; ValueError if not a cubin."""
    if len(data) < 52 or data[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    if int.from_bytes(data[18:20], "little") != 190:  # EM_CUDA
        raise ValueError("ELF machine is not EM_CUDA (190)")
    flags = int.from_bytes(data[48:52], "little")
    abi_version = data[8]
    return (flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF


# --------------------------------------------------------------------------------------------
# The table shipped in the wheel and the kernel objects built from it.


class IntegrityError(RuntimeError):
    """A shipped file does not match the sha256 recorded for it."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Selection:
    """What `Kernel.select` answers: which variant runs, with which config, and why."""

    kernel: str
    variant: str
    config: Mapping[str, Any]
    types: Mapping[str, str]
    bucket: Mapping[str, int]
    tuned: bool
    arch: str  # the table arch whose choice this is (e.g. 'sm_80' on an sm_86 device)
    binary: str  # the binary that runs: 'sm_80' (cubin) or 'compute_90' (PTX, JIT-compiled)


def types_key(types: Mapping[str, str]) -> str:
    """'T=float32' (sorted, comma-joined), or '-' for a kernel without type parameters."""
    return ",".join(f"{k}={types[k]}" for k in sorted(types)) or "-"


class Kernel:
    """One kernel of a generated module: selection now; loading and launching build on it."""

    def __init__(self, name: str, spec: Mapping[str, Any], library: "Library"):
        self.name = name
        self.entry: str = spec["entry"]
        self.doc: str = spec.get("doc", "")
        self.args: list[dict[str, Any]] = spec["args"]
        self.key: list[dict[str, Any]] = spec["key"]
        self.type_params: dict[str, list[str]] = spec["type_params"]
        self.launch_trees: dict[str, Any] = spec["launch"]
        self.variants: dict[str, dict[str, Any]] = spec["variants"]
        self._library = library
        self._key_names = [k["name"] for k in self.key]
        # (types_key, arch) -> {bucket tuple -> entry}
        self._select: dict[tuple[str, str], dict[tuple[int, ...], dict[str, Any]]] = {}
        for tkey, per_arch in spec["select"].items():
            for arch, entries in per_arch.items():
                self._select[(tkey, arch)] = {tuple(e["bucket"]): e for e in entries}
        self.launch = {
            "grid": [compile_expr(t) for t in self.launch_trees["grid"]],
            "block": [compile_expr(t) for t in self.launch_trees["block"]],
            "shared": compile_expr(self.launch_trees["shared"]),
        }

    @property
    def buckets(self) -> dict[str, list[int]]:
        return {k["name"]: list(k["buckets"]) for k in self.key}

    @property
    def provenance(self) -> dict[str, Any]:
        """Per (types, arch, bucket): tuned or default, and where it was tuned."""
        out: dict[str, Any] = {}
        for (tkey, arch), entries in sorted(self._select.items()):
            for bucket, e in sorted(entries.items()):
                label = " ".join(f"{n}={b}" for n, b in zip(self._key_names, bucket))
                out[f"{tkey} {arch} {label}"] = {
                    "variant": e["variant"],
                    "tuned": e["tuned"],
                    "provenance": e.get("provenance", {}),
                }
        return out

    def __repr__(self) -> str:
        return f"<hatch-autotune kernel {self.name} key=({', '.join(self._key_names)})>"

    def _resolve_types(self, given: dict[str, Any]) -> dict[str, str]:
        types: dict[str, str] = {}
        for tp, allowed in self.type_params.items():
            if tp in given:
                value = str(given.pop(tp))
                if value not in allowed:
                    raise ValueError(f"{self.name}: type parameter {tp}={value!r}; expected one of {allowed}")
                types[tp] = value
            elif len(allowed) == 1:
                types[tp] = allowed[0]
            else:
                raise TypeError(f"{self.name}.select() needs type parameter {tp}= (one of {allowed})")
        return types

    def select(self, arch: Any = None, **key: Any) -> Selection:
        """Choose the variant for key dims (and type parameters) on a device arch.

        ``arch`` is 'sm_86', '8.6', 86 or (8, 6); None asks the current CUDA device.
        """
        given = dict(key)
        types = self._resolve_types(given)
        missing = [n for n in self._key_names if n not in given]
        unknown = sorted(set(given) - set(self._key_names))
        if unknown:
            raise TypeError(f"{self.name}.select(): unknown key {unknown}; the key dims are {self._key_names}")
        if missing:
            raise TypeError(f"{self.name}.select(): missing key dim(s) {missing}")
        bucket = []
        for k in self.key:
            value = given[k["name"]]
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{self.name}.select(): key dim {k['name']} must be an int, got {value!r}")
            bucket.append(map_to_bucket(value, k["buckets"], k["mapping"], k["name"]))
        cc = as_compute_capability(arch) if arch is not None else current_device_cc()
        table_arch, binary = self._library.binary_for(cc)
        tkey = types_key(types)
        entry = self._select[(tkey, table_arch)][tuple(bucket)]
        variant = self.variants[entry["variant"]]
        return Selection(
            kernel=self.name,
            variant=entry["variant"],
            config=dict(variant["config"]),
            types=types,
            bucket=dict(zip(self._key_names, bucket)),
            tuned=bool(entry["tuned"]),
            arch=table_arch,
            binary=table_arch if binary == "cubin" else self._library.ptx_for[table_arch],
        )

    def binary(self, selection: Selection) -> bytes:
        """The cubin (or PTX) bytes of a selection, checked against their sha256."""
        info = self.variants[selection.variant]["binaries"][selection.binary]
        return self._library.read_checked(info["file"], info["sha256"])


class Library:
    """The table of a generated module plus the files next to it."""

    def __init__(self, directory: str, table: Mapping[str, Any]):
        self.directory = directory
        self.table = table
        self.module: str = table["module"]
        self.cubin_archs: list[str] = list(table["archs"])
        # table arch -> the PTX arch compiled from that arch's winners
        self.ptx_for: dict[str, str] = dict(table.get("ptx", {}))
        self.provenance: dict[str, Any] = dict(table.get("provenance", {}))
        self.kernels = {name: Kernel(name, spec, self) for name, spec in sorted(table["kernels"].items())}
        self._lock = threading.Lock()
        self._arch_cache: dict[tuple[int, int], tuple[str, str]] = {}

    @classmethod
    def load(cls, directory: str, table_sha256: str | None = None) -> "Library":
        path = os.path.join(directory, TABLE_FILE)
        with open(path, "rb") as f:
            raw = f.read()
        if table_sha256 is not None and sha256_hex(raw) != table_sha256:
            raise IntegrityError(
                f"{path} does not match the sha256 recorded in the generated module "
                f"(expected {table_sha256}, got {sha256_hex(raw)}); reinstall the package"
            )
        try:
            table = json.loads(raw)
        except ValueError as exc:
            raise IntegrityError(f"{path} is not valid JSON: {exc}") from None
        if not isinstance(table, dict) or table.get("schema") != TABLE_SCHEMA:
            raise IntegrityError(f"{path}: unsupported selection-table schema {table.get('schema')!r}")
        return cls(directory, table)

    def binary_for(self, cc: tuple[int, int]) -> tuple[str, str]:
        """(table arch, 'cubin'|'ptx') for a compute capability, memoised per device."""
        hit = self._arch_cache.get(cc)
        if hit is None:
            ptx_archs = sorted(self.ptx_for.values())
            arch, how = choose_arch(cc, self.cubin_archs, ptx_archs)
            if how == "ptx":
                arch = next(t for t, p in self.ptx_for.items() if p == arch)
            hit = self._arch_cache.setdefault(cc, (arch, how))
        return hit

    def read_checked(self, relpath: str, expected_sha256: str) -> bytes:
        path = os.path.join(self.directory, relpath)
        with open(path, "rb") as f:
            data = f.read()
        if sha256_hex(data) != expected_sha256:
            raise IntegrityError(
                f"{path} does not match its sha256 in {TABLE_FILE} "
                f"(expected {expected_sha256}, got {sha256_hex(data)}); reinstall the package"
            )
        return data
