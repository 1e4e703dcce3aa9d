"""Every failure is a JitopsError that names its cause and fix (issue 20).

One test per input the issue lists (each failed on main before the fix), plus
the kinds around them: argument types, unparsable settings, obstructed cache
paths and odd-but-legal archives. Fake builds (``JITOPS_BUILDER=fake``),
in-process; the property test over the whole surface is test_properties.py.
"""

from __future__ import annotations

import io
import os
import tarfile
import warnings
from pathlib import Path

import pytest

import jitops
from jitops.store import admin as cache_admin, archive as cache_archive, repair, roots
from jitops.loading import loader
from jitops.build import entry as entry_mod
from jitops import plan as planning
from jitops.store.cache import Cache
from jitops.cli import main
from jitops.errors import (
    ArgumentError,
    CacheError,
    ConfigError,
    InvalidNameError,
    JitopsError,
    UnknownOpError,
)
from jitops.spec import Registry
from tests.cli_helpers import fake_spec


@pytest.fixture
def fake(private_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    """A registered fake-built spec with a name of the test's choosing, and the test's Cache."""
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    monkeypatch.setenv("JITOPS_PROGRESS", "0")
    # this test's get() calls start from the cache, not the memo
    monkeypatch.setattr(loader, "_ops", {})
    # nor from an earlier test's private temporary cache
    monkeypatch.setattr(roots, "_private", None)

    def make(name: str):  # type: ignore[no-untyped-def]
        spec = fake_spec(tmp_path / "specs", name)
        jitops.register(spec, replace=True)
        return spec

    return make, Cache(private_cache)


def plan_of(spec):  # type: ignore[no-untyped-def]
    return planning.make_plan(spec, "cpu")


# ------------------------------------------------------------------ 1. arguments


@pytest.mark.parametrize("bad", [["softmax"], {"softmax": 1}, ("softmax",), b"softmax", 3, None])
def test_get_takes_one_op_name(bad: object) -> None:
    with pytest.raises(JitopsError, match=r"jitops.get\(\) takes one op name") as info:
        jitops.get(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError) and isinstance(info.value, ArgumentError)
    assert type(bad).__name__ in str(info.value)


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda: jitops.get("softmax", device=0), "device"),
        (lambda: jitops.get("softmax", fallback="no"), "fallback"),
        (lambda: jitops.reference(["softmax"]), "name"),
        (lambda: jitops.register("softmax"), "OpSpec"),
        (
            lambda: jitops.register(
                jitops.OpSpec("x", Path("."), ("a.cpp",), exports=("x",)), replace="yes"
            ),
            "replace",
        ),
        (lambda: jitops.load("lib", 3), "sources"),
        (lambda: jitops.load("lib", ["a.cpp", 3]), "sources"),
        (lambda: jitops.load(["lib"], "a.cpp"), "name"),
        (lambda: jitops.load_inline("lib", {"x": 1}), "cpp_sources"),
        (lambda: jitops.load_inline("lib", "", extra_cflags=7), "extra_cflags"),
        (lambda: jitops.register_kernel_dir(5), "path"),
        (lambda: jitops.register_kernel_dir("x\0y"), "path"),
        (lambda: jitops.register_kernel_dir(".", ops=[1]), "ops"),
    ],
)
def test_public_functions_name_the_bad_argument(call, arg: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ArgumentError) as info:
        call()
    assert arg in str(info.value)


def test_a_kernel_folder_that_is_not_there_is_named(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("")
    for path in (tmp_path / "nope", tmp_path / "a_file"):
        with pytest.raises(jitops.KernelSourceError, match="does not exist or is not a directory"):
            jitops.register_kernel_dir(path)


def test_invalid_name_is_still_invalid_name_error() -> None:
    with pytest.raises(InvalidNameError):
        jitops.get("../etc")


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("Softmax", "softmax"), (" log_softmax ", "log_softmax"), ("my-kernels", "my_kernels")],
)
def test_a_near_valid_name_suggests_the_valid_one(typed: str, meant: str) -> None:
    with pytest.raises(InvalidNameError, match=f"Did you mean '{meant}'"):
        jitops.get(typed)


