"""The compile cache shared through Redis (compile/remote_cache.py): a real redis-server on
127.0.0.1 (a free port, no persistence, in a temporary directory), real NVRTC compiles. What the
server holds is untrusted: every damaged entry is a miss and the next put repairs it. A server
that is down, hung or misused costs one warning and a bounded wait, never the build."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import load_project, write_tiny_project
from hatchling.builders.wheel import WheelBuilder
from test_damage import KEEP, REMOVE, content_damages, dumps, flip, seal

from hatch_autotune.compile.cache import CompileCache
from hatch_autotune.compile.entry import MAX_METADATA_BYTES, CacheEntry, Resources
from hatch_autotune.compile.remote_cache import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S, DEFAULT_TTL_S, RemoteCache, redact
from hatch_autotune.compile.tiers import open_compile_cache
from hatch_autotune.declare.settings import read_cache_settings
from hatch_autotune.errors import BuildError
from hatch_autotune.wheel.assemble import build_payload

KEY = "ab" * 32
OTHER_KEY = "cd" * 32
THIRD_KEY = "ef" * 32
RESOURCES = {f: n for n, f in enumerate(Resources.__dataclass_fields__)}
COMPILED = CacheEntry(
    ok=True, log="ptxas info: Used 8 registers", label="scale BLOCK=128", resources=RESOURCES, binary=bytes(range(256)) * 40
)
FAILED = CacheEntry(ok=False, log="error: expected a ';'", label="scale BAD=true", resources=None, binary=None)
REDIS_SERVER = shutil.which("redis-server")


# ---- the server --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(workdir: Path, port: int) -> subprocess.Popen:
    """redis-server on 127.0.0.1:port and a unix socket in `workdir`, saving nothing; waits at
    most 10 s for it to answer PING."""
    import redis

    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "redis.log", "wb") as log:
        proc = subprocess.Popen(
            [REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(workdir),
             "--unixsocket", str(workdir / "redis.sock"), "--unixsocketperm", "700", "--protected-mode", "yes"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    probe = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if probe.ping():
                return proc
        except redis.RedisError:
            time.sleep(0.05)
    stop(proc)
    raise RuntimeError(f"redis-server did not answer on 127.0.0.1:{port}: {(workdir / 'redis.log').read_text(errors='replace')[-2000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGCONT)  # a stopped process ignores SIGTERM until it runs again (a no-op once it has exited)
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """One redis-server for the module: its process, TCP and unix URLs, and a client to look
    at what the cache stored."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; CI installs it)")
    redis = pytest.importorskip("redis", reason="redis-py is not installed (pip install 'hatch-autotune[redis]')")
    workdir = tmp_path_factory.mktemp("redis")
    for attempt in range(3):  # the free port may be taken between asking and binding
        port = free_port()
        try:
            proc = start_redis(workdir, port)
            break
        except RuntimeError:
            if attempt == 2:
                raise
    try:
        yield SimpleNamespace(
            proc=proc,
            url=f"redis://127.0.0.1:{port}/0",
            unix_url=f"unix://{workdir / 'redis.sock'}?db=0",
            raw=redis.Redis(host="127.0.0.1", port=port, socket_timeout=5),
        )
    finally:
        stop(proc)


@pytest.fixture
def server(redis_server):
    """The module's server, emptied."""
    redis_server.raw.flushall()
    return redis_server


def env_for(cache_dir: Path, url: str, **settings: str) -> dict[str, str]:
    return {"HATCH_AUTOTUNE_CACHE_DIR": str(cache_dir), "HATCH_AUTOTUNE_CACHE_URL": url} | {
        f"HATCH_AUTOTUNE_CACHE_{k.upper()}": v for k, v in settings.items()
    }


def remote_keys(key: str) -> tuple[str, str]:
    return f"hatch-autotune:v1:{key}:meta", f"hatch-autotune:v1:{key}:bin"


