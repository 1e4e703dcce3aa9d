"""A property over the whole public surface (issue 20): every failure is a JitopsError.

Four surfaces, each with at least 200 hypothesis examples, in-process, with
tests/fakelib's specs and, for volume, a builder that copies a library the fake
builder (``JITOPS_BUILDER=fake``) made once:

- arguments of every type for each public function;
- values of each environment variable jitops reads (empty, unicode, quotes,
  NUL-free binary junk, huge);
- an obstruction (folder, file, link, read-only folder) at each path of the
  cache layout;
- tar member lists for ``cache import`` (duplicates, odd orders, links, empty files).

The property: the call succeeds or raises a JitopsError with a non-empty
message; the CLI (``cli.main``) exits 0, 1 or 2, and on failure its last line
on stderr is jitops's own, with no traceback; and afterwards, in a clean
state, getting an op still works. ``test_real_compiler_*`` repeat a few cases
with the real compiler.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import jitops
from jitops.build import runner as build_mod
from jitops.store import admin as cache_admin, archive as cache_archive, roots
from jitops.loading import loader
from jitops import cli
from jitops.build import entry as entry_mod
from jitops import plan as planning
from jitops.base import settings as settings_mod
from jitops.registry import registry
from jitops.store.cache import Cache
from jitops.errors import JitopsError
from tests import fakelib
from tests.helpers import environ

EXAMPLES = int(os.environ.get("JITOPS_PROPERTY_EXAMPLES", "200"))
PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
BUILTIN_OPS = ("softmax", "log_softmax", "add", "add_", "nms")


# ------------------------------------------------------------------ shared state


@contextlib.contextmanager
def clean_loader() -> Iterator[None]:
    """Each example starts from the cache, not from the memo or a private cache of an earlier one."""
    reg = registry()
    specs, index = dict(reg._specs), dict(reg._index)
    loader._ops.clear()
    roots._private = None
    try:
        yield
    finally:
        with reg._lock:
            reg._specs.clear(), reg._specs.update(specs)
            reg._index.clear(), reg._index.update(index)
        loader._ops.clear()
        roots._private = None


BUILDER = "property"  # JITOPS_BUILDER for these tests: see ``world``


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A template cache holding a ``fakeadd`` entry, and its export.

    The fake builder runs ``cc`` under the supervisor (~0.3 s a build). For
    volume, these tests register one more builder beside it that copies a
    library the fake builder made once; everything around the compiler (plan,
    key, lock, staging, publish, verify, load) is the real code.
    """
    base = tmp_path_factory.mktemp("props")
    with environ(
        JITOPS_CACHE_DIR=str(base / "scratch"), JITOPS_BUILDER="fake", JITOPS_PROGRESS="0"
    ):
        fakelib.register_all()
        proto = base / "proto.so"
        made = entry_mod.ensure_entry(planning.make_plan(fakelib.FAKEADD, "cpu"))
        shutil.copyfile(made.path / "libfakeadd.so", proto)

    def copy_build(job: Any, on_line: Any = None) -> tuple[int, str, Path]:
        out = job.build_dir / f"{job.library}.so"
        shutil.copyfile(proto, out)
        return 0, f"copied {proto}", out

    build_mod.BUILDERS[BUILDER] = copy_build
    known = settings_mod.BUILDERS
    settings_mod.BUILDERS = (*known, BUILDER)  # Settings.from_env accepts only builders it knows
    template = base / "template"
    with environ(JITOPS_CACHE_DIR=str(template), JITOPS_BUILDER=BUILDER, JITOPS_PROGRESS="0"):
        entry = entry_mod.ensure_entry(planning.make_plan(fakelib.FAKEADD, "cpu"))
        bundle = base / "fakeadd.tar"
        cache_archive.export(Cache(template), base / "fakeadd.tar.gz", {"fakeadd"})
        with tarfile.open(base / "fakeadd.tar.gz") as tin:
            members = {
                m.name: (m, tin.extractfile(m).read() if m.isfile() else b"")
                for m in tin.getmembers()
            }
    yield {
        "base": base,
        "template": template,
        "entry": entry.path.relative_to(template),
        "bundle": bundle,
        "members": members,
        "key": entry.plan.key,
    }
    del build_mod.BUILDERS[BUILDER]
    settings_mod.BUILDERS = known


