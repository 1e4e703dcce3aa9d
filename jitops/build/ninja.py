"""jitops's own ninja file: torch's flags, from torch's public helpers, for one build.

The compile and link commands are those ``torch.utils.cpp_extension`` writes
for the same sources and flags (a test compares ``ninja -t commands`` of the
two), built from its public pieces: ``include_paths``, ``library_paths``,
``COMMON_NVCC_FLAGS`` and jitops's own ``-gencode`` flags. The toolkit is the
one of the nvcc jitops chose and keyed, never cpp_extension's import-time guess.

Quoting, at two levels. Ninja runs each command through ``sh``: every path
jitops writes is shell-quoted, and ``$`` doubled for ninja. nvcc then runs
the host compiler and its own tools through ``sh`` again, wrapping paths in
double quotes without escaping backticks (and ``$`` only in some places):
a cache path holding `` `cmd` `` or ``$(cmd)`` would run ``cmd``. So no path
with a character ``sh`` treats specially ever reaches nvcc: such a directory
is reached through a symlink with a plain name in the private build
directory (a CUDA source file is copied there: nvcc resolves symlinks), the
build runs in a directory with a plain path (publish), and the build log is
rewritten back to the real paths.

Imports: job (``LINK_DEPFILE``); errors lazily (the BuildError of ``check_expressible``).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .job import LINK_DEPFILE

if TYPE_CHECKING:
    from .job import BuildJob

_SH_PLAIN = re.compile(r"[^\s\"'`$\\;&|<>()*?\[\]#~!{}]*")  # nothing sh (even inside "...") acts on


def sh_plain(path: str) -> bool:
    """True if ``sh`` would take ``path`` as it is, even unquoted or inside double quotes."""
    return _SH_PLAIN.fullmatch(path) is not None


def cxx_std(torch_version: str) -> str:
    """The C++ standard torch's extension builder uses: C++20 from torch 2.12 on."""
    major, minor = (int(x) for x in re.findall(r"\d+", torch_version)[:2])
    return "-std=c++20" if (major, minor) >= (2, 12) else "-std=c++17"


def escape_path(p: str) -> str:
    """A path in a ninja ``build`` line."""
    return p.replace("$", "$$").replace(" ", "$ ").replace(":", "$:")


def _var(words: list[str]) -> str:
    """A ninja variable holding shell words that are already quoted."""
    return " ".join(w.strip() for w in words).replace("$", "$$")


def words(flags: Sequence[str]) -> list[str]:
    """Flag words (each one argument) quoted for ``sh``, which ninja runs every command through:
    ``;``, ``$(...)``, backticks and redirections inside a flag are the compiler's text, never sh's."""
    return [shlex.quote(f) for f in flags]


# ninja has no escape for these in a path (| starts implicit inputs)
_NINJA_UNSAFE = re.compile(r"[|\n\r]")


def check_expressible(job: BuildJob, lines: Sequence[str], paths: Sequence[str]) -> None:
    """BuildError, before anything runs, for a path or a flag the ninja file cannot carry as it is."""
    from ..errors import BuildError

    bad = next((p for p in paths if _NINJA_UNSAFE.search(p)), None)
    if bad is not None:
        why = f"the source path {bad!r} holds {'|' if '|' in bad else 'a line break'}, which a ninja build file cannot express"
    elif any("\n" in ln or "\r" in ln for ln in lines):
        bad = next(ln for ln in lines if "\n" in ln or "\r" in ln)
        why = f"a flag or path holds a line break ({bad.strip()[:120]!r}), which a ninja build file cannot carry"
    else:
        return
    raise BuildError(
        f"cannot build {job.library!r} for {job.target}: {why}; nothing was compiled. "
        "Fix: rename the file or folder (or drop the line break from the flag)",
        op=job.library,
        target=job.target,
        log="",
        log_path=None,
    )


