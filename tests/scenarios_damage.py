"""Child programs of tests/test_corruption.py and tests/test_security.py: damaged, planted and
untrusted cache entries, and what a build starts.

Each function runs in a fresh interpreter (``helpers.run_scenario("scenarios_damage.NAME", ...)``,
or as uid nobody through ``helpers.run_as_nobody``) and returns what the test checks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

from tests import scenarios as S


def truncations_and_flips(root: str, seed: int, flips: int, through_get: int) -> dict[str, Any]:
    """Build fakeadd once (``root/pristine``); then damage copies of its library and manifest: ``flips``
    random byte flips against ``Cache.verify`` in this process, and every truncation plus the first
    ``through_get`` flips through get() in fresh workers (an audit hook records each dlopened inode)."""
    from jitops.store.cache import Cache
    from jitops.store.manifest import EntryProblem

    S.preload()
    base = Path(root)
    pristine = base / "pristine"
    os.environ["JITOPS_CACHE_DIR"] = str(pristine)
    first = S.call(S.get_and_check, "fakeadd")
    assert first["ok"], first
    entry = S.entry_of(pristine)
    files = {"lib": entry / "libfakeadd.so", "manifest": entry / "manifest.json"}
    good = {k: p.read_bytes() for k, p in files.items()}
    key = json.loads(good["manifest"])["key"]
    lib_name, target = entry.parent.parent.name, entry.parent.name
    rng = random.Random(seed)

    cases: list[tuple[str, str, int | None, int | None]] = []
    for which, data in good.items():
        for cut in sorted({0, 1, 7, len(data) // 3, len(data) // 2, len(data) - 1}):
            cases.append((which, "truncate", cut, None))
    flip_cases: list[tuple[str, str, int | None, int | None]] = []
    for which in [rng.choice(["lib", "manifest"]) for _ in range(flips)]:
        off = rng.randrange(len(good[which]))
        new = rng.choice([b for b in range(256) if b != good[which][off]])
        flip_cases.append((which, "flip", off, new))

    held = []

    def damage(cache: Path, which: str, how: str, at: int | None, new: int | None) -> int:
        p = S.entry_of(cache) / files[which].name
        data = bytearray(good[which])
        if how == "truncate":
            data = data[:at]
        else:
            assert at is not None and new is not None
            data[at] = new
        with open(p, "r+b") as f:  # in place: same inode, like real damage
            f.truncate(0)
            f.write(bytes(data))
        # Hold the damaged file open, so its inode number cannot be handed to the rebuilt
        # library once the damaged entry is deleted: "loaded the damaged inode" stays exact.
        held.append(open(p, "rb"))  # kept open on purpose
        return os.stat(p).st_ino

    # Every flip against verify(), in this process.
    cache = base / "verify"
    shutil.copytree(pristine, cache)
    c = Cache(cache)
    undetected = []
    for case in flip_cases:
        damage(cache, *case)
        try:
            c.verify(S.entry_of(cache), key, lib_name, target)
            undetected.append(case)
        except EntryProblem:
            pass
    for which in files:  # restore
        damage(cache, which, "truncate", len(good[which]), None)
    c.verify(S.entry_of(cache), key, lib_name, target)

    # All truncations and the first flips through get() in fresh workers.
    rows = []
    for i, case in enumerate(cases + flip_cases[:through_get]):
        cache = base / f"c{i}"
        shutil.copytree(pristine, cache)
        ino = damage(cache, *case)
        os.environ["JITOPS_CACHE_DIR"] = str(cache)
        r = S.call(S.get_recording, timeout=30)
        v = r.get("value") or {}
        rows.append(
            {
                "case": case,
                "ok": r["ok"],
                "exit": r["exit"],
                "works": v.get("works"),
                "built": v.get("built"),
                "loaded_damaged": ino in v.get("dlopened", []),
                "loads": len(v.get("dlopened", [])),
                "err": r.get("msg"),
            }
        )
    return {"verify_flips": len(flip_cases), "undetected": undetected, "rows": rows}


def _plant(cache: Path, how: str, evil: Path, good_manifest: bytes) -> None:
    """Replace the one entry's library in ``cache`` with ``evil``, its manifest as ``how`` says."""
    from jitops.key import compute_key
    from jitops.store.manifest import Manifest

    m = Manifest.parse(good_manifest)
    e = S.entry_of(cache)
    lib = e / "libfakeadd.so"
    lib.unlink()
    shutil.copyfile(evil, lib)
    os.chmod(lib, 0o700)
    mp = e / "manifest.json"
    data = evil.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    if how == "no-manifest":
        mp.unlink()
    elif how == "garbage-manifest":
        mp.write_bytes(b"\x7fELF not json")
    elif how == "empty-manifest":
        mp.write_bytes(b"")
    elif how == "other-key":  # a valid manifest describing the planted file, but not this key
        ingr = dict(m.ingredients, cflags=["-DOTHER"])
        mp.write_bytes(
            dataclasses.replace(
                m, key=compute_key(ingr), ingredients=ingr, sha256=sha, size=len(data)
            ).to_json()
        )
    elif how == "claims-planted-sha":  # right key, planted sha, ingredients that do not hash to it
        mp.write_bytes(
            dataclasses.replace(
                m, sha256=sha, size=len(data), ingredients=dict(m.ingredients, cflags=["-DOTHER"])
            ).to_json()
        )
    elif how == "symlinked-library":  # manifest matches the planted file, reached through a symlink
        lib.unlink()
        lib.symlink_to(evil)
        mp.write_bytes(dataclasses.replace(m, sha256=sha, size=len(data)).to_json())
    elif how == "old-manifest":
        pass  # the real manifest, whose sha256 the planted file does not match
    elif how == "in-staging":  # a complete planted entry left in staging is never looked at
        shutil.rmtree(e)
        st = cache / "v1" / "staging" / "fakeadd-x.host.1.abcd" / "entry"
        st.mkdir(parents=True)
        shutil.copyfile(evil, st / "libfakeadd.so")
        (st / "manifest.json").write_bytes(good_manifest)
    else:
        raise AssertionError(how)


