"""The filesystem backend (``file://`` on a shared directory, e.g. NFS).

Imports only the stdlib and ``.store``. Blobs are written to a temporary
name and renamed into place. A lease is a file made with exclusive create
(``O_EXCL``) holding the holder and its stated ttl; its holder renews it by
touching it (a heartbeat), and it has lapsed when its mtime is older than the
holder's stated ttl (``LeaseJudge``: an mtime in the future counts from when
this reader first saw it, at most ``LEASE_CAP`` times its own lease). Taking
over a lapsed lease renames it away first: a rename succeeds for one process
only, so one waiter takes over. Records carry their expiry inside.

mtimes on a network filesystem come from the server's clock; ttls of tens
of seconds absorb ordinary skew. A hung NFS mount cannot be timed out from
Python; that is the mount's ``timeo``/``soft`` options' job.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import secrets
import time
from pathlib import Path

from .store import Holder, Store, StoreError, parse_lease

_FULL = {errno.ENOSPC, errno.EDQUOT}


class FileStore(Store):
    def __init__(self, url: str) -> None:
        self.url = url
        path = url[len("file://") :]
        if not path.startswith("/"):
            raise StoreError(
                f"{url} is not an absolute file:// URL. Fix: write it as file:///shared/dir"
            )
        self.root = Path(path) / "v1"

    def _path(self, name: str) -> Path:
        parts = name.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise StoreError(f"invalid store name {name!r}")
        return self.root.joinpath(*parts)

    @staticmethod
    def _fail(what: str, e: OSError) -> StoreError:
        full = " (the store is full)" if e.errno in _FULL else ""
        return StoreError(f"{what} failed{full}: {e}")

    def ping(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            os.listdir(self.root)
        except OSError as e:
            raise self._fail(f"reaching {self.url}", e) from e

    def get_blob(self, name: str) -> bytes | None:
        try:
            return self._path(name).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise self._fail(f"reading {name} from {self.url}", e) from e

    def put_blob(self, name: str, data: bytes) -> None:
        self._write(self._path(name), data, f"writing {name} to {self.url}")

    def _write(self, dest: Path, data: bytes, what: str) -> None:
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise self._fail(what, e) from e

    def list_blobs(self, prefix: str) -> list[str]:
        base = self.root
        out = []
        try:
            for dirpath, _dirs, files in os.walk(base):
                for f in files:
                    rel = os.path.relpath(os.path.join(dirpath, f), base).replace(os.sep, "/")
                    if rel.startswith(prefix) and not f.startswith("."):
                        out.append(rel)
        except OSError as e:
            raise self._fail(f"listing {self.url}", e) from e
        return sorted(out)

    # ---- leases
    def _lease_path(self, name: str) -> Path:
        p = self._path(name)
        return p.with_name(p.name + ".lease")

    def _live(self, name: str, found: tuple[bytes, float], ttl: float) -> Holder | None:
        raw, mtime = found
        holder, _ = parse_lease(raw)
        observed = raw + b"@%r" % mtime
        return (
            holder
            if self.judge.live(name, observed, holder, mtime + (holder.ttl or ttl), ttl)
            else None
        )

    @staticmethod
    def _read_live(path: Path) -> tuple[bytes, float] | None:
        try:
            with open(path, "rb") as f:
                raw = f.read(4096)
                mtime = os.fstat(f.fileno()).st_mtime
        except FileNotFoundError:
            return None
        return raw, mtime

    def acquire_lease(self, name: str, holder: Holder, ttl: float) -> Holder | None:
        path = self._lease_path(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            for _ in range(3):
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                except FileExistsError:
                    found = self._read_live(path)
                    if found is None:
                        continue
                    live = self._live(name, found, ttl)
                    if live is not None:
                        return live
                    self._break(path, found)  # lapsed: whoever renames it away first clears the way
                    continue
                with os.fdopen(fd, "wb") as f:
                    f.write(holder.to_bytes())
                return None
        except OSError as e:
            raise self._fail(f"taking the lease {name} in {self.url}", e) from e
        return self.lease_holder(name, ttl) or Holder("?", 0, time.time(), "")

    def _break(self, path: Path, judged: tuple[bytes, float]) -> None:
        stale = path.with_name(f".{path.name}.{secrets.token_hex(4)}.stale")
        try:
            os.rename(path, stale)
        except FileNotFoundError:
            return  # another waiter took it away first
        try:
            # renewed (or replaced) just before our rename: give it back
            if self._read_live(stale) != judged:
                try:
                    os.link(stale, path)
                except FileExistsError:
                    pass
        finally:
            os.unlink(stale)

    def renew_lease(self, name: str, holder: Holder, ttl: float) -> bool:
        path = self._lease_path(name)
        try:
            found = self._read_live(path)
            if found is None or not parse_lease(found[0])[0].same(holder):
                return False
            os.utime(path)
            return True
        except OSError as e:
            raise self._fail(f"renewing the lease {name} in {self.url}", e) from e

    def release_lease(self, name: str, holder: Holder) -> None:
        path = self._lease_path(name)
        try:
            found = self._read_live(path)
            if found is not None and parse_lease(found[0])[0].same(holder):
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise self._fail(f"releasing the lease {name} in {self.url}", e) from e

    def lease_holder(self, name: str, ttl: float) -> Holder | None:
        try:
            found = self._read_live(self._lease_path(name))
        except OSError as e:
            raise self._fail(f"reading the lease {name} in {self.url}", e) from e
        return None if found is None else self._live(name, found, ttl)

    # ---- records
    def put_record(self, name: str, data: bytes, ttl: float) -> None:
        body = json.dumps(
            {"expires": time.time() + ttl, "data": base64.b64encode(data).decode()}
        ).encode()
        self._write(self._path(name), body, f"writing the record {name} to {self.url}")

    def get_record(self, name: str) -> bytes | None:
        raw = self.get_blob(name)
        if raw is None:
            return None
        try:
            d = json.loads(raw)
            if float(d["expires"]) < time.time():
                return None
            return base64.b64decode(d["data"])
        except (ValueError, KeyError, TypeError):
            return None
