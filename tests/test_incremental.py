"""Per-file builds: the object cache, jitops's own precompiled headers, and the time records (issue 17).

Most tests build small libraries of plain C++ (no torch headers: a compile takes ~0.1 s) through
``build.build`` with a compiler wrapper that counts its compiles; the PCH tests precompile
standard-library headers with the real g++ (and clang++ where installed). One test builds a
torch kernel twice, with and without the PCH, and compares outputs and exported symbols.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from jitops.store import cache
from jitops.build import pch
from jitops.target import toolchain
from jitops.build import runner as build
from jitops.store.manifest import Manifest
from jitops.store.inputs import read_depfile
from jitops.base.settings import Settings
from jitops.build.tubuild import summary

pytestmark = pytest.mark.timeout(600)

CLANG = shutil.which("clang++")
COMPILERS = ["gcc", *(["clang"] if CLANG else [])]


# ------------------------------------------------------------------ pure


def test_header_prefix_is_the_leading_angle_includes() -> None:
    src = '// c\n\n#include <a/b.h>\n  # include <c.h>  // why\n#include "local.h"\n#include <d.h>\nint x;\n'
    assert pch.header_prefix(src) == ["#include <a/b.h>", "# include <c.h>  // why"]
    # a macro first changes what headers mean
    assert pch.header_prefix("#define X 1\n#include <a.h>\n") == []
    assert pch.header_prefix("#include <a.h>\n#include <b.h>") == [
        "#include <a.h>",
        "#include <b.h>",
    ]
    # the drop-in's "#line 1" after the prepended header: the user's own includes stay in the prefix
    # (issue 29)
    assert pch.header_prefix("#include <a.h>\n#line 1\n#include <b.h>\nint x;") == [
        "#include <a.h>",
        "#include <b.h>",
    ]


def test_pch_flags_leave_out_only_the_library_name_and_folder(tmp_path: Path) -> None:
    words = [
        "-UTORCH_EXTENSION_NAME",
        "-DTORCH_EXTENSION_NAME=x",
        f"-I{tmp_path}",
        "-I/other",
        "-O3",
    ]
    assert pch.pch_flags(words, tmp_path) == ["-I/other", "-O3"]


def test_depfile_parsing(tmp_path: Path) -> None:
    d = tmp_path / "a.o.d"
    d.write_text("a.o: /src/a.cpp /src/my\\ dir/h.h \\\n /usr/x.h\n")
    assert read_depfile(d) == ["/src/a.cpp", "/src/my dir/h.h", "/usr/x.h"]


def test_manifest_timings_round_trip_and_old_manifests_still_parse() -> None:
    base = dict(
        key="k" * 64,
        library="lib",
        target="cpu",
        namespace="ns",
        library_file="liblib.so",
        sha256="0" * 64,
        size=1,
        build_seconds=1.0,
        built_at=0.0,
        ingredients={},
        build_log="",
    )
    old = Manifest(**base)  # type: ignore[arg-type]
    assert b"timings" not in old.to_json() and Manifest.parse(old.to_json()) == old
    timings = {
        "files": {
            "a.cpp": {"object": "compiled", "seconds": 1.5, "pch": "hit"},
            "b.cpp": {"object": "cached"},
        },
        "link_seconds": 0.2,
    }
    new = Manifest(**base, timings=timings)  # type: ignore[arg-type]
    assert Manifest.parse(new.to_json()).timings == timings
    assert summary(timings) == "a.cpp 1.5s, PCH hit; b.cpp cached; link 0.2s"
    timings["files"]["a.cpp"]["pch_bytes"] = 786 << 20  # the PCH's size, where one was used
    assert summary(timings) == "a.cpp 1.5s, PCH hit (786.0 MiB); b.cpp cached; link 0.2s"


def test_jitops_pch_setting_and_it_never_changes_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings.from_env({}).pch is True
    assert Settings.from_env({"JITOPS_PCH": "0"}).pch is False
    with pytest.raises(Exception, match="JITOPS_PCH"):
        Settings.from_env({"JITOPS_PCH": "maybe"})
    from jitops.plan import make_plan
    from jitops.registry import registry

    spec = registry().library("add")
    keys = {
        make_plan(spec, "cpu", settings=Settings.from_env({"JITOPS_PCH": v})).key
        for v in ("0", "1")
    }
    assert len(keys) == 1


# ------------------------------------------------------------------ builds of plain C++


def _wrapper(tmp_path: Path, compiler: str) -> tuple[Path, Path]:
    """A compiler that logs each command line, then runs the real one."""
    log = tmp_path / "compiles.log"
    real = CLANG if compiler == "clang" else (shutil.which("g++") or "g++")
    script = tmp_path / "cxx"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


def _compiles(log: Path) -> list[str]:
    """Names of the sources compiled (PCH builds and the namespace file left out)."""
    if not log.exists():
        return []
    lines = log.read_text().splitlines()
    return sorted(
        w.rsplit("/", 1)[-1]
        for ln in lines
        if " -c " in ln and "_jitops_namespace" not in ln
        for w in ln.split()
        if w.endswith(".cpp")
    )


def _pch_builds(log: Path) -> int:
    return sum("c++-header" in ln for ln in log.read_text().splitlines()) if log.exists() else 0


FILES = {
    f"f{i}.cpp": f'#include <vector>\n#include <string>\n#include "common.h"\n'
    f'extern "C" __attribute__((visibility("default"))) int f{i}() '
    f'{{ std::vector<int> v{{{i}, BASE}}; return v[0] + v[1] + (int)std::string("ab").size(); }}\n'
    for i in range(4)
}


def _library(root: Path, files: dict[str, str], base: int = 10) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "common.h").write_text(f"#pragma once\n#define BASE {base}\n")
    return root


def _job(
    tmp_path: Path,
    root: Path,
    cxx: Path,
    compiler: str,
    store: cache.Cache,
    n: int,
    use_pch: bool = True,
) -> build.BuildJob:
    build_dir = tmp_path / f"build{n}"
    build_dir.mkdir()
    return build.BuildJob(
        library="plain",
        target="cpu-test",
        device="cpu",
        namespace=f"jitops_plain_{n:016d}",
        sources=tuple(sorted(root.glob("*.cpp"))),
        include_dirs=(root,),
        cflags=("-O1",),
        cuda_cflags=(),
        ldflags=(),
        cxx=str(cxx),
        ninja=toolchain.find_ninja("plain"),
        nvcc=None,
        build_dir=build_dir,
        env=dict(os.environ),
        jobs=2,
        cache=store,
        root=root,
        identity=json.dumps({"compiler": compiler}),
        pch=compiler if use_pch else "",
        pch_build=True,
    )


def _run(job: build.BuildJob) -> tuple[dict[str, int], dict[str, object]]:
    result = build.build(job, None)
    lib = ctypes.CDLL(str(result.library))
    return {f"f{i}": getattr(lib, f"f{i}")() for i in range(4)}, result.timings


@pytest.mark.parametrize("compiler", COMPILERS)
def test_one_edited_file_of_four_recompiles_alone_and_relinks(
    tmp_path: Path, compiler: str
) -> None:
    store = cache.Cache(tmp_path / "cache")
    cxx, log = _wrapper(tmp_path, compiler)
    root = _library(tmp_path / "lib1", FILES)
    out, timings = _run(_job(tmp_path, root, cxx, compiler, store, 1, use_pch=False))
    assert out == {f"f{i}": i + 12 for i in range(4)}
    assert _compiles(log) == ["f0.cpp", "f1.cpp", "f2.cpp", "f3.cpp"]
    assert set(timings["files"]) == set(FILES) and timings["link_seconds"] > 0  # type: ignore[index,operator]

    log.unlink()
    (root / "f2.cpp").write_text(FILES["f2.cpp"].replace("return v[0]", "return 100 + v[0]"))
    out, timings = _run(_job(tmp_path, root, cxx, compiler, store, 2, use_pch=False))
    assert out == {"f0": 12, "f1": 13, "f2": 114, "f3": 15}
    assert _compiles(log) == ["f2.cpp"]
    assert [f for f, i in timings["files"].items() if i["object"] == "cached"] == [
        "f0.cpp",
        "f1.cpp",
        "f3.cpp",
    ]  # type: ignore[attr-defined]

    log.unlink()  # a header every file includes: all recompile
    (root / "common.h").write_text("#pragma once\n#define BASE 20\n")
    out, _ = _run(_job(tmp_path, root, cxx, compiler, store, 3, use_pch=False))
    assert out == {"f0": 22, "f1": 23, "f2": 124, "f3": 25} and len(_compiles(log)) == 4

    # the same files in another folder (load_inline writes each version to its own): all cached
    log.unlink()
    moved = shutil.copytree(root, tmp_path / "lib2")
    out, _ = _run(_job(tmp_path, moved, cxx, compiler, store, 4, use_pch=False))
    assert out == {"f0": 22, "f1": 23, "f2": 124, "f3": 25} and _compiles(log) == []
    # ...and its own headers count
    (moved / "common.h").write_text("#pragma once\n#define BASE 30\n")
    out, _ = _run(_job(tmp_path, moved, cxx, compiler, store, 5, use_pch=False))
    assert out["f0"] == 32 and len(_compiles(log)) == 4

    for obj in store.objects.glob("*.o"):  # a damaged cached object is a miss, never linked
        obj.write_bytes(b"garbage")
    log.unlink()
    out, _ = _run(_job(tmp_path, moved, cxx, compiler, store, 6, use_pch=False))
    assert out["f0"] == 32 and len(_compiles(log)) == 4


@pytest.mark.parametrize("compiler", COMPILERS)
def test_pch_is_built_once_in_the_cache_reused_and_rebuilt_when_damaged(
    tmp_path: Path, compiler: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = cache.Cache(tmp_path / "cache")
    cxx, log = _wrapper(tmp_path, compiler)
    root = _library(tmp_path / "lib", FILES)
    before = sorted(p.name for p in root.iterdir())
    out, timings = _run(_job(tmp_path, root, cxx, compiler, store, 1))
    assert out == {f"f{i}": i + 12 for i in range(4)}
    states = [i["pch"] for i in timings["files"].values()]  # type: ignore[attr-defined]
    # built once: maybe never again
    assert states == ["first use"] * 4 and _pch_builds(log) == 0, states
    # the same prefix compiled again (objects gone): now its PCH is built
    shutil.rmtree(store.objects)
    out, timings = _run(_job(tmp_path, root, cxx, compiler, store, 11))
    states = [i["pch"] for i in timings["files"].values()]  # type: ignore[attr-defined]
    # compiled as before; their one PCH was built beside them
    assert states == ["built"] * 4, states
    assert _pch_builds(log) == 1 and len(timings["pch_built"]) == 1  # type: ignore[arg-type]
    (pch_dir,) = [p for p in store.pch.iterdir() if p.is_dir()]
    assert (pch_dir / ("prefix.h.pch" if compiler == "clang" else "prefix.h.gch")).is_file()
    assert sorted(p.name for p in root.iterdir()) == before  # nothing written beside the sources

    def edit_f1(add: int, n: int) -> dict[str, object]:
        log.unlink()
        (root / "f1.cpp").write_text(FILES["f1.cpp"].replace("return v[0]", f"return {add} + v[0]"))
        out, timings = _run(_job(tmp_path, root, cxx, compiler, store, n))
        assert out == {"f0": 12, "f1": 13 + add, "f2": 14, "f3": 15} and _compiles(log) == [
            "f1.cpp"
        ]
        return timings["files"]["f1.cpp"]  # type: ignore[index,no-any-return]

    assert edit_f1(50, 2)["pch"] == "hit" and _pch_builds(log) == 0
    flags = [ln for ln in log.read_text().splitlines() if " -c " in ln and "f1.cpp" in ln][0]
    assert str(pch_dir) in flags

    gch = next(p for p in pch_dir.iterdir() if p.name.startswith("prefix.h."))
    data = bytearray(gch.read_bytes())  # damaged: a flipped byte; the manifest's sha256 catches it
    data[len(data) // 2] ^= 0xFF
    gch.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="jitops"):
        assert edit_f1(60, 3)["pch"] == "built"  # set aside, compiled without, rebuilt beside
    assert _pch_builds(log) == 1 and "is unusable" in caplog.text
    assert edit_f1(70, 4)["pch"] == "hit"


@pytest.mark.parametrize("compiler", COMPILERS)
def test_a_pch_the_compiler_rejects_falls_back_to_a_normal_compile(
    tmp_path: Path, compiler: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A PCH that passes jitops's checks but not the compiler's (here: made by a different command) costs one
    note and a compile without it; never a failed build, never a wrong result."""
    store = cache.Cache(tmp_path / "cache")
    cxx, log = _wrapper(tmp_path, compiler)
    root = _library(tmp_path / "lib", {"f0.cpp": FILES["f0.cpp"]})
    assert (
        build.build(_job(tmp_path, root, cxx, compiler, store, 1), None).timings["files"]["f0.cpp"][
            "pch"
        ]
        == "first use"
    )
    shutil.rmtree(store.objects)
    assert (
        build.build(_job(tmp_path, root, cxx, compiler, store, 11), None).timings["files"][
            "f0.cpp"
        ]["pch"]
        == "built"
    )
    (pch_dir,) = [p for p in store.pch.iterdir() if p.is_dir()]
    pch_file = next(p for p in pch_dir.iterdir() if p.name.startswith("prefix.h."))
    # Replace it by a PCH of other headers and a foreign macro, and make the manifest agree (sha256,
    # size).
    (tmp_path / "other.h").write_text("#include <map>\n#define FOREIGN 1\n")
    real = CLANG if compiler == "clang" else "g++"
    subprocess.run(
        [real, "-O0", "-x", "c++-header", str(tmp_path / "other.h"), "-o", str(pch_file)],
        check=True,
    )
    m = json.loads((pch_dir / "manifest.json").read_text())
    from jitops.base import fsutil

    m.update(size=pch_file.stat().st_size, sha256=fsutil.sha256_file(pch_file))
    (pch_dir / "manifest.json").write_text(json.dumps(m))
    (root / "f0.cpp").write_text(FILES["f0.cpp"].replace("return v[0]", "return 7 + v[0]"))
    log.unlink()
    with caplog.at_level(logging.INFO, logger="jitops"):
        result = build.build(_job(tmp_path, root, cxx, compiler, store, 2), None)
    assert ctypes.CDLL(str(result.library)).f0() == 19
    assert result.timings["files"]["f0.cpp"]["pch"] == "rejected"
    notes = [r for r in caplog.records if "precompiled header" in r.getMessage()]
    assert len(notes) == 1, [r.getMessage() for r in notes]


