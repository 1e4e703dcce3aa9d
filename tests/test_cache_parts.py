"""``jitops cache prune`` and ``ls`` over the rebuildable caches: per-file objects and precompiled headers (issue 17).

Objects are stored with objcache's own ``store`` (a small file stands for the compiler's
output: no compile); the one PCH is precompiled by the real g++ from ``<cstddef>`` (under
a second), through pch's own ``start`` / ``finish``. Entries are fake-built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import jitops
import jitops.build.entry as jentry
import jitops.plan as jplan
from jitops.store import admin as cache_admin, inputs, parts as cache_parts, objcache
from jitops.build import pch
from jitops.store.cache import Cache
from jitops.cli import main
from jitops.store.lock import key_lock
from tests.cli_helpers import fake_spec

pytestmark = pytest.mark.timeout(300)
DAY = 86400.0


@pytest.fixture
def cache(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Cache:
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    monkeypatch.setenv("JITOPS_PROGRESS", "0")
    return Cache(private_cache)


def _age(paths: list[Path], seconds_ago: float) -> None:
    t = time.time() - seconds_ago
    for p in paths:
        for q in [p, *p.rglob("*")] if p.is_dir() else [p]:
            os.utime(q, (t, t), follow_symlinks=False)


def _object(cache: Cache, tmp: Path, name: str, size: int = 5000) -> tuple[str, Path]:
    """A cached object of ``size`` bytes as a build stores it: (its TU key, the build folder)."""
    root = tmp / f"lib_{name}"
    root.mkdir()
    (root / "a.h").write_text(f"// {name}\n")
    (root / f"{name}.o").write_bytes(name.encode() * (size // len(name)))
    key = objcache.tu_key("identity", f"g++ -O3 {name}", "0" * 64, root)
    objcache.store(cache, key, root / f"{name}.o", inputs.record([f"{root}/a.h"], root, ()))
    assert objcache.lookup(cache, key, root, tmp / f"{name}.check.o") == {
        "<root>/a.h": inputs.digest(f"{root}/a.h")
    }
    return key, root


def _pch(cache: Cache, tmp: Path) -> Path:
    """A real PCH (g++, ``<cstddef>``), published as a build publishes one: its folder."""
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    key = pch.key_of("identity", "gcc", "-O2", ["#include <cstddef>"])
    assert not pch.seen_before(cache, key)
    p = pch.start(
        cache,
        key=key,
        kind="gcc",
        cxx="g++",
        flags=["-O2"],
        prefix=["#include <cstddef>"],
        root=tmp,
    )
    assert p is not None
    subprocess.run(p.command, shell=True, check=True, timeout=120)
    assert pch.finish(cache, p, 0.5) is not None
    return cache.build_path("pch", key)


def _entry(name: str, tmp: Path):  # type: ignore[no-untyped-def]
    jitops.register(fake_spec(tmp / "specs", name), replace=True)
    return jentry.ensure_entry(jplan.make_plan(fake_spec(tmp / "specs", name), "cpu"))


def _prune(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["cache", "prune", *argv]) == 0
    return capsys.readouterr().out


def test_prune_counts_objects_and_pchs_and_evicts_least_recently_used_across_kinds(
    cache: Cache, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _pch(cache, tmp_path)
    seen = cache.build_path("pch", folder.name, ".seen")
    key_a, root_a = _object(cache, tmp_path, "a")
    key_b, root_b = _object(cache, tmp_path, "b")
    entry = _entry("parts_lru", tmp_path)
    _age([folder, seen], 5 * DAY)  # the PCH: least recently used
    _age(list(cache.objects.glob("*")), 4 * DAY)
    _age([entry.path / "manifest.json"], 3 * DAY)
    # a hit is a use: b is the newest
    assert objcache.lookup(cache, key_b, root_b, tmp_path / "b.again.o")
    parts = cache_parts.all_parts(cache, time.time())
    sizes = {p.label.split()[0]: p.size for p in parts if p.kind == "pch"}
    obj = {p.name: p for p in parts if p.kind == "object"}
    # each object with its record
    assert len(obj) == 2 and all(len(p.paths) == 2 for p in obj.values())
    assert sizes["PCH"] > 100_000  # the .gch counts, not only its manifest
    entry_size = cache_admin.entry_size(entry.path)
    cap = entry_size + sum(p.size for p in obj.values()) + 10
    out = _prune(capsys, "--max-size", str(cap))
    assert [ln.split()[1] for ln in out.splitlines() if ln.startswith("removed ")] == ["PCH"]
    assert not folder.exists() and not seen.exists() and entry.path.exists()
    assert objcache.lookup(cache, key_a, root_a, tmp_path / "a.2.o")
    # a used again (touched) -> old again; b stays the newest
    _age(list(cache.objects.glob("*")), 4 * DAY)
    assert objcache.lookup(cache, key_b, root_b, tmp_path / "b.2.o")
    out = _prune(capsys, "--max-size", str(entry_size + max(p.size for p in obj.values()) + 10))
    removed = [" ".join(ln.split()[1:3]) for ln in out.splitlines() if ln.startswith("removed ")]
    # the object unused for 4 days, before the entry
    assert len(removed) == 1 and removed[0].startswith("object ")
    assert not objcache.lookup(cache, key_a, root_a, tmp_path / "a.3.o")
    assert objcache.lookup(cache, key_b, root_b, tmp_path / "b.3.o") and entry.path.exists()
    assert sum(1 for _ in cache.objects.iterdir()) == 2


def test_prune_older_than_applies_to_objects_and_pchs_and_dangling_records_go_first(
    cache: Cache, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _pch(cache, tmp_path)
    key_old, root_old = _object(cache, tmp_path, "old")
    _age(
        [folder, cache.build_path("pch", folder.name, ".seen"), *cache.objects.glob("*")], 40 * DAY
    )
    key_new, root_new = _object(cache, tmp_path, "new")
    key_gone, root_gone = _object(cache, tmp_path, "gone")
    record = cache.build_path("objects", key_gone, ".json")
    obj = cache.build_path("objects", json.loads(record.read_text())["object"], ".o")
    obj.unlink()  # an object whose record remains: a miss, never an error
    assert not objcache.lookup(cache, key_gone, root_gone, tmp_path / "gone.o")
    _age([record], cache_parts.GRACE + 60)
    out = _prune(capsys, "--older-than", "30d")
    assert not folder.exists() and not record.exists()
    assert not objcache.lookup(cache, key_old, root_old, tmp_path / "old.2.o")
    assert objcache.lookup(cache, key_new, root_new, tmp_path / "new.2.o")
    assert "removed PCH" in out and out.count("removed object") == 2


def test_prune_keeps_a_pch_being_built_or_just_used(
    cache: Cache, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _pch(cache, tmp_path)
    out = _prune(capsys, "--max-size", "0")  # just built: a build may be about to read it
    assert folder.exists() and f"kept    PCH {folder.name[:12]}" in out
    _age([folder, cache.build_path("pch", folder.name, ".seen")], 2 * DAY)
    with key_lock(cache.lock_path("pch", folder.name), "a test builds it", 0):
        out = _prune(capsys, "--max-size", "0")
    assert folder.exists() and "kept    PCH" in out
    out = _prune(capsys, "--max-size", "0")
    assert not folder.exists() and "removed PCH" in out
    assert (
        pch.find(cache, pch.key_of("identity", "gcc", "-O2", ["#include <cstddef>"]), "gcc") is None
    )


def test_cache_ls_shows_the_bytes_of_objects_and_pchs(
    cache: Cache, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache", "ls"]) == 0
    assert "0 per-file objects, 0 B; 0 precompiled headers, 0 B" in capsys.readouterr().out
    folder = _pch(cache, tmp_path)
    _object(cache, tmp_path, "a", size=3000)
    assert main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    from jitops.cli.cache import human_size

    pch_bytes = sum(p.stat().st_size for p in folder.iterdir())
    obj_bytes = sum(p.stat().st_size for p in cache.objects.iterdir())
    assert (
        f"1 per-file objects, {human_size(obj_bytes)}; 1 precompiled headers, {human_size(pch_bytes)}"
        in out
    )
    assert obj_bytes > 3000 and pch_bytes > 100_000


def test_a_cache_inside_the_source_folder_is_not_a_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JITOPS_CACHE_DIR=./cache beside the kernel: what builds write into the cache (a PCH's prefix.h in
    staging, objects) is not hashed into the key, so it neither changes the key nor looks like an edit."""
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    spec = fake_spec(tmp_path, "cache_inside")
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(spec.root / "cache"))
    first = jentry.ensure_entry(jplan.make_plan(spec, "cpu"))
    tag = spec.root / "cache" / "v1" / "CACHEDIR.TAG"
    assert tag.read_bytes().startswith(b"Signature: 8a477f597d28d172789f06886806bc55"), (
        "the cache is tagged"
    )
    stray = spec.root / "cache" / "v1" / "staging" / "pch-x" / "pch" / "prefix.h"
    stray.parent.mkdir(parents=True)
    stray.write_text("#include <vector>\n")  # as a PCH build's staging holds
    again = jentry.ensure_entry(jplan.make_plan(spec, "cpu"))
    assert again.path == first.path, "the same key: the cache's own files are not sources"
    # another tool's tagged cache (cargo's target/) can hold generated headers
    other = spec.root / "target"
    (other / "gen").mkdir(parents=True)
    (other / "CACHEDIR.TAG").write_bytes(b"Signature: 8a477f597d28d172789f06886806bc55\n# cargo\n")
    (other / "gen" / "bridge.h").write_text("// generated\n")
    assert jentry.ensure_entry(jplan.make_plan(spec, "cpu")).path != first.path, (
        "only jitops's own tag is skipped"
    )
    (spec.root / "helper.h").write_text("// a real header beside the kernel is a source\n")
    assert jentry.ensure_entry(jplan.make_plan(spec, "cpu")).path != first.path


