"""``jitops.cache`` against real caches of fake builds: each function, the ``jitops cache`` command
printing the same answers, links and FIFOs in the tree, bad input, and the public modules' inert
import."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import jitops
import jitops.cache as jcache
import jitops.loader as jloader
from jitops.base.units import parse_age, parse_size
from jitops.build import entry as jentry
from jitops.cli import main
from jitops.errors import ArgumentError, ConfigError, InvalidNameError, UnknownOpError
from jitops.plan import make_plan
from jitops.store.cache import Cache
from tests.cli_helpers import fake_spec
from tests.helpers import REPO, child_env, run_scenario

DAY = 86400.0


@pytest.fixture
def fake(private_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """``build(name)``: a fake-built entry of a fresh one-source library in a private cache; its
    plan."""
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    monkeypatch.setenv("JITOPS_PROGRESS", "0")
    monkeypatch.setenv(
        "JITOPS_CONFIG_DIR", str(tmp_path / "config")
    )  # no signing key of the user's
    for var in ("JITOPS_REMOTE_CACHE", "JITOPS_REMOTE_TRUSTED_KEYS", "JITOPS_REQUIRE_SIGNED"):
        monkeypatch.delenv(var, raising=False)
    specs: dict[str, Any] = {}

    def build(name: str) -> Any:
        if name not in specs:
            specs[name] = fake_spec(tmp_path / "specs", name)
            jitops.register(specs[name], replace=True)  # undone after the test (conftest)
        plan = make_plan(specs[name], "cpu")
        jentry.ensure_entry(plan)
        return plan

    return build


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["cache", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _age(plan: Any, days: float) -> None:
    """Make ``plan``'s entry last used ``days`` ago (its manifest's mtime is its last use)."""
    when = time.time() - days * DAY
    os.utime(plan.entry / "manifest.json", (when, when))


# ------------------------------------------------------------------ reading


def test_entries_size_and_info_agree_with_ls_and_info(
    fake: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = fake("apilsa"), fake("apilsb")
    found = jcache.entries()
    assert {(e.op, e.target, e.key) for e in found} == {
        (p.spec.name, p.target.name, p.key) for p in (a, b)
    }
    for e in found:
        assert e.path.is_dir() and e.size > 0 and e.built_at is not None and not e.damaged
        assert (e.origin, e.source, e.signed_by, e.signed) == ("built", "", None, False)
    assert [e.op for e in jcache.entries(op="apilsa")] == ["apilsa"]
    with pytest.raises(AttributeError):
        found[0].size = 1  # type: ignore[misc]  # frozen records

    rc, out, _ = cli(capsys, "ls")
    assert rc == 0 and f"{len(found)} entries" in out
    for e in found:
        assert any(ln.split()[:3] == [e.op, e.target, e.key[:12]] for ln in out.splitlines()), out

    summary = jcache.info()
    assert summary.location == jcache.location() and summary.entries == 2
    assert summary.size == jcache.size() >= sum(e.size for e in found)
    assert (
        summary.total >= summary.size and dict((k, n) for k, n, _ in summary.kinds)["entries"] == 2
    )
    rc, out, _ = cli(capsys, "info")
    assert rc == 0 and f"location  {summary.location}" in out and "entries   2" in out, out
    assert "JITOPS_PCH_MAX_SIZE" in out


def test_an_unknown_op_names_close_matches_and_a_library_name_works(fake: Any) -> None:
    fake("apiname")
    with pytest.raises(UnknownOpError, match="apiname"):
        jcache.entries(op="apinamx")
    with pytest.raises(InvalidNameError):
        jcache.clear(op="../apiname")
    with pytest.raises(ArgumentError, match="`op`"):
        jcache.verify(op=3)  # type: ignore[arg-type]


# ------------------------------------------------------------------ prune and clear


def test_prune_by_age_and_by_budget_string_like_the_command(
    fake: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = fake("apiold"), fake("apinew")
    _age(old, 10)
    assert jcache.prune(max_size="5GB").removed == ()  # far under budget: nothing goes
    res = jcache.prune(older_than="7d")
    assert [e.op for e in res.removed] == ["apiold"] and res.busy == ()
    assert res.kept == jcache.size() and res.freed >= res.removed[0].size
    assert [e.op for e in jcache.entries()] == ["apinew"]

    fake("apiold")  # again, and aged again: the command removes the same one
    _age(old, 10)
    rc, out, _ = cli(capsys, "prune", "--older-than", "7d")
    assert rc == 0 and f"removed apiold/{old.target.name}/{old.key[:12]}" in out, out
    assert "apinew" not in out

    res = jcache.prune(max_size=0, older_than=timedelta(days=365))
    assert [e.op for e in res.removed] == ["apinew"] and res.kept == 0 == jcache.size()
    assert new.key == res.removed[0].key


def test_clear_one_op_then_all_like_the_command(
    fake: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = fake("apiclra"), fake("apiclrb")
    res = jcache.clear(op="apiclra")
    assert [e.op for e in res.removed] == ["apiclra"] and not a.entry.exists()
    assert [e.op for e in jcache.entries()] == ["apiclrb"]
    (log := jcache.location() / "v1" / "logs" / "x.log").parent.mkdir(parents=True, exist_ok=True)
    log.write_text("a failed build")
    assert jcache.clear(op="apiclrb").removed and log.exists()  # one op: its entries only
    fake("apiclrb")
    rc, out, _ = cli(capsys, "clear", "apiclrb")
    assert rc == 0 and f"removed apiclrb/{b.target.name}/{b.key[:12]}" in out and log.exists()
    fake("apiclrb")
    assert [e.op for e in jcache.clear().removed] == ["apiclrb"] and not log.exists()
    assert jcache.entries() == []


# ------------------------------------------------------------------ verify


def test_verify_finds_a_flipped_library_like_the_command(
    fake: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, good = fake("apivbad"), fake("apivgood")
    lib = next(p for p in bad.entry.iterdir() if p.suffix == ".so")
    os.chmod(lib, 0o644)
    data = bytearray(lib.read_bytes())
    data[-1] ^= 0xFF
    lib.write_bytes(bytes(data))
    verdicts = {v.entry.op: v for v in jcache.verify()}
    assert verdicts["apivgood"].ok and not verdicts["apivbad"].ok
    assert "sha256" in str(verdicts["apivbad"].problem) and not verdicts["apivbad"].removed
    rc, out, err = cli(capsys, "verify")
    assert rc == 1 and f"BAD     apivbad/{bad.target.name}/{bad.key[:12]}" in out
    assert f"ok      apivgood/{good.target.name}/{good.key[:12]}" in out and "1 damaged" in err
    assert [v.entry.op for v in jcache.verify(op="apivgood")] == ["apivgood"]
    removed = jcache.verify(remove=True)
    assert [v.entry.op for v in removed if v.removed] == ["apivbad"] and not bad.entry.exists()
    assert all(v.ok for v in jcache.verify())


# ------------------------------------------------------------------ archives and origins


def test_export_then_import_notes_origin_and_signer(
    fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from jitops.remote.config import RemoteSettings
    from jitops.remote.signing import keygen

    plan = fake("apiarch")
    archive = tmp_path / "a.tar.gz"
    unsigned = jcache.export(archive, ["apiarch"])
    assert not unsigned.signing_key and unsigned.signed == ()
    assert [e.key for e in unsigned.entries] == [plan.key]

    cfg = Path(os.environ["JITOPS_CONFIG_DIR"])
    _, _, public, fingerprint = keygen(RemoteSettings("file:///x", "write", None, None, str(cfg)))
    signed = jcache.export(tmp_path / "s.tar.gz")
    assert signed.signing_key and [e.key for e in signed.signed] == [plan.key]
    rc, out, _ = cli(capsys, "export", str(tmp_path / "c.tar.gz"))
    assert rc == 0 and "1 signed with your key" in out

    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "other"))
    monkeypatch.setenv("JITOPS_REMOTE_TRUSTED_KEYS", public)
    res = jcache.import_(tmp_path / "s.tar.gz")
    assert [r.key for r in res.imported] == [plan.key] and res.rejected == () == res.unsigned
    (e,) = jcache.entries()
    assert (e.origin, e.signed_by, e.signed) == ("imported", fingerprint, True)
    assert str((tmp_path / "s.tar.gz").resolve()) in e.source
    assert jcache.import_(archive).present and jcache.entries()[0].signed  # already there: kept

    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "third"))
    res = jcache.import_(archive)
    assert [r.key for r in res.unsigned] == [plan.key]
    (e,) = jcache.entries()
    assert (e.origin, e.signed_by) == ("imported", None)
    rc, out, _ = cli(capsys, "ls")
    assert rc == 0 and plan.key[:12] in out


def test_push_and_pull_through_a_file_store(
    fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jitops.remote.config import RemoteSettings
    from jitops.remote.signing import keygen

    with pytest.raises(ConfigError, match="JITOPS_REMOTE_CACHE is not set"):
        jcache.push(["apipush"])
    plan = fake("apipush")
    cfg = Path(os.environ["JITOPS_CONFIG_DIR"])
    _, _, _, fingerprint = keygen(RemoteSettings("file:///x", "write", None, None, str(cfg)))
    (tmp_path / "shared").mkdir()
    monkeypatch.setenv("JITOPS_REMOTE_CACHE", f"file://{tmp_path / 'shared'}")
    monkeypatch.setenv("JITOPS_REMOTE_CACHE_MODE", "write")
    pushed = jcache.push(["apipush"])
    assert [(t.op, t.status, t.key) for t in pushed.transfers] == [("apipush", "pushed", plan.key)]
    assert [r.key[:12] for r in jcache.remote_entries()] == [plan.key[:12]]

    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "node"))
    monkeypatch.setenv("JITOPS_OFFLINE", "1")
    with pytest.raises(ConfigError, match="JITOPS_OFFLINE"):
        jcache.pull(["apipush"])
    monkeypatch.delenv("JITOPS_OFFLINE")
    pulled = jcache.pull(["apipush"])
    assert pulled.count("fetched") == 1 and pulled.rejected == 0
    (e,) = jcache.entries()
    assert (e.key, e.origin, e.signed_by) == (plan.key, "pulled", fingerprint)
    assert jcache.push(["apipush"]).count("foreign") == 1  # never re-signed unasked
    assert jcache.pull(["apipush"]).count("present") == 1


# ------------------------------------------------------------------ links, FIFOs and bad input


@pytest.mark.timeout(120)
def test_links_and_a_fifo_in_the_cache_are_never_followed_nor_waited_on(
    fake: Any, tmp_path: Path
) -> None:
    plan = fake("apilink")
    v1 = jcache.location() / "v1"
    outside = tmp_path / "outside"
    (outside / "apilink" / plan.target.name / "0123456789ab").mkdir(parents=True)
    (outside / "keep.txt").write_text("not jitops's")
    (v1 / "entries" / "zlinked").symlink_to(outside, target_is_directory=True)
    shutil.rmtree(v1 / "logs", ignore_errors=True)
    (v1 / "logs").symlink_to(outside, target_is_directory=True)
    damaged = fake("apififo")
    manifest = damaged.entry / "manifest.json"
    manifest.unlink()
    os.mkfifo(manifest)  # a reader that opened it blocking would hang here

    found = {e.op: e for e in jcache.entries()}
    assert set(found) == {"apilink", "apififo"} and found["apififo"].damaged
    assert found["apilink"].origin == "built"
    verdicts = {v.entry.op: v for v in jcache.verify()}
    assert verdicts["apilink"].ok and "manifest" in str(verdicts["apififo"].problem)
    assert jcache.size() > 0 and jcache.info().entries == 2

    res = jcache.clear()
    assert {e.op for e in res.removed} == {"apilink", "apififo"}
    assert (outside / "keep.txt").read_text() == "not jitops's"  # a link is removed, not followed
    assert not os.path.lexists(v1 / "logs") and os.path.lexists(v1 / "entries" / "zlinked")
    assert (outside / "apilink").is_dir()


def test_an_origin_note_behind_a_link_is_not_trusted(fake: Any, tmp_path: Path) -> None:
    from jitops.remote import origin

    plan = fake("apinote")
    cache = Cache(jcache.location())
    note = cache.origin_path(plan.address)
    elsewhere = tmp_path / "origins"
    (elsewhere / note.parent.relative_to(cache.origins)).mkdir(parents=True)
    cache.origins.symlink_to(elsewhere, target_is_directory=True)
    body = {
        "kind": "imported",
        "from": "somewhere",
        "manifest": hashlib.sha256(cache.manifest_bytes(plan.entry)).hexdigest(),
        "signer": "ed25519:forged",
    }
    note.write_text(json.dumps(body))  # through the link
    assert origin.origin_of(cache, plan.address) == ("imported", "somewhere", "ed25519:forged")
    (e,) = jcache.entries()
    assert (e.origin, e.signed_by) == ("unknown", None) and "link" in e.source


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({}, "max_size= and/or older_than="),
        ({"max_size": "lots"}, r"invalid size 'lots': expected e.g. 500M"),
        ({"max_size": "5 gigs"}, "invalid size"),
        ({"max_size": -1}, "int >= 0"),
        ({"max_size": True}, "int >= 0"),
        ({"max_size": 1.5}, "int >= 0"),
        ({"older_than": "7 days"}, "invalid age '7 days'"),
        ({"older_than": float("nan")}, "seconds"),
        ({"older_than": -1}, "seconds"),
    ],
)
def test_bad_budgets_and_ages_are_refused_before_any_work(
    fake: Any, kwargs: dict[str, Any], match: str
) -> None:
    fake("apibad")
    with pytest.raises(ArgumentError, match=match):
        jcache.prune(**kwargs)
    assert [e.op for e in jcache.entries()] == ["apibad"]


def test_sizes_and_ages_read_as_the_command_reads_them() -> None:
    assert parse_size("5GB") == 5 << 30 == parse_size("5G") == parse_size(" 5gib ")
    assert parse_size("500MiB") == 500 << 20 and parse_size("1048576") == 1 << 20
    assert parse_age("30d") == 30 * DAY and parse_age("2w") == 14 * DAY
    for bad in ("", "5XB", "-1G", "1e3"):
        with pytest.raises(ValueError, match="invalid size"):
            parse_size(bad)


def test_writes_are_refused_offline_and_reads_are_not(
    fake: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake("apioff")
    monkeypatch.setenv("JITOPS_OFFLINE", "1")
    for call in (
        lambda: jcache.clear(),
        lambda: jcache.prune(max_size="1G"),
        lambda: jcache.verify(remove=True),
        lambda: jcache.import_(tmp_path / "none.tar.gz"),
    ):
        with pytest.raises(ConfigError, match="JITOPS_OFFLINE=1 forbids writing"):
            call()
    assert [e.op for e in jcache.entries()] == ["apioff"] and jcache.verify()[0].ok
    with pytest.raises(ArgumentError, match="`file`"):
        jcache.export("")


# ------------------------------------------------------------------ the command's edges


def test_a_closed_stdout_ends_ls_quietly(fake: Any) -> None:
    fake("apipipe")
    read, write = os.pipe()
    os.close(read)  # as `| head` does once it has its lines
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "jitops", "cache", "ls"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=REPO,
            env=child_env(JITOPS_CACHE_DIR=os.environ["JITOPS_CACHE_DIR"]),
        )
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (141, "")


def test_a_broken_pipe_elsewhere_is_still_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from jitops.cli import cache as cli_cache

    def broken(*_: Any) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli_cache.ACTIONS, "path", broken)
    rc, _, err = cli(capsys, "path")
    assert rc == 1 and "jitops: error: Broken pipe" in err


# ------------------------------------------------------------------ the loading module


def test_the_loading_module_is_jitops_public_names() -> None:
    for name in jloader.__all__:
        assert getattr(jloader, name) is getattr(jitops, name), name
    assert jitops.loader is jloader and jitops.cache is jcache
    assert "softmax" in jloader.list_ops()
    with pytest.raises(AttributeError):
        jloader.nothing_here  # noqa: B018
    with pytest.raises(ArgumentError, match="jobs"):
        jloader.warm("softmax", jobs=0)


def test_warm_builds_then_finds_each_entry(fake: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = fake("apiwarm")
    jcache.clear(op="apiwarm")
    first = jloader.warm("apiwarm", devices="cpu", jobs=1)
    assert [(o.task.spec.name, o.status, o.target) for o in first] == [
        ("apiwarm", "built", plan.target.name)
    ]
    assert [o.status for o in jitops.warm(["apiwarm"], devices=["cpu"])] == ["cached"]
    assert [e.key for e in jcache.entries(op="apiwarm")] == [plan.key]
    monkeypatch.setenv("JITOPS_OFFLINE", "1")
    with pytest.raises(ConfigError, match="forbids building"):
        jloader.warm("apiwarm")


@pytest.mark.process
@pytest.mark.timeout(60)
def test_public_modules_import_inert(tmp_path: Path) -> None:
    cache, state = tmp_path / "cache", tmp_path / "state"
    report = run_scenario(
        "scenarios_inert.public_modules_are_inert",
        env=child_env(JITOPS_CACHE_DIR=str(cache), JITOPS_STATE_DIR=str(state)),
        cache=str(cache),
        state=str(state),
    )
    assert report == {
        "events": [],
        "torch": False,
        "store": [],
        "remote": [],
        "loading": [],
        "platformdirs": False,
        "location": str(cache),
        "same": True,
    }
    assert not cache.exists() and not state.exists()