def test_a_pch_pruned_between_lookup_and_compile_costs_a_compile_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`jitops cache prune` in another process may remove a PCH after a build found it and before gcc opens
    it (prune keeps one used in the last 10 minutes, so this needs a PCH idle longer): one note, a rerun
    without it, the right result."""
    from jitops.build import tubuild

    store = cache.Cache(tmp_path / "cache")
    cxx, _ = _wrapper(tmp_path, "gcc")
    root = _library(tmp_path / "lib", {"f0.cpp": FILES["f0.cpp"]})
    build.build(_job(tmp_path, root, cxx, "gcc", store, 1), None)
    shutil.rmtree(store.objects)
    assert (
        build.build(_job(tmp_path, root, cxx, "gcc", store, 11), None).timings["files"]["f0.cpp"][
            "pch"
        ]
        == "built"
    )
    (pch_dir,) = [p for p in store.pch.iterdir() if p.is_dir()]
    (root / "f0.cpp").write_text(FILES["f0.cpp"].replace("return v[0]", "return 5 + v[0]"))
    calls: list[list[str]] = []

    def prune_then_run(argv: list[str], **kw: object) -> tuple[int, str]:
        if not calls:
            shutil.rmtree(pch_dir)  # after find(), before the compile
        calls.append(argv)
        return build.run_supervised(argv, **kw)  # type: ignore[arg-type]

    job = _job(tmp_path, root, cxx, "gcc", store, 2)
    with caplog.at_level(logging.INFO, logger="jitops"):
        rc, out, lib, timings = tubuild.build_tus(job, prune_then_run)
    assert rc == 0 and len(calls) == 2, out
    assert ctypes.CDLL(str(lib)).f0() == 17 and timings["files"]["f0.cpp"]["pch"] == "rejected"
    assert "refused a precompiled header" in caplog.text


# --------------------------------------------------------- a torch kernel, with and without the PCH

TORCH_KERNEL = """// an elementwise kernel in jitops's lean style
#include <jitops/op.h>
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty_like.h>

