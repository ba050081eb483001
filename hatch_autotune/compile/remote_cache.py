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
to fail or wait: a server that refuses, errs or does not answer within the timeout switches
the tier off for the rest of the process, with one warning (`error`) that names the URL
without its password.
"""

from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import unquote, urlsplit

from ..declare.settings import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S, DEFAULT_TTL_S, CacheSettings, redact
from ..errors import BuildError
from ..runtime import load_json
from .entry import CACHE_SCHEMA, MAX_METADATA_BYTES, CacheEntry

URL_VAR = "HATCH_AUTOTUNE_CACHE_URL"  # named in messages; declare/settings.py reads it
EXTRA_HINT = "pip install 'hatch-autotune[redis]'"


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
            self._url_options = redis.connection.parse_url(url)
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
        """This process's client: the timeouts bound every connect and every reply, and nothing
        is retried (`redis.Redis()` retries 10 times, with backoff, by default: a hung server
        would cost minutes)."""
        with self._lock:
            if self._client_pid != os.getpid():
                import redis
                from redis.backoff import NoBackoff
                from redis.retry import Retry

                options = {
                    **self._url_options,  # ours win: the URL's own timeout or decoding options would undo them
                    "socket_timeout": self.timeout,
                    "socket_connect_timeout": self.timeout,
                    "retry": Retry(NoBackoff(), 0),
                    "decode_responses": False,
                }
                self._client = redis.Redis(connection_pool=redis.ConnectionPool(**options))
                self._client_pid = os.getpid()
            return self._client

    def get(self, key: str) -> CacheEntry | None:
        """The entry stored under `key` if it is exactly one `put` would store, else None (a
        miss); never raises. A hit refreshes the entry's expiry."""
        if self.error is not None:
            return None
        try:
            return self._get(key)
        except Exception as exc:  # noqa: BLE001 - whatever the server or the network does, the build goes on locally
            self._switch_off(exc)
            return None

    def _get(self, key: str) -> CacheEntry | None:
        meta_key, bin_key = self._keys(key)
        client = self._redis()
        with client.pipeline(transaction=False) as pipe:
            sizes = _values(pipe.strlen(meta_key).strlen(bin_key).execute(raise_on_error=False))
        if sizes is None:
            return None
        meta_size, bin_size = sizes
        if not 0 < meta_size <= MAX_METADATA_BYTES or bin_size > self.max_bytes:
            return None  # absent, or too large to download
        with client.pipeline(transaction=True) as pipe:
            # GETRANGE's end is inclusive: one byte more than measured shows a value that grew since
            pipe.getrange(meta_key, 0, meta_size).getrange(bin_key, 0, bin_size)
            if self.ttl:
                pipe.expire(meta_key, self.ttl).expire(bin_key, self.ttl)
            values = _values(pipe.execute(raise_on_error=False))
        if values is None:
            return None
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
            with self._redis().pipeline(transaction=True) as pipe:
                if entry.binary is None:
                    pipe.delete(bin_key)
                else:
                    pipe.set(bin_key, entry.binary, ex=expiry)
                pipe.set(meta_key, meta, ex=expiry).execute()
        except Exception as exc:  # noqa: BLE001 - a full, read-only or dead server: the build goes on locally
            self._switch_off(exc)

    def probe(self) -> str | None:
        """None when the server answers a PING within the timeout, else the warning a build
        would print (for `hatch-autotune cache info`)."""
        if self.error is None:
            try:
                self._redis().ping()
            except Exception as exc:  # noqa: BLE001 - reported, as a build would report it
                self._switch_off(exc)
        return self.error

    def _switch_off(self, exc: BaseException) -> None:
        """Keep the first failure as the one warning; later calls do nothing."""
        from redis.exceptions import TimeoutError as RedisTimeout

        what = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        for secret in self._secrets:
            what = what.replace(secret, "***")
        failed = f"did not answer within {self.timeout:g} s" if isinstance(exc, (TimeoutError, RedisTimeout)) else "failed"
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