def fresh_cache(world: dict[str, Any]) -> Path:
    root = Path(tempfile.mkdtemp(dir=world["base"], prefix="c-")) / "cache"
    shutil.copytree(world["template"], root, symlinks=True)
    return root


def drop(path: Path) -> None:
    """Remove whatever an example left, read-only folders included."""
    for p in [path, *path.rglob("*")] if path.is_dir() and not path.is_symlink() else [path]:
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                os.chmod(p, 0o700)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def outcome(call: Any) -> Any:
    """Run ``call``: its result, or the JitopsError it raised (after checking the message)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return call()
    except JitopsError as e:
        assert str(e).strip(), f"{type(e).__name__} with an empty message"
        return e


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc in (0, 1, 2), (argv, rc, err)
    assert "Traceback" not in err, err
    if rc:
        last = err.strip().splitlines()[-1] if err.strip() else ""
        assert last.startswith(("jitops", "rejected", "usage")) and len(last) < 2000, (argv, err)
    return rc, out, err


def still_works(world: dict[str, Any]) -> None:
    """In a clean state (a fresh copy of the template cache, plain settings), get() works."""
    root = fresh_cache(world)
    with (
        environ(
            JITOPS_CACHE_DIR=str(root),
            JITOPS_BUILDER=BUILDER,
            JITOPS_OFFLINE=None,
            JITOPS_FALLBACK=None,
        ),
        clean_loader(),
        warnings.catch_warnings(),
    ):
        # the fake kernels re-registered for a new load of the same namespace
        warnings.simplefilter("ignore")
        loader._libraries.clear()
        op = jitops.get("fakeadd")
        assert fakelib.check(op, "fakeadd")
        assert op.library is not None and op.library.entry.is_relative_to(root)
    drop(root.parent)


# ------------------------------------------------------------------ 1. arguments

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=6)
    | st.sampled_from(
        [
            "fakeadd",
            "fakemul",
            "softmax",
            "nosuchop",
            "../x",
            "",
            "Fake",
            "a" * 70,
            "cpu",
            "cuda",
            "tpu",
            "k.cpp",
            "/nonexistent/k.cpp",
            "x\0y",
        ]
    )
)
ANY = st.recursive(
    _scalars,
    lambda c: (
        st.lists(c, max_size=3)
        | st.tuples(c)
        | st.dictionaries(st.text(max_size=3), c, max_size=2)
        | st.builds(Path, st.sampled_from(["k.cpp", ".", "/nonexistent"]))
    ),
    max_leaves=4,
)


def _specs() -> st.SearchStrategy[Any]:
    fields = st.fixed_dictionaries(
        {"name": ANY, "root": ANY, "cpu_sources": ANY},
        optional={
            "cuda_sources": ANY,
            "schemas": ANY,
            "exports": ANY,
            "cflags": ANY,
            "include_dirs": ANY,
            "python": ANY,
            "editable": ANY,
        },
    )
    return st.builds(lambda kw: outcome(lambda: jitops.OpSpec(**kw)), fields)


@pytest.fixture(scope="module")
def kernel_dir(world: dict[str, Any]) -> Path:
    d = world["base"] / "kdir" / "kdir"
    d.mkdir(parents=True)
    (d / "k.cpp").write_text("// a kernel folder for the property test\n")
    return d


CALLS = ["get", "reference", "register", "load", "load_inline", "register_kernel_dir", "OpSpec"]


@PROPERTY
@given(data=st.data())
@pytest.mark.parametrize("func", CALLS)
def test_every_public_function_raises_only_jitops_errors(
    world, kernel_dir, func: str, data: st.DataObject
) -> None:  # type: ignore[no-untyped-def]
    draw = data.draw
    lists = {
        k: draw(st.none() | ANY)
        for k in ("extra_cflags", "extra_ldflags", "schemas")
        if draw(st.booleans())
    }
    device = draw(st.none() | st.sampled_from(["cpu", "cuda", "tpu"]) | ANY)
    src = str(kernel_dir / "k.cpp")
    if func == "get":
        name = draw(ANY)
        assume(name not in BUILTIN_OPS)  # a builtin would be fake-built without its kernels
        call = lambda: jitops.get(
            name, device=device, fallback=draw(st.none() | st.booleans() | ANY)
        )  # noqa: E731
    elif func == "reference":
        name = draw(ANY)
        call = lambda: jitops.reference(name)  # noqa: E731
    elif func == "register":
        spec = draw(_specs() | ANY)
        assume(not (isinstance(spec, jitops.OpSpec) and set(spec.exports) & {"fakeadd", "fakemul"}))
        call = lambda: jitops.register(spec, replace=draw(ANY | st.booleans()))  # noqa: E731
    elif func == "load":
        sources = draw(ANY | st.just(src) | st.just([src, src]))
        call = lambda: jitops.load(draw(ANY | st.just("propload")), sources, device=device, **lists)  # noqa: E731
    elif func == "load_inline":
        cpp = draw(ANY | st.just("// empty\n"))
        call = lambda: jitops.load_inline(
            draw(ANY | st.just("propinline")), cpp, device=device, **lists
        )  # noqa: E731
    elif func == "register_kernel_dir":
        path = draw(ANY | st.just(kernel_dir) | st.just(str(kernel_dir)))
        ops = draw(st.none() | ANY | st.just(["kdir_op"]))
        call = lambda: jitops.register_kernel_dir(
            path, name=draw(st.none() | ANY), ops=ops, device=device, **lists
        )  # noqa: E731
    else:
        kw = draw(st.fixed_dictionaries({"name": ANY, "root": ANY, "cpu_sources": ANY}))
        call = lambda: jitops.OpSpec(**kw)  # noqa: E731
    with (
        environ(
            JITOPS_CACHE_DIR=str(world["template"]), JITOPS_BUILDER=BUILDER, JITOPS_PROGRESS="0"
        ),
        clean_loader(),
    ):
        outcome(call)


def test_list_ops_and_arguments_leave_get_working(world) -> None:  # type: ignore[no-untyped-def]
    with environ(JITOPS_CACHE_DIR=str(world["template"])), clean_loader():
        assert {"fakeadd", "fakemul", "softmax"} <= set(jitops.list_ops())
    still_works(world)


# ------------------------------------------------------------------ 2. environment

ENV_VARS = (
    "CXX",
    "CC",
    "CFLAGS",
    "CXXFLAGS",
    "LDFLAGS",
    "CUDA_HOME",
    "TORCH_CUDA_ARCH_LIST",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "MAX_JOBS",
    "JITOPS_CACHE_DIR",
    "JITOPS_OFFLINE",
    "JITOPS_FALLBACK",
    "JITOPS_STRICT",
    "JITOPS_LOCK_TIMEOUT",
    "JITOPS_PROGRESS",
    "JITOPS_BUILDER",
    # issue 28: the remote tier's variables (a file:// store in the sandbox is set for the others)
    "JITOPS_REMOTE_CACHE",
    "JITOPS_REMOTE_CACHE_MODE",
    "JITOPS_REMOTE_TRUSTED_KEYS",
    "JITOPS_REMOTE_CONNECT_TIMEOUT",
    "JITOPS_REMOTE_TIMEOUT",
    "JITOPS_REMOTE_LEASE_SECONDS",
    "JITOPS_REMOTE_FAILURE_SECONDS",
    "JITOPS_DISTRIBUTED",
    "JITOPS_HOST_ID",
)
_no_nul = st.characters(blacklist_characters="\0", blacklist_categories=("Cs",))
VALUES = st.one_of(
    st.just(""),
    st.text(_no_nul, max_size=20),
    st.lists(
        st.sampled_from(
            ["'", '"', "\\", " ", "-O2", "-DX=1", "$(x)", "`", "\n", "é", "8.0", "+PTX", ";"]
        ),
        max_size=8,
    ).map("".join),
    st.binary(max_size=20).map(lambda b: os.fsdecode(b.replace(b"\0", b""))),
    st.sampled_from(
        [
            "x" * 5000,
            "/bin/false",
            "/bin/true",
            "/etc/passwd",
            "cc -m32",
            "nan",
            "inf",
            "-1",
            "0",
            "²",
            "1e9",
            "native",
            "Hopper+PTX",
            "fake",
            "~",
            "~nobody/x",
            ".",
            "/",
            "1",
            "yes",
            "off",
            "1e300",
            "-5",
            "-inf",
            "0.001",
            "zip://x",
            "tar://x",
            "reference://x",
            "/dev/zero",
            "/bin/sh",
            "signed",
            "read",
            "write",
            "ed25519:AAAA",
        ]
    ),
)
ENV_ACTIONS = ("get", "get", "get", "explain", "info", "ls", "fingerprint")


@PROPERTY
@given(var=st.sampled_from(ENV_VARS), value=VALUES, action=st.sampled_from(ENV_ACTIONS))
def test_every_environment_value_gives_a_named_error(
    world, capsys, var: str, value: str, action: str
) -> None:  # type: ignore[no-untyped-def]
    # a real compile: test_real_compiler_*
    assume(not (var == "JITOPS_BUILDER" and value.strip() == "real"))
    root = fresh_cache(world)
    sandbox = root.parent / "home"
    sandbox.mkdir()
    values = {
        "JITOPS_CACHE_DIR": str(root),
        "JITOPS_BUILDER": BUILDER,
        "JITOPS_PROGRESS": "0",
        "HOME": str(sandbox),
        "XDG_CACHE_HOME": str(sandbox),
    }
    if var == "JITOPS_CACHE_DIR" and value.strip() and not value.startswith("/"):
        # relative or ~ paths: inside the sandbox, never the checkout
        value = str(sandbox / value.lstrip("~"))
    if var.startswith(("JITOPS_REMOTE_", "JITOPS_DISTRIBUTED", "JITOPS_HOST_ID")):
        if var != "JITOPS_REMOTE_CACHE":
            # so the remote settings are used
            values["JITOPS_REMOTE_CACHE"] = f"file://{root.parent / 'shared'}"
        shutil.rmtree(root / world["entry"])  # a local miss: `get` goes through the remote tier
    values[var] = value
    cwd = os.getcwd()
    try:
        os.chdir(sandbox)
        with environ(**values), clean_loader():
            if action == "get":
                loader._libraries.clear()  # as a new process: plan, key and cache, not the memo
                result = outcome(lambda: jitops.get("fakeadd"))
                assert isinstance(result, JitopsError) or fakelib.check(result, "fakeadd")
            else:
                argv = {
                    "explain": ["explain", "fakeadd"],
                    "info": ["info", "fakeadd"],
                    "ls": ["cache", "ls"],
                    "fingerprint": ["cache", "fingerprint"],
                }[action]
                run_cli(argv, capsys)
    finally:
        os.chdir(cwd)
        loader._libraries.clear()
    still_works(world)
    drop(root.parent)


# ------------------------------------------------------------------ 3. obstructions

LAYOUT = (
    "",
    "v1",
    "v1/entries",
    "v1/entries/fakeadd",
    "<target>",
    "<entry>",
    "<entry>/manifest.json",
    "<entry>/libfakeadd.so",
    "v1/staging",
    "v1/locks",
    "<lock>",
    "<holder>",
    "v1/toolchains",
    "<record>",
    "v1/logs",
    "v1/trash",
    "v1/inline",
)
KINDS = (
    "empty folder",
    "folder",
    "empty file",
    "file",
    "link",
    "dangling link",
    "read-only folder",
)
OB_ACTIONS = ("ls", "verify", "repair", "clear", "explain", "prune", "doctor-layout")
OB_EXAMPLES = max(1, -(-EXAMPLES // len(LAYOUT)))  # every path, and at least EXAMPLES in all


def _layout_path(world: dict[str, Any], root: Path, where: str) -> Path:
    entry = root / world["entry"]
    key = world["key"][:32]
    records = sorted((root / "v1" / "toolchains").glob("*.json"))
    special = {
        "<target>": entry.parent,
        "<entry>": entry,
        "<lock>": root / f"v1/locks/fakeadd-{key}.lock",
        "<holder>": root / f"v1/locks/fakeadd-{key}.holder",
        "<record>": records[0] if records else root / "v1/toolchains" / ("0" * 32 + ".json"),
    }
    head, _, rest = where.partition("/")
    if head in special:
        return special[head] / rest if rest else special[head]
    return root / where if where else root


def _obstruct(path: Path, kind: str, outside: Path) -> None:
    if kind == "read-only folder":
        if not path.is_dir() or path.is_symlink():
            drop(path)
            path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o500)
        return
    drop(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "empty folder":
        path.mkdir()
    elif kind == "folder":
        path.mkdir()
        (path / "data").write_text("someone's data")
    elif kind == "empty file":
        path.write_bytes(b"")
    elif kind == "file":
        path.write_text("someone's data")
    elif kind == "link":
        path.symlink_to(outside)
    else:
        path.symlink_to(outside / "missing")


def _ensure(world: dict[str, Any], root: Path, miss: bool) -> None:
    """ensure_entry for the template's key: a hit, or (``miss``) a build after its entry is gone."""
    if miss:
        drop(root / world["entry"])
    loader._libraries.clear()
    result = outcome(lambda: entry_mod.ensure_entry(planning.make_plan(fakelib.FAKEADD, "cpu")))
    if not isinstance(result, JitopsError):
        plan = result.plan
        plan.cache.verify(result.path, plan.key, "fakeadd", plan.target.name)


