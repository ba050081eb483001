"""The compile cache's shared tier: entries in Redis, for builders that do not share a disk.

HATCH_AUTOTUNE_CACHE_URL (redis://, rediss://, unix://) turns it on; `CompileCache` consults it
after a local miss and puts every fresh compile in it too (cache.py). An entry is two strings,
`hatch-autotune:v<schema>:<key>:meta` (the JSON `CacheEntry.record` describes, the same bytes
the disk store keeps) and `...:bin` (the raw binary; absent for a failed compile), written
together in one MULTI with an expiry (HATCH_AUTOTUNE_CACHE_TTL). What the server returns is
untrusted: it is read only when both values are within their size limits (their lengths are
asked first, and GETRANGE bounds what comes back even if they grow meanwhile), and it is a hit
only when `CacheEntry.from_record` accepts it for this key; anything else is a miss, which the
build's fresh compile then overwrites. The tier is an optimisation, never a reason for a build
to fail or wait: a server that refuses, errs or does not finish an operation (a get, a put, a
probe: connecting included) within the timeout switches the tier off for the rest of the
process, with one warning (`error`) that names the URL without its password; so does one whose
replies are larger than asked for (a server that says a value is 10 bytes long, then sends
300 MiB). redis-py bounds only each read, not an operation, nor what a reply may hold: its
connections read through `_BoundedSocket`, which enforces both.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from ..declare.settings import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S, DEFAULT_TTL_S, CacheSettings, redact
from ..errors import BuildError
from ..runtime import load_json
from .entry import CACHE_SCHEMA, MAX_METADATA_BYTES, CacheEntry

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer

URL_VAR = "HATCH_AUTOTUNE_CACHE_URL"  # named in messages; declare/settings.py reads it
EXTRA_HINT = "pip install 'hatch-autotune[redis]'"
SMALL_REPLIES = 64 << 10  # what the replies to PING, STRLEN, SET, EXPIRE, MULTI and the handshake may take together


class ReplyTooLarge(Exception):
    """A server sent more than the replies it owes can hold."""


class _Budget:
    """What the operation under way (one get, put or probe) may still spend: time until
    `deadline` (time.monotonic()) and reply bytes up to `limit`."""

    def __init__(self, timeout: float):
        self.deadline = time.monotonic() + timeout
        self.received = 0
        self.limit = SMALL_REPLIES

    def expect(self, size: int) -> None:
        """The next replies may take `size` bytes more (the values asked for), framing aside."""
        self.limit = self.received + size + SMALL_REPLIES

    def time_left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the operation ran out of time")
        return left

    def count(self, size: int) -> None:
        self.received += size
        if self.received > self.limit:
            raise ReplyTooLarge(f"more than {self.limit} bytes of replies to one request")


_BUDGET: ContextVar[_Budget | None] = ContextVar("hatch_autotune_redis_budget", default=None)


class _BoundedSocket:
    """A connection's socket, held to the budget of this thread's operation (`_BUDGET`): every
    read and write waits at most the time the operation has left, and reads stop once the
    replies exceed their size. Everything else is the socket's own."""

    def __init__(self, sock: socket.socket):  # TCP, unix, or TLS (ssl.SSLSocket is a socket.socket)
        self._sock = sock
        self._timeout = sock.gettimeout()  # what redis-py asked for; each call may get less

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout
        self._sock.settimeout(timeout)

    def gettimeout(self) -> float | None:
        return self._timeout

    def _budget(self) -> _Budget | None:
        """The operation's budget, after giving the socket the time it has left."""
        budget, timeout = _BUDGET.get(), self._timeout
        if budget is not None and timeout != 0:  # 0: a non-blocking poll, which never waits
            left = budget.time_left()
            timeout = left if timeout is None else min(timeout, left)
        self._sock.settimeout(timeout)
        return budget

    def recv(self, size: int, *flags: int) -> bytes:
        budget = self._budget()
        data = self._sock.recv(size, *flags)
        if budget is not None:
            budget.count(len(data))
        return data

    def recv_into(self, buffer: WriteableBuffer, size: int = 0, *flags: int) -> int:
        budget = self._budget()
        n = self._sock.recv_into(buffer, size, *flags)
        if budget is not None:
            budget.count(n)
        return n

    def sendall(self, data: ReadableBuffer, *flags: int) -> None:
        self._budget()
        self._sock.sendall(data, *flags)

    def send(self, data: ReadableBuffer, *flags: int) -> int:
        self._budget()
        return self._sock.send(data, *flags)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _BoundedConnection:
    """Mixed into the connection class the URL picks (TCP, TLS, unix socket): its sockets are
    `_BoundedSocket`s. (For TLS the handshake itself is bounded per read only.)"""

    def _connect(self) -> Any:
        return _BoundedSocket(super()._connect())  # type: ignore[misc]