def test_a_header_edited_while_its_pch_compiles_is_not_vouched_for(
    cache: Cache, tmp_path: Path
) -> None:
    """The PCH's header digests are read after its compile: a header saved meanwhile would be recorded with its
    new text while the .gch holds the old, and later builds would trust it. Such a PCH is not published."""
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    header = tmp_path / "mine.h"
    header.write_text("inline int mine() { return 1; }\n")
    time.sleep(2.5)  # older than the compile's start by more than the clock's tick
    for n, edit in ((1, False), (2, True)):
        prefix = ["#include <cstddef>", f'#include "mine.h"  // {n}']
        key = pch.key_of("identity", "gcc", "-O2", prefix)
        p = pch.start(
            cache,
            key=key,
            kind="gcc",
            cxx="g++",
            flags=["-O2", "-I", str(tmp_path)],
            prefix=prefix,
            root=tmp_path,
        )
        assert p is not None
        t0 = time.monotonic()
        subprocess.run(p.command, shell=True, check=True, timeout=120)
        if edit:  # saved by the user while the (background) compile ran
            header.write_text("inline int mine() { return 2; }\n")
        made = pch.finish(cache, p, time.monotonic() - t0)
        assert (made is None) == edit, (n, made)
        assert (pch.find(cache, key, "gcc") is None) == edit


