"""A link at ``v1/objects``, ``v1/logs`` or ``v1/inline`` pointing at a user's folder is never written through
during a build (audit defect 7).

The user's folder must be exactly as it was after: a real stable-ABI ``load_inline`` build (its sources in
``inline/``, its background PCH's log in ``logs/``) and a failing one (its kept log), with all three folders
links; the links are healed on a build's way (with a warning) and the builds succeed or fail as they would.
Each writer also refuses a link at its folder on its own (one planted after the cache was healed): an
object is then not cached, a log not kept, the background PCH runs without a log; none of it fails a build.
A file holding data where a rebuildable folder belongs is left alone and costs only that cache.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jitops.base import fsutil
from jitops.build import pch_bg, runner
from jitops.store import inputs, objcache
from jitops.store.cache import Cache
from tests.helpers import REPO, child_env
from tests.scenarios_stable import KERNEL

pytestmark = pytest.mark.timeout(600)


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for dirpath, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), folder) + "/"] = None
        for f in files:
            out[os.path.relpath(os.path.join(dirpath, f), folder)] = Path(dirpath, f).read_bytes()
    return out


def _user_folder(tmp: Path) -> Path:
    mine = tmp / "mine"
    (mine / "notes").mkdir(parents=True)
    (mine / "notes" / "a.txt").write_text("the user's\n")
    return mine


CHILD = r"""
import json, sys
import jitops
from jitops.build import pch_bg
from jitops.errors import BuildError
kernel, failing = sys.argv[1], sys.argv[2]
out = {}
lib = jitops.load_inline("lkdemo", kernel)
import torch
out["value"] = lib.scale(torch.ones(2), 3.0).tolist()
try:
    jitops.load_inline("lkfail", failing)
    out["fail"] = "built"
except BuildError as e:
    out["fail"] = "BuildError"
    out["fail_log"] = str(e.log_path)
pch_bg.wait(120)
print("RESULT " + json.dumps(out))
"""


@pytest.mark.compile
def test_a_real_build_never_writes_through_links_at_objects_logs_inline(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    mine = _user_folder(tmp_path)
    before = _snapshot(mine)
    base = Cache(root).base
    base.mkdir(parents=True, mode=0o700)
    for name in ("objects", "logs", "inline"):
        os.symlink(mine, base / name)
    failing = KERNEL.replace("using torch::stable::Tensor;", '#error "fails on purpose"\n', 1)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, KERNEL, failing],
        env=child_env(
            JITOPS_CACHE_DIR=str(root),
            JITOPS_STATE_DIR=str(tmp_path / "state"),
            JITOPS_PROGRESS="0",
            JITOPS_REMOTE_CACHE=None,
        ),
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"{proc.stdout}\n{proc.stderr[-3000:]}"
    got = json.loads(lines[-1][len("RESULT ") :])
    assert got["value"] == [3.0, 3.0] and got["fail"] == "BuildError", got
    assert _snapshot(mine) == before, "written through a link at v1/objects, logs or inline"
    for name in ("objects", "logs", "inline"):
        assert not os.path.islink(base / name), f"the link at v1/{name} was left in place"
    assert "removed a symbolic link" in proc.stderr, proc.stderr[-2000:]


@pytest.fixture
def linked(tmp_path: Path) -> tuple[Cache, Path, dict[str, bytes | None]]:
    """A cache whose ``objects`` and ``logs`` folders are links to a user's folder (planted after any heal)."""
    cache = Cache(tmp_path / "cache")
    cache.base.mkdir(parents=True, mode=0o700)
    mine = _user_folder(tmp_path)
    for d in (cache.objects, cache.logs, cache.folders["inline"]):
        os.symlink(mine, d)
    return cache, mine, _snapshot(mine)


def test_objcache_store_refuses_a_link_at_objects(
    linked: tuple[Cache, Path, dict[str, bytes | None]], tmp_path: Path
) -> None:
    cache, mine, before = linked
    obj = tmp_path / "k.o"
    obj.write_bytes(b"\x7fELF object")
    (tmp_path / "k.cpp").write_text("int k;\n")
    read = inputs.record([str(tmp_path / "k.cpp")], tmp_path, ())
    objcache.store(cache, "ab" * 32, obj, read)  # best effort: never raises
    assert _snapshot(mine) == before
    assert objcache.lookup(cache, "ab" * 32, tmp_path, tmp_path / "again.o") is None


def test_kept_log_refuses_a_link_at_logs(
    linked: tuple[Cache, Path, dict[str, bytes | None]],
) -> None:
    cache, mine, before = linked
    assert runner._keep_log(cache.log_file("lib", "cpu"), "the build's output\n") is None
    assert _snapshot(mine) == before


def test_background_pch_runs_without_a_log_behind_a_link(
    linked: tuple[Cache, Path, dict[str, bytes | None]],
) -> None:
    cache, mine, before = linked
    # a spec the child cannot use: it exits at once, and only where its output goes matters here
    pids = pch_bg.spawn(cache, {"cd" * 32: {}}, child_env(), 1 << 30)
    assert pch_bg.wait(60)
    assert len(pids) == 1
    assert _snapshot(mine) == before


def test_inline_sources_are_never_written_through_a_link(
    linked: tuple[Cache, Path, dict[str, bytes | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from jitops.api import user

    cache, mine, before = linked
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(cache.root))
    folder = user.inline_dir("lkdemo", {"lkdemo.cpp": "int x;\n"})
    assert _snapshot(mine) == before
    assert folder.parent == cache.folders["inline"] and fsutil.is_real_dir(folder.parent)
    assert (folder / "lkdemo.cpp").read_text() == "int x;\n"


def test_data_where_a_rebuildable_folder_belongs_costs_only_that_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file holding data at ``objects`` or ``logs``: left in place with a warning, the build's way still opens."""
    cache = Cache(tmp_path / "cache")
    cache.base.mkdir(parents=True, mode=0o700)
    for d in (cache.objects, cache.logs):
        d.write_text("the user's data\n")
    with caplog.at_level(logging.WARNING, logger="jitops"):
        cache.ensure_base()
    for d in (cache.objects, cache.logs):
        assert d.read_text() == "the user's data\n"
        assert str(d) in caplog.text
    assert fsutil.is_real_dir(cache.staging)
    assert runner._keep_log(cache.log_file("lib", "cpu"), "out\n") is None


def test_data_where_inline_belongs_is_a_named_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file holding data at ``inline``: load_inline's sources are not written, and the error names the fix."""
    from jitops.api import user
    from jitops.errors import CacheError

    cache = Cache(tmp_path / "cache")
    cache.base.mkdir(parents=True, mode=0o700)
    cache.folders["inline"].write_text("the user's data\n")
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(cache.root))
    with pytest.raises(CacheError, match="jitops cache repair"):
        user.inline_dir("lkdemo", {"lkdemo.cpp": "int x;\n"})
    assert cache.folders["inline"].read_text() == "the user's data\n"