def cuda_library_includes() -> tuple[str, ...]:
    """Header dirs of the CUDA libraries torch's wheel installs (``site-packages/nvidia/*/include``).

    <ATen/cuda/CUDAContext.h> includes cusparse.h and cublas_v2.h, which a
    minimal toolkit (nvcc + cudart) lacks; the pip packages torch links
    against carry them. They are searched after the toolkit's include dir,
    so the toolkit's own headers win where both have one.
    """
    import importlib.util

    found = importlib.util.find_spec("nvidia")
    locations = list(found.submodule_search_locations or []) if found is not None else []
    return tuple(
        sorted(str(p) for loc in locations for p in Path(loc).glob("*/include") if p.is_dir())
    )


class _Aliases:
    """Plain-named symlinks (in the build dir) to directories whose paths sh would act on."""

    def __init__(self, build_dir: Path) -> None:
        self.build_dir = build_dir
        self.made: dict[str, str] = {}  # alias -> real directory

    def dir(self, real: str) -> str:
        if sh_plain(real):
            return real
        for alias, target in self.made.items():
            if target == real:
                return alias
        alias = f"_jitops_path{len(self.made)}"
        link = self.build_dir / alias
        # a build's commands made again (stable's retry) find the same alias in place
        if not (link.is_symlink() and os.readlink(link) == real):
            os.symlink(real, link)
        self.made[alias] = real
        return alias

    def file(self, real: str) -> str:
        """A source file for nvcc. nvcc resolves its real path (``--orig_src_path_name``), so a
        symlink is not enough: the bytes are copied to a plain name (its folder stays an -I)."""
        if sh_plain(real):
            return real
        alias = f"_jitops_src{len(self.made)}"
        os.makedirs(self.build_dir / alias, exist_ok=True)
        shutil.copyfile(real, self.build_dir / alias / os.path.basename(real))
        self.made[alias] = os.path.dirname(real)
        return f"{alias}/{os.path.basename(real)}"


@dataclass(frozen=True)
class TU:
    """One translation unit of a per-file build (tubuild): compiled here, or linked from the object cache."""

    source: str  # absolute path
    obj: str  # the object's name in the build dir
    # the object is already in the build dir (from the object cache): link only
    cached: bool = False
    extra: tuple[
        str, ...
    ] = ()  # shell words after the rule's flags (-include of a PCH, -DJITOPS_NS=...)


# per build: defines the namespace string op.h's macros register under
NAMESPACE_TU = "_jitops_namespace"


def namespace_source(namespace: str) -> str:
    return (
        "namespace jitops { namespace detail {\n"
        f'__attribute__((visibility("hidden"))) extern const char library_namespace[] = "{namespace}";\n'
        "} }  // generated by jitops: the op namespace of this build\n"
    )


