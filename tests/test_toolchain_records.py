"""What the compiler's driver runs, remembered in the cache's toolchain records: a later process
only stats the programs, and a record that is damaged or no longer true is asked again (the key
holds the programs' digests, so a stale record would give a switched compiler the old key).

The real C++ compiler on PATH answers (``-###`` and ``-print-prog-name=ld``: no compile).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from jitops.target import toolchain

DAMAGE = [
    "not json",
    "other format",
    "other command",
    "programs not a list",
    "no programs",
    "row too short",
    "program gone",
    "program replaced",
    "found elsewhere on PATH",
]


def _damaged(body: dict[str, Any], damage: str, tmp_path: Path) -> dict[str, Any] | str:
    rows = [list(r) for r in body["programs"]]
    other = tmp_path / "other"
    other.write_text("x")
    if damage == "not json":
        return "{"
    if damage == "other format":
        return {**body, "format": toolchain.PROGRAMS_FORMAT + 1}
    if damage == "other command":
        return {**body, "command": "/usr/bin/another-c++"}
    if damage == "programs not a list":
        return {**body, "programs": "cc1plus"}
    if damage == "no programs":
        return {**body, "programs": []}
    if damage == "row too short":
        return {**body, "programs": [rows[0][:4], *rows[1:]]}
    if damage == "program gone":  # one found by its path, not looked up on PATH
        next(r for r in rows if not r[2])[1] = str(tmp_path / "gone")
    elif damage == "program replaced":
        rows[0][4] = toolchain._identity(str(other))
    elif damage == "found elsewhere on PATH":
        rows[0][2] = "as"  # looked up by a name PATH now finds somewhere else
        rows[0][1] = str(other)
        rows[0][4] = toolchain._identity(str(other))
    return {**body, "programs": rows}


@pytest.fixture
def compiler() -> tuple[str, str]:
    command = shutil.which("c++")
    if command is None:
        pytest.skip("no c++ on PATH")
    return os.path.realpath(command), command


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_programs_record_that_no_longer_holds_is_asked_again(
    damage: str, compiler: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real, command = compiler
    records = tmp_path / "toolchains"
    monkeypatch.setattr(toolchain, "_asked", {})  # a fresh process: nothing asked yet
    ran, asked = toolchain.programs(real, command, records)
    assert asked and ran
    assert {role for role, _ in ran} >= {"command", "compiler proper", "assembler", "linker"}
    (record,) = records.glob("*-programs.json")
    body = json.loads(record.read_text())

    monkeypatch.setattr(toolchain, "_asked", {})  # a later process: the record answers
    assert toolchain.program_files(real, command) is None  # nothing asked in this one yet
    assert toolchain.programs(real, command, records) == (ran, False)
    assert toolchain.program_files(real, command) == [(r[1], r[2]) for r in body["programs"]]

    damaged = _damaged(body, damage, tmp_path)
    record.write_text(damaged if isinstance(damaged, str) else json.dumps(damaged))
    monkeypatch.setattr(toolchain, "_asked", {})
    assert toolchain.programs(real, command, records) == (ran, True)  # asked again, same answer
    assert json.loads(record.read_text()) == body  # and remembered again

    if not isinstance(damaged, str):  # the same facts held in this process are not trusted either
        name = record.name.removesuffix(".json")
        monkeypatch.setattr(toolchain, "_asked", {name: damaged})
        assert toolchain.program_files(real, command) is None


def test_program_files_of_a_compiler_that_is_gone_is_none(tmp_path: Path) -> None:
    assert toolchain.program_files(str(tmp_path / "gone"), "c++") is None
