"""The job store's trust without a key pair: an entry is accepted when its digests match what its builder published.

Imports only the stdlib and ``jitops.store.manifest`` (EntryProblem); ``.signing``
(``cryptography``) is never needed for it. The building rank's "signature"
is the sha256 of the entry's manifest (which holds the library's own sha256
and size), next to the sha256 of the whole blob that the c10d backend
publishes with every upload. This proves the bytes are the ones the building
rank published, not who built them: anyone who can write the job's store is
trusted, as ``torch.distributed`` already trusts it (its object collectives
unpickle what other ranks send). ``JITOPS_DISTRIBUTED=signed`` requires a
trusted Ed25519 signature instead (:class:`JobTrust` with ``signed``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from ..store.manifest import EntryProblem

DIGEST_SIGNER = "job-store:sha256"


@dataclass(frozen=True)
class DigestSigner:
    """Publishes the manifest's sha256 where a signature would go."""

    fingerprint: str = DIGEST_SIGNER

    def sign(self, manifest: bytes) -> str:
        return hashlib.sha256(manifest).hexdigest()


@dataclass
class JobTrust:
    """Digest-matching entries (unless ``signed``), and entries signed by a key of ``keyed`` (a ``signing.Trust``)."""

    signed: bool = False
    keyed: Any = None  # signing.Trust or None
    keys: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.signed:
            self.keys[DIGEST_SIGNER] = None
        if self.keyed is not None:
            self.keys.update(self.keyed.keys)

    def verify(self, manifest: bytes, signer: str, signature: str) -> None:
        if signer == DIGEST_SIGNER:
            if self.signed:
                raise EntryProblem(
                    "it is not signed, and JITOPS_DISTRIBUTED=signed requires a trusted signature. "
                    "Fix: give the building ranks a signing key (`jitops cache keygen`), or unset "
                    "JITOPS_DISTRIBUTED to trust the job's store"
                )
            if hashlib.sha256(manifest).hexdigest() != signature:
                raise EntryProblem(
                    "its manifest's sha256 differs from the digest its building rank published"
                )
            return
        if self.keyed is None:
            raise EntryProblem(
                f"it is signed by key {signer}, and this rank checks digests only. Fix: set "
                "JITOPS_DISTRIBUTED=signed on every rank, or on none"
            )
        self.keyed.verify(manifest, signer, signature)
