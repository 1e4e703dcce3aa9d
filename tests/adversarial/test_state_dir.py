"""A state dir that jitops must not use (``JITOPS_STATE_DIR`` a link, a shared 0777 folder): nothing is made or
written in it, and the reason is logged once per process at INFO (audit defect 12).

Stamps, the drop-in's recall records, op names, signatures, discovered bundles and self-check verdicts
are each refused there, as documented; before, their writers made ``verified/`` or ``selfcheck/`` first and
checked after, so an empty folder appeared in the link's target or the shared root, and nothing said why
recall and stamps stayed off.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jitops.store import stamps as stamps_mod
from jitops.store import verdicts
from jitops.store.stamps import Stamps
from tests.helpers import REPO, child_env

pytestmark = pytest.mark.timeout(600)

MESSAGE = "not using the state dir"


def _bad_state(tmp: Path, kind: str) -> tuple[Path, Path]:
    """(the state root jitops is given, the folder that must stay empty)."""
    target = tmp / "mine"
    target.mkdir()
    if kind == "link":
        os.symlink(target, tmp / "state")
        return tmp / "state", target
    os.chmod(target, 0o777)
    return target, target


def _write_everything(root: Path, lib: Path) -> None:
    st = Stamps(lambda: root)
    st.record(lib.parent, b"{}", "ab" * 32, os.lstat(lib), lib)
    st.remember("x.hit", {"v": 1}, 256)
    st.record_op_names("k" * 64, "ab" * 32, "ns", ("op",))
    st.record_signature(b"{}", "signer", "sig")
    st.record_discovery([1, ["a"]], [])
    verdicts.write(root, "ident", ok=True, detail="", compiler="c++", seconds=1.0)
    with verdicts.probing(root, "ident", 5.0):
        pass
    assert st.vouches(lib.parent, b"{}", "ab" * 32, os.lstat(lib)) is False
    assert verdicts.read(root, "ident") is None


@pytest.mark.parametrize("kind", ["link", "shared"])
def test_nothing_is_made_in_a_state_dir_jitops_refuses(
    kind: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stamps_mod, "SETTLED", 0.0)  # a library just written may be stamped
    root, target = _bad_state(tmp_path, kind)
    lib = tmp_path / "entry" / "lib.so"
    lib.parent.mkdir()
    lib.write_bytes(b"\0" * 8)
    monkeypatch.setattr(stamps_mod, "_told", set(), raising=False)  # told nothing yet
    with caplog.at_level(logging.INFO, logger="jitops"):
        _write_everything(root, lib)
        _write_everything(root, lib)
    assert sorted(os.listdir(target)) == [], f"made in the refused state dir {target}"
    told = [r for r in caplog.records if MESSAGE in r.getMessage()]
    assert len(told) == 1 and told[0].levelno == logging.INFO, [r.getMessage() for r in told]
    assert str(root) in told[0].getMessage()


def test_a_good_state_dir_is_still_made_and_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: an absent state root is made (0700) and stamps go there."""
    monkeypatch.setattr(stamps_mod, "SETTLED", 0.0)
    root = tmp_path / "state"
    lib = tmp_path / "entry" / "lib.so"
    lib.parent.mkdir()
    lib.write_bytes(b"\0" * 8)
    st = Stamps(lambda: root)
    st.record(lib.parent, b"{}", "ab" * 32, os.lstat(lib), lib)
    assert st.vouches(lib.parent, b"{}", "ab" * 32, os.lstat(lib))
    assert oct(os.lstat(root).st_mode & 0o777) == oct(0o700)


CHILD = r"""
import logging, sys
logging.basicConfig(level=logging.INFO, format="LOG %(levelname)s %(message)s")
import jitops
for _ in range(2):
    jitops.get("softmax")
print("RESULT ok")
"""


def test_get_never_writes_through_a_linked_state_dir(tmp_path: Path) -> None:
    """End to end: gets in a process whose JITOPS_STATE_DIR is a link (fake builder) write nothing through it,
    and say why once."""
    root, target = _bad_state(tmp_path, "link")
    env = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "cache"),
        JITOPS_STATE_DIR=str(root),
        JITOPS_BUILDER="fake",
        JITOPS_PROGRESS="0",
        JITOPS_REMOTE_CACHE=None,
    )
    for _ in range(2):  # the second process finds a settled entry to stamp
        proc = subprocess.run(
            [sys.executable, "-c", CHILD],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
        assert proc.returncode == 0 and "RESULT ok" in proc.stdout, proc.stderr[-3000:]
        time.sleep(2.5)
    assert sorted(os.listdir(target)) == [], f"written through the link: {os.listdir(target)}"
    assert proc.stderr.count(MESSAGE) == 1, proc.stderr[-3000:]
