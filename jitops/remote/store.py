"""The small store interface every remote backend implements, and its errors.

Imports only the stdlib. Three kinds of things live in a store, by name:

- **blobs**: whole values, written all at once or not at all (entries);
- **leases**: "who builds this key", created only if absent, held by a token,
  renewed by their holder, lapsing by themselves ``ttl`` seconds after the
  last renewal (a dead holder's lease frees itself). The record states the
  holder's own ``ttl`` (and, where the backend has no server-side expiry, its
  expiry); a reader judges it by that, never by its own setting, but accepts
  no more than :data:`LEASE_CAP` times its own lease unchanged
  (:class:`LeaseJudge`): a lease written without expiry, or with one in 2100,
  still frees itself;
- **records**: small values that lapse ``ttl`` seconds after being written
  (failed builds).

Each backend maps these onto what it has: Redis ``SET NX PX`` and scripts, a
filesystem's exclusive create and mtimes, or a c10d store's
``compare_set`` with the expiry written into the value. Every failure to talk
to the store is a :class:`StoreError`; the tier then switches itself off.
Network backends run each operation under :func:`within`, a wall-clock
deadline for the whole operation (a store that drips bytes cannot hold it).
Text a store supplies is shown only through :func:`clean_text`.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import socket
import threading
import time
import unicodedata
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
# : A reader accepts a holder's stated lease of at most this many times its own
# JITOPS_REMOTE_LEASE_SECONDS. : A holder renews every third of its lease, so nodes whose settings
# differ by up to 3 * LEASE_CAP never : take each other's live lease; a lease with no or an absurd
# expiry lapses after LEASE_CAP * the reader's lease.
LEASE_CAP = 4.0
_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])")


def clean_text(text: str, limit: int = 8000) -> str:
    """Text a store supplied, safe to show or raise: escape sequences and control or format characters
    (ANSI colours, cursor moves, bidi overrides) removed, newlines and tabs kept, at most ``limit`` characters."""
    text = _ANSI.sub("", str(text)[: limit * 2])
    return "".join(
        c for c in text if c in "\n\t" or unicodedata.category(c) not in ("Cc", "Cf", "Cs")
    )[:limit]


class StoreError(Exception):
    """The store could not be reached or refused an operation (the tier turns itself off).

    Its text often quotes the store (an error reply, a key): it is cleaned (:func:`clean_text`) here, once.
    """

    def __init__(self, message: str = "") -> None:
        super().__init__(clean_text(message, 2000))


class StoreTimeout(StoreError):
    """The store did not answer within the connect or operation timeout."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: shown to waiters, and the token that proves it."""

    host: str
    pid: int
    since: float  # wall-clock time the lease was taken
    token: str
    # the holder's own lease seconds, as it states them (0: not stated, an older writer)
    ttl: float = 0.0

    @classmethod
    def me(cls, ttl: float = 0.0) -> Holder:
        return cls(socket.gethostname(), os.getpid(), time.time(), secrets.token_hex(8), ttl)

    def to_bytes(self, expires: float | None = None) -> bytes:
        """The lease record; ``expires``: the holder's wall-clock expiry, for backends without a server-side one."""
        d: dict[str, object] = {
            "host": self.host,
            "pid": self.pid,
            "since": self.since,
            "token": self.token,
        }
        if self.ttl:
            d["ttl"] = self.ttl
        if expires is not None:
            d["expires"] = expires
        return json.dumps(d, sort_keys=True).encode()

    def same(self, other: Holder) -> bool:
        return bool(self.token) and self.token == other.token

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, holding the lease for {max(0.0, time.time() - self.since):.0f}s"


def _finite(x: object) -> float | None:
    try:
        v = float(x)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


def parse_lease(raw: bytes) -> tuple[Holder, float | None]:
    """(holder, stated wall-clock expiry or None) of a lease record; whatever a store holds, never an error."""
    try:
        d = json.loads(raw)
        if not isinstance(d, dict):
            raise TypeError(d)
        since = _finite(d.get("since"))
        ttl = _finite(d.get("ttl")) or 0.0
        holder = Holder(
            clean_text(str(d["host"]), 200),
            int(d["pid"]),
            time.time() if since is None else since,
            str(d["token"]),
            ttl if ttl > 0 else 0.0,
        )
        return holder, _finite(d.get("expires")) if "expires" in d else None
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
        return Holder("?", 0, time.time(), ""), None


