"""The Redis backend (``redis://``, ``rediss://``): redis-py with bounded timeouts and no retries.

Imports ``redis`` (the ``jitops[redis]`` extra) and ``.store``. Leases are
``SET NX PX`` with the holder as value; renewing and releasing compare the
value in a server-side script, so a lapsed holder never touches its
successor's lease. Records are ``SET PX``. Every redis-py error becomes a
:class:`StoreError` (a timeout a :class:`StoreTimeout`): redis-py's own
retries are off, so one silent server costs one timeout, not several.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.retry import Retry
from redis.backoff import NoBackoff

from .store import Holder, Store, StoreError, StoreTimeout

T = TypeVar("T")
PREFIX = "jitops:v1:"

_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


class RedisStore(Store):
    def __init__(self, url: str, connect_timeout: float, op_timeout: float) -> None:
        self.url = url
        self._connect_timeout = connect_timeout
        kw: dict[str, Any] = {"socket_connect_timeout": connect_timeout, "retry": Retry(NoBackoff(), 0),
                              "retry_on_timeout": False, "health_check_interval": 0}
        try:
            self._r = redis.Redis.from_url(url, socket_timeout=op_timeout, **kw)
            # The first contact answers within the connect timeout: a server that accepts and never replies
            # costs that, not the operation timeout.
            self._probe = redis.Redis.from_url(url, socket_timeout=connect_timeout, **kw)
        except (ValueError, redis.RedisError) as e:
            raise StoreError(f"cannot use {url}: {e}") from e

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except redis.TimeoutError as e:
            raise StoreTimeout(f"{self.url} did not answer {what} in time ({e})") from e
        except (redis.RedisError, OSError) as e:
            raise StoreError(f"{self.url} failed {what}: {e}") from e

    def ping(self) -> None:
        self._call("PING", self._probe.ping)

    def get_blob(self, name: str) -> bytes | None:
        return self._call(f"GET {name}", lambda: self._r.get(PREFIX + name))  # type: ignore[return-value]

    def put_blob(self, name: str, data: bytes) -> None:
        self._call(f"SET {name}", lambda: self._r.set(PREFIX + name, data))

    def list_blobs(self, prefix: str) -> list[str]:
        def scan() -> list[str]:
            return sorted(k.decode()[len(PREFIX):] for k in self._r.scan_iter(match=PREFIX + prefix + "*", count=500))
        return self._call("SCAN", scan)

    def acquire_lease(self, name: str, holder: Holder, ttl: float) -> Holder | None:
        key = PREFIX + name
        if self._call("SET NX", lambda: self._r.set(key, holder.to_bytes(), nx=True, px=int(ttl * 1000))):
            return None
        current = self._call("GET", lambda: self._r.get(key))
        if current is None:  # lapsed between the two calls: try once more
            ok = self._call("SET NX", lambda: self._r.set(key, holder.to_bytes(), nx=True, px=int(ttl * 1000)))
            return None if ok else Holder("?", 0, 0.0, "")
        return Holder.from_bytes(current)  # type: ignore[arg-type]

    def renew_lease(self, name: str, holder: Holder, ttl: float) -> bool:
        return bool(self._call("renew", lambda: self._r.eval(_RENEW, 1, PREFIX + name, holder.to_bytes(),
                                                               int(ttl * 1000))))

    def release_lease(self, name: str, holder: Holder) -> None:
        self._call("release", lambda: self._r.eval(_RELEASE, 1, PREFIX + name, holder.to_bytes()))

    def lease_holder(self, name: str, ttl: float) -> Holder | None:
        raw = self._call("GET", lambda: self._r.get(PREFIX + name))
        return None if raw is None else Holder.from_bytes(raw)  # type: ignore[arg-type]

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
