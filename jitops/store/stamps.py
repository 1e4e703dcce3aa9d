"""Verified stamps: a library whose full check passed, remembered so later processes need not hash it again.

``Cache.verify`` checks an entry's manifest, key, size and the library's sha256. Hashing a
multi-megabyte library costs tens of milliseconds in every process's first load, so after a full
check passes the cache records a stamp, and a later check skips the sha256 when the stamp proves the
library file is the very one that was hashed:

* where: the user's own state dir (``Settings.state_root()``), ``<state>/verified/<digest of the
  entry path>.json``, never the cache (a cache can be shared; a stamp inside it would let anyone who
  can write the cache vouch for a library they swapped). Folders and file are read like the
  self-check's verdicts: this user's, not links, not group- or world-writable, opened ``O_NOFOLLOW``,
  checked on the descriptor, JSON checked field by field. Anything else is no stamp, never an error;
* what it binds: the entry's path, the sha256 of the manifest's bytes and the library's sha256 it
  names, and the library's whole stat identity (device, inode, size, mtime and ctime in ns). Any
  write to the file changes its ctime, which no call can set back (only the clock can); a
  replacement is another inode with its own ctime. Any difference: the full check runs again;
* when it is written: never offline (``JITOPS_OFFLINE``) nor from a read-only cache (both promise zero
  writes; the caller checks the latter); otherwise only after a full check whose library did not change while it was hashed
  (the same identity before and after) and whose ctime is :data:`SETTLED` seconds old, so that a
  write within the same timestamp tick as the stamp cannot go unseen (git's "racily clean" rule).
  A fresh build is therefore hashed once more by the next process, which stamps it.

Beside the stamps, the op names a loaded library defined in its namespace (``<state>/verified/<digest>.ops``),
so that later processes need not list the dispatcher's thousands of ops (a few ms) to find them. They are
bound to the entry's key, its library's sha256 and its namespace: the same verified library, loaded under the
same per-key namespace with the same schemas (part of the key), defines the same ops. Read and written as
stamps are (this user's files only; anything odd: none, and the caller lists the dispatcher).

And verified signatures (``<state>/verified/<digest>.sig``): a manifest's bytes, a signer's fingerprint and
the signature that ``remote.archive_trust`` checked with Ed25519 and found good. The check is deterministic in
those three, so a later process whose trusted keys still hold that fingerprint may take the record for the
check and need not import ``cryptography`` (~10 ms of a signed bundle's first load). Read and written as stamps.

And the drop-in's recalled requests (``<state>/verified/<digest of the request>.hit``, ``loading.recall``): what a
planned load of a verified entry was proven from, so that a later process can load it without planning. Read and
written as stamps are; past a bound the oldest half are dropped.

And the installed bundles' entry points (``<state>/verified/<digest of the import path>.bundles``, at most
:data:`KEEP_DISCOVERIES` of them, the oldest dropped): what the last full read of the ``jitops.bundles`` group
found (distribution, entry point, module, value, where it was installed), bound to a digest of the finders that
supply distributions and each import path folder's metadata names (``*.dist-info``, ``*.egg-info``, ``*.egg``;
a zip's size and mtime). Reading every installed distribution's entry points costs ~4 ms, most of a bundle
hit's extra over a cache hit; an install, upgrade or removal changes those names. Not seen: an entry point
edited in place inside an installed distribution's metadata (pip never does that). A stale record can hide or
name a bundle, never load anything unchecked: every entry is verified as always. Written unless offline (it is
state, not a stamp of the cache); read as stamps are.

Imports: fsutil.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..base import fsutil

log = logging.getLogger("jitops")

# seconds: a library changed more recently than this is not stamped (timestamp granularity)
SETTLED = 2.0
MAX_BYTES = 4096
KEEP = 512  # stamps kept before a write sweeps those whose entry is gone
# suffix of the record of the entry points found for one import path (store.bundles)
DISCOVERY = ".bundles"
KEEP_DISCOVERIES = 64  # import paths remembered before they are all forgotten
Identity = tuple[int, int, int, int, int]
_told: set[str] = set()  # the reasons already logged by this process


def unusable(state_root: Path, sub: str) -> str | None:
    """Why ``<state_root>/<sub>`` (``verified``, ``selfcheck``) must be neither read nor written, or None (absent
    folders are fine). Checked before anything is made there; the reason is logged once per process at INFO,
    since it turns stamps, recall or self-check verdicts off without an error."""
    for d in (state_root, state_root / sub):
        if os.path.lexists(d):
            reason = fsutil.insecure_reason(d, want_dir=True)
            if reason is not None:
                if reason not in _told:
                    _told.add(reason)
                    log.info(
                        "not using the state dir %s: %s, so verified stamps, the drop-in's recall and "
                        "self-check verdicts are neither read nor written there (loads hash and plan "
                        "again). Fix: point JITOPS_STATE_DIR at a folder of this user's, not a link, "
                        "writable only by this user",
                        state_root,
                        reason,
                    )
                return reason
    return None


def make_private(state_root: Path, sub: str) -> Path:
    """``<state_root>/<sub>``, made if missing, only once :func:`unusable` finds nothing wrong (then checked
    again); OSError naming the reason otherwise. Nothing is ever made through a link or in a shared folder."""
    folder = state_root / sub
    if (reason := unusable(state_root, sub)) is None:
        fsutil.makedirs(folder)
        reason = unusable(state_root, sub)  # what was made, or raced in meanwhile
    if reason is not None:
        raise OSError(reason)
    return folder


def identity(st: os.stat_result) -> Identity:
    """What a stamp binds of a file's stat: it is the same file, unwritten since."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def manifest_digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