def flags(
    job: BuildJob, aliases: _Aliases | None = None, *, namespace: bool = True
) -> tuple[list[str], list[str], list[str]]:
    """(cflags, cuda_cflags, ldflags) as shell words, in cpp_extension's order.

    ``namespace=False`` (per-file builds) leaves out -DJITOPS_NS: the namespace is then a string in
    one generated file, so no other file's object depends on the build's key.
    """
    import torch
    import torch.utils.cpp_extension as ce

    with_cuda = job.device == "cuda"
    toolkit = os.path.dirname(os.path.dirname(job.nvcc)) if with_cuda and job.nvcc else None
    system = list(ce.include_paths("cpu"))
    if toolkit is not None:
        system += [
            d
            for d in (os.path.join(toolkit, "include"), os.environ.get("CUDA_INC_PATH"))
            if d and d != "/usr/include"
        ]
        system += [os.path.join(ce.CUDNN_HOME, "include")] if ce.CUDNN_HOME else []
    python_include = sysconfig.get_path("include", scheme="posix_prefix")
    system += [python_include] if python_include else []
    user = [os.path.abspath(str(d)) for d in job.include_dirs]
    libs = [w for d in cuda_library_includes() for w in ("-isystem", d)] if with_cuda else []
    std = cxx_std(torch.__version__)

    def common(alias: _Aliases | None) -> list[str]:
        fix = alias.dir if alias is not None else (lambda d: d)
        return (
            [f"-DTORCH_EXTENSION_NAME={job.library}", "-DTORCH_API_INCLUDE_EXTENSION_H"]
            + [f"-I{shlex.quote(fix(d))}" for d in user]
            + [f"-isystem {shlex.quote(fix(d))}" for d in system]
        )

    ns = [f"-DJITOPS_NS={job.namespace}"] if namespace else []
    extra = [*words(job.cflags), *ns] + (["-DJITOPS_WITH_CUDA", *libs] if with_cuda else [])
    cflags = [*common(None), "-fPIC", std, *extra]
    cuda: list[str] = []
    if with_cuda:
        # jitops's -gencode flags are in job.cuda_cflags, so torch's arch flags (none when present)
        # add nothing.
        extra_cuda = [*words(job.cuda_cflags), *ns, "-DJITOPS_WITH_CUDA", *libs]
        cuda = [
            *common(aliases),
            *ce.COMMON_NVCC_FLAGS,
            "--compiler-options",
            "'-fPIC'",
            *extra_cuda,
        ]
        if not any(f.startswith("-std=") for f in cuda):
            cuda.append(std)
        if os.environ.get("CC"):  # as cpp_extension does (CC is in the key)
            cuda = ["-ccbin", shlex.quote(os.environ["CC"]), *cuda]
    ldflags = [
        "-shared",
        *words(job.ldflags),
        *(f"-L{d}" for d in ce.library_paths("cpu")),
        "-lc10",
    ]
    ldflags += (
        ["-lc10_cuda", "-ltorch_cpu", "-ltorch_cuda", "-ltorch"]
        if with_cuda
        else ["-ltorch_cpu", "-ltorch"]
    )
    if toolkit is not None:
        ldflags += [f"-L{cuda_lib_dir(toolkit)}", "-lcudart"]
        ldflags += [f"-L{os.path.join(ce.CUDNN_HOME, 'lib64')}"] if ce.CUDNN_HOME else []
    return cflags, cuda, ldflags  # no -ltorch_python: the ops use no Python C-API


def cuda_lib_dir(toolkit: str) -> str:
    """The toolkit's library folder, as cpp_extension picks it: ``lib64``, else ``lib`` where only
    that exists."""
    lib = os.path.join(toolkit, "lib")
    lib64 = os.path.join(toolkit, "lib64")
    return lib if not os.path.exists(lib64) and os.path.exists(lib) else lib64


def registration_cflags(cflags: str) -> str:
    """Flags for ``register*.cpp``: files that only hold dispatcher registration.

    <torch/library.h> is the slowest header to parse and its templates are the
    slowest to optimise; nothing in these files is hot and nothing needs the
    ISA. -O1 without the ISA flags takes ~2 s off every cold build here.
    """
    tokens = _SH_WORD.findall(cflags)  # quoted words stay whole
    kept = [
        w
        for w in tokens
        if not (
            w.startswith("-mavx") or w in ("-mfma", "-mf16c") or w.startswith("-DCPU_CAPABILITY")
        )
    ]
    return " ".join("-O1" if w == "-O3" else w for w in kept)


# one shell word as written
_SH_WORD = re.compile(r"""(?:[^\s'"\\]|\\.|'[^']*'|"(?:[^"\\]|\\.)*")+""")


def is_registration(src: str) -> bool:
    return os.path.basename(src).startswith("register")


