"""Hardening of the services a build talks to (issue #33): a Redis server that answers slowly or
lies about its values' sizes, a Ray address where nothing answers, and `cache clear` while a
build writes. Every server here is real, on 127.0.0.1, started and stopped by its test: a fake
Redis that speaks just enough RESP to misbehave, a redis-server for the happy path, plain
sockets where a Ray head should be."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import test_remote_cache
from conftest import write_tiny_project
from test_remote_cache import RESOURCES

from hatch_autotune import cli
from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.compile.entry import CacheEntry
from hatch_autotune.compile.remote_cache import RemoteCache

redis_server = test_remote_cache.redis_server  # the module's real redis-server (skipped without one)
KEY = "ab" * 32
ENTRY = CacheEntry(ok=True, log="", label="scale BLOCK=128", resources=RESOURCES, binary=bytes(range(256)) * 4)

# ---- a fake Redis --------------------------------------------------------------------------------

Answer = Callable[[list[bytes], dict], Iterator[bytes]]


def accept_until(listener: socket.socket, stopping: threading.Event, on_connection: Callable[[socket.socket], object]) -> None:
    """Hand each connection to `on_connection` until `stopping` is set or the listener closes
    (the listener's timeout lets the loop see `stopping`)."""
    while not stopping.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        on_connection(conn)


class FakeRedis:
    """A TCP server on 127.0.0.1 that reads RESP commands (arrays of bulk strings) and writes, for
    each, the chunks `answer(command, state)` yields (`state`: one dict per connection), waiting
    `pause` seconds between chunks. A connection is dropped after `lifetime` seconds, so that a
    client that would wait forever is released when its test has failed. `sent`: bytes written."""

    def __init__(self, answer: Answer, *, pause: float = 0.0, lifetime: float = 15.0):
        self.answer, self.pause, self.lifetime = answer, pause, lifetime
        self.sent = 0
        self.stopping = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.connections: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        accept_until(self.listener, self.stopping, self._start_serving)

    def _start_serving(self, conn: socket.socket) -> None:
        self.connections.append(conn)
        thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
        self.threads.append(thread)
        thread.start()

    def _serve(self, conn: socket.socket) -> None:
        ends = time.monotonic() + self.lifetime
        conn.settimeout(self.lifetime)
        state: dict = {}
        try:
            with conn.makefile("rb") as reader:
                while (command := read_command(reader)) is not None:
                    for chunk in self.answer(command, state):
                        if self.stopping.is_set() or time.monotonic() > ends:
                            return
                        conn.sendall(chunk)
                        self.sent += len(chunk)
                        if self.pause:
                            self.stopping.wait(self.pause)
        except (OSError, ValueError):  # the client hung up, or the test is over
            pass
        finally:
            conn.close()

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()
        for conn in self.connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self.threads:
            thread.join(5)


def read_command(reader) -> list[bytes] | None:
    line = reader.readline()
    if not line:
        return None
    args = []
    for _ in range(int(line[1:])):
        size = int(reader.readline()[1:])
        args.append(reader.read(size + 2)[:-2])
    return args


@pytest.fixture
def fake_redis():
    started: list[FakeRedis] = []

    def start(answer: Answer, **options) -> FakeRedis:
        started.append(FakeRedis(answer, **options))
        return started[-1]

    yield start
    for fake in started:
        fake.stop()


def dribble(command: list[bytes], state: dict) -> Iterator[bytes]:
    """A reply that never ends, one byte at a time: each read gets a byte well within its timeout."""
    yield b"+"
    while True:
        yield b"x"


HUGE = 128 << 20
CHUNK = 64 << 10


def liar(lie_to: bytes) -> Answer:
    """A server whose reply to `lie_to` (STRLEN or GETRANGE) is a 128 MiB value; every other
    reply is what Redis would say of a 10-byte value."""

    def reply(name: bytes) -> Iterator[bytes]:
        if name == lie_to:
            yield b"$%d\r\n" % HUGE
            for _ in range(HUGE // CHUNK):
                yield bytes(CHUNK)
            yield b"\r\n"
        elif name == b"STRLEN":
            yield b":10\r\n"
        elif name == b"GETRANGE":
            yield b"$10\r\n0123456789\r\n"
        elif name == b"EXPIRE":
            yield b":1\r\n"
        elif name == b"HELLO":  # redis-py >= 8 speaks RESP3 and checks the protocol the server names
            yield b"%1\r\n+proto\r\n:3\r\n"
        else:
            yield b"+OK\r\n"

    def answer(command: list[bytes], state: dict) -> Iterator[bytes]:
        name = command[0].upper()
        if name == b"MULTI":
            state["queued"] = []
            yield b"+OK\r\n"
        elif name == b"EXEC":
            queued = state.pop("queued")
            yield b"*%d\r\n" % len(queued)
            for q in queued:
                yield from reply(q)
        elif "queued" in state:
            state["queued"].append(name)
            yield b"+QUEUED\r\n"
        else:
            yield from reply(name)

    return answer


# ---- #5: a slow Redis ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "operation",
    [
        pytest.param(lambda cache: cache.get(KEY), id="get"),
        pytest.param(lambda cache: cache.put(KEY, ENTRY), id="put"),
        pytest.param(lambda cache: cache.probe(), id="probe"),
    ],
)
def test_a_server_that_dribbles_its_reply_costs_one_timeout_not_forever(fake_redis, operation):
    """One byte every 0.3 s never trips a 1 s timeout per read; the operation as a whole is
    bounded, and the tier switches off with the usual warning."""
    fake = fake_redis(dribble, pause=0.3)
    cache = RemoteCache(fake.url, timeout=1.0)
    started = time.monotonic()
    operation(cache)
    assert time.monotonic() - started < 10, "the operation waited on the dribbling server"
    assert cache.error is not None and "did not answer within 1 s" in cache.error, cache.error
    assert cache.get(KEY) is None  # switched off: no second wait


# ---- #17: a Redis that lies about a value's size ---------------------------------------------------


@pytest.mark.parametrize("lie_to", [b"STRLEN", b"GETRANGE"])
def test_a_reply_larger_than_asked_for_is_not_downloaded(fake_redis, lie_to):
    """STRLEN says 10 bytes, then GETRANGE sends 128 MiB (or STRLEN itself answers with 128 MiB):
    the client stops reading at the size it asked for, the get is a miss, and the tier switches
    off with a warning."""
    fake = fake_redis(liar(lie_to))
    cache = RemoteCache(fake.url, timeout=10.0, max_bytes=1 << 20)
    assert cache.get(KEY) is None
    assert cache.error is not None and "sent more than was asked for" in cache.error, cache.error
    fake.stop()
    assert fake.sent < 32 << 20, f"the client took {fake.sent} bytes of a lying reply"


def test_values_larger_than_small_replies_still_round_trip(redis_server):
    """The bound on replies follows the sizes asked for: a 4 MiB binary is a hit."""
    big = CacheEntry(ok=True, log="", label="big", resources=RESOURCES, binary=os.urandom(4 << 20))
    RemoteCache(redis_server.url).put(KEY, big)
    reader = RemoteCache(redis_server.url)
    assert reader.get(KEY) == big and reader.error is None


# ---- #6: a Ray address where nothing answers ----------------------------------------------------


class FakeHead:
    """A socket on 127.0.0.1 where a Ray head should be: `silent` accepts and never answers,
    `closes` accepts and hangs up, `refused` is a port nothing listens on."""

    def __init__(self, behaviour: str):
        self.behaviour = behaviour
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        if behaviour == "refused":
            self.listener.close()
            return
        self.listener.settimeout(0.2)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        accept_until(self.listener, self.stopping, lambda conn: conn.close() if self.behaviour == "closes" else self.held.append(conn))

    def stop(self) -> None:
        if self.behaviour == "refused":
            return
        self.stopping.set()
        self.thread.join(5)
        self.listener.close()
        for conn in self.held:
            conn.close()


def run_tune(root: Path, env: dict[str, str], *args: str, timeout: float = 45) -> subprocess.CompletedProcess:
    """`hatch-autotune tune ROOT ARGS` in a process of its own (its session killed whole after
    `timeout` s: the old code hung in ray.init)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "hatch_autotune", "tune", str(root), *args],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        pytest.fail(f"`tune` was still running after {timeout} s")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("behaviour", ["silent", "closes", "refused"])
@pytest.mark.parametrize("origin", ["HATCH_AUTOTUNE_RAY", "--ray"])
def test_a_ray_address_where_no_head_answers_is_one_error_naming_it(tmp_path, behaviour, origin):
    root = write_tiny_project(tmp_path / "p")
    head = FakeHead(behaviour)
    address = f"127.0.0.1:{head.port}"
    env = {"HATCH_AUTOTUNE_CACHE_DIR": str(tmp_path / "cache"), "HATCH_AUTOTUNE_MODE": "tune"}
    try:
        if origin == "HATCH_AUTOTUNE_RAY":
            proc = run_tune(root, {**env, "HATCH_AUTOTUNE_RAY": address})
        else:
            proc = run_tune(root, {**env, "HATCH_AUTOTUNE_RAY": "not-an-address"}, "--ray", address)  # --ray overrides it
    finally:
        head.stop()
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"cannot reach the Ray cluster at {address}: " in lines[0], lines[0]
    assert f"set by {origin}" in lines[0] and "ray start --head" in lines[0], lines[0]


# ---- `cache clear` while a build writes ---------------------------------------------------------


def test_cache_clear_while_a_build_writes_is_a_clean_outcome(tmp_path, monkeypatch, capsys):
    """A writer puts entries all the while `cache clear` runs, five times over: every clear
    succeeds, the writer never loses its store, and what remains is a store of whole entries."""
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HATCH_AUTOTUNE_CACHE_URL", raising=False)
    writer = CompileCache(tmp_path / "cache")
    stop = threading.Event()
    written: list[str] = []

    def write() -> None:
        n = 0
        while not stop.is_set():
            key = f"{n % 256:02x}{n:062x}"
            writer.put(key, ENTRY)
            written.append(key)
            n += 1

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        for _ in range(5):
            deadline = time.monotonic() + 60
            while len(written) < 300:
                assert thread.is_alive() and time.monotonic() < deadline, "the writer stopped writing"
                time.sleep(0.01)
            written.clear()
            code = cli.main(["cache", "clear", "--yes"])
            out, err = capsys.readouterr()
            assert code == 0 and "removed" in out and not err, (out, err, writer.write_error)
    finally:
        stop.set()
        thread.join(10)
    assert writer.write_error is None, writer.write_error
    assert writer.foreign_path() is None
    assert {p.name for p in (tmp_path / "cache").iterdir()} <= {
        "v1"
    }  # nothing left aside (v1: unless the writer stopped before it wrote again)
    for meta in writer.root.glob("*/*.json"):
        assert writer.get(meta.stem) == ENTRY
