"""Object stores and other fsspec URLs (``s3://`` through s3fs, ``gs://``, ...): the ``jitops[s3]`` extra.

Imports ``fsspec`` (and, through it, the URL's filesystem) and ``.store``.
Blobs and records are whole objects. Leases need a create that fails when
the object exists (S3's ``If-None-Match: *``, fsspec's ``mode="create"``):
a key's lease is a series of generations ``leases/<name>/<n>``, each holding
its holder and its expiry; taking a lapsed lease means creating generation
``n + 1``, which only one node can do. Where the store ignores the condition,
:meth:`ObjectStore.check_exclusive` says so and ``jitops doctor`` reports it
(two nodes may then build one key; what they publish stays correct).

Timeouts go to botocore where the filesystem is s3fs (connect and read
timeouts, one attempt: botocore's retries and s3fs's own retry loop are both
off, so a stopped server costs one refused connection, not five with
backoff). The first contact (:meth:`ObjectStore.ping`) must answer within the
connect timeout as a whole: a server that accepts and never answers costs
that, not the read timeout. Making the client (botocore parses its models:
CPU, no network) comes before that deadline. S3 endpoints other than AWS's
come from botocore's own ``AWS_ENDPOINT_URL``; credentials from its usual chain.

botocore parses its JSON models (S3's API, the endpoint rules: about 0.15 s of
CPU) once per data loader. Every S3 store of a process shares one loader
(:func:`_s3_session`), and :func:`warm` fills it before a process forks
workers that each open the store.
"""

from __future__ import annotations

import functools
import json
import secrets
import socket
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

import fsspec
import fsspec.asyn

from .store import Holder, Store, StoreError, StoreTimeout, parse_lease, within

T = TypeVar("T")
# fsspec protocols that read archives or wrap another filesystem: never a store nodes can share and
# write.
NOT_STORES = frozenset(
    {
        "zip",
        "tar",
        "reference",
        "libarchive",
        "cached",
        "simplecache",
        "filecache",
        "blockcache",
        "dir",
    }
)
_loader: Any = None  # botocore's data loader: parsed models only, no connections or credentials


def _s3_session() -> Any:
    """A new aiobotocore session (its own credentials and connections) on this process's one data loader."""
    global _loader
    from aiobotocore.session import AioSession

    session = AioSession()
    if _loader is None:
        _loader = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _loader)
    return session


def warm() -> None:
    """Parse botocore's S3 models now, so that stores opened later, also in forked children, skip it."""
    import asyncio

    async def make_client() -> None:  # explicit dummy credentials: no credential lookup, no network
        async with _s3_session().create_client(
            "s3", region_name="us-east-1", aws_access_key_id="-", aws_secret_access_key="-"
        ):
            pass

    asyncio.run(make_client())