def build_wheel(src: Path, out: Path, env: dict[str, str], capsys) -> tuple[Path, str, float]:
    """A wheel of `src` built by hatchling's WheelBuilder in this process with `env` set: (the
    wheel, what the build printed, seconds)."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        mp.setenv("HATCH_AUTOTUNE_MODE", "offline")
        mp.delenv("HATCH_AUTOTUNE_ARCHS", raising=False)
        capsys.readouterr()
        t0 = time.monotonic()
        (artifact,) = WheelBuilder(str(src)).build(directory=str(out), versions=["standard"])
        seconds = time.monotonic() - t0
    printed = capsys.readouterr()
    return Path(artifact), printed.out + printed.err, seconds


def cache_warnings(printed: str) -> list[str]:
    return [line for line in printed.splitlines() if line.startswith("hatch-autotune warning:") and "compile cache" in line]


# ---- hits --------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_put_is_a_hit_through_another_cache_with_an_empty_local_store(server, tmp_path, transport):
    url = server.url if transport == "tcp" else server.unix_url
    writer = open_compile_cache(read_cache_settings(env_for(tmp_path / "a", url)))
    writer.put(KEY, COMPILED)
    writer.put(OTHER_KEY, FAILED)
    reader = open_compile_cache(read_cache_settings(env_for(tmp_path / "b", url)))
    assert not reader.root.exists()
    got = reader.get(KEY)
    assert got == COMPILED and (got.binary, got.log, got.resources) == (COMPILED.binary, COMPILED.log, RESOURCES)
    assert reader.get(OTHER_KEY) == FAILED
    assert reader.get(THIRD_KEY) is None  # absent everywhere
    local = CompileCache(tmp_path / "b")  # the hit was written to the reader's own store
    assert local.get(KEY) == COMPILED and local.get(OTHER_KEY) == FAILED and local.info()[0] == 2
    assert writer.warnings() == reader.warnings() == []
    meta_key, bin_key = remote_keys(KEY)
    assert server.raw.get(meta_key) == COMPILED.metadata(KEY) and server.raw.get(bin_key) == COMPILED.binary  # JSON and raw bytes
    assert server.raw.exists(remote_keys(OTHER_KEY)[1]) == 0  # a failed compile has no binary


def test_the_local_store_is_consulted_first(server, tmp_path):
    cache = open_compile_cache(read_cache_settings(env_for(tmp_path, server.url)))
    CompileCache(tmp_path).put(KEY, COMPILED)  # in the local store only
    assert cache.get(KEY) == COMPILED
    assert server.raw.dbsize() == 0  # a local hit is not copied to the server


def test_a_warm_redis_builds_without_compiling(server, tmp_path, capsys):
    """Real compiles, through the build hook: a second builder with an empty disk cache takes
    every binary from Redis (and keeps them locally), and its wheel is the first one's."""
    src = write_tiny_project(tmp_path / "src", extra='mode = "offline"')
    first, printed, _ = build_wheel(src, tmp_path / "out1", env_for(tmp_path / "cache1", server.url), capsys)
    compiled = CompileCache(tmp_path / "cache1").info()[0]
    assert compiled >= 2 and f"in all, {compiled} variant binaries compiled, 0 from the cache" in printed, printed
    assert server.raw.dbsize() >= compiled  # meta (+ bin) per entry

    second, printed, _ = build_wheel(src, tmp_path / "out2", env_for(tmp_path / "cache2", server.url), capsys)
    assert f"in all, 0 variant binaries compiled, {compiled} from the cache" in printed, printed
    assert cache_warnings(printed) == []
    assert second.read_bytes() == first.read_bytes()
    assert CompileCache(tmp_path / "cache2").info()[0] == compiled


def test_a_build_from_an_empty_local_store_counts_remote_hits_as_cached(server, tmp_path):
    project = load_project(write_tiny_project(tmp_path / "src"))
    cold = build_payload(project, cache=open_compile_cache(read_cache_settings(env_for(tmp_path / "c1", server.url))), log=lambda m: None)
    logs: list[str] = []
    warm = build_payload(project, cache=open_compile_cache(read_cache_settings(env_for(tmp_path / "c2", server.url))), log=logs.append)
    assert cold.counts["compiled"] > 0 and warm.counts == {"compiled": 0, "cached": cold.counts["compiled"], "failed": 0}
    assert not [m for m in logs if m.startswith("warning:") and "compile cache" in m]


def test_each_process_opens_its_own_connection(server, tmp_path):
    """A forked child (a process pool's worker) must not talk over its parent's socket."""
    cache = open_compile_cache(read_cache_settings(env_for(tmp_path / "parent", server.url)))
    cache.put(KEY, COMPILED)
    parent_client = cache.remote._redis()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()

    def child() -> None:
        fresh = CompileCache(tmp_path / "child", remote=cache.remote)
        queue.put((fresh.get(KEY) == COMPILED, cache.remote._redis() is not parent_client, fresh.warnings()))

    proc = ctx.Process(target=child)
    proc.start()
    hit, own_client, warnings = queue.get(timeout=30)
    proc.join(30)
    assert hit and own_client and warnings == []
    assert cache.remote._redis() is parent_client and cache.remote.get(KEY) == COMPILED and cache.warnings() == []


