"""Writing a bundle: verified cache entries as an installable wheel that ``store.bundles`` finds.

The wheel holds one package, ``jitops_bundle_<name>/``: an ``__init__.py`` whose ``ROOT`` is its folder, and
below it each entry exactly as the cache holds it (``v1/entries/<library>/<target>/<key>/``: manifest and
library, byte for byte, and the ``signature`` file when ``sign`` gives one), so a read-only cache over that folder
verifies it as the cache would. The entry
point ``[jitops.bundles] <name> = jitops_bundle_<name>:ROOT`` declares it. Tags: the entries are keyed on the
Python ABI, the platform and the exact torch, so the wheel is ``cp3X-cp3X-<platform>`` (``py3-none-<platform>``
when no entry is keyed on the Python ABI) and requires ``torch==<the running torch's public version>``
(``torch>=<target>`` when every entry is on torch's stable ABI: ``torch_requirement``); the
platform tag is the plain one (``linux_x86_64``): the libraries link against this torch's libraries, not a
manylinux baseline. A plain zip writer (no build backend): METADATA, WHEEL, entry_points.txt and RECORD (sha256
of every file).

Imports: bundles, cache, manifest, base.fsutil, errors, spec (``flag_version``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import sys
import sysconfig
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..base import fsutil
from ..errors import ArgumentError
from ..spec import flag_version
from .bundles import SIGNATURE, Signature, signature_text
from .cache import MAX_MANIFEST_BYTES, Cache
from .manifest import MANIFEST, Manifest

NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*$")
_STAMP = (2020, 1, 1, 0, 0, 0)  # fixed zip times: the same entries give the same wheel


@dataclass(frozen=True)
class Packed:
    """One verified entry to pack: the cache it is in, its folder, its manifest."""

    cache: Cache
    entry: Path
    manifest: Manifest


@dataclass(frozen=True)
class Written:
    path: Path
    distribution: str
    version: str
    size: int  # bytes of the wheel file
    per_library: dict[str, int]  # bytes of each library's entries, uncompressed
    # each entry folder (under the package) -> its signer's fingerprint, None: unsigned
    signers: dict[str, str | None]
    requires: str  # the METADATA's torch requirement (torch_requirement)


def package_name(name: str) -> str:
    if not NAME.match(name):
        raise ArgumentError(
            f"bundle name {name!r}: use lower-case letters, digits and '_' (a letter first). "
            "Fix: e.g. --name myservice"
        )
    return f"jitops_bundle_{name}"


def check_version(version: str) -> str:
    """``version`` normalized (PEP 440: 08 -> 8), or ArgumentError."""
    if not VERSION.match(version):
        raise ArgumentError(f"bundle version {version!r}: use digits and dots, e.g. 1.0")
    return ".".join(str(int(part)) for part in version.split("."))


def tags(packed: list[Packed]) -> str:
    """The wheel's python-abi-platform tag for what the entries are keyed on."""
    platform = re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())
    if all(p.manifest.ingredients.get("python_abi") is None for p in packed):
        return f"py3-none-{platform}"
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return f"{py}-{py}{getattr(sys, 'abiflags', '')}-{platform}"


def torch_requirement(packed: list[Packed], torch_version: str) -> str:
    """The torch the wheel's entries serve: ``torch==<this one>`` when an entry is keyed on torch's version, else
    (every entry on torch's stable ABI) ``torch>=<the oldest target version>``, the range the keys hold."""
    targets = []
    for p in packed:
        ingr = p.manifest.ingredients
        found = [v for f in ingr.get("cflags") or () if (v := flag_version(str(f)))]
        if ingr.get("abi") != "stable" or ingr.get("torch_version") is not None or len(found) != 1:
            return f"torch=={torch_version.split('+', 1)[0]}"
        targets.append(found[0])
    major, minor = min(targets)
    return f"torch>={major}.{minor}"


def _same_manifest(
    data: bytes, verified: Manifest
) -> bool:  # the bytes packed (and signed) are the ones verified
    try:
        return Manifest.parse(data) == verified
    except (ValueError, TypeError, UnicodeDecodeError):
        return False


