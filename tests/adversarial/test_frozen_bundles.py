"""Frozen mode runs nothing before FrozenError, and a miss names each installed bundle it could not use and why.

Audit 2026-11-28, defects 10 and 11.

- ``JITOPS_FREEZE=error`` with a remote tier: a miss may still be answered by a fetch, but nothing that runs a
  compiler (a stable-ABI plan's link stub, the toolchain self-check) starts before the FrozenError. A child
  process counts every process it starts once its plan is made (the compiler's identity is part of planning).
- A bundle that holds the op only for another machine (another CPU ISA, another compiler) is named in the
  FrozenError, and in the ToolchainError of a machine with no compiler, with the ingredients that differ; the
  text stays short with many bundles.

Tiers: one child process per case for the frozen ordering (no build); in-process with the fake builder for
the messages, a bundle made by rewriting a fake entry's manifest for another machine (a sound entry: its key
is its ingredients').
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import jitops
import jitops.build.entry as jentry
import jitops.plan as jplan
from jitops.build import freeze as jfreeze
from jitops.errors import FrozenError, ToolchainError
from jitops.key import compute_key, namespace_for
from jitops.store import bundles
from jitops.store.cache import Cache
from jitops.store.manifest import MANIFEST, Manifest
from jitops.target import choose_target, probe
from tests.cli_helpers import fake_spec
from tests.helpers import child_env, run_scenario

# ------------------------------------------------------------------- defect 10: nothing runs before
#  FrozenError

SPAWNS = ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.system")


def frozen_get_spawns(op: str) -> dict[str, Any]:
    """Child: ``jitops.get(op)`` once its plan is made (the compiler's identity is asked in planning, a hit's
    too); the error, every process started, and whether a link stub was begun."""
    import threading

    from jitops.build import stable_fast
    from jitops.registry import lookup

    jplan.make_plan(lookup(op), "cpu")
    spawned: list[list[str]] = []

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in SPAWNS:
            argv = args[1] if event in ("subprocess.Popen", "os.posix_spawn", "os.exec") else ()
            spawned.append([event, *map(str, argv or ())])

    sys.addaudithook(hook)
    try:
        jitops.get(op, device="cpu")
        out: dict[str, Any] = {"type": None}
    except Exception as e:  # noqa: BLE001 - the test reads it
        out = {"type": type(e).__name__, "msg": str(e)}
    # a thread begun before the error (a link stub) has its chance to run
    for t in threading.enumerate():
        if t is not threading.current_thread() and t.daemon:
            t.join(30)
    return {**out, "spawned": spawned, "stubs": len(stable_fast._early) + len(stable_fast._stubs)}


@pytest.mark.process
@pytest.mark.parametrize("op", ["nms", "softmax"], ids=["stable-abi", "aten"])
def test_frozen_with_a_remote_tier_starts_no_process_before_frozen_error(
    tmp_path: Path, op: str
) -> None:
    """nms's CPU library is on the stable ABI (a link stub would begin); softmax's is not (the self-check)."""
    remote = tmp_path / "remote"
    remote.mkdir()
    env = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "cache"),
        JITOPS_STATE_DIR=str(tmp_path / "state"),
        JITOPS_CONFIG_DIR=str(tmp_path / "config"),
        JITOPS_REMOTE_CACHE=f"file://{remote}",
        JITOPS_FREEZE="error",
        JITOPS_PROGRESS="0",
        JITOPS_BUILDER=None,
    )
    out = run_scenario(
        "adversarial.test_frozen_bundles.frozen_get_spawns", env=env, timeout=240, op=op
    )
    assert out["type"] == "FrozenError" and f"'{op}'" in out["msg"], out
    assert out["spawned"] == [], f"processes started before FrozenError: {out['spawned']}"
    assert out["stubs"] == 0, "a link stub was begun for a build that frozen mode forbids"
    assert not list((tmp_path / "cache").glob("v1/entries/*/*/*"))


# ------------------------------------------------------------------- defect 11: the bundle and why,
#  named


@pytest.fixture
def frozen_victim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:  # (make(name, change, bundles=1) -> plan on an empty cache with those bundles installed)
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    monkeypatch.setenv("JITOPS_PROGRESS", "0")
    monkeypatch.delenv("JITOPS_FREEZE", raising=False)
    monkeypatch.setenv("JITOPS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("JITOPS_CONFIG_DIR", str(tmp_path / "config"))
    handles = []

    def make(name: str, change: Any, count: int = 1) -> Any:
        warm = tmp_path / "warm-cache"
        monkeypatch.setenv("JITOPS_CACHE_DIR", str(warm))
        spec = fake_spec(tmp_path / "specs", name)
        handles.append(jitops.register(spec, replace=True))
        built = jentry.ensure_entry(jplan.make_plan(spec, "cpu"))
        m = Manifest.parse((built.path / MANIFEST).read_bytes())
        ingredients = json.loads(json.dumps(m.ingredients))
        change(ingredients)
        key = compute_key(ingredients)
        other = dataclasses.replace(
            m,
            ingredients=ingredients,
            key=key,
            namespace=namespace_for(m.library, key),
            target=ingredients["target"]["name"],
        )
        found = []
        for i in range(count):
            root = tmp_path / f"bundle{i}"
            entry = Cache(root).target_dir(name, other.target) / key[:32]
            shutil.copytree(built.path, entry)
            (entry / MANIFEST).write_bytes(other.to_json())
            bundle = bundles.BundleCache(root, f"jitops_bundle_other{i} (other{i})", _unsigned)
            assert bundle.verify(entry, key, name, other.target).key == key  # a sound entry
            found.append(bundle)
        monkeypatch.setattr(bundles, "_found", found)
        # the victim: nothing cached
        monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "victim-cache"))
        return jplan.make_plan(spec, "cpu")

    yield make
    for handle in reversed(handles):
        handle.undo()
    with jfreeze._lock:
        jfreeze._api.clear()


def _unsigned(manifest: bytes, signature: Any) -> None:
    assert signature is None


def _other_isa(here: str) -> tuple[str, str]:
    """(isa, target name) of a CPU ISA other than this machine's."""
    isa = "AVX2" if here != "cpu-avx2" else "DEFAULT"
    return isa, f"cpu-{isa.lower()}"


