"""The job's own c10d store (``torch.distributed.Store``, a TCPStore under torchrun) as a remote backend.

Imports ``.store`` and, when a store is opened, ``torch.distributed``. Every
call is a single non-blocking request: ``get`` only after ``check`` says the
key exists (a c10d ``get`` of a missing key would block for the store's
timeout), ``wait`` is never used, and no collective is ever issued.

- **Blobs** are cut into chunks of at most :data:`CHUNK` bytes (4 MiB). The
  TCPStore server is one event loop holding every value in memory and serving
  the job's own rendezvous and process-group keys too: one request of a few
  MiB keeps it responsive, where a single 200 MiB CUDA entry would stall it
  and need that much contiguous memory at once on both ends. The chunks go
  first, under a fresh upload id; then one meta record (size, chunk count,
  sha256 of the whole blob, id) commits the upload. A reader takes the meta,
  reads that upload's chunks and returns the blob only if its sha256 equals
  the digest the writer published: a torn or mixed upload is never returned.
- **Leases** are ``compare_set`` on one key holding the holder and a renewal
  counter. Taking a free lease is ``compare_set(key, "", mine)``; releasing
  is ``compare_set(key, mine, "")``, so a lapsed holder never frees its
  successor's lease. A lease lapses when its value has not changed for the
  holder's stated ``ttl`` (in the value; at most ``LEASE_CAP`` times the
  reader's own) *as this process observes it* (monotonic clock, ``LeaseJudge``):
  the holder rewrites it every ``ttl/3``, so no clock needs to agree across nodes.
  Taking a lapsed lease over is ``compare_set(key, old, mine)``: one winner.
- **Records** hold their writer's expiry time (wall clock; failure records
  last minutes, so small clock skew does not matter).
- **Exit.** Every call into the C++ store passes a gate (:class:`_Gate`). A daemon
  thread (a lease renewal, ``distributed.warm``'s heartbeat) whose call returns while
  the interpreter finalizes is ended by Python inside pybind11's GIL guard, and that
  aborts the whole process ("terminate called without an active exception"). At exit,
  before finalizing, the gate lets the calls under way return (a bounded wait) and
  refuses new ones with StoreError.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from .store import Holder, Store, StoreError, StoreTimeout, parse_lease

T = TypeVar("T")
PREFIX = "jitops/v1/"
CHUNK = 4 << 20  # bytes per store request; see the module docstring
EXIT_WAIT = 2.0  # seconds the exit waits for calls under way; a stalled one rarely ends meanwhile


class _Gate:
    """This process's calls into the C++ store: counted while under way, none after ``close``."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = 0
        self._closed = False

    @contextmanager
    def call(self, what: str) -> Iterator[None]:
        with self._cond:
            if self._closed:
                raise StoreError(f"{what} was not sent: this process is exiting")
            self._busy += 1
        try:
            yield
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def close(self, wait: float = EXIT_WAIT) -> bool:
        """Refuse new calls; wait up to ``wait`` s for those under way. True if none is left."""
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: self._busy == 0, timeout=wait)

    def reopen(self) -> None:  # a forked child: the parent's calls are not its own
        self._cond, self._busy, self._closed = threading.Condition(), 0, False


_gate = _Gate()
# atexit runs its hooks last-registered first: this one, registered on import, after the tier's
atexit.register(_gate.close)
os.register_at_fork(after_in_child=_gate.reopen)