# ---- damage ------------------------------------------------------------------------------------


def set_remote(server, name: str, value) -> None:
    """Make the key hold `value` (KEEP: leave it, REMOVE: delete it)."""
    if value == REMOVE:
        server.raw.delete(name)
    elif value != KEEP:
        server.raw.set(name, value)


@pytest.mark.parametrize("entry", [COMPILED, FAILED], ids=["compiled", "failed"])
def test_every_damaged_remote_entry_is_a_miss_and_put_repairs_it(server, tmp_path, entry):
    """test_damage's damages to an entry's metadata and binary (truncated, flipped, emptied,
    nested, each field removed or of the wrong type, re-sealed or not, ...), applied in Redis."""
    remote = RemoteCache(server.url)
    meta_key, bin_key = remote_keys(KEY)
    remote.put(KEY, entry)
    damages = content_damages(entry.metadata(KEY), entry.binary)
    assert len(damages) > 100
    accepted = []
    for name, meta, binary in damages:
        set_remote(server, meta_key, meta)
        set_remote(server, bin_key, binary)
        if remote.get(KEY) is not None:
            accepted.append(name)
        remote.put(KEY, entry)
        assert remote.get(KEY) == entry, f"put did not repair the entry after: {name}"
    assert accepted == [] and remote.error is None


def test_damage_the_disk_store_cannot_see_is_a_miss(server, tmp_path):
    """Redis holds what no file can: values of other types, entries under another key, values
    over the size limits. Each is a miss (not a reason to switch the tier off) and put repairs it."""
    remote = RemoteCache(server.url, max_bytes=len(COMPILED.binary))
    meta_key, bin_key = remote_keys(KEY)
    record = COMPILED.record(KEY)
    other = CacheEntry(ok=True, log="", label="other", resources=None, binary=b"other binary")
    damages = {
        "binary with a flipped byte": lambda: server.raw.set(bin_key, flip(COMPILED.binary, 100, 0x01)),
        "binary truncated": lambda: server.raw.set(bin_key, COMPILED.binary[:-1]),
        "garbage metadata": lambda: server.raw.set(meta_key, os.urandom(300)),
        "garbage binary": lambda: server.raw.set(bin_key, os.urandom(len(COMPILED.binary))),
        "metadata of another key (re-sealed)": lambda: server.raw.set(meta_key, dumps(seal({**record, "key": OTHER_KEY}))),
        "another key's entry copied here": lambda: server.raw.mset({meta_key: other.metadata(OTHER_KEY), bin_key: other.binary}),
        "metadata with ok a string (re-sealed)": lambda: server.raw.set(meta_key, dumps(seal({**record, "ok": "true"}))),
        "metadata a JSON list": lambda: server.raw.set(meta_key, b"[]"),
        "metadata a list in Redis": lambda: (server.raw.delete(meta_key), server.raw.rpush(meta_key, b"x")),
        "metadata a hash in Redis": lambda: (server.raw.delete(meta_key), server.raw.hset(meta_key, "meta", COMPILED.metadata(KEY))),
        "binary a set in Redis": lambda: (server.raw.delete(bin_key), server.raw.sadd(bin_key, b"x")),
        "binary over the size limit": lambda: server.raw.set(bin_key, COMPILED.binary + b"\0"),
        "metadata over its size limit": lambda: server.raw.set(meta_key, b" " * MAX_METADATA_BYTES + COMPILED.metadata(KEY)),
        "metadata empty": lambda: server.raw.set(meta_key, b""),
        "binary removed": lambda: server.raw.delete(bin_key),
        "metadata removed": lambda: server.raw.delete(meta_key),
    }
    for name, damage in damages.items():
        remote.put(KEY, COMPILED)
        assert remote.get(KEY) == COMPILED, name
        damage()
        sent = server.raw.info("stats")["total_net_output_bytes"]
        assert remote.get(KEY) is None, name
        assert server.raw.info("stats")["total_net_output_bytes"] - sent < 2 * len(COMPILED.binary) + 1000, f"{name}: downloaded"
        assert remote.error is None, name
        remote.put(KEY, COMPILED)
        assert remote.get(KEY) == COMPILED, f"put did not repair the entry after: {name}"