def _record_line(arc: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arc},sha256={digest},{len(data)}"


# an entry, its manifest's bytes -> its signature, or None
Sign = Callable[[Packed, bytes], Signature | None]


def write_wheel(
    packed: list[Packed],
    out_dir: Path,
    name: str,
    version: str,
    torch_version: str,
    sign: Sign | None = None,
) -> Written:
    """Write the wheel into ``out_dir``; what was written. Each entry is re-read exactly as verified (a library
    whose size or sha256 differs from its manifest by now is refused); ``sign`` signs the manifest bytes packed
    (it may raise: nothing is written then)."""
    pkg, version = package_name(name), check_version(version)
    if not packed:
        raise ArgumentError("a bundle needs at least one entry. Fix: name the ops with --ops")
    dist = f"{pkg}-{version}"
    files: dict[str, tuple[bytes, int]] = {
        f"{pkg}/__init__.py": (
            b'"""A jitops bundle: verified op libraries (jitops bundle build)."""\n'
            b"from pathlib import Path\n\nROOT = str(Path(__file__).resolve().parent)\n",
            0o644,
        )
    }
    per_library: dict[str, int] = {}
    signers: dict[str, str | None] = {}
    for p in packed:
        rel = p.entry.relative_to(p.cache.root).as_posix()
        for member in (MANIFEST, p.manifest.library_file):
            limit = MAX_MANIFEST_BYTES if member == MANIFEST else p.manifest.size
            try:  # bounded, never a link nor a FIFO put there since the check
                data = fsutil.read_bounded(p.entry / member, limit)
            except OSError as e:
                raise ArgumentError(
                    f"{p.entry / member} changed since it was verified ({e.strerror}). Fix: run the "
                    "command again"
                ) from e
            if (
                not _same_manifest(data, p.manifest)
                if member == MANIFEST
                else len(data) != p.manifest.size
                or hashlib.sha256(data).hexdigest() != p.manifest.sha256
            ):
                raise ArgumentError(
                    f"{p.entry / member} changed since it was verified. Fix: run the command again"
                )
            files[f"{pkg}/{rel}/{member}"] = (data, 0o644)
            per_library[p.manifest.library] = per_library.get(p.manifest.library, 0) + len(data)
        signature = sign(p, files[f"{pkg}/{rel}/{MANIFEST}"][0]) if sign is not None else None
        signers[rel] = None if signature is None else signature[0]
        if signature is not None:
            files[f"{pkg}/{rel}/{SIGNATURE}"] = (signature_text(signature), 0o644)
    meta, requires = f"{dist}.dist-info", torch_requirement(packed, torch_version)
    files[f"{meta}/METADATA"] = (
        (
            f"Metadata-Version: 2.1\nName: {pkg}\nVersion: {version}\n"
            f"Summary: jitops bundle {name}: prebuilt, verified op libraries\n"
            f"Requires-Dist: {requires}\n"
        ).encode(),
        0o644,
    )
    tag = tags(packed)
    files[f"{meta}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: jitops bundle build\nRoot-Is-Purelib: false\n"
        f"Tag: {tag}\n".encode(),
        0o644,
    )
    files[f"{meta}/entry_points.txt"] = (f"[jitops.bundles]\n{name} = {pkg}:ROOT\n".encode(), 0o644)
    files[f"{meta}/top_level.txt"] = (f"{pkg}\n".encode(), 0o644)
    record = [_record_line(arc, data) for arc, (data, _) in files.items()] + [f"{meta}/RECORD,,"]
    files[f"{meta}/RECORD"] = (("\n".join(record) + "\n").encode(), 0o644)
    fsutil.makedirs(out_dir)
    path = out_dir / f"{dist}-{tag}.whl"
    tmp = out_dir / f".{path.name}.{os.getpid()}.tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arc, (data, mode) in files.items():
            info = zipfile.ZipInfo(arc, date_time=_STAMP)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    os.replace(tmp, path)
    return Written(path, pkg, version, path.stat().st_size, per_library, signers, requires)
