"""No edit of a file the compiler or linker read, and no switch of the compiler, leaves a warm hit
serving the old code: in a new process, in the same process, and through a shared remote tier.

Each case builds a real stable-ABI kernel (a second or two) whose op returns the number its inputs
define, changes one input, and loads again: the new number must come back, built anew. Files outside
what the key walks (odd suffixes, ``../``, absolute includes, ``-I``/``-include`` in the flags, a
static library, ``ld`` and the compiler behind ``PATH`` or a wrapper) are the kinds the audit of
2026-11-28 found served stale.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import child_env, run_scenario
from tests.scenarios_inputs import kernel

pytestmark = [pytest.mark.compile, pytest.mark.process]


def _env(tmp: Path, **more: str | None) -> dict[str, str]:
    return child_env(
        JITOPS_CACHE_DIR=str(tmp / "cache"),
        JITOPS_STATE_DIR=str(tmp / "state"),
        JITOPS_BUILDER=None,
        **more,
    )


def _load(tmp: Path, name: str, env: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    result = run_scenario("scenarios_inputs.load_value", env=env or _env(tmp), name=name, **kw)
    assert "value" in result or "loads" in result, result
    return result  # type: ignore[no-any-return]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _define(value: int) -> str:
    return f"#define VALUE {value}.0\n"


# Each kind: (sources and load arguments, the file whose edit must be seen), laid out in tmp.
Layout = Callable[[Path], tuple[dict[str, Any], Path]]


def _suffix(name: str) -> Layout:
    def lay(tmp: Path) -> tuple[dict[str, Any], Path]:
        src = _write(tmp / "src" / "k.cpp", kernel(f'#include "{name}"\n'))
        return {"sources": [str(src)]}, _write(tmp / "src" / name, _define(1))

    return lay


def _relative(tmp: Path) -> tuple[dict[str, Any], Path]:
    src = _write(tmp / "src" / "k.cpp", kernel('#include "../common/cfg.h"\n'))
    return {"sources": [str(src)]}, _write(tmp / "common" / "cfg.h", _define(1))


def _absolute(tmp: Path) -> tuple[dict[str, Any], Path]:
    header = _write(tmp / "elsewhere" / "cfg.h", _define(1))
    src = _write(tmp / "src" / "k.cpp", kernel(f'#include "{header}"\n'))
    return {"sources": [str(src)]}, header


def _include_flag(tmp: Path) -> tuple[dict[str, Any], Path]:
    src = _write(tmp / "src" / "k.cpp", kernel("#include <audcfg.h>\n"))
    header = _write(tmp / "flagdir" / "audcfg.h", _define(1))
    return {"sources": [str(src)], "extra_cflags": [f"-I{header.parent}"]}, header


def _forced_include(tmp: Path) -> tuple[dict[str, Any], Path]:
    src = _write(tmp / "src" / "k.cpp", kernel(""))
    header = _write(tmp / "forced" / "cfg.h", _define(1))
    return {"sources": [str(src)], "extra_cflags": ["-include", str(header)]}, header


def _symlinked_folder(tmp: Path) -> tuple[dict[str, Any], Path]:
    header = _write(tmp / "real" / "cfg.h", _define(1))
    (tmp / "src").mkdir()
    (tmp / "src" / "sub").symlink_to(tmp / "real", target_is_directory=True)
    src = _write(tmp / "src" / "k.cpp", kernel('#include "sub/cfg.h"\n'))
    return {"sources": [str(src)]}, header


KINDS = {
    "suffix .hh": _suffix("cfg.hh"),
    "suffix .inc": _suffix("cfg.inc"),
    "no suffix": _suffix("cfgfile"),
    "../ outside the folder": _relative,
    "absolute include": _absolute,
    "-I in extra_cflags": _include_flag,
    "-include in extra_cflags": _forced_include,
    "symlinked subfolder": _symlinked_folder,
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_an_edited_header_is_built_again_in_a_new_process(tmp_path: Path, kind: str) -> None:
    args, header = KINDS[kind](tmp_path)
    name = "stale_" + "".join(c for c in kind if c.isalnum())[:20].lower()
    first = _load(tmp_path, name, **args)
    assert first["value"] == 1.0 and first["built"], first
    header.write_text(_define(2))
    second = _load(tmp_path, name, **args)
    assert second["value"] == 2.0 and second["built"], (kind, second)
    third = _load(tmp_path, name, **args)
    assert third["value"] == 2.0 and not third["built"], (kind, third)


def test_the_same_process_loads_the_edited_build_beside_the_old(tmp_path: Path) -> None:
    """An edit between two loads in one process: the second is rebuilt and registered in a namespace
    of its own (the first stays registered), and editing back builds once more."""
    args, header = _absolute(tmp_path)
    out = _load(
        tmp_path,
        "stale_inproc",
        times=3,
        edits=[[str(header), _define(2)], [str(header), _define(3)]],
        **args,
    )["loads"]
    assert [r["value"] for r in out] == [1.0, 2.0, 3.0], out
    assert all(r["built"] for r in out) and len({r["namespace"] for r in out}) == 3, out


def test_every_recorded_input_is_proven(tmp_path: Path) -> None:
    """Property: the entry records every user file the compiler read, wherever it was found, and
    changing any one of them (bytes, or only its identity with the same bytes) is caught by the
    lookup's proof; bytes put back pass again."""
    from jitops.store.cache import Cache
    from jitops.store.manifest import Manifest

    header = _write(tmp_path / "elsewhere" / "far.h", "#define FAR 0\n")
    _write(tmp_path / "src" / "near.hh", "#define NEAR 0\n")
    _write(tmp_path / "common" / "up.h", "#define UP 0\n")
    _write(tmp_path / "flagdir" / "viaflag.h", "#define VIAFLAG 0\n")
    src = _write(
        tmp_path / "src" / "k.cpp",
        kernel(
            f'#include "near.hh"\n#include "../common/up.h"\n#include "{header}"\n'
            "#include <viaflag.h>\n#define VALUE (1.0 + NEAR + UP + FAR + VIAFLAG)\n"
        ),
    )
    flags = [f"-I{tmp_path / 'flagdir'}"]
    built = _load(tmp_path, "stale_every", sources=[str(src)], extra_cflags=flags)
    entry = Path(built["entry"])
    manifest = Manifest.parse((entry / "manifest.json").read_bytes())
    assert manifest.inputs is not None
    ours = {
        label: path
        for label in manifest.inputs
        if (path := label.replace("<root>", str(tmp_path / "src"))).startswith(str(tmp_path))
    }
    assert {Path(p).name for p in ours.values()} == {
        "k.cpp",
        "near.hh",
        "up.h",
        "far.h",
        "viaflag.h",
    }
    assert any(not label.startswith(("<root>", str(tmp_path))) for label in manifest.inputs), (
        "system headers are recorded too"
    )
    cache = Cache(tmp_path / "cache")
    root = tmp_path / "src"
    assert cache.stale(entry, manifest, root) is None
    for label, path in sorted(ours.items()):
        before = Path(path).read_bytes()
        Path(path).write_bytes(before + b"\n// edited\n")
        why = cache.stale(entry, manifest, root)
        assert why is not None and Path(path).name in why, (label, why)
        Path(path).write_bytes(before)
        assert cache.stale(entry, manifest, root) is None, label
    os.unlink(header)
    os.mkfifo(header)  # a FIFO where a header was: refused at once, never opened blocking
    why = cache.stale(entry, manifest, root)
    assert why is not None and "far.h" in why


