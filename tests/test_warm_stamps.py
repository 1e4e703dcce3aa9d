"""Verified stamps (jitops/stamps.py, issue 32 item 4): a later check skips the sha256 only for the very file
that was hashed; a swapped library, a damaged or foreign stamp, or another user's state dir means a full check.

Entries come from the fake builder (no compiler). ``stamps.SETTLED`` is shortened so a test need not wait 2 s
for a library to settle; each test still waits past it, as the rule asks.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import jitops.build.entry as jentry
import jitops.plan as jplan
from jitops.base import fsutil
from jitops.store import stamps
from jitops.store.manifest import Hit, Miss
from tests.cli_helpers import fake_spec
from tests.helpers import child_env, run_scenario

SETTLE = 0.2


@pytest.fixture
def state(private_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    monkeypatch.setenv("JITOPS_PROGRESS", "0")
    monkeypatch.setenv("JITOPS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(stamps, "SETTLED", SETTLE)
    return tmp_path / "state"


def _built(tmp: Path, name: str = "stamped") -> jplan.Plan:
    plan = jplan.make_plan(fake_spec(tmp / "specs", name), "cpu")
    jentry.ensure_entry(plan)
    time.sleep(SETTLE + 0.1)  # settled: a write from now on gets another ctime
    return plan


def _library(plan: jplan.Plan) -> Path:
    found = plan.cache.lookup(plan.address)
    assert isinstance(found, Hit)
    return found.path / found.manifest.library_file


def _stamp_files(state: Path) -> list[Path]:
    return sorted((state / "verified").glob("*.json"))


def _hashes(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    seen: list[Path] = []
    real = fsutil.sha256_file
    monkeypatch.setattr(fsutil, "sha256_file", lambda p, *a: seen.append(Path(p)) or real(p, *a))
    return seen


def test_a_full_check_stamps_the_entry_and_the_next_check_skips_the_hash(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _built(tmp_path)
    lib = _library(plan)  # the full check: hashed, then stamped
    [stamp] = _stamp_files(state)
    assert json.loads(stamp.read_bytes())["stat"] == list(stamps.identity(os.lstat(lib)))
    assert stat_mode(stamp) == 0o600 and stat_mode(state / "verified") == 0o700
    hashed = _hashes(monkeypatch)
    assert isinstance(plan.cache.lookup(plan.address), Hit) and lib not in hashed
    assert isinstance(jentry.entry_status(plan), Hit) and lib not in hashed


def stat_mode(p: Path) -> int:
    return os.lstat(p).st_mode & 0o777


def test_a_fresh_library_is_not_stamped_until_it_settles(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stamps, "SETTLED", 3600.0)
    plan = jplan.make_plan(fake_spec(tmp_path / "specs", "fresh"), "cpu")
    jentry.ensure_entry(plan)
    assert isinstance(plan.cache.lookup(plan.address), Hit)
    assert _stamp_files(state) == []  # a write in the same timestamp tick could go unseen


@pytest.mark.parametrize(
    "how", ["in place, mtime restored", "renamed over, mtime restored", "truncated and rewritten"]
)
def test_a_swapped_library_under_a_stamped_entry_is_refused_and_rebuilt(
    how: str, state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _built(tmp_path)
    lib = _library(plan)
    assert len(_stamp_files(state)) == 1
    before = os.lstat(lib)
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    if how.startswith("in place"):
        with open(lib, "r+b") as f:
            f.write(data)
    elif how.startswith("renamed"):
        other = lib.with_name("swap.tmp")
        other.write_bytes(data)
        os.chmod(other, before.st_mode & 0o777)
        os.replace(other, lib)
    else:
        lib.write_bytes(b"")
        lib.write_bytes(data)
    # mtime and size as they were: only ctime/inode tell
    os.utime(lib, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.lstat(lib)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert stamps.identity(after) != stamps.identity(before)
    found = plan.cache.lookup(plan.address)
    assert isinstance(found, Miss) and "sha256" in (found.reason or "")
    assert isinstance(jentry.entry_status(plan), jentry.Damaged)
    rebuilt = jentry.ensure_entry(plan)
    assert (
        rebuilt.built
        and fsutil.sha256_file(rebuilt.path / rebuilt.manifest.library_file)
        == rebuilt.manifest.sha256
    )


DAMAGE = {
    "empty": b"",
    "not json": b"\x00\xff garbage",
    "a list": b"[1, 2]",
    "wrong types": json.dumps(
        {"v": 1, "entry": 3, "manifest": "x", "sha256": None, "stat": "all"}
    ).encode(),
    "stat of bools": None,  # filled from the real stamp: each stat number a bool
    "another stat": None,  # the real stamp with one stat number changed
    "huge": b"{" + b" " * (stamps.MAX_BYTES + 10) + b"}",
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_stamp_is_no_stamp(
    damage: str, state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _built(tmp_path)
    lib = _library(plan)
    [stamp] = _stamp_files(state)
    body = json.loads(stamp.read_bytes())
    raw = DAMAGE[damage]
    if damage == "stat of bools":
        raw = json.dumps(dict(body, stat=[True] * 5)).encode()
    elif damage == "another stat":
        raw = json.dumps(dict(body, stat=[*body["stat"][:4], body["stat"][4] + 1])).encode()
    stamp.write_bytes(raw)
    hashed = _hashes(monkeypatch)
    assert isinstance(plan.cache.lookup(plan.address), Hit)  # never an error: the full check runs
    assert hashed.count(lib) == 1
    # stamped again
    assert json.loads(stamp.read_bytes())["stat"] == list(stamps.identity(os.lstat(lib)))


@pytest.mark.parametrize(
    "how",
    [
        "stamp group-writable",
        "stamp a link",
        "stamp another user's",
        "folder another user's",
        "folder group-writable",
    ],
)
def test_a_stamp_this_user_did_not_write_alone_is_ignored(
    how: str, state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _built(tmp_path)
    lib = _library(plan)
    [stamp] = _stamp_files(state)
    if how == "stamp group-writable":
        os.chmod(stamp, 0o620)
    elif how == "stamp a link":
        real = tmp_path / "elsewhere.json"
        real.write_bytes(stamp.read_bytes())
        stamp.unlink()
        stamp.symlink_to(real)
    elif how == "stamp another user's":
        os.chown(stamp, 65534, 65534) if os.geteuid() == 0 else pytest.skip(
            "needs root to give a file away"
        )
    elif how == "folder another user's":
        os.chown(state / "verified", 65534, 65534) if os.geteuid() == 0 else pytest.skip(
            "needs root"
        )
    else:
        os.chmod(state / "verified", 0o770)
    hashed = _hashes(monkeypatch)
    assert isinstance(plan.cache.lookup(plan.address), Hit)
    assert hashed.count(lib) == 1  # the stamp proved nothing: the library was hashed
    assert isinstance(plan.cache.lookup(plan.address), Hit)
    # a stamp is written again only into a folder of this user's alone
    expect = 1 if how.startswith("stamp") else 2
    assert hashed.count(lib) == expect


def test_a_stamp_in_another_state_dir_does_not_count(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _built(tmp_path)
    lib = _library(plan)
    assert len(_stamp_files(state)) == 1
    # another user's, or another setting
    monkeypatch.setenv("JITOPS_STATE_DIR", str(tmp_path / "other-state"))
    again = jplan.make_plan(fake_spec(tmp_path / "specs", "stamped"), "cpu")
    hashed = _hashes(monkeypatch)
    assert isinstance(again.cache.lookup(again.address), Hit) and hashed.count(lib) == 1


def test_a_stamp_for_another_manifest_does_not_count(
    state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _built(tmp_path)
    lib = _library(plan)
    [stamp] = _stamp_files(state)
    body = json.loads(stamp.read_bytes())
    stamp.write_bytes(json.dumps(dict(body, manifest="0" * 64)).encode())
    hashed = _hashes(monkeypatch)
    assert isinstance(plan.cache.lookup(plan.address), Hit) and hashed.count(lib) == 1


@pytest.mark.process
@pytest.mark.timeout(120)
def test_the_stamped_warm_check_opens_no_library_and_starts_no_process(tmp_path: Path) -> None:
    env = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "cache"),
        JITOPS_STATE_DIR=str(tmp_path / "state"),
        JITOPS_BUILDER="fake",
        JITOPS_PROGRESS="0",
    )
    report = run_scenario(
        "scenarios_stamps.stamped_check", env=env, root=str(tmp_path / "specs"), name="audited"
    )
    assert report == {
        "full": {"built": False, "events": ["open"]},
        "stamped": {"built": False, "events": []},
    }


@pytest.mark.parametrize("how", ["offline", "read-only entry"])
def test_no_stamp_is_written_where_a_warm_load_promises_zero_writes(
    how: str, state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = jplan.make_plan(fake_spec(tmp_path / "specs", "quiet"), "cpu")
    entry = jentry.ensure_entry(plan)
    time.sleep(SETTLE + 0.1)
    if how == "offline":
        monkeypatch.setenv("JITOPS_OFFLINE", "1")
    else:
        os.chmod(entry.path / "manifest.json", 0o400)  # as `chmod -R a-w` leaves a cache
    again = jplan.make_plan(fake_spec(tmp_path / "specs", "quiet"), "cpu")
    assert isinstance(again.cache.lookup(again.address), Hit)
    assert _stamp_files(state) == []


def test_recorded_op_names_are_bound_to_key_library_and_namespace(tmp_path: Path) -> None:
    """A library's op names (issue 32 item 4: a warm load need not list the dispatcher) come back only for the
    same key, library sha256 and namespace, from a file this user alone wrote; anything else is none."""
    st = stamps.Stamps(lambda: tmp_path / "state")
    key, sha, ns = "a" * 64, "b" * 64, "jitops_lib_0123"
    assert st.op_names(key, sha, ns) is None
    st.record_op_names(key, sha, ns, ("scale", "scale_"))
    assert st.op_names(key, sha, ns) == ("scale", "scale_")
    st.record_op_names("c" * 64, sha, "jitops_other", ())
    # none (a pybind11 module) is an answer too
    assert st.op_names("c" * 64, sha, "jitops_other") == ()
    for other in (("d" * 64, sha, ns), (key, "d" * 64, ns), (key, sha, "jitops_lib_9999")):
        assert st.op_names(*other) is None
    [path] = [
        p for p in (tmp_path / "state" / "verified").glob("*.ops") if "scale" in p.read_text()
    ]
    body = json.loads(path.read_bytes())
    for bad in (
        dict(body, ops=["x; rm"]),
        dict(body, ops="scale"),
        dict(body, namespace="jitops_other"),
        dict(body, v=2),
    ):
        path.write_bytes(json.dumps(bad).encode())
        assert st.op_names(key, sha, ns) is None, bad
    path.write_bytes(json.dumps(body).encode())
    os.chmod(path, 0o660)
    assert st.op_names(key, sha, ns) is None  # group-writable: not this user's word alone
    offline = stamps.Stamps(lambda: tmp_path / "offline-state", write=False)
    offline.record_op_names(key, sha, ns, ("scale",))
    assert offline.op_names(key, sha, ns) is None and not (tmp_path / "offline-state").exists()