class C10dStore(Store):
    """A ``torch.distributed.Store`` (our own TCPStore client, or the default process group's store)."""

    def __init__(self, store: Any, url: str) -> None:
        self._s, self.url = store, url
        self._mine: dict[str, bytes] = {}  # lease key -> the value we last wrote
        self._guard = threading.Lock()  # the lease thread renews while the main thread polls

    @classmethod
    def connect(cls, host: str, port: int, connect_timeout: float, op_timeout: float) -> C10dStore:
        """A TCPStore client of the job's store (never its server); StoreError if it cannot connect in time."""
        from datetime import timedelta

        import torch.distributed as dist

        url = f"c10d://{host}:{port}"
        try:
            with _gate.call(f"connect to {url}"):
                s = dist.TCPStore(
                    host,
                    port,
                    is_master=False,
                    timeout=timedelta(seconds=connect_timeout),
                    wait_for_workers=False,
                )
                s.set_timeout(timedelta(seconds=op_timeout))
        except (
            RuntimeError,
            OSError,
            ValueError,
            TypeError,
            OverflowError,
        ) as e:  # TypeError: a port pybind11 refuses
            raise StoreError(f"cannot connect to the job's store {url}: {e}") from e
        return cls(s, url)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            with _gate.call(f"{what} on {self.url}"):
                return fn()
        except (
            RuntimeError,
            OSError,
            ValueError,
        ) as e:  # torch's DistStoreError/DistNetworkError are RuntimeErrors
            if "timeout" in str(e).lower() or "timed out" in str(e).lower():
                raise StoreTimeout(
                    f"the job's store {self.url} did not answer {what} in time ({e})"
                ) from e
            raise StoreError(f"the job's store {self.url} failed {what}: {e}") from e

    def _get(self, key: str) -> bytes | None:
        k = PREFIX + key
        if not self._call(f"check {key}", lambda: self._s.check([k])):
            return None
        return bytes(self._call(f"get {key}", lambda: self._s.get(k)))

    def _cas(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return bytes(
            self._call(
                f"compare_set {key}", lambda: self._s.compare_set(PREFIX + key, expected, desired)
            )
        )

    def ping(self) -> None:
        self._call("check", lambda: self._s.check([PREFIX + "ping"]))

    # ---- blobs, in chunks
    def get_blob(self, name: str) -> bytes | None:
        raw = self._get(f"blobs/{name}")
        if raw is None:
            return None
        try:
            meta = json.loads(raw)
            uid, n, size, digest = (
                str(meta["id"]),
                int(meta["chunks"]),
                int(meta["size"]),
                str(meta["sha256"]),
            )
        except (ValueError, KeyError, TypeError):
            return None
        parts = []
        for i in range(n):
            part = self._get(f"chunks/{name}@{uid}/{i}")
            if part is None:
                return None
            parts.append(part)
        blob = b"".join(parts)
        if len(blob) != size or hashlib.sha256(blob).hexdigest() != digest:
            return None  # not what the writer published: never returned, so never installed
        return blob

    def put_blob(self, name: str, data: bytes) -> None:
        uid = secrets.token_hex(6)
        n = max(1, -(-len(data) // CHUNK))
        for i in range(n):
            part = data[i * CHUNK : (i + 1) * CHUNK]
            self._call(
                f"set chunk {i} of {name}",
                lambda: self._s.set(f"{PREFIX}chunks/{name}@{uid}/{i}", part),
            )
        meta = json.dumps(
            {"id": uid, "chunks": n, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        )
        self._call(f"set {name}", lambda: self._s.set(f"{PREFIX}blobs/{name}", meta.encode()))

    def list_blobs(self, prefix: str) -> list[str]:
        # TCPStore has it; a PrefixStore may not
        keys = self._call("list_keys", lambda: list(self._s.list_keys()))
        start = PREFIX + "blobs/"
        return sorted(k[len(start) :] for k in map(str, keys) if k.startswith(start + prefix))

    # ---- leases
    def _lapsed(self, key: str, value: bytes, ttl: float) -> bool:
        return not self.judge.live(key, value, self._holder(value), None, ttl)

    @staticmethod
    def _value(holder: Holder, count: int) -> bytes:
        return holder.to_bytes() + b"\n%d" % count

    @staticmethod
    def _holder(value: bytes) -> Holder:
        return parse_lease(value.split(b"\n", 1)[0])[0]

    def acquire_lease(self, name: str, holder: Holder, ttl: float) -> Holder | None:
        key, mine = name, self._value(holder, 0)
        with self._guard:
            current = self._cas(key, b"", mine)
            if current == mine:
                self._mine[key] = mine
                return None
            if self._lapsed(key, current, ttl) and self._cas(key, current, mine) == mine:
                self._mine[key] = mine
                return None
            return self._holder(current)

    def renew_lease(self, name: str, holder: Holder, ttl: float) -> bool:
        key = name
        with self._guard:
            old = self._mine.get(key)
            if old is None:
                return False
            new = self._value(holder, int(old.rsplit(b"\n", 1)[1]) + 1)
            if self._cas(key, old, new) != new:
                self._mine.pop(key, None)
                return False
            self._mine[key] = new
            return True

    def release_lease(self, name: str, holder: Holder) -> None:
        key = name
        with self._guard:
            old = self._mine.pop(key, None)
            if old is not None:
                self._cas(key, old, b"")

    def lease_holder(self, name: str, ttl: float) -> Holder | None:
        key = name
        with self._guard:
            current = self._get(key)
            if not current or self._lapsed(key, current, ttl):
                return None
            return self._holder(current)

    # ---- plain values, for `jitops.distributed.warm`'s own keys
    def put_value(self, name: str, data: bytes) -> None:
        self._call(f"set {name}", lambda: self._s.set(f"{PREFIX}values/{name}", data))

    def get_value(self, name: str) -> bytes | None:
        return self._get(f"values/{name}")

    def first_value(self, name: str, data: bytes) -> bytes:
        """Write ``data`` unless a value is there; the value that won (``data`` or the earlier one)."""
        return self._cas(f"values/{name}", b"", data)

    # ---- records
    def put_record(self, name: str, data: bytes, ttl: float) -> None:
        self._call(
            f"set {name}",
            lambda: self._s.set(f"{PREFIX}records/{name}", b"%.3f\n" % (time.time() + ttl) + data),
        )

    def get_record(self, name: str) -> bytes | None:
        raw = self._get(f"records/{name}")
        if raw is None:
            return None
        stamp, _, data = raw.partition(b"\n")
        try:
            return data if float(stamp) > time.time() else None
        except ValueError:
            return None