@pytest.mark.parametrize("where", LAYOUT)
@settings(PROPERTY, max_examples=OB_EXAMPLES)
@given(kind=st.sampled_from(KINDS), action=st.sampled_from(OB_ACTIONS), miss_first=st.booleans())
def test_every_obstruction_heals_or_names_the_fix(
    world,
    capsys,
    where: str,
    kind: str,
    action: str,  # type: ignore[no-untyped-def]
    miss_first: bool,
) -> None:
    root = fresh_cache(world)
    outside = root.parent / "outside"
    outside.mkdir()
    (outside / "precious").write_text("must survive")
    path = _layout_path(world, root, where)
    in_entry = where.startswith(("<entry>", "<target>", "v1/entries")) or where in ("", "v1")
    _obstruct(path, kind, outside)
    try:
        with (
            environ(JITOPS_CACHE_DIR=str(root), JITOPS_BUILDER=BUILDER, JITOPS_PROGRESS="0"),
            clean_loader(),
        ):
            # The hit path, the build path (its lock, staging and publish), and one command.
            _ensure(world, root, miss=miss_first and not in_entry)
            _ensure(world, root, miss=not in_entry)
            if action == "doctor-layout":
                from jitops.cli import diagnose

                check = outcome(lambda: diagnose._obstructions(root))
                assert isinstance(check, JitopsError) or check.status in ("ok", "warn")
            else:
                argv = {
                    "ls": ["cache", "ls"],
                    "verify": ["cache", "verify"],
                    "repair": ["cache", "repair"],
                    "clear": ["cache", "clear"],
                    "explain": ["explain", "fakeadd"],
                    "prune": ["cache", "prune", "--max-size", "0"],
                }[action]
                run_cli(argv, capsys)
        assert (
            outside / "precious"
        ).read_text() == "must survive"  # nothing outside the cache is touched
        # Clean state: `jitops cache repair` clears what stands in the cache's own tree...
        for p in [path, *path.parents]:
            with contextlib.suppress(OSError):
                if p.is_dir() and not p.is_symlink() and p.is_relative_to(root):
                    os.chmod(p, 0o700)
        if where in ("", "v1"):  # ...the root and v1 are the user's choice: the user clears them
            drop(path)
        with environ(JITOPS_CACHE_DIR=str(root)):
            rc, _out, err = run_cli(["cache", "repair"], capsys)
            assert rc == 0, err
        with environ(JITOPS_CACHE_DIR=str(root), JITOPS_BUILDER=BUILDER), clean_loader():
            loader._libraries.clear()
            entry = entry_mod.ensure_entry(planning.make_plan(fakelib.FAKEADD, "cpu"))
            assert entry.path.is_relative_to(root)
    finally:
        loader._libraries.clear()
        drop(root.parent)


