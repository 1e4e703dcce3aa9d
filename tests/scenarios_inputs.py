"""Scenarios of tests/adversarial/test_stale_inputs.py: a stable-ABI kernel whose one op returns the
number its headers (or a library it links) define, loaded through ``jitops.load`` in a fresh process."""

from __future__ import annotations

from typing import Any

HEAD = """\
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/Exception.h>
"""
TAIL = """
double value() { return VALUE; }
STABLE_TORCH_LIBRARY(JITOPS_NS, m) { m.def("value() -> float"); }
STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CompositeExplicitAutograd, m) {
  m.impl("value", TORCH_BOX(&value));
}
"""


def kernel(includes: str) -> str:
    """A kernel whose ``value()`` returns ``VALUE``, which ``includes`` (or the flags) define."""
    return HEAD + includes + TAIL


def load_value(
    name: str,
    sources: list[str],
    extra_cflags: list[str] | None = None,
    extra_ldflags: list[str] | None = None,
    extra_include_paths: list[str] | None = None,
    times: int = 1,
    edits: list[list[str]] | None = None,
) -> dict[str, Any]:
    """Load the library ``times`` times in this process (before load ``i`` > 0, ``edits[i - 1]``
    (path, text) is written); each load's value, whether it built, its key and namespace."""
    import jitops

    out = []
    for i in range(times):
        if i and edits:
            path, text = edits[i - 1]
            with open(path, "w") as f:
                f.write(text)
        lib = jitops.load(
            name,
            sources,
            extra_cflags=extra_cflags,
            extra_ldflags=extra_ldflags,
            extra_include_paths=extra_include_paths,
        )
        out.append(
            {
                "value": float(lib.value()),
                "built": lib.library.built,
                "key": lib.library.key,
                "namespace": lib.library.namespace,
                "entry": str(lib.library.entry),
            }
        )
    return out[0] if times == 1 else {"loads": out}


def get_twice(folder: str, op: str, header: str) -> dict[str, Any]:
    """``jitops.get`` of a registered kernel folder's op, then again after ``header`` (outside the
    folder) was edited in this process: both values, and whether the second built."""
    import jitops

    jitops.register_kernel_dir(folder, ops=[op])
    first = jitops.get(op)
    with open(header, "w") as f:
        f.write("#define VALUE 2.0\n")
    second = jitops.get(op)
    return {
        "values": [float(first()), float(second())],
        "keys": [first.library.key, second.library.key],
        "built": second.library.built,
    }
