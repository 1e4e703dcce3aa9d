"""The fast tier: what a bare ``python -m pytest`` runs (tests/conftest.py applies it; ``--full`` runs all), and the
versions tier (``--tier versions``, CI's newest torch: see VERSIONS_FILES).

An allow-list: pure files (their tests without a heavy mark) and named tests (one real build of each builtin
library, a smoke test of each public entry point). Anything not listed, every new file included (e.g.
tests/adversarial/), runs only in the full tier, which is what CI runs.
"""

from __future__ import annotations

from collections.abc import Iterable

# Files whose tests without a compile, process or slow mark are all fast (pure: seconds in all).
FAST_FILES = frozenset(
    {
        "tests/test_bench.py",
        "tests/test_build_errors.py",
        "tests/test_cache_parts.py",
        "tests/test_cli.py",
        "tests/test_compilers.py",
        "tests/test_cuda_target.py",
        "tests/test_cuda_toolchain.py",
        "tests/test_docs_coverage.py",
        "tests/test_errors.py",
        "tests/test_first_minutes.py",
        "tests/test_freeze.py",
        "tests/test_functionalize.py",
        "tests/test_get_path.py",
        "tests/test_gpu_safe.py",
        "tests/test_ninja.py",
        "tests/test_pch_background.py",
        "tests/test_pure_core.py",
        "tests/test_selfcheck.py",
        "tests/test_tiers.py",
        "tests/test_torch_versions.py",
        "tests/test_stable_abi.py",
        "tests/test_layout.py",
        "tests/test_bundles.py",
        "tests/test_record.py",
        "tests/test_patterns.py",
        "tests/test_recall.py",
        "tests/test_userdirs.py",
        "tests/test_xdist_order.py",
    }
)
# Named tests, whatever their marks: one real build of each builtin library, and a smoke test of
# each public entry point. "file::test" takes every parametrization; "file::test[id]" just that one.
FAST_TESTS = frozenset(
    {
        # get() of each builtin library, built for real once (the session cache), checked against
        # torch
        "tests/test_kernels.py::test_softmax_matches_reference",  # softmax, log_softmax
        "tests/test_kernels.py::test_add_matches_reference_and_torch",
        "tests/test_kernels.py::test_nms_matches_reference",
        "tests/test_kernels.py::test_gradcheck",  # autograd through the built kernels
        # load / load_inline (jitops style) and register_kernel_dir
        "tests/test_user.py::test_load_from_files_and_register_kernel_dir",
        # the drop-in load / load_inline (torch's style: <torch/extension.h>, functions=)
        "tests/test_dropin.py::test_functions_become_module_attributes_and_run",
        # two builds failing in ~1 s
        "tests/test_dropin.py::test_compile_errors_name_the_line_of_the_users_string",
        "tests/test_dropin.py::test_every_torch_parameter_is_accepted_in_torchs_order",
        # the `jitops` console script and `jitops explain` on a real entry (test_cli.py: list, info,
        # warm, cache * with the fake builder; test_selfcheck.py and test_bench.py: doctor, bench)
        "tests/test_cli_process.py::test_console_script_is_main",
        "tests/test_cli_process.py::test_explain_names_the_changed_ingredient",
        # jitops bundle build (add, from the session cache) and get() from the installed wheel with
        # no compiler
        "tests/test_bundles.py::test_installed_bundle_serves_get_with_no_build[no-compiler]",
        # jitops.distributed: get outside a job, warm's rank and world from a process group
        "tests/test_distributed.py::test_without_torch_distributed_nothing_changes",
        "tests/test_distributed.py::test_warm_takes_rank_and_world_from_an_initialized_process_group",
        # the first edit never waits for its PCH (built after it, detached; tiny plain C++, real
        # g++: seconds)
        "tests/test_pch_background.py::test_first_edit_returns_before_the_pch_then_the_next_edit_uses_it",
        # the jitops.kernels entry-point group
        "tests/test_entrypoints.py::test_broken_packages_are_skipped_with_a_warning",
    }
)
HEAVY = frozenset({"compile", "process", "slow", "cuda"})
# The versions tier (``--tier versions``: CI's torch-versions leg, the newest torch): the fast tier,
# every pure test, and these files' compile tests: the builtin ops' parity (a kernel bit-identical
# to one torch is checked against each; no build beyond the fast tier's), the stable ABI (its
# headers, target version and link), and the lean <torch/extension.h> stand-in (it mirrors one
# torch's header set). Other user-kernel builds run in the main leg.
VERSIONS_FILES = frozenset(
    {
        "tests/test_kernels.py",
        "tests/test_parity_softmax.py",
        "tests/test_parity_add_nms.py",
        "tests/test_nms_parity.py",
        "tests/test_stable_abi.py",
        "tests/test_lean_extension.py",
    }
)


def is_fast(nodeid: str, marks: Iterable[str]) -> bool:
    """Whether the test ``nodeid`` (``tests/x.py::test[id]``) with these mark names is in the fast tier."""
    path, _, name = nodeid.partition("::")
    if nodeid in FAST_TESTS or f"{path}::{name.split('[')[0]}" in FAST_TESTS:
        return True
    return path in FAST_FILES and not HEAVY.intersection(marks)


def stale(nodeids: Iterable[str]) -> list[str]:
    """Entries of FAST_TESTS that name no collected test (a rename must not drop a test from the tier unseen)."""
    seen = set()
    for n in nodeids:
        seen.update((n, n.split("[")[0]))
    return sorted(t for t in FAST_TESTS if t not in seen)


def in_versions_tier(nodeid: str, marks: Iterable[str]) -> bool:
    """Whether ``nodeid`` runs in the versions tier: the fast tier, pure tests, the builtin ops' parity files."""
    path = nodeid.partition("::")[0]
    heavy = HEAVY.intersection(marks)
    return is_fast(nodeid, marks) or not heavy or (path in VERSIONS_FILES and heavy <= {"compile"})
