"""Damaged records in the cache and the config dir: a named JitopsError or success, never a raw error (issue 28,
audit defect 12).

Each record jitops reads from ``v1/`` (a toolchain identity, the remote tier's counters, an entry's manifest,
an object's record, a PCH's manifest) and the config dir's ``signing.pub`` is replaced in turn by each kind of
damage (empty, a JSON list, fields of the wrong type, bytes that are not UTF-8, numbers out of range); then the
commands that read it and ``jitops.get`` (with a remote tier configured, which reads ``signing.pub``) run in a
fresh process. Any exception that is not a JitopsError is a failure (stricter than the command line, which
prints a plain ValueError or OSError as one line); a damaged rebuildable record is treated as missing (the
entry is rebuilt). A manifest is re-digested after its damage, so it passes the byte check as an imported one
would, and only the type checks of ``Manifest.parse`` stand between it and ``ls``/``export``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jitops.build import pch
from jitops.store.cache import Cache
from jitops.store.manifest import Manifest, _canonical
from tests.helpers import REPO, child_env

pytestmark = pytest.mark.timeout(600)

# What the child runs: the commands (through the CLI's own parser and functions, exceptions not
# swallowed) and get.
CHILD = r"""
import json, sys, traceback
import jitops
from jitops.cli import build_parser
from jitops.errors import JitopsError
out = {}
for argv in json.loads(sys.argv[1]):
    try:
        args = build_parser().parse_args(argv)
        out[" ".join(argv)] = "rc %s" % args.fn(args)
    except JitopsError as e:
        out[" ".join(argv)] = "JitopsError %s: %s" % (type(e).__name__, e)
    except SystemExit as e:
        out[" ".join(argv)] = "exit %s" % e.code
    except BaseException:
        out[" ".join(argv)] = "RAW " + traceback.format_exc()
if sys.argv[2] == "get":
    try:
        op = jitops.get("softmax")
        out["get"] = "ok " + repr(op)
    except JitopsError as e:
        out["get"] = "JitopsError %s: %s" % (type(e).__name__, e)
    except BaseException:
        out["get"] = "RAW " + traceback.format_exc()
print("RESULT " + json.dumps(out))
"""

DAMAGE: dict[str, bytes] = {
    "empty": b"",
    "list": b"[1, 2]",
    "wrong-types": b'{"path": 1, "version": ["x"], "hits": "many", "object": 5, "format": "1", "key": null}',
    "not-utf8": b"\xff\xfe\x00\x80 garbage \xc3",
    "huge": b'{"path": "x", "version": "1", "hits": 1e999, "misses": -1e999, "seconds": 1e400, "size": 1e999}',
    "deep": b"[" * 100000,
}


def _env(root: Path, config: Path, store: Path) -> dict[str, str]:
    return child_env(
        JITOPS_CACHE_DIR=str(root),
        JITOPS_BUILDER="fake",
        JITOPS_PROGRESS="0",
        JITOPS_CONFIG_DIR=str(config),
        JITOPS_REMOTE_CACHE=f"file://{store}",
        JITOPS_REMOTE_TRUSTED_KEYS=None,
        JITOPS_REMOTE_CACHE_MODE="read",
    )


def _child(
    root: Path, config: Path, store: Path, commands: list[list[str]], get: bool
) -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(commands), "get" if get else "-"],
        env=_env(root, config, store),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"the child failed (rc {proc.returncode})\n{proc.stdout}\n{proc.stderr}"
    )
    return dict(json.loads(lines[-1][len("RESULT ") :]))


def _assert_named(results: dict[str, str], what: str) -> None:
    raw = {k: v for k, v in results.items() if v.startswith("RAW")}
    assert not raw, f"{what}: raw errors\n" + "\n".join(f"--- {k}\n{v}" for k, v in raw.items())


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache with softmax fake-built, a key pair in the config dir, an object record, an empty file store."""
    top = tmp_path_factory.mktemp("records")
    root, config, store = top / "cache", top / "config", top / "store"
    store.mkdir()
    got = _child(root, config, store, [["cache", "keygen"]], get=True)
    assert got["get"].startswith("ok") and got["cache keygen"] == "rc 0", got
    objects = Cache(root).objects
    objects.mkdir()
    (objects / ("ab" * 16 + ".json")).write_text(json.dumps({"format": 1, "object": "cd" * 32}))
    (objects / ("cd" * 32 + ".o")).write_bytes(b"\0" * 64)
    return top


