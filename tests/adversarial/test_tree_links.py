"""A link where the cache layout keeps a folder is never followed by any walk of the tree (issue 28, audit defect 1).

Each case plants a symbolic link at one folder of the layout (``v1/entries``, a library's, a target's and an
entry's folder, ``v1/staging`` and a staging build folder, ``objects``, ``pch`` and a PCH's folder, ``locks``,
``toolchains``, ``logs``, ``trash``, ``origins``, ``inline``, and ``v1`` itself), pointing at a folder of the
user's files: nested folders, every file and folder older than any prune or staging age. Then every ``jitops
cache`` command and ``jitops doctor`` runs through the real command line, in a child process, and the user's
folder must be exactly as it was (same names, same bytes, nothing added) after each one; a build on that cache
must still work. On 309e589 ``clear``, ``prune`` and ``verify --remove`` deleted the user's files through the
entry-tree and staging links, and lock files were written through a ``locks`` link.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, child_env

pytestmark = pytest.mark.timeout(600)

OLD = time.time() - 90 * 86400.0  # older than `prune --older-than 30d` and the staging sweep's hour
COMMANDS = (
    ("cache", "ls"),
    ("cache", "stats"),
    ("doctor",),
    ("cache", "verify"),
    ("cache", "verify", "--remove"),
    ("cache", "prune", "--older-than", "30d"),
    ("cache", "prune", "--max-size", "1"),
    ("cache", "clear"),
    ("cache", "repair"),
)


def _env(root: Path, **more: str) -> dict[str, str]:
    return child_env(
        JITOPS_CACHE_DIR=str(root),
        JITOPS_BUILDER="fake",
        JITOPS_PROGRESS="0",
        JITOPS_REMOTE_CACHE=None,
        **more,
    )


def _jitops(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jitops", *args],
        env=_env(root),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )


def _get(root: Path) -> subprocess.CompletedProcess[str]:
    code = "import jitops, torch; op = jitops.get('softmax'); print('LOADED', op)"
    return subprocess.run(
        [sys.executable, "-c", code],
        env=_env(root),
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )


def _user_folder(where: Path) -> Path:
    """A folder of the user's: files at several depths, shaped like an entry tree and a staging folder."""
    data = where / "precious"
    for rel, body in (
        ("top.txt", b"top"),
        ("a/b/c/manifest.json", b"{}"),
        ("a/b/c/libx.so", b"\x7fELF" * 100),
        ("a/b/notes.md", b"notes"),
        ("d/e/f/g/deep.bin", os.urandom(4096)),
        ("softmax-0123.host.1.abcd/work.o", b"object"),
        ("x.lock", b"mine"),
        ("y.json", b"[1]"),
    ):
        path = data / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    for p in sorted(data.rglob("*"), reverse=True) + [data]:
        os.utime(p, (OLD, OLD), follow_symlinks=False)
    return data


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for dirpath, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), folder) + "/"] = None
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, folder)] = Path(p).read_bytes()
    return out


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache with one fake-built entry (softmax), made once: each case works on a copy."""
    root = tmp_path_factory.mktemp("template") / "cache"
    proc = _get(root)
    assert "LOADED" in proc.stdout, proc.stderr
    return root


def _entry_dir(root: Path) -> Path:
    (entry,) = (root / "v1" / "entries" / "softmax").glob("*/*")
    return entry


# where the link goes, relative to the cache root; "{target}"/"{entry}": the real entry's
PLACES = {
    "v1": "v1",
    "entries": "v1/entries",
    "library": "v1/entries/mylib",
    "target": "v1/entries/softmax/cpu-other",
    "entry": "v1/entries/softmax/{target}/0123456789abcdef0123456789abcdef",
    "real-entry": "{entry}",
    "staging": "v1/staging",
    "staging-build": "v1/staging/softmax-0123.host.1.abcd",
    "objects": "v1/objects",
    "pch": "v1/pch",
    "pch-key": "v1/pch/0123456789abcdef0123456789abcdef",
    "locks": "v1/locks",
    "toolchains": "v1/toolchains",
    "logs": "v1/logs",
    "trash": "v1/trash",
    "origins": "v1/origins",
    "inline": "v1/inline",
}


def _plant(root: Path, place: str, data: Path) -> Path:
    entry = _entry_dir(root)
    rel = PLACES[place].format(target=entry.parent.name, entry=entry.relative_to(root))
    link = root / rel
    if os.path.lexists(link):
        shutil.rmtree(link)  # the cache's own folder: the link stands in its place
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(data, target_is_directory=True)
    os.utime(link, (OLD, OLD), follow_symlinks=False)
    return link


@pytest.mark.parametrize("place", sorted(PLACES))
def test_no_command_follows_a_link_in_the_tree(place: str, template: Path, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    shutil.copytree(template, root, symlinks=True)
    data = _user_folder(tmp_path)
    before = _snapshot(data)
    _plant(root, place, data)
    for args in COMMANDS:
        proc = _jitops(root, *args)
        shown = f"`jitops {' '.join(args)}` (rc {proc.returncode})\n{proc.stdout}\n{proc.stderr}"
        assert "Traceback" not in proc.stderr, shown
        assert proc.returncode in (0, 1), shown
        assert _snapshot(data) == before, (
            f"the user's files changed through the {place} link after {shown}"
        )
    # a build (or a hit) on that cache still works, and still leaves the user's files alone
    proc = _get(root)
    assert "LOADED" in proc.stdout, proc.stderr
    assert _snapshot(data) == before, f"a build changed the user's files through the {place} link"


def test_clear_unlinks_a_link_it_owns_and_keeps_the_rest(template: Path, tmp_path: Path) -> None:
    """A link standing for an owned folder (logs/) is removed as a link by `clear`; a link in the entry tree is
    neither entered nor listed, and `repair` then removes it as a link."""
    root = tmp_path / "cache"
    shutil.copytree(template, root, symlinks=True)
    data = _user_folder(tmp_path)
    before = _snapshot(data)
    logs = _plant(root, "logs", data)
    lib = root / "v1" / "entries" / "mylib"
    lib.symlink_to(data, target_is_directory=True)
    listed = _jitops(root, "cache", "ls")
    assert "mylib" not in listed.stdout and "1 entries" in listed.stdout, listed.stdout
    assert _jitops(root, "cache", "clear").returncode == 0
    assert not os.path.lexists(logs) and os.path.islink(lib)
    assert _jitops(root, "cache", "repair").returncode == 0
    assert not os.path.lexists(lib)
    assert _snapshot(data) == before


@pytest.mark.parametrize("place", ["library", "target", "entry", "staging", "staging-build"])
@pytest.mark.parametrize(
    "command",
    [
        ("cache", "clear"),
        ("cache", "prune", "--older-than", "30d"),
        ("cache", "verify", "--remove"),
    ],
    ids=["clear", "prune", "verify-remove"],
)
def test_removing_commands_alone(
    command: tuple[str, ...], place: str, template: Path, tmp_path: Path
) -> None:
    """Each removing command on its own, on a fresh copy (the audit's reproductions: on 309e589 each of these
    removed the user's files through the entry-tree links, and clear/prune through the staging links)."""
    root = tmp_path / "cache"
    shutil.copytree(template, root, symlinks=True)
    data = _user_folder(tmp_path)
    before = _snapshot(data)
    _plant(root, place, data)
    proc = _jitops(root, *command)
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
    assert _snapshot(data) == before, (
        f"`jitops {' '.join(command)}` changed the user's files through the {place} link"
    )


# ---------------------------------------- messages never name the private staging folder (audit 16)


def test_publish_failure_names_the_entry_not_the_staging_folder(tmp_path: Path) -> None:
    from jitops.store.cache import Cache
    from jitops.errors import CacheError

    cache = Cache(tmp_path / "cache")
    staging = cache.new_staging("mylib", "ab" * 16)
    with pytest.raises(CacheError) as e:
        cache.publish(staging / "entry", "mylib", "cpu-x", "ab" * 16)  # nothing was staged there
    assert staging.name not in str(e.value) and "mylib/cpu-x key abababababab" in str(e.value), str(
        e.value
    )


def test_pch_notes_name_the_pch_not_the_staging_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from jitops.build import pch
    from jitops.store.cache import Cache

    cache = Cache(tmp_path / "cache")
    key = pch.key_of("identity", "gcc", "", ["#include <cstddef>"])
    p = pch.start(
        cache,
        key=key,
        kind="gcc",
        cxx="false",
        flags=[],
        prefix=["#include <cstddef>"],
        root=tmp_path,
    )
    assert p is not None
    subprocess.run(p.command, shell=True, check=True, timeout=60)  # `false`: no PCH made
    with caplog.at_level(logging.INFO, logger="jitops"):
        assert pch.finish(cache, p, 0.1) is None
    notes = [r.getMessage() for r in caplog.records]
    assert any(key[:12] in n for n in notes), notes
    assert not any(str(cache.staging) in n for n in notes), notes


def test_a_build_never_writes_a_pch_through_a_link(tmp_path: Path) -> None:
    """A link at v1/pch: a build makes no PCH there (no `.seen` mark, no staging rename into it), finds none
    through it, and the user's folder stays as it was."""
    from jitops.build import pch
    from jitops.store.cache import Cache

    cache = Cache(tmp_path / "cache")
    cache.ensure_base()
    data = _user_folder(tmp_path)
    key = pch.key_of("identity", "gcc", "", ["#include <cstddef>"])
    (data / key).mkdir()  # a folder of the user's that happens to carry a PCH key's name
    before = _snapshot(data)
    cache.pch.symlink_to(data, target_is_directory=True)
    assert not pch.seen_before(cache, key) and not pch.seen_before(cache, key)
    assert (
        pch.start(
            cache,
            key=key,
            kind="gcc",
            cxx="g++",
            flags=[],
            prefix=["#include <cstddef>"],
            root=tmp_path,
        )
        is None
    )
    assert pch.find(cache, key, "gcc") is None
    assert _snapshot(data) == before