def test_a_hopeless_name_suggests_nothing() -> None:
    with pytest.raises(InvalidNameError) as info:
        jitops.get("../etc")
    assert "Did you mean" not in str(info.value)


def test_an_unknown_op_lists_the_known_ones() -> None:
    with pytest.raises(UnknownOpError) as info:
        jitops.get("nope")
    listed = info.value.available[: UnknownOpError.SHOWN]
    assert {"add", "log_softmax", "nms", "softmax"} <= set(info.value.available)
    assert "did you mean" not in str(info.value)
    assert f"known ops: {', '.join(listed)}" in str(info.value)


def test_the_known_ops_are_listed_up_to_a_bound(tmp_path: Path) -> None:
    reg = Registry()
    reg.extend([fake_spec(tmp_path, f"many_{i:02}") for i in range(UnknownOpError.SHOWN + 5)])
    with pytest.raises(UnknownOpError) as info:
        reg.lookup("many_9")
    msg = str(info.value)
    assert "many_09" in info.value.suggestions and "did you mean" in msg
    assert (
        f"many_{UnknownOpError.SHOWN - 1:02}" in msg
        and f"many_{UnknownOpError.SHOWN:02}" not in msg
    )
    assert "and 5 more (jitops.list_ops() lists every op)" in msg


# ------------------------------------------------------------------ 2. settings


@pytest.mark.parametrize("var", ["CXXFLAGS", "CFLAGS", "LDFLAGS"])
def test_unbalanced_quote_in_flags_names_the_variable_even_for_cached_ops(
    fake, monkeypatch, var: str
) -> None:  # type: ignore[no-untyped-def]
    make, _cache = fake
    make("flagop")
    jitops.get("flagop")  # cached now
    monkeypatch.setattr(loader, "_ops", {})  # as a new process would: from the cache
    monkeypatch.setattr(loader, "_libraries", {})
    monkeypatch.setenv(var, '-O2 "-DX=1')
    with pytest.raises(ConfigError) as info:
        jitops.get("flagop")
    msg = str(info.value)
    assert var in msg and "-DX=1" in msg and "Fix:" in msg
    assert isinstance(info.value, ValueError)


def test_fallback_names_the_flag_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "_ops", {})
    monkeypatch.setattr(loader, "_fallback_warned", set())
    monkeypatch.setenv("CXXFLAGS", "-O2 '-DX=1")
    with pytest.warns(RuntimeWarning, match="CXXFLAGS"):
        op = jitops.get("softmax", fallback=True)
    import torch

    x = torch.randn(3, 5)
    assert torch.allclose(op(x, 1), torch.softmax(x, 1))


@pytest.mark.parametrize("var", ["NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS"])
def test_unbalanced_nvcc_flags_name_the_variable_for_cuda(
    monkeypatch: pytest.MonkeyPatch, var: str
) -> None:
    from jitops.key import extra_env_flags
    from jitops.target import probe

    monkeypatch.setenv(var, '--foo "bar')
    assert extra_env_flags(probe(cuda=False), "cpu")  # a CPU build does not use them
    with pytest.raises(ConfigError, match=var):
        extra_env_flags(probe(cuda=False), "cuda")


@pytest.mark.parametrize("value", ["abc", "0", "-2", "²", "1e3", "4.5"])
def test_max_jobs_junk_is_a_config_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from jitops.base.settings import Settings

    with pytest.raises(ConfigError, match="MAX_JOBS"):
        Settings.from_env({"MAX_JOBS": value})


def test_lock_timeout_nan_is_a_config_error() -> None:
    from jitops.base.settings import Settings

    with pytest.raises(ConfigError, match="JITOPS_LOCK_TIMEOUT"):
        Settings.from_env({"JITOPS_LOCK_TIMEOUT": "nan"})


def test_doctor_reports_unsplittable_flags(monkeypatch, capsys, private_cache) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LDFLAGS", "-L'/opt")
    rc = main(["doctor"])
    out, err = capsys.readouterr()
    assert "FAIL  settings" in out and "LDFLAGS" in out, out
    assert rc == 1 and "Traceback" not in err


