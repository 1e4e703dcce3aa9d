"""Small frictions of a user's first minutes (issue 29, item 6): compiler variables that are not a compiler,
and fingerprints that say whose they are."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from jitops.target import compilers, toolchain
from jitops.errors import ToolchainError
from jitops.target import probe


def test_cxx_with_flags_says_to_put_them_in_cxxflags() -> None:
    if shutil.which("g++") is None:
        pytest.skip("needs g++ on PATH")
    with pytest.raises(ToolchainError) as e:
        toolchain.find_cxx(probe({"CXX": "g++ -O2 -g"}), "softmax")
    assert "CXX='g++ -O2 -g' holds flags" in str(e.value) and "Fix: set CXX=g++" in str(e.value)
    assert "CXXFLAGS='-O2 -g'" in str(e.value)
    # no compiler in it at all
    with pytest.raises(ToolchainError, match="does not name an executable"):
        toolchain.find_cxx(probe({"CXX": "no-such-compiler -O2"}), "softmax")


@pytest.mark.parametrize("program", ["true", "echo"])
def test_a_program_that_is_not_a_compiler_is_refused_with_the_fix(program: str) -> None:
    path = shutil.which(program)
    if path is None:
        pytest.skip(f"no {program} on PATH")
    with pytest.raises(ToolchainError) as e:
        compilers.cxx(probe({"CXX": path}), "softmax", None, record=False)
    assert "does not behave like a C++ compiler" in str(e.value) and "-dumpmachine" in str(e.value)
    assert "Fix: set CXX to a C++ compiler" in str(e.value)


def test_a_compiler_that_fails_version_is_refused_with_the_fix() -> None:
    path = shutil.which("false")
    if path is None:
        pytest.skip("no false on PATH")
    with pytest.raises(ToolchainError, match="not a working compiler. Fix: set CXX"):
        compilers.cxx(probe({"CXX": path}), "softmax", None, record=False)


def test_real_compilers_pass_and_ask_nothing_more() -> None:
    for name in ("g++", "clang++"):
        path = shutil.which(name)
        if path is not None:
            tool = compilers.cxx(probe({"CXX": path}), "softmax", None, record=False)
            # known: no -dumpmachine question
            assert compilers.kind_of(tool.version)[0] in (
                "gcc",
                "clang",
            )


def test_info_and_doctor_label_their_fingerprints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from jitops.cli import diagnose
    from jitops import cli, registry

    monkeypatch.setenv("JITOPS_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("JITOPS_BUILDER", "fake")  # doctor's self-check row: skipped, nothing built
    assert cli.main(["info", "softmax", "--device", "cpu"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("fingerprint"))
    assert "this library on cpu" in line and "jitops cache fingerprint" in line
    row = next(c for c in diagnose.doctor(registry.registry().specs()) if c.name == "fingerprint")
    assert "this machine: every op" in row.detail and "jitops info OP" in row.detail