# ------------------------------------------------------------------ 4. archives

MEMBER_KINDS = ("good", "good", "good", "empty", "junk", "dir", "symlink", "hardlink", "fifo")


def _member_names(world: dict[str, Any]) -> list[str]:
    names = [n for n, (m, _) in world["members"].items() if m.isfile()]
    return [
        *names,
        *(n.rsplit("/", 1)[0] for n in names[:1]),
        "v1/entries",
        "v1/toolchains/" + "b" * 32 + ".json",
        "v1/other",
        "../escape",
        "/abs/x",
        "v1/entries/fakeadd/x/y/manifest.json",
    ]


@PROPERTY
@given(
    data=st.data(),
    gz=st.booleans(),
    fmt=st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]),
)
def test_every_tar_member_list_imports_or_is_refused_in_one_line(
    world, capsys, data, gz: bool, fmt: int
) -> None:  # type: ignore[no-untyped-def]
    names = _member_names(world)
    good_names = [n for n, (m, _) in world["members"].items() if m.isfile()]
    members = data.draw(
        st.lists(st.tuples(st.sampled_from(names), st.sampled_from(MEMBER_KINDS)), max_size=8)
    )
    members = data.draw(st.permutations(members))
    root = Path(tempfile.mkdtemp(dir=world["base"], prefix="i-"))
    bundle = root / ("b.tar.gz" if gz else "b.tar")
    with tarfile.open(bundle, "w:gz" if gz else "w", format=fmt) as tar:
        for name, kind in members:
            info = tarfile.TarInfo(name)
            body = b""
            if kind == "good":
                body = world["members"].get(
                    name, (None, b'{"path": "/usr/bin/c++", "version": "x"}')
                )[1]
            elif kind == "junk":
                body = data.draw(st.binary(max_size=64))
            if kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind in ("symlink", "hardlink"):
                info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.LNKTYPE
                info.linkname = "/etc/passwd" if kind == "symlink" else names[0]
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            info.size = len(body) if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
            tar.addfile(info, io.BytesIO(body) if info.size else None)
    cache_root = root / "cache"
    try:
        with environ(JITOPS_CACHE_DIR=str(cache_root)):
            rc, out, err = run_cli(["cache", "import", str(bundle)], capsys)
            assert "Errno" not in err and "staging" not in err and "import-" not in err, err
            assert rc in (0, 1)
            links = any(k in ("symlink", "hardlink", "fifo") for _, k in members)
            outside = any(
                not n.startswith("v1/") or n == "v1/other" or n.count("/") > 5 for n, _ in members
            )
            last = {}
            for name, kind in members:
                last[name] = kind
            if links or outside:
                assert rc == 1 and "nothing was imported" in err, (members, err)
                assert not (cache_root / "v1" / "entries").exists() or not cache_admin.entries(
                    Cache(cache_root)
                )
            elif all(last.get(n) == "good" for n in good_names):
                # the last copy of each member wins
                assert rc == 0 and "1 imported" in out, (
                    members,
                    out,
                    err,
                )
            rc2, _, err2 = run_cli(["cache", "verify"], capsys)
            assert rc2 == 0, err2  # whatever was imported is sound
    finally:
        drop(root)
    still_works(world)


