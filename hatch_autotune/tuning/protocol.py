"""The tuning worker's protocol: what the tuner asks (`Hello`, `Setup`, `Prepare`, `Reference`,
`Measure`) and what the worker answers (`HelloReply`, `Ready`, `Done`, `Measured`, `Failure`), one
JSON object per line each way (worker.py carries the lines). One typed definition per message with its JSON
form, so that the tuner, the worker and any stand-in (a replayed device, a test's fake worker)
agree on the fields.

  {"op": "hello", "device": 0, "flush_l2": true}  -> {"ok": true, "device": {name, cc, driver, limits}}
  {"op": "setup", ...the bucket, its inputs' recipe...}
                                                  -> {"ok": true, "phases", "prefetched"}
  {"op": "prepare", "inputs": recipe}             -> {"ok": true}   (made in the background, for a later setup)
  {"op": "reference", "variant", "binary"}        -> {"ok": true}   (its outputs become the reference)
  {"op": "measure", "variant", "binary", "leader_ms", "timed"}
                                                  -> {"ok": true, "status", "samples", "reason", "phases"}
  any request                                     -> {"ok": false, "error": "...", "fatal": true?, "kind": "input"?}

"binary" is the file of the variant's cubin (compiled as the search goes; setup's "binaries"
may name some up front). A measurement with "timed": false only verifies (the reference's
cross-check). A replayed device adds "seconds" to a measurement: its simulated time. "fatal"
means the worker's CUDA context is unusable; the worker exits after sending it; "kind": "input"
means the user's input generator or reference failed (a build error, not the variant's).
No array crosses the protocol: the worker makes a bucket's inputs from their recipe
(inputs.InputRecipe), and its verification answers with a verdict, not outputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..declare.config import TuningSpec
from ..lock import Bucket, Status
from ..runtime import KernelDecl
from .inputs import InputRecipe


@dataclass(frozen=True)
class Hello:
    """Open a device; the first request a worker gets."""

    op: ClassVar[str] = "hello"
    device: int = 0
    flush_l2: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "device": self.device, "flush_l2": self.flush_l2}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Hello:
        return cls(int(raw.get("device", 0)), bool(raw.get("flush_l2", True)))


@dataclass(frozen=True)
class Limits:
    """What a block may use on the device: the tuner prunes configs that exceed it."""

    max_threads_per_block: int
    max_registers_per_block: int
    max_shared_memory_per_block: int
    # what a block may use once its function opts in (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    # 0 (not given): max_shared_memory_per_block, as a device that allows no more
    max_shared_memory_per_block_optin: int = 0

    def __post_init__(self) -> None:
        if not self.max_shared_memory_per_block_optin:
            object.__setattr__(self, "max_shared_memory_per_block_optin", self.max_shared_memory_per_block)

    def to_json(self) -> dict[str, int]:
        out = {
            "max_threads_per_block": self.max_threads_per_block,
            "max_registers_per_block": self.max_registers_per_block,
            "max_shared_memory_per_block": self.max_shared_memory_per_block,
        }
        if self.max_shared_memory_per_block_optin != self.max_shared_memory_per_block:  # written only when it says more
            out["max_shared_memory_per_block_optin"] = self.max_shared_memory_per_block_optin
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Limits:
        shared = int(raw["max_shared_memory_per_block"])
        optin = int(raw.get("max_shared_memory_per_block_optin", shared))  # absent in a reply of an older worker
        return cls(int(raw["max_threads_per_block"]), int(raw["max_registers_per_block"]), shared, optin)


@dataclass(frozen=True)
class DeviceInfo:
    """The device a worker opened: what the provenance records and the pruning reads."""

    name: str
    cc: tuple[int, int]
    driver: str  # the driver's CUDA version, 'major.minor'
    limits: Limits
    driver_release: str = "unknown"  # the driver's own release ('580.159.04'): two of one CUDA version may differ

    @property
    def arch(self) -> str:
        return "sm_" + "".join(str(c) for c in self.cc)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cc": list(self.cc),
            "driver": self.driver,
            "driver_release": self.driver_release,
            "limits": self.limits.to_json(),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> DeviceInfo:
        major, minor = raw["cc"]
        release = str(raw.get("driver_release") or "unknown")
        return cls(str(raw["name"]), (int(major), int(minor)), str(raw["driver"]), Limits.from_json(raw["limits"]), release)


@dataclass(frozen=True)
class Setup:
    """One bucket: the kernel with its candidate variants, the recipe of its inputs (the worker
    makes them, and the user's reference outputs when the kernel has a reference function), the
    tolerances, the timing settings and the compare kernels' binaries (a file per
    'got/expected' dtype pair: verification on the device). Replaces the previous bucket."""

    op: ClassVar[str] = "setup"
    kernel: KernelDecl
    configs: Mapping[str, Mapping[str, Any]]  # every candidate variant: its id -> its config
    types: Mapping[str, str]
    key: Bucket
    inputs: InputRecipe
    tolerances: Mapping[str, tuple[float, float]]  # per output: (rtol, atol)
    settings: TuningSpec
    binaries: Mapping[str, str] = field(default_factory=dict)  # variant id -> cubin file, for those compiled up front
    comparers: Mapping[str, str] = field(default_factory=dict)  # 'float32/float32' -> the compare kernel's cubin file

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "name": self.kernel.name,
            "kernel": self.kernel.to_json(),
            "configs": {vid: dict(config) for vid, config in self.configs.items()},
            "binaries": dict(self.binaries),
            "types": dict(self.types),
            "key": self.key.as_dict(),
            "inputs": self.inputs.to_json(),
            "tolerances": {k: list(v) for k, v in self.tolerances.items()},
            "settings": dict(vars(self.settings)),
            "comparers": dict(self.comparers),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Setup:
        return cls(
            kernel=KernelDecl.from_json(str(raw["name"]), raw["kernel"]),
            configs={str(vid): dict(config) for vid, config in raw["configs"].items()},
            types=dict(raw["types"]),
            key=Bucket.of(raw["key"]),
            inputs=InputRecipe.from_json(raw["inputs"]),
            tolerances={k: (v[0], v[1]) for k, v in raw["tolerances"].items()},
            settings=TuningSpec(**raw["settings"]),
            binaries=dict(raw["binaries"]),
            comparers=dict(raw.get("comparers", {})),
        )


@dataclass(frozen=True)
class Prepare:
    """Make a later bucket's inputs in the background while this one measures (host work
    only: nothing touches the device, so the timings are undisturbed); its Setup takes them."""

    op: ClassVar[str] = "prepare"
    inputs: InputRecipe

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "inputs": self.inputs.to_json()}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Prepare:
        return cls(InputRecipe.from_json(raw["inputs"]))


@dataclass(frozen=True)
class Reference:
    """Run a variant once; its outputs become the bucket's reference."""

    op: ClassVar[str] = "reference"
    variant: str
    binary: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "variant": self.variant, "binary": self.binary}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Reference:
        return cls(raw["variant"], raw.get("binary") or None)


