"""examples/notebook.ipynb runs green, headless, in a real Jupyter kernel (nbclient + ipykernel)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.compile, pytest.mark.process]

NOTEBOOK = REPO / "examples" / "notebook.ipynb"


def _text(cell: Any, stream: str = "stdout") -> str:
    return "".join(
        o.get("text", "")
        for o in cell.outputs
        if o.get("output_type") == "stream" and o.get("name") == stream
    )


@pytest.mark.timeout(600)
def test_example_notebook_executes_green(
    monkeypatch: pytest.MonkeyPatch, session_cache: Path
) -> None:
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the kernel imports this checkout's jitops
    monkeypatch.setenv("JITOPS_CACHE_DIR", str(session_cache))
    monkeypatch.delenv("JITOPS_PROGRESS", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(REPO / "examples")}},
    ).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) == 7

    errors = [
        (i, o) for i, c in enumerate(code) for o in c.outputs if o.get("output_type") == "error"
    ]
    assert [i for i, _ in errors] == [3], errors  # only the cell that shows a compile error raises
    for c in code:
        assert _text(c, "stderr") == "", _text(c, "stderr")

    assert "softmax matches torch: True" in _text(code[0])
    assert re.search(
        r"<jitops library my_ops \(\S+, key [0-9a-f]{12}\): squared_relu>", _text(code[1])
    )
    assert "squared_relu matches PyTorch" in _text(code[1])
    out = _text(code[2])
    assert re.search(r"<jitops library my_ops \(\S+, key [0-9a-f]{12}\): bias_squared_relu>", out)
    for line in (
        "bias_squared_relu matches PyTorch",
        "old handle still works: True",
        "same source, same object: True",
    ):
        assert line in out

    err = errors[0][1]
    assert err["ename"] == "BuildError"
    message = err["evalue"].splitlines()
    assert message[0].startswith("building op library 'my_ops' for ") and message[0].endswith(
        " failed"
    )
    assert re.fullmatch(
        r"/\S+/v1/inline/my_ops-[0-9a-f]{32}/my_ops\.cpp:\d+:\d+: error: .zero. was not declared in this scope(; did you mean .*)?",
        message[1],
    ), message[1]
    assert any(
        re.fullmatch(r"  > +\d+ \|\s+float pos = v > 0\.f \? v : zero;", ln) for ln in message
    ), message
    assert message[-1].startswith("full log: ") and len(message) <= 40
    # The cell's live status ended as "failed"; it is a display that was updated in place.
    status = [
        o["data"]["text/plain"] for o in code[3].outputs if o.get("output_type") == "display_data"
    ]
    assert len(status) == 1 and re.fullmatch(
        r"jitops: failed my_ops for \S+ \.\.\. \d+\.\ds", status[0]
    ), status

    assert "back to the working version: True" in _text(code[4])
    timing = _text(code[5])
    assert re.search(r"PyTorch relu\(x \+ bias\) \*\* 2: +\d+\.\d{3} ms", timing), timing
    assert re.search(
        r"jitops bias_squared_relu: +\d+\.\d{3} ms +\(\d+\.\d\dx PyTorch's speed\)", timing
    ), timing

    # A cell written for torch.utils.cpp_extension.load_inline: only its import line differs (issue
    # 17).
    assert (
        code[6]
        .source.splitlines()[0]
        .startswith("from jitops import load_inline  # was: from torch.utils.cpp_extension")
    )
    assert "load_inline(name=" in code[6].source and "jitops." not in code[6].source
    dropin = _text(code[6])
    assert "sin_add matches PyTorch: True" in dropin and "traced whole: True" in dropin, dropin
