"""Replay: a tuning device that answers from brute-forced measurements instead of a GPU.

Search strategies are developed and compared without a GPU on real data: Kernel Tuner's cache
files (the benchmark_hub dataset) record every valid config of a space with every repeated
runtime, its compile time, or the error it failed with. A replayed measurement draws its samples
from the recorded runtimes, so the noise is real, and stops by the same rules as the GPU timer
(bench.next_step: repetitions, budget, early elimination); a failed config fails as it did.
Compiling and measuring advance a simulated clock, which a budget in seconds is counted on.

`python benchmarks/replay.py FILE` is a tuning worker (the protocol of worker.py) that the real
engine tunes against, end to end (tests/test_search.py); search_quality.py calls `ReplayDevice`
directly. Research tooling, not part of the plugin: it lives here, outside the package's wheel.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hatch_autotune.declare.config import TuningSpec
from hatch_autotune.tuning.bench import BATCH, median, next_step
from hatch_autotune.tuning.search import SearchSpace


class ReplayDataError(ValueError):
    """The file is not a Kernel Tuner cache, or does not match the space asked of it."""


@dataclass(frozen=True)
class Record:
    """One config as it was measured: its runtimes and their recorded mean (ms; the truth a
    search is judged by), or the error it failed with."""

    times: tuple[float, ...]
    mean_ms: float | None
    error: str
    compile_s: float


@dataclass(frozen=True)
class ReplayData:
    """A Kernel Tuner cache file: the device, the axes and one record per config."""

    device: str
    kernel: str
    axes: Mapping[str, Sequence[Any]]
    configs: Sequence[Mapping[str, Any]]
    records: Sequence[Record]

    @classmethod
    def load(cls, path: Path | str) -> ReplayData:
        path = Path(path)
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt", encoding="utf-8") as f:
                raw = json.load(f)
            axes = {str(k): list(v) for k, v in raw["tune_params"].items()}
            configs, records = [], []
            for _key, entry in raw["cache"].items():
                configs.append({a: entry[a] for a in axes})
                time = entry.get("time")
                ok = isinstance(time, (int, float)) and not isinstance(time, bool)
                times = tuple(float(t) for t in entry.get("times") or [time]) if ok else ()
                records.append(
                    Record(times, float(time) if ok else None, "" if ok else str(time), float(entry.get("compile_time") or 0.0) / 1000)
                )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ReplayDataError(f"{path}: not a readable Kernel Tuner cache file ({type(exc).__name__}: {exc})") from None
        order = {a: {v: r for r, v in enumerate(vals)} for a, vals in axes.items()}
        ranked = sorted(range(len(configs)), key=lambda i: tuple(order[a].get(configs[i][a], -1) for a in axes))
        return cls(
            str(raw.get("device_name", path.stem)),
            str(raw.get("kernel_name", "")),
            axes,
            [configs[i] for i in ranked],  # canonical order, as the tuner enumerates a space
            [records[i] for i in ranked],
        )

    def space(self) -> SearchSpace:
        return SearchSpace(self.axes, self.configs)

    def fastest(self) -> int:
        """The index of the config with the fastest recorded mean: the true optimum."""
        return min((r.mean_ms, i) for i, r in enumerate(self.records) if r.mean_ms is not None)[1]

    def optimum_ms(self) -> float:
        return self.records[self.fastest()].mean_ms

    def matcher(self, space_axes: Sequence[str]) -> Matcher:
        """Looks configs of a kernel whose axes are `space_axes` up in this file: the names must
        be the file's, except that an axis with one value in the file may be left out."""
        fixed = {a: v[0] for a, v in self.axes.items() if len(v) == 1 and a not in space_axes}
        missing = [a for a in self.axes if a not in space_axes and a not in fixed]
        extra = [a for a in space_axes if a not in self.axes]
        if missing or extra:
            raise ReplayDataError(
                f"the kernel's axes ({', '.join(space_axes)}) do not match the replay data's ({', '.join(self.axes)}):"
                + (f" missing {', '.join(missing)}" if missing else "")
                + (f" not in the data: {', '.join(extra)}" if extra else "")
            )
        return Matcher(self, fixed)


