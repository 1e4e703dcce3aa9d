"""The jitops command in-process (``main(argv)``) with fake builds: cache management and warm.

Real compiles and subprocess scenarios are in test_cli_process.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

import jitops
from jitops.build import runner as build_mod
from jitops.store import admin as cache_admin
from jitops.loading import loader
import jitops.build.entry as jentry
import jitops.plan as jplan
from jitops.store.cache import Cache
from jitops.key import compute_key
from jitops.store.manifest import Manifest
from jitops.cli import main
from jitops.cli.cache import parse_age, parse_size
from jitops.errors import OfflineMiss
from tests.cli_helpers import fake_spec
from tests.helpers import child_env, run_scenario


@pytest.fixture
def fake(private_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Register fake-built specs on demand; returns (make(name) -> spec, Cache)."""
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    monkeypatch.setenv("JITOPS_PROGRESS", "0")
    handles = []

    def make(name: str):  # type: ignore[no-untyped-def]
        spec = fake_spec(tmp_path / "specs", name)
        handles.append(jitops.register(spec, replace=True))
        return spec

    yield make, Cache(private_cache)
    for handle in reversed(handles):  # registrations are undone after each test
        handle.undo()


def build(spec, offline: bool | None = None):  # type: ignore[no-untyped-def]
    return jentry.ensure_entry(jplan.make_plan(spec, "cpu"), offline=offline)


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------ parsing


def test_sizes_and_ages_parse() -> None:
    assert parse_size("1048576") == 1 << 20
    assert parse_size("500M") == 500 << 20
    assert parse_size("1.5GiB") == int(1.5 * (1 << 30))
    assert parse_size("2g") == 2 << 30
    assert parse_age("45s") == 45 and parse_age("30m") == 1800 and parse_age("7d") == 7 * 86400
    for bad in ("", "M", "-1G", "1X"):
        with pytest.raises(Exception, match="invalid size"):
            parse_size(bad)
    with pytest.raises(Exception, match="invalid age"):
        parse_age("7 days")


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["frobnicate"], capsys)[0] == 2
    rc, _, err = run(["warm"], capsys)
    assert rc == 2 and "--all" in err
    rc, _, err = run(["cache", "prune", "--max-size", "lots"], capsys)
    assert rc == 2 and "invalid size" in err
    rc, _, err = run(["info", "sofmax"], capsys)
    assert rc == 1 and "did you mean 'softmax'" in err


