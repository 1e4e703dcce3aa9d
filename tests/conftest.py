"""Shared fixtures, and the fast tier.

Marks (see docs/contributing.md): pure tests need no compiler; ``compile`` tests
build real kernels into one session-wide cache, each op at most once per
session; ``process`` tests run scenarios in subprocesses with hard timeouts;
``cuda`` tests need a GPU and are skipped without one.

Tiers: a bare ``python -m pytest`` runs the fast tier, an allow-list in
tests/tiers.py; ``--full`` runs everything (what CI runs, on two pytest-xdist workers: ``-n 2 --dist loadfile``,
sharing one session cache); ``--tier versions`` is CI's selection for its other torch versions. Naming test paths,
``-m`` or ``-k`` also selects from everything. A test that is not
allow-listed (every new file, e.g. tests/adversarial/) is full-only, and the
run's summary says how many were left to ``--full``.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import tiers

# One cache for the whole session, resolved before anything imports jitops's loader: every compile
# test shares it, so each op is built once. Never import this module from a test (shared helpers
# live in tests/helpers.py): a second import would make a second cache. A run started in the
# background by a shell without job control (`nohup pytest ... &`) inherits SIGINT ignored, and so
# would every child: the tests that interrupt a build with SIGINT (a user's Ctrl-C) would see it
# ignored. A handler, unlike SIG_IGN, is reset to the default at exec: children get Ctrl-C as a
# user's process does.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# With pytest-xdist (``-n N``: CI), the controller makes the folders and its workers (started with
# its environment) share them: one cache for every worker, so each op is still built once (jitops's
# own lock makes a second worker wait for the first's build, as two processes of a user's would).
_WORKER = "PYTEST_XDIST_WORKER" in os.environ


def _session_dir(var: str, prefix: str) -> str:
    path = os.environ.get(var) if _WORKER else None
    if not path:
        path = tempfile.mkdtemp(prefix=prefix)
        os.environ[var] = path
    return path


_SESSION_CACHE = os.environ.get("JITOPS_TEST_CACHE_DIR") or _session_dir(
    "_JITOPS_TEST_SESSION_CACHE", "jitops-test-cache-"
)
os.environ["JITOPS_CACHE_DIR"] = _SESSION_CACHE
# The state dir (toolchain self-check verdicts) is the session's too: no test reads or writes the
# real home's.
_SESSION_STATE = _session_dir("_JITOPS_TEST_SESSION_STATE", "jitops-test-state-")
os.environ["JITOPS_STATE_DIR"] = _SESSION_STATE
# torch.compile's on-disk caches, private to the session too: a compiled graph from another run,
# checkout or torch (same op names, same graph code) is never what a test gets back.
_SESSION_INDUCTOR = _session_dir("_JITOPS_TEST_SESSION_INDUCTOR", "jitops-test-inductor-")
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", _SESSION_INDUCTOR)
# Background PCHs start even beside the other workers' compiles: tests that wait for one must get
# it; test_pch_background checks that contended CPUs defer one, with busy programs of its own.
os.environ["JITOPS_PCH_PRESSURE"] = "1"
for _var in (
    "JITOPS_OFFLINE",
    "JITOPS_FALLBACK",
    "JITOPS_BUILDER",
    "JITOPS_STRICT",
    "JITOPS_LOCK_TIMEOUT",
    "JITOPS_FREEZE",
):
    os.environ.pop(_var, None)


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--full",
        action="store_true",
        default=False,
        help="run the whole suite (what CI runs); without it a bare run is the fast tier "
        "(docs/contributing.md)",
    )
    parser.addoption(
        "--tier",
        choices=("fast", "versions", "full"),
        default=None,
        help="fast: the bare run's; versions: the fast tier, every pure test and the builtin ops' parity "
        "tests (CI's other torch versions); full: as --full",
    )


def _tier(config: pytest.Config) -> str:
    """``--tier`` if given; else the bare command (no --full, no test paths, no -m, no -k) is the fast tier."""
    named = config.args_source == pytest.Config.ArgsSource.ARGS
    if config.getoption("--tier"):
        return str(config.getoption("--tier"))
    full = (
        config.getoption("--full")
        or named
        or config.getoption("markexpr")
        or config.getoption("keyword")
    )
    return "full" if full else "fast"


def _select_fast_tier(config: pytest.Config, items: list[pytest.Item], tier: str) -> None:
    named = config.args_source == pytest.Config.ArgsSource.ARGS or config.getoption("ignore")
    # a named subset lacks the others
    stale = [] if named else tiers.stale([i.nodeid for i in items])
    if stale:  # a renamed test must not drop out of the fast tier unnoticed
        raise pytest.UsageError(f"tests/tiers.py FAST_TESTS names tests that do not exist: {stale}")
    chosen = tiers.in_versions_tier if tier == "versions" else tiers.is_fast
    fast = {i.nodeid for i in items if chosen(i.nodeid, {m.name for m in i.iter_markers()})}
    keep = [i for i in items if i.nodeid in fast]
    left = [i for i in items if i.nodeid not in fast]
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = keep
    config.stash[_LEFT] = (tier, len(left))


_LEFT = pytest.StashKey[tuple[str, int]]()


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    tier, left = config.stash.get(_LEFT, ("", 0))
    if left:
        terminalreporter.write_line(
            f"{tier} tier: {left} more tests run with `python -m pytest --full` (what CI runs)"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tier = _tier(config)
    if tier != "full":
        _select_fast_tier(config, items, tier)
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        # The marker, not item.keywords: keywords also hold directory names (a checkout named
        # "cuda").
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """CI's ``--dist loadfile`` hands out the longest files first (tests/xdist_order.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.xdist_order import LongFilesFirst

    return LongFilesFirst(config, log)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    import sys

    # background PCH builds this process started: none outlives the run, and no test is left to
    # use their PCHs
    if "jitops.build.pch_bg" in sys.modules:
        from tests.helpers import stop_background_pchs

        stop_background_pchs(sys.modules["jitops.build.pch_bg"], 60)
    if _WORKER:  # the controller removes the shared folders once every worker has finished
        return
    if not os.environ.get("JITOPS_TEST_CACHE_DIR"):
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)
    shutil.rmtree(_SESSION_INDUCTOR, ignore_errors=True)
    shutil.rmtree(_SESSION_STATE, ignore_errors=True)


@pytest.fixture(scope="session")
def session_cache() -> Path:
    """The session-wide cache root that compile tests share."""
    return Path(_SESSION_CACHE)


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty cache root for one test (for subprocess scenarios)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(root))
    return root


@pytest.fixture(autouse=True)
def _undo_registrations() -> Iterator[None]:
    """Whatever a test registers is taken back after it: the registry is as the test found it."""
    from jitops.registry import REGISTRY, registry

    registry()  # the builtins are part of the registry as every test finds it
    before = {s.name: s for s in REGISTRY.specs()}
    yield
    for spec in REGISTRY.specs():
        if before.get(spec.name) is not spec:
            REGISTRY.remove(spec.name)
    for spec in before.values():
        if REGISTRY.get_library(spec.name) is not spec:
            REGISTRY.add(spec, replace=True)