at::Tensor pchsq(const at::Tensor& x) {
  auto y = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "pchsq", [&] {
    const auto* a = x.data_ptr<scalar_t>();
    auto* b = y.data_ptr<scalar_t>();
    for (int64_t i = 0; i < x.numel(); ++i) b[i] = a[i] * a[i] / scalar_t(3) + scalar_t(0.25);
  });
  return y;
}
JITOPS_LIBRARY(m) { m.def("pchsq(Tensor x) -> Tensor"); }
JITOPS_LIBRARY_IMPL(CPU, m) { m.impl("pchsq", &pchsq); }
"""


def _exported(lib: str) -> list[str]:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True
    ).stdout
    return sorted(line.split()[-1] for line in out.splitlines() if line.strip())


def test_a_library_built_with_the_pch_behaves_as_one_built_without(
    session_cache: Path, tmp_path: Path
) -> None:
    """Same key, same outputs, same exported symbols; the second process loads with no compiler, no PCH work."""
    from tests.helpers import child_env, run_scenario

    # The first build records the prefix, the second builds its PCH, the third is compiled with it.
    earlier = [TORCH_KERNEL.replace("0.25", v) for v in ("0.5", "0.75")]
    with_pch = run_scenario("load_inline_and_run", name="pchsq", sources=[*earlier, TORCH_KERNEL])
    assert with_pch["ok"], with_pch
    assert with_pch["states"][-1] == ["hit"] or not with_pch["built"], with_pch
    plain_root = tmp_path / "plain-cache"
    # (a live cache: another worker may be writing)
    shutil.copytree(
        session_cache / "v1" / "toolchains",
        plain_root / "v1" / "toolchains",  # no second self-check
        ignore=shutil.ignore_patterns("*.tmp"),
    )
    plain = run_scenario(
        "load_inline_and_run",
        env=child_env(JITOPS_CACHE_DIR=str(plain_root), JITOPS_PCH="0"),
        name="pchsq",
        sources=[TORCH_KERNEL],
    )
    assert plain["ok"] and plain["built"], plain
    assert {i["pch"] for i in plain["timings"]["files"].values()} == {"off"}
    assert plain["key"] == with_pch["key"]  # the PCH never changes an entry's key
    assert plain["out"] == with_pch["out"] and plain["out32"] == with_pch["out32"]
    assert _exported(plain["library"]) == _exported(with_pch["library"])
    assert not (plain_root / "v1" / "pch").exists() or not any(
        (plain_root / "v1" / "pch").iterdir()
    )

    # warm: nothing built
    again = run_scenario("load_inline_and_run", name="pchsq", sources=[TORCH_KERNEL])
    assert again["ok"] and not again["built"] and again["out"] == with_pch["out"]


def test_per_file_ninja_file_links_cached_objects_and_builds_side_jobs(tmp_path: Path) -> None:
    """Pure: what write_ninja_file(tus=...) writes (ninja -t commands expands it; no compiler runs)."""
    from jitops.build import ninja

    root = _library(tmp_path / "lib", {"a.cpp": "int a;\n", "register.cpp": "int r;\n"})
    job = _job(tmp_path, root, Path("/usr/bin/c++"), "gcc", cache.Cache(tmp_path / "cache"), 1)
    (job.build_dir / "b.o").write_bytes(b"")
    tus = [
        ninja.TU(str(root / "a.cpp"), "a.o", extra=("-include", "/c/pch/prefix.h")),
        ninja.TU(str(root / "b.cpp"), "b.o", cached=True),
        ninja.TU(str(root / "register.cpp"), "register.o"),
    ]
    ninja.write_ninja_file(job, tus, [("_jitops_pch0", "echo side")])
    text = (job.build_dir / "build.ninja").read_text()
    assert "deps = gcc" not in text  # the object cache reads the .d files ninja would delete
    commands = subprocess.run(
        [toolchain.find_ninja("t"), "-t", "commands"],
        cwd=job.build_dir,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    compiles = [c for c in commands if " -c " in c]
    assert len(compiles) == 3  # a.cpp, register.cpp and the namespace file; b.o is linked as it is
    assert not any("JITOPS_NS" in c for c in commands)
    assert any(c.endswith("-o a.o -include /c/pch/prefix.h") for c in compiles)
    assert "echo side" in commands
    link = next(c for c in commands if "-shared" in c)
    assert all(o in link.split() for o in ("a.o", "b.o", "register.o", "_jitops_namespace.o"))
    assert (
        'library_namespace[] = "jitops_plain_0000000000000001"'
        in (job.build_dir / "_jitops_namespace.cpp").read_text()
    )


def test_info_shows_where_the_build_time_went() -> None:
    from jitops.cli import _build_time

    m = Manifest(
        key="k" * 64,
        library="lib",
        target="cpu",
        namespace="ns",
        library_file="liblib.so",
        sha256="0" * 64,
        size=1,
        build_seconds=2.5,
        built_at=0.0,
        ingredients={},
        build_log="",
        timings={
            "files": {"a.cpp": {"object": "compiled", "seconds": 2.0, "pch": "hit"}},
            "pch_built": {},
            "link_seconds": 0.3,
        },
    )
    assert _build_time(m) == "2.5s (a.cpp 2.0s, PCH hit; link 0.3s)"


def test_a_compile_error_with_the_pch_is_reported_at_once(tmp_path: Path) -> None:
    """The rerun without a PCH is for errors the PCH caused, not for the user's own (the notebook loop)."""
    from jitops.errors import BuildError

    store = cache.Cache(tmp_path / "cache")
    cxx, log = _wrapper(tmp_path, "gcc")
    root = _library(tmp_path / "lib", {"f0.cpp": FILES["f0.cpp"]})
    build.build(_job(tmp_path, root, cxx, "gcc", store, 1), None)
    shutil.rmtree(store.objects)
    # the second build of the prefix makes its PCH
    build.build(_job(tmp_path, root, cxx, "gcc", store, 11), None)
    (root / "f0.cpp").write_text(FILES["f0.cpp"].replace("return v[0]", "return nosuchname + v[0]"))
    log.unlink()
    with pytest.raises(BuildError, match="nosuchname"):
        build.build(_job(tmp_path, root, cxx, "gcc", store, 2), None)
    assert _compiles(log) == ["f0.cpp"], log.read_text()
    assert "prefix.h" in log.read_text()  # it was compiled with the PCH