class Stamps:
    """The stamps under one user's state dir (resolved on first use: ``state_root`` is a callable)."""

    def __init__(self, state_root: Callable[[], Path], *, write: bool = True) -> None:
        self._state_root = state_root
        self.write = write  # False (JITOPS_OFFLINE): stamps are read, never written
        self._folder: Path | None = None

    @property
    def folder(self) -> Path:
        if self._folder is None:
            self._folder = Path(self._state_root()) / "verified"
        return self._folder

    def _problem(self) -> str | None:
        """Why stamps here must be neither read nor written (absent folders are fine)."""
        return unusable(self.folder.parent, self.folder.name)

    def _path(self, entry: Path) -> Path:
        return self.folder / f"{hashlib.sha256(os.fsencode(entry)).hexdigest()[:32]}.json"

    def vouches(self, entry: Path, manifest: bytes, sha256: str, st: os.stat_result) -> bool:
        """True when a stamp proves the library with stat ``st`` is the one verified for this entry and the
        manifest whose bytes are ``manifest``."""
        try:
            path = self._path(entry)
            if self._problem() is not None:
                return False
            data = fsutil.read_private_record(path, MAX_BYTES)
        except (OSError, ValueError):
            return False
        if data is None or not _well_formed(data):
            return False
        return (
            data["entry"] == os.fsdecode(entry)
            and data["manifest"] == manifest_digest(manifest)
            and data["sha256"] == sha256
            and tuple(data["stat"]) == identity(st)
        )

    def _read(self, path: Path, limit: int) -> dict[str, Any] | None:
        """The record at ``path`` read as a stamp is (this user's, no link, bounded JSON), or None."""
        try:
            return None if self._problem() is not None else fsutil.read_private_record(path, limit)
        except (OSError, ValueError):
            return None

    def _write(self, path: Path, body: dict[str, Any], what: str) -> None:
        """Write the record ``body`` at ``path``: best effort, never offline (``what`` names it in the debug log)."""
        if not self.write:
            return
        try:
            make_private(self.folder.parent, self.folder.name)
            fsutil.atomic_write(path, json.dumps(body).encode(), durable=False)
        except (OSError, ValueError, TypeError) as e:
            log.debug("could not record %s in %s: %s", what, self.folder, e)

    def recalled(self, name: str, limit: int) -> dict[str, Any] | None:
        """The record ``<name>`` of the drop-in's recall (``loading.recall``), read as a stamp is, or None."""
        return self._read(self.folder / name, limit)

    def remember(self, name: str, body: dict[str, Any], keep: int) -> None:
        """Write the recall record ``<name>``, as stamps are written; past ``keep`` of its suffix, the oldest half go."""
        self._write(self.folder / name, body, "a drop-in request")
        try:
            kin = sorted(
                (p for p in fsutil.children(self.folder) if p.suffix == Path(name).suffix),
                key=_mtime,
            )
            for p in kin[: len(kin) // 2] if len(kin) > keep else ():
                fsutil.remove_path(p)
        except OSError as e:
            log.debug("could not sweep the drop-in requests in %s: %s", self.folder, e)

    def _inputs_path(self, entry: str) -> Path:
        return self.folder / f"{hashlib.sha256(os.fsencode(entry)).hexdigest()[:32]}.inputs"

    def inputs_stamp(self, entry: str) -> tuple[str, tuple[str, ...]] | None:
        """The stamp of an entry's inputs as their last proof found them
        (``store.inputs.Stamp``)."""
        data = self._read(self._inputs_path(entry), MAX_BYTES * 16)
        if data is None or data.get("v") != 3 or data.get("entry") != entry:
            return None
        seal, left = data.get("seal"), data.get("left")
        if not (isinstance(seal, str) and len(seal) == 64 and isinstance(left, list)):
            return None
        if not all(isinstance(p, str) for p in left):
            return None
        return seal, tuple(left)

    def record_inputs_stamp(self, entry: str, stamp: tuple[str, tuple[str, ...]]) -> None:
        """Remember the stamp of an entry's inputs just proven (best effort)."""
        body = {"v": 3, "entry": entry, "seal": stamp[0], "left": list(stamp[1])}
        self._write(self._inputs_path(entry), body, "the proven inputs of an entry")

    def _ops_path(self, key: str, sha256: str, namespace: str) -> Path:
        return (
            self.folder
            / f"{hashlib.sha256(f'{key}:{sha256}:{namespace}'.encode()).hexdigest()[:32]}.ops"
        )

    def op_names(self, key: str, sha256: str, namespace: str) -> tuple[str, ...] | None:
        """The op names recorded for this library in this namespace, or None (then list the dispatcher)."""
        data = self._read(self._ops_path(key, sha256, namespace), MAX_BYTES * 16)
        ops = data.get("ops") if data is not None else None
        if (
            data is None
            or data.get("v") != 1
            or (data.get("key"), data.get("sha256"), data.get("namespace"))
            != (key, sha256, namespace)
            or not isinstance(ops, list)
            or not all(isinstance(o, str) and o.isidentifier() for o in ops)
        ):
            return None
        return tuple(ops)

    def record_op_names(self, key: str, sha256: str, namespace: str, ops: tuple[str, ...]) -> None:
        """Remember ``ops`` for this library and namespace (best effort; never offline)."""
        body = {"v": 1, "key": key, "sha256": sha256, "namespace": namespace, "ops": list(ops)}
        self._write(self._ops_path(key, sha256, namespace), body, f"the op names of {namespace}")

    def _signature_path(self, manifest: bytes, signer: str, signature: str) -> Path:
        digest = hashlib.sha256(
            f"{signer}:{signature}:{manifest_digest(manifest)}".encode()
        ).hexdigest()
        return self.folder / f"{digest[:32]}.sig"

    def signature_verified(self, manifest: bytes, signer: str, signature: str) -> bool:
        """True when this very signature by ``signer`` over these manifest bytes was verified before."""
        data = self._read(self._signature_path(manifest, signer, signature), MAX_BYTES)
        return data is not None and data == {
            "v": 1,
            "manifest": manifest_digest(manifest),
            "signer": signer,
            "signature": signature,
        }

    def record_signature(self, manifest: bytes, signer: str, signature: str) -> None:
        """Remember that ``signature`` by ``signer`` over ``manifest`` verified (best effort; never offline)."""
        body = {
            "v": 1,
            "manifest": manifest_digest(manifest),
            "signer": signer,
            "signature": signature,
        }
        self._write(self._signature_path(manifest, signer, signature), body, "a verified signature")

    def _discovery_path(self, key: list[Any]) -> Path:  # one record per import path (its folders)
        return (
            self.folder
            / f"{hashlib.sha256(json.dumps([k[0] for k in key[1:]]).encode()).hexdigest()[:32]}{DISCOVERY}"
        )

    def discovery(self, key: list[Any]) -> list[list[str]] | None:
        """The bundles' entry points found when the import path and its distributions were ``key``
        (store.bundles), or None."""
        try:
            path = self._discovery_path(key)
        except (TypeError, ValueError):  # a key json cannot write
            return None
        data = self._read(path, MAX_BYTES * 16)
        found = data.get("found") if data is not None else None
        if (
            data is None
            or data.get("v") != 2
            or data.get("key") != _digest(key)
            or not isinstance(found, list)
            or not all(
                isinstance(f, list) and len(f) == 5 and all(isinstance(w, str) for w in f)
                for f in found
            )
        ):
            return None
        return found

    def record_discovery(self, key: list[Any], found: list[list[str]]) -> None:
        """Remember what a full read of the entry points found for ``key`` (best effort; never offline); past
        :data:`KEEP_DISCOVERIES` import paths, the oldest records go."""
        if not self.write or self._problem() is not None:
            return
        try:
            path = self._discovery_path(key)
            olds = sorted(
                (p for p in fsutil.children(self.folder) if p.suffix == DISCOVERY and p != path),
                key=lambda p: os.lstat(p).st_mtime_ns,
            )
            for old in olds[: max(0, len(olds) - KEEP_DISCOVERIES + 1)]:
                fsutil.remove_path(old)
            body = {"v": 2, "key": _digest(key), "found": found}
        except (OSError, ValueError, TypeError) as e:
            log.debug("could not record the installed bundles in %s: %s", self.folder, e)
            return
        self._write(path, body, "the installed bundles")

    def record(
        self, entry: Path, manifest: bytes, sha256: str, before: os.stat_result, lib: Path
    ) -> None:
        """Stamp ``entry`` after a full check hashed ``lib`` (stat ``before`` taken before the hash): best effort,
        and only when the file stayed the same while it was hashed and is settled."""
        if not self.write:
            return
        try:
            after = os.lstat(lib)
            if identity(after) != identity(before) or not stat.S_ISREG(after.st_mode):
                return
            if after.st_ctime_ns > time.time_ns() - int(SETTLED * 1e9):
                # changed moments ago: a write in the same timestamp tick would keep this ctime
                return
            make_private(self.folder.parent, self.folder.name)
            body = {
                "v": 1,
                "entry": os.fsdecode(entry),
                "manifest": manifest_digest(manifest),
                "sha256": sha256,
                "stat": list(identity(after)),
            }
            fsutil.atomic_write(self._path(entry), json.dumps(body).encode(), durable=False)
            self._sweep()
        except (OSError, ValueError) as e:
            log.debug("could not stamp the verified entry %s in %s: %s", entry, self.folder, e)

    def _sweep(self) -> None:
        """Past :data:`KEEP` stamps, remove those whose entry is gone (entries pruned or rebuilt elsewhere)."""
        names = [p for p in fsutil.children(self.folder) if p.suffix == ".json"]
        if len(names) <= KEEP:
            return
        for p in names:
            data = fsutil.read_private_record(p, MAX_BYTES)
            if data is None or not _well_formed(data) or not os.path.lexists(data["entry"]):
                fsutil.remove_path(p)


def _mtime(path: Path) -> int:
    try:
        return os.lstat(path).st_mtime_ns
    except OSError:
        return 0


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()


def _well_formed(data: dict[str, object]) -> bool:
    hexes = ("manifest", "sha256")
    st = data.get("stat")
    return (
        data.get("v") == 1
        and isinstance(data.get("entry"), str)
        and all(isinstance(data.get(k), str) and len(data[k]) == 64 for k in hexes)  # type: ignore[arg-type]
        and isinstance(st, list)
        and len(st) == 5
        and all(fsutil.is_number(v, int) for v in st)
    )
