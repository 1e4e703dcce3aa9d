"""Every public name, CLI command and setting is in the docs' generated references.

The references are made at build time by ``docs/hooks.py``; these tests run its generators (no
mkdocs needed, no site built) against what the code holds: ``jitops.__all__``, the parser's
commands, and every variable name ``jitops/base/settings.py`` reads.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import re
from types import ModuleType

import pytest

import jitops
from tests.helpers import REPO

DOCS = REPO / "docs"


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("jitops_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _variables_read_by_settings() -> set[str]:
    """Every string constant in settings.py that is a whole variable name jitops reads."""
    tree = ast.parse((REPO / "jitops" / "base" / "settings.py").read_text())
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.fullmatch(r"JITOPS_[A-Z0-9_]*[A-Z0-9]|MAX_JOBS", node.value)
    }


def test_every_setting_read_is_in_the_settings_reference(hooks: ModuleType) -> None:
    from jitops.base.settings import SETTINGS, VARIABLES

    table = hooks.settings_markdown()
    read = _variables_read_by_settings()
    assert "JITOPS_CACHE_DIR" in read and "JITOPS_REMOTE_TIMEOUT" in read  # the scan works
    missing = sorted(v for v in read if f"| `{v}` |" not in table)
    assert not missing, (
        f"settings read but not documented in jitops.base.settings.SETTINGS: {missing}"
    )
    for name, kind, default, meaning in SETTINGS:
        assert name in read, f"{name} is documented but settings.py never reads it"
        assert kind.strip() and default.strip() and meaning.strip(), name
    assert VARIABLES == tuple(row[0] for row in SETTINGS)
    assert len(set(VARIABLES)) == len(VARIABLES)


def test_every_cli_command_is_in_the_cli_reference(hooks: ModuleType) -> None:
    page = hooks.cli_markdown()
    commands = list(hooks.cli_commands())
    names = {" ".join(words) for words, _, _ in commands}
    assert {"list", "warm", "doctor", "cache", "cache ls", "bundle build"} <= names
    parts = re.split(r"^#+ (jitops[^\n]*)$", page, flags=re.M)
    sections = dict(zip(parts[1::2], parts[2::2]))
    for words, parser, help_ in commands:
        title = "jitops " + " ".join(words)
        assert help_.strip(), f"`{title}` has no help text"
        assert title in sections, f"`{title}` is not in the page"
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in sections[title], f"`{title} {flag}` is not in its section"


def test_every_public_name_has_a_docstring_and_the_api_page_renders_the_package() -> None:
    page = (DOCS / "reference" / "api.md").read_text()
    assert re.search(r"^::: jitops$", page, re.M), "the API page must render `::: jitops`"
    block = page.split("::: jitops\n", 1)[1].split(":::", 1)[0]
    assert "members:" not in block, "a members list would hide names of jitops.__all__"
    undocumented = []
    for name in jitops.__all__:
        if name == "__version__":
            continue
        obj = getattr(jitops, name)
        doc = obj.__doc__ if inspect.isclass(obj) else inspect.getdoc(obj)
        if not (doc or "").strip():
            undocumented.append(name)
    assert not undocumented, f"public names without a docstring: {undocumented}"


def test_every_error_class_is_in_the_errors_reference(hooks: ModuleType) -> None:
    import jitops.errors as errors

    table = hooks.errors_markdown()
    classes = [
        c
        for c in vars(errors).values()
        if inspect.isclass(c) and issubclass(c, BaseException) and c.__module__ == errors.__name__
    ]
    assert len(classes) >= 15
    for cls in classes:
        assert f"`{cls.__name__}`" in table, cls.__name__
        assert (cls.__doc__ or "").strip(), f"{cls.__name__} has no docstring"
        if cls.__name__ in jitops.__all__:
            assert f"[jitops.{cls.__name__}]" in table, f"{cls.__name__} is not linked"


def test_every_page_marker_has_a_generator_and_every_generator_is_used(hooks: ModuleType) -> None:
    used = {m for p in DOCS.rglob("*.md") for m in hooks.MARKER.findall(p.read_text())}
    assert used == set(hooks.GENERATORS), (used, set(hooks.GENERATORS))
    with pytest.raises(KeyError):
        hooks.render("<!-- jitops:nothing-such -->")


def test_the_nav_names_every_page_and_only_pages_that_exist() -> None:
    config = (REPO / "mkdocs.yml").read_text()
    named = set(re.findall(r":\s+([\w/.-]+\.md)\s*$", config, re.M))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert named == pages, (sorted(named - pages), sorted(pages - named))


def test_ci_runs_the_readmes_commands_as_written() -> None:
    """CI takes its set-up line, its Quickstart block and its test command from README.md
    (.ci/readme_commands.py), so a README command that stops working fails CI."""
    spec = importlib.util.spec_from_file_location(
        "readme_commands", REPO / ".ci" / "readme_commands.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (REPO / "README.md").read_text()
    setup = module.command(text, "setup")
    assert "torch==2.13.0" in setup and setup.endswith("examples/quickstart.py"), setup
    assert module.command(text, "test") == ".venv/bin/python -m pytest"
    assert 'jitops.get("softmax")' in module.command(text, "quickstart")
    ci = (REPO / ".ci" / "run").read_text()
    for which in ("setup", "quickstart", "test"):
        assert f"python3 .ci/readme_commands.py {which})" in ci
    with pytest.raises(SystemExit, match="not two lines"):
        module.command(text.replace("\n.venv/bin/python -m pytest", ""), "setup")
