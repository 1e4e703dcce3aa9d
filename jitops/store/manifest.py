"""The data of one cache entry: its manifest (what was built, from what, its digest), its
Address, and the answers of a cache tier (Hit, Miss, EntryProblem).

A data type below the cache and its users. Its bytes are canonical JSON that
carries the sha256 of its own body, so any changed byte is detected.

Imports: record.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from ..base.record import record

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 2  # 2: canonical bytes + self-digest, so any changed byte is detected


@record
class Manifest:
    """One entry's record: its key and library, what was built (the file, its sha256 and size), when and how
    long, the key's ingredients, the build log and where the time went. ``to_json`` / ``parse``: its bytes."""

    key: str
    library: str
    target: str
    namespace: str
    library_file: str
    sha256: str
    size: int
    build_seconds: float
    built_at: float
    ingredients: dict[str, Any]
    build_log: str
    # Where the build's time went: per file (seconds, cached object, PCH hit/built/...), link. Not
    # in the key. Left out of the bytes when empty, so manifests written before it existed still
    # parse.
    timings: dict[str, Any] = field(default_factory=dict)
    # What the compiler and linker read ({label: sha256}, store.inputs), proven before the entry is
    # used. None: an entry from before jitops recorded it, which cannot be proven (so it is built
    # again).
    inputs: dict[str, str] | None = None

    def _body(self) -> dict[str, Any]:
        body = {"format": MANIFEST_FORMAT, **self.__dict__}
        if not self.timings:
            del body["timings"]
        if self.inputs is None:
            del body["inputs"]
        return body

    def to_json(self) -> bytes:
        """Canonical JSON (sorted keys, no spaces) carrying the sha256 of its own body.

        ``parse`` demands exactly these bytes back, so a flipped or truncated
        byte anywhere in the file, even in a field nothing else checks (the
        build log) or in insignificant whitespace, is detected.
        """
        body = self._body()
        return _canonical({**body, "digest": hashlib.sha256(_canonical(body)).hexdigest()})

    @classmethod
    def parse(cls, raw: bytes) -> Manifest:
        """The manifest in ``raw``; ValueError (only) for anything else: every field's type is checked, so a
        manifest the cache accepts is one ``ls``, ``export`` and ``explain`` can print."""
        try:
            data = json.loads(raw)
        except RecursionError:
            raise ValueError(
                "manifest nested too deep"
            ) from None  # JSONDecodeError, UnicodeDecodeError: ValueErrors
        if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
            raise ValueError("unknown manifest format")
        fields = cls.__dataclass_fields__
        missing = [f for f in fields if f not in data and f not in _OPTIONAL]
        if missing:
            raise ValueError(f"manifest lacks {missing}")
        if set(data) - set(fields) - {"format", "digest"}:
            raise ValueError(
                f"manifest has unknown fields {sorted(set(data) - set(fields) - {'format', 'digest'})}"
            )
        for f, t in _TYPES.items():
            v = data.get(f, {}) if f == "timings" else data[f]
            if (
                isinstance(v, bool)
                or not isinstance(v, t)
                or (isinstance(v, float) and not math.isfinite(v))
            ):
                raise ValueError(f"manifest field {f!r} has the wrong type ({type(v).__name__})")
        if not _timings_ok(data.get("timings", {})):
            raise ValueError("manifest field 'timings' has the wrong shape")
        if "inputs" in data and not _inputs_ok(data["inputs"]):
            raise ValueError("manifest field 'inputs' has the wrong shape")
        m = cls(**{f: data[f] for f in fields if f in data})
        stem = (
            m.library_file[3:-3]
            if m.library_file.startswith("lib") and m.library_file.endswith(".so")
            else ""
        )
        # lib[a-z0-9_]+.so, without compiling a regex on the warm path
        if not stem or stem.strip(_LIBRARY_CHARS):
            raise ValueError(f"manifest names an unexpected library file {m.library_file!r}")
        if raw != m.to_json():
            raise ValueError("manifest bytes do not match their digest (damaged or edited)")
        return m


_LIBRARY_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
_OPTIONAL = ("timings", "inputs")
_HEX_RUN = re.compile("[0-9a-f]*")
_TYPES: dict[str, type | tuple[type, ...]] = {
    "key": str,
    "library": str,
    "target": str,
    "namespace": str,
    "library_file": str,
    "sha256": str,
    "size": int,
    "build_seconds": (int, float),
    "built_at": (int, float),
    "ingredients": dict,
    "build_log": str,
    "timings": dict,
}


def _num(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _timings_ok(t: dict[str, Any]) -> bool:
    """The shape ``tubuild.summary`` reads: {files: {label: {seconds: number, ...}}, pch_built: {key: number},
    link_seconds: number}, each part optional."""
    files, built = t.get("files") or {}, t.get("pch_built") or {}
    return (
        isinstance(files, dict)
        and all(isinstance(i, dict) and _num(i.get("seconds", 0.0)) for i in files.values())
        and isinstance(built, dict)
        and all(_num(v) for v in built.values())
        and _num(t.get("link_seconds", 0.0))
    )


def _inputs_ok(inputs: object) -> bool:
    """{label: sha256}: labels non-empty strings without NUL, digests 64 lower-case hex digits
    (checked joined: a manifest records hundreds, read on every warm load)."""
    if not isinstance(inputs, dict) or "" in inputs:
        return False
    if not inputs:
        return True
    digests = list(inputs.values())
    if not all(type(v) is str and len(v) == 64 for v in digests):
        return False
    if not all(type(k) is str for k in inputs) or "\0".join(inputs).count("\0") != len(inputs) - 1:
        return False
    return _HEX_RUN.fullmatch("".join(digests)) is not None


def _canonical(data: Mapping[str, Any]) -> bytes:
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


class EntryProblem(Exception):
    """Why an entry cannot be used; the entry is then a cache miss."""


class StaleInputs(EntryProblem):
    """An entry built from other inputs than this machine holds: ``labels`` are the files its build
    read (as ``Manifest.inputs`` names them), so a tier can look for the entry of this machine's."""

    def __init__(self, message: str, labels: tuple[str, ...]) -> None:
        super().__init__(message)
        self.labels = labels


@record
class Address:
    """Which entry: a library, its target's name and the key. The unit every tier stores."""

    library: str
    target: str
    key: str


@record
class Hit:
    """A verified entry: safe to load."""

    path: Path
    manifest: Manifest


@record
class Miss:
    """No loadable entry. ``reason`` is None when there is none at all, else why the one there is refused."""

    reason: str | None = None

    @property
    def damaged(self) -> bool:
        return self.reason is not None
