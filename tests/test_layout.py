"""The layout's rules (ARCHITECTURE.md): subpackages by stage, each importing only those below it.

Read from the source by tests/import_graph.py: lazy imports inside functions and annotation-only
imports (``if TYPE_CHECKING:``) count, since a reader follows them too.
"""

from __future__ import annotations

import ast
import shutil
import subprocess

import pytest
from import_graph import PACKAGE, cycles, graph, modules, unresolved

# Bottom to top. A module may import its own subpackage (no circle) or a stage on a lower line.
STAGES: tuple[tuple[str, ...], ...] = (
    ("jitops.errors", "jitops._version"),
    ("jitops.base",),
    ("jitops.spec",),
    ("jitops.kernels",),
    ("jitops.registry",),
    ("jitops.target",),
    ("jitops.key",),
    ("jitops.store",),
    ("jitops.plan",),
    ("jitops.remote",),
    ("jitops.build",),
    ("jitops.loading",),
    ("jitops.api",),
    ("jitops.loader", "jitops.cache"),  # the public loading and cache modules
    ("jitops", "jitops.distributed"),  # the public API (jitops/__init__.py) and jitops.distributed
    ("jitops.bench",),
    ("jitops.cli",),
    ("jitops.__main__",),
)
TOP_LEVEL_MODULES = {
    "__init__.py",
    "__main__.py",
    "_version.py",
    "errors.py",
    "distributed.py",
    "loader.py",
    "cache.py",
}


def stage_of(module: str) -> str:
    """The stage a module belongs to: its subpackage under jitops, or itself for a top-level module."""
    parts = module.split(".")
    return ".".join(parts[:2])


def rank(module: str) -> int:
    stage = stage_of(module)
    return next(i for i, names in enumerate(STAGES) if stage in names)


def test_every_module_has_a_stage() -> None:
    unplaced = [m for m in modules() if not any(stage_of(m) in names for names in STAGES)]
    assert unplaced == []


def test_imports_only_point_down_to_a_lower_stage_or_within_one() -> None:
    upward = sorted(
        f"{m} -> {d}"
        for m, deps in graph().items()
        for d in deps
        if stage_of(d) != stage_of(m) and rank(d) >= rank(m)
    )
    assert upward == []


def test_no_import_circle_annotations_included() -> None:
    assert cycles(graph(annotations=True)) == []


def test_the_rule_catches_an_upward_and_a_circular_import() -> None:
    """The checks above can fail: an upward edge and a circle added to the real graph are found."""
    g = graph()
    g["jitops.store.cache"] = g["jitops.store.cache"] | {"jitops.plan"}
    assert any(
        rank(d) >= rank(m) and stage_of(d) != stage_of(m) for m, deps in g.items() for d in deps
    )
    g = graph()
    g["jitops.store.manifest"] = g["jitops.store.manifest"] | {"jitops.store.cache"}
    assert ["jitops.store.cache", "jitops.store.manifest", "jitops.store.cache"] in cycles(g)


def test_jitops_holds_subpackages_and_a_handful_of_modules() -> None:
    top = {p.name for p in PACKAGE.glob("*.py")}
    assert top == TOP_LEVEL_MODULES
    for pkg in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"{pkg.name}/__init__.py must say what the subpackage owns"


def test_every_import_names_a_module_that_exists() -> None:
    """A path left stale by a move (string imports included: importlib.import_module("..build.runner", ...))."""
    assert unresolved() == []


@pytest.mark.skipif(
    shutil.which("git") is None or not (PACKAGE.parent / ".git").exists(),
    reason="needs a git checkout",
)
def test_no_file_of_the_package_is_git_ignored() -> None:
    """A .gitignore rule for a build folder once matched jitops/build/: its modules were never committed."""
    ignored = subprocess.run(
        ["git", "ls-files", "--others", "--ignored", "--exclude-standard", "--", "jitops"],
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert [f for f in ignored if "__pycache__" not in f] == []