class ObjectStore(Store):
    def __init__(self, url: str, connect_timeout: float, op_timeout: float) -> None:
        self.url, self.connect_timeout, self.op_timeout = url, connect_timeout, op_timeout
        opts: dict[str, Any] = {"skip_instance_cache": True}
        if url.startswith(("s3://", "s3a://")):
            opts["config_kwargs"] = {
                "connect_timeout": connect_timeout,
                "read_timeout": op_timeout,
                "retries": {"max_attempts": 1},
            }
            # other nodes write: never answer a listing from memory
            opts["use_listings_cache"] = False
            opts["session"] = _s3_session()
        scheme = url.split("://", 1)[0].lower()
        if scheme in NOT_STORES:
            raise StoreError(
                f"{url} is not a store jitops can write to (fsspec's {scheme}:// reads an archive or "
                "wraps another filesystem). Fix: set JITOPS_REMOTE_CACHE to redis://, file:// or an "
                "object store such as s3://bucket/prefix"
            )
        try:
            self.fs, root = fsspec.url_to_fs(url, **opts)
        except ImportError as e:
            raise StoreError(
                f"cannot use {url}: {e}. Fix: pip install 'jitops[s3]' (or the fsspec backend "
                "for this URL)"
            ) from e
        except Exception as e:  # noqa: BLE001 - each fsspec filesystem raises its own on a URL it cannot open
            raise StoreError(
                f"cannot use {url}: {type(e).__name__}: {e}. Fix: check JITOPS_REMOTE_CACHE"
            ) from e
        if hasattr(self.fs, "retries"):
            # s3fs retries timeouts and refused connections 5 times with backoff by itself
            self.fs.retries = 1
        self.root = root.rstrip("/") + "/v1"

    def _p(self, name: str) -> str:
        if any(p in ("", ".", "..") for p in name.split("/")):
            raise StoreError(f"invalid store name {name!r}")
        return f"{self.root}/{name}"

    def _call(self, what: str, fn: Callable[[], T], deadline: float | None = None) -> T:
        try:  # a wall clock for the whole operation: botocore's read timeout is per socket read
            return within(deadline or self.op_timeout, f"{self.url}: {what}", fn)
        except (FileNotFoundError, FileExistsError, StoreTimeout):
            raise
        except Exception as e:  # noqa: BLE001 - botocore, aiohttp, gcsfs... each raises its own
            kind = StoreTimeout if "timeout" in type(e).__name__.lower() else StoreError
            raise kind(f"{self.url} failed {what}: {type(e).__name__}: {e}") from e

    def ping(self) -> None:
        bucket = self.root.split("/", 1)[0]
        fs = self.fs
        if isinstance(fs, fsspec.asyn.AsyncFileSystem):
            # s3fs: make the client now, outside the deadline below
            if self.url.startswith(("s3://", "s3a://")):
                self._call("setting up its client", fs.connect)

            def listing() -> Any:  # the whole round trip within the connect timeout
                return fsspec.asyn.sync(
                    fs.loop, fs._ls, bucket, detail=False, timeout=self.connect_timeout
                )
        else:

            def listing() -> Any:
                return fs.ls(bucket, detail=False)

        try:
            self._call("a listing", listing, self.connect_timeout + 1)
        except FileNotFoundError as e:
            raise StoreError(
                f"{self.url}: {bucket} does not exist. Fix: create it, or fix JITOPS_REMOTE_CACHE"
            ) from e
        except (
            StoreTimeout
        ) as e:  # a loaded machine can spend the budget before botocore even connects:
            where = self._refusing_endpoint()  # name a stopped server as one, not as a slow one
            if where:
                raise StoreError(
                    f"{self.url}: nothing listens at {where} (connection refused). Fix: start the "
                    "server, or fix AWS_ENDPOINT_URL / JITOPS_REMOTE_CACHE"
                ) from e
            raise

    def _refusing_endpoint(self) -> str | None:
        """``host:port`` of the S3 endpoint when a plain TCP connect to it is refused, else None."""
        url = getattr(getattr(getattr(self.fs, "s3", None), "meta", None), "endpoint_url", None)
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
        if not parts or not parts.hostname:
            return None
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname, port), timeout=0.25).close()
        except ConnectionRefusedError:
            return f"{parts.hostname}:{port}"
        except OSError:
            return None
        return None

    def get_blob(self, name: str) -> bytes | None:
        try:
            return self._call(f"GET {name}", lambda: self.fs.cat_file(self._p(name)))
        except FileNotFoundError:
            return None

    def put_blob(self, name: str, data: bytes) -> None:
        self._call(f"PUT {name}", lambda: self.fs.pipe_file(self._p(name), data))

    def _create(self, name: str, data: bytes) -> bool:
        try:
            self._call(
                f"create {name}", lambda: self.fs.pipe_file(self._p(name), data, mode="create")
            )
            return True
        except FileExistsError:
            return False

    def list_blobs(self, prefix: str) -> list[str]:
        try:
            found = self._call(
                "a listing", lambda: self.fs.find(self._p(prefix.rstrip("/") or "."))
            )
        except FileNotFoundError:
            return []
        return sorted(p[len(self.root) + 1 :] for p in found)

    def check_exclusive(self) -> bool:
        """True if a second create of one name fails, as leases need."""
        name = f"probe/exclusive-{secrets.token_hex(6)}"
        first, second = self._create(name, b"1"), self._create(name, b"2")
        self._call("delete", lambda: self.fs.rm_file(self._p(name)))
        self.exclusive_create = first and not second
        return self.exclusive_create

    # ---- leases: generations, each created at most once
    def _generations(self, name: str) -> list[int]:
        gens = [p.rsplit("/", 1)[1] for p in self.list_blobs(f"leases/{name}/")]
        return sorted(int(g) for g in gens if g.isdigit())

    def _read_gen(self, name: str, gen: int) -> tuple[Holder, float, bytes] | None:
        raw = self.get_blob(f"leases/{name}/{gen}")
        if raw is None:
            return None
        try:
            d = json.loads(raw)
            holder, _ = parse_lease(json.dumps(d["holder"]).encode())
            return holder, float(d["expires"]), raw
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError):
            return Holder("?", 0, 0.0, ""), 0.0, raw

    def _live(
        self, name: str, cur: tuple[Holder, float, bytes] | None, ttl: float
    ) -> Holder | None:
        if cur is None:
            return None
        holder, expires, raw = cur
        return holder if self.judge.live(name, raw, holder, expires, ttl) else None

    @staticmethod
    def _body(holder: Holder, ttl: float) -> bytes:
        return json.dumps(
            {"holder": json.loads(holder.to_bytes()), "expires": time.time() + ttl}
        ).encode()

    def acquire_lease(self, name: str, holder: Holder, ttl: float) -> Holder | None:
        gens = self._generations(name)
        nxt = 0
        if gens:
            live = self._live(name, self._read_gen(name, gens[-1]), ttl)
            if live is not None:
                return live
            nxt = gens[-1] + 1
        if self._create(f"leases/{name}/{nxt}", self._body(holder, ttl)):
            for old in gens[:-1]:
                self._call(
                    "delete", functools.partial(self.fs.rm_file, self._p(f"leases/{name}/{old}"))
                )
            return None
        won = self._read_gen(name, nxt)
        return won[0] if won is not None else Holder("?", 0, time.time(), "")

    def _mine(self, name: str, holder: Holder) -> int | None:
        gens = self._generations(name)
        if not gens:
            return None
        cur = self._read_gen(name, gens[-1])
        return gens[-1] if cur is not None and cur[0].same(holder) else None

    def renew_lease(self, name: str, holder: Holder, ttl: float) -> bool:
        gen = self._mine(name, holder)
        if gen is None:
            return False
        self.put_blob(f"leases/{name}/{gen}", self._body(holder, ttl))
        return True

    def release_lease(self, name: str, holder: Holder) -> None:
        gen = self._mine(name, holder)
        if gen is not None:  # lapse it in place: the generation number must never be created twice
            self.put_blob(
                f"leases/{name}/{gen}",
                json.dumps({"holder": json.loads(holder.to_bytes()), "expires": 0}).encode(),
            )

    def lease_holder(self, name: str, ttl: float) -> Holder | None:
        gens = self._generations(name)
        return self._live(name, self._read_gen(name, gens[-1]), ttl) if gens else None

    # ---- records
    def put_record(self, name: str, data: bytes, ttl: float) -> None:
        self.put_blob(
            name,
            json.dumps(
                {"expires": time.time() + ttl, "data": data.decode("utf-8", "replace")}
            ).encode(),
        )

    def get_record(self, name: str) -> bytes | None:
        raw = self.get_blob(name)
        try:
            d = json.loads(raw) if raw is not None else None
            return (
                d["data"].encode() if d is not None and float(d["expires"]) > time.time() else None
            )
        except (ValueError, KeyError, TypeError):
            return None
