"""A key always matches its bytes; flags are words, never commands; paths ninja cannot express; offline misses.

Audit 2026-11-24, defects 3, 9, 10 and 16 (a source path holding ``|``); issue 28, items 2, 6 and 7.

- An edit saved while a library builds: the build is discarded (the key's files are re-digested after
  each ninja run, before any object is cached or the entry published) and built again from the bytes
  as they are; the old key never holds the new code, and the next call picks the edit up.
- Every flag string is split once into shell words (quotes honoured) and each word is quoted for the
  ``sh`` that ninja runs commands with: ``;``, ``$(...)``, backticks and redirections run nothing.
- A source path holding ``|`` or a line break is a KernelSourceError / BuildError before any build.
- ``JITOPS_OFFLINE=1`` with a user library and an empty cache is an OfflineMiss naming the library.

Tiers: pure (plans, build.ninja text), fake builder (races, in-process), process with the real compiler
(two builds: one edited while it compiles, one with hostile flags).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import child_env, last_json, scenario_argv

OPERATORS = {";", "&", "|", "||", "&&", ">", "<", ">>", "(", ")", ";;", "&>", "<<", ">&", "|&"}
KERNEL = """\
#include <jitops/op.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <cstring>
#define JSTR2(x) #x
#define JSTR(x) JSTR2(x)

at::Tensor bump(const at::Tensor& x) {{
  at::Tensor xc = x.contiguous();
  at::Tensor out = at::empty_like(xc);
  const float* in = xc.data_ptr<float>();
  float* o = out.data_ptr<float>();
  float add = {add}.0f;
#ifdef NAME
  add += std::strcmp(JSTR(NAME), "a b") == 0 ? 1000.0f : 0.0f;  // -DNAME="a b" reached the compiler as one word
#endif
  for (int64_t i = 0; i < xc.numel(); ++i) o[i] = in[i] + add;
  return out;
}}

