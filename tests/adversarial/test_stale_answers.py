"""No stale answer: ``get`` inside one process after a build variable changes, and the drop-in's recall after an
include path is created or a source's bytes change without its stat.

Audit 2026-11-28, defects 8, 2 and 9.

- ``jitops.get`` in a running process plans again when a build variable its key holds (``CXXFLAGS``, ...) changes,
  as ``load`` and a fresh process do; with nothing changed (or only a CUDA variable, for a CPU op) it answers from
  its memo without planning.
- A remembered drop-in call is not recalled once an ``extra_include_paths`` folder that was missing when it was
  remembered exists: it plans, and builds the header the new folder holds.
- A source rewritten through a shared mapping (the page already dirty, so neither ctime nor mtime moves) is not
  recalled: recall checks the bytes of small sources, not their stat alone.

Tiers: in-process with the fake builder (``get``); one real torch-style pybind11 module built once for the module
(``<torch/extension.h>``, include paths ``[override, base]``), each load a fresh process
(``scenarios_dropin.warm_load``) on a private state dir, a rebuild per test after its change.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jitops
from jitops.loading import loader
from jitops.store import stamps
from tests.cli_helpers import fake_spec
from tests.helpers import child_env, run_scenario

# ------------------------------------------------------------------- defect 8: get's memo and the
#  environment


def test_get_plans_again_when_a_build_variable_changes_in_the_process(
    private_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    monkeypatch.setenv("JITOPS_PROGRESS", "0")
    for var in ("CXXFLAGS", "CFLAGS", "LDFLAGS", "TORCH_CUDA_ARCH_LIST"):
        monkeypatch.delenv(var, raising=False)
    jitops.register(fake_spec(tmp_path / "specs", "memo_env"), replace=True)
    plans: list[str] = []
    real = loader.make_plan

    def counting(*args: Any, **kwargs: Any) -> Any:
        plans.append(args[0].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(loader, "make_plan", counting)
    first = jitops.get("memo_env", device="cpu")
    assert first.library is not None and first.library.built and len(plans) == 1
    for _ in range(20):
        assert jitops.get("memo_env", device="cpu") is first
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")  # not in a CPU key
    assert jitops.get("memo_env", device="cpu") is first and len(plans) == 1

    monkeypatch.setenv("CXXFLAGS", "-DX=10")  # a notebook's cell
    second = jitops.get("memo_env", device="cpu")
    assert second.library is not None and second.library.key != first.library.key, (
        "get answered from its memo after CXXFLAGS changed"
    )
    assert second.library.built and len(plans) == 2
    assert jitops.get("memo_env", device="cpu") is second and len(plans) == 2

    monkeypatch.delenv("CXXFLAGS")  # back: the library already loaded, no build
    third = jitops.get("memo_env", device="cpu")
    assert third.library is not None and third.library.key == first.library.key
    assert len(plans) == 3 and jitops.get("memo_env", device="cpu") is third


# ------------------------------------------------------------------ defects 2 and 9: recall

SOURCE = r"""#include <torch/extension.h>
#include "cfg.h"
torch::Tensor scaled(torch::Tensor x) { return x * VALUE; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scaled", &scaled, "scaled"); }
"""
HEADER = "#pragma once\n#define VALUE {}\n"
PLANNER = {"jitops.plan", "jitops.key", "jitops.loading.loader", "jitops.api.cpp_ext_style"}


def _layout(where: Path) -> tuple[Path, Path, Path]:
    """(sources' folder, the missing ``override`` include dir, ``base`` holding cfg.h = 1)."""
    src, override, base = where / "src", where / "override", where / "base"
    src.mkdir(parents=True)
    base.mkdir()
    (src / "scaled.cpp").write_text(SOURCE)
    (base / "cfg.h").write_text(HEADER.format(1))
    return src, override, base


def _load(src: Path, includes: list[Path], cache: Path, state: Path) -> tuple[str, list[float]]:
    """One warm ``jitops.load`` in a fresh process: ("planned" | "recalled", what the module returns)."""
    reply = run_scenario(
        "scenarios_dropin.warm_load",
        loader="jitops",
        folder=str(src),
        source="scaled.cpp",
        name="stale_recall",
        includes=[str(i) for i in includes],
        env=child_env(
            JITOPS_CACHE_DIR=str(cache),
            JITOPS_STATE_DIR=str(state),
            JITOPS_PROGRESS="0",
            JITOPS_BUILDER=None,
        ),
        timeout=280,
    )
    ours = {m for m in reply["imported"] if m.startswith("jitops")}
    how = "planned" if PLANNER & ours else "recalled"
    return how, reply["value"]


def _settle() -> None:
    time.sleep(stamps.SETTLED + 0.3)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the module built once (its key holds the sources' bytes, not their folders)."""
    where = tmp_path_factory.mktemp("stale-build")
    src, override, base = _layout(where / "tree")
    how, value = _load(src, [override, base], where / "cache", where / "state")
    assert (how, value) == ("planned", [1.0, 1.0])
    return where / "cache"


def _remembered(src: Path, includes: list[Path], cache: Path, state: Path) -> None:
    """Settle, then load until the call is recalled (the first settled load stamps and remembers it)."""
    _settle()
    assert _load(src, includes, cache, state) == ("planned", [1.0, 1.0])
    assert _load(src, includes, cache, state) == ("recalled", [1.0, 1.0])


@pytest.mark.compile
@pytest.mark.timeout(900)
def test_recall_is_not_answered_once_a_missing_include_path_is_created(
    built: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(built, cache, symlinks=True)
    src, override, base = _layout(tmp_path / "tree")
    includes = [override, base]
    _remembered(src, includes, cache, tmp_path / "state")
    override.mkdir()  # earlier on the path than base: its cfg.h wins
    (override / "cfg.h").write_text(HEADER.format(2))
    assert _load(src, includes, cache, tmp_path / "state") == ("planned", [2.0, 2.0]), (
        "the call was recalled with the module of the old include path"
    )


@pytest.mark.compile
@pytest.mark.timeout(900)
def test_recall_is_not_answered_after_an_edit_of_a_file_no_walk_covers(tmp_path: Path) -> None:
    """A header reached through ``../`` with a suffix no folder walk takes: the key cannot see it, the
    entry's record of what the compiler read does, and so does a remembered call."""
    src, override, base = _layout(tmp_path / "tree")
    far = tmp_path / "tree" / "elsewhere" / "value.hh"
    far.parent.mkdir()
    far.write_text("#define VALUE 1\n")
    (base / "cfg.h").write_text('#pragma once\n#include "../elsewhere/value.hh"\n')
    includes, cache, state = [override, base], tmp_path / "cache", tmp_path / "state"
    assert _load(src, includes, cache, state) == ("planned", [1.0, 1.0])
    _remembered(src, includes, cache, state)
    far.write_text("#define VALUE 2\n")
    assert _load(src, includes, cache, state) == ("planned", [2.0, 2.0]), (
        "the call was recalled with the module built from the old header"
    )
    assert _load(src, includes, cache, state)[1] == [2.0, 2.0]


@pytest.fixture
def quiet_folder(tmp_path: Path) -> Iterator[Path]:
    """A folder where a shared mapping's dirty page stays dirty: tmpfs (/dev/shm) never writes it back; else the
    test's folder, where the kernel keeps it dirty for ~30 s (vm.dirty_expire_centisecs)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        folder = Path(tempfile.mkdtemp(prefix="jitops-mmap-", dir=shm))
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    else:
        yield tmp_path / "quiet"


@pytest.mark.compile
@pytest.mark.timeout(900)
def test_recall_is_not_answered_after_a_write_through_a_shared_mapping(
    built: Path, tmp_path: Path, quiet_folder: Path
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(built, cache, symlinks=True)
    src, override, base = _layout(quiet_folder)
    includes = [override, base]
    header = base / "cfg.h"
    fd = os.open(header, os.O_RDWR)
    try:
        with mmap.mmap(fd, 0) as page:
            at = page.find(b"VALUE 1") + len("VALUE ")
            page[at : at + 1] = (
                b"1"  # the page dirty now, its times moved now: before the call is remembered
            )
            _remembered(src, includes, cache, tmp_path / "state")
            before = os.stat(header)
            page[at : at + 1] = b"2"
            after = os.stat(header)
    finally:
        os.close(fd)
    assert header.read_text() == HEADER.format(2)
    if (before.st_ctime_ns, before.st_mtime_ns) != (after.st_ctime_ns, after.st_mtime_ns):
        pytest.skip("the page was written back meanwhile: the write moved the file's times")
    assert _load(src, includes, cache, tmp_path / "state") == ("planned", [2.0, 2.0]), (
        "the call was recalled with the module built from the header's old bytes"
    )
