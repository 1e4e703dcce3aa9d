"""Archives and provenance as an attacker sees them (issue 28; audit 2024-11-24 defects 2, 4, 6 and 8).

Entries come from the fake builder (a real, tiny shared library); stores are a shared directory and a
real redis-server on 127.0.0.1. A planted library is ``helpers.tattletale_library``: its constructor
creates a marker file, so "was it loaded?" is a fact. Each test for an audit defect fails on 309e589.
"""

from __future__ import annotations

import argparse
import bz2
import contextlib
import dataclasses
import gzip
import hashlib
import io
import lzma
import os
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jitops.store import archive as cache_archive
from jitops.store.cache import Cache
from jitops.cli import main
from jitops.key import KEY_CHARS
from jitops.store.manifest import MANIFEST, Manifest, Miss
from jitops.plan import make_plan
from jitops.build.publish import build_and_publish
from jitops.remote import envelope
from jitops.remote.config import RemoteSettings
from jitops.remote.session import make_tier
from jitops.remote.tier import entry_name
from jitops.base.settings import Settings
from jitops.spec import OpSpec
from tests import fakelib
from tests.helpers import last_json, run_scenario_proc, tattletale_library
from tests.remote_helpers import keygen, node_env, redis_server

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

BACKENDS = ["file", "redis"]
GIB = 1 << 30
# gzip members concatenate: 1024 of these inflate to 1 GiB of zeros
_ZERO_MIB = gzip.compress(bytes(1 << 20), 9)


# ------------------------------------------------------------------ helpers


def _settings(cache: Path, **more: str) -> Settings:
    return Settings.from_env({"JITOPS_CACHE_DIR": str(cache), "JITOPS_BUILDER": "fake", **more})


def _built(tmp: Path, name: str, spec: OpSpec = fakelib.FAKEADD) -> tuple[Cache, Any]:
    """A cache ``tmp/name`` holding the fake build of ``spec``, and its plan."""
    cache = Cache(tmp / name)
    plan = make_plan(spec, "cpu", settings=_settings(tmp / name), cache=cache)
    build_and_publish(plan, cache, None, _settings(tmp / name))
    return cache, plan


def _plan_in(tmp: Path, name: str, spec: OpSpec = fakelib.FAKEADD) -> tuple[Cache, Any]:
    cache = Cache(tmp / name)
    return cache, make_plan(spec, "cpu", settings=_settings(tmp / name), cache=cache)


@contextlib.contextmanager
def _store(kind: str, tmp: Path) -> Iterator[str]:
    if kind == "redis":
        with redis_server(tmp) as (url, _):
            yield url
    else:
        (tmp / "shared").mkdir()
        yield f"file://{tmp / 'shared'}"


def _tier(url: str, cfg: Path, mode: str, trusted: str | None = None) -> Any:
    tier = make_tier(RemoteSettings(url, mode, trusted, None, str(cfg)))
    assert tier.store is not None and not tier.off
    return tier