def test_a_clang_pch_written_just_now_is_published(cache: Cache, tmp_path: Path) -> None:
    """clang's PCH reads its prefix from a header jitops writes beside it just before the compile: that file is the
    PCH's own, not a user header changed during the compile, so the PCH is published (it was not, for a while)."""
    if shutil.which("clang++") is None:
        pytest.skip("no clang++")
    prefix = ["#include <cstddef>"]
    key = pch.key_of("identity", "clang", "-O2", prefix)
    p = pch.start(
        cache, key=key, kind="clang", cxx="clang++", flags=["-O2"], prefix=prefix, root=tmp_path
    )
    assert p is not None
    t0 = time.monotonic()
    subprocess.run(p.command, shell=True, check=True, timeout=120)
    assert pch.finish(cache, p, time.monotonic() - t0) is not None
    assert pch.find(cache, key, "clang") is not None


@pytest.mark.parametrize(
    "damage",
    ["deps not a mapping", "deps missing", "object missing", "size not a number", "object edited"],
)
def test_a_damaged_object_record_is_a_miss(cache: Cache, tmp_path: Path, damage: str) -> None:
    """An object whose record is damaged or whose bytes changed is compiled again, never linked."""
    key, root = _object(cache, tmp_path, "obj")
    record_path = cache.build_path("objects", key, ".json")
    record = json.loads(record_path.read_text())
    if damage == "object edited":
        obj = cache.build_path("objects", record["object"], ".o")
        obj.chmod(0o600)
        data = bytearray(obj.read_bytes())
        data[0] ^= 1
        obj.write_bytes(bytes(data))
    else:
        if damage == "deps not a mapping":
            record["deps"] = list(record["deps"])
        elif damage == "deps missing":
            del record["deps"]
        elif damage == "object missing":
            del record["object"]
        elif damage == "size not a number":
            record["size"] = "5000"
        record_path.chmod(0o600)
        record_path.write_text(json.dumps(record))
    into = tmp_path / "into.o"
    assert objcache.lookup(cache, key, root, into) is None
    assert not into.exists()  # nothing to link