def test_a_rebuilt_static_library_is_linked_again(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler for the static library")

    def archive(value: int) -> None:
        c = _write(
            tmp_path / "lib" / "audv.c", f"double audv_value(void) {{ return {value}.0; }}\n"
        )
        obj = tmp_path / "lib" / "audv.o"
        subprocess.run([cc, "-fPIC", "-c", str(c), "-o", str(obj)], check=True, timeout=60)
        (tmp_path / "lib" / "libaudv.a").unlink(missing_ok=True)
        subprocess.run(["ar", "rcs", str(tmp_path / "lib" / "libaudv.a"), str(obj)], check=True)

    archive(1)
    src = _write(
        tmp_path / "src" / "k.cpp",
        kernel('extern "C" double audv_value(void);\n#define VALUE audv_value()\n'),
    )
    args = {"sources": [str(src)], "extra_ldflags": [f"-L{tmp_path / 'lib'}", "-laudv"]}
    assert _load(tmp_path, "stale_archive", **args)["value"] == 1.0
    archive(2)
    again = _load(tmp_path, "stale_archive", **args)
    assert again["value"] == 2.0 and again["built"], again


def _script(path: Path, text: str) -> Path:
    _write(path, text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_an_ld_earlier_on_path_is_a_new_key(tmp_path: Path) -> None:
    real_ld = shutil.which("ld")
    if real_ld is None:
        pytest.skip("needs GNU ld on PATH")
    src = _write(tmp_path / "src" / "k.cpp", kernel(_define(1)))
    first = _load(tmp_path, "stale_ld", sources=[str(src)])
    bin_dir = tmp_path / "bin"
    _script(bin_dir / "ld", f'#!/bin/sh\nexec {real_ld} "$@"\n')
    env = _env(tmp_path, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    second = _load(tmp_path, "stale_ld", env=env, sources=[str(src)])
    assert second["built"] and second["key"] != first["key"], (first, second)


def test_a_compiler_switched_behind_a_wrapper_is_a_new_key(tmp_path: Path) -> None:
    gxx, clangxx = shutil.which("g++"), shutil.which("clang++")
    if gxx is None or clangxx is None:
        pytest.skip("needs g++ and clang++")
    link = tmp_path / "bin" / "cxx-link"
    link.parent.mkdir(parents=True)
    link.symlink_to(gxx)
    wrapper = _script(tmp_path / "bin" / "cxx", f'#!/bin/sh\nexec {link} "$@"\n')
    src = _write(
        tmp_path / "src" / "k.cpp",
        kernel("#ifdef __clang__\n#define VALUE 2.0\n#else\n#define VALUE 1.0\n#endif\n"),
    )
    env = _env(tmp_path, CXX=str(wrapper))
    assert _load(tmp_path, "stale_cxx", env=env, sources=[str(src)])["value"] == 1.0
    link.unlink()
    link.symlink_to(clangxx)
    again = _load(tmp_path, "stale_cxx", env=env, sources=[str(src)])
    assert again["value"] == 2.0 and again["built"], again


def test_a_same_size_rewrite_of_the_compiler_with_its_mtime_put_back(tmp_path: Path) -> None:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("needs g++")
    src = _write(tmp_path / "src" / "k.cpp", kernel("#define VALUE (0.0 + BIAS)\n"))
    wrapper = _script(tmp_path / "bin" / "cxx", f'#!/bin/sh\nexec {gxx} -DBIAS=1 "$@"\n')
    st = wrapper.stat()
    env = _env(tmp_path, CXX=str(wrapper))
    assert _load(tmp_path, "stale_rewrite", env=env, sources=[str(src)])["value"] == 1.0
    wrapper.write_text(wrapper.read_text().replace("-DBIAS=1", "-DBIAS=2"))
    os.utime(wrapper, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert wrapper.stat().st_size == st.st_size and wrapper.stat().st_mtime_ns == st.st_mtime_ns
    again = _load(tmp_path, "stale_rewrite", env=env, sources=[str(src)])
    assert again["value"] == 2.0 and again["built"], again


def test_a_node_never_takes_a_remote_entry_built_from_other_inputs(tmp_path: Path) -> None:
    """Two caches share a signed remote tier: the second node's out-of-tree header differs from what
    the first built with, so it refuses the fetched entry and builds its own, stored under a name of
    its inputs' own; nodes holding either header then fetch the one built from theirs."""
    import hashlib

    from tests.remote_helpers import keygen, node_env

    cfg = tmp_path / "cfg"
    keygen(cfg)
    store = tmp_path / "store"
    url = f"file://{store}"
    args, header = _absolute(tmp_path)

    def node(name: str) -> dict[str, str]:
        return node_env(
            tmp_path / name, url, cfg, JITOPS_BUILDER=None, JITOPS_STATE_DIR=str(tmp_path / name)
        )

    def stored() -> dict[str, str]:
        return {
            p.relative_to(store).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in store.rglob("*")
            if p.is_file() and "entries" in p.parts
        }

    first = _load(tmp_path, "stale_remote", env=node("a"), **args)
    assert first["value"] == 1.0 and first["built"]
    (primary, blob), *more = stored().items()
    assert not more, stored()
    header.write_text(_define(2))
    second = _load(tmp_path, "stale_remote", env=node("b"), **args)
    assert second["value"] == 2.0 and second["built"], second
    names = stored()
    assert names[primary] == blob, "a build from other inputs was stored over the first"
    (variant,) = set(names) - {primary}
    assert variant.startswith(primary + "."), names
    header.write_text(_define(1))
    third = _load(tmp_path, "stale_remote", env=node("c"), **args)
    assert third["value"] == 1.0 and not third["built"], third
    header.write_text(_define(2))
    fourth = _load(tmp_path, "stale_remote", env=node("d"), **args)
    assert fourth["value"] == 2.0 and not fourth["built"], fourth
    assert stored() == names, "a fetched entry was uploaded again"


def test_an_entry_without_a_record_of_its_inputs_is_built_again(tmp_path: Path) -> None:
    """An entry from before jitops recorded what its compiler read cannot be proven: built again."""
    import dataclasses

    from jitops.store.manifest import Manifest

    src = _write(tmp_path / "src" / "k.cpp", kernel(_define(1)))
    first = _load(tmp_path, "stale_old", sources=[str(src)])
    entry = Path(first["entry"])
    m = Manifest.parse((entry / "manifest.json").read_bytes())
    raw = json.loads((entry / "manifest.json").read_bytes())
    assert m.inputs is not None and "inputs" in raw
    old = dataclasses.replace(m, inputs=None)
    (entry / "manifest.json").write_bytes(old.to_json())
    again = _load(tmp_path, "stale_old", sources=[str(src)])
    assert again["built"] and again["value"] == 1.0, again


def test_get_in_the_same_process_sees_an_edited_header_outside_the_folder(tmp_path: Path) -> None:
    """A notebook edits a header that the key does not walk: the next ``jitops.get`` of a registered
    kernel folder's op builds again (its memo watches the files the build read, not only the folder)."""
    args, header = _relative(tmp_path)
    out = run_scenario(
        "scenarios_inputs.get_twice",
        env=_env(tmp_path),
        folder=str(tmp_path / "src"),
        op="value",
        header=str(header),
    )
    assert out.get("values") == [1.0, 2.0] and out["built"], out


def test_a_file_written_while_it_compiles_is_built_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record's digests are taken after the compile: a file saved meanwhile would be recorded with
    bytes the compiler never read. Its ctime says so, and the build is done again."""
    from jitops import plan as planning
    from jitops.build import entry as entry_mod
    from jitops.build import runner
    from jitops.store import inputs
    from tests import fakelib
    from tests.helpers import environ

    header = _write(tmp_path / "far.h", _define(1))
    fake, builds = runner.BUILDERS["fake"], []

    def saved_meanwhile(job: Any, on_line: Any = None) -> tuple[int, str, Path]:
        rc, out, lib = fake(job, on_line)
        if not builds:
            header.write_text(_define(2))  # saved while the first build compiled
        builds.append(job.library)
        runner._TIMINGS[id(job)] = {"inputs": {str(header): inputs.digest(str(header))}}
        return rc, out, lib

    monkeypatch.setitem(runner.BUILDERS, "fake", saved_meanwhile)
    with environ(
        JITOPS_CACHE_DIR=str(tmp_path / "cache"), JITOPS_BUILDER="fake", JITOPS_PROGRESS="0"
    ):
        fakelib.register_all()
        made = entry_mod.ensure_entry(planning.make_plan(fakelib.FAKEADD, "cpu"))
    assert len(builds) == 2 and made.built, builds
    assert made.manifest.inputs == {str(header): inputs.digest(str(header))}
