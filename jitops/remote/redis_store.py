"""The Redis backend (``redis://``, ``rediss://``): redis-py with bounded timeouts and no retries.

Imports ``redis`` (the ``jitops[redis]`` extra) and ``.store``. Leases are
``SET NX PX`` with the holder (and its stated ttl) as value; renewing rewrites
the value (a new stated expiry) and releasing deletes it, each only when the
value holds our token (a server-side script), so a lapsed holder never touches
its successor's lease. A lease the server keeps although its holder stopped
renewing (no ``PX``, or an absurd one) is judged by ``LeaseJudge`` and taken
over with a compare-and-set script. Records are ``SET PX``. Every redis-py
error becomes a :class:`StoreError` (a timeout a :class:`StoreTimeout`):
redis-py's own retries are off, so one silent server costs one timeout, not
several; and each call has a wall-clock deadline (``within``), so a server
that drips its answer costs the operation timeout, not the answer's length.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.retry import Retry
from redis.backoff import NoBackoff

from .store import Holder, Store, StoreError, StoreTimeout, parse_lease, within

T = TypeVar("T")
PREFIX = "jitops:v1:"

_OURS = "local v = redis.call('get', KEYS[1]) if v and string.find(v, ARGV[1], 1, true) then "
_RENEW = _OURS + "redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 else return 0 end"
_RELEASE = _OURS + "return redis.call('del', KEYS[1]) else return 0 end"
_TAKEOVER = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]) "
    "return 1 else return 0 end"
)


def _token(holder: Holder) -> str:
    return json.dumps({"token": holder.token})[1:-1]  # '"token": "<hex>"', as the record spells it


class RedisStore(Store):
    def __init__(self, url: str, connect_timeout: float, op_timeout: float) -> None:
        self.url = url
        self._connect_timeout, self._op_timeout = connect_timeout, op_timeout
        kw: dict[str, Any] = {
            "socket_connect_timeout": connect_timeout,
            "retry": Retry(NoBackoff(), 0),
            "retry_on_timeout": False,
            "health_check_interval": 0,
        }
        try:
            self._r = redis.Redis.from_url(url, socket_timeout=op_timeout, **kw)
            # The first contact answers within the connect timeout: a server that accepts and never
            # replies costs that, not the operation timeout.
            self._probe = redis.Redis.from_url(url, socket_timeout=connect_timeout, **kw)
        except (ValueError, redis.RedisError) as e:
            raise StoreError(f"cannot use {url}: {e}") from e

    def _abort(self) -> None:
        # shuts the sockets down: a call stuck on a dripping reply returns
        for c in (
            self._r,
            self._probe,
        ):
            c.connection_pool.disconnect()

    def _call(self, what: str, fn: Callable[[], T], deadline: float | None = None) -> T:
        try:
            return within(deadline or self._op_timeout, f"{self.url}: {what}", fn, self._abort)
        except StoreTimeout:
            raise
        except redis.TimeoutError as e:
            raise StoreTimeout(f"{self.url} did not answer {what} in time ({e})") from e
        except (redis.RedisError, OSError) as e:
            raise StoreError(f"{self.url} failed {what}: {e}") from e

    def ping(self) -> None:
        self._call("PING", self._probe.ping, self._connect_timeout)

    def get_blob(self, name: str) -> bytes | None:
        return self._call(f"GET {name}", lambda: self._r.get(PREFIX + name))  # type: ignore[return-value]

    def put_blob(self, name: str, data: bytes) -> None:
        self._call(f"SET {name}", lambda: self._r.set(PREFIX + name, data))

    def list_blobs(self, prefix: str) -> list[str]:
        def scan() -> list[str]:
            return sorted(
                k.decode()[len(PREFIX) :]
                for k in self._r.scan_iter(match=PREFIX + prefix + "*", count=500)
            )

        return self._call("SCAN", scan)

    @staticmethod
    def _record(holder: Holder, ttl: float) -> bytes:
        # the expiry is informative: the server's PX rules
        return holder.to_bytes(expires=time.time() + ttl)

    def acquire_lease(self, name: str, holder: Holder, ttl: float) -> Holder | None:
        key, px = PREFIX + name, max(1, int(ttl * 1000))
        if self._call(
            "SET NX", lambda: self._r.set(key, self._record(holder, ttl), nx=True, px=px)
        ):
            return None
        current: bytes | None = self._call("GET", lambda: self._r.get(key))  # type: ignore[assignment]
        if current is None:  # lapsed between the two calls: try once more
            ok = self._call(
                "SET NX", lambda: self._r.set(key, self._record(holder, ttl), nx=True, px=px)
            )
            return None if ok else Holder("?", 0, 0.0, "")
        other, _ = parse_lease(current)
        if self.judge.live(name, current, other, None, ttl):
            return other
        # Kept although its holder stopped renewing (no PX, or one the reader does not accept):
        # replace it only if it is still that record, so one waiter takes over.
        won = self._call(
            "take over",
            lambda: self._r.eval(_TAKEOVER, 1, key, current, self._record(holder, ttl), px),
        )
        return None if won else Holder("?", 0, time.time(), "")

    def renew_lease(self, name: str, holder: Holder, ttl: float) -> bool:
        return bool(
            self._call(
                "renew",
                lambda: self._r.eval(
                    _RENEW,
                    1,
                    PREFIX + name,
                    _token(holder),
                    self._record(holder, ttl),
                    max(1, int(ttl * 1000)),
                ),
            )
        )

    def release_lease(self, name: str, holder: Holder) -> None:
        self._call("release", lambda: self._r.eval(_RELEASE, 1, PREFIX + name, _token(holder)))

    def lease_holder(self, name: str, ttl: float) -> Holder | None:
        raw: bytes | None = self._call("GET", lambda: self._r.get(PREFIX + name))  # type: ignore[assignment]
        if raw is None:
            return None
        holder, _ = parse_lease(raw)
        return holder if self.judge.live(name, raw, holder, None, ttl) else None

    def put_record(self, name: str, data: bytes, ttl: float) -> None:
        self._call("SET PX", lambda: self._r.set(PREFIX + name, data, px=max(1, int(ttl * 1000))))

    def get_record(self, name: str) -> bytes | None:
        return self._call("GET", lambda: self._r.get(PREFIX + name))  # type: ignore[return-value]

    def close(self) -> None:
        for c in (self._r, self._probe):
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