def _written() -> int:
    """Bytes this process has passed to write(2) so far (/proc/self/io): what extraction costs the disk."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def _member(
    name: str, data: bytes = b"", size: int | None = None, pax: dict[str, str] | None = None
) -> bytes:
    """One tar member, header and data (``size`` alone: a header whose data follows elsewhere)."""
    info = tarfile.TarInfo(name)
    info.size = len(data) if size is None else size
    info.mode = 0o600
    info.pax_headers = pax or {}
    return (
        info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + data + bytes(-len(data) % 512)
    )


def _members(archive: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
        return {m.name: (m, tar.extractfile(m).read()) for m in tar if m.isfile()}  # type: ignore[union-attr]


def _bomb(archive: bytes, where: str) -> bytes:
    """The audit's blob: a genuine one-entry archive plus two members of 1 GiB of zeros (about 2 MB in all).

    other-entries: two other entries' libraries before the genuine members; own-library: the genuine
    (signed) manifest, then its library member claiming 1 GiB.
    """
    plain = gzip.decompress(archive)
    members = _members(archive)
    (mname,) = [n for n in members if n.endswith(MANIFEST)]
    (lname,) = [n for n in members if n.endswith(".so")]
    zeros = _ZERO_MIB * (GIB >> 20)
    if where == "other-entries":
        folder = mname.rsplit("/", 2)[0]
        big = [
            gzip.compress(_member(f"{folder}/{c * KEY_CHARS}/{lname.rsplit('/', 1)[1]}", size=GIB))
            + zeros
            for c in "ef"
        ]
        return b"".join(big) + gzip.compress(plain)
    return (
        gzip.compress(_member(mname, members[mname][1], pax=members[mname][0].pax_headers))
        + gzip.compress(_member(lname, size=GIB))
        + zeros
        + gzip.compress(bytes(1024))
    )


def _swapped(archive: bytes, evil: bytes, keep_pax: bool = True) -> bytes:
    """The audit's forgery: the library replaced, the manifest's sha256 and size recomputed (all public)."""
    out = b""
    for name, (info, data) in _members(archive).items():
        if name.endswith(MANIFEST):
            m = Manifest.parse(data)
            data = dataclasses.replace(
                m, sha256=hashlib.sha256(evil).hexdigest(), size=len(evil)
            ).to_json()
            out += _member(name, data, pax=dict(info.pax_headers) if keep_pax else None)
        else:
            out += _member(name, evil if name.endswith(".so") else data)
    return gzip.compress(out + bytes(1024))


def _damaged(plain_tar: bytes, comp: str) -> bytes:
    """``plain_tar`` compressed with ``comp``, then 64 bytes flipped three quarters into the stream."""
    data = bytearray(
        {"xz": lzma.compress, "bz2": bz2.compress, "gz": gzip.compress}[comp](plain_tar)
    )
    at = len(data) * 3 // 4
    for i in range(at, min(at + 64, len(data) - 8)):
        data[i] ^= 0x55
    return bytes(data)


def _cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str, **env: str
) -> tuple[int, str, str]:
    """``jitops ARGV`` in this process under ``env`` (the fake builder, fakelib registered); (rc, out, err)."""
    for k, v in {"JITOPS_BUILDER": "fake", "JITOPS_PROGRESS": "0", **env}.items():
        monkeypatch.setenv(k, v)
    fakelib.register_all()
    capsys.readouterr()
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------ defect 2: damaged xz / bz2 / gz


@pytest.mark.parametrize("comp", ["xz", "bz2", "gz"])
def test_damaged_archive_is_a_named_error_on_import(
    tmp_path: Path, comp: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Audit 2: a .tar.xz damaged late in the stream gave `jitops cache import` a raw LZMAError traceback."""
    cache, _plan = _built(tmp_path, "ci")
    cache_archive.export(cache, tmp_path / "a.tar.gz", {"fakeadd"})
    bad = tmp_path / f"bad.tar.{comp}"
    bad.write_bytes(_damaged(gzip.decompress((tmp_path / "a.tar.gz").read_bytes()), comp))
    rc, out, err = _cli(
        monkeypatch, capsys, "cache", "import", str(bad), JITOPS_CACHE_DIR=str(tmp_path / "b")
    )
    assert rc == 1 and "Traceback" not in err, out + err
    # refused whole, by name; gzip's damage may instead only spoil the library (rejected: its
    # sha256)
    if comp != "gz":
        assert (
            "jitops: error:" in err and str(bad) in err and "writes gzip" in err and "Fix:" in err
        ), err
    else:
        assert "jitops: error:" in err or "rejected fakeadd/" in err, err
    assert not list((tmp_path / "b" / "v1" / "entries").glob("*/*/*")), (
        "a damaged archive published something"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_damaged_xz_remote_entry_is_rejected_and_built_locally(
    tmp_path: Path,
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Audit 2: every `jitops.get` raised LZMAError while the blob was there; now: rejected, counted, built here."""
    cfg = tmp_path / "cfg"
    keygen(cfg)
    cache, plan = _built(tmp_path, "ci")
    with _store(backend, tmp_path) as url:
        writer = _tier(url, cfg, "write")
        assert writer.upload(plan, cache)
        name = entry_name("fakeadd", plan.target.name, plan.key)
        header, archive = envelope.unpack(writer.store.get_blob(name))
        writer.store.put_blob(
            name,
            envelope.pack(
                header["key"],
                header["signer"],
                header["signature"],
                _damaged(gzip.decompress(archive), "xz"),
            ),
        )
        node_cache, node_plan = _plan_in(tmp_path, "node")
        node = _tier(url, cfg, "read")
        assert node.fetch(node_plan, node_cache) is None
        assert node.stats.rejected == 1
        built = []
        manifest, here = node.obtain(
            node_plan,
            node_cache,
            lambda: (
                built.append(1)
                or build_and_publish(node_plan, node_cache, None, _settings(tmp_path / "node"))
            ),
        )
        assert here and built == [1] and manifest.key == plan.key
        rc, out, err = _cli(
            monkeypatch,
            capsys,
            "cache",
            "pull",
            "fakeadd",
            JITOPS_CACHE_DIR=str(tmp_path / "puller"),
            JITOPS_REMOTE_CACHE=url,
            JITOPS_CONFIG_DIR=str(cfg),
            JITOPS_REMOTE_CACHE_MODE="read",
        )
    assert rc == 1 and "1 rejected" in out and "Traceback" not in err, out + err


# ------------------------------------------------------------------ defect 6: decompression bombs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["other-entries", "own-library"])
def test_decompression_bomb_is_refused_before_it_is_written(
    tmp_path: Path, backend: str, where: str
) -> None:
    """Audit 6: a 2 MB blob with 1 GiB members of zeros was fully extracted (41.8 s file, 168 s redis, 2 GiB written)."""
    cfg = tmp_path / "cfg"
    keygen(cfg)
    cache, plan = _built(tmp_path, "ci")
    with _store(backend, tmp_path) as url:
        writer = _tier(url, cfg, "write")
        assert writer.upload(plan, cache)
        name = entry_name("fakeadd", plan.target.name, plan.key)
        header, archive = envelope.unpack(writer.store.get_blob(name))
        blob = envelope.pack(
            header["key"], header["signer"], header["signature"], _bomb(archive, where)
        )
        assert len(blob) < 3 << 20
        writer.store.put_blob(name, blob)
        node_cache, node_plan = _plan_in(tmp_path, "node")
        node = _tier(url, cfg, "read")
        w0, t0 = _written(), time.monotonic()
        got = node.fetch(node_plan, node_cache)
        seconds, written = time.monotonic() - t0, _written() - w0
    assert got is None and node.stats.rejected == 1
    assert seconds < 5, f"the bomb took {seconds:.1f}s to refuse"
    assert written < 64 << 20, f"{written} bytes written while refusing a bomb"
    assert isinstance(node_cache.lookup(node_plan.address), Miss)


def test_decompression_bomb_archive_is_refused_by_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cache, _plan = _built(tmp_path, "ci")
    cache_archive.export(cache, tmp_path / "a.tar.gz", {"fakeadd"})
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(_bomb((tmp_path / "a.tar.gz").read_bytes(), "other-entries"))
    w0, t0 = _written(), time.monotonic()
    rc, out, err = _cli(
        monkeypatch, capsys, "cache", "import", str(bomb), JITOPS_CACHE_DIR=str(tmp_path / "b")
    )
    seconds, written = time.monotonic() - t0, _written() - w0
    assert rc == 1 and "decompression bomb" in err and "Traceback" not in err, out + err
    assert seconds < 5 and written < 64 << 20, (seconds, written)


# ------------------------------------------------------------------ defect 8: manifests over 64 KiB


def _big_manifest_spec(tmp: Path) -> OpSpec:
    folder = tmp / "bigmanifest"
    folder.mkdir()
    (folder / "k.cpp").write_text("// a kernel folder with many headers\n")
    for i in range(900):
        (folder / f"header_with_a_rather_long_descriptive_name_{i:04d}.h").write_text(
            f"#define H{i} {i}\n"
        )
    return OpSpec(
        name="bigmanifest",
        root=folder,
        cpu_sources=("k.cpp",),
        schemas=("bigmanifest(Tensor x) -> Tensor",),
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_manifest_over_64k_round_trips_export_import_push_pull(
    tmp_path: Path, backend: str
) -> None:
    """Audit 8: import and pull refused (whole archive) a manifest over 64 KiB that the cache itself accepts."""
    spec = _big_manifest_spec(tmp_path)
    cache, plan = _built(tmp_path, "ci", spec)
    assert len((plan.entry / MANIFEST).read_bytes()) > 64 << 10
    exported, skipped = cache_archive.export(cache, tmp_path / "a.tar.gz", {"bigmanifest"})
    assert len(exported) == 1 and not skipped
    into = Cache(tmp_path / "imported")
    res = cache_archive.import_archive(into, tmp_path / "a.tar.gz")
    assert [m.key for m in res.imported] == [plan.key] and not res.rejected, res.rejected
    assert (
        into.verify(into.path_of(plan.address), plan.key, "bigmanifest", plan.target.name).key
        == plan.key
    )
    cfg = tmp_path / "cfg"
    keygen(cfg)
    with _store(backend, tmp_path) as url:
        assert _tier(url, cfg, "write").upload(plan, cache)
        node_cache, node_plan = _plan_in(tmp_path, "node", spec)
        node = _tier(url, cfg, "read")
        got = node.fetch(node_plan, node_cache)
    assert got is not None and got.key == plan.key and node.stats.rejected == 0


# ------------------------------------------------------------------ defect 4 / item 3: provenance


@pytest.mark.parametrize("backend", BACKENDS)
def test_push_refuses_to_sign_an_imported_swapped_library(
    tmp_path: Path,
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Audit 4: import accepted a swapped library with a recomputed manifest, and push signed it for every node."""
    cfg = tmp_path / "cfg"
    public = keygen(cfg)
    marker = tmp_path / "LOADED"
    cache, plan = _built(tmp_path, "ci")
    cache_archive.export(cache, tmp_path / "a.tar.gz", {"fakeadd"})
    forged = tmp_path / "forged.tar.gz"
    forged.write_bytes(
        _swapped(
            (tmp_path / "a.tar.gz").read_bytes(), tattletale_library(tmp_path, marker).read_bytes()
        )
    )
    with _store(backend, tmp_path) as url:
        signer = {
            "JITOPS_CACHE_DIR": str(tmp_path / "signer"),
            "JITOPS_CONFIG_DIR": str(cfg),
            "JITOPS_REMOTE_CACHE": url,
            "JITOPS_REMOTE_CACHE_MODE": "write",
        }
        rc, imported, err = _cli(monkeypatch, capsys, "cache", "import", str(forged), **signer)
        assert rc == 0 and "1 imported" in imported, imported + err
        rc, pushed, err = _cli(monkeypatch, capsys, "cache", "push", "fakeadd", **signer)
        assert rc == 0, pushed + err
        in_store = _tier(url, cfg, "read").store.list_blobs("entries/")
        env = node_env(
            tmp_path / "node",
            url,
            tmp_path / "nodecfg",
            JITOPS_REMOTE_CACHE_MODE="read",
            JITOPS_REMOTE_TRUSTED_KEYS=public,
        )
        node = last_json(
            run_scenario_proc(
                "remote_scenarios.get_node", ops=["fakeadd"], env=env, timeout=120
            ).stdout
        )
    assert not marker.exists(), "the planted library's constructor ran on a read-only node"
    assert node["ops"]["fakeadd"]["built"] and node["ops"]["fakeadd"]["works"], node
    assert in_store == [] and "push: 0 uploaded" in pushed and "imported from" in pushed, pushed
    assert "unsigned" in imported and "code you chose to trust" in imported, imported


def test_resign_foreign_pushes_an_imported_entry_only_when_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "cfg"
    keygen(cfg)
    cache, _plan = _built(tmp_path, "ci")
    cache_archive.export(cache, tmp_path / "a.tar.gz", {"fakeadd"})
    with _store("file", tmp_path) as url:
        signer = {
            "JITOPS_CACHE_DIR": str(tmp_path / "signer"),
            "JITOPS_CONFIG_DIR": str(cfg),
            "JITOPS_REMOTE_CACHE": url,
            "JITOPS_REMOTE_CACHE_MODE": "write",
        }
        assert (
            _cli(monkeypatch, capsys, "cache", "import", str(tmp_path / "a.tar.gz"), **signer)[0]
            == 0
        )
        rc, out, _ = _cli(monkeypatch, capsys, "cache", "push", **signer)
        assert "skipped fakeadd" in out and "--resign-foreign fakeadd" in out, out
        rc, out, err = _cli(
            monkeypatch, capsys, "cache", "push", "--resign-foreign", "fakeadd", **signer
        )
        assert rc == 0 and "re-signing foreign code" in out and "push: 1 uploaded" in out, out + err
        assert len(_tier(url, cfg, "read").store.list_blobs("entries/fakeadd/")) == 1


def test_warm_push_and_pulled_entries_are_not_resigned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An entry a node pulled is noted as pulled: that node's `cache push` skips it; the builder's pushes it."""
    from jitops.remote.commands import cmd_push
    from jitops.remote.origin import installed_from

    cfg = tmp_path / "cfg"
    keygen(cfg)
    cache, plan = _built(tmp_path, "ci")
    with _store("file", tmp_path) as url:
        assert _tier(url, cfg, "write").upload(plan, cache)
        node_cache, node_plan = _plan_in(tmp_path, "node")
        assert _tier(url, cfg, "read").fetch(node_plan, node_cache) is not None
        assert installed_from(node_cache, node_plan.address) == ("pulled", url)
        assert installed_from(cache, plan.address) is None
        _cli(
            monkeypatch,
            capsys,
            "cache",
            "path",
            JITOPS_CACHE_DIR=str(tmp_path / "node"),
            JITOPS_CONFIG_DIR=str(cfg),
            JITOPS_REMOTE_CACHE=url,
            JITOPS_REMOTE_CACHE_MODE="write",
        )
        assert cmd_push(argparse.Namespace(ops=["fakeadd"], device=None)) == 0
        assert f"pulled from {url}" in capsys.readouterr().out


def test_export_signs_what_was_built_here_and_import_verifies_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Signed archives: verified against the trusted keys, the library taken only after the manifest verifies."""
    cfg = tmp_path / "cfg"
    public = keygen(cfg)
    _built(tmp_path, "ci")
    rc, out, err = _cli(
        monkeypatch,
        capsys,
        "cache",
        "export",
        str(tmp_path / "a.tar.gz"),
        "fakeadd",
        JITOPS_CACHE_DIR=str(tmp_path / "ci"),
        JITOPS_CONFIG_DIR=str(cfg),
    )
    assert rc == 0 and "1 signed with your key" in out, out + err
    trusting = {
        "JITOPS_CACHE_DIR": str(tmp_path / "b"),
        "JITOPS_CONFIG_DIR": str(tmp_path / "bcfg"),
        "JITOPS_REMOTE_TRUSTED_KEYS": public,
    }
    # A swapped library under the genuine signature: refused, and its 4 MiB library is never
    # written.
    forged = tmp_path / "forged.tar.gz"
    forged.write_bytes(_swapped((tmp_path / "a.tar.gz").read_bytes(), os.urandom(4 << 20)))
    w0 = _written()
    rc, out, err = _cli(monkeypatch, capsys, "cache", "import", str(forged), **trusting)
    assert rc == 1 and "signature does not verify" in err and "1 rejected" in out, out + err
    assert _written() - w0 < 1 << 20, "the library of an entry whose signature fails was extracted"
    rc, out, err = _cli(
        monkeypatch, capsys, "cache", "import", str(tmp_path / "a.tar.gz"), **trusting
    )
    assert rc == 0 and "1 imported" in out and "unsigned" not in out, out + err
    stranger = {
        **trusting,
        "JITOPS_CACHE_DIR": str(tmp_path / "c"),
        "JITOPS_REMOTE_TRUSTED_KEYS": "",
    }
    rc, out, err = _cli(
        monkeypatch, capsys, "cache", "import", str(tmp_path / "a.tar.gz"), **stranger
    )
    assert rc == 1 and "trusts no key" in err, out + err
    # b imported it: b's own key does not sign it on export.
    keygen(tmp_path / "bcfg")
    rc, out, err = _cli(
        monkeypatch, capsys, "cache", "export", str(tmp_path / "b.tar.gz"), **trusting
    )
    assert rc == 0 and "0 signed with your key, 1 unsigned" in out, out + err


def test_an_archive_of_too_many_members_is_refused_at_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Empty members cost no bytes, so the size budget alone would let millions through: their number is bounded."""
    from jitops.store.archive_reader import MAX_MEMBERS

    info = tarfile.TarInfo("v1/entries")
    info.type = tarfile.DIRTYPE
    # a directory member's header, repeated
    head = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
    path = tmp_path / "many.tar.gz"
    path.write_bytes(gzip.compress(head * (MAX_MEMBERS + 10) + bytes(1024), 1))
    rc, out, err = _cli(
        monkeypatch, capsys, "cache", "import", str(path), JITOPS_CACHE_DIR=str(tmp_path / "b")
    )
    assert rc == 1 and f"more than {MAX_MEMBERS} members" in err and "Traceback" not in err, (
        out + err
    )


def test_remote_fetch_takes_only_the_requested_entry(tmp_path: Path) -> None:
    """Another entry riding in a genuine blob is read past: the requested one is fetched, the other not published."""
    cfg = tmp_path / "cfg"
    keygen(cfg)
    cache, plan = _built(tmp_path, "ci")
    _built(tmp_path, "ci", fakelib.FAKEMUL)
    with _store("file", tmp_path) as url:
        writer = _tier(url, cfg, "write")
        assert writer.upload(plan, cache)
        name = entry_name("fakeadd", plan.target.name, plan.key)
        header, _archive = envelope.unpack(writer.store.get_blob(name))
        both = tmp_path / "both.tar.gz"
        exported, _ = cache_archive.export(cache, both, {"fakeadd", "fakemul"}, with_records=False)
        assert len(exported) == 2
        writer.store.put_blob(
            name,
            envelope.pack(header["key"], header["signer"], header["signature"], both.read_bytes()),
        )
        node_cache, node_plan = _plan_in(tmp_path, "node")
        node = _tier(url, cfg, "read")
        got = node.fetch(node_plan, node_cache)
    assert got is not None and got.key == plan.key and node.stats.rejected == 0
    assert [p.parent.parent.name for p in node_cache.iter_entries()] == ["fakeadd"]
