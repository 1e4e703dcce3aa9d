"""A real build file by file: cached objects linked as they are, a PCH for the rest, timings.

For each source: its object is looked up in the object cache (objcache); a
miss is compiled by ninja, with the precompiled header of its header prefix
(pch) when the build has one for its compiler. The namespace is compiled from
one generated file (ninja.NAMESPACE_TU), so objects do not depend on the key.
A build that fails while using a PCH runs again without one (one note): a PCH
is never the reason a build fails. A header prefix's PCH is built from its
second build on (the first build of a prefix only records it: a library built
once and never edited costs no PCH), beside the compiles, for the build after
(user libraries only: builtin ops are built once per machine). Times come from ninja's own log. Per-file states: ``hit``
(compiled with the PCH), ``built`` (compiled without; its PCH built beside),
``busy`` (another process builds it), ``first use`` (the prefix's first build:
recorded, no PCH yet), ``none`` (builtin), ``no prefix``,
``off`` (JITOPS_PCH=0), ``rejected`` (the compiler refused it), ``unavailable``.

Imports: ninja, objcache, pch, fsutil (the BuildJob and its Cache are read by attribute).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import fsutil, objcache, pch
from .ninja import NAMESPACE_TU, TU, flags, is_registration, registration_cflags, unalias, write_ninja_file

if TYPE_CHECKING:
    from .build import BuildJob

log = logging.getLogger("jitops")
Run = Callable[..., tuple[int, str]]
# An error caused by a PCH (a compiler refusing one hard: clang's -include-pch, a gcc that cannot read one).
_PCH_ERROR = re.compile(r"^.*error: .*(PCH|[Pp]recompiled|AST file|\.gch\b|\.pch\b).*$", re.MULTILINE)
_REJECTED = re.compile(r"[^\n]*\.(gch|pch)\b[^\n]*\[-Winvalid-pch\]")


def _names_namespace(job: BuildJob, text: str, rule_flags: str) -> bool:
    """Whether a file needs -DJITOPS_NS: it (or a header of the library's folder) spells JITOPS_NS, or
    TORCH_EXTENSION_NAME where the flags define that as JITOPS_NS (the drop-in's pybind11 modules)."""
    tokens = ("JITOPS_NS", "TORCH_EXTENSION_NAME") if "=JITOPS_NS" in rule_flags else ("JITOPS_NS",)
    if any(t in text for t in tokens):
        return True
    root = job.root
    return root is not None and any(t in p.read_text(errors="replace") for p in sorted(root.rglob("*"))
                                    if p.suffix in (".h", ".hpp", ".cuh", ".inc") for t in tokens)


def _ninja_times(build_dir: Path) -> dict[str, float]:
    """{output: seconds} from ``.ninja_log`` (start and end in ms, tab-separated)."""
    out: dict[str, float] = {}
    try:
        for line in (build_dir / ".ninja_log").read_text().splitlines()[1:]:
            parts = line.split("\t")
            if len(parts) >= 4:
                out[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000
    except (OSError, ValueError):
        pass
    return out


def build_tus(job: BuildJob, run: Run, on_line: Callable[[str], None] | None = None) -> tuple[int, str, Path, dict[str, Any]]:
    """(exit code, log, library path, timings) of a build that reuses cached objects and PCHs."""
    cache, root = job.cache, job.root or job.build_dir
    assert cache is not None
    with_cuda = job.device == "cuda"
    cflags, cuda, _ = flags(job, None, namespace=False)
    ns_flag = f"-DJITOPS_NS={job.namespace}"
    tus: list[TU] = []
    keys: dict[str, str] = {}
    info: dict[str, dict[str, Any]] = {}
    uses: dict[str, pch.Use | None] = {}
    first: set[str] = set()  # prefixes this build is the first to compile
    pending: dict[str, pch.Pending] = {}  # PCHs built beside this build's compiles, for the next build
    pch_plain: dict[str, tuple[str, ...]] = {}  # obj -> its extra flags without the PCH (the retry)
    for src in (os.path.abspath(str(s)) for s in job.sources):
        is_cuda = with_cuda and src.endswith((".cu", ".cuh"))
        obj = f"{os.path.splitext(os.path.basename(src))[0]}{'.cuda' if is_cuda else ''}.o"
        label = os.path.relpath(src, root) if src.startswith(str(root)) else src
        text = Path(src).read_text(errors="replace")
        words = cuda if is_cuda else cflags
        rule_flags = registration_cflags(" ".join(words)) if not is_cuda and is_registration(src) else " ".join(words)
        extra = (ns_flag,) if _names_namespace(job, text, rule_flags) else ()
        tool = job.nvcc if is_cuda else job.cxx
        key = objcache.tu_key(job.identity, f"{tool} {rule_flags} {' '.join(extra)}", fsutil.sha256_file(Path(src)), root)
        keys[obj] = key
        if objcache.lookup(cache, key, root, job.build_dir / obj):
            tus.append(TU(src, obj, cached=True))
            info[label] = {"object": "cached", "seconds": 0.0, "pch": "-"}
            continue
        state = "off" if not job.pch else "nvcc" if is_cuda else "no prefix"  # nvcc: no PCH (see pch.py)
        # A file given -DJITOPS_NS uses the PCH built without it: torch's headers never read it (op.h
        # does: gcc then refuses the PCH with a warning and parses the text, clang is rerun without it).
        usable = job.pch and not is_cuda and src.endswith(pch.CXX_SUFFIXES)
        prefix = pch.header_prefix(text) if usable else []
        use = None
        if prefix:
            pflags = pch.pch_flags(rule_flags.split(" "), root)
            pkey = pch.key_of(job.identity, job.pch, " ".join(pflags), prefix)
            use = uses[pkey] if pkey in uses else pch.find(cache, pkey, job.pch)
            uses[pkey] = use
            if use is not None:
                state = "hit"
            elif pkey in pending:
                state = "built"
            elif not job.pch_build:
                state = "none"  # builtin ops: built once per machine, a PCH would only cost their cold build
            elif pkey in first or not pch.seen_before(cache, pkey):
                first.add(pkey)
                state = "first use"  # a prefix compiled once may never be compiled again: no PCH for it yet
            else:
                p = pch.start(cache, key=pkey, kind=job.pch, cxx=job.cxx, flags=pflags, prefix=prefix, root=root)
                state = "built" if p is not None else "busy"  # busy: another process builds it now
                if p is not None:
                    pending[pkey] = p
        tus.append(TU(src, obj, extra=(*extra, *(use.words if use else ()))))
        pch_plain[obj] = extra
        info[label] = {"object": "compiled", "pch": state, "_obj": obj, "_use": use,
                       **({"pch_key": pkey[:12]} if prefix else {})}
    pch_jobs = [(f"_jitops_pch{i}", p.command) for i, p in enumerate(pending.values())]
    built: dict[str, float] = {}  # PCH key (12) -> seconds to build it
    finished = False
    try:
        _, aliases = write_ninja_file(job, tus, pch_jobs)
        argv = [job.ninja, "-v", "-j", str(job.jobs + len(pch_jobs))]  # one more job per PCH being built
        rc, out = run(argv, cwd=job.build_dir, env=job.env, on_line=on_line)
        finished = True
    finally:
        times = _ninja_times(job.build_dir)
        for (name, _), (pkey, p) in zip(pch_jobs, pending.items(), strict=True):
            made = pch.finish(cache, p, times.get(name, 0.0), publish=finished)
            if made is not None:
                built[pkey[:12]] = times.get(name, 0.0)
            for i in info.values():
                if i.get("pch_key") == pkey[:12] and i["pch"] == "built" and made is None:
                    i["pch"] = "unavailable"
    used = [t for t in tus if not t.cached and pch_plain.get(t.obj) != t.extra]
    if rc != 0 and used and _PCH_ERROR.search(out):  # never for the user's own compile errors: those show at once
        log.info("note: the compiler refused a precompiled header (%s); building again without it",
                 _PCH_ERROR.search(out).group(0).strip())  # type: ignore[union-attr]
        tus = [TU(t.source, t.obj, t.cached, pch_plain.get(t.obj, t.extra)) for t in tus]
        for i in info.values():
            i["pch"] = "rejected" if i.get("_use") is not None else i["pch"]
        _, aliases = write_ninja_file(job, tus)
        rc, out2 = run(argv, cwd=job.build_dir, env=job.env, on_line=on_line)
        out = out + out2
    elif used and _REJECTED.search(out):
        log.info("note: the compiler did not use a precompiled header (it parsed the headers instead): %s",
                 _REJECTED.search(out).group(0))  # type: ignore[union-attr]
        for line in out.splitlines():
            for i in info.values():
                if _REJECTED.search(line) and i.get("_use") is not None and i["_use"].key[:32] in line:
                    i["pch"] = "rejected"
    times = _ninja_times(job.build_dir)
    pch_dir = str(cache.pch) + "/"
    for i in info.values():
        obj, use = i.pop("_obj", None), i.pop("_use", None)
        if obj is None:
            continue
        i["seconds"] = times.get(obj, 0.0)
        if rc == 0:
            src = next(t.source for t in tus if t.obj == obj)
            objcache.store(cache, keys[obj], job.build_dir / obj, job.build_dir / f"{obj}.d", root, (pch_dir,),
                           use.deps if use is not None and i["pch"] != "rejected" else None, src)
    timings = {"files": info, "link_seconds": times.get(f"{job.library}.so", 0.0), "pch_built": built,
               "namespace_seconds": times.get(f"{NAMESPACE_TU}.o", 0.0), "at": time.time()}
    return rc, unalias(out, aliases), job.build_dir / f"{job.library}.so", timings


def summary(timings: dict[str, Any]) -> str:
    """One line for the INFO log and ``jitops info``: each file's compile, its PCH, the link."""
    parts = []
    for label, i in (timings.get("files") or {}).items():
        if i.get("object") == "cached":
            parts.append(f"{label} cached")
        else:
            parts.append(f"{label} {i.get('seconds', 0.0):.1f}s, PCH {i.get('pch')}")
    if not parts:
        return ""
    pchs = "".join(f"; PCH {k} built beside, {s:.1f}s" for k, s in (timings.get("pch_built") or {}).items())
    return "; ".join(parts) + pchs + f"; link {timings.get('link_seconds', 0.0):.1f}s"
