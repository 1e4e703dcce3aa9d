"""Damaged and planted cache entries are detected before anything is loaded.

A truncated or flipped library or manifest is a cache miss: the entry is set
aside and rebuilt, once, and the damaged file is never dlopened (an audit
hook records the inode of every library ``ctypes`` opens). A planted library
whose constructor would write a marker file never runs without a valid
manifest.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import child_env, last_json, run_py, tattletale_library

pytestmark = [pytest.mark.process]




@pytest.mark.slow
@pytest.mark.timeout(400)
def test_truncations_and_flips_detected_before_load(tmp_path: Path) -> None:
    out = run_py(
        f"""
        import random
        from jitops.cache import Cache
        from jitops.manifest import EntryProblem
        import os, shutil
        from pathlib import Path
        from tests import scenarios as S
        from tests.scenarios import entry_of, get_recording
        S.preload()
        root = Path({str(tmp_path)!r})
        pristine = root / "pristine"
        os.environ["JITOPS_CACHE_DIR"] = str(pristine)
        first = S.call(S.get_and_check, "fakeadd")
        assert first["ok"], first
        entry = entry_of(pristine)
        files = {{"lib": entry / "libfakeadd.so", "manifest": entry / "manifest.json"}}
        good = {{k: p.read_bytes() for k, p in files.items()}}
        key = __import__("json").loads(good["manifest"])["key"]
        lib_name, target = entry.parent.parent.name, entry.parent.name
        rng = random.Random(3)

        cases = []
        for which, data in good.items():
            for cut in sorted({{0, 1, 7, len(data) // 3, len(data) // 2, len(data) - 1}}):
                cases.append((which, "truncate", cut, None))
        flips = [(rng.choice(["lib", "manifest"]), "flip", None, None) for _ in range(300)]
        for i, (which, _, _, _) in enumerate(flips):
            off = rng.randrange(len(good[which]))
            new = rng.choice([b for b in range(256) if b != good[which][off]])
            flips[i] = (which, "flip", off, new)

        held = []

        def damage(cache, which, how, at, new):
            p = entry_of(cache) / files[which].name
            data = bytearray(good[which])
            if how == "truncate":
                data = data[:at]
            else:
                data[at] = new
            mode = os.stat(p).st_mode
            with open(p, "r+b") as f:  # in place: same inode, like real damage
                f.truncate(0)
                f.write(bytes(data))
            # Hold the damaged file open, so its inode number cannot be handed to the rebuilt
            # library once the damaged entry is deleted: "loaded the damaged inode" stays exact.
            held.append(open(p, "rb"))
            return os.stat(p).st_ino

        # Every flip against verify(), in this process.
        cache = root / "verify"
        shutil.copytree(pristine, cache)
        c = Cache(cache)
        undetected = []
        for case in flips:
            damage(cache, *case)
            try:
                c.verify(entry_of(cache), key, lib_name, target)
                undetected.append(case)
            except EntryProblem:
                pass
        for which in files:  # restore
            damage(cache, which, "truncate", len(good[which]), None)
        c.verify(entry_of(cache), key, lib_name, target)

        # All truncations and 60 flips through get() in fresh workers.
        rows = []
        for i, case in enumerate(cases + flips[:60]):
            cache = root / f"c{{i}}"
            shutil.copytree(pristine, cache)
            ino = damage(cache, *case)
            os.environ["JITOPS_CACHE_DIR"] = str(cache)
            r = S.call(get_recording, timeout=30)
            v = r.get("value") or {{}}
            trash = list((cache / "v1" / "trash").glob("*")) if (cache / "v1" / "trash").exists() else []
            rows.append({{"case": case, "ok": r["ok"], "exit": r["exit"], "works": v.get("works"),
                         "built": v.get("built"), "loaded_damaged": ino in v.get("dlopened", []),
                         "loads": len(v.get("dlopened", [])), "err": r.get("msg")}})
        S.report({{"verify_flips": len(flips), "undetected": undetected, "rows": rows}})
        """,
        env=child_env(JITOPS_BUILDER="fake"),
        timeout=390,
    )
    r = last_json(out.stdout)
    assert r["verify_flips"] == 300 and r["undetected"] == []
    rows = r["rows"]
    assert len(rows) == 12 + 60
    bad = [x for x in rows if not (x["ok"] and x["exit"] == 0 and x["works"] and x["built"])]
    assert not bad, bad[:3]
    assert [x for x in rows if x["loaded_damaged"]] == []
    assert all(x["loads"] == 1 for x in rows)  # one dlopen: the rebuilt library; no retry loop


@pytest.mark.timeout(120)
def test_planted_library_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "PLANTED-LIBRARY-RAN"
    evil = tattletale_library(tmp_path, marker)
    out = run_py(
        f"""
        import json
        from jitops.manifest import Manifest
        import os, shutil
        from pathlib import Path
        from tests import scenarios as S
        from tests.scenarios import entry_of, get_recording
        S.preload()
        root = Path({str(tmp_path)!r})
        evil = Path({str(evil)!r})
        pristine = root / "pristine"
        os.environ["JITOPS_CACHE_DIR"] = str(pristine)
        assert S.call(S.get_and_check, "fakeadd")["ok"]
        good_manifest = (entry_of(pristine) / "manifest.json").read_bytes()
        m = Manifest.parse(good_manifest)

        def plant(cache, how):
            e = entry_of(cache)
            lib = e / "libfakeadd.so"
            lib.unlink()
            shutil.copyfile(evil, lib)
            os.chmod(lib, 0o700)
            mp = e / "manifest.json"
            if how == "no-manifest":
                mp.unlink()
            elif how == "garbage-manifest":
                mp.write_bytes(b"\\x7fELF not json")
            elif how == "empty-manifest":
                mp.write_bytes(b"")
            elif how == "other-key":  # a valid manifest describing the planted file, but not this key
                import hashlib, dataclasses
                data = evil.read_bytes()
                ingr = dict(m.ingredients, cflags=["-DOTHER"])
                from jitops.key import compute_key
                fake = dataclasses.replace(m, key=compute_key(ingr), ingredients=ingr,
                                           sha256=hashlib.sha256(data).hexdigest(), size=len(data))
                mp.write_bytes(fake.to_json())
            elif how == "claims-planted-sha":  # right key, planted sha, ingredients that do not hash to it
                import hashlib, dataclasses
                data = evil.read_bytes()
                fake = dataclasses.replace(m, sha256=hashlib.sha256(data).hexdigest(), size=len(data),
                                           ingredients=dict(m.ingredients, cflags=["-DOTHER"]))
                mp.write_bytes(fake.to_json())
            elif how == "symlinked-library":  # manifest matches the planted file, reached through a symlink
                import hashlib, dataclasses
                lib.unlink()
                lib.symlink_to(evil)
                data = evil.read_bytes()
                mp.write_bytes(dataclasses.replace(m, sha256=hashlib.sha256(data).hexdigest(), size=len(data)).to_json())
            elif how == "old-manifest":
                pass  # the real manifest, whose sha256 the planted file does not match
            elif how == "in-staging":  # a complete planted entry left in staging is never looked at
                shutil.rmtree(e)
                st = cache / "v1" / "staging" / "fakeadd-x.host.1.abcd" / "entry"
                st.mkdir(parents=True)
                shutil.copyfile(evil, st / "libfakeadd.so")
                (st / "manifest.json").write_bytes(good_manifest)

        hows = ["no-manifest", "garbage-manifest", "empty-manifest", "other-key", "claims-planted-sha",
                "symlinked-library", "old-manifest", "in-staging"]
        rows = []
        for how in hows:
            cache = root / how
            shutil.copytree(pristine, cache)
            plant(cache, how)
            os.environ["JITOPS_CACHE_DIR"] = str(cache)
            r = S.call(get_recording, timeout=30)
            rows.append({{"how": how, "ok": r["ok"], "works": (r.get("value") or {{}}).get("works"),
                         "built": (r.get("value") or {{}}).get("built"), "err": r.get("msg")}})
        S.report(rows)
        """,
        env=child_env(JITOPS_BUILDER="fake"),
    )
    rows = last_json(out.stdout)
    assert len(rows) == 8
    assert not marker.exists(), "a planted library ran"
    assert all(r["ok"] and r["works"] and r["built"] for r in rows), rows


def test_tattletale_is_a_working_detector(tmp_path: Path) -> None:
    """The planted library does run when loaded directly (so its silence above means something)."""
    import ctypes

    marker = tmp_path / "RAN"
    lib = tattletale_library(tmp_path, marker)
    run_py(f"import ctypes; ctypes.CDLL({str(lib)!r})")
    assert marker.exists()
    del ctypes