def test_a_value_over_the_size_limit_is_never_downloaded(server, tmp_path):
    """The lengths are asked first: 32 MiB in Redis cost the reader a few bytes, not 32 MiB."""
    remote = RemoteCache(server.url, max_bytes=1 << 20)
    meta_key, bin_key = remote_keys(KEY)
    server.raw.set(meta_key, COMPILED.metadata(KEY))
    server.raw.set(bin_key, b"\0" * (32 << 20))
    sent = server.raw.info("stats")["total_net_output_bytes"]
    assert remote.get(KEY) is None
    assert server.raw.info("stats")["total_net_output_bytes"] - sent < 10_000


# ---- a server that is down or hung -------------------------------------------------------------


def test_a_stopped_server_is_one_warning_without_the_password_and_the_build_goes_on(tmp_path, capsys):
    """Nobody listens at the URL: the build compiles with its local cache, warns once (the URL
    with its password hidden), and does not wait."""
    pytest.importorskip("redis")
    url = f"redis://ci:s3cret-pw@127.0.0.1:{free_port()}/0"
    cache = open_compile_cache(read_cache_settings(env_for(tmp_path / "direct", url)))
    t0 = time.monotonic()
    assert cache.get(KEY) is None
    cache.put(KEY, COMPILED)
    assert time.monotonic() - t0 < 1.5
    assert cache.get(KEY) == COMPILED  # the local store still works
    (warning,) = cache.warnings()
    assert f"redis://ci:***@127.0.0.1:{url.rsplit(':', 1)[1]}" in warning and "s3cret" not in warning

    src = write_tiny_project(tmp_path / "src", extra='mode = "offline"')
    wheel, printed, seconds = build_wheel(src, tmp_path / "out", env_for(tmp_path / "cache", url), capsys)
    assert wheel.is_file() and "s3cret" not in printed
    (warning,) = cache_warnings(printed)
    assert "redis://ci:***@127.0.0.1:" in warning and "going on with the local compile cache only" in warning, warning
    assert CompileCache(tmp_path / "cache").info()[0] > 0  # the fresh compiles went to the local store
    assert seconds < 30


def test_probe_says_whether_the_server_answers(server, tmp_path):
    assert RemoteCache(server.url).probe() is None
    dead = RemoteCache(f"redis://:pw@127.0.0.1:{free_port()}/0")
    assert "redis://:***@127.0.0.1:" in dead.probe() and dead.error == dead.probe()


def test_a_hung_server_costs_one_timeout_then_nothing(server, tmp_path):
    """A server that accepts but never answers (SIGSTOP): the first get waits the timeout once,
    the tier switches off, and everything after returns at once; one warning says why."""
    connected = open_compile_cache(read_cache_settings(env_for(tmp_path / "a", server.url, timeout="0.5")))
    connected.put(KEY, COMPILED)  # a pooled connection, opened while the server ran
    RemoteCache(server.url).put(THIRD_KEY, COMPILED)
    fresh = open_compile_cache(read_cache_settings(env_for(tmp_path / "b", server.url, timeout="0.5")))  # connects while it is stopped
    server.proc.send_signal(signal.SIGSTOP)
    try:
        for cache in (connected, fresh):
            t0 = time.monotonic()
            assert cache.get(OTHER_KEY) is None
            assert 0.4 < time.monotonic() - t0 < 2.5
            t0 = time.monotonic()
            assert cache.get(THIRD_KEY) is None  # in Redis, but the tier is off: not even asked
            cache.put(OTHER_KEY, FAILED)
            assert time.monotonic() - t0 < 0.1
            assert cache.get(OTHER_KEY) == FAILED  # the local store
            (warning,) = cache.warnings()
            assert "did not answer within 0.5 s" in warning and server.url in warning, warning
    finally:
        server.proc.send_signal(signal.SIGCONT)
    assert server.raw.exists(remote_keys(OTHER_KEY)[0]) == 0  # nothing written once switched off


def test_a_server_error_switches_the_tier_off_with_one_warning(server, tmp_path):
    """A server that refuses writes (out of memory, a read-only replica) is not retried per entry."""
    cache = open_compile_cache(read_cache_settings(env_for(tmp_path, server.url)))
    server.raw.config_set("maxmemory", "1")
    server.raw.config_set("maxmemory-policy", "noeviction")
    try:
        cache.put(KEY, COMPILED)
        cache.put(OTHER_KEY, FAILED)
    finally:
        server.raw.config_set("maxmemory", "0")
    (warning,) = cache.warnings()
    assert "OutOfMemoryError" in warning and "maxmemory" in warning and " failed " in warning, warning
    assert CompileCache(tmp_path).get(KEY) == COMPILED and cache.get(OTHER_KEY) == FAILED