JITOPS_LIBRARY(m) {{ m.def("bump(Tensor x) -> Tensor"); }}
JITOPS_LIBRARY_IMPL(CPU, m) {{ m.impl("bump", &bump); }}
"""


def _write(path: Path, text: str) -> None:
    """As editors and git write: a new file renamed over the old one (never a half-written source)."""
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text)
    os.replace(tmp, path)


def _hostile(marker_dir: Path) -> tuple[list[str], list[str], str]:
    """(extra_cflags, extra_ldflags, CXXFLAGS): each would run `touch` through sh if a flag were not one word.

    One shell word each (``${IFS}`` is sh's space), so a real compile with them succeeds."""
    m = str(marker_dir)
    cflags = [
        f"-DJT_A=1;touch${{IFS}}{m}/semicolon;#",
        f"-DJT_B=$(touch${{IFS}}{m}/dollar)",
        f"-DJT_C=`touch${{IFS}}{m}/backtick`",
        f"-DJT_D=1>{m}/redirect",
        f"-DJT_E=1|touch${{IFS}}{m}/pipe",
        f"-DJT_F=1&touch${{IFS}}{m}/amp",
        '-DNAME="a b"',
        "-O0 -Wall",
    ]
    ldflags = [
        f"-Wl,-rpath,;touch${{IFS}}{m}/ld_semicolon;#",
        f"-Wl,-rpath,$(touch${{IFS}}{m}/ld_dollar)",
        f"-Wl,-rpath,`touch${{IFS}}{m}/ld_backtick`",
        f"-Wl,-rpath,>{m}/ld_redirect",
    ]
    return cflags, ldflags, f"'-DJT_Y=$(touch {m}/cxxflags)'"


# ---------------------------------------------------------------- scenarios (run in children)


def load_and_bump(
    name: str, source: str, cflags: list[str] | None = None, ldflags: list[str] | None = None
) -> dict[str, Any]:
    """Scenario: jitops.load one library and call its op on zeros."""
    import torch

    import jitops

    lib = jitops.load(name, sources=[source], extra_cflags=cflags, extra_ldflags=ldflags)
    return {
        "value": float(lib.bump(torch.zeros(3))[0]),
        "key": lib.library.key,
        "built": lib.library.built,
        "cflags": list(lib.library.manifest.ingredients["cflags"]),
        "ldflags": list(lib.library.manifest.ingredients["ldflags"]),
    }


def load_twice(name: str, source: str, first: str, second: str) -> dict[str, Any]:
    """Scenario: the library with ``first`` as its source, then (edited) with ``second``."""
    _write(Path(source), first)
    a = load_and_bump(name, source)
    _write(Path(source), second)
    b = load_and_bump(name, source)
    return {"first": a, "second": b}


# --------------------------------------------------------- defect 3: a key always matches its bytes


def _fake_library(tmp_path: Path, name: str) -> tuple[Any, Path]:
    from jitops.spec import user_spec

    folder = tmp_path / name
    folder.mkdir()
    (folder / "k.cpp").write_text("// v1\n")
    (folder / "k.h").write_text("#pragma once\n")
    spec = user_spec._spec(
        name, folder, ["k.cpp"], user_spec.BuildOptions.of(), origin=f"jitops.load from {folder}"
    )
    return spec, folder


def _when_staging_appears(
    cache: Path, library: str, then: Any, within: float = 60
) -> threading.Thread:
    """Run ``then()`` in a thread as soon as a staging folder of ``library`` appears (bounded)."""

    def watch() -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                if any(
                    p.name.startswith(f"{library}-") for p in (cache / "v1" / "staging").iterdir()
                ):
                    then()
                    return
            except OSError:
                pass
            time.sleep(0.005)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


@pytest.fixture
def fake_env(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    monkeypatch.setenv("JITOPS_FAKE_BUILD_SECONDS", "0.6")
    monkeypatch.setenv("JITOPS_PROGRESS", "0")
    return private_cache


@pytest.mark.parametrize("edited", ["k.cpp", "k.h"])
def test_an_edit_during_the_build_never_lands_under_the_old_key(
    fake_env: Path, tmp_path: Path, edited: str
) -> None:
    """The source (or a header of its folder) is rewritten the moment staging appears: nothing is published
    under the plan's key, and the call returns the build of the bytes as they are now, under their own key."""
    from jitops.build.entry import ensure_entry
    from jitops.plan import make_plan
    from jitops.base.settings import Settings

    spec, folder = _fake_library(tmp_path, f"edited_{edited[-1]}")
    settings = Settings.from_env()
    old = make_plan(spec, "cpu", settings=settings)
    watcher = _when_staging_appears(fake_env, spec.name, lambda: _write(folder / edited, "// v2\n"))
    entry = ensure_entry(old, settings=settings)
    watcher.join(5)
    new = make_plan(spec, "cpu", settings=settings)
    assert new.key != old.key
    assert entry.plan.key == new.key and entry.manifest.key == new.key
    assert dict(entry.manifest.ingredients["sources"]) == dict(new.digests)
    assert not old.entry.exists(), "the old key holds a build made while its sources changed"
    again = ensure_entry(make_plan(spec, "cpu", settings=settings), settings=settings)
    assert again.plan.key == new.key and not again.built  # the next call: the edit, from the cache


def test_the_same_bytes_written_again_during_the_build_are_built_again(
    fake_env: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rewrite with identical bytes (an edit and its undo, a git checkout back and forth) changes the
    file's ctime: the compiler may have read other bytes in between, so the build is redone."""
    from jitops.build.entry import ensure_entry
    from jitops.plan import make_plan
    from jitops.base.settings import Settings

    spec, folder = _fake_library(tmp_path, "aba")
    settings = Settings.from_env()
    plan = make_plan(spec, "cpu", settings=settings)
    watcher = _when_staging_appears(
        fake_env, spec.name, lambda: _write(folder / "k.cpp", "// v1\n")
    )
    with caplog.at_level("INFO", logger="jitops"):
        entry = ensure_entry(plan, settings=settings)
    watcher.join(5)
    assert entry.plan.key == plan.key and entry.built
    assert any("k.cpp was written again" in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]


def test_sources_that_keep_changing_give_a_build_error_after_three_builds(
    fake_env: Path, tmp_path: Path
) -> None:
    from jitops.build.entry import ensure_entry
    from jitops.errors import BuildError
    from jitops.plan import make_plan
    from jitops.base.settings import Settings

    spec, folder = _fake_library(tmp_path, "churn")
    stop = threading.Event()

    def churn() -> None:
        for i in range(400):  # at most ~40 s
            if stop.wait(0.1):
                return
            _write(folder / "k.cpp", f"// v{i}\n")

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    settings = Settings.from_env()
    start = time.monotonic()
    try:
        with pytest.raises(
            BuildError, match=r"changed during each of 3 builds .*k\.cpp was edited.*Fix: "
        ):
            ensure_entry(make_plan(spec, "cpu", settings=settings), settings=settings)
    finally:
        stop.set()
        t.join(5)
    assert time.monotonic() - start < 30
    assert not any((fake_env / "v1" / "entries").rglob("manifest.json"))  # nothing published


@pytest.mark.process
@pytest.mark.timeout(480)
def test_a_real_build_edited_while_it_compiles(tmp_path: Path) -> None:
    """Audit defect 3 as reported: v1 (x+1) builds in a child; the source becomes v2 (x+100) the moment
    staging appears. A fresh process with v1's bytes must get x+1, never x+100; the next call, with v2's
    bytes, gets x+100."""
    cache = tmp_path / "cache"
    src = tmp_path / "src" / "bump.cpp"
    src.parent.mkdir()
    v1, v2 = KERNEL.format(add=1), KERNEL.format(add=100)
    _write(src, v1)
    env = child_env(JITOPS_CACHE_DIR=str(cache), JITOPS_PROGRESS="0")
    child = subprocess.Popen(
        scenario_argv(
            "adversarial.test_build_integrity.load_and_bump", name="bump_race", source=str(src)
        ),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    edited = threading.Event()
    watcher = _when_staging_appears(
        cache, "bump_race", lambda: (_write(src, v2), edited.set()), within=240
    )
    try:
        out, err = child.communicate(timeout=360)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    watcher.join(5)
    assert child.returncode == 0, err[-3000:]
    first = last_json(out)
    assert edited.is_set(), "staging never appeared"
    # the edited call returns a library of one of the two
    assert first.get("value") in (1.0, 100.0), first
    again = last_json(
        subprocess.run(
            scenario_argv(
                "adversarial.test_build_integrity.load_twice",
                name="bump_race",
                source=str(src),
                first=v1,
                second=v2,
            ),
            env=env,
            capture_output=True,
            text=True,
            timeout=360,
            cwd=Path(__file__).parents[2],
        ).stdout
    )
    # v1's bytes: v1's code (built again, or cached), never x+100
    assert again["first"]["value"] == 1.0, again
    assert again["second"]["value"] == 100.0, again
    # the child built the edit: under v2's key, which the next call finds
    if first["value"] == 100.0:
        assert first["key"] == again["second"]["key"] and not again["second"]["built"]


# ---------------------------------------------------------------- defect 10: flags are words


def _plan_with_flags(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cflags: list[str],
    ldflags: list[str],
    cxxflags: str,
) -> Any:
    from jitops.spec import user_spec
    from jitops.plan import make_plan
    from jitops.base.settings import Settings

    monkeypatch.setenv("CXXFLAGS", cxxflags)
    folder = tmp_path / "src"
    folder.mkdir(exist_ok=True)
    (folder / "k.cpp").write_text("// k\n")
    (folder / "register_k.cpp").write_text("// r\n")
    spec = user_spec._spec(
        "flags_lib",
        folder,
        ["k.cpp", "register_k.cpp"],
        user_spec.BuildOptions.of(extra_cflags=cflags, extra_ldflags=ldflags),
        origin="test",
    )
    return make_plan(spec, "cpu", settings=Settings.from_env())


def test_flag_strings_become_words_in_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    plan = _plan_with_flags(
        tmp_path,
        monkeypatch,
        ['-DNAME="a b"', "-O0 -Wall", "-DQ='x y'"],
        ["-Wl,-O1 -Wl,--as-needed"],
        "-DE='1 2' -g",
    )
    cflags = list(plan.cflags)
    assert cflags[-6:] == ["-DNAME=a b", "-O0", "-Wall", "-DQ=x y", "-DE=1 2", "-g"]
    assert list(plan.ldflags)[-2:] == ["-Wl,-O1", "-Wl,--as-needed"]
    assert plan.ingredients["cflags"] == cflags  # the key holds the words


def _ninja_commands(build_dir: Path) -> list[str]:
    from jitops.target import toolchain

    proc = subprocess.run(
        [toolchain.find_ninja("t"), "-t", "commands"],
        cwd=build_dir,
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.splitlines()


def _sh_tokens(command: str) -> list[str]:
    """A command line as sh would tokenize it: words, and ;, |, &, <, >, (, ) as operators of their own."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    return list(lex)


def _job(plan: Any, build_dir: Path, cxx: str) -> Any:
    from jitops.target import toolchain
    from jitops.build.job import BuildJob
    from jitops.key import INCLUDE_DIR

    build_dir.mkdir()
    return BuildJob(
        library=plan.spec.name,
        target=plan.target.name,
        device="cpu",
        namespace=plan.namespace,
        sources=tuple(plan.spec.root / s for s in plan.spec.cpu_sources),
        include_dirs=(INCLUDE_DIR, plan.spec.root),
        cflags=plan.cflags,
        cuda_cflags=(),
        ldflags=plan.ldflags,
        cxx=cxx,
        ninja=toolchain.find_ninja("t"),
        nvcc=None,
        build_dir=build_dir,
        env=dict(os.environ),
    )


def test_build_ninja_gives_each_flag_word_as_one_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    """Pure: the compile and link lines of build.ninja, tokenized as sh would, hold every flag word as exactly
    one word and no shell operator (the registration file's own flags too)."""
    from jitops.build import ninja

    marks = tmp_path / "marks"
    cflags, ldflags, cxxflags = _hostile(marks)
    plan = _plan_with_flags(tmp_path, monkeypatch, cflags, ldflags, cxxflags)
    path, _ = ninja.write_ninja_file(_job(plan, tmp_path / "b", "/usr/bin/c++"))
    commands = _ninja_commands(path.parent)
    compiles = [c for c in commands if " -c " in c]
    link = next(c for c in commands if " -shared " in c)
    assert len(compiles) == 2
    for command in [*compiles, link]:
        tokens = _sh_tokens(command)
        assert not OPERATORS & set(tokens), command
    want_c = [w for item in cflags for w in shlex.split(item)] + [
        f"-DJT_Y=$(touch {marks}/cxxflags)"
    ]
    assert {f"-DJT_C=`touch${{IFS}}{marks}/backtick`", "-DNAME=a b", "-O0", "-Wall"} <= set(want_c)
    for command in compiles:
        tokens = _sh_tokens(command)
        assert all(tokens.count(w) == 1 for w in want_c), (want_c, tokens)
    want_ld = [w for item in ldflags for w in shlex.split(item)]
    assert all(_sh_tokens(link).count(w) == 1 for w in want_ld), (want_ld, link)


def test_ninja_runs_hostile_flags_through_sh_and_sh_runs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    """build.ninja run by the real ninja (every command through ``sh -c``), with a stand-in compiler that
    records its argv: no marker file appears, and the compiler gets each word as one argument."""
    from jitops.build import ninja

    marks = tmp_path / "marks"
    marks.mkdir()
    cflags, ldflags, cxxflags = _hostile(marks)
    plan = _plan_with_flags(tmp_path, monkeypatch, cflags, ldflags, cxxflags)
    record = tmp_path / "argv.jsonl"
    cxx = tmp_path / "recording-cxx"
    cxx.write_text(
        f"#!{sys.executable}\nimport json, sys\nopen({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "open(sys.argv[sys.argv.index('-o') + 1], 'w').close()\n"
    )
    cxx.chmod(0o755)
    job = _job(plan, tmp_path / "b", str(cxx))
    path, _ = ninja.write_ninja_file(job)
    proc = subprocess.run(
        [job.ninja, "-v"], cwd=path.parent, capture_output=True, text=True, timeout=120
    )
    assert sorted(p.name for p in marks.iterdir()) == [], proc.stdout
    assert proc.returncode == 0, proc.stdout
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    compiles = [a for a in calls if "-c" in a]
    assert len(compiles) == 2 and len(calls) == 3  # two files, the link
    for argv in compiles:
        for word in (
            *cflags[:6],
            "-DNAME=a b",
            "-O0",
            "-Wall",
            f"-DJT_Y=$(touch {marks}/cxxflags)",
        ):
            assert argv.count(word) == 1, (word, argv)
    link = next(a for a in calls if "-shared" in a)
    assert all(link.count(word) == 1 for word in ldflags), link


@pytest.mark.process
@pytest.mark.timeout(300)
def test_a_real_build_with_hostile_flags_runs_nothing(tmp_path: Path) -> None:
    """The real compiler, once: hostile extra_cflags, extra_ldflags and CXXFLAGS build a working library and
    create no marker; -DNAME="a b" reaches the compiler as one word (the kernel stringifies it)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    cflags, ldflags, cxxflags = _hostile(marks)
    src = tmp_path / "src" / "bump.cpp"
    src.parent.mkdir()
    src.write_text(KERNEL.format(add=1))
    env = child_env(
        JITOPS_CACHE_DIR=str(tmp_path / "cache"), JITOPS_PROGRESS="0", CXXFLAGS=cxxflags
    )
    proc = subprocess.run(
        scenario_argv(
            "adversarial.test_build_integrity.load_and_bump",
            name="bump_flags",
            source=str(src),
            cflags=cflags,
            ldflags=ldflags,
        ),
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        cwd=Path(__file__).parents[2],
    )
    assert sorted(p.name for p in marks.iterdir()) == [], proc.stderr[-3000:]
    got = last_json(proc.stdout)
    assert got.get("value") == 1001.0, (got, proc.stderr[-3000:])  # x + 1, + 1000 for NAME == "a b"
    assert {*cflags[:6], "-DNAME=a b", "-O0", "-Wall", f"-DJT_Y=$(touch {marks}/cxxflags)"} <= set(
        got["cflags"]
    )
    assert set(ldflags) <= set(got["ldflags"])


@pytest.mark.parametrize(
    ("arg", "flag", "match"),
    [
        ("extra_cflags", '-DNAME="a b', "cannot be split into words"),
        ("extra_ldflags", "-Wl,'-O1", "cannot be split into words"),
        ("extra_cflags", "'-DX=1\ntouch PWN'", "line break"),
        ("extra_cuda_cflags", "-DX=$(touch PWN)", "nvcc passes its flags on to a shell"),
        ("extra_cuda_cflags", "-Xcompiler=-DY=1;touch", "nvcc passes its flags on to a shell"),
    ],
)
def test_flags_that_cannot_be_words_are_argument_errors(arg: str, flag: str, match: str) -> None:
    from jitops.errors import ArgumentError
    from jitops.spec.user_spec import BuildOptions

    with pytest.raises(ArgumentError, match=match):
        BuildOptions.of(**{arg: [flag]})


def test_nvcc_variables_that_a_shell_would_act_on_are_config_errors(tmp_path: Path) -> None:
    from jitops import key
    from jitops.errors import ConfigError
    from jitops.target import probe

    system = probe({"NVCC_APPEND_FLAGS": "-DX=`touch PWN`"}, cuda=False)
    with pytest.raises(ConfigError, match="NVCC_APPEND_FLAGS holds the flag"):
        key.extra_env_flags(system, "cuda")
    assert key.extra_env_flags(system, "cpu") == ((), ())  # a CPU build never hands it to nvcc


# ------------------------------------------------------------ defect 16: paths ninja cannot express


@pytest.mark.parametrize("odd", ["a|b", "a\nb"])
def test_a_source_path_ninja_cannot_express_is_refused_before_any_build(
    fake_env: Path, tmp_path: Path, odd: str
) -> None:
    import jitops
    from jitops.errors import KernelSourceError

    folder = tmp_path / odd
    folder.mkdir()
    (folder / "k.cpp").write_text(KERNEL.format(add=1))
    with pytest.raises(KernelSourceError, match=r"cannot express.*Fix: rename"):
        jitops.load("odd_path", sources=[str(folder / "k.cpp")])
    assert not (fake_env / "v1" / "staging").exists() or not any(
        (fake_env / "v1" / "staging").iterdir()
    )


def test_the_ninja_writer_refuses_such_paths_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, private_cache: Path
) -> None:
    """Defence in depth for sources that do not come through load (a package installed under such a path)."""
    import dataclasses

    from jitops.build import ninja
    from jitops.errors import BuildError

    plan = _plan_with_flags(tmp_path, monkeypatch, [], [], "")
    odd = tmp_path / "x|y"
    odd.mkdir()
    (odd / "k.cpp").write_text("// k\n")
    job = dataclasses.replace(_job(plan, tmp_path / "b", "/usr/bin/c++"), sources=(odd / "k.cpp",))
    with pytest.raises(BuildError, match=r"holds \|, which a ninja build file cannot express"):
        ninja.write_ninja_file(job)
    assert not (tmp_path / "b" / "build.ninja").exists()


# ---------------------------------------------------------------- defect 9: offline


@pytest.mark.parametrize("how", ["load", "load_inline"])
def test_offline_with_an_empty_cache_is_an_offline_miss_naming_the_library(
    private_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    import jitops
    from jitops.errors import OfflineMiss

    monkeypatch.setenv("JITOPS_OFFLINE", "1")
    src = tmp_path / "offlib.cpp"
    src.write_text(KERNEL.format(add=1))
    with pytest.raises(
        OfflineMiss, match=r"op library 'offlib'.*Fix: call the same jitops\.load / load_inline"
    ):
        if how == "load":
            jitops.load("offlib", sources=[str(src)])
        else:
            jitops.load_inline("offlib", cpp_sources=src.read_text())
    assert not (private_cache / "v1" / "entries").exists() or not any(
        (private_cache / "v1" / "entries").iterdir()
    )