# ------------------------------------------------------------------ real compiler, a few cases

SQ = """
#include <jitops/op.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/mul.h>
at::Tensor propsq(const at::Tensor& x) { return at::mul(x, x); }
JITOPS_LIBRARY(m) { m.def("propsq(Tensor x) -> Tensor"); }
JITOPS_LIBRARY_IMPL(CPU, m) { m.impl("propsq", &propsq); }
"""


@pytest.mark.compile
def test_real_compiler_obstructions_settings_and_duplicate_archive(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    import torch

    folder = tmp_path / "propsq"
    folder.mkdir()
    (folder / "propsq.cpp").write_text(SQ)
    root = tmp_path / "cache"
    with (
        environ(JITOPS_CACHE_DIR=str(root), JITOPS_BUILDER=None, JITOPS_PROGRESS="0", MAX_JOBS="1"),
        clean_loader(),
    ):
        spec = jitops.register_kernel_dir(folder, ops=["propsq"])
        plan = planning.make_plan(spec, "cpu")
        # A folder at the lock path and an empty file where the staging folder belongs: both healed.
        plan.cache.lock_path(spec.name, plan.key).mkdir(parents=True)
        (root / "v1" / "staging").write_bytes(b"")
        # A broken flag variable fails first, naming itself; nothing is built or left behind.
        with environ(CXXFLAGS='-O2 "-DX=1'), pytest.raises(jitops.ConfigError, match="CXXFLAGS"):
            jitops.get("propsq")
        op = jitops.get("propsq")
        assert op.library is not None and op.library.built
        x = torch.arange(5.0)
        assert torch.equal(op(x), x * x)
        bundle = tmp_path / "sq.tar"
        cache_archive.export(Cache(root), tmp_path / "sq.tar.gz", {"propsq"})
        with tarfile.open(tmp_path / "sq.tar.gz") as tin, tarfile.open(bundle, "w") as tout:
            ms = tin.getmembers()
            for m in ms + ms:  # every member twice, as `tar -r` of the same files leaves it
                tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
    other = tmp_path / "other"
    with environ(JITOPS_CACHE_DIR=str(other)):
        rc, out, err = run_cli(["cache", "import", str(bundle)], capsys)
        assert rc == 0 and "1 imported" in out, err
        assert run_cli(["cache", "verify"], capsys)[0] == 0
    assert stat.S_ISDIR(os.lstat(other / "v1" / "entries").st_mode)
