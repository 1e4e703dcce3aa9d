"""base.userdirs answers as the installed platformdirs does, without importing it on Linux's common case."""

from __future__ import annotations

import sys

import platformdirs
import pytest

from jitops.base import userdirs
from jitops.base.settings import Settings
from tests.helpers import run_scenario

KINDS = ("cache", "state", "config")
VARS = {"cache": "XDG_CACHE_HOME", "state": "XDG_STATE_HOME", "config": "XDG_CONFIG_HOME"}


@pytest.mark.parametrize("xdg", ["absolute", "relative", "empty", "unset", "trailing slash"])
@pytest.mark.parametrize("home", ["/home/someone", "/root/", "relative/home", "unset"])
@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_is_platformdirs_answer(
    kind: str, home: str, xdg: str, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    var = VARS[kind]
    values = {
        "absolute": "/srv/xdg-dir",
        "relative": "xdg/rel",
        "empty": "",
        "trailing slash": "/srv/xdg/",
    }
    if xdg == "unset":
        monkeypatch.delenv(var, raising=False)
    else:
        monkeypatch.setenv(var, values[xdg])
    if home == "unset":
        monkeypatch.delenv("HOME", raising=False)
    else:
        monkeypatch.setenv("HOME", home)
    expected = getattr(platformdirs, f"user_{kind}_dir")("jitops", appauthor=False)
    assert userdirs.user_dir(kind) == expected


def test_settings_roots_use_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/srv/state")
    monkeypatch.setenv("XDG_CACHE_HOME", "/srv/cache")
    assert str(Settings.from_env({}).state_root()) == "/srv/state/jitops"
    assert str(Settings.from_env({}).cache_root()) == "/srv/cache/jitops"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fast path is Linux's")
def test_the_roots_import_no_platformdirs_on_linux() -> None:
    report = run_scenario(
        "scenarios_inert.user_roots", env={"HOME": "/home/u", "PATH": "/usr/bin:/bin"}, timeout=60
    )
    assert report == {
        "cache": "/home/u/.cache/jitops",
        "state": "/home/u/.local/state/jitops",
        "platformdirs": False,
    }