# ------------------------------------------------------------------ 3. obstructions


def test_directory_at_lock_path_no_longer_makes_an_op_unbuildable(fake) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    spec = make("lockdirop")
    plan = plan_of(spec)
    lock = cache.lock_path(spec.name, plan.key)
    lock.mkdir(parents=True)  # a mistaken `mkdir -p`
    op = jitops.get("lockdirop")  # the real get path, fake builder
    assert op.library is not None and op.library.built
    assert lock.is_file()


def test_nonempty_directory_at_lock_path_names_path_and_repair(fake, capsys) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    spec = make("lockfullop")
    plan = plan_of(spec)
    lock = cache.lock_path(spec.name, plan.key)
    (lock / "keep").mkdir(parents=True)
    with pytest.raises(CacheError) as info:
        jitops.get("lockfullop")
    assert str(lock) in str(info.value) and "jitops cache repair" in str(info.value)
    assert main(["doctor"]) in (0, 1)
    out, _ = capsys.readouterr()
    assert "layout" in out and str(lock) in out and "jitops cache repair" in out
    assert main(["cache", "repair"]) == 0
    assert not lock.exists()
    assert jitops.get("lockfullop").library.built


@pytest.mark.parametrize("where", ["locks", "staging", "entries"])
@pytest.mark.parametrize("what", ["file", "empty", "link"])
def test_obstructed_cache_folders_heal_or_name_the_fix(fake, where: str, what: str) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    make(f"ob{where}{what}")
    cache.base.mkdir(parents=True)
    path = cache.base / where
    if what == "file":
        path.write_text("user data")
    elif what == "empty":
        path.write_text("")
    else:
        path.symlink_to(cache.root.parent)
    with warnings.catch_warnings():
        # a file with data: the private temporary cache, with a warning
        warnings.simplefilter("ignore")
        op = jitops.get(f"ob{where}{what}")
    assert op.library is not None
    if what != "file":
        assert path.is_dir() and not path.is_symlink()  # healed in place
        assert op.library.entry.is_relative_to(cache.root)
    assert os.path.isdir(cache.root.parent)  # a link's target is never touched


def test_scan_and_repair_cover_the_layout(fake, capsys) -> None:  # type: ignore[no-untyped-def]
    make, cache = fake
    spec = make("scanop")
    entry = entry_mod.ensure_entry(plan_of(spec)).path
    (cache.base / "trash").write_text("x")
    cache.toolchains.mkdir(parents=True, exist_ok=True)
    bad_record = cache.toolchains / ("a" * 32 + ".json")
    bad_record.mkdir()
    (entry.parent / "stray").write_text("x")
    found = {o.path for o in repair.scan(cache)}
    assert {cache.base / "trash", bad_record, entry.parent / "stray"} <= found
    assert main(["cache", "repair"]) == 0
    assert repair.scan(cache) == []
    assert main(["cache", "verify"]) == 0
    capsys.readouterr()


# ------------------------------------------------------------------ 4. archives


def _exported(fake, tmp_path: Path, name: str) -> tuple[Path, Cache]:  # type: ignore[no-untyped-def]
    make, cache = fake
    entry_mod.ensure_entry(plan_of(make(name)))
    bundle = tmp_path / f"{name}.tar.gz"
    cache_archive.export(cache, bundle, {name})
    return bundle, cache


def _plain_tar(src: Path, dest: Path) -> None:
    with tarfile.open(src) as tin, tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tout:
        for m in tin.getmembers():
            tout.addfile(m, tin.extractfile(m) if m.isfile() else None)


