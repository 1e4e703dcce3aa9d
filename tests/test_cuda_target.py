"""Pure tests of the CUDA decisions: arch lists, target names, keys, check-before-load.

No GPU and no compiler: every device is simulated by building a ``System``
by hand, as ``probe()`` would on a machine with that GPU.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from jitops.loading import loader
import jitops.key as jkey
import jitops.plan as jplan
import jitops.registry as jregistry
from jitops.target.archs import (
    NAMED_ARCHS,
    arch_gencode_flags,
    check_runnable,
    default_arch,
    parse_arch_list,
    ptx_archs,
    runnable_code,
    sass_archs,
)
from jitops.key import compute_key
from jitops.errors import TargetError
from jitops.spec import OpSpec
from jitops.target import System, Target, choose_target
from tests.cuda_fakes import fake_toolkit, gpu_system


# ----------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text",
    ["8.0;9.0", "9.0;8.0", "8.0,9.0", "8.0 9.0", " 9.0 , 8.0 ;", "8.0;9.0;8.0"],
)
def test_equivalent_spellings_normalize_to_one_list(text: str) -> None:
    assert parse_arch_list(text) == ("8.0", "9.0")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8.6+PTX", ("8.6+PTX",)),
        ("8.6+ptx", ("8.6+PTX",)),
        ("8.0;8.0+PTX", ("8.0+PTX",)),  # SASS is implied by +PTX: one entry, one name
        ("9.0a", ("9.0a",)),
        ("10.0f;9.0", ("9.0", "10.0f")),
        ("12.0;8.0;10.0", ("8.0", "10.0", "12.0")),  # numeric order, not string order
        ("9.0a;9.0", ("9.0", "9.0a")),
        ("Ampere", ("8.0", "8.6+PTX")),
        ("ampere;Hopper", ("8.0", "8.6+PTX", "9.0+PTX")),
        ("Ampere+Tegra", ("8.7",)),
        ("Volta+Tegra+PTX", ("7.2+PTX",)),
    ],
)
def test_parse_forms(text: str, expected: tuple[str, ...]) -> None:
    assert parse_arch_list(text) == expected


@pytest.mark.parametrize(
    "text", ["8", "sm_80", "8.0+SASS", "ampere9", "80", "8.0b", "Ampere+PTX+PTX"]
)
def test_invalid_arch_names_the_entry_and_the_accepted_forms(text: str) -> None:
    with pytest.raises(TargetError) as e:
        parse_arch_list(text)
    assert f"invalid CUDA arch {text!r}" in str(e.value)
    assert "'8.0'" in str(e.value) and "Ampere" in str(e.value)


def test_empty_list_is_an_error() -> None:
    with pytest.raises(TargetError, match="empty CUDA arch list"):
        parse_arch_list(" ; ,")


# Lists whose nvcc flags must equal torch's own cpp_extension._get_cuda_arch_flags.
_TORCH_FORMS = [
    *NAMED_ARCHS,
    "8.0;9.0",
    "7.5;8.6+PTX",
    "9.0a",
    "10.0;12.0+PTX",
    "8.0 9.0+PTX",
    "Ampere;Hopper",
]


@pytest.mark.parametrize("text", _TORCH_FORMS)
def test_gencode_flags_equal_torchs_for_every_form_it_accepts(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    import torch.utils.cpp_extension as ce

    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", text)
    try:
        theirs = ce._get_cuda_arch_flags()
    except ValueError:
        # Names newer than the installed torch (e.g. Rubin before 2.14) are unknown to it;
        # torch 2.14.1, the CUDA build jitops's CI leg uses, must know every one.
        assert tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 14), text
        pytest.skip(f"torch {torch.__version__} does not know {text!r}")
    ours = sorted(arch_gencode_flags(parse_arch_list(text)))
    if (
        "Blackwell" in text
        and ours != sorted(theirs)
        and int((torch.version.cuda or "13").split(".")[0]) < 13
    ):
        # jitops's named archs follow torch 2.13+ (CUDA 13: Thor is sm_110, Blackwell adds 10.3 and
        # 12.1). A torch built for CUDA 12 (2.7.1+cu126) names the older sets; there, give archs by
        # number.
        pytest.skip(
            f"torch {torch.__version__} (CUDA {torch.version.cuda}) names an older {text!r}: {theirs}"
        )
    assert ours == sorted(theirs)


def test_gencode_flags_sass_and_ptx() -> None:
    archs = parse_arch_list("9.0a+PTX;8.0")
    assert arch_gencode_flags(archs) == (
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-gencode=arch=compute_90a,code=compute_90a",
    )
    assert sass_archs(archs) == ("sm_80", "sm_90a")
    assert ptx_archs(archs) == ("compute_90a",)


# ----------------------------------------------------------------- targets


@pytest.mark.parametrize(
    ("archs", "name"),
    [
        ("8.0,9.0", "cuda-sm80-sm90"),
        ("9.0;8.0", "cuda-sm80-sm90"),
        ("8.0;9.0+PTX", "cuda-sm80-sm90ptx"),
        ("9.0a", "cuda-sm90a"),
        ("12.0;10.0f", "cuda-sm100f-sm120"),
        ("Ampere", "cuda-sm80-sm86ptx"),
    ],
)
def test_target_name_carries_the_arch_list(archs: str, name: str) -> None:
    target = choose_target(gpu_system(None), "cuda", archs)
    assert target.name == name
    assert os.sep not in target.name and target.name.isascii()


def _key(system: System, target: Target) -> str:
    spec = jregistry.registry().library("softmax")
    return compute_key(
        jkey.ingredients(spec, target, system, None, None, {"softmax_cuda.cu": "0" * 64})
    )


def test_sm80_and_sm90_entries_coexist() -> None:
    system = gpu_system(None)
    t80, t90, both = (choose_target(system, "cuda", a) for a in ("8.0", "9.0", "8.0,9.0"))
    assert len({t80.name, t90.name, both.name}) == 3
    assert len({_key(system, t) for t in (t80, t90, both)}) == 3
    assert _key(system, both) == _key(system, choose_target(system, "cuda", "9.0;8.0"))
    ptx = choose_target(system, "cuda", "8.0;9.0+PTX")
    assert _key(system, ptx) != _key(system, both) and ptx.name != both.name


def test_explicit_archs_beat_the_environment_which_beats_the_gpu() -> None:
    system = gpu_system((8, 6), TORCH_CUDA_ARCH_LIST="7.5;8.0")
    assert choose_target(system, "cuda", "9.0").archs == ("9.0",)
    assert choose_target(system, "cuda").archs == ("7.5", "8.0")
    assert choose_target(gpu_system((8, 6)), "cuda").archs == ("8.6",)
    assert choose_target(gpu_system((8, 6), TORCH_CUDA_ARCH_LIST="native"), "cuda").archs == (
        "8.6",
    )


def test_a_gpu_newer_than_torch_builds_torchs_newest_arch_with_ptx() -> None:
    """Like cpp_extension: nvcc matches torch's CUDA and may not know a newer GPU, so the default is
    clamped to the newest sm_XY torch was built for, plus PTX the driver JIT-compiles."""
    torch_sm = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")
    for cap, want in [
        ((9, 0), ("9.0",)),
        ((12, 0), ("12.0",)),
        ((8, 9), ("8.9",)),
        ((12, 1), ("12.0+PTX",)),
        ((13, 0), ("12.0+PTX",)),
    ]:
        system = dataclasses.replace(gpu_system(cap), torch_cuda_archs=torch_sm)
        t = choose_target(system, "cuda")
        assert t.archs == want, (cap, t.archs)
        assert runnable_code(t.archs, cap) is not None  # and it passes the check before load
    # torch's list unknown: no clamp
    assert choose_target(gpu_system((13, 0)), "cuda").archs == ("13.0",)
    assert default_arch((10, 3), ("sm_90a", "sm_100f")) == "10.0+PTX"
    assert default_arch((9, 0), ("sm_90a",)) == "9.0"


def test_default_device_is_cuda_when_a_gpu_is_visible() -> None:
    assert choose_target(gpu_system((12, 0))).name == "cuda-sm120"
    assert choose_target(gpu_system(None)).device == "cpu"


def test_cuda_without_gpu_needs_an_explicit_arch_list() -> None:
    with pytest.raises(TargetError) as e:
        choose_target(gpu_system(None), "cuda")
    msg = str(e.value)
    assert "no GPU is visible" in msg and "TORCH_CUDA_ARCH_LIST is not set" in msg
    assert "jitops warm" in msg and "--arch 8.0,9.0" in msg
    with pytest.raises(TargetError, match="'native', which needs a GPU"):
        choose_target(gpu_system(None, TORCH_CUDA_ARCH_LIST="native"), "cuda")


def test_cpu_only_torch_cannot_target_cuda() -> None:
    system = dataclasses.replace(gpu_system(None), torch_cuda=None)
    with pytest.raises(TargetError, match="CPU-only build"):
        choose_target(system, "cuda", "8.0")


# ------------------------------------------------------ check before load


@pytest.mark.parametrize(
    ("archs", "capability", "code"),
    [
        (("8.0", "9.0"), (8, 0), "sm_80"),
        (("8.0", "9.0"), (8, 6), "sm_80"),  # SASS runs on later minors of its major
        (("8.0", "9.0"), (8, 9), "sm_80"),
        (("8.0", "9.0"), (9, 0), "sm_90"),
        (("8.0", "8.6"), (8, 9), "sm_86"),  # the closest SASS wins
        (("8.0", "9.0"), (7, 5), None),  # older than every arch
        (("8.0", "9.0"), (10, 0), None),  # newer major, no PTX
        (("8.0", "9.0"), (12, 0), None),
        (("8.6",), (8, 0), None),  # SASS never runs on an earlier minor
        (("8.0", "9.0+PTX"), (10, 0), "compute_90"),  # PTX is JIT-compiled for newer devices
        (("8.0", "9.0+PTX"), (12, 1), "compute_90"),
        (("8.0", "9.0+PTX"), (8, 6), "sm_80"),  # SASS is preferred over PTX
        (("8.0+PTX",), (8, 6), "sm_80"),
        (("8.6+PTX",), (8, 0), None),  # PTX does not run on older devices either
        (("9.0a",), (9, 0), "sm_90a"),
        (("10.0a",), (10, 3), None),  # arch-specific code: that exact device only
        (("9.0a+PTX",), (10, 0), None),
        (("10.0f",), (10, 3), "sm_100f"),  # family code: later minors of the family
        (("10.0f",), (12, 0), None),
    ],
)
def test_runnable_code_with_simulated_capabilities(
    archs: tuple[str, ...], capability: tuple[int, int], code: str | None
) -> None:
    assert runnable_code(archs, capability) == code


def test_mismatch_error_names_both_sides_and_the_fix() -> None:
    with pytest.raises(TargetError) as e:
        check_runnable(("8.0", "9.0"), (7, 5), "the cached build X")
    msg = str(e.value)
    assert "the cached build X" in msg and "compute capability 7.5" in msg
    assert "sm_80, sm_90" in msg and "PTX for none" in msg
    assert "no kernel image is available" in msg and "TORCH_CUDA_ARCH_LIST='7.5'" in msg
    assert check_runnable(("8.0", "9.0+PTX"), (12, 0), "x") == "compute_90"


def test_plan_for_an_arch_list_the_gpu_cannot_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Checked before building: a named list is an error; TORCH_CUDA_ARCH_LIST gives way to the GPU's arch."""
    spec = jregistry.registry().library("softmax")
    monkeypatch.setattr(jplan, "probe", lambda **_: gpu_system((9, 0), TORCH_CUDA_ARCH_LIST="8.0"))
    plan = jplan.make_plan(spec)
    assert plan.target.archs == ("8.0",)
    with caplog.at_level("WARNING", logger="jitops"):
        fixed = jplan.runnable_here(plan, None)
    assert fixed.target.name == "cuda-sm90" and fixed.key != plan.key
    assert "has no code for this GPU (compute capability 9.0)" in caplog.text
    with pytest.raises(TargetError, match="compute capability 9.0"):
        jplan.runnable_here(jplan.make_plan(spec, "cuda", "8.0"), "8.0")
    ok = jplan.make_plan(spec, "cuda", "8.0,9.0")
    assert jplan.runnable_here(ok, "8.0,9.0") is ok
    newer = dataclasses.replace(
        gpu_system((12, 1), TORCH_CUDA_ARCH_LIST="8.0"), torch_cuda_archs=("sm_80", "sm_120")
    )
    monkeypatch.setattr(jplan, "probe", lambda **_: newer)
    assert jplan.runnable_here(jplan.make_plan(spec), None).target.archs == ("12.0+PTX",)


