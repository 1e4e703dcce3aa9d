"""What a source file's text says about the headers it needs: ``<torch/extension.h>``, Python's API.

Plain regular expressions, shared by the drop-in (cpp_ext_style: which bindings, on the warm path too)
and the per-file build (tubuild: where the stand-in may stand in), so a warm load imports no build code.

Imports: base.patterns (``lazy``).
"""

from __future__ import annotations

import re
from ..base.patterns import lazy

EXTENSION_H = lazy(
    r"^\s*#\s*include\s*[<\"]torch/extension\.h[>\"]", re.MULTILINE, needs="torch/extension.h"
)
# Python's or pybind11's API: such a file needs the real header (the drop-in's generated bindings
# are not the user's).
PYTHON_API = lazy(
    r"\b(PYBIND11_\w+|pybind11|py::|Py_\w+|Py[A-Z][A-Za-z]*_\w+|PyObject|PyMODINIT_FUNC|THP\w+)"
)


_COMMENT = lazy(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def spells_python_api(text: str) -> bool:
    """Whether ``text``'s code (its comments aside) spells Python's or pybind11's API."""
    return PYTHON_API.search(_COMMENT.sub(" ", text)) is not None
