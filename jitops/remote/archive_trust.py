"""What an archive trusts (issue 28): ``cache export`` signs what this machine built, ``cache import``
verifies what is signed and notes each entry it installs as imported.

Imports ``jitops.store.cache``, ``jitops.store.manifest``, ``jitops.base.settings`` (via ``.config``), ``.origin``;
``.signing`` (``cryptography``) lazily: without it archives go out unsigned, and signed ones are refused.
Each function returns a hook for ``store.archive.export`` / ``import_archive``.
"""

from __future__ import annotations

from typing import Any

from ..store.cache import Cache
from ..store.manifest import Address, EntryProblem
from .config import RemoteSettings, Settings, for_keys
from .origin import installed_from, note


def _keys(settings: Settings) -> RemoteSettings:
    """Where the key pair and the trusted keys are, also without JITOPS_REMOTE_CACHE: ``Settings`` reads
    JITOPS_REMOTE_TRUSTED_KEYS / _SIGNING_KEY into the job store's settings then (unless JITOPS_DISTRIBUTED=0)."""
    job = settings.distributed.tier if settings.remote is None and settings.distributed is not None else None
    if job is None:
        return for_keys(settings)
    return RemoteSettings(url="", mode="read", trusted_keys=job.trusted_keys, signing_key=job.signing_key,
                          config_dir=settings.config_dir)


def archive_signer(settings: Settings, cache: Cache) -> Any:
    """``cache_archive.export``'s ``sign``: this machine's key over entries built here; None without a key."""
    try:
        from .signing import load_signer
    except ImportError:  # cryptography is optional: the archive goes out unsigned
        return None
    signer, _why = load_signer(_keys(settings))
    if signer is None:
        return None

    def sign(info: Any, manifest: bytes) -> tuple[str, str] | None:
        address = Address(info.library, info.target, info.manifest.key)
        return None if installed_from(cache, address) else (signer.fingerprint, signer.sign(manifest))

    return sign


def archive_trust(settings: Settings) -> Any:
    """``cache_archive.import_archive``'s ``verify``: a signed manifest must verify against a trusted key."""
    trusts: list[Any] = []

    def verify(manifest: bytes, signature: tuple[str, str] | None) -> None:
        if signature is None:
            return  # unsigned: the user's own choice to trust it (the command says so)
        try:
            from .signing import load_trust
        except ImportError as e:
            raise EntryProblem("it is signed, and checking signatures needs the `cryptography` package. "
                               "Fix: pip install cryptography") from e
        trust = trusts[0] if trusts else load_trust(_keys(settings))
        trusts[:] = [trust]  # read once per command
        if not trust.keys:
            raise EntryProblem(f"it is signed by key {signature[0]}, and this machine trusts no key. Fix: add the "
                               "signer's public key to JITOPS_REMOTE_TRUSTED_KEYS")
        trust.verify(manifest, *signature)

    return verify


def origin_noter(cache: Cache, src: str) -> Any:
    """``cache_archive.import_archive``'s ``note``: each imported entry is noted as imported (from ``src``)."""
    def noted(m: Any, raw: bytes, signature: tuple[str, str] | None) -> None:
        by = f" signed by {signature[0]}" if signature else " unsigned"
        note(cache, Address(m.library, m.target, m.key), "imported", f"{src}{by}", raw)

    return noted
