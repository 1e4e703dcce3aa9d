"""A held lease, kept alive by a daemon thread while its holder builds.

Imports only the stdlib and ``.store``.
"""

from __future__ import annotations

import logging
import threading

from .store import Holder, Store, StoreError

log = logging.getLogger("jitops")


class Lease:
    """A held lease, renewed by a daemon thread every third of its ttl until stopped."""

    def __init__(self, store: Store, name: str, holder: Holder, ttl: float) -> None:
        self.store, self.name, self.holder, self.ttl = store, name, holder, ttl
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jitops-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        store, ttl = self.store, self.ttl
        while not self._stop.wait(ttl / 3):
            try:
                if not store.renew_lease(self.name, self.holder, ttl):
                    log.warning(
                        "lost the lease %s in %s (it lapsed); another node may build too",
                        self.name,
                        store.url,
                    )
                    return
            except StoreError as e:
                log.warning("cannot renew the lease %s: %s", self.name, e)
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
