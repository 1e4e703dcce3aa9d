"""Ed25519 keys for the remote tier: key pairs, fingerprints, the trusted set, sign and verify.

Imports ``cryptography``, ``jitops.base.fsutil``, ``jitops.errors``, ``jitops.store.manifest``
(EntryProblem) and ``.config``. What is signed is the entry's manifest bytes
(which hold the key, the library's sha256 and size, and every ingredient),
behind a domain prefix so a signature can never be replayed as anything else.

A public key is one token, ``ed25519:<base64 of 32 bytes>``; its fingerprint
is ``SHA256:<base64 of its sha256>`` (what messages and ``keygen`` show).
Trusted keys: every token or file named in ``JITOPS_REMOTE_TRUSTED_KEYS``
(commas or whitespace between them; a file holds one key per line, ``#``
comments allowed), plus the user's own ``signing.pub`` in the config dir when
it and its directory are owned by this user and not group/world-writable.
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..base import fsutil
from ..base.record import record
from ..store.manifest import EntryProblem
from ..errors import ConfigError
from .config import RemoteSettings, config_dir

DOMAIN = b"jitops remote entry v1\0"
PRIVATE_NAME = "signing.key"
PUBLIC_NAME = "signing.pub"


def _raw(pub: Ed25519PublicKey) -> bytes:  # PEM (``serialization``, ~10 ms to import) only where a private key is read
    return pub.public_bytes_raw()


def fingerprint(pub: Ed25519PublicKey) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(_raw(pub)).digest()).decode().rstrip("=")


def public_text(pub: Ed25519PublicKey) -> str:
    return "ed25519:" + base64.b64encode(_raw(pub)).decode()


def parse_public(token: str, where: str) -> Ed25519PublicKey:
    try:
        if not token.startswith("ed25519:"):
            raise ValueError("does not start with ed25519:")
        raw = base64.b64decode(token[len("ed25519:"):], validate=True)
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError as e:
        raise ConfigError(f"{where}: {token[:60]!r} is not a jitops public key ({e}). Fix: use the line "
                          "`jitops cache keygen` printed (ed25519:...)") from None


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
                f"JITOPS_REMOTE_TRUSTED_KEYS; otherwise push from a trusted key")
        try:
            pub.verify(base64.b64decode(signature, validate=True), DOMAIN + manifest)
        except (InvalidSignature, ValueError) as e:
            raise EntryProblem(f"its signature does not verify against the trusted key {signer} (forged or damaged)") from e


def key_paths(settings: RemoteSettings | None) -> tuple[Path, Path]:
    d = Path(config_dir(settings))
    return d / PRIVATE_NAME, d / PUBLIC_NAME


MAX_TRUST_FILE = 1 << 20  # bytes of one JITOPS_REMOTE_TRUSTED_KEYS file


def load_trust(settings: RemoteSettings) -> Trust:
    trust = Trust()
    for item in (settings.trusted_keys or "").replace(",", " ").split():
        if item.startswith("ed25519:"):
            trust.add(parse_public(item, "JITOPS_REMOTE_TRUSTED_KEYS"), "JITOPS_REMOTE_TRUSTED_KEYS")
            continue
        path = Path(os.path.expanduser(item))
        for line in _key_lines(path, "JITOPS_REMOTE_TRUSTED_KEYS names", "a file of public keys, one per line, "
                               "or list the keys themselves"):
            token = line.split("#", 1)[0].strip().split(" ")[0]
            if token:
                trust.add(parse_public(token, str(path)), str(path))
    _, pub_path = key_paths(settings)
    if os.path.exists(pub_path) and own_file_problem(pub_path) is None:
        trust.add(parse_public(read_public(pub_path), str(pub_path)), f"{pub_path} (your own key)")
    return trust


def _key_lines(path: Path, who: str, fix: str) -> list[str]:
    """The lines of a small key file; ConfigError naming it when it cannot be read or is not UTF-8 text."""
    try:
        with open(path, "rb") as f:  # bounded: a list of keys, never /dev/zero or a disk image
            raw = f.read(MAX_TRUST_FILE + 1)
        if len(raw) > MAX_TRUST_FILE:
            why = f"larger than {MAX_TRUST_FILE // 1024} KiB"
        else:
            return raw.decode("utf-8").splitlines()
    except OSError as e:
        why = e.strerror or type(e).__name__
    except UnicodeDecodeError:
        why = "not UTF-8 text"
    raise ConfigError(f"{who} {path}, which cannot be read ({why}). Fix: point it at {fix}")


def read_public(path: Path) -> str:
    """The public-key token in ``path`` (the config dir's ``signing.pub``); ConfigError naming the file when it
    is unreadable, not UTF-8, or empty (check the token with :func:`parse_public`)."""
    fix = "a file holding the ed25519:... line `jitops cache keygen` printed (`jitops cache keygen --force` writes a new pair)"
    words = " ".join(_key_lines(path, "the public key file", fix)).split()
    if not words:
        raise ConfigError(f"the public key file {path} is empty. Fix: point it at {fix}")
    return words[0]


def own_file_problem(path: Path) -> str | None:
    return fsutil.insecure_reason(path.parent, want_dir=True) or fsutil.insecure_reason(path, want_dir=False)


@record
class Signer:
    key: Ed25519PrivateKey
    fingerprint: str

    def sign(self, manifest: bytes) -> str:
        return base64.b64encode(self.key.sign(DOMAIN + manifest)).decode()


def load_signer(settings: RemoteSettings) -> tuple[Signer | None, str | None]:
    """(the signing key, None), or (None, why there is none)."""
    path = Path(os.path.expanduser(settings.signing_key)) if settings.signing_key else key_paths(settings)[0]
    if not os.path.exists(path):
        return None, f"no signing key at {path}. Fix: run `jitops cache keygen` (or set JITOPS_REMOTE_SIGNING_KEY)"
    problem = own_file_problem(path)
    if problem is not None:
        return None, f"the signing key is not safe to use: {problem}. Fix: chmod 600 it, owned by you"
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as e:
        return None, f"cannot read the signing key {path}: {e}"
    if not isinstance(key, Ed25519PrivateKey):
        return None, f"{path} is not an Ed25519 private key. Fix: make one with `jitops cache keygen`"
    return Signer(key, fingerprint(key.public_key())), None


def keygen(settings: RemoteSettings | None, force: bool = False) -> tuple[Path, Path, str, str]:
    """Write a new key pair into the config dir; (private path, public path, public text, fingerprint)."""
    priv_path, pub_path = key_paths(settings)
    if priv_path.exists() and not force:
        raise ConfigError(f"{priv_path} already exists. Fix: keep it, or pass --force to replace it "
                          "(nodes that trust the old public key will then reject new uploads)")
    folder = priv_path.parent
    problem = fsutil.insecure_reason(folder, want_dir=True) if os.path.lexists(folder) else None
    if problem is not None:  # never re-moded: it may be a shared folder (/tmp's sticky bit) or a file (issue 28)
        raise ConfigError(f"cannot keep a signing key in the config dir: {problem}, so jitops would refuse the key "
                          "there. Fix: point JITOPS_CONFIG_DIR at a folder of your own (a new one is made, mode 700)")
    fsutil.makedirs(folder)  # only the folders it creates, mode 700
    from cryptography.hazmat.primitives import serialization

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fsutil.atomic_write(priv_path, pem, mode=0o600)
    text = public_text(key.public_key())
    fsutil.atomic_write(pub_path, (text + "\n").encode(), mode=0o644)
    return priv_path, pub_path, text, fingerprint(key.public_key())
