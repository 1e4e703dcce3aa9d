"""Filesystem faults: read-only caches, unusable caches, a full disk, odd paths, modes.

Read-only and full filesystems are real: a read-only bind mount and a small
tmpfs, mounted inside a private mount namespace (``unshare --mount``) so
nothing leaks onto the host even if a test dies. Where the runner may not
mount (no CAP_SYS_ADMIN), those tests skip and say why.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import run_scenario, REPO, child_env, last_json, run_py

pytestmark = pytest.mark.process

# Every audit event that writes to the filesystem or starts a process.
_AUDIT = """
import os, sys
WRITES = []
_W = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_EVENTS = {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.chmod", "os.chown", "os.utime", "os.truncate",
           "os.link", "os.symlink", "shutil.copyfile", "shutil.copymode", "shutil.copystat", "shutil.rmtree",
           "shutil.move", "subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec", "os.system", "os.startfile"}
def _hook(event, args):
    if event == "open":
        path, mode, flags = args
        if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (isinstance(flags, int) and flags & _W):
            WRITES.append((event, str(path)))
    elif event in _EVENTS:
        WRITES.append((event, str(args[0])[:200]))
def audit():
    sys.addaudithook(_hook)
"""


def _can_mount() -> str | None:
    if shutil.which("unshare") is None:
        return "`unshare` is not installed"
    probe = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
        capture_output=True, text=True,
    )
    return None if probe.returncode == 0 else f"cannot mount here ({probe.stderr.strip()})"


needs_mount = pytest.mark.skipif(_can_mount() is not None, reason=str(_can_mount()))


def run_in_mount_ns(code: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as root in a private mount namespace (mounts vanish with it)."""
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", textwrap.dedent(code)],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )
    if proc.returncode != 0:
        raise AssertionError(f"child exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc


def _warm(cache: Path, *names: str, builder: str | None = "fake") -> None:
    run_py(
        f"""
        from tests import scenarios as S
        for n in {names!r}:
            assert S.get_and_check(n)["works"]
        """,
        env=child_env(JITOPS_CACHE_DIR=str(cache), JITOPS_BUILDER=builder),
        timeout=280,
    )


@needs_mount
@pytest.mark.timeout(300)
def test_readonly_warm_cache_zero_writes(tmp_path: Path, session_cache: Path) -> None:
    """A warm cache on a read-only mount loads with zero writes, no subprocess and no warning."""
    fake = tmp_path / "fake"
    _warm(fake, "fakeadd")
    _warm(session_cache, "softmax", builder=None)
    ro_fake, ro_real = tmp_path / "ro-fake", tmp_path / "ro-real"
    ro_fake.mkdir()
    ro_real.mkdir()
    out = run_in_mount_ns(
        f"""
        import subprocess, warnings
        for src, dst in (({str(fake)!r}, {str(ro_fake)!r}), ({str(session_cache)!r}, {str(ro_real)!r})):
            subprocess.run(["mount", "--bind", src, dst], check=True)
            subprocess.run(["mount", "-o", "remount,ro,bind", dst], check=True)
        import torch, jitops
        from tests import fakelib, scenarios as S
        {textwrap.indent(_AUDIT, " " * 8).strip()}
        fakelib.register_all()
        import os
        audit()
        results = {{}}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            os.environ["JITOPS_CACHE_DIR"] = {str(ro_fake)!r}
            results["fakeadd"] = S.get_and_check("fakeadd")
            os.environ["JITOPS_CACHE_DIR"] = {str(ro_real)!r}
            del os.environ["JITOPS_BUILDER"]  # the builder is part of the key: softmax was built for real
            results["softmax"] = S.get_and_check("softmax")
        S.report({{"writes": WRITES, "warnings": [str(w.message) for w in caught], "results": results}})
        """,
        env=child_env(JITOPS_BUILDER="fake"),
    )
    r = last_json(out.stdout)
    assert r["writes"] == []
    assert r["warnings"] == []
    for name in ("fakeadd", "softmax"):
        v = r["results"][name]
        assert v["works"] and not v["built"] and v["subprocesses"] == 0, v
        assert v["entry"].startswith(str(tmp_path / "ro-"))


@needs_mount
@pytest.mark.timeout(120)
def test_readonly_cold_cache(tmp_path: Path) -> None:
    """A read-only cold cache: one warning and a private build; or CacheError with JITOPS_STRICT=1."""
    ro = tmp_path / "ro"
    ro.mkdir()
    code = f"""
        import subprocess, warnings, os
        subprocess.run(["mount", "--bind", {str(ro)!r}, {str(ro)!r}], check=True)
        subprocess.run(["mount", "-o", "remount,ro,bind", {str(ro)!r}], check=True)
        from tests import scenarios as S
        out = {{}}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out["values"] = [S.get_and_check(n) for n in ("fakeadd", "fakemul", "fakeadd")]
            except Exception as e:
                out["error"] = {{"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e)}}
        out["warnings"] = [str(w.message) for w in caught]
        out["ro_contents"] = os.listdir({str(ro)!r})
        S.report(out)
    """
    lenient = last_json(run_in_mount_ns(code, child_env(JITOPS_BUILDER="fake", JITOPS_CACHE_DIR=str(ro))).stdout)
    assert len(lenient["warnings"]) == 1, lenient["warnings"]
    assert "JITOPS_CACHE_DIR" in lenient["warnings"][0] and "fakeadd" in lenient["warnings"][0]
    assert [v["works"] for v in lenient["values"]] == [True] * 3
    assert all(not v["entry"].startswith(str(ro)) for v in lenient["values"])
    assert lenient["ro_contents"] == []
    strict = last_json(
        run_in_mount_ns(code, child_env(JITOPS_BUILDER="fake", JITOPS_CACHE_DIR=str(ro), JITOPS_STRICT="1")).stdout
    )
    err = strict["error"]
    assert err["type"] == "CacheError" and "JitopsError" in err["mro"] and "OSError" in err["mro"]
    assert "fakeadd" in err["msg"] and "Fix:" in err["msg"] and "Read-only file system" in err["msg"]


@pytest.mark.timeout(120)
def test_cache_path_is_a_file(tmp_path: Path) -> None:
    """An unusable cache (JITOPS_CACHE_DIR names a file): one warning, private build; strict: CacheError."""
    bogus = tmp_path / "not-a-dir"
    bogus.write_text("x")
    r = run_scenario("get_all_reporting_warnings", env=child_env(JITOPS_BUILDER="fake", JITOPS_CACHE_DIR=str(bogus)),
                     names=["fakeadd", "fakemul"])
    assert r["works"] == [True, True] and len(r["warnings"]) == 1
    assert bogus.read_text() == "x"
    strict = run_scenario("attempt_get", env=child_env(JITOPS_BUILDER="fake", JITOPS_CACHE_DIR=str(bogus),
                                                       JITOPS_STRICT="1"), name="fakeadd", register_fakes=True)
    assert strict["type"] == "CacheError" and "fakeadd" in strict["msg"]


@pytest.mark.timeout(120)
def test_load_inline_with_cache_path_a_file_builds_privately(tmp_path: Path) -> None:
    """load_inline, like get: an unusable cache root means one warning and a build in the private cache
    (it raised TypeError in user.inline_dir)."""
    bogus = tmp_path / "not-a-dir"
    bogus.write_text("x")
    r = run_scenario("load_inline_reporting", env=child_env(JITOPS_BUILDER="fake", JITOPS_CACHE_DIR=str(bogus)),
                     name="inline_private", source="// no C++ needed: the schema is defined from Python\n",
                     schemas=["inline_private_op(Tensor x) -> Tensor"])
    assert r["ok"], r
    assert r["ops"] == ["inline_private_op"] and not r["entry"].startswith(str(bogus))
    assert len(r["warnings"]) == 1 and "private temporary cache" in r["warnings"][0], r["warnings"]
    assert bogus.read_text() == "x"


@needs_mount
@pytest.mark.timeout(300)
def test_full_disk(tmp_path: Path) -> None:
    """A cache on a small tmpfs, filled to leave 0..96 KiB: each get() succeeds or raises a
    clear CacheError, and a failure leaves no entry and no staging behind."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    out = run_in_mount_ns(
        f"""
        import os, subprocess, shutil
        from pathlib import Path
        mnt = Path({str(mnt)!r})
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mnt)], check=True)
        from tests import scenarios as S
        S.preload()
        rows = []
        for free_kib in (0, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 64, 96):
            for p in mnt.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
            filler = mnt / "filler"
            with open(filler, "wb") as f:
                try:
                    f.write(b"x" * ((256 - free_kib) * 1024))
                except OSError:
                    pass
            cache = mnt / "cache"
            os.environ["JITOPS_CACHE_DIR"] = str(cache)
            r = S.call(S.get_and_check, "fakeadd", timeout=30)
            entries = list((cache / "v1" / "entries").glob("*/*/*")) if cache.exists() else []
            staging = list((cache / "v1" / "staging").glob("*")) if (cache / "v1" / "staging").exists() else []
            rows.append({{"free_kib": free_kib, "ok": r["ok"], "type": r.get("type"), "mro": r.get("mro"),
                         "msg": r.get("msg"), "entries": len(entries), "staging": len(staging)}})
        S.report(rows)
        """,
        env=child_env(JITOPS_BUILDER="fake"),
    )
    rows = last_json(out.stdout)
    failures = [r for r in rows if not r["ok"]]
    assert failures and any(r["ok"] for r in rows), rows  # the sweep crosses the boundary
    for r in failures:
        assert r["type"] == "CacheError" and "JitopsError" in r["mro"], r
        assert "no space left" in r["msg"] and "fakeadd" in r["msg"] and "Fix:" in r["msg"], r
        assert r["entries"] == 0 and r["staging"] == 0, r
    print("ENOSPC sweep:", [(r["free_kib"], r["ok"]) for r in rows])


@needs_mount
@pytest.mark.compile
@pytest.mark.timeout(300)
def test_full_disk_real_compiler(tmp_path: Path) -> None:
    """The real compiler runs out of space writing an object file: CacheError, nothing published."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    out = run_in_mount_ns(
        f"""
        import subprocess
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k,mode=0700", "tmpfs", {str(mnt)!r}], check=True)
        from pathlib import Path
        from tests import scenarios as S
        r = S.call(S.get_and_check, "softmax", timeout=280)
        cache = Path({str(mnt)!r}) / "c"
        r["entries"] = len(list((cache / "v1" / "entries").glob("*/*/*")))
        r["staging"] = len(list((cache / "v1" / "staging").glob("*")))
        S.report(r)
        """,
        env=child_env(JITOPS_BUILDER=None, JITOPS_CACHE_DIR=str(mnt / "c")),
    )
    r = last_json(out.stdout)
    assert r["type"] == "CacheError", r
    assert "no space left" in r["msg"] and "softmax" in r["msg"]
    assert r["entries"] == 0 and r["staging"] == 0


