"""The trusted public keys as data, read without ``cryptography``: tokens, fingerprints, the trusted set's sources.

A public key is one token, ``ed25519:<base64 of 32 bytes>``; its fingerprint is ``SHA256:<base64 of its
sha256>`` (what messages and ``keygen`` show). Trusted keys: every token or file named in
``JITOPS_REMOTE_TRUSTED_KEYS`` (commas or whitespace between them; a file holds one key per line, ``#``
comments allowed), plus the user's own ``signing.pub`` in the config dir when it and its directory are owned by
this user and not group/world-writable. ``signing`` turns these into keys; ``archive_trust`` needs only the
fingerprints to use a remembered verification (``store.stamps``), so a signed bundle's repeat check imports no
``cryptography`` (~10 ms).

Imports ``jitops.base.fsutil``, ``jitops.errors`` and ``.config``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from pathlib import Path

from ..base import fsutil
from ..errors import ConfigError
from .config import RemoteSettings, config_dir

PREFIX = "ed25519:"
RAW_BYTES = 32  # an Ed25519 public key
PRIVATE_NAME = "signing.key"
PUBLIC_NAME = "signing.pub"
MAX_TRUST_FILE = 1 << 20  # bytes of one JITOPS_REMOTE_TRUSTED_KEYS file


def fingerprint_of(raw: bytes) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(raw).digest()).decode().rstrip("=")


def raw_public(token: str, where: str) -> bytes:
    """The 32 bytes of a public-key token; ConfigError naming ``where`` when it is not one."""
    try:
        if not token.startswith(PREFIX):
            raise ValueError("does not start with ed25519:")
        raw = base64.b64decode(token[len(PREFIX) :], validate=True)
        if len(raw) != RAW_BYTES:
            raise ValueError(f"an Ed25519 public key is {RAW_BYTES} bytes, this is {len(raw)}")
        return raw
    except (ValueError, binascii.Error) as e:
        raise ConfigError(
            f"{where}: {token[:60]!r} is not a jitops public key ({e}). Fix: use the line "
            "`jitops cache keygen` printed (ed25519:...)"
        ) from None


def key_paths(settings: RemoteSettings | None) -> tuple[Path, Path]:
    d = Path(config_dir(settings))
    return d / PRIVATE_NAME, d / PUBLIC_NAME


def trusted(settings: RemoteSettings) -> list[tuple[bytes, str]]:
    """Each trusted key's raw bytes and where it came from (ConfigError for a token or file that is not usable)."""
    keys: list[tuple[bytes, str]] = []
    for item in (settings.trusted_keys or "").replace(",", " ").split():
        if item.startswith(PREFIX):
            keys.append(
                (raw_public(item, "JITOPS_REMOTE_TRUSTED_KEYS"), "JITOPS_REMOTE_TRUSTED_KEYS")
            )
            continue
        path = Path(os.path.expanduser(item))
        for line in _key_lines(
            path,
            "JITOPS_REMOTE_TRUSTED_KEYS names",
            "a file of public keys, one per line, or list the keys themselves",
        ):
            token = line.split("#", 1)[0].strip().split(" ")[0]
            if token:
                keys.append((raw_public(token, str(path)), str(path)))
    _, pub_path = key_paths(settings)
    if os.path.exists(pub_path) and own_file_problem(pub_path) is None:
        keys.append(
            (raw_public(read_public(pub_path), str(pub_path)), f"{pub_path} (your own key)")
        )
    return keys


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
    is unreadable, not UTF-8, or empty (check the token with :func:`raw_public`)."""
    fix = "a file holding the ed25519:... line `jitops cache keygen` printed (`jitops cache keygen --force` writes a new pair)"
    words = " ".join(_key_lines(path, "the public key file", fix)).split()
    if not words:
        raise ConfigError(f"the public key file {path} is empty. Fix: point it at {fix}")
    return words[0]


def own_file_problem(path: Path) -> str | None:
    return fsutil.insecure_reason(path.parent, want_dir=True) or fsutil.insecure_reason(
        path, want_dir=False
    )
