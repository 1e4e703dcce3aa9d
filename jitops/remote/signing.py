"""Ed25519 keys for the remote tier: key pairs, the trusted set as keys, sign and verify.

Imports ``cryptography``, ``jitops.base.fsutil``, ``jitops.base.record``, ``jitops.errors``,
``jitops.store.manifest`` (EntryProblem), ``.config`` and ``.keyring`` (tokens, fingerprints, which keys are
trusted: read without ``cryptography``). What is signed is the entry's manifest bytes (which hold the key, the
library's sha256 and size, and every ingredient), behind a domain prefix so a signature can never be replayed
as anything else.
"""

from __future__ import annotations

import base64
import os
from dataclasses import field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..base import fsutil
from ..base.record import record
from ..store.manifest import EntryProblem
from ..errors import ConfigError
from .config import RemoteSettings
from .keyring import (
    PREFIX,
    fingerprint_of,
    key_paths,
    own_file_problem,
    raw_public,
    read_public,
    trusted,
)

__all__ = [
    "DOMAIN",
    "Signer",
    "Trust",
    "fingerprint",
    "key_paths",
    "keygen",
    "load_signer",
    "load_trust",
    "own_file_problem",
    "parse_public",
    "public_text",
    "read_public",
]

DOMAIN = b"jitops remote entry v1\0"


def _raw(
    pub: Ed25519PublicKey,
) -> bytes:  # PEM (``serialization``, ~10 ms to import) only where a private key is read
    return pub.public_bytes_raw()


def fingerprint(pub: Ed25519PublicKey) -> str:
    return fingerprint_of(_raw(pub))


def public_text(pub: Ed25519PublicKey) -> str:
    return PREFIX + base64.b64encode(_raw(pub)).decode()


def parse_public(token: str, where: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(raw_public(token, where))


@record
class Trust:
    keys: dict[str, Ed25519PublicKey] = field(default_factory=dict)  # fingerprint -> key
    sources: list[str] = field(default_factory=list)

    def add(self, pub: Ed25519PublicKey, source: str) -> None:
        self.keys[fingerprint(pub)] = pub
        self.sources.append(f"{fingerprint(pub)} from {source}")

    def verify(self, manifest: bytes, signer: str, signature: str) -> None:
        """Raise EntryProblem unless ``signature`` is a trusted key's signature over ``manifest``."""
        pub = self.keys.get(signer)
        if pub is None:
            raise EntryProblem(
                f"it is signed by key {signer}, which this node does not trust. Fix: if you trust whoever holds "
                f"that key, add its public key (`jitops cache keygen --show` on the signing machine prints it) to "
                f"JITOPS_REMOTE_TRUSTED_KEYS; otherwise push from a trusted key"
            )
        try:
            pub.verify(base64.b64decode(signature, validate=True), DOMAIN + manifest)
        except (InvalidSignature, ValueError) as e:
            raise EntryProblem(
                f"its signature does not verify against the trusted key {signer} (forged or damaged)"
            ) from e


def load_trust(settings: RemoteSettings) -> Trust:
    trust = Trust()
    for raw, source in trusted(settings):
        trust.add(Ed25519PublicKey.from_public_bytes(raw), source)
    return trust


@record
class Signer:
    key: Ed25519PrivateKey
    fingerprint: str

    def sign(self, manifest: bytes) -> str:
        return base64.b64encode(self.key.sign(DOMAIN + manifest)).decode()


def load_signer(settings: RemoteSettings) -> tuple[Signer | None, str | None]:
    """(the signing key, None), or (None, why there is none)."""
    path = (
        Path(os.path.expanduser(settings.signing_key))
        if settings.signing_key
        else key_paths(settings)[0]
    )
    if not os.path.exists(path):
        return (
            None,
            f"no signing key at {path}. Fix: run `jitops cache keygen` (or set JITOPS_REMOTE_SIGNING_KEY)",
        )
    problem = own_file_problem(path)
    if problem is not None:
        return (
            None,
            f"the signing key is not safe to use: {problem}. Fix: chmod 600 it, owned by you",
        )
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        return None, f"cannot read the signing key {path}: {e}"
    if not isinstance(key, Ed25519PrivateKey):
        return (
            None,
            f"{path} is not an Ed25519 private key. Fix: make one with `jitops cache keygen`",
        )
    return Signer(key, fingerprint(key.public_key())), None


def keygen(settings: RemoteSettings | None, force: bool = False) -> tuple[Path, Path, str, str]:
    """Write a new key pair into the config dir; (private path, public path, public text, fingerprint)."""
    priv_path, pub_path = key_paths(settings)
    if priv_path.exists() and not force:
        raise ConfigError(
            f"{priv_path} already exists. Fix: keep it, or pass --force to replace it "
            "(nodes that trust the old public key will then reject new uploads)"
        )
    folder = priv_path.parent
    problem = fsutil.insecure_reason(folder, want_dir=True) if os.path.lexists(folder) else None
    # never re-moded: it may be a shared folder (/tmp's sticky bit) or a file
    if problem is not None:
        raise ConfigError(
            f"cannot keep a signing key in the config dir: {problem}, so jitops would refuse the key "
            "there. Fix: point JITOPS_CONFIG_DIR at a folder of your own (a new one is made, mode 700)"
        )
    fsutil.makedirs(folder)  # only the folders it creates, mode 700
    from cryptography.hazmat.primitives import serialization

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fsutil.atomic_write(priv_path, pem, mode=0o600)
    text = public_text(key.public_key())
    fsutil.atomic_write(pub_path, (text + "\n").encode(), mode=0o644)
    return priv_path, pub_path, text, fingerprint(key.public_key())
