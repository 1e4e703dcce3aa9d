"""What the remote-tier commands do: ``cache keygen/push/pull/stats``, ``cache ls --remote``,
``warm --push`` and doctor's remote checks.

Imports ``jitops.store.cache``, ``jitops.errors``, ``jitops.store.manifest``,
``jitops.base.settings``, ``jitops.registry`` and ``jitops.plan`` (plans, lazily)
and this package; argparse only to declare its sub-commands. Each command
reads ``Settings`` once and passes it down. Returns exit codes;
prints, like the rest of the CLI.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from collections.abc import Sequence
from typing import Any

from ..store.cache import Cache
from ..errors import ConfigError
from ..store.manifest import EntryProblem
from ..base.settings import Settings
from .config import for_keys


def add_cache_parsers(cs: Any) -> None:
    """Declare ``jitops cache keygen|push|pull|stats`` on the ``cache`` sub-parsers."""
    p = cs.add_parser(
        "keygen", help="write a signing key pair for the remote cache (and print the public key)"
    )
    p.add_argument(
        "--show", action="store_true", help="print the existing public key and its fingerprint"
    )
    p.add_argument("--force", action="store_true", help="replace an existing key pair")
    p.set_defaults(fn=cmd_keygen)
    for name, fn, what in (
        ("push", cmd_push, "sign and upload local entries to JITOPS_REMOTE_CACHE"),
        ("pull", cmd_pull, "fetch and verify entries from JITOPS_REMOTE_CACHE"),
    ):
        p = cs.add_parser(name, help=what)
        p.add_argument("ops", nargs="*", metavar="OP", help="these ops (default: every known op)")
        p.add_argument(
            "--device",
            action="append",
            choices=("cpu", "cuda"),
            help="device (repeatable; default cpu)",
        )
        if name == "push":
            p.add_argument(
                "--resign-foreign",
                action="append",
                default=[],
                metavar="OP",
                help="also sign OP's entries that were imported or pulled, not built here: you vouch for "
                "code someone else built (repeatable)",
            )
        p.set_defaults(fn=fn)
    cs.add_parser(
        "stats", help="remote cache counters summed over this cache's processes"
    ).set_defaults(fn=cmd_stats)


def _tier(settings: Settings) -> Any:
    remote = settings.remote
    if remote is None:
        raise ConfigError(
            "JITOPS_REMOTE_CACHE is not set. Fix: set it to redis://host:port/db or file:///shared/dir"
        )
    from .session import tier_for

    tier = tier_for(remote)
    if tier.off or tier.store is None:
        raise ConfigError(f"the remote cache {remote.url} cannot be used (see the warning above)")
    return tier


def cmd_keygen(args: argparse.Namespace) -> int:
    try:
        from .signing import fingerprint, key_paths, keygen, parse_public, read_public
    except ImportError as e:
        raise ConfigError(
            f"`jitops cache keygen` needs the `cryptography` package ({e}). "
            "Fix: pip install 'jitops[remote]'"
        ) from None

    settings = for_keys(Settings.from_env())
    if args.show:
        _, pub = key_paths(settings)
        text = read_public(pub)  # ConfigError naming the file: missing, empty, not UTF-8, too big
        print(f"{text}\nfingerprint {fingerprint(parse_public(text, str(pub)))} ({pub})")
        return 0
    priv, pub, text, fp = keygen(settings, force=args.force)
    print(
        f"private key {priv} (keep it on the machines that upload, e.g. CI)\npublic key  {pub}\n"
        f"fingerprint {fp}\n\nOn every node that should trust uploads signed by it:\n"
        f"  export JITOPS_REMOTE_TRUSTED_KEYS={text}"
    )
    return 0


def _plans(ops: Sequence[str], devices: Sequence[str] | None, settings: Settings) -> list[Any]:
    from ..plan import make_plan
    from ..registry import lookup, registry

    specs = [lookup(n) for n in ops] if ops else registry().specs()
    return [
        make_plan(s, d, settings=settings)
        for s in dict.fromkeys(specs)
        for d in (devices or ["cpu"])
    ]


def cmd_push(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    tier = _tier(settings)
    if not tier.writes:
        raise ConfigError(
            "this node cannot upload: JITOPS_REMOTE_CACHE_MODE=read or no signing key. "
            "Fix: run `jitops cache keygen` here (or set JITOPS_REMOTE_SIGNING_KEY) in write mode"
        )
    from .origin import installed_from

    resign = set(getattr(args, "resign_foreign", None) or ())
    pushed = missing = foreign = 0
    for plan in _plans(
        list(dict.fromkeys([*args.ops, *resign])) if args.ops else args.ops, args.device, settings
    ):
        try:
            local = plan.cache.verify(plan.entry, plan.key, plan.spec.name, plan.target.name)
        except EntryProblem:
            missing += 1
            print(f"skipped {plan.what}: no sound local entry (run `jitops warm` first)")
            continue
        # its name in the store says which inputs it was built from: those held here now
        if (why := plan.cache.stale(plan.entry, local, plan.spec.root)) is not None:
            missing += 1
            print(f"skipped {plan.what}: {why} (run `jitops warm` first)")
            continue
        source = installed_from(plan.cache, plan.address)
        # signing it would vouch for what this node never built
        if source is not None and plan.spec.name not in resign:
            foreign += 1
            print(
                f"skipped {plan.what}: {_origin_text(source)}, not built here; jitops never re-signs foreign code "
                f"unasked (build it on a node you trust, or pass --resign-foreign {plan.spec.name} to vouch for it)"
            )
            continue
        if source is not None:
            print(
                f"re-signing foreign code: {plan.what} is {_origin_text(source)}; your key now vouches for it"
            )
        if tier.upload(plan, plan.cache):
            pushed += 1
            print(f"pushed  {plan.what} ({plan.key[:12]})")
    print(
        f"push: {pushed} uploaded to {tier.settings.url}, {missing} not built here, {foreign} not built here "
        "(imported, pulled or from a job's store)"
    )
    return 0


def _origin_text(source: tuple[str, str]) -> str:
    kind, where = source
    return {
        "imported": f"imported from {where}",
        "pulled": f"pulled from {where}",
        "job-store": f"installed from the job's store {where}",
    }.get(kind, f"of unknown origin: {where}")


def cmd_pull(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if settings.offline:  # checked before the store is contacted
        raise ConfigError(
            "`jitops cache pull` publishes downloaded entries into the local cache, and JITOPS_OFFLINE=1 "
            "forbids writing it. Fix: run the pull without JITOPS_OFFLINE (e.g. in the step that "
            "prepares the node), then set it for the job"
        )
    tier = _tier(settings)
    counts = {"fetched": 0, "present": 0, "absent": 0}
    for plan in _plans(args.ops, args.device, settings):
        try:
            plan.cache.verify(plan.entry, plan.key, plan.spec.name, plan.target.name)
            counts["present"] += 1
            continue
        except EntryProblem:
            pass
        plan.cache.ensure_base()
        state = "fetched" if tier.fetch(plan, plan.cache) is not None else "absent"
        counts[state] += 1
        print(f"{state:<8} {plan.what}")
    rejected = tier.stats.rejected
    print(
        f"pull: {counts['fetched']} fetched, {counts['present']} already here, {counts['absent']} not in the "
        f"store, {rejected} rejected"
    )
    return 1 if rejected else 0


def cmd_ls_remote(settings: Settings) -> int:
    tier = _tier(settings)
    from .store import clean_text

    names = tier.store.list_blobs("entries/")
    entries = [
        parts[1:] for parts in (n.split("/") for n in names) if len(parts) == 4 and all(parts)
    ]
    for lib, target, key in entries:  # store text: shown cleaned
        key, _, held = key.partition(".")  # an entry for another set of inputs (tier.entry_name)
        inputs = f"  inputs {clean_text(held, 12)}" if held else ""
        print(
            f"{clean_text(lib, 64):<14} {clean_text(target, 64):<18} {clean_text(key, 12)}{inputs}"
        )
    stray = len(names) - len(entries)
    print(
        f"{len(entries)} entries in {tier.settings.url}"
        + (
            f"; {stray} other keys under entries/ skipped "
            "(not entries/<library>/<target>/<key>: not written by jitops)"
            if stray
            else ""
        )
    )
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from .stats import read_totals

    root = Settings.from_env().cache_root()
    totals = read_totals(Cache(root).remote_stats)
    print(f"remote cache, summed over the processes that used {root}: {totals.summary()}")
    return 0


def push_warmed(ops: Sequence[str], devices: Sequence[str] | None) -> int:
    """``jitops warm --push``: upload what was just warmed."""
    ns = argparse.Namespace(ops=list(ops), device=list(devices) if devices else None)
    return cmd_push(ns)


BURST = 16  # nodes polling at once, as in the bound (benchmarks/cluster.py)
AIM = 3.0  # seconds: every node should have an op within its build time plus this


def polling(store: Any, first: float) -> tuple[str, str, str, str]:
    """doctor's row on what waiting costs with this store, measured: one poll's round trip, and BURST at once.

    Around one build a node pays its first contact, about four round trips to look for the entry and the
    lease, then after the build at most POLL_MAX s of backoff and two round trips to see it. When the store
    answers concurrent requests one after another (moto's server), each round trip costs the burst's time.
    """
    from concurrent.futures import ThreadPoolExecutor

    from .tier import POLL_MAX

    name = f"probe/absent-{secrets.token_hex(6)}"
    times = []
    for _ in range(5):
        t0 = time.monotonic()
        store.get_blob(name)
        times.append(time.monotonic() - t0)
    rtt = statistics.median(times)
    with ThreadPoolExecutor(BURST) as pool:
        t0 = time.monotonic()
        list(pool.map(lambda _: store.get_blob(name), range(BURST)))
        burst = time.monotonic() - t0
    late = first + 6 * burst + POLL_MAX
    detail = (
        f"a poll's round trip takes {1000 * rtt:.2f} ms (median of 5), {BURST} at once {1000 * burst:.0f} ms: "
        f"with {BURST} nodes waiting, every node has an op about {late:.1f} s after its build "
        f"(first contact {1000 * first:.0f} ms + 6 round trips + polls {POLL_MAX:g} s apart)"
    )
    if late <= AIM:
        return ("polling", "ok", detail + f", within the {AIM:g} s jitops aims for", "")
    why = (
        "the store answers concurrent requests one after another"
        if burst > 4 * rtt
        else "the store's round trip is long"
    )
    return (
        "polling",
        "warn",
        f"{detail}: over the {AIM:g} s jitops aims for, because {why}",
        "use a store that serves concurrent requests in parallel and close to the nodes (Redis, S3; moto's "
        "server is for tests); nodes still build each op once",
    )


def doctor_checks(remote: Settings) -> list[tuple[str, str, str, str]]:
    """(name, status, detail, fix) rows for ``jitops doctor`` when JITOPS_REMOTE_CACHE is set."""
    settings = remote.remote
    if settings is None:
        return []
    from .backends import open_store
    from .signing import load_signer, load_trust
    from .store import Holder, StoreError

    rows = []
    try:
        store = open_store(settings)
        t0 = time.monotonic()
        store.ping()
        first = time.monotonic() - t0
        rows.append(("remote", "ok", f"{settings.url} answers in {1000 * first:.1f} ms", ""))
        rows.append(polling(store, first))
    except StoreError as e:
        return [
            (
                "remote",
                "warn",
                f"{settings.url} is unreachable: {e}",
                "start the store or fix JITOPS_REMOTE_CACHE; jitops builds locally meanwhile",
            )
        ]
    trust = load_trust(settings)
    rows.append(
        (
            "trust",
            "ok" if trust.keys else "warn",
            f"{len(trust.keys)} trusted key(s): " + ("; ".join(trust.sources) or "none"),
            ""
            if trust.keys
            else "set JITOPS_REMOTE_TRUSTED_KEYS to the uploaders' public keys (every download is rejected without)",
        )
    )
    if settings.mode != "read":
        signer, why = load_signer(settings)
        try:
            me = Holder.me()
            store.put_blob(f"probe/{me.host}", me.to_bytes())
            can = store.get_blob(f"probe/{me.host}") == me.to_bytes()
        except StoreError as e:
            can, why = False, str(e)
        if signer is None or not can:
            rows.append(("upload", "warn", f"this node cannot upload: {why}", "see the message"))
        else:
            rows.append(
                ("upload", "ok", f"writes to the store, signed by {signer.fingerprint}", "")
            )
    else:
        rows.append(
            ("upload", "info", "JITOPS_REMOTE_CACHE_MODE=read: this node only downloads", "")
        )
    # object stores: does create-if-absent hold?
    check_exclusive = getattr(store, "check_exclusive", None)
    if check_exclusive is not None:
        try:
            exclusive = check_exclusive()
        except StoreError as e:
            exclusive, why = False, str(e)
        rows.append(
            ("leases", "ok", "conditional create works: one node builds each key", "")
            if exclusive
            else (
                "leases",
                "warn",
                "this store ignores conditional create (If-None-Match), so leases are not "
                "exclusive: two nodes may build one key (what they publish stays correct)",
                "use an S3 service with conditional writes, Redis, or a shared file:// directory",
            )
        )
    store.close()
    return rows
