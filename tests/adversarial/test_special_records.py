"""A FIFO, or a link to ``/dev/zero``, where a record or an entry's manifest belongs: skipped or a named
JitopsError, never a hang, a MemoryError or a traceback (audit defect 5).

A cache holds softmax (fake-built) and, beside it under the same target, an entry folder whose
``manifest.json`` is the special file. Then, in a child process bounded by a timeout and an address-space
limit (so a regression fails, and a read of ``/dev/zero`` cannot take the machine's memory): ``jitops.get``
without a compiler (``find_compatible`` reads every sibling), a frozen miss (``_why_missed`` does too),
and ``cache ls``, ``cache verify``, ``explain`` and ``doctor --offline-ready``. Every other reader of a record
in ``store/`` (the lock holder, an object's record, an archive's toolchain record, an entry's origin note, a
signature, the remote tier's manifest bytes) is asked the same way.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jitops.store.cache import Cache
from jitops.store.manifest import Address
from tests.helpers import REPO, child_env

pytestmark = pytest.mark.timeout(600)

TIMEOUT = 120  # seconds: a child that takes longer hung
ADDRESS_SPACE = 3 << 30  # bytes: torch's import needs well under 1 GiB

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
try:
    out["get"] = "ok " + repr(jitops.get("softmax"))
except JitopsError as e:
    out["get"] = "JitopsError %s: %s" % (type(e).__name__, e)
except BaseException:
    out["get"] = "RAW " + traceback.format_exc()
print("RESULT " + json.dumps(out))
"""

COMMANDS = [
    ["cache", "ls"],
    ["cache", "verify"],
    ["explain", "softmax"],
    ["doctor", "--offline-ready", "softmax"],
]


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _env(root: Path, **more: str | None) -> dict[str, str]:
    return child_env(
        JITOPS_CACHE_DIR=str(root),
        JITOPS_STATE_DIR=str(root.parent / "state"),
        JITOPS_BUILDER="fake",
        JITOPS_PROGRESS="0",
        JITOPS_REMOTE_CACHE=None,
        **{"JITOPS_FREEZE": None, **more},
    )