@dataclass(frozen=True)
class Failure:
    """A failed build's record, as waiters read it (its text cleaned for display)."""

    host: str
    pid: int
    at: float  # wall-clock time of the failure
    message: str

    def to_bytes(self) -> bytes:
        return json.dumps(
            {"host": self.host, "pid": self.pid, "at": self.at, "message": self.message}
        ).encode()

    @classmethod
    def parse(cls, raw: bytes, keep: float) -> Failure | None:
        """The record, or None when unreadable or lapsed: a reader believes it for its own ``keep`` seconds
        (JITOPS_REMOTE_FAILURE_SECONDS) from its time, whatever expiry its writer gave it, or none."""
        try:
            d = json.loads(raw)
            rec = cls(
                clean_text(d["host"], 200), int(d["pid"]), float(d["at"]), clean_text(d["message"])
            )
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
            return None
        age = time.time() - rec.at
        # also NaN and a time far ahead: not a failure it believes
        return rec if -keep <= age < keep else None


class LeaseJudge:
    """Whether another node's lease is live, by what its holder states, within what this reader accepts.

    A lease is live while (1) its stated wall-clock expiry (if any) is ahead and (2) this reader has not
    seen the same record unchanged for the holder's stated ttl, capped at ``LEASE_CAP`` times the reader's
    own (the reader's own ttl when the holder states none). A live holder rewrites or touches its record
    every third of its ttl, so (2) only ends a lease whose holder stopped renewing or stated an absurd one.
    """

    def __init__(self) -> None:
        self._seen: dict[
            str, tuple[bytes, float]
        ] = {}  # name -> (record as observed, monotonic first seen)
        self._guard = threading.Lock()

    def live(
        self, name: str, observed: bytes, holder: Holder, expires: float | None, reader_ttl: float
    ) -> bool:
        if expires is not None and expires <= time.time():
            return False
        limit = min(holder.ttl or reader_ttl, LEASE_CAP * reader_ttl)
        now = time.monotonic()
        with self._guard:
            seen = self._seen.get(name)
            if seen is None or seen[0] != observed:
                self._seen[name] = (observed, now)
                return True
            return now - seen[1] < limit


def within(
    seconds: float, what: str, fn: Callable[[], T], abort: Callable[[], None] | None = None
) -> T:
    """``fn()`` with a wall-clock deadline for the whole call: StoreTimeout after ``seconds``.

    ``fn`` runs in a daemon thread; at the deadline ``abort`` (closing the connection) frees it, and the
    caller gets StoreTimeout at once (the tier then switches itself off). For the miss path only.
    """
    box: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box.append((False, e))

    t = threading.Thread(target=run, name="jitops-store-op", daemon=True)
    t.start()
    t.join(seconds)
    if not box:
        if abort is not None:
            try:
                abort()
            except Exception:  # noqa: BLE001 - best effort: the caller already gives up
                pass
        raise StoreTimeout(
            f"{what} took more than {seconds:g}s (JITOPS_REMOTE_TIMEOUT bounds each operation)"
        )
    ok, value = box[0]
    if not ok:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]


class Store(ABC):
    """One remote store. Names are ``/``-separated ASCII paths such as ``entries/softmax/cpu-avx2/<key>``."""

    url: str
    #: True where lease creation is atomic (only one creator can win); doctor reports it.
    exclusive_create: bool = True
    _judge: LeaseJudge | None = None

    @property
    def judge(self) -> LeaseJudge:
        if self._judge is None:
            self._judge = LeaseJudge()
        return self._judge

    @abstractmethod
    def ping(self) -> None:
        """A round trip within the connect timeout, or StoreError."""

    @abstractmethod
    def get_blob(self, name: str) -> bytes | None: ...

    @abstractmethod
    def put_blob(self, name: str, data: bytes) -> None:
        """Write (or replace) a blob; readers see the old value or the whole new one."""

    @abstractmethod
    def list_blobs(self, prefix: str) -> list[str]: ...

    @abstractmethod
    def acquire_lease(self, name: str, holder: Holder, ttl: float) -> Holder | None:
        """Take the lease if it is free or lapsed: None. Otherwise the current holder."""

    @abstractmethod
    def renew_lease(self, name: str, holder: Holder, ttl: float) -> bool:
        """Extend our lease; False if it is no longer ours (it lapsed and was taken)."""

    @abstractmethod
    def release_lease(self, name: str, holder: Holder) -> None:
        """Drop the lease if it is still ours."""

    @abstractmethod
    def lease_holder(self, name: str, ttl: float) -> Holder | None:
        """The live holder, or None when free or lapsed."""

    @abstractmethod
    def put_record(self, name: str, data: bytes, ttl: float) -> None: ...

    @abstractmethod
    def get_record(self, name: str) -> bytes | None:
        """The record, or None when absent or lapsed."""

    def close(self) -> None:  # noqa: B027 - optional
        pass
