"""The compile-error message format (pure: a recorded compiler log, real source files, no compiler)."""

from __future__ import annotations

from pathlib import Path

from jitops.build.job import BuildJob
from jitops.build.build_errors import MAX_ERROR_LINES, error_sites, format_build_error


def _job(tmp_path: Path) -> BuildJob:
    return BuildJob(
        library="mine",
        target="cpu-avx2",
        device="cpu",
        namespace="jitops_mine_0123456789abcdef",
        sources=(tmp_path / "mine.cpp",),
        include_dirs=(),
        cflags=(),
        cuda_cflags=(),
        ldflags=(),
        cxx="g++",
        ninja="ninja",
        nvcc=None,
        build_dir=tmp_path / "build",
        env={},
        jobs=2,
    )


SOURCE = (
    "\n".join(
        [
            "#include <jitops/op.h>",  # 1
            "",  # 2
            "at::Tensor f(const at::Tensor& x) {",  # 3
            "\tauto y = x.relu();",  # 4 (a tab: gcc counts it as 8 display columns)
            "\treturn y * scale;",  # 5
            "}",  # 6
            "int g() { return nope(); }",  # 7
        ]
    )
    + "\n"
)


def test_first_errors_with_file_line_caret_and_log_path(tmp_path: Path) -> None:
    src = tmp_path / "mine.cpp"
    src.write_text(SOURCE)
    log = (
        "[1/2] g++ -c mine.cpp -o mine.o\n"
        "FAILED: mine.o\n"
        f"{src}: In function 'at::Tensor f(const at::Tensor&)':\n"
        f"{src}:5:20: error: 'scale' was not declared in this scope\n"
        "    5 |         return y * scale;\n"
        "      |                    ^~~~~\n"
        f"{src}:5:20: error: 'scale' was not declared in this scope (again, same line)\n"
        f"{src}:7:18: error: 'nope' was not declared in this scope\n"
        f"{src}:9:1: error: a third error is not shown\n"
        "ninja: build stopped: subcommand failed.\n"
    )
    msg = format_build_error(_job(tmp_path), 1, log, tmp_path / "mine.log")
    assert msg.splitlines() == [
        "building op library 'mine' for cpu-avx2 failed",
        f"{src}:5:20: error: 'scale' was not declared in this scope",
        "        3 | at::Tensor f(const at::Tensor& x) {",
        "        4 |         auto y = x.relu();",
        "  >     5 |         return y * scale;",
        "          |                    ^",
        "        6 | }",
        "        7 | int g() { return nope(); }",
        f"{src}:7:18: error: 'nope' was not declared in this scope",
        "        5 |         return y * scale;",
        "        6 | }",
        "  >     7 | int g() { return nope(); }",
        "          |                  ^",
        "Fix: correct the first error above (mine.cpp:5) and run again",
        f"full log: {tmp_path / 'mine.log'}",
    ]


def test_nvcc_errors_and_headers_are_found(tmp_path: Path) -> None:
    hdr = tmp_path / "k.cuh"
    hdr.write_text("a\nb\nc\n")
    log = f'In file included from x.cu:1:\n{hdr}(2): error: identifier "q" is undefined\n'
    assert error_sites(log) == [(str(hdr), 2, None, 'identifier "q" is undefined')]
    msg = format_build_error(_job(tmp_path), 2, log, None)
    assert msg.splitlines()[1:] == [
        f'{hdr}:2: error: identifier "q" is undefined',
        "        1 | a",
        "  >     2 | b",
        "        3 | c",
        "Fix: correct the first error above (k.cuh:2) and run again",
    ]


def test_long_messages_fit_one_screen(tmp_path: Path) -> None:
    src = tmp_path / "mine.cpp"
    src.write_text(SOURCE)
    log = f"{src}:5:20: error: no match for call to " + "std::vector<at::Tensor> " * 400 + "\n"
    msg = format_build_error(_job(tmp_path), 1, log, tmp_path / "x.log")
    assert all(len(line) <= 200 + len(str(src)) + 20 for line in msg.splitlines())
    assert msg.splitlines()[1].endswith("...")
    no_error_line = "\n".join(f"linker line {i} " + "x" * 500 for i in range(100))
    msg = format_build_error(_job(tmp_path), 1, no_error_line, tmp_path / "x.log")
    lines = msg.splitlines()
    assert len(lines) <= MAX_ERROR_LINES and lines[-1] == f"full log: {tmp_path / 'x.log'}"
    assert (
        "(exit code 1; no compiler error line found; last output:)" in msg
        and "linker line 99" in msg
    )


def test_excerpt_numbers_lines_as_a_line_directive_does(tmp_path: Path) -> None:
    """The drop-in prepends <torch/extension.h> and "#line 1" (issue 29): the excerpt shows the user's lines with
    the numbers the compiler reports, never the prepended header."""
    src = tmp_path / "mine.cpp"
    src.write_text("#include <torch/extension.h>\n#line 1\nint a = 1;\nint b = nope;\nint c = 3;\n")
    msg = format_build_error(
        _job(tmp_path), 1, f"{src}:2:9: error: 'nope' was not declared in this scope\n", None
    )
    assert msg.splitlines()[2:5] == [
        "        1 | int a = 1;",
        "  >     2 | int b = nope;",
        "          |         ^",
    ]
    assert "#include" not in msg and "(mine.cpp:2)" in msg
