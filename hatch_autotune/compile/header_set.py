"""A header set as a machine has it: the record that compile/headers.py resolves and every
compile job carries (its own module, so that the NVRTC driver and the resolver need not import
each other)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ResolvedHeaderSet:
    """A header set as this machine has it: what NVRTC is told (`options`, with paths: never in a
    key), what the set is (`identity`, a content hash: in every key), and how to say it (`label`)."""

    name: str
    identity: str
    label: str
    options: tuple[str, ...]
    folders: tuple[str, ...]