def test_a_wrong_password_is_one_warning_that_does_not_show_it(server, tmp_path):
    cache = open_compile_cache(read_cache_settings(env_for(tmp_path, server.url.replace("redis://", "redis://ci:n0t-the-pw@"))))
    assert cache.get(KEY) is None
    cache.put(KEY, COMPILED)
    (warning,) = cache.warnings()
    assert "redis://ci:***@127.0.0.1:" in warning and "n0t-the-pw" not in warning and " failed " in warning, warning


def test_without_redis_py_a_url_is_one_warning_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` raises ImportError
    cache = open_compile_cache(read_cache_settings(env_for(tmp_path, "redis://127.0.0.1:6379/0")))
    cache.put(KEY, COMPILED)
    assert cache.get(KEY) == COMPILED
    (warning,) = cache.warnings()
    assert "hatch-autotune[redis]" in warning and "HATCH_AUTOTUNE_CACHE_URL" in warning
    logs: list[str] = []
    build_payload(load_project(write_tiny_project(tmp_path / "src")), cache=cache, log=logs.append)
    assert [m for m in logs if "hatch-autotune[redis]" in m] == [f"warning: {warning}"]


# ---- expiry and size limit ---------------------------------------------------------------------


def test_entries_expire_and_a_hit_refreshes_the_expiry(server, tmp_path):
    cache = open_compile_cache(read_cache_settings(env_for(tmp_path / "a", server.url, ttl="1000")))
    cache.put(KEY, COMPILED)
    for name in remote_keys(KEY):
        assert 990 < server.raw.ttl(name) <= 1000
        server.raw.expire(name, 5)
    assert open_compile_cache(read_cache_settings(env_for(tmp_path / "b", server.url, ttl="1000"))).get(KEY) == COMPILED
    assert all(990 < server.raw.ttl(name) <= 1000 for name in remote_keys(KEY))
    open_compile_cache(read_cache_settings(env_for(tmp_path / "c", server.url, ttl="0"))).put(OTHER_KEY, COMPILED)
    assert all(server.raw.ttl(name) == -1 for name in remote_keys(OTHER_KEY))  # 0: no expiry
    open_compile_cache(read_cache_settings(env_for(tmp_path / "d", server.url))).put(KEY, COMPILED)
    assert DEFAULT_TTL_S - 10 < server.raw.ttl(remote_keys(KEY)[0]) <= DEFAULT_TTL_S


def test_the_size_limit_refuses_to_store_a_larger_binary(server, tmp_path):
    size = len(COMPILED.binary)
    cache = open_compile_cache(read_cache_settings(env_for(tmp_path / "a", server.url, max_bytes=str(size - 1))))
    cache.put(KEY, COMPILED)
    assert server.raw.dbsize() == 0 and cache.warnings() == []
    assert cache.get(KEY) == COMPILED  # kept locally all the same
    exact = open_compile_cache(read_cache_settings(env_for(tmp_path / "b", server.url, max_bytes=str(size))))
    exact.put(KEY, COMPILED)
    assert server.raw.strlen(remote_keys(KEY)[1]) == size
    assert (
        open_compile_cache(read_cache_settings(env_for(tmp_path / "c", server.url, max_bytes=str(size - 1)))).get(KEY) is None
    )  # nor read


# ---- settings ----------------------------------------------------------------------------------


def test_the_settings_and_their_defaults(tmp_path):
    pytest.importorskip("redis")
    assert open_compile_cache(read_cache_settings({"HATCH_AUTOTUNE_CACHE_DIR": str(tmp_path)})).remote is None
    assert (
        open_compile_cache(read_cache_settings({"HATCH_AUTOTUNE_CACHE_DIR": str(tmp_path), "HATCH_AUTOTUNE_CACHE_URL": " "})).remote is None
    )
    remote = open_compile_cache(read_cache_settings(env_for(tmp_path, "rediss://cache.internal:6380/2"))).remote
    assert (
        (remote.timeout, remote.max_bytes, remote.ttl)
        == (DEFAULT_TIMEOUT_S, DEFAULT_MAX_BYTES, DEFAULT_TTL_S)
        == (2.0, 64 << 20, 30 * 24 * 3600)
    )
    remote = open_compile_cache(read_cache_settings(env_for(tmp_path, "redis://h", timeout="0.25", max_bytes="1000", ttl="60"))).remote
    assert (remote.timeout, remote.max_bytes, remote.ttl) == (0.25, 1000, 60)


@pytest.mark.parametrize(
    "setting, value, expected",
    [
        ("URL", "http://u:hunter2@cache.internal:6379", "expected a URL of scheme redis://, rediss://, unix://"),
        ("URL", "cache.internal:6379", "expected a URL of scheme"),
        ("URL", "redis://:hunter2@cache.internal:port/0", "Port could not be cast"),
        ("TIMEOUT", "two", "expected a number of seconds > 0"),
        ("TIMEOUT", "0", "expected a number of seconds > 0"),
        ("TIMEOUT", "-1", "expected a number of seconds > 0"),
        ("TIMEOUT", "nan", "expected a number of seconds > 0"),
        ("TIMEOUT", "inf", "expected a number of seconds > 0"),
        ("MAX_BYTES", "64MiB", "expected a whole number of bytes > 0"),
        ("MAX_BYTES", "0", "expected a whole number of bytes > 0"),
        ("TTL", "30d", "expected a whole number of seconds, 0 for no expiry"),
        ("TTL", "-1", "expected a whole number of seconds, 0 for no expiry"),
    ],
)
def test_a_bad_setting_is_an_error_naming_the_variable(tmp_path, setting, value, expected):
    env = env_for(tmp_path, "redis://127.0.0.1:6379/0") | {f"HATCH_AUTOTUNE_CACHE_{setting}": value}
    with pytest.raises(BuildError) as info:
        open_compile_cache(read_cache_settings(env))
    message = str(info.value)
    assert message.startswith(f"hatch-autotune: HATCH_AUTOTUNE_CACHE_{setting}=") and expected in message, message
    assert "hunter2" not in message


def test_show_project_notes_a_shared_cache_that_failed_and_refuses_a_bad_setting(tmp_path, monkeypatch):
    """`hatch-autotune show PROJECT` compiles what ships through the same cache as a build."""
    pytest.importorskip("redis")
    from hatch_autotune.errors import CliError
    from hatch_autotune.inspection.readers import project_source

    src = write_tiny_project(tmp_path / "src", extra='mode = "offline"')
    for name, value in env_for(tmp_path / "cache", f"redis://:pw@127.0.0.1:{free_port()}/0").items():
        monkeypatch.setenv(name, value)
    (note,) = [n for n in project_source(src).notes if "shared compile cache" in n]
    assert "redis://:***@127.0.0.1:" in note
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_URL", "http://cache.internal")
    with pytest.raises(CliError, match=r"HATCH_AUTOTUNE_CACHE_URL=http://cache.internal: expected a URL of scheme"):
        project_source(src)


def test_a_bad_setting_stops_the_build_hook_with_that_message(tmp_path, monkeypatch):
    from test_plugin import fresh_build_data, hook_of

    src = write_tiny_project(tmp_path / "src", extra='mode = "offline"')
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_URL", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("HATCH_AUTOTUNE_CACHE_TIMEOUT", "soon")
    builder = WheelBuilder(str(src))
    with pytest.raises(SystemExit) as info:
        hook_of(builder, tmp_path / "dist").initialize("standard", fresh_build_data(builder))
    assert str(info.value) == "hatch-autotune: HATCH_AUTOTUNE_CACHE_TIMEOUT='soon': expected a number of seconds > 0 (default 2)"


@pytest.mark.parametrize(
    "url, shown",
    [
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:pw@host", "redis://:***@host"),
        ("rediss://pw@host:6380", "rediss://***@host:6380"),  # a user part alone may be a password
        ("redis://host:6379/0?password=pw&db=1", "redis://host:6379/0?password=***&db=1"),
        ("unix://user:pw@/run/redis.sock?db=0", "unix://user:***@/run/redis.sock?db=0"),
        ("redis://host:6379/0", "redis://host:6379/0"),
    ],
)
def test_redact_hides_the_password(url, shown):
    assert redact(url) == shown


def test_the_metadata_is_the_disk_stores_json(tmp_path):
    """One format for both tiers: the bytes in Redis are the .json file's."""
    cache = CompileCache(tmp_path)
    cache.put(KEY, COMPILED)
    assert cache._paths(KEY)[0].read_bytes() == COMPILED.metadata(KEY)
    assert json.loads(COMPILED.metadata(KEY)) == COMPILED.record(KEY)