def _copy(template: Path, tmp: Path) -> tuple[Path, Path, Path]:
    shutil.copytree(template, tmp / "t", symlinks=True)
    return tmp / "t" / "cache", tmp / "t" / "config", tmp / "t" / "store"


def _only(folder: Path, pattern: str) -> Path:
    (path,) = folder.glob(pattern)
    return path


RECORDS = {  # record -> (where it is, the commands that read it, whether get reads it)
    # every toolchain record: the identity, what the driver runs, the folders it names
    "toolchain": (
        lambda r, c: sorted(Cache(r).toolchains.glob("*.json")),
        [["info", "softmax"], ["doctor"]],
        True,
    ),
    "remote-stats": (lambda r, c: Cache(r).remote_stats, [["cache", "stats"]], False),
    "object-record": (
        lambda r, c: _only(Cache(r).objects, "*.json"),
        [["cache", "ls"], ["cache", "prune", "--max-size", "1T"]],
        False,
    ),
    "manifest": (
        lambda r, c: _only(Cache(r).entries, "softmax/*/*/manifest.json"),
        [["cache", "ls"], ["cache", "verify"], ["info", "softmax"], ["explain", "softmax"]],
        True,
    ),
    "signing.pub": (lambda r, c: c / "signing.pub", [["doctor"]], True),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("record", sorted(RECORDS))
def test_damaged_record(record: str, damage: str, template: Path, tmp_path: Path) -> None:
    root, config, store = _copy(template, tmp_path)
    where, commands, get = RECORDS[record]
    found = where(root, config)
    paths = found if isinstance(found, list) else [found]
    assert paths and all(p.is_file() for p in paths), paths
    for p in paths:
        p.write_bytes(DAMAGE[damage])
    path = paths[0]
    # a miss, so that get consults the remote tier, which reads the trusted keys
    if record == "signing.pub":
        shutil.rmtree(Cache(root).entries)
    results = _child(root, config, store, commands, get)
    _assert_named(results, f"{record} replaced by {damage}")
    # a damaged rebuildable record is a missing one: get still works
    if get and record != "signing.pub":
        assert results["get"].startswith("ok"), results["get"]
    # the user's own key: a named ConfigError, never an IndexError/UnicodeDecodeError
    if record == "signing.pub":
        assert (
            results["get"].startswith("JitopsError ConfigError") and str(path) in results["get"]
        ), results["get"]


def _redigest(body: dict[str, Any]) -> bytes:
    body = {k: v for k, v in body.items() if k != "digest"}
    return _canonical({**body, "digest": hashlib.sha256(_canonical(body)).hexdigest()})


WRONG = [
    None,
    "yesterday",
    "",
    [],
    {},
    True,
    -1,
    10**30,
    1.5,
    {"files": []},
    {"files": {"a.cpp": {"seconds": "1"}}},
]


@pytest.mark.parametrize(
    "field",
    [
        "built_at",
        "build_seconds",
        "size",
        "timings",
        "ingredients",
        "key",
        "sha256",
        "library_file",
        "build_log",
        "namespace",
    ],
)
@pytest.mark.parametrize("value", WRONG, ids=[repr(v)[:20] for v in WRONG])
def test_manifest_accepted_is_printable(field: str, value: Any, template: Path) -> None:
    """Property: a manifest whose field holds any JSON value, digest recomputed, is either refused by
    ``Manifest.parse`` with ValueError or can be printed the way ``ls``, ``info`` and ``export`` print it."""
    from jitops.cli.cache import human_age
    from jitops.build.tubuild import summary

    good = _only(Cache(template / "cache").entries, "softmax/*/*/manifest.json").read_bytes()
    body = json.loads(good)
    body[field] = value
    try:
        raw = _redigest(body)
    except ValueError:
        return  # not even writable as canonical JSON
    try:
        m = Manifest.parse(raw)
    except ValueError:
        return
    human_age(1e9 - m.built_at)
    f"{m.build_seconds:.1f} {m.size:,}"
    summary(m.timings)
    assert math.isfinite(m.built_at) and not isinstance(m.built_at, bool)


def test_damaged_get_with_an_imported_bad_manifest_rebuilds(template: Path, tmp_path: Path) -> None:
    """The audit's case: an entry whose manifest has ``built_at`` null (re-digested, as an import would have
    accepted it): ls and export print it as damaged or refuse it by name, and get rebuilds it."""
    root, config, store = _copy(template, tmp_path)
    path = _only(Cache(root).entries, "softmax/*/*/manifest.json")
    body = json.loads(path.read_bytes())
    body["built_at"] = None
    path.write_bytes(_redigest(body))
    results = _child(
        root,
        config,
        store,
        [["cache", "ls"], ["cache", "export", str(tmp_path / "x.tar.gz")]],
        True,
    )
    _assert_named(results, "built_at null")
    assert results["get"].startswith("ok"), results["get"]
    assert Manifest.parse(path.read_bytes()).built_at is not None  # rebuilt in place


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_pch_manifest_is_set_aside(damage: str, tmp_path: Path) -> None:
    """A PCH whose manifest is damaged is never used: ``pch.find`` sets it aside (a miss, rebuilt), no raw error."""
    cache = Cache(tmp_path / "cache")
    key = "ef" * 32
    folder = cache.build_path("pch", key)
    folder.mkdir(parents=True, mode=0o700)
    (folder / "manifest.json").write_bytes(DAMAGE[damage])
    os.chmod(folder / "manifest.json", 0o600)
    (folder / "prefix.h").write_text("#include <cstddef>\n")
    (folder / "prefix.h.gch").write_bytes(b"garbage")
    assert pch.find(cache, key, "gcc") is None
    assert not os.path.lexists(folder)


# ------------------------------------------------------ keygen and the config dir (audit defect 14)


def _keygen(config: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = child_env(
        JITOPS_CONFIG_DIR=str(config), JITOPS_CACHE_DIR=str(tmp / "cache"), JITOPS_REMOTE_CACHE=None
    )
    return subprocess.run(
        [sys.executable, "-m", "jitops", "cache", "keygen"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_keygen_never_re_modes_a_shared_folder(tmp_path: Path) -> None:
    """JITOPS_CONFIG_DIR at an existing 1777 folder (a /tmp): left 1777, and no key is written where jitops
    would refuse it; a named error instead."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    proc = _keygen(shared, tmp_path)
    assert oct(os.lstat(shared).st_mode & 0o7777) == oct(0o1777)
    assert (
        proc.returncode == 1
        and "Traceback" not in proc.stderr
        and "JITOPS_CONFIG_DIR" in proc.stderr
    ), proc.stderr
    assert not (shared / "signing.key").exists()


def test_keygen_at_a_file_leaves_it(tmp_path: Path) -> None:
    target = tmp_path / "config-file"
    target.write_text("mine\n")
    os.chmod(target, 0o644)
    proc = _keygen(target, tmp_path)
    assert os.lstat(target).st_mode & 0o7777 == 0o644 and target.read_text() == "mine\n"
    assert (
        proc.returncode == 1 and "Traceback" not in proc.stderr and "not a directory" in proc.stderr
    ), proc.stderr


def test_keygen_makes_only_its_own_folders_private(tmp_path: Path) -> None:
    parent = tmp_path / "home"
    parent.mkdir()
    os.chmod(parent, 0o755)
    proc = _keygen(parent / "a" / "jitops", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert os.lstat(parent).st_mode & 0o7777 == 0o755  # existing: kept
    assert (
        os.lstat(parent / "a").st_mode & 0o7777
        == 0o700
        == os.lstat(parent / "a" / "jitops").st_mode & 0o7777
    )
    assert (parent / "a" / "jitops" / "signing.key").is_file()


# ------------------------------------------------------------ the PCH check (audit defect 15)

CONSTRUCTOR = '\n#include <cstdio>\n__attribute__((constructor)) static void tattle() {{ std::fopen("{}", "w"); }}\n'


def _gcc_pch(cache: Cache, root: Path) -> tuple[str, Path]:
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    key = pch.key_of("identity", "gcc", "-O0", ["#include <cstddef>"])
    p = pch.start(
        cache,
        key=key,
        kind="gcc",
        cxx="g++",
        flags=["-O0"],
        prefix=["#include <cstddef>"],
        root=root,
    )
    assert p is not None
    subprocess.run(p.command, shell=True, check=True, timeout=120)
    assert pch.finish(cache, p, 0.5) is not None
    return key, cache.build_path("pch", key)


def _compile_and_run(words: list[str], tmp: Path) -> None:
    (tmp / "main.cpp").write_text(
        "#include <cstddef>\nint main() { return sizeof(std::size_t) == 0; }\n"
    )
    cmd = f"g++ -O0 {' '.join(words)} {tmp / 'main.cpp'} -o {tmp / 'prog'} && {tmp / 'prog'}"
    subprocess.run(cmd, shell=True, check=True, timeout=120, capture_output=True)


@pytest.mark.parametrize("forgery", ["file-is-prefix.h", "honest-file-edited-header"])
def test_pch_check_covers_what_gcc_reads(forgery: str, tmp_path: Path) -> None:
    """The audit's case: a garbage .gch (gcc rejects it under -Winvalid-pch and parses prefix.h instead) beside an
    edited prefix.h whose constructor writes a marker, with a manifest made to agree (its file set to prefix.h,
    or the .gch's new size and sha256). The PCH is set aside, never used; the edited header never runs; a new
    PCH is built in its place and used."""
    cache = Cache(tmp_path / "cache")
    key, folder = _gcc_pch(cache, tmp_path)
    marker = tmp_path / "MARKER"
    with open(folder / "prefix.h", "a") as f:
        f.write(CONSTRUCTOR.format(marker))
    (folder / "prefix.h.gch").write_bytes(b"not a precompiled header")
    m = json.loads((folder / "manifest.json").read_bytes())
    forged = folder / ("prefix.h" if forgery == "file-is-prefix.h" else "prefix.h.gch")
    m.update(
        file=forged.name,
        size=forged.stat().st_size,
        sha256=hashlib.sha256(forged.read_bytes()).hexdigest(),
    )
    (folder / "manifest.json").write_text(json.dumps(m, sort_keys=True))
    use = pch.find(cache, key, "gcc")
    # what a build would compile with
    _compile_and_run(use.words if use is not None else [], tmp_path)
    assert not marker.exists(), "the edited prefix.h was compiled in"
    assert use is None and not os.path.lexists(folder)  # set aside
    key2, _ = _gcc_pch(cache, tmp_path)  # rebuilt
    use = pch.find(cache, key2, "gcc")
    assert use is not None
    _compile_and_run(use.words, tmp_path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "content", [b"", b"\xff\xfe\x00garbage", None], ids=["empty", "not-utf8", "missing"]
)
def test_keygen_show_names_a_damaged_public_key_file(tmp_path: Path, content: bytes | None) -> None:
    """`jitops cache keygen --show` on an empty, non-UTF-8 or missing signing.pub: one error line naming the file."""
    conf = tmp_path / "conf"
    conf.mkdir(mode=0o700)
    if content is not None:
        (conf / "signing.pub").write_bytes(content)
    env = {
        **os.environ,
        "JITOPS_CONFIG_DIR": str(conf),
        "JITOPS_CACHE_DIR": str(tmp_path / "cache"),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "jitops", "cache", "keygen", "--show"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    assert "signing.pub" in proc.stderr, proc.stderr
