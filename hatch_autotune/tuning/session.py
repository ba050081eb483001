"""The tuner's side of one worker: a worker process plus what it must be told again after a
restart (a variant that crashes it takes its device state along)."""

from __future__ import annotations

from typing import Sequence

from ..declare.config import TuningSpec
from .errors import TuningError
from .protocol import DeviceInfo, Failure, Hello, HelloReply, Measure, Measured, Reference, Setup
from .worker import WorkerClient, WorkerDied


class WorkerSession:
    """A worker on one device: `hello` once (again after a restart), a bucket's setup through
    `prepare` (sent again to a restarted worker), then `measure` per variant."""

    def __init__(self, client: WorkerClient, device: int, settings: TuningSpec):
        self.client, self.device, self.settings = client, device, settings
        self.info: DeviceInfo | None = None
        self._setup: list[Setup | Reference] = []
        self._greeted = False

    def hello(self) -> DeviceInfo:
        if self._greeted and self.client.alive:
            assert self.info is not None
            return self.info
        reply = self.client.request(Hello(self.device, self.settings.flush_l2).to_json(), self.settings.timeout_s * 4)
        if not reply.get("ok"):
            raise TuningError(f"the tuning worker could not open device {self.device}: {Failure.from_json(reply).error}")
        self.info, self._greeted = HelloReply.from_json(reply).device, True
        return self.info

    def _send(self, messages: Sequence[Setup | Reference]) -> None:
        for m in messages:
            reply = self.client.request(m.to_json(), self.settings.timeout_s * 4)
            if not reply.get("ok"):
                raise WorkerDied(Failure.from_json(reply).error or f"{m.op} failed")

    def prepare(self, messages: Sequence[Setup | Reference]) -> None:
        """Send a bucket's setup; remembered so that a restarted worker gets it again."""
        self.hello()
        self._send(messages)
        self._setup = list(messages)

    def measure(self, message: Measure) -> Measured | Failure:
        """The worker's answer; WorkerDied if it crashed or hung (it is restarted on the next request)."""
        if not self.client.alive:  # the last variant killed it: a fresh worker, set up again
            self._greeted = False
            self.hello()
            self._send(self._setup)
        reply = self.client.request(message.to_json(), self.settings.timeout_s)
        return Measured.from_json(reply) if reply.get("ok") else Failure.from_json(reply)

    def close(self) -> None:
        self.client.close()
