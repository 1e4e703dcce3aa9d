"""The values a build takes and gives: ``BuildJob`` (everything one build needs, already decided) and
``BuildResult``. Below every builder (runner, ninja, tubuild, build_errors, stable), which all read them.

Imports: nothing of jitops at run time (the object cache's ``Cache`` for annotations only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..store.cache import Cache

# GNU ld's list of the files it read (libraries found through -l and -L included), beside the output
LINK_DEPFILE = "{out}.link.d"


@dataclass(frozen=True)
class BuildJob:
    """Everything one build needs, already decided."""

    library: str
    target: str
    device: str
    namespace: str
    sources: tuple[Path, ...]
    include_dirs: tuple[Path, ...]
    cflags: tuple[str, ...]
    cuda_cflags: tuple[str, ...]
    ldflags: tuple[str, ...]
    cxx: str
    ninja: str
    nvcc: str | None
    build_dir: Path
    env: dict[str, str] = field(repr=False)
    jobs: int = 1
    builder: str = "real"  # settings.builder: "fake" is the test seam
    fake_seconds: float = 0.0  # settings.fake_build_seconds
    # Per-file builds (tubuild): the cache holding objects and PCHs (None: one plain ninja build).
    cache: Cache | None = field(default=None, repr=False)
    root: Path | None = None  # the library's own folder (``<root>`` in object keys)
    # compiler, torch, target...: the key's ingredients other than sources and flags
    identity: str = ""
    pch: str = ""  # "gcc" / "clang": precompile header prefixes with that compiler; "" off
    # build missing PCHs beside the compiles (user libraries; builtin ops only use them)
    pch_build: bool = False
    # build them after the build, detached (pch_bg; settings.pch_background), not beside
    pch_background: bool = False
    # bound PCHs + objects to this after a build (settings.pch_max_size); 0: no bound
    pch_max_size: int = 0
    # start a background PCH only below this CPU pressure during the build (settings.pch_pressure)
    pch_pressure: float = 1.0
    # try the stand-in for <torch/extension.h> first (user libraries; tubuild)
    lean_extension: bool = False
    # words that make the compiler faster and its output no different (compilers.gc_words): in no
    # key, added to C++ compiles and PCH builds
    speed: tuple[str, ...] = ()
    lock_timeout: float | None = None
    # Folders whose files an ingredient of the key already pins (torch, jitops's headers, the
    # compiler's own folder, the cache): what the build reads there is not recorded (store.inputs).
    pinned: tuple[str, ...] = ()
    # None if every file the key covers still holds the bytes digested for it, else what changed
    # (publish: the plan's re-digest). Asked after each ninja run, before objects are cached or
    # anything is published.
    sources_changed: Callable[[], str | None] | None = field(
        default=None, repr=False, compare=False
    )

    # set when this build replaces an entry of the same key: its library gets a file name of its
    # own, since a process that loaded the one replaced would get that one back from dlopen by its
    # path
    variant: str = ""

    @property
    def library_file(self) -> str:
        return f"lib{self.library}{'_' + self.variant if self.variant else ''}.so"


@dataclass(frozen=True)
class BuildResult:
    library: Path
    log: str
    seconds: float
    timings: dict[str, Any] = field(default_factory=dict)  # per file, PCH, link (tubuild.build_tus)
    # what the compiler and linker read, {label: sha256} (store.inputs); None: not known
    inputs: dict[str, str] | None = None
