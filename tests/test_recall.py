"""The drop-in's recall (jitops/loading/recall.py, issue 32 item 4): a warm torch-style load in a fresh process
loads without planning only while every fact its plan read still holds; any change plans again, and an edit
is built.

One real module (``<torch/extension.h>``, a pybind11 module with an include path), built once, and one rebuild at
the end; every load is a fresh process (``scenarios_dropin.warm_load``) on a private cache and state dir. A load
planned when ``jitops.plan`` is among the modules it imported; recalled when neither the planner, the key nor the
drop-in's build code is.
Records and libraries settle for ``stamps.SETTLED`` (2 s) before they may be recalled, so the test waits that long.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import types
from pathlib import Path
from typing import Any

import pytest

from jitops.store import stamps
from tests.helpers import child_env, run_scenario

SOURCE = r"""#include <torch/extension.h>
#include "scale.h"
torch::Tensor scaled(torch::Tensor x) { return x * SCALE; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scaled", &scaled, "scaled"); }
"""
PLANNER = {
    "jitops.plan",
    "jitops.key",
    "jitops.loading.loader",
    "jitops.build.entry",
    "jitops.api.cpp_ext_style",
    "jitops.api.user",
}


def _settle() -> None:
    time.sleep(stamps.SETTLED + 0.2)


def _records(state: Path) -> list[Path]:
    return sorted((state / "verified").glob("*.hit"))


@pytest.mark.compile
@pytest.mark.timeout(900)
def test_a_warm_load_is_recalled_without_planning_and_any_change_plans_again(
    tmp_path: Path,
) -> None:
    src, inc, state = tmp_path / "src", tmp_path / "inc", tmp_path / "state"
    src.mkdir(), inc.mkdir()
    (src / "scaled.cpp").write_text(SOURCE)
    (inc / "scale.h").write_text("#pragma once\n#define SCALE 3\n")
    env = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "cache"), JITOPS_STATE_DIR=str(state), JITOPS_PROGRESS="0"
    )

    def warm(**extra: str) -> tuple[str, dict[str, Any]]:
        reply = run_scenario(
            "scenarios_dropin.warm_load",
            loader="jitops",
            folder=str(src),
            source="scaled.cpp",
            name="recalled",
            includes=[str(inc)],
            env={**env, **extra},
            timeout=600,
        )
        ours = {m for m in reply["imported"] if m.startswith("jitops")}
        how = "planned" if "jitops.plan" in ours else "recalled"
        assert how == "planned" or not PLANNER & ours, reply
        return how, reply

    how, reply = warm()  # the build
    assert (how, reply["value"]) == ("planned", [3.0, 3.0]) and reply["spawned"], reply
    _settle()
    how, reply = warm()  # hashes the settled library, stamps it, remembers the request
    assert (how, reply["value"], reply["spawned"]) == ("planned", [3.0, 3.0], []), reply
    assert len(_records(state)) == 1
    record = _records(state)[0]  # this request's (a request of other settings gets its own)
    how, reply = warm()
    assert (how, reply["value"], reply["spawned"]) == ("recalled", [3.0, 3.0], []), reply

    # Each change below plans again (the same key: nothing is built), and the next process recalls
    # once settled.
    entry_lib = next((tmp_path / "cache").rglob("*.so"))

    # the same bytes in another file: its identity is not the one a stamp vouched for
    def swap_library() -> None:
        shutil.copy2(entry_lib, entry_lib.with_suffix(".tmp"))
        os.replace(entry_lib.with_suffix(".tmp"), entry_lib)

    changes: list[tuple[str, Any]] = [
        (
            "the header rewritten with the same bytes",
            lambda: (inc / "scale.h").write_text("#pragma once\n#define SCALE 3\n"),
        ),
        ("a file added beside the source", lambda: (src / "notes.txt").write_text("not a source")),
        ("the library swapped for a copy", swap_library),
        ("a setting changed", None),
    ]
    for what, change in changes:
        extra = {"JITOPS_LOCK_TIMEOUT": "30"} if change is None else {}
        if change is not None:
            change()
        how, reply = warm(**extra)
        assert (how, reply["value"], reply["spawned"]) == ("planned", [3.0, 3.0], []), (what, reply)
        _settle()
        # remembers again (a swapped library: after this process hashed and stamped it)
        warm(**extra)
        how, reply = warm(**extra)
        assert (how, reply["value"]) == ("recalled", [3.0, 3.0]), (what, reply)

    # A record this user did not write alone, or one that is not a record, is none: the load plans.
    body = record.read_text()
    record.chmod(0o666)
    assert warm()[0] == "planned"
    record.chmod(0o600)
    assert warm()[0] == "recalled"
    record.write_text(json.dumps({**json.loads(body), "paths": "everything"}))
    assert warm()[0] == "planned"

    # An edit is built, whatever was recalled before.
    _settle()
    assert warm()[0] == "recalled"
    (inc / "scale.h").write_text("#pragma once\n#define SCALE 5\n")
    how, reply = warm()
    assert (how, reply["value"]) == ("planned", [5.0, 5.0]) and reply["spawned"], reply


INLINE = r"""
torch::Tensor scaled(torch::Tensor x) { return x * 7; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("scaled", &scaled, "scaled"); }
"""


@pytest.mark.compile
@pytest.mark.timeout(600)
def test_a_warm_load_inline_is_recalled_and_gives_one_module_per_process(tmp_path: Path) -> None:
    """load_inline's sources are its arguments: the same strings are recalled (the module torch would return, with
    ``.ops``, the same object on each call in a process)."""
    env = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "cache"),
        JITOPS_STATE_DIR=str(tmp_path / "state"),
        JITOPS_PROGRESS="0",
    )

    def twice(source: str = INLINE) -> dict[str, Any]:
        return run_scenario(
            "scenarios_dropin.inline_twice",
            source=source,
            name="inline_recalled",
            env=env,
            timeout=500,
        )

    assert twice()["planned"]  # the build
    _settle()
    assert twice()["planned"]  # hashes, stamps, remembers
    reply = twice()
    assert reply == {"planned": False, "same": True, "value": [7.0, 7.0], "ops": True}, reply


def _request(tmp_path: Path) -> Any:
    from jitops.base.settings import Settings
    from jitops.loading import recall

    settings = Settings.from_env(
        {"JITOPS_STATE_DIR": str(tmp_path / "state"), "JITOPS_CACHE_DIR": str(tmp_path / "cache")}
    )
    req = recall.request("jitops.load", {"name": "x", "sources": ["x.cpp"]}, settings)
    assert req is not None
    return req


@pytest.mark.parametrize(
    "damage",
    [
        "not json",
        "[]",
        '{"v": 1}',
        "paths-short",
        "paths-not-ids",
        "ids-floats",
        "other-request",
        "library-gone",
    ],
)
def test_a_damaged_or_stale_record_is_no_record(damage: str, tmp_path: Path) -> None:
    """Anything odd in a record (its JSON, its fields, another request's digest, a library that is not there) makes
    the call plan: recall answers None and raises nothing."""
    from jitops.loading import recall

    req = _request(tmp_path)
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"x")
    good = {
        "v": recall.FORMAT,
        "request": req.digest,
        "key": "k" * 64,
        "namespace": "ns",
        "module": "m",
        "manifest_path": str(tmp_path / "manifest.json"),
        "manifest": "0" * 64,
        "library_path": str(lib),
        "library": list(stamps.identity(os.stat(lib))),
        "command": "/bin/true",
        "compiler": "/bin/true",
        "compiler_identity": [0, 0, 0, 0, 0],
        "paths": [],
    }
    bodies = {
        "paths-short": {**good, "paths": [["only a path"]]},
        "paths-not-ids": {**good, "paths": [["/", "x"]]},
        "ids-floats": {**good, "library": [1.0, 2, 3, 4, 5]},
        "other-request": {**good, "request": "0" * 64},
        "library-gone": {**good, "library_path": str(tmp_path / "gone.so")},
    }
    folder = tmp_path / "state" / "verified"
    folder.mkdir(parents=True, mode=0o700)
    (tmp_path / "state").chmod(0o700)
    raw = damage if damage not in bodies else json.dumps(bodies[damage])
    path = folder / (req.digest[:32] + recall.SUFFIX)
    path.write_text(raw)
    path.chmod(0o600)
    assert recall.recall(req) is None
    if damage in bodies:  # read as a record: refused for what it says, not for how it was stored
        assert req.stamps.recalled(path.name, recall.MAX_BYTES) == bodies[damage]


FACTS = [
    "a-pair-short",
    "compiler-switched",
    "compiler-replaced",
    "source-changed",
    "path-unreadable",
    "include-dir-created",
    "include-dir-unreadable",
    "assembler-elsewhere",
    "bytes-changed",
    "bytes-unreadable",
    "manifest-changed",
    "manifest-gone",
    "library-replaced",
]


@pytest.mark.parametrize("fact", [None, *FACTS])
def test_a_record_is_recalled_only_while_every_fact_holds(
    fact: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A well-formed record whose facts all hold answers with the module its namespace loaded in
    this process; one fact that no longer holds (a compiler, a source's identity or bytes, an
    include path that now exists, the assembler PATH finds, the manifest, the library) and recall
    answers None: the call plans. A fact that cannot be read is one that does not hold."""
    from jitops.loading import recall

    req = _request(tmp_path)
    source, manifest, lib = tmp_path / "x.cpp", tmp_path / "manifest.json", tmp_path / "lib.so"
    source.write_text("// the source\n")
    manifest.write_bytes(b'{"a manifest": 1}')
    lib.write_bytes(b"a library")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)  # stat fails with ELOOP, not "no such file"
    found = recall._compiler(req.system)
    assert found is not None, "a C++ compiler on PATH"
    command, compiler = found
    assembler = shutil.which("as")
    assert assembler is not None

    def ident(p: Path | str) -> list[int]:
        return list(stamps.identity(os.stat(p)))

    good = {
        "v": recall.FORMAT,
        "request": req.digest,
        "key": "k" * 64,
        "namespace": f"recall_test_{tmp_path.name}",
        "module": "m",
        "manifest_path": str(manifest),
        "manifest": stamps.manifest_digest(manifest.read_bytes()),
        "library_path": str(lib),
        "library": ident(lib),
        "command": command,
        "compiler": compiler,
        "compiler_identity": ident(compiler),
        "paths": [[str(source), ident(source)]],
        "absent": [str(tmp_path / "include")],
        "digests": [[str(source), hashlib.sha256(source.read_bytes()).hexdigest()]],
        "lookups": [["as", assembler]],
    }
    other = tmp_path / "other"
    other.write_text("x")
    body = dict(good)
    if fact == "a-pair-short":  # read, but not a record of this format
        body["lookups"] = [["as"]]
    elif fact == "compiler-switched":
        body["command"] = "/usr/bin/another-c++"
    elif fact == "compiler-replaced":
        body["compiler_identity"] = ident(other)
    elif fact == "source-changed":
        body["paths"] = [[str(source), ident(other)]]
    elif fact == "path-unreadable":
        body["paths"] = [[str(loop), ident(source)]]
    elif fact == "include-dir-created":
        (tmp_path / "include").mkdir()
    elif fact == "include-dir-unreadable":
        body["absent"] = [str(loop)]
    elif fact == "assembler-elsewhere":
        body["lookups"] = [["as", str(other)]]
    elif fact == "bytes-changed":
        body["digests"] = [[str(source), "0" * 64]]
    elif fact == "bytes-unreadable":
        body["digests"] = [[str(tmp_path / "gone.cpp"), good["digests"][0][1]]]
    elif fact == "manifest-changed":
        body["manifest"] = "0" * 64
    elif fact == "manifest-gone":
        body["manifest_path"] = str(tmp_path / "gone.json")
    elif fact == "library-replaced":
        body["library"] = ident(other)
    folder = tmp_path / "state" / "verified"
    folder.mkdir(parents=True, mode=0o700)
    (tmp_path / "state").chmod(0o700)
    path = folder / (req.digest[:32] + recall.SUFFIX)
    path.write_text(json.dumps(body))
    path.chmod(0o600)
    loaded = types.ModuleType("m")  # the module this process loaded for the namespace
    monkeypatch.setitem(recall.MODULES, good["namespace"], loaded)
    assert recall.recall(req) is (loaded if fact is None else None)