def test_load_library_builds_for_the_gpu_it_will_run_on(
    tmp_path: Path, private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wired into the loader: the mismatched sm_80 entry is never built, the sm_90 one is built and loaded."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "k.cpp").write_text("// cpu\n")
    (src / "k.cu").write_text("// cuda\n")
    spec = OpSpec(
        name="archcheck",
        root=src,
        cpu_sources=("k.cpp",),
        cuda_sources=("k.cu",),
        schemas=("archcheck(Tensor x) -> Tensor",),
    )
    kit = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    monkeypatch.setattr(
        jplan,
        "probe",
        lambda **_: gpu_system((9, 0), TORCH_CUDA_ARCH_LIST="8.0", CUDA_HOME=str(kit)),
    )
    # a real, tiny .so; this test is about which entry is built
    monkeypatch.setenv("JITOPS_BUILDER", "fake")
    entries = private_cache / "v1" / "entries" / "archcheck"

    with pytest.raises(TargetError, match="compute capability 9.0"):
        loader.load_library(spec, "cuda", "8.0")
    assert not entries.exists()

    lib = loader.load_library(spec, "cuda")
    assert lib.target == "cuda-sm90" and lib.built
    assert sorted(p.name for p in entries.iterdir()) == ["cuda-sm90"]
    assert lib.manifest.ingredients["target"]["cuda_archs"] == ["9.0"]
