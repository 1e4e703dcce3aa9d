"""The remote tier's flow, behind the local cache.

Imports ``jitops.store.cache``, ``jitops.store.archive`` (export/import of one entry),
``jitops.store.inputs`` (naming an input set), ``jitops.errors``, ``jitops.store.manifest``,
``jitops.base.settings`` (via ``.config``) and this package's lower modules; never the loader, entry
or plan (the plan arrives as an argument, the wait limit too). Called only after a local miss, under
the local key lock, so one process per node talks to the store:

1. fetch ``entries/<lib>/<target>/<key>``: download, check in private staging
   (signature by a trusted key, the expected key, sha256 and size, and that every file its build
   read holds the same bytes here: all in ``store.archive.import_entry``), publish with the atomic
   protocol. An entry built from other inputs is never taken: the entry for this node's inputs is
   ``<key>.<held>`` (``entry_name``), where ``held`` digests what this node holds at the files the
   first one read; an upload goes there too, so no name ever holds two input sets' libraries
   (but for a build that read files the first one did not, stored over by the last writer: every
   taker proves its inputs);
2. else a fresh failure record for the key fails at once with its message;
3. else take the key's lease (write mode) and build, renewing the lease
   while building, then upload (signed) or record the failure; or wait for the
   holder, polling with backoff and naming it, and take over when it lapses.

A configured remote tier fails open: a store error switches it off for the process with one warning, and
the build goes on locally. The job's store (``fail_open=False``) raises it instead. Each entry a tier installs
is noted as pulled (or from the job store) before it is published (``.origin``), so ``cache push`` never
re-signs it. Counters are logged at exit.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..store import archive as cache_archive
from ..store import inputs
from ..store.cache import Cache
from ..store.manifest import Address, EntryProblem, Manifest, StaleInputs
from ..errors import BuildError, CacheError, LockTimeout
from . import envelope, origin
from .config import RemoteSettings
from .stats import Counters, add_to_totals
from .lease import Lease
from .store import Failure, Holder, Store, StoreError, StoreTimeout

if TYPE_CHECKING:
    from pathlib import Path

    from ..plan import Plan
    from .digest import DigestSigner, JobTrust
    from .signing import Signer, Trust

log = logging.getLogger("jitops")
PROGRESS_EVERY = 30.0
# A waiter polls the entry and the failure record, first after POLL_FIRST s, backing off by 1.5x to
# POLL_MAX s: a finished build is seen within about POLL_MAX s plus two round trips. It looks at the
# lease (to take it over when it lapses) at most every LEASE_EVERY s (or a third of its ttl): for an
# object store that is a listing and a GET that 16 waiters need not repeat on every poll.
POLL_FIRST, POLL_MAX, LEASE_EVERY = 0.05, 1.0, 2.0
# no JITOPS_LOCK_TIMEOUT: a live lease is waited for this long, then the node builds itself
WAIT_DEFAULT = 1800.0


def entry_name(library: str, target: str, key: str, held: str = "") -> str:
    """The store's name of an entry. ``held``: for an entry built from other inputs than the one
    stored first under its key, the digest of what its node held at that one's recorded files
    (``inputs.holding``), so each set of inputs has a name of its own."""
    name = f"entries/{library}/{target}/{key}"
    return f"{name}.{held[:32]}" if held else name


class Tier:
    def __init__(
        self,
        settings: RemoteSettings,
        store: Store | None,
        trust: Trust | JobTrust | None,
        signer: Signer | DigestSigner | None,
        *,
        fail_open: bool = True,
    ) -> None:
        self.settings, self.store, self.trust, self.signer = settings, store, trust, signer
        # False for the job's store: its failure is the job's, raised, not hidden
        self.fail_open = fail_open
        self.stats = Counters()
        self.off = False  # True once the store failed: the process builds locally from then on
        self._rejected: set[str] = set()
        # blobs refused as built from other inputs: the files their builds read
        self._stale: dict[str, tuple[str, ...]] = {}
        self._caches: set[str] = set()
        self._pid = os.getpid()  # a forked child inherits the atexit hook, not the counters

    @property
    def writes(self) -> bool:
        return self.settings.mode != "read" and self.signer is not None

    # ---- failing open
    def switch_off(self, e: Exception) -> None:
        self.stats.errors += 1
        self.stats.timeouts += isinstance(e, StoreTimeout)
        if not self.fail_open:
            raise CacheError(
                f"the job's store {self.settings.url} failed: {e}. This is torch.distributed's failure "
                "(the store's host went away or stalls); jitops does not hide it. Fix: see why the "
                "job's rank 0 / agent died, or set JITOPS_DISTRIBUTED=0 to build without the store"
            ) from e
        if self.off:
            return
        self.off = True
        warnings.warn(
            f"jitops: the remote cache {self.settings.url} failed: {e}. It is off for the rest of this "
            "process, which builds locally. Fix: check the store, or unset JITOPS_REMOTE_CACHE",
            RuntimeWarning,
            stacklevel=2,
        )

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.stats.seconds += time.monotonic() - t0

    # ---- the flow
    def obtain(
        self,
        plan: Plan,
        cache: Cache,
        build: Callable[[], Manifest],
        wait_limit: float | None = None,
        built_here: Callable[[], bool] = lambda: True,
    ) -> tuple[Manifest, bool]:
        """The plan's entry: (manifest, built here?). Fetched, waited for, or built by ``build``.

        ``wait_limit``: seconds to wait for another node's build (``JITOPS_LOCK_TIMEOUT``; None: as long as it takes).
        ``built_here``: asked after ``build`` returns; False when ``build`` fetched from a tier behind this one
        (the job's store), so this tier never re-signs and uploads what it did not build.
        """
        self._caches.add(str(cache.root))
        if self.off or self.store is None:
            return build(), True
        lease: Lease | None = None
        try:
            found = self.fetch(plan, cache)
            if found is not None:
                return found, False
            self.stats.misses += 1
            found, lease = self._lease_or_wait(plan, cache, wait_limit)
            if found is not None:
                return found, False
        except StoreError as e:
            self.switch_off(e)
            return build(), True
        try:
            try:
                manifest = build()
            except BuildError as e:
                if lease is not None:
                    self._guard(self._record_failure, plan, e)
                raise
            # before the lease goes: a waiter that sees it free must find the entry
            if self.writes and built_here():
                self._guard(self.upload, plan, cache, manifest)
            return manifest, True
        finally:
            if lease is not None:  # even after an error: waiters should not sit out the lease's ttl
                lease.stop()
                try:
                    self._timed(self.store.release_lease, lease.name, lease.holder)  # type: ignore[union-attr]
                except StoreError as e:
                    self.switch_off(e)

    def _guard(self, fn: Callable[..., Any], *args: Any) -> None:
        if self.off:
            return
        try:
            self._timed(fn, *args)
        except StoreError as e:
            self.switch_off(e)

    def fetch(self, plan: Plan, cache: Cache) -> Manifest | None:
        """Download, verify and publish the plan's remote entry; None if absent or rejected. When
        the entry stored under the key was built from other inputs, the one for this node's
        inputs."""
        self._caches.add(str(cache.root))
        found = self._for_inputs_here(plan, cache)[1]
        if isinstance(found, StaleInputs):
            return None
        if found is not None:
            self.stats.hits += 1
            log.info("fetched %s from the remote cache %s", plan.what, self.settings.url)
        return found

    def _for_inputs_here(
        self, plan: Plan, cache: Cache
    ) -> tuple[str, Manifest | StaleInputs | None]:
        """The name of the plan's entry for this node's inputs, and what is stored there (as
        ``_fetch_named`` says): the key's own name, or, when the entry there was built from other
        inputs, the name ``entry_name`` gives this node's."""
        address = (plan.spec.name, plan.target.name, plan.key)
        name = entry_name(*address)
        found = self._fetch_named(plan, cache, name)
        if isinstance(found, StaleInputs):
            name = entry_name(*address, inputs.holding(found.labels, plan.spec.root))
            found = self._fetch_named(plan, cache, name)
        return name, found

    def _fetch_named(self, plan: Plan, cache: Cache, name: str) -> Manifest | StaleInputs | None:
        """The entry stored as ``name``, published here; StaleInputs if it was built from other
        inputs than this node holds; None if absent or rejected."""
        assert self.store is not None
        blob = self._timed(self.store.get_blob, name)
        if blob is None:
            return None
        self.stats.bytes_down += len(blob)
        digest = hashlib.sha256(blob).hexdigest()
        if digest in self._stale:
            return StaleInputs("", self._stale[digest])
        if digest in self._rejected:
            return None
        try:
            return self.install(
                plan.spec.name, plan.target.name, plan.key, cache, blob, plan.spec.root
            )
        except StaleInputs as e:  # not an error: the entry of another node's inputs
            self._stale[digest] = e.labels
            log.info("the remote entry %s is not for %s here: %s", name, plan.what, e)
            return e
        except EntryProblem as e:
            self._rejected.add(digest)
            self.stats.rejected += 1
            log.warning(
                "rejected the remote entry for %s from %s: %s; it was not loaded",
                plan.what,
                self.settings.url,
                e,
            )
            return None

    def install(
        self,
        library: str,
        target: str,
        key: str,
        cache: Cache,
        blob: bytes,
        root: Path | None = None,
    ) -> Manifest:
        """Check ``blob`` as the entry for ``key`` and publish it locally, noted as pulled; EntryProblem if refused.

        Only that entry's members are taken, and its library only after the signature over its manifest verifies.
        """
        header, archive = envelope.unpack(blob)
        if header["key"] != key:
            raise EntryProblem(f"it was stored for key {header['key'][:12]}, not {key[:12]}")
        trust, kind = self.trust, "pulled" if self.fail_open else "job-store"
        if trust is None or not trust.keys:
            raise EntryProblem(
                "this node trusts no signing key. Fix: set JITOPS_REMOTE_TRUSTED_KEYS to the public "
                "key(s) of whoever uploads (see `jitops cache keygen`)"
            )
        address = Address(library, target, key)
        return cache_archive.import_entry(
            cache,
            archive,
            address,
            verify=lambda raw, _sig: trust.verify(raw, header["signer"], header["signature"]),
            note=lambda _m, raw, _sig: origin.note(
                cache, address, kind, self.settings.url, raw, str(header["signer"])
            ),
            root=root,
        )

    def upload(self, plan: Plan, cache: Cache, manifest: Manifest | None = None) -> bool:
        """Sign and upload the plan's local entry. False if there is nothing sound to upload."""
        assert self.store is not None and self.signer is not None
        staging = cache.new_staging(plan.spec.name, plan.key)
        try:
            path = staging / "entry.tar.gz"
            exported, skipped = cache_archive.export(
                cache, path, {plan.spec.name}, keys={plan.key}, with_records=False
            )
            if not exported:
                log.warning(
                    "not uploading %s: %s",
                    plan.what,
                    skipped[0][1] if skipped else "no local entry",
                )
                return False
            raw = cache.manifest_bytes(exported[0].path)
            blob = envelope.pack(
                plan.key, self.signer.fingerprint, self.signer.sign(raw), path.read_bytes()
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        name = self._upload_name(plan, cache)
        if name is None:
            log.info(
                "%s is in %s already, built from the same inputs", plan.what, self.settings.url
            )
            return True
        self.store.put_blob(name, blob)
        self.stats.uploads += 1
        self.stats.bytes_up += len(blob)
        return True

    def _upload_name(self, plan: Plan, cache: Cache) -> str | None:
        """Where this node's entry for the plan belongs (``_for_inputs_here``); None when an entry
        of the same inputs is stored there already. A damaged or untrusted one is stored over, and
        so is one that read files the first one did not (the last writer's: takers prove theirs)."""
        assert self.store is not None
        name, found = self._for_inputs_here(plan, cache)
        return None if isinstance(found, Manifest) else name

    # ---- one build per key
    def _lease_or_wait(
        self, plan: Plan, cache: Cache, limit: float | None
    ) -> tuple[Manifest | None, Lease | None]:
        assert self.store is not None
        store, ttl = self.store, self.settings.lease_seconds
        name = f"leases/{plan.spec.name}/{plan.key}"
        start, last_note = time.monotonic(), None
        delay, lease_due = POLL_FIRST, 0.0
        holder: Holder | None = None
        while True:
            self._raise_recorded_failure(plan)
            # a lease changes hands only when it lapses: look now and then
            if time.monotonic() >= lease_due:
                lease_due = time.monotonic() + min(ttl / 3, LEASE_EVERY)
                if self.writes:
                    me = Holder.me(ttl)
                    holder = self._timed(store.acquire_lease, name, me, ttl)
                    if holder is None:
                        # uploaded between our first look and the lease?
                        found = self.fetch(plan, cache)
                        if found is not None:
                            self._timed(store.release_lease, name, me)
                            return found, None
                        return None, Lease(store, name, me, ttl)
                else:
                    holder = self._timed(store.lease_holder, name, ttl)
                    if holder is None:
                        return None, None  # nobody builds it; a read-only node builds for itself
            assert holder is not None
            now = time.monotonic()
            if limit is None and now - start > WAIT_DEFAULT:
                log.warning(
                    "waited %gs for the build of %s on another node (%s) through %s; building it here. "
                    "Fix: stop that build if it hangs, or set JITOPS_LOCK_TIMEOUT",
                    WAIT_DEFAULT,
                    plan.what,
                    holder.describe(),
                    self.settings.url,
                )
                return None, None
            if limit is not None and now - start > limit:
                raise LockTimeout(
                    f"gave up after {limit:g}s (JITOPS_LOCK_TIMEOUT) waiting for {plan.what} from "
                    f"another node ({holder.describe()}) through {self.settings.url}. Fix: wait for "
                    "that build, stop it, or raise JITOPS_LOCK_TIMEOUT"
                )
            if last_note is None or now - last_note >= PROGRESS_EVERY:
                last_note = now
                log.warning(
                    "waiting for the build of %s on another node (%s); lease in %s",
                    plan.what,
                    holder.describe(),
                    self.settings.url,
                )
            time.sleep(delay)
            delay = min(delay * 1.5, POLL_MAX)
            found = self.fetch(plan, cache)
            if found is not None:
                return found, None

    def _failure_name(self, plan: Plan) -> str:
        return f"failures/{plan.spec.name}/{plan.target.name}/{plan.key}"

    def _record_failure(self, plan: Plan, e: BuildError) -> None:
        assert self.store is not None
        record = Failure(os.uname().nodename, os.getpid(), time.time(), str(e)[:8000])
        self.store.put_record(
            self._failure_name(plan), record.to_bytes(), self.settings.failure_seconds
        )

    def _raise_recorded_failure(self, plan: Plan) -> None:
        assert self.store is not None
        raw = self._timed(self.store.get_record, self._failure_name(plan))
        keep = self.settings.failure_seconds
        rec = None if raw is None else Failure.parse(raw, keep)
        if rec is None:
            return
        age = time.time() - rec.at
        raise BuildError(
            f"the build of {plan.what} failed on {rec.host} (pid {rec.pid}) {max(age, 0.0):.0f}s ago; its error, "
            f"shared through {self.settings.url}:\n{rec.message}\n(jitops retries the build once this record "
            f"lapses, in {keep - age:.0f}s: JITOPS_REMOTE_FAILURE_SECONDS={keep:g} after the failure.)",
            op=plan.spec.name,
            target=plan.target.name,
            log=rec.message,
            log_path=None,
        )

    def at_exit(self) -> None:
        if self.stats.any() and os.getpid() == self._pid:
            log.info("remote cache %s: %s", self.settings.url, self.stats.summary())
            from pathlib import Path

            for root in self._caches:
                add_to_totals(Cache(Path(root)).remote_stats, self.stats)