def write_ninja_file(
    job: BuildJob, tus: Sequence[TU] | None = None, side: Sequence[tuple[str, str]] = ()
) -> tuple[Path, dict[str, str]]:
    """Write ``build.ninja`` in the job's build dir; (its path, {alias: real dir} for the log).

    Without ``tus``: every source compiled with -DJITOPS_NS, as cpp_extension would. With ``tus``
    (tubuild): cached objects are only linked, each compiled file gets its own extra flags, the
    namespace is compiled from one generated file, and dependency files are left for the object cache.
    """
    with_cuda = job.device == "cuda"
    aliases = _Aliases(job.build_dir)
    cflags, cuda, ldflags = flags(job, aliases if with_cuda else None, namespace=tus is None)
    # Side jobs run beside at most job.jobs compiles (ninja gets -j jobs + len(side)): MAX_JOBS
    # still holds.
    pool = ["  pool = compiles"] if side else []
    lines = ["ninja_required_version = 1.3", f"cxx = {_var([shlex.quote(job.cxx)])}"]
    if with_cuda and job.nvcc:
        lines.append(f"nvcc = {_var([shlex.quote(job.nvcc)])}")
    lines += [
        "",
        *(["pool compiles", f"  depth = {job.jobs}", ""] if side else []),
        f"cflags = {_var(cflags)}",
        "post_cflags = ",
    ]
    if with_cuda:
        lines += [f"cuda_cflags = {_var(cuda)}", "cuda_post_cflags = "]
    lines += [
        "cuda_dlink_post_cflags = ",
        "sycl_dlink_post_cflags = ",
        f"ldflags = {_var(ldflags)}",
        *([f"speed = {_var(list(job.speed))}"] if job.speed else []),
        "",
        "rule compile",
        # -MD: every file read, system headers too (store.inputs records them with the entry);
        # $speed: words that change no output (BuildJob.speed)
        "  command = $cxx -MD -MF $out.d $cflags -c $in -o $out $post_cflags"
        + (" $speed" if job.speed else ""),
        "  depfile = $out.d",
        *pool,
        "",
    ]
    if with_cuda:
        import torch

        # As cpp_extension: dependency files where torch is a CUDA build (not under ROCm), unless
        # turned off.
        deps = (
            torch.version.cuda is not None
            and os.environ.get("TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES", "0") != "1"
        )
        lines += [
            "rule cuda_compile",
            *(["  depfile = $out.d"] if deps else []),
            f"  command = $nvcc {'-MD -MF $out.d' if deps else ''} $cuda_cflags -c $in -o $out $cuda_post_cflags",
            *pool,
            "",
        ]
    link_deps = f"-Wl,--dependency-file={LINK_DEPFILE.format(out='${out}')}"
    lines += ["rule link", f"  command = $cxx $in $ldflags {link_deps} -o $out", ""]
    if tus is None:
        tus = [
            TU(
                src,
                f"{os.path.splitext(os.path.basename(src))[0]}"
                f"{'.cuda' if with_cuda and src.endswith(('.cu', '.cuh')) else ''}.o",
            )
            for src in (os.path.abspath(str(s)) for s in job.sources)
        ]
    else:
        (job.build_dir / f"{NAMESPACE_TU}.cpp").write_text(namespace_source(job.namespace))
        lines += [
            "rule namespace",
            "  command = $cxx -fPIC -c $in -o $out",
            "",
            f"build {NAMESPACE_TU}.o: namespace {NAMESPACE_TU}.cpp",
        ]
    objects: list[str] = []
    for tu in tus:
        objects.append(tu.obj)
        if tu.cached:
            continue
        is_cuda = with_cuda and tu.source.endswith((".cu", ".cuh"))
        where = aliases.file(tu.source) if is_cuda else tu.source
        lines.append(
            f"build {escape_path(tu.obj)}: {'cuda_compile' if is_cuda else 'compile'} {escape_path(where)}"
        )
        if not is_cuda and is_registration(tu.source):
            lines.append("  cflags = " + registration_cflags(_var(cflags)))
        if tu.extra:
            lines.append(
                f"  {'cuda_post_cflags' if is_cuda else 'post_cflags'} = {_var(list(tu.extra))}"
            )
    if os.path.exists(job.build_dir / f"{NAMESPACE_TU}.cpp"):
        objects.append(f"{NAMESPACE_TU}.o")
    if side:
        lines += ["", "rule side", "  command = $side_command"]
    for name, command in side:
        lines += [f"build {name}: side", f"  side_command = {_var([command])}"]
    lines += [
        "",
        f"build {job.library}.so: link {' '.join(escape_path(o) for o in objects)}",
        "",
        f"default {job.library}.so{''.join(' ' + name for name, _ in side)}",
        "",
    ]
    check_expressible(job, lines, [tu.source for tu in tus])
    path = job.build_dir / "build.ninja"
    path.write_text("\n".join(lines))
    return path, aliases.made


def unalias(text: str, aliases: dict[str, str]) -> str:
    """A build log with the symlinked paths named by their real paths again."""
    for alias, real in aliases.items():
        text = text.replace(alias + "/", real + "/")
    return text