def _bounded(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            cwd=REPO,
            preexec_fn=_limit,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung: the child was still running after {TIMEOUT}s")


def _results(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"the child failed (rc {proc.returncode})\n{proc.stdout}\n{proc.stderr[-3000:]}"
    )
    return dict(json.loads(lines[-1][len("RESULT ") :]))


def _plant(path: Path, kind: str) -> None:
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        os.symlink("/dev/zero", path)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache with softmax fake-built."""
    root = tmp_path_factory.mktemp("special") / "cache"
    proc = subprocess.run(
        [sys.executable, "-c", "import jitops; jitops.get('softmax')"],
        env=_env(root),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    return root


def _cache_with_special(template: Path, tmp: Path, kind: str, keep_entry: bool) -> Path:
    root = tmp / "cache"
    shutil.copytree(template, root, symlinks=True)
    (manifest,) = Cache(root).entries.glob("softmax/*/*/manifest.json")
    odd = manifest.parent.parent / ("0" * len(manifest.parent.name))  # sorted first
    odd.mkdir(mode=0o700)
    _plant(odd / "manifest.json", kind)
    (odd / "libsoftmax.so").write_bytes(b"\0" * 16)
    if not keep_entry:
        shutil.rmtree(manifest.parent)
    return root


def _assert_named(results: dict[str, str]) -> None:
    raw = {k: v for k, v in results.items() if v.startswith("RAW")}
    assert not raw, "raw errors\n" + "\n".join(f"--- {k}\n{v}" for k, v in raw.items())


@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_no_compiler_get_and_commands_skip_a_special_manifest(
    kind: str, template: Path, tmp_path: Path
) -> None:
    """No compiler here (``CXX=/bin/false``): get looks for an entry equal but for the toolchain, reading each
    sibling's manifest; the commands list, verify and explain the cache. The special one is a damaged entry."""
    root = _cache_with_special(template, tmp_path, kind, keep_entry=True)
    proc = _bounded(
        [sys.executable, "-c", CHILD, json.dumps(COMMANDS)], _env(root, CXX="/bin/false")
    )
    results = _results(proc)
    _assert_named(results)
    assert results["get"].startswith("ok"), results["get"]
    assert results["cache verify"] == "rc 1", results  # the odd entry is reported as damaged


@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_frozen_miss_names_why_past_a_special_manifest(
    kind: str, template: Path, tmp_path: Path
) -> None:
    """Frozen, with nothing cached for this key: ``FrozenError`` says why, after reading each sibling's manifest."""
    root = _cache_with_special(template, tmp_path, kind, keep_entry=False)
    proc = _bounded(
        [sys.executable, "-c", CHILD, json.dumps(COMMANDS)], _env(root, JITOPS_FREEZE="error")
    )
    results = _results(proc)
    _assert_named(results)
    assert results["get"].startswith("JitopsError FrozenError"), results["get"]


READERS = r"""
import json, sys, traceback
from pathlib import Path
from jitops.base import fsutil
from jitops.store import archive, bundles, lock, objcache
from jitops.store.cache import Cache
from jitops.store.manifest import Address
from jitops.remote import origin

root, odd = Path(sys.argv[1]), Path(sys.argv[2])
cache = Cache(root)
address = Address("softmax", "cpu", "ab" * 32)
checks = {
    "fsutil.read_record": lambda: fsutil.read_record(odd / "record.json"),
    "Cache.read_manifest": lambda: cache.read_manifest(odd),
    "Cache.manifest_bytes": lambda: cache.manifest_bytes(odd),
    "lock holder": lambda: lock._holder_text(odd / "record.json"),
    "objcache record": lambda: objcache.lookup(cache, "cd" * 32, root, root / "x.o"),
    "archive toolchain record": lambda: archive._import_record(cache, "t.json", odd / "record.json"),
    "origin note": lambda: origin.installed_from(cache, address),
    "bundle signature": lambda: bundles.read_signature(odd / "record.json"),
}
out = {}
for name, fn in checks.items():
    try:
        out[name] = "ok " + repr(fn())[:200]
    except OSError as e:
        out[name] = "OSError " + str(e)
    except Exception as e:
        from jitops.errors import JitopsError
        from jitops.store.manifest import EntryProblem
        if isinstance(e, (JitopsError, EntryProblem)):
            out[name] = "named " + str(e)
        else:
            out[name] = "RAW " + traceback.format_exc()
print("RESULT " + json.dumps(out))
"""


@pytest.mark.parametrize("kind", ["fifo", "devzero"])
def test_every_store_record_reader_refuses_a_special_file(kind: str, tmp_path: Path) -> None:
    """Each reader of a record in ``store/`` given the special file: None, "unknown", a miss or a named
    problem, never a hang or a MemoryError. (``manifest_bytes`` raises OSError by contract.)"""
    root = tmp_path / "cache"
    cache = Cache(root)
    odd = tmp_path / "odd"
    odd.mkdir()
    _plant(odd / "manifest.json", kind)
    _plant(odd / "record.json", kind)
    cache.objects.mkdir(parents=True)
    _plant(cache.build_path("objects", "cd" * 32, ".json"), kind)
    note = cache.origin_path(Address("softmax", "cpu", "ab" * 32))
    note.parent.mkdir(parents=True)
    _plant(note, kind)
    proc = _bounded([sys.executable, "-c", READERS, str(root), str(odd)], child_env())
    results = _results(proc)
    _assert_named(results)
    assert results["Cache.manifest_bytes"].startswith("OSError"), results
    assert results["Cache.read_manifest"] == "ok None", results
    assert results["fsutil.read_record"] == "ok None", results
    assert results["objcache record"] == "ok None", results
    assert results["archive toolchain record"] == "ok 0", results
    assert results["lock holder"] == "ok 'holder unknown'", results