@dataclass(frozen=True)
class Measure:
    """Verify a variant against the reference, then time it; `leader_ms`, the fastest time
    so far, lets the timer stop a clear loser early. Not `timed`: verify only."""

    op: ClassVar[str] = "measure"
    variant: str
    binary: str | None = None
    leader_ms: float | None = None
    timed: bool = True

    def to_json(self) -> dict[str, Any]:
        out = {"op": self.op, "variant": self.variant, "binary": self.binary, "leader_ms": self.leader_ms}
        return out if self.timed else {**out, "timed": False}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Measure:
        return cls(raw["variant"], raw.get("binary") or None, raw.get("leader_ms"), bool(raw.get("timed", True)))


Request = Hello | Setup | Prepare | Reference | Measure
_REQUESTS: dict[str, Any] = {c.op: c for c in (Hello, Setup, Prepare, Reference, Measure)}  # each message names its op
OPERATIONS = tuple(_REQUESTS)


def parse_request(raw: Mapping[str, Any]) -> Request:
    """A decoded request line to its message; ValueError for an unknown op, KeyError for a
    missing field."""
    op = raw.get("op")
    if op not in OPERATIONS:
        raise ValueError(f"unknown op {op!r}; expected one of {OPERATIONS}")
    message: Request = _REQUESTS[op].from_json(raw)
    return message


@dataclass(frozen=True)
class Done:
    """A request that has nothing to answer went through."""

    def to_json(self) -> dict[str, Any]:
        return {"ok": True}


@dataclass(frozen=True)
class Ready:
    """A bucket is set up: where the worker's time went (seconds: `inputs` made or waited for,
    `reference` the user's reference computed, `upload`), and whether its inputs were made
    ahead (a Prepare)."""

    phases: Mapping[str, float] = field(default_factory=dict)
    prefetched: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "phases": dict(self.phases), "prefetched": self.prefetched}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Ready:
        return cls({k: float(v) for k, v in raw.get("phases", {}).items()}, bool(raw.get("prefetched", False)))


@dataclass(frozen=True)
class HelloReply:
    device: DeviceInfo

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "device": self.device.to_json()}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> HelloReply:
        return cls(DeviceInfo.from_json(raw["device"]))


@dataclass(frozen=True)
class Measured:
    """A measured variant: timed (ok, or eliminated early as a clear loser) with its samples
    (ms), or rejected by verification with the reason. `phases`: where the worker's wall time
    went (run, verify, time); `seconds`: a replayed device's simulated time (None on a GPU,
    whose time is the wall clock)."""

    status: Status  # ok, eliminated or rejected
    samples: tuple[float, ...] = ()
    reason: str = ""
    phases: Mapping[str, float] = field(default_factory=dict)
    seconds: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": True, "status": str(self.status)}
        if self.samples or self.status != Status.REJECTED:
            out["samples"] = list(self.samples)
        if self.reason:
            out["reason"] = self.reason
        out["phases"] = dict(self.phases)
        if self.seconds is not None:
            out["seconds"] = self.seconds
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Measured:
        seconds = raw.get("seconds")
        return cls(
            status=Status(raw["status"]),
            samples=tuple(raw.get("samples", ())),
            reason=raw.get("reason", ""),
            phases={k: float(v) for k, v in raw.get("phases", {}).items()},
            seconds=None if seconds is None else float(seconds),
        )


FailureKind = Literal["", "input"]  # "input": the user's input generator or reference failed


@dataclass(frozen=True)
class Failure:
    """A request the worker could not serve, and why; `fatal`: its CUDA context is unusable,
    and it exits after sending this; `kind` "input": the user's input generator or reference
    failed (the tuner raises it as the build error it is)."""

    error: str
    fatal: bool = False
    kind: FailureKind = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": False, "fatal": True, "error": self.error} if self.fatal else {"ok": False, "error": self.error}
        return {**out, "kind": self.kind} if self.kind else out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Failure:
        return cls(str(raw.get("error", "")), bool(raw.get("fatal", False)), "input" if raw.get("kind") == "input" else "")


Reply = Done | Ready | HelloReply | Measured | Failure