def test_import_of_a_tar_with_duplicate_members(fake, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bundle, cache = _exported(fake, tmp_path, "dupop")
    plain = tmp_path / "dup.tar"
    _plain_tar(bundle, plain)
    # like `tar -r`: append members again
    with (
        tarfile.open(bundle) as tin,
        tarfile.open(plain, "a") as tar,
    ):
        for m in tin.getmembers():
            tar.addfile(m, tin.extractfile(m))
    with tarfile.open(plain) as t:
        names = t.getnames()
    assert len(names) > len(set(names))
    cache_admin.clear(cache)
    rc = main(["cache", "import", str(plain)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "1 imported" in out and err == ""
    assert main(["cache", "verify"]) == 0


def test_import_duplicate_last_member_wins(fake, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bundle, cache = _exported(fake, tmp_path, "lastop")
    plain = tmp_path / "last.tar"
    _plain_tar(bundle, plain)
    with tarfile.open(plain) as t:
        manifest = next(m for m in t.getmembers() if m.name.endswith("manifest.json"))
    with tarfile.open(
        plain, "a"
    ) as tar:  # a later, damaged copy of the manifest replaces the good one
        info = tarfile.TarInfo(manifest.name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    cache_admin.clear(cache)
    rc = main(["cache", "import", str(plain)])
    out, err = capsys.readouterr()
    assert rc == 1 and "1 rejected" in out and "rejected lastop/" in err
    assert "Errno" not in err and "staging" not in err


@pytest.mark.parametrize("damage", ["truncated", "missing_manifest", "garbage"])
def test_import_failures_show_no_errno_or_staging_path(
    fake, tmp_path: Path, capsys, damage: str
) -> None:  # type: ignore[no-untyped-def]
    bundle, cache = _exported(fake, tmp_path, f"imp{damage}")
    bad = tmp_path / "bad.tar"
    if damage == "truncated":
        plain = tmp_path / "p.tar"
        _plain_tar(bundle, plain)
        bad.write_bytes(plain.read_bytes()[:700])
    elif damage == "missing_manifest":
        with tarfile.open(bundle) as tin, tarfile.open(bad, "w") as tout:
            for m in tin.getmembers():
                if not m.name.endswith("manifest.json"):
                    tout.addfile(m, tin.extractfile(m))
    else:
        bad.write_bytes(os.urandom(3000))
    rc = main(["cache", "import", str(bad)])
    _out, err = capsys.readouterr()
    assert rc == 1, err
    assert err.strip() and "Errno" not in err and "staging" not in err and "Traceback" not in err


def test_a_refused_schema_is_the_same_kernel_source_error_every_time(fake) -> None:  # type: ignore[no-untyped-def]
    """Found by the property test: the second call raised torch's "Only a single TORCH_LIBRARY"."""
    from jitops.errors import KernelSourceError

    for _ in range(2):
        with pytest.raises(KernelSourceError, match="refuses the schema"):
            jitops.load_inline(
                "badschema",
                "// nothing\n",
                schemas=["ok_op(Tensor x) -> Tensor", "bad_op(Tensor x -> Tensor"],
            )


def test_a_library_loaded_again_in_a_process_registers_its_python_side_once(
    fake,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's registrations (a twin op's schema, fake kernels) live as long as the process: the library's Python
    side runs once per namespace, even when the library is loaded again (the memo of loaded libraries emptied).
    Its second run raised torch's "registered ... multiple times" (found by two tests sharing an xdist worker)."""
    import dataclasses
    import sys

    mod = tmp_path / "pyside_once.py"
    mod.write_text(
        "import torch\nCALLS = []\n_LIBS = []\n"
        "def register(ns):\n    CALLS.append(ns)\n    lib = torch.library.Library(ns, 'FRAGMENT')\n"
        "    _LIBS.append(lib)\n    lib.define('twin_once(Tensor x) -> Tensor')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pyside_once", raising=False)
    make, _cache = fake
    spec = dataclasses.replace(make("pyside"), python="pyside_once")
    jitops.register(spec, replace=True)
    first = jitops.get("pyside")
    monkeypatch.setattr(loader, "_ops", {})
    monkeypatch.setattr(loader, "_libraries", {})
    again = jitops.get("pyside")  # the same key and namespace, loaded again
    assert again.library is not None and first.library is not None
    assert again.library.namespace == first.library.namespace
    assert sys.modules["pyside_once"].CALLS == [first.library.namespace]
