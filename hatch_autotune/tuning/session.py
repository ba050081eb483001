"""The tuner's side of one worker: a worker process plus what it must be told again after a
restart (a variant that crashes it takes its device state along): the bucket's setup and the
reference, each remembered as the latest one sent."""

from __future__ import annotations

from typing import Any

from ..declare.config import TuningSpec
from .errors import TuningError
from .inputs import InputError, InputRecipe
from .protocol import DeviceInfo, Failure, Hello, HelloReply, Measure, Measured, Prepare, Ready, Reference, Setup
from .worker_client import WorkerClient, WorkerDied


class WorkerSession:
    """A worker on one device: `hello` once (again after a restart), a bucket's `setup`, its
    `reference` (both sent again to a restarted worker), then `measure` per variant. `expect`
    names the bucket likely to come next: its inputs are made in the background as soon as
    the current bucket is set up."""

    def __init__(self, client: WorkerClient, device: int, settings: TuningSpec):
        self.client, self.device, self.settings = client, device, settings
        self.info: DeviceInfo | None = None
        self._setup: Setup | None = None
        self._reference: Reference | None = None
        self._next: InputRecipe | None = None
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

    def _send(self, message: Setup | Reference | Prepare) -> dict[str, Any]:
        reply = self.client.request(message.to_json(), self.settings.timeout_s * 4)
        if not reply.get("ok"):
            failure = Failure.from_json(reply)
            if failure.kind == "input":  # the user's generator or reference: the build stops with its message
                raise InputError(failure.error)
            raise WorkerDied(failure.error or f"{message.op} failed")
        return reply

    def expect(self, inputs: InputRecipe | None) -> None:
        """The next bucket's inputs, made ahead once the current bucket is set up."""
        self._next = inputs

    def setup(self, message: Setup) -> Ready:
        """Send a bucket's setup (remembered, so that a restarted worker gets it again); then
        ask for the expected next bucket's inputs, made while this one measures."""
        self.hello()
        self._setup, self._reference = message, None
        ready = Ready.from_json(self._send(message))
        upcoming, self._next = self._next, None
        if upcoming is not None and upcoming != message.inputs:
            self._send(Prepare(upcoming))
        return ready

    def reference(self, message: Reference) -> None:
        """Make a variant's outputs the bucket's reference (remembered, as the setup is)."""
        self._restart_if_dead()
        self._send(message)
        self._reference = message

    def _restart_if_dead(self) -> None:
        if not self.client.alive and self._setup is not None:  # the last variant killed it: a fresh worker, set up again
            self._greeted = False
            self.hello()
            self._send(self._setup)
            if self._reference is not None:
                self._send(self._reference)

    def measure(self, message: Measure) -> Measured | Failure:
        """The worker's answer; WorkerDied if it crashed or hung (it is restarted on the next request)."""
        self._restart_if_dead()
        reply = self.client.request(message.to_json(), self.settings.timeout_s)
        return Measured.from_json(reply) if reply.get("ok") else Failure.from_json(reply)

    def close(self) -> None:
        self.client.close()
