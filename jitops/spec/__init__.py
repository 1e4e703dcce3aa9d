"""Subpackage ``jitops.spec`` (stage 3 of ``STAGES`` in tests/test_layout.py): ops as immutable data.
Owns: this module (``OpSpec``, ``Registry``, ``validate_name``, ``SOURCE_SUFFIXES`` / ``HEADER_SUFFIXES``,
``STABLE_ABI_FLAG`` / ``stable_target`` / ``version_flag`` / ``flag_version``), ``checks`` (checks of public arguments,
``shown``, what a flag word may not hold), ``headers`` (what a source's text says about the headers it needs)
and ``user_spec`` (user build arguments -> ``BuildOptions`` -> ``OpSpec``). May import: ``jitops.base``,
``jitops.errors``, ``jitops._version`` (today: errors, base.patterns, base.record, base.torchcompat).

This module: Op specs (immutable data) and the registry that maps public names to them.

A spec describes one kernel library: where its sources are, which schemas it
defines, its flags and the Python module that holds its fake kernels,
autograd formulas and pure-PyTorch references. One library may export several
public op names (``add`` and ``add_``; ``softmax`` and ``log_softmax``).

Nothing here imports torch.

Imports: errors, patterns, record, torchcompat.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import threading
from collections.abc import Iterable
from pathlib import Path

from ..base.patterns import lazy
from ..base.record import record
from ..base.torchcompat import SUPPORTED, parse
from ..errors import ArgumentError, InvalidNameError, UnknownOpError

NAME_PATTERN = r"^[a-z][a-z0-9_]{0,63}$"
_NAME_FIRST = frozenset("abcdefghijklmnopqrstuvwxyz")
_NAME_REST = _NAME_FIRST | frozenset("0123456789_")


def _is_name(text: str) -> bool:
    """``NAME_PATTERN``, checked without compiling a regex (the warm path checks a name in every process)."""
    return 0 < len(text) <= 64 and text[0] in _NAME_FIRST and _NAME_REST.issuperset(text)


SOURCE_SUFFIXES = (".cpp", ".cc", ".cxx", ".cu")
HEADER_SUFFIXES = (".h", ".hpp", ".cuh", ".inl")
# In a spec's cflags: its sources are on torch's stable C ABI (build/stable.py); the key then holds
# their -DTORCH_TARGET_VERSION instead of torch's version.
STABLE_ABI_FLAG = "-DJITOPS_STABLE_ABI=1"


def stable_target(torch_version: str) -> tuple[int, int]:
    """The stable ABI version a build targets unless told: the oldest torch jitops supports (never above the
    running one), so an entry built now serves every later torch."""
    return min(SUPPORTED[0], parse(torch_version) or SUPPORTED[0])


def version_flag(version: tuple[int, int]) -> str:
    """``(2, 13)`` -> ``-DTORCH_TARGET_VERSION=0x020d000000000000`` (torch/headeronly/version.h's encoding)."""
    return f"-DTORCH_TARGET_VERSION=0x{(version[0] << 56) | (version[1] << 48):016x}"


_TARGET_FLAG = lazy(
    r"^-DTORCH_TARGET_VERSION=(0x[0-9a-fA-F]{1,16}|\d+)$", needs="-DTORCH_TARGET_VERSION="
)


def flag_version(word: str) -> tuple[int, int] | None:
    """``version_flag``'s inverse: ``(major, minor)`` of one ``-DTORCH_TARGET_VERSION=<number>`` word (hex or
    decimal, as torch/headeronly/version.h encodes it), None for any other word."""
    m = _TARGET_FLAG.match(word)
    if m is None:
        return None
    value = int(m.group(1), 0)
    return (value >> 56) & 0xFF, (value >> 48) & 0xFF


def validate_name(name: object, what: str = "op name") -> str:
    """Return ``name`` if it may be used as an op or library name, else raise.

    Runs before any file access: a name that passes contains only ASCII
    lowercase letters, digits and underscores, so it can never form a path
    separator, a parent reference, a shell metacharacter or a homoglyph.
    """
    if isinstance(name, str) and _is_name(name):
        return name
    shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
    # A name that differs from a valid one only in case, padding or '-' gets that name as the fix.
    near = name.strip().lower().replace("-", "_") if isinstance(name, str) else ""
    hint = f". Did you mean {near!r}?" if near and near != name and _is_name(near) else ""
    raise InvalidNameError(
        f"invalid {what} {shown}: names must match {NAME_PATTERN} "
        f"(ASCII lowercase letters, digits and '_', starting with a letter, at most 64 characters){hint}"
    )


def _op_name_of(schema: str) -> str:
    """``"add.out(Tensor self, ...) -> ..."`` -> ``"add"``."""
    head = schema.split("(", 1)[0].strip()
    return head.split(".", 1)[0]


@record
class OpSpec:
    """One kernel library, described as data.

    ``root`` is the folder holding the sources; ``cpu_sources`` and
    ``cuda_sources`` are paths relative to it. A CUDA build compiles both
    lists, so CPU tensors keep working on a GPU machine. ``schemas`` are
    defined by jitops before the library loads; a library that defines its
    own schemas in C++ (``JITOPS_LIBRARY``) leaves it empty and lists its
    ``exports`` (a registered spec needs at least one; ``jitops.load`` finds
    a user library's ops after loading it instead). ``python`` names a module with ``register(ns)`` (fake
    kernels, autograd) and a ``REFERENCES`` mapping of pure-PyTorch
    implementations. ``editable`` marks sources edited in place (a kernel
    folder): ``jitops.get`` re-checks their stamps and rebuilds after an edit.
    ``stable_cpu_sources``: a CPU target builds these alone instead, on torch's
    stable C ABI (they define and register every op; ``for_target``).
    """

    name: str
    root: Path
    cpu_sources: tuple[str, ...]
    cuda_sources: tuple[str, ...] = ()
    schemas: tuple[str, ...] = ()
    exports: tuple[str, ...] = ()
    cflags: tuple[str, ...] = ()
    cuda_cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    include_dirs: tuple[Path, ...] = ()
    python: str | None = None
    description: str = ""
    origin: str = "builtin"
    editable: bool = False
    stable_cpu_sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        validate_name(self.name, "library name")
        if (
            not isinstance(self.root, (str, os.PathLike))
            or not isinstance(self.include_dirs, (list, tuple))
            or not all(isinstance(p, (str, os.PathLike)) for p in self.include_dirs)
        ):
            raise ArgumentError(
                f"OpSpec {self.name!r}: root must be a path and include_dirs a list of paths, got "
                f"{self.root!r} and {self.include_dirs!r}"[:300]
            )
        if (
            not (self.python is None or isinstance(self.python, str))
            or not isinstance(self.description, str)
            or not isinstance(self.origin, str)
            or not isinstance(self.editable, bool)
        ):
            raise ArgumentError(
                f"OpSpec {self.name!r}: python must be a module name or None, description and "
                "origin strings, editable a bool"
            )
        object.__setattr__(self, "root", Path(self.root))
        for attr in (
            "cpu_sources",
            "cuda_sources",
            "schemas",
            "exports",
            "cflags",
            "cuda_cflags",
            "ldflags",
            "stable_cpu_sources",
        ):
            value = getattr(self, attr)
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ArgumentError(
                    f"OpSpec.{attr} must be a list or tuple of strings, got {value!r}"[:300]
                )
            object.__setattr__(self, attr, tuple(value))
        object.__setattr__(self, "include_dirs", tuple(Path(p) for p in self.include_dirs))
        if not self.exports:
            names = tuple(
                dict.fromkeys(
                    _op_name_of(s) for s in self.schemas if not _op_name_of(s).endswith("_backward")
                )
            )
            object.__setattr__(self, "exports", names)
        for export in self.exports:
            validate_name(export, "op name")
        for rel in self.cpu_sources + self.cuda_sources + self.stable_cpu_sources:
            p = Path(rel)
            if p.is_absolute() or ".." in p.parts:
                raise InvalidNameError(
                    f"spec {self.name!r}: source {rel!r} must be a relative path inside {self.root}"
                )

    def sources_for(self, device: str) -> tuple[str, ...]:
        return self.cpu_sources + (self.cuda_sources if device == "cuda" else ())

    @property
    def devices(self) -> tuple[str, ...]:
        return ("cpu", "cuda") if self.cuda_sources else ("cpu",)

    def for_target(self, device: str, torch_version: str) -> OpSpec:
        """The spec a build for ``device`` compiles: this one, except for a CPU target of a library with
        ``stable_cpu_sources``, which builds those alone on torch's stable C ABI (they define and register its
        ops; ``schemas`` are theirs to define), with ``STABLE_ABI_FLAG`` and ``stable_target``'s version in
        its cflags, so its key holds that version instead of torch's. That spec is a CPU-only one."""
        if device != "cpu" or not self.stable_cpu_sources:
            return self
        return dataclasses.replace(
            self,
            cpu_sources=self.stable_cpu_sources,
            cuda_sources=(),
            schemas=(),
            exports=self.exports,
            cflags=(STABLE_ABI_FLAG, version_flag(stable_target(torch_version)), *self.cflags),
            stable_cpu_sources=(),
        )


class Registry:
    """Public op name -> (spec, op name inside the library). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._specs: dict[str, OpSpec] = {}
        self._index: dict[str, OpSpec] = {}

    def add(self, spec: OpSpec, *, replace: bool = False) -> None:
        if not spec.exports:
            raise InvalidNameError(f"spec {spec.name!r} exports no op: give schemas or exports")
        with self._lock:
            clashes = [
                e for e in spec.exports if e in self._index and self._index[e].name != spec.name
            ]
            if clashes and not replace:
                owner = self._index[clashes[0]].name
                raise InvalidNameError(
                    f"op {clashes[0]!r} is already provided by library {owner!r}. Fix: pick "
                    "another op name, or pass replace=True to take it over"
                )
            old = self._specs.get(spec.name)
            if old is not None:
                if not replace and old != spec:
                    raise InvalidNameError(
                        f"a different library named {spec.name!r} is already registered. Fix: "
                        "pick another library name, or pass replace=True"
                    )
                for e in old.exports:
                    self._index.pop(e, None)
            self._specs[spec.name] = spec
            for e in spec.exports:
                self._index[e] = spec

    def remove(self, name: str) -> OpSpec | None:
        """Take library ``name`` and its exports out; the spec removed, or None."""
        with self._lock:
            old = self._specs.pop(name, None)
            for e in old.exports if old is not None else ():
                if self._index.get(e) is old:
                    del self._index[e]
            return old

    def get_library(self, name: str) -> OpSpec | None:
        return self._specs.get(name)

    def extend(self, specs: Iterable[OpSpec]) -> None:
        for s in specs:
            self.add(s)

    def find(self, name: str) -> OpSpec | None:
        return self._index.get(name)

    def lookup(self, name: object) -> OpSpec:
        op = validate_name(name)
        spec = self._index.get(op)
        if spec is None:
            close = difflib.get_close_matches(op, list(self._index), n=3, cutoff=0.6)
            raise UnknownOpError(op, close, available=list(self._index))
        return spec

    def library(self, name: str) -> OpSpec:
        spec = self._specs.get(validate_name(name, "library name"))
        if spec is None:
            raise UnknownOpError(
                name,
                difflib.get_close_matches(name, list(self._specs), n=3),
                available=list(self._specs),
                what="library",
            )
        return spec

    def names(self) -> list[str]:
        return sorted(self._index)

    def specs(self) -> list[OpSpec]:
        return [self._specs[k] for k in sorted(self._specs)]