def test_info_without_a_compiler_says_what_is_missing(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``jitops info`` on a machine whose compiler is gone still describes the op, and says which
    tool is missing and how to get one."""
    monkeypatch.setenv("CXX", str(private_cache / "no-such-c++"))
    rc, out, _ = run(["info", "softmax"], capsys)
    assert rc == 0
    (line,) = [ln for ln in out.splitlines() if ln.startswith("toolchain    missing: ")]
    assert "no C++ compiler found (CXX=" in line


# ------------------------------------------------------------------ warm


def test_warm_builds_in_parallel_then_builds_nothing(
    fake, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """--jobs 2 runs two builds at once (seen from the builder, not from a stopwatch); a second warm builds nothing."""
    make, cache = fake
    specs = [make(f"cli_warm_{c}") for c in "abc"]
    in_flight: list[int] = [0]
    peak: list[int] = []
    calls: list[str] = []
    guard = threading.Lock()
    real_fake = build_mod.BUILDERS["fake"]

    def counting(job, on_line=None):  # type: ignore[no-untyped-def]
        with guard:
            calls.append(job.library)
            in_flight[0] += 1
            peak.append(in_flight[0])
        try:
            return real_fake(job, on_line)
        finally:
            with guard:
                in_flight[0] -= 1

    monkeypatch.setitem(build_mod.BUILDERS, "fake", counting)
    monkeypatch.setenv("JITOPS_FAKE_BUILD_SECONDS", "1.5")  # wide enough that two builds must meet
    rc, out, _ = run(["warm", *(s.name for s in specs), "--jobs", "2"], capsys)
    assert rc == 0, out
    assert "3 built, 0 cached" in out and len(re.findall(r"built +cli_warm_", out)) == 3
    assert sorted(calls) == sorted(s.name for s in specs)
    assert max(peak) == 2, f"--jobs 2 never had two builds in flight: {peak}"
    monkeypatch.delenv("JITOPS_FAKE_BUILD_SECONDS")
    assert len(cache_admin.entries(cache)) == 3
    calls.clear()
    rc, out, _ = run(["warm", *(s.name for s in specs)], capsys)
    assert rc == 0 and "0 built, 3 cached" in out
    assert calls == [], f"a warm cache was rebuilt: {calls}"


def test_warm_skips_cuda_without_cuda_torch_and_strict_fails(
    fake, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    import torch

    if torch.version.cuda:
        pytest.skip("this torch can build CUDA entries")
    rc, out, _ = run(["warm", "softmax", "--device", "cuda", "--arch", "8.0,9.0"], capsys)
    assert rc == 0
    skipped = [ln for ln in out.splitlines() if "skipped" in ln and "softmax" in ln]
    assert len(skipped) == 1 and "CPU-only build" in skipped[0], out
    rc, out, err = run(["warm", "softmax", "--device", "cuda", "--arch", "8.0", "--strict"], capsys)
    assert rc == 1 and "--strict" in err


def test_offline_refuses_every_command_that_writes(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    entry = build(make("cli_offline_rw"))
    archive = tmp_path / "a.tar.gz"
    assert run(["cache", "export", str(archive)], capsys)[0] == 0  # writes outside the cache only
    monkeypatch.setenv("JITOPS_OFFLINE", "1")
    for argv in (
        ["warm", "--all"],
        ["cache", "clear"],
        ["cache", "prune", "--max-size", "0"],
        ["cache", "import", str(archive)],
        ["cache", "verify", "--remove"],
    ):
        rc, _, err = run(argv, capsys)
        assert rc == 1 and "JITOPS_OFFLINE" in err, argv
    assert entry.path.exists()
    assert [run(argv, capsys)[0] for argv in (["cache", "ls"], ["cache", "verify"], ["list"])] == [
        0,
        0,
        0,
    ]


# ------------------------------------------------------------------ ls, verify, last use


def test_ls_lists_entries_with_size_and_last_use(fake, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    entry = build(make("cli_ls"))
    rc, out, _ = run(["cache", "ls"], capsys)
    assert rc == 0
    row = next(ln for ln in out.splitlines() if ln.startswith("cli_ls"))
    assert (
        entry.plan.target.name in row
        and entry.plan.key[:12] in row
        and "KiB" in row
        and "ago" in row
    )


def test_list_shows_what_cache_ls_lists(
    fake, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """A library no op here names (``jitops.load`` in another process) is listed with its targets;
    a registered library whose entries were removed is not cached, though its folders remain."""
    make, cache = fake
    user = build(fake_spec(tmp_path / "user", "cli_list_user"))  # never registered here
    gone = build(make("cli_list_gone"))
    cache_admin.remove_entry(cache, gone.path)
    assert gone.path.parent.is_dir()
    rc, out, _ = run(["list"], capsys)
    assert rc == 0
    rows = out.splitlines()
    assert any(
        "library cli_list_user" in r and r.endswith(f"cached: {user.plan.target.name}")
        for r in rows
    ), out
    assert next(r for r in rows if r.startswith("cli_list_gone")).endswith("cached: -"), out


def test_load_records_last_use_but_not_offline(fake, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    specs = [make("cli_use_a"), make("cli_use_b")]
    old = time.time() - 3600
    for spec in specs:
        e = build(spec)
        os.utime(e.path / "manifest.json", (old, old))
    before = time.time()
    loader.load_library(specs[0], "cpu")
    assert cache.last_use(build(specs[0]).path) >= before - 1
    monkeypatch.setenv("JITOPS_OFFLINE", "1")
    loader.load_library(specs[1], "cpu")
    assert abs(os.stat(build(specs[1], offline=True).path / "manifest.json").st_mtime - old) < 1


def test_verify_finds_a_flipped_byte_and_remove_removes_it(
    fake, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    good, bad = build(make("cli_ver_good")), build(make("cli_ver_bad"))
    lib = bad.path / bad.manifest.library_file
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    rc, out, err = run(["cache", "verify"], capsys)
    assert rc == 1 and "sha256" in out and "cli_ver_bad" in out and "ok      cli_ver_good" in out
    rc, out, err = run(["cache", "verify", "--remove"], capsys)
    assert rc == 0 and not bad.path.exists() and good.path.exists()


# ------------------------------------------------------------------ prune and clear


def _use_in_order(cache: Cache, entries: list) -> None:  # type: ignore[type-arg]
    for e in entries:  # the loader's own last-use record, oldest first
        time.sleep(0.02)
        cache.record_use(e.path)


def test_prune_to_a_size_cap_evicts_least_recently_used_first(
    fake, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    e = {c: build(make(f"cli_lru_{c}")) for c in "abcd"}
    _use_in_order(cache, [e["b"], e["d"], e["a"], e["c"]])
    sizes = {c: cache_admin.entry_size(x.path) for c, x in e.items()}
    cap = sizes["a"] + sizes["c"] + 100
    rc, out, _ = run(["cache", "prune", "--max-size", str(cap)], capsys)
    assert rc == 0
    removed = [ln.split()[1].split("/")[0] for ln in out.splitlines() if ln.startswith("removed ")]
    assert removed == ["cli_lru_b", "cli_lru_d"]
    left = cache_admin.entries(cache)
    assert sorted(x.library for x in left) == ["cli_lru_a", "cli_lru_c"]
    assert sum(x.size for x in left) <= cap


def test_prune_never_evicts_an_entry_whose_key_lock_is_held(
    fake, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    from jitops.store.lock import key_lock

    make, cache = fake
    e = {c: build(make(f"cli_busy_{c}")) for c in "abc"}
    _use_in_order(cache, [e["a"], e["b"], e["c"]])
    with key_lock(cache.lock_path("cli_busy_a", e["a"].plan.key), "test holds it"):
        cap = cache_admin.entry_size(e["a"].path) + cache_admin.entry_size(e["c"].path) + 100
        rc, out, _ = run(["cache", "prune", "--max-size", str(cap)], capsys)
    assert rc == 0
    assert "kept    cli_busy_a" in out and "being built" in out
    assert e["a"].path.exists() and not e["b"].path.exists() and e["c"].path.exists()


def test_prune_older_than_and_damaged_first(fake, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    old, new, broken = (
        build(make("cli_age_old")),
        build(make("cli_age_new")),
        build(make("cli_age_broken")),
    )
    past = time.time() - 10 * 86400
    os.utime(old.path / "manifest.json", (past, past))
    (broken.path / "manifest.json").write_text("{not json")
    rc, out, _ = run(["cache", "prune", "--older-than", "7d"], capsys)
    assert rc == 0
    assert not old.path.exists() and not broken.path.exists() and new.path.exists()


def test_clear_removes_only_what_jitops_owns(fake, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    entry = build(make("cli_clear"))
    mine = cache.root / "notes.txt"
    mine.write_text("user data")
    (cache.base / "README").write_text("also not jitops's")
    rc, out, _ = run(["cache", "clear"], capsys)
    assert rc == 0 and "removed 1 entries" in out
    assert not entry.path.exists() and not cache.toolchains.exists()
    assert mine.read_text() == "user data" and (cache.base / "README").exists()


# ------------------------------------------------------------------ export / import


def test_export_then_import_into_an_empty_cache_gives_hits(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    specs = [make("cli_exp_a"), make("cli_exp_b")]
    built = [build(s) for s in specs]
    archive = tmp_path / "cache.tar.gz"
    rc, out, _ = run(["cache", "export", str(archive)], capsys)
    assert rc == 0 and "exported 2 entries" in out
    other = tmp_path / "other-cache"
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(other))
    rc, out, _ = run(["cache", "import", str(archive)], capsys)
    assert rc == 0 and "2 imported" in out and "toolchain records" in out
    for spec, b in zip(specs, built):
        e = build(spec, offline=True)  # offline: a miss would raise
        assert not e.built and e.plan.key == b.plan.key and e.path.is_relative_to(other)
    rc, out, _ = run(["cache", "import", str(archive)], capsys)
    assert rc == 0 and "0 imported, 2 already present" in out


def test_require_signed_refuses_an_unsigned_archive_and_takes_a_signed_one(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """JITOPS_REQUIRE_SIGNED=1 holds for `cache import` as for bundles: unsigned entries are rejected, with the fix."""
    from tests.remote_helpers import keygen

    make, _cache = fake
    build(make("cli_req_signed"))
    monkeypatch.setenv("JITOPS_CONFIG_DIR", str(tmp_path / "empty-config"))
    unsigned = tmp_path / "unsigned.tar.gz"
    assert run(["cache", "export", str(unsigned)], capsys)[0] == 0
    monkeypatch.setenv("JITOPS_CONFIG_DIR", str(tmp_path / "config"))
    keygen(tmp_path / "config")  # this machine's key, trusted here too
    signed = tmp_path / "signed.tar.gz"
    assert run(["cache", "export", str(signed)], capsys)[0] == 0
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "other"))
    monkeypatch.setenv("JITOPS_REQUIRE_SIGNED", "1")
    rc, _, err = run(["cache", "import", str(unsigned)], capsys)
    assert (
        rc == 1
        and "it is unsigned, and JITOPS_REQUIRE_SIGNED=1" in err
        and "jitops cache keygen" in err
    ), err
    assert not list(Cache(tmp_path / "other").iter_entries())
    rc, out, _ = run(["cache", "import", str(signed)], capsys)
    assert rc == 0 and "1 imported" in out, out


def _archive(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _entry_members(
    cache: Cache, entry_path: Path, manifest: bytes | None = None
) -> list[tuple[tarfile.TarInfo, bytes]]:
    rel = entry_path.relative_to(cache.root).as_posix()
    out = []
    for f in sorted(entry_path.iterdir()):
        data = manifest if (manifest is not None and f.name == "manifest.json") else f.read_bytes()
        info = tarfile.TarInfo(f"{rel}/{f.name}")
        info.size = len(data)
        out.append((info, data))
    return out


def test_import_refuses_traversal_links_and_bad_manifests(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    e = build(make("cli_imp"))
    target = tmp_path / "fresh"
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(target))
    evil = tarfile.TarInfo("v1/entries/../../../evil.txt")
    evil.size = 4
    link = tarfile.TarInfo(f"{e.path.relative_to(cache.root).as_posix()}/libcli_imp.so")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    stray = tarfile.TarInfo("v1/entries/cli_imp/run.sh")
    stray.size = 4
    for bad, why in (
        (evil, "outside the cache"),
        (link, "link"),
        (stray, "not part of a jitops cache"),
    ):
        arc = _archive(
            tmp_path / "bad.tar.gz",
            [(bad, b"evil" if bad.isfile() else None), *_entry_members(cache, e.path)],
        )
        rc, _, err = run(["cache", "import", str(arc)], capsys)
        assert rc == 1 and why in err, err
        assert not (tmp_path / "evil.txt").exists()
        assert not list(Cache(target).iter_entries())  # refused whole: nothing published
    # A manifest whose digest does not match its library: that entry alone is rejected.
    m = Manifest.parse((e.path / "manifest.json").read_bytes())
    badsum = dataclasses.replace(m, sha256="0" * 64).to_json()  # a well-formed manifest that lies
    arc = _archive(tmp_path / "badsum.tar.gz", _entry_members(cache, e.path, badsum))
    rc, _, err = run(["cache", "import", str(arc)], capsys)
    assert rc == 1 and "rejected" in err and "sha256" in err
    # Ingredients edited without the key: the key check catches it.
    m = Manifest.parse((e.path / "manifest.json").read_bytes())
    ingredients = json.loads(json.dumps(m.ingredients))
    ingredients["cflags"].append("-DEVIL")
    badkey = dataclasses.replace(m, ingredients=ingredients).to_json()
    arc = _archive(tmp_path / "badkey.tar.gz", _entry_members(cache, e.path, badkey))
    rc, _, err = run(["cache", "import", str(arc)], capsys)
    assert rc == 1 and "do not hash to its key" in err
    assert not list(Cache(target).iter_entries())


def test_import_keeps_a_foreign_entry_but_never_loads_it(
    fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    spec = make("cli_foreign")
    e = build(spec)
    old = Manifest.parse((e.path / "manifest.json").read_bytes())
    ingredients = json.loads(json.dumps(old.ingredients))
    ingredients["torch_version"] = "1.0.0+elsewhere"
    m = dataclasses.replace(old, ingredients=ingredients, key=compute_key(ingredients))
    rel = f"v1/entries/cli_foreign/{m.target}/{m.key[:32]}"
    members = []
    for name, data in (
        ("manifest.json", m.to_json()),
        (m.library_file, (e.path / m.library_file).read_bytes()),
    ):
        info = tarfile.TarInfo(f"{rel}/{name}")
        info.size = len(data)
        members.append((info, data))
    arc = _archive(tmp_path / "foreign.tar.gz", members)
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "fresh"))
    rc, out, _ = run(["cache", "import", str(arc)], capsys)
    assert (
        rc == 0 and "1 imported" in out and "never loaded here" in out and "1.0.0+elsewhere" in out
    )
    assert len(cache_admin.entries(Cache(tmp_path / "fresh"))) == 1
    with pytest.raises(OfflineMiss, match="jitops warm"):
        build(spec, offline=True)


# ------------------------------------------------------------- no torch for help and cache commands


@pytest.mark.process
@pytest.mark.timeout(120)
def test_help_list_and_cache_commands_do_not_import_torch(tmp_path: Path) -> None:
    env = child_env(JITOPS_CACHE_DIR=str(tmp_path / "c"))
    report = run_scenario(
        "scenarios_inert.cache_commands", archive=str(tmp_path / "x.tar.gz"), env=env, timeout=100
    )
    assert report == {"rcs": [0] * 9, "torch": []}
    # And as the real command, as `python -X importtime` sees it.
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "jitops", "cache", "ls"],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0 and "0 entries" in proc.stdout
    imported = [
        ln.rsplit("|", 1)[-1].strip()
        for ln in proc.stderr.splitlines()
        if ln.startswith("import time:")
    ]
    assert "jitops.cli" in imported and not [m for m in imported if m.split(".")[0] == "torch"]
