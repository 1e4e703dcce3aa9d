"""What an archive or a bundle trusts: ``cache export`` and ``bundle build`` sign what this machine
built; ``cache import`` and the bundle tier verify what is signed (and, with JITOPS_REQUIRE_SIGNED=1, refuse what
is not); import notes each entry it installs as imported.

Imports ``jitops.store.cache``, ``jitops.store.manifest``, ``jitops.store.stamps``, ``jitops.base.settings`` (via
``.config``), ``.keyring``, ``.origin``;
``.signing`` (``cryptography``) lazily: without it archives go out unsigned, and a signed entry is refused unless
a good check of those very bytes by a trusted signer is remembered (``store.stamps``).
Each function returns a hook for ``store.archive.export`` / ``import_archive``.
"""

from __future__ import annotations

from typing import Any

from ..store.cache import Cache
from ..store.manifest import Address, EntryProblem
from ..store.stamps import Stamps
from .config import RemoteSettings, Settings, for_keys
from .keyring import fingerprint_of, trusted
from .origin import installed_from, note


def _keys(settings: Settings) -> RemoteSettings:
    """Where the key pair and the trusted keys are, also without JITOPS_REMOTE_CACHE: ``Settings`` reads
    JITOPS_REMOTE_TRUSTED_KEYS / _SIGNING_KEY into the job store's settings then (unless JITOPS_DISTRIBUTED=0)."""
    job = (
        settings.distributed.tier
        if settings.remote is None and settings.distributed is not None
        else None
    )
    if job is None:
        return for_keys(settings)
    return RemoteSettings(
        url="",
        mode="read",
        trusted_keys=job.trusted_keys,
        signing_key=job.signing_key,
        config_dir=settings.config_dir,
    )


def entry_signer(settings: Settings) -> tuple[Any, str]:
    """(``sign(cache, address, manifest bytes)``, the key's fingerprint), or (None, why there is no key). ``sign``
    returns (fingerprint, signature) for an entry built here, None for one ``cache`` installed from elsewhere (an
    import or the job's store: never re-signed)."""
    try:
        from .signing import load_signer
    except ImportError:  # cryptography is optional: nothing is signed
        return None, "signing needs the `cryptography` package. Fix: pip install cryptography"
    signer, why = load_signer(_keys(settings))
    if signer is None:
        return None, why or "no signing key"

    def sign(cache: Cache, address: Address, manifest: bytes) -> tuple[str, str] | None:
        return (
            None if installed_from(cache, address) else (signer.fingerprint, signer.sign(manifest))
        )

    return sign, signer.fingerprint


def archive_signer(settings: Settings, cache: Cache) -> Any:
    """``cache_archive.export``'s ``sign``: this machine's key over entries built here; None without a key."""
    sign, _ = entry_signer(settings)
    if sign is None:
        return None
    return lambda info, manifest: sign(
        cache, Address(info.library, info.target, info.manifest.key), manifest
    )


def archive_trust(settings: Settings) -> Any:
    """``cache_archive.import_archive``'s ``verify`` and the bundle tier's check (``store.bundles``): a signed
    manifest must verify against a trusted key; an unsigned one passes unless JITOPS_REQUIRE_SIGNED=1. A good
    signature is remembered (``store.stamps``): while its signer stays trusted, a later check of the same bytes
    takes the record and imports no ``cryptography``."""
    trusts: list[Any] = []
    fingerprints: list[set[str]] = []
    stamps = Stamps(settings.state_root, write=not settings.offline)

    def verify(manifest: bytes, signature: tuple[str, str] | None) -> None:
        if signature is None:
            if settings.require_signed:
                raise EntryProblem(
                    "it is unsigned, and JITOPS_REQUIRE_SIGNED=1 accepts only entries signed by a "
                    "trusted key. Fix: use a bundle or archive made with a signing key (`jitops cache "
                    "keygen`, then `jitops bundle build --sign` or `jitops cache export`), or unset "
                    "JITOPS_REQUIRE_SIGNED"
                )
            return  # unsigned: the user's own choice to trust it (the command says so)
        if not fingerprints:  # read once per check's life (a command; a bundle check: one load)
            fingerprints.append({fingerprint_of(raw) for raw, _ in trusted(_keys(settings))})
        if not fingerprints[0]:
            raise EntryProblem(
                f"it is signed by key {signature[0]}, and this machine trusts no key. Fix: add the "
                "signer's public key (the ed25519:... line `jitops cache keygen` printed on the signing "
                "machine) to JITOPS_REMOTE_TRUSTED_KEYS"
            )
        if signature[0] not in fingerprints[0]:
            raise EntryProblem(
                f"it is signed by key {signature[0]}, which this node does not trust. Fix: if you trust "
                "whoever holds that key, add its public key (`jitops cache keygen --show` on the signing "
                "machine prints it) to JITOPS_REMOTE_TRUSTED_KEYS"
            )
        if stamps.signature_verified(manifest, *signature):
            return
        try:
            from .signing import load_trust
        except ImportError as e:
            raise EntryProblem(
                f"it is signed by the trusted key {signature[0]}, and checking the signature needs the "
                "`cryptography` package. Fix: pip install cryptography (or jitops[remote])"
            ) from e
        trust = trusts[0] if trusts else load_trust(_keys(settings))
        trusts[:] = [trust]  # read once per command
        trust.verify(manifest, *signature)
        stamps.record_signature(manifest, *signature)

    return verify


def origin_noter(cache: Cache, src: str) -> Any:
    """``cache_archive.import_archive``'s ``note``: each imported entry is noted as imported (from ``src``)."""

    def noted(m: Any, raw: bytes, signature: tuple[str, str] | None) -> None:
        by = f" signed by {signature[0]}" if signature else " unsigned"
        signer = signature[0] if signature else None
        note(cache, Address(m.library, m.target, m.key), "imported", f"{src}{by}", raw, signer)

    return noted