_ODD = "odd dir 'single' \"double\" ünïcødé ✓ $HOME `x` ;"


def _modes(root: Path) -> list[str]:
    """Every path under ``root`` whose mode is not 0700 (dirs, libraries) or 0600 (other files)."""
    wrong = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            want = 0o700 if stat.S_ISDIR(st.st_mode) or p.suffix == ".so" else 0o600
            if stat.S_IMODE(st.st_mode) != want:
                wrong.append(f"{p.relative_to(root)} {stat.S_IMODE(st.st_mode):o}")
    return wrong


@pytest.mark.timeout(120)
@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_odd_paths_and_modes_fake(tmp_path: Path, umask: int) -> None:
    cache = tmp_path / _ODD / "cache"
    out = run_py(
        f"""
        import os
        os.umask({umask})
        from tests import scenarios as S
        S.report([S.get_and_check(n) for n in ("fakeadd", "fakemul")])
        """,
        env=child_env(JITOPS_BUILDER="fake", JITOPS_CACHE_DIR=str(cache)),
    )
    assert all(v["works"] for v in last_json(out.stdout))
    assert _modes(cache) == []


@pytest.mark.compile
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_odd_paths_and_modes_real_compiler(tmp_path: Path) -> None:
    """The package itself and the cache under paths with spaces, quotes and unicode; umask 0."""
    # Known limit: a '$' in the *package* path breaks the ninja file cpp_extension writes
    # (it escapes spaces and ':' but not '$'); the cache path may hold one.
    pkg = tmp_path / "pkg dir 'single' \"double\" ünïcødé ✓ ;" / "site"
    shutil.copytree(REPO / "jitops", pkg / "jitops")
    shutil.copytree(REPO / "tests", pkg / "tests", ignore=shutil.ignore_patterns("test_*.py"))
    cache = tmp_path / _ODD / "cache"
    env = child_env(JITOPS_BUILDER=None, JITOPS_CACHE_DIR=str(cache))
    env["PYTHONPATH"] = str(pkg)
    code = """
import os
os.umask(0)
import jitops
from tests import scenarios as S
r = S.get_and_check("softmax")
r["jitops"] = jitops.__file__
S.report(r)
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=pkg, capture_output=True, text=True, timeout=290)
    assert out.returncode == 0, out.stderr
    r = last_json(out.stdout)
    assert r["works"] and r["built"] and r["jitops"].startswith(str(pkg))
    assert _modes(cache) == []
