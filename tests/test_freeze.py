"""Frozen mode (issue 31): no build after warm-up, and ``jitops doctor --offline-ready``.

In-process with the fake builder (a tiny real library from ``cc``), each test in its own cache; every op
library has a name of its own, so the loader's per-process memo never answers for another test's.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jitops
import jitops.build.entry as jentry
import jitops.plan as jplan
from jitops.api import dropin
from jitops.base.settings import VARIABLES, Settings
from jitops.build import freeze as jfreeze
from jitops.build import runner as build_mod
from jitops.cli import main
from jitops.errors import (
    ArgumentError,
    ConfigError,
    FrozenBuildWarning,
    FrozenError,
    JitopsError,
    ToolchainError,
)
from jitops.spec import OpSpec
from jitops.store import admin as cache_admin
from jitops.store.cache import Cache
from tests.cli_helpers import fake_spec
from tests.helpers import run_scenario
from tests.remote_helpers import keygen, node_env

USER_KERNEL = r"""#include <jitops/op.h>
#include <ATen/core/Tensor.h>
at::Tensor NAME(const at::Tensor& x) { return x; }
JITOPS_LIBRARY(m) { m.def("NAME(Tensor x) -> Tensor"); }
JITOPS_LIBRARY_IMPL(CPU, m) { m.impl("NAME", &NAME); }
"""


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    """No test leaves the process frozen, nor its warn-once memory behind."""
    yield
    with jfreeze._lock:
        jfreeze._api.clear()
        jfreeze._warned.clear()


@pytest.fixture
def fake(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[tuple[Any, Cache, list[str]]]:
    """(make(name) -> registered fake-built spec, the test's Cache, the libraries the fake builder was asked for)."""
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    monkeypatch.setenv("JITOPS_PROGRESS", "0")
    monkeypatch.delenv("JITOPS_FREEZE", raising=False)
    calls: list[str] = []
    real_fake = build_mod.BUILDERS["fake"]

    def counting(job, on_line=None):  # type: ignore[no-untyped-def]
        calls.append(job.library)
        return real_fake(job, on_line)

    monkeypatch.setitem(build_mod.BUILDERS, "fake", counting)
    handles = []

    def make(name: str) -> OpSpec:
        spec = fake_spec(tmp_path / "specs", name)
        handles.append(jitops.register(spec, replace=True))
        return spec

    yield make, Cache(private_cache), calls
    for handle in reversed(handles):
        handle.undo()


def key12(spec: OpSpec) -> str:
    return jplan.make_plan(spec, "cpu").key[:12]


# ------------------------------------------------------------------ error mode


def test_error_mode_refuses_a_miss_naming_op_key_cache_why_and_fix_and_builds_nothing(
    fake, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    make, cache, calls = fake
    spec = make("frz_err")
    monkeypatch.setenv("JITOPS_FREEZE", "error")
    with pytest.raises(FrozenError) as info:
        jitops.get("frz_err", device="cpu")
    msg = str(info.value)
    assert isinstance(info.value, JitopsError) and isinstance(info.value, RuntimeError)
    assert "'frz_err'" in msg and key12(spec) in msg and str(cache.root) in msg, msg
    assert "JITOPS_FREEZE=error" in msg and "no entry: nothing is cached for 'frz_err'" in msg, msg
    assert (
        "`jitops warm frz_err`" in msg and "jitops.unfreeze()" in msg and "Nothing was built" in msg
    ), msg
    assert calls == [] and cache_admin.entries(cache) == []


def test_a_hit_still_loads_in_error_mode(fake) -> None:  # type: ignore[no-untyped-def]
    make, cache, calls = fake
    spec = make("frz_hit")
    jentry.ensure_entry(jplan.make_plan(spec, "cpu"))  # warm-up
    assert calls == ["frz_hit"]
    jitops.freeze()
    op = jitops.get("frz_hit", device="cpu")
    assert op.library is not None and op.library.built is False
    assert calls == ["frz_hit"] and len(cache_admin.entries(cache)) == 1


def test_a_damaged_entry_is_named_as_the_reason(fake) -> None:  # type: ignore[no-untyped-def]
    make, cache, calls = fake
    spec = make("frz_dmg")
    entry = jentry.ensure_entry(jplan.make_plan(spec, "cpu"))
    lib = entry.path / entry.manifest.library_file
    data = bytearray(lib.read_bytes())
    data[len(data) // 2] ^= 0xFF
    lib.write_bytes(bytes(data))
    jitops.freeze("error")
    with pytest.raises(FrozenError, match="its entry is damaged .*sha256"):
        jitops.get("frz_dmg", device="cpu")
    assert calls == ["frz_dmg"] and lib.read_bytes() == bytes(data)  # not set aside, not rebuilt


def test_another_compiler_is_named_as_the_reason(fake, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """An entry equal in every ingredient but the compiler's identity (g++ upgraded in place): 'the toolchain differs'."""
    make, cache, calls = fake
    spec = make("frz_tool")
    warmed = jentry.ensure_entry(jplan.make_plan(spec, "cpu"))
    real_cxx = jplan.compilers.cxx
    monkeypatch.setattr(
        jplan.compilers,
        "cxx",
        lambda *a, **k: dataclasses.replace(real_cxx(*a, **k), version="g++ 99.1"),
    )
    jitops.freeze()
    with pytest.raises(FrozenError) as info:
        jentry.ensure_entry(jplan.make_plan(spec, "cpu"))
    assert f"the toolchain differs: {warmed.path} was built with " in str(info.value)
    assert "this machine has g++ 99.1" in str(info.value) and calls == ["frz_tool"]


def test_other_keys_and_a_missing_compiler_are_named_as_the_reason(
    fake, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """An edited source (the cached entry has another key), then no compiler at all: FrozenError, not ToolchainError."""
    make, cache, calls = fake
    spec = make("frz_keys")
    jentry.ensure_entry(jplan.make_plan(spec, "cpu"))
    (spec.root / "k.cpp").write_text("// frz_keys, edited after warm-up\n")
    jitops.freeze()
    with pytest.raises(
        FrozenError,
        match="no entry has this key: the 1 cached for 'frz_keys' differ in sources"
        r".*`jitops explain frz_keys`",
    ):
        jentry.ensure_entry(jplan.make_plan(spec, "cpu"))

    def no_compiler(*args: Any, **kwargs: Any) -> Any:
        raise ToolchainError("cannot build op 'frz_keys': no C++ compiler found. Fix: install one")

    monkeypatch.setattr(jplan.compilers, "cxx", no_compiler)
    with pytest.raises(
        FrozenError,
        match=r"and this machine has no compiler to build with \(cannot build op 'frz_keys': "
        r"no C\+\+ compiler found\)\. Nothing was built",
    ):
        jentry.ensure_entry(jplan.make_plan(spec, "cpu"))
    jitops.freeze("warn")
    # warn mode would build, and cannot: the usual
    with (
        warnings.catch_warnings(),
        pytest.raises(ToolchainError),
    ):
        warnings.simplefilter("error", FrozenBuildWarning)  # error, and no warning
        jentry.ensure_entry(jplan.make_plan(spec, "cpu"))
    assert calls == ["frz_keys"]


def test_load_load_inline_the_drop_in_and_warm_all_refuse(
    fake,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
    capsys: pytest.CaptureFixture[str],
) -> None:
    make, cache, calls = fake
    monkeypatch.setenv("JITOPS_FREEZE", "error")
    src = tmp_path / "frz_file.cpp"
    src.write_text(USER_KERNEL.replace("NAME", "frz_file"))
    with pytest.raises(FrozenError, match="'frz_file'"):
        jitops.load("frz_file", [str(src)])
    with pytest.raises(FrozenError, match="'frz_inline'.*call the same jitops.load / load_inline"):
        jitops.load_inline("frz_inline", USER_KERNEL.replace("NAME", "frz_inline"))
    with pytest.raises(FrozenError, match="'frz_dropin'"):  # torch's style: pybind11 functions
        dropin.load_inline("frz_dropin", "int answer() { return 42; }", functions=["answer"])
    make("frz_warm")
    assert main(["warm", "frz_warm"]) == 1
    out, err = capsys.readouterr()
    assert "1 failed" in out and "forbids building" in out + err
    assert calls == [] and cache_admin.entries(cache) == []


def test_fallback_gives_the_reference_instead_of_a_build(fake, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """JITOPS_FALLBACK / fallback=True: a frozen miss is an op that cannot be built here, so the reference answers."""
    make, cache, calls = fake
    folder = tmp_path / "fakeadd_frozen"
    folder.mkdir()
    (folder / "k.cpp").write_text("// a fakeadd of this test's own (own key)\n")
    jitops.register(
        OpSpec(
            name="fakeadd",
            root=folder,
            cpu_sources=("k.cpp",),
            schemas=("fakeadd(Tensor x) -> Tensor",),
            python="tests.fakelib",
        ),
        replace=True,
    )
    jitops.freeze()
    with pytest.warns(
        RuntimeWarning, match="pure-PyTorch reference for op 'fakeadd'.*forbids building"
    ):
        op = jitops.get("fakeadd", device="cpu", fallback=True)
    import torch

    assert op.library is None and torch.equal(op(torch.zeros(2)), torch.ones(2)) and calls == []


# ------------------------------------------------------------------ warn mode


def test_warn_mode_builds_and_warns_once_per_op_library(
    fake, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    make, cache, calls = fake
    spec, other = make("frz_warn"), make("frz_warn_b")
    monkeypatch.setenv("JITOPS_FREEZE", "warn")
    with warnings.catch_warnings(record=True) as caught:
        # Python's once-per-location filter must not be what dedupes
        warnings.simplefilter("always")
        jitops.get("frz_warn", device="cpu")
        jitops.get("frz_warn", device="cpu")  # a hit: no build, no warning
        (spec.root / "k.cpp").write_text("// frz_warn, edited: a second miss of the same library\n")
        second = jentry.ensure_entry(jplan.make_plan(spec, "cpu"))
    assert second.built and calls == ["frz_warn", "frz_warn"]
    frozen = [w for w in caught if issubclass(w.category, FrozenBuildWarning)]
    assert len(frozen) == 1, [str(w.message) for w in caught]
    assert "JITOPS_FREEZE=warn: building op library 'frz_warn'" in str(frozen[0].message)
    assert "no entry: nothing is cached" in str(
        frozen[0].message
    ) and "`jitops warm frz_warn`" in str(frozen[0].message)
    with pytest.warns(FrozenBuildWarning, match="'frz_warn_b'"):  # another library warns on its own
        jitops.get("frz_warn_b", device="cpu")
    assert calls == ["frz_warn", "frz_warn", "frz_warn_b"] and len(cache_admin.entries(cache)) == 3
    assert other.name == "frz_warn_b"


# ------------------------------------------------------------------ the setting and the API


def test_the_setting_parses_and_a_bad_value_is_a_config_error_naming_it(
    fake, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    make, _, calls = fake
    assert "JITOPS_FREEZE" in VARIABLES
    assert [
        Settings.from_env({"JITOPS_FREEZE": v}).freeze for v in ("error", " WARN ", "0", "off", "")
    ] == ["error", "warn", None, None, None]
    assert Settings.from_env({}).freeze is None
    for bad in ("1", "on", "errors", "raise"):
        with pytest.raises(
            ConfigError,
            match=rf"JITOPS_FREEZE='{bad}' is not a freeze mode.*Fix: set JITOPS_FREEZE=error",
        ):
            Settings.from_env({"JITOPS_FREEZE": bad})
    make("frz_bad")
    monkeypatch.setenv("JITOPS_FREEZE", "yes")
    # at the public entry point, before anything is built
    with pytest.raises(ConfigError, match="JITOPS_FREEZE"):
        jitops.get("frz_bad", device="cpu")
    assert calls == []


def test_the_api_wins_over_the_setting(fake, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    make, cache, calls = fake
    for name in ("frz_api_a", "frz_api_b", "frz_api_c"):
        make(name)
    jitops.freeze()  # no JITOPS_FREEZE: the API alone
    with pytest.raises(FrozenError, match=r"jitops.freeze\('error'\) forbids building"):
        jitops.get("frz_api_a", device="cpu")
    monkeypatch.setenv("JITOPS_FREEZE", "error")
    jitops.unfreeze()  # wins over the variable
    jitops.get("frz_api_a", device="cpu")
    jitops.freeze("warn")
    with pytest.warns(FrozenBuildWarning, match=r"jitops.freeze\('warn'\)"):
        jitops.get("frz_api_b", device="cpu")
    jfreeze._api.clear()  # back to the variable alone
    with pytest.raises(FrozenError, match="JITOPS_FREEZE=error"):
        jitops.get("frz_api_c", device="cpu")
    assert calls == ["frz_api_a", "frz_api_b"]
    for bad in ("loud", None, 1):
        with pytest.raises(ArgumentError, match="jitops.freeze: mode must be one of"):
            jitops.freeze(bad)  # type: ignore[arg-type]
    assert {"freeze", "unfreeze", "FrozenError", "FrozenBuildWarning"} <= set(jitops.__all__)


@pytest.mark.process
def test_a_remote_hit_loads_in_error_mode_and_a_remote_miss_refuses(tmp_path: Path) -> None:
    """The remote tier's fetch builds nothing, so frozen mode allows it; a miss there still builds nothing."""
    cfg = tmp_path / "cfg"
    keygen(cfg)
    (tmp_path / "shared").mkdir()
    url = f"file://{tmp_path / 'shared'}"
    a = run_scenario("get_and_check", name="fakeadd", env=node_env(tmp_path / "a", url, cfg))
    assert a["built"] and a["works"], a
    frozen = node_env(tmp_path / "b", url, cfg, JITOPS_FREEZE="error")
    b = run_scenario("get_and_check", name="fakeadd", env=frozen)
    assert b.get("built") is False and b["works"] and b["sha256"] == a["sha256"], b
    c = run_scenario("get_and_check", name="fakemul", env=frozen)
    assert c["type"] == "FrozenError" and "'fakemul'" in c["msg"] and "no entry" in c["msg"], c
    shared = tmp_path / "shared" / "v1"
    assert not list((shared / "entries").glob("fakemul/*/*")) and not list(
        (tmp_path / "b").glob("v1/*/fakemul/*/*")
    )
    held = [p for p in shared.rglob("*") if p.is_file() and "fakemul" in str(p)]
    assert held == [], f"a frozen miss left a lease or a failure record in the store: {held}"


# ------------------------------------------------------------------ jitops doctor --offline-ready


def test_offline_ready_before_and_after_warm(fake, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    make, cache, calls = fake
    a, b = make("frz_ready_a"), make("frz_ready_b")
    assert main(["doctor", "--offline-ready", "frz_ready_a", "frz_ready_b"]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 2 and all(ln.startswith("NOT READY") for ln in lines), out
    assert (
        key12(a) in lines[0]
        and "nothing is cached for 'frz_ready_a'" in lines[0]
        and "`jitops warm frz_ready_a`" in lines[0]
    )
    assert "2 of 2 ops" in err
    assert calls == [] and cache_admin.entries(cache) == []  # the check built nothing

    assert main(["warm", "frz_ready_a"]) == 0
    capsys.readouterr()
    calls.clear()
    assert main(["doctor", "--offline-ready", "frz_ready_a"]) == 0
    out, _ = capsys.readouterr()
    assert (
        out.startswith("READY") and "frz_ready_a" in out and key12(a) in out and "no build" in out
    ), out
    assert main(["doctor", "--offline-ready", "frz_ready_a", "frz_ready_b", "frz_nosuch"]) == 1
    out, err = capsys.readouterr()
    assert [ln[:9].strip() for ln in out.splitlines()] == ["READY", "NOT READY", "NOT READY"], out
    assert "unknown op 'frz_nosuch'" in out and "frz_ready_b" in err and calls == []
    assert b.name == "frz_ready_b"


def test_offline_ready_names_a_damaged_entry_and_device_alone_is_usage(
    fake, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    make, cache, calls = fake
    entry = jentry.ensure_entry(jplan.make_plan(make("frz_ready_dmg"), "cpu"))
    (entry.path / entry.manifest.library_file).write_bytes(b"not a library")
    assert main(["doctor", "--offline-ready", "frz_ready_dmg", "--device", "cpu"]) == 1
    out, _ = capsys.readouterr()
    assert out.startswith("NOT READY") and "damaged" in out, out
    assert main(["doctor", "--device", "cpu"]) == 2
    assert "--offline-ready" in capsys.readouterr().err
    assert calls == ["frz_ready_dmg"]


def test_doctor_fails_an_uncached_op_only_when_frozen_in_error_mode(fake) -> None:  # type: ignore[no-untyped-def]
    import os

    from jitops.cli import diagnose

    make, _, calls = fake
    spec = make("frz_doctor")
    rows = {
        mode: diagnose._ops([spec], Settings.from_env({**os.environ, "JITOPS_FREEZE": mode}))[0]
        for mode in ("error", "warn", "0")
    }
    assert (
        rows["error"].status == "fail" and "JITOPS_FREEZE forbids building" in rows["error"].detail
    )
    assert (
        "`jitops warm frz_doctor`" in rows["error"].fix
        and "unset JITOPS_FREEZE" in rows["error"].fix
    )
    assert rows["warn"].status == rows["0"].status == "info" and calls == []