class RemoteCache:
    """get/put of `CacheEntry`s in one Redis database; see the module docstring. One client per
    process, made on first use: a client's sockets must not be shared across a fork."""

    def __init__(self, url: str, *, timeout: float = DEFAULT_TIMEOUT_S, max_bytes: int = DEFAULT_MAX_BYTES, ttl: int = DEFAULT_TTL_S):
        self.url = redact(url)  # the only form of the URL that is ever shown
        self.timeout, self.max_bytes, self.ttl = timeout, max_bytes, ttl
        self.error: str | None = None  # the one warning: set when the tier switches itself off
        password = urlsplit(url).password or ""
        self._secrets = [p for p in {password, unquote(password)} if p]  # kept out of the warning
        self._lock = threading.Lock()
        self._client: Any = None
        self._client_pid: int | None = None
        try:
            import redis
        except ImportError:
            self.error = f"{URL_VAR} is set but redis-py is not installed ({EXTRA_HINT}); using the local compile cache only"
            return
        try:
            # redis-py leaves parse_url unannotated; it returns the keyword arguments of a connection pool
            parse_url: Callable[[str], dict[str, Any]] = redis.connection.parse_url
            self._url_options = parse_url(url)
        except ValueError as exc:
            raise BuildError(f"hatch-autotune: {URL_VAR}={self.url}: {exc}") from None

    @classmethod
    def from_settings(cls, settings: CacheSettings) -> RemoteCache | None:
        """The tier the settings' URL names (None without one), with their timeout, size limit
        and expiry; BuildError for a URL redis-py cannot read."""
        if settings.url is None:
            return None
        return cls(settings.url, timeout=settings.timeout_s, max_bytes=settings.max_bytes, ttl=settings.ttl_s)

    def _keys(self, key: str) -> tuple[str, str]:
        base = f"hatch-autotune:v{CACHE_SCHEMA}:{key}"
        return f"{base}:meta", f"{base}:bin"

    def _redis(self) -> Any:
        """This process's client: the timeout bounds every connect and every reply, its
        connections' sockets are bounded by the operation under way (`_operation`), and nothing
        is retried (`redis.Redis()` retries 10 times, with backoff, by default: a hung server
        would cost minutes)."""
        with self._lock:
            if self._client_pid != os.getpid():
                import redis
                from redis.backoff import NoBackoff
                from redis.retry import Retry

                base = self._url_options.get("connection_class", redis.Connection)
                options = {
                    **self._url_options,  # ours win: the URL's own timeout or decoding options would undo them
                    "connection_class": type(f"Bounded{base.__name__}", (_BoundedConnection, base), {}),
                    "socket_timeout": self.timeout,
                    "socket_connect_timeout": self.timeout,
                    "retry": Retry(NoBackoff(), 0),
                    "decode_responses": False,
                }
                self._client = redis.Redis(connection_pool=redis.ConnectionPool(**options))
                self._client_pid = os.getpid()
            return self._client

    @contextlib.contextmanager
    def _operation(self) -> Iterator[_Budget]:
        """One get, put or probe: everything it sends and reads, connecting included, within one
        timeout, and its replies within the budget's size."""
        budget = _Budget(self.timeout)
        token = _BUDGET.set(budget)
        try:
            yield budget
        finally:
            _BUDGET.reset(token)

    def get(self, key: str) -> CacheEntry | None:
        """The entry stored under `key` if it is exactly one `put` would store, else None (a
        miss); never raises. A hit refreshes the entry's expiry."""
        if self.error is not None:
            return None
        try:
            with self._operation() as budget:
                return self._get(key, budget)
        except Exception as exc:
            self._switch_off(exc)
            return None

    def _get(self, key: str, budget: _Budget) -> CacheEntry | None:
        meta_key, bin_key = self._keys(key)
        client = self._redis()
        with client.pipeline(transaction=False) as pipe:
            sizes = _values(pipe.strlen(meta_key).strlen(bin_key).execute(raise_on_error=False))
        if sizes is None:
            return None
        meta_size, bin_size = sizes
        if not 0 < meta_size <= MAX_METADATA_BYTES or bin_size > self.max_bytes:
            return None  # absent, or too large to download
        budget.expect(meta_size + bin_size + 2)  # GETRANGE may return one byte more of each: see below
        with client.pipeline(transaction=True) as pipe:
            # GETRANGE's end is inclusive: one byte more than measured shows a value that grew since
            pipe.getrange(meta_key, 0, meta_size).getrange(bin_key, 0, bin_size)
            if self.ttl:
                pipe.expire(meta_key, self.ttl).expire(bin_key, self.ttl)
            values = _values(pipe.execute(raise_on_error=False))
        if values is None:
            return None
        meta: bytes
        binary: bytes  # decode_responses=False: GETRANGE replies are bytes
        meta, binary = values[:2]
        if len(meta) != meta_size or len(binary) != bin_size:
            return None

        def read_binary(size: int) -> bytes:
            if len(binary) != size:
                raise ValueError(f"the binary has {len(binary)} bytes, the metadata says {size}")
            return binary

        try:
            return CacheEntry.from_record(load_json(meta), key, read_binary)
        except ValueError:  # not JSON, nested too deep, or a binary of another size
            return None

    def put(self, key: str, entry: CacheEntry) -> None:
        """Store `entry` (metadata and binary at once, with the expiry), unless either is over
        its size limit; never raises."""
        if self.error is not None:
            return
        meta = entry.metadata(key)
        if len(meta) > MAX_METADATA_BYTES or (entry.binary is not None and len(entry.binary) > self.max_bytes):
            return  # get would refuse it: storing it would only cost the server memory
        meta_key, bin_key = self._keys(key)
        expiry = self.ttl or None
        try:
            with self._operation(), self._redis().pipeline(transaction=True) as pipe:
                if entry.binary is None:
                    pipe.delete(bin_key)
                else:
                    pipe.set(bin_key, entry.binary, ex=expiry)
                pipe.set(meta_key, meta, ex=expiry).execute()
        except Exception as exc:
            self._switch_off(exc)

    def probe(self) -> str | None:
        """None when the server answers a PING within the timeout, else the warning a build
        would print (for `hatch-autotune cache info`)."""
        if self.error is None:
            try:
                with self._operation():
                    self._redis().ping()
            except Exception as exc:
                self._switch_off(exc)
        return self.error

    def _switch_off(self, exc: BaseException) -> None:
        """Keep the first failure as the one warning; later calls do nothing."""
        from redis.exceptions import TimeoutError as RedisTimeout

        what = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        for secret in self._secrets:
            what = what.replace(secret, "***")
        failed = (
            f"did not answer within {self.timeout:g} s" if isinstance(exc, (TimeoutError, RedisTimeout))
            else "sent more than was asked for" if isinstance(exc, ReplyTooLarge)
            else "failed"
        )  # fmt: skip
        with self._lock:
            if self.error is None:
                self.error = f"the shared compile cache at {self.url} {failed} ({what}); going on with the local compile cache only"


def _values(replies: list[Any]) -> list[Any] | None:
    """The replies of a pipeline, or None when a key holds another type than a string (a
    miss: put will overwrite it); any other error reply is raised, to switch the tier off."""
    for reply in replies:
        if isinstance(reply, Exception):
            if str(reply).startswith("WRONGTYPE"):
                return None
            raise reply
    return replies
