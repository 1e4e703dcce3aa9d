"""What one remote entry is on the wire: a signed header line, then an exported archive.

Imports only the stdlib and ``jitops.store.manifest`` (EntryProblem). The archive is
exactly what ``jitops cache export`` writes for one entry (no toolchain
records), so the remote and export/import share one format and one set of
checks (``store.archive.import_entry``: only the key's members are read, and its
library only after this signature verifies over the manifest member). The header
names the key, the signer's fingerprint and its signature over the entry's manifest bytes.
"""

from __future__ import annotations

import json
from typing import Any

from ..store.manifest import EntryProblem

MAGIC = b"jitops-remote-entry 1\n"
MAX_HEADER = 4096


def pack(key: str, signer: str, signature: str, archive: bytes) -> bytes:
    header = json.dumps(
        {"key": key, "signer": signer, "signature": signature}, sort_keys=True
    ).encode()
    return MAGIC + header + b"\n" + archive


def unpack(blob: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, archive bytes); EntryProblem if the blob is not a remote entry."""
    if not blob.startswith(MAGIC):
        raise EntryProblem("it is not a jitops remote entry (wrong magic)")
    end = blob.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER)
    if end < 0:
        raise EntryProblem("its header is missing or truncated")
    try:
        header = json.loads(blob[len(MAGIC) : end])
    except ValueError as e:
        raise EntryProblem(f"its header is not valid JSON ({e})") from e
    if not (
        isinstance(header, dict)
        and all(isinstance(header.get(k), str) for k in ("key", "signer", "signature"))
    ):
        raise EntryProblem("its header lacks the key, the signer or the signature")
    return header, blob[end + 1 :]