def _as_isa(isa: str, name: str) -> Any:
    def change(ingredients: dict[str, Any]) -> None:
        ingredients["target"].update(isa=isa, name=name)

    return change


def test_frozen_error_names_a_bundle_built_for_another_isa_and_why(frozen_victim: Any) -> None:
    here = choose_target(probe(cuda=False), "cpu").name
    isa, name = _other_isa(here)
    plan = frozen_victim("frz_b_isa", _as_isa(isa, name))
    assert plan.target.name == here
    jitops.freeze()
    with pytest.raises(FrozenError) as info:
        jentry.ensure_entry(plan)
    msg = str(info.value)
    assert "jitops_bundle_other0 (other0)" in msg, msg
    assert f"target {name} here {here}" in msg, msg


def test_frozen_error_names_a_bundle_built_with_another_compiler(frozen_victim: Any) -> None:
    def clang(ingredients: dict[str, Any]) -> None:
        ingredients["compiler"].update(
            version="clang version 99.0.0", path="/usr/lib/llvm-99/bin/clang"
        )

    plan = frozen_victim("frz_b_cxx", clang)
    # this machine has a compiler: a build is what frozen mode refuses
    assert plan.toolchain_error is None
    jitops.freeze()
    with pytest.raises(FrozenError) as info:
        jentry.ensure_entry(plan)
    msg = str(info.value)
    assert "jitops_bundle_other0 (other0)" in msg and "compiler.version clang version 99" in msg, (
        msg
    )


def test_with_no_compiler_the_toolchain_error_names_the_bundle_and_why(
    frozen_victim: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = choose_target(probe(cuda=False), "cpu").name
    isa, name = _other_isa(here)

    def no_compiler(*args: Any, **kwargs: Any) -> Any:
        raise ToolchainError(
            "cannot build op 'frz_b_nocxx': no C++ compiler found. Fix: install one"
        )

    warmed = frozen_victim("frz_b_nocxx", _as_isa(isa, name))
    monkeypatch.setattr(jplan.compilers, "cxx", no_compiler)
    plan = jplan.make_plan(warmed.spec, "cpu")
    assert plan.toolchain_error is not None
    with pytest.raises(ToolchainError) as info:
        jentry.ensure_entry(plan)
    msg = str(info.value)
    assert "jitops_bundle_other0 (other0)" in msg and f"target {name} here {here}" in msg, msg
    assert msg.rstrip().endswith("install one"), msg  # the fix stays last
    # no compiler here: the toolchain is moot
    assert "compiler" not in msg.partition("differs in")[2], msg
    jitops.freeze()
    with pytest.raises(FrozenError) as frozen:
        jentry.ensure_entry(plan)
    assert "jitops_bundle_other0 (other0)" in str(frozen.value), frozen.value


def test_the_bundles_named_are_bounded(frozen_victim: Any) -> None:
    """Eight bundles, each entry differing in many ingredients: a few named, the rest counted, one short text."""

    def far(ingredients: dict[str, Any]) -> None:
        ingredients.update(torch_version="9.9.9", python_abi="cpython-399", machine="risc-v" * 30)
        ingredients["target"].update(isa="AVX2", name="cpu-avx2-far")
        ingredients["cflags"] = [f"-DFLAG{i}={'x' * 50}" for i in range(40)]

    plan = frozen_victim("frz_b_many", far, count=8)
    jitops.freeze()
    with pytest.raises(FrozenError) as info:
        jentry.ensure_entry(plan)
    msg = str(info.value)
    assert "jitops_bundle_other0 (other0)" in msg and "5 more bundles" in msg, msg
    assert "target cpu-avx2-far here" in msg and "torch_version 9.9.9 here" in msg, msg
    assert len(msg) < 2000, len(msg)