def planted_library(root: str, evil: str, hows: list[str]) -> list[dict[str, Any]]:
    """Build fakeadd once (``root/pristine``); per ``how``, a copy with the library ``evil`` planted
    (see ``_plant``), then get() in a fresh worker."""
    S.preload()
    base = Path(root)
    pristine = base / "pristine"
    os.environ["JITOPS_CACHE_DIR"] = str(pristine)
    assert S.call(S.get_and_check, "fakeadd")["ok"]
    good_manifest = (S.entry_of(pristine) / "manifest.json").read_bytes()
    rows = []
    for how in hows:
        cache = base / how
        shutil.copytree(pristine, cache)
        _plant(cache, how, Path(evil), good_manifest)
        os.environ["JITOPS_CACHE_DIR"] = str(cache)
        r = S.call(S.get_recording, timeout=30)
        rows.append(
            {
                "how": how,
                "ok": r["ok"],
                "works": (r.get("value") or {}).get("works"),
                "built": (r.get("value") or {}).get("built"),
                "err": r.get("msg"),
            }
        )
    return rows


def dlopen(path: str) -> bool:
    """Load the shared library ``path`` directly."""
    import ctypes

    ctypes.CDLL(path)
    return True


# ------------------------------------------------------------------ security


def build_pristine(base: str) -> str:
    """Build fakeadd into ``base/pristine`` (HOME is ``base``); "built"."""
    os.environ["HOME"] = base
    S.preload()
    os.environ["JITOPS_CACHE_DIR"] = str(Path(base) / "pristine")
    r = S.call(S.get_and_check, "fakeadd")
    assert r["ok"], r
    return "built"


def _get_with_warnings() -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = S.get_and_check("fakeadd")
    r["warnings"] = [str(w.message) for w in caught]
    return r


def get_from_each_cache(
    base: str, cases: list[str], strict_case: str
) -> list[tuple[str, dict[str, Any]]]:
    """get() in a fresh worker from each cache ``base/<case>``; then with JITOPS_STRICT=1 from ``base/<strict_case>``."""
    S.preload()
    rows = []
    for case in cases:
        os.environ["JITOPS_CACHE_DIR"] = base + "/" + case
        rows.append((case, S.call(_get_with_warnings, timeout=30)))
    os.environ["JITOPS_CACHE_DIR"] = base + "/" + strict_case
    rows.append(
        ("strict", S.call(S.get_and_check, "fakeadd", env={"JITOPS_STRICT": "1"}, timeout=30))
    )
    return rows


def build_subprocesses() -> list[tuple[Any, Any, Any]]:
    """Get fakeadd; every subprocess.Popen meanwhile: (executable, argv, sorted env names or None)."""
    S.preload()
    seen = []
    sys.addaudithook(
        lambda e, a: (
            seen.append(
                (
                    a[0],
                    list(a[1]) if isinstance(a[1], (list, tuple)) else a[1],
                    sorted(a[3]) if a[3] is not None else None,
                )
            )
            if e == "subprocess.Popen"
            else None
        )
    )
    S.get_and_check("fakeadd")
    return seen


def _get_both_with_warnings() -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values = [S.get_and_check(n)["works"] for n in ("fakeadd", "fakemul")]
    return {"values": values, "warnings": [str(w.message) for w in caught]}


def unreachable_cache() -> list[dict[str, Any]]:
    """fakeadd and fakemul in one worker (with the warnings), then fakeadd with JITOPS_STRICT=1."""
    S.preload()
    return [
        S.call(_get_both_with_warnings),
        S.call(S.get_and_check, "fakeadd", env={"JITOPS_STRICT": "1"}),
    ]
