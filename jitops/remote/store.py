"""The small store interface every remote backend implements, and its errors.

Imports only the stdlib. Three kinds of things live in a store, by name:

- **blobs**: whole values, written all at once or not at all (entries);
- **leases**: "who builds this key", created only if absent, held by a token,
  renewed by their holder, lapsing by themselves ``ttl`` seconds after the
  last renewal (a dead holder's lease frees itself);
- **records**: small values that lapse ``ttl`` seconds after being written
  (failed builds).

Each backend maps these onto what it has: Redis ``SET NX PX`` and scripts, a
filesystem's exclusive create and mtimes, or (issue 16) a c10d store's
``compare_set`` with the expiry written into the value. Every failure to talk
to the store is a :class:`StoreError`; the tier then switches itself off.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass


class StoreError(Exception):
    """The store could not be reached or refused an operation (the tier turns itself off)."""


class StoreTimeout(StoreError):
    """The store did not answer within the connect or operation timeout."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: shown to waiters, and the token that proves it."""

    host: str
    pid: int
    since: float  # wall-clock time the lease was taken
    token: str

    @classmethod
    def me(cls) -> Holder:
        return cls(socket.gethostname(), os.getpid(), time.time(), secrets.token_hex(8))

    def to_bytes(self) -> bytes:
        return json.dumps({"host": self.host, "pid": self.pid, "since": self.since, "token": self.token},
                          sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Holder:
        try:
            d = json.loads(raw)
            return cls(str(d["host"]), int(d["pid"]), float(d["since"]), str(d["token"]))
        except (ValueError, KeyError, TypeError):
            return cls("?", 0, time.time(), "")

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}, holding the lease for {max(0.0, time.time() - self.since):.0f}s"


class Store(ABC):
    """One remote store. Names are ``/``-separated ASCII paths such as ``entries/softmax/cpu-avx2/<key>``."""

    url: str
    #: True where lease creation is atomic (only one creator can win); doctor reports it.
    exclusive_create: bool = True

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