class Matcher:
    def __init__(self, data: ReplayData, fixed: Mapping[str, Any]):
        self._axes = list(data.axes)
        self._fixed = dict(fixed)
        self._index = {self._key(c): i for i, c in enumerate(data.configs)}

    def _key(self, config: Mapping[str, Any]) -> tuple:
        return tuple(json.dumps(config[a] if a in config else self._fixed[a]) for a in self._axes)

    def find(self, config: Mapping[str, Any]) -> int | None:
        return self._index.get(self._key(config))


class ReplayDevice:
    """Measures recorded configs as the GPU timer would, on a simulated clock (seconds)."""

    def __init__(self, data: ReplayData, settings: TuningSpec, seed: int = 0):
        self.data, self.settings, self.seed = data, settings, seed
        self.clock_s = 0.0
        self._compiled: set[int] = set()
        self._draws: dict[int, int] = {}

    def measure(self, index: int, leader_ms: float | None) -> tuple[str, tuple[float, ...], str]:
        """(status, samples, reason): ok or eliminated with samples, or failed with the error."""
        record = self.data.records[index]
        if index not in self._compiled:
            self._compiled.add(index)
            self.clock_s += record.compile_s
        if not record.times:
            return "failed", (), f"failed when it was recorded: {record.error}"
        n = self._draws[index] = self._draws.get(index, 0) + 1
        rng = random.Random(f"{self.seed}:{index}:{n}")
        samples: list[float] = []
        while True:
            samples.extend(rng.choice(record.times) for _ in range(min(BATCH, self.settings.max_reps - len(samples))))
            stop, eliminated = next_step(samples, self.settings, leader_ms)
            if stop:
                break
        self.clock_s += (self.settings.warmup * median(samples) + sum(samples)) / 1000
        return ("eliminated" if eliminated else "ok"), tuple(samples), ""


def _serve(data: ReplayData, cc: tuple[int, int], seed: int, lines: Any, out: Any) -> None:
    """The worker protocol, answered from the data (see worker.py's docstring)."""
    device: ReplayDevice | None = None
    variants: dict[str, int | None] = {}
    for line in lines:
        msg = json.loads(line)
        op = msg.get("op")
        reply: dict[str, Any]
        try:
            if op == "hello":
                limits = {"max_threads_per_block": 1024, "max_registers_per_block": 65536, "max_shared_memory_per_block": 49152}
                reply = {"ok": True, "device": {"name": f"{data.device} (replayed)", "cc": list(cc), "driver": "replay", "limits": limits}}
            elif op == "setup":
                configs = dict(msg["configs"])
                axes = list(next(iter(configs.values()))) if configs else []
                matcher = data.matcher(axes)
                variants = {vid: matcher.find(c) for vid, c in configs.items()}
                device = device or ReplayDevice(data, TuningSpec(**msg["settings"]), seed)
                device.settings = TuningSpec(**msg["settings"])
                reply = {"ok": True}
            elif op == "prepare":
                reply = {"ok": True}
            elif op == "measure" and msg.get("timed") is False:  # verify only: a recorded config's outputs are right
                reply = {"ok": True, "status": "ok", "samples": [], "seconds": 0.0}
            elif op in ("reference", "measure"):
                assert device is not None, "setup first"
                index = variants[msg["variant"]]
                if index is None:
                    reply = {"ok": False, "error": f"variant {msg['variant']}'s config is not in the replay data"}
                else:
                    before = device.clock_s
                    status, samples, reason = device.measure(index, msg.get("leader_ms"))
                    if status == "failed":
                        reply = {"ok": False, "error": reason}
                    else:
                        reply = {"ok": True, "status": status, "samples": list(samples), "seconds": device.clock_s - before}
            else:
                reply = {"ok": False, "error": f"unknown op {op!r}"}
        except (ReplayDataError, KeyError, TypeError, AssertionError) as exc:
            reply = {"ok": False, "error": f"replay: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python benchmarks/replay.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="a Kernel Tuner cache file (.json or .json.gz)")
    parser.add_argument("--cc", default="9.0", help="the compute capability the replayed device reports (default 9.0)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the draws from the recorded runtimes")
    args = parser.parse_args(argv)
    major, _, minor = args.cc.partition(".")
    _serve(ReplayData.load(args.data), (int(major), int(minor or 0)), args.seed, sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