class _Reached(Exception):
    """Raised where the proof first reads the loaded library: every check before it held."""


class _LibraryNotRead:
    @property
    def manifest(self) -> Any:
        raise _Reached


class _Library:
    """The loaded library as far as the proof reads it before its seal (a stand-in: a real one
    needs a build, which the compile tests above make)."""

    def __init__(self, inputs: dict[str, str] | None, entry: Path) -> None:
        self.manifest = types.SimpleNamespace(inputs=inputs)
        self.entry = entry


PROOF_REFUSALS = [
    "a folder not settled",
    "too many folders",
    "a source not stamped by the plan",
    "a source written since",
    "another compiler",
    "the compiler's programs unknown",
    "what the build read unknown",
    "what the build read not sealed",
]


@pytest.mark.parametrize("refusal", [None, *PROOF_REFUSALS])
def test_a_call_is_remembered_only_from_settled_facts_its_plan_took(
    refusal: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a remembered call is proven from must be what its plan read, settled: a folder that
    changed within the settle time, a tree too big to walk, a source the plan did not stamp or that
    was written since, another compiler than the plan's, or programs the compiler's driver runs
    that this process does not know, and nothing is remembered (the call plans next time). The
    plan is a real one (a copy of the softmax op's sources, a CPU plan with the real compiler)."""
    import dataclasses

    from jitops.base.settings import Settings
    from jitops.kernels import BUILTINS
    from jitops.loading import recall
    from jitops.plan import make_plan
    from jitops.target import toolchain

    softmax = next(s for s in BUILTINS if s.name == "softmax")
    root = Path(shutil.copytree(softmax.root, tmp_path / "softmax"))
    spec = dataclasses.replace(softmax, root=root)
    settings = Settings.from_env({"JITOPS_CACHE_DIR": str(tmp_path / "cache")})
    plan = make_plan(spec, "cpu", settings=settings)
    assert plan.compiler is not None
    req = _request(tmp_path)
    monkeypatch.setattr(recall, "SETTLED", 0)  # no waiting: what was just written counts as settled
    if refusal == "a folder not settled":
        monkeypatch.setattr(recall, "SETTLED", 3600)
    elif refusal == "too many folders":
        monkeypatch.setattr(recall, "MAX_FOLDERS", 1)
    elif refusal == "a source not stamped by the plan":
        plan = dataclasses.replace(plan, stamps=plan.stamps[1:])
    elif refusal == "a source written since":
        source = root / spec.cpu_sources[0]
        source.write_bytes(source.read_bytes())  # the same bytes, written again
    elif refusal == "another compiler":
        other = dataclasses.replace(plan.compiler, command="/usr/bin/another-c++")
        plan = dataclasses.replace(plan, compiler=other)
    elif refusal == "the compiler's programs unknown":
        monkeypatch.setattr(toolchain, "_asked", {})
    lib: Any = _LibraryNotRead()
    if refusal == "what the build read unknown":  # an entry from before inputs were recorded
        lib = _Library(None, tmp_path / "entry")
    elif refusal == "what the build read not sealed":  # no proof by bytes has sealed them yet
        lib = _Library({}, tmp_path / "entry")
    if refusal is None:
        with pytest.raises(_Reached):
            recall._proof(req, plan, lib, "m")
    else:
        assert recall._proof(req, plan, lib, "m") is None


@pytest.mark.parametrize("marker", ["STABLE_TORCH_LIBRARY", "JITOPS_LIBRARY"])
def test_sources_that_load_as_a_user_library_look_up_no_record(
    marker: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stable-ABI or jitops-style source loads as a UserLibrary, which is never remembered: its warm load makes no
    request (no digest, no state-dir lookup); a torch-style source does."""
    from jitops.api import dropin
    from jitops.base.settings import Settings
    from jitops.loading import recall

    asked: list[str] = []
    monkeypatch.setattr(recall, "request", lambda func, args, settings: asked.append(func))
    args = {"verbose": False, "is_python_module": True, "abi": None, "schemas": None}
    settings = Settings.from_env({"JITOPS_STATE_DIR": str(tmp_path)})
    text = f"{marker}(JITOPS_NS, m) {{ }}"
    assert dropin._recalled("jitops.load_inline", args, settings, None, False, ["// a", text]) == (
        None,
        None,
    )
    assert asked == []
    dropin._recalled(
        "jitops.load_inline",
        args,
        settings,
        None,
        False,
        ["PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}"],
    )
    assert asked == ["jitops.load_inline"]
