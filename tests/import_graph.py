"""jitops's import graph, read from the source (no import runs): the layout tests' one source of truth.

``graph(annotations=True)`` maps each module (dotted, ``jitops.store.cache``) to the jitops modules it
imports anywhere in its text: at the top, inside functions (lazy imports) and, unless
``annotations=False``, inside ``if TYPE_CHECKING:`` blocks, since a reader follows those too.
``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "jitops"


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Each module of ``package`` (a ``jitops/`` folder, this checkout's by default) by dotted name."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _base(module: str, is_package: bool, level: int, name: str | None) -> str:
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def graph(annotations: bool = True, package: Path = PACKAGE) -> dict[str, set[str]]:
    return _read(annotations, package)[0]


def unresolved(package: Path = PACKAGE) -> list[str]:
    """Imports of jitops modules that do not exist (a stale path after a move: a string import too)."""
    return _read(True, package)[1]


def _read(annotations: bool, package: Path) -> tuple[dict[str, set[str]], list[str]]:
    mods = modules(package)
    missing: list[str] = []
    result: dict[str, set[str]] = {}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        skipped = (
            set()
            if annotations
            else {
                id(n)
                for node in ast.walk(tree)
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                for n in ast.walk(node)
            }
        )
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = _base(mod, path.name == "__init__.py", node.level, node.module)
                elif (node.module or "").split(".")[0] == "jitops":
                    base = node.module or ""
                else:
                    continue
                deps.update(
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
                )
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.split(".")[0] == "jitops")
            elif (
                isinstance(node, ast.Call)
                and ast.unparse(node.func).endswith("import_module")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                name = node.args[
                    0
                ].value  # importlib.import_module("..x", __package__): a string import
                if name.startswith("."):
                    level = len(name) - len(name.lstrip("."))
                    deps.add(
                        _base(mod, path.name == "__init__.py", level, name.lstrip(".") or None)
                    )
                elif name.split(".")[0] == "jitops":
                    deps.add(name)
        missing += [
            f"{mod} -> {d}" for d in sorted(deps) if d.split(".")[0] == "jitops" and d not in mods
        ]
        result[mod] = {d for d in deps if d in mods and d != mod}
    return result, missing


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle found by a depth-first walk, as the path that closes it."""
    state: dict[str, int] = {}
    found: list[list[str]] = []

    def visit(mod: str, stack: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(g[mod]):
            if state.get(dep) == 1:
                found.append(stack[stack.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[mod] = 2

    for mod in sorted(g):
        if mod not in state:
            visit(mod, [mod])
    return found
