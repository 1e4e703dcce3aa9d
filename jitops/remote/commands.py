"""What the remote-tier commands do: ``cache keygen/push/pull/stats``, ``cache ls --remote``,
``warm --push`` and doctor's remote checks.

Imports ``jitops.store.cache``, ``jitops.errors``, ``jitops.store.manifest``,
``jitops.base.settings``, ``jitops.registry`` and ``jitops.plan`` (plans, lazily) and this package;
argparse only to declare its sub-commands. Each command reads ``Settings`` once and passes it down.
``push``, ``pull`` and ``remote_entries`` do the work and return records (``jitops.cache`` calls
them too); the ``cmd_*`` functions print those and return exit codes, like the rest of the CLI.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Transfer:
    """What ``push`` or ``pull`` did with one op library's entry for one target.

    ``status``: push: ``pushed``, ``missing`` (no sound local entry), ``foreign`` (imported, pulled
    or from a job's store: not re-signed unasked), ``unsent`` (the store took nothing); pull:
    ``fetched``, ``present`` (already here), ``absent`` (not in the store, or refused: counted in
    ``Transferred.rejected``).
    """

    op: str  # the op library
    target: str
    key: str
    status: str
    what: str  # the plan's words for it, as the commands print them
    origin: tuple[str, str] | None = None  # push: (kind, source) of a foreign entry
    detail: str = ""  # push: why a local entry is not sound to send (``missing``), when it has one


@dataclass(frozen=True)
class Transferred:
    """Every ``Transfer`` of one push or pull, the store's URL and (pull) how many entries it
    refused."""

    transfers: tuple[Transfer, ...]
    url: str
    rejected: int = 0

    def count(self, status: str) -> int:
        return sum(t.status == status for t in self.transfers)


def push(
    ops: Sequence[str],
    devices: Sequence[str] | None = None,
    resign_foreign: Sequence[str] = (),
    *,
    settings: Settings | None = None,
    each: Callable[[Transfer], None] | None = None,
) -> Transferred:
    """Sign and upload the sound local entries of ``ops`` (none: every known op) for ``devices``
    (default cpu). An entry this node did not build is sent only when its library is in
    ``resign_foreign``: signing it vouches for code someone else built. ``each`` hears every outcome
    as it happens."""
    settings = Settings.from_env() if settings is None else settings
    tier = _tier(settings)
    if not tier.writes:
        raise ConfigError(
            "this node cannot upload: JITOPS_REMOTE_CACHE_MODE=read or no signing key. "
            "Fix: run `jitops cache keygen` here (or set JITOPS_REMOTE_SIGNING_KEY) in write mode"
        )
    from .origin import installed_from

    resign = set(resign_foreign)
    wanted = list(dict.fromkeys([*ops, *resign])) if ops else list(ops)
    done: list[Transfer] = []
    for plan in _plans(wanted, devices, settings):
        source: tuple[str, str] | None = None
        detail = ""
        try:
            local = plan.cache.verify(plan.entry, plan.key, plan.spec.name, plan.target.name)
        except EntryProblem:
            status = "missing"
        else:
            # its name in the store says which inputs it was built from: those held here now
            stale = plan.cache.stale(plan.entry, local, plan.spec.root)
            source = None if stale is not None else installed_from(plan.cache, plan.address)
            if stale is not None:
                status, detail = "missing", stale
            # signing it would vouch for what this node never built
            elif source is not None and plan.spec.name not in resign:
                status = "foreign"
            else:
                status = "pushed" if tier.upload(plan, plan.cache) else "unsent"
        t = Transfer(plan.spec.name, plan.target.name, plan.key, status, plan.what, source, detail)
        done.append(t)
        if each is not None:
            each(t)
    return Transferred(tuple(done), tier.settings.url)


def cmd_push(args: argparse.Namespace) -> int:
    def said(t: Transfer) -> None:
        if t.status == "missing":
            why = t.detail or "no sound local entry"
            print(f"skipped {t.what}: {why} (run `jitops warm` first)")
        elif t.status == "foreign" and t.origin is not None:
            print(
                f"skipped {t.what}: {_origin_text(t.origin)}, not built here; jitops never "
                "re-signs foreign code unasked (build it on a node you trust, or pass "
                f"--resign-foreign {t.op} to vouch for it)"
            )
        elif t.status == "pushed":
            if t.origin is not None:
                print(
                    f"re-signing foreign code: {t.what} is {_origin_text(t.origin)}; your key now "
                    "vouches for it"
                )
            print(f"pushed  {t.what} ({t.key[:12]})")

    res = push(args.ops, args.device, getattr(args, "resign_foreign", None) or (), each=said)
    print(
        f"push: {res.count('pushed')} uploaded to {res.url}, "
        f"{res.count('missing')} not built here, "
        f"{res.count('foreign')} not built here (imported, pulled or from a job's store)"
    )
    return 0


def _origin_text(source: tuple[str, str]) -> str:
    kind, where = source
    return {
        "imported": f"imported from {where}",
        "pulled": f"pulled from {where}",
        "job-store": f"installed from the job's store {where}",
    }.get(kind, f"of unknown origin: {where}")


def pull(
    ops: Sequence[str],
    devices: Sequence[str] | None = None,
    *,
    settings: Settings | None = None,
    each: Callable[[Transfer], None] | None = None,
) -> Transferred:
    """Fetch the entries of ``ops`` (none: every known op) for ``devices`` (default cpu) that are
    not here yet, each verified and published like an import. ``each`` hears every outcome as it
    happens."""
    settings = Settings.from_env() if settings is None else settings
    if settings.offline:  # checked before the store is contacted
        raise ConfigError(
            "`jitops cache pull` publishes downloaded entries into the local cache, and JITOPS_OFFLINE=1 "
            "forbids writing it. Fix: run the pull without JITOPS_OFFLINE (e.g. in the step that "
            "prepares the node), then set it for the job"
        )
    tier = _tier(settings)
    done: list[Transfer] = []
    for plan in _plans(ops, devices, settings):
        try:
            plan.cache.verify(plan.entry, plan.key, plan.spec.name, plan.target.name)
            status = "present"
        except EntryProblem:
            plan.cache.ensure_base()
            status = "fetched" if tier.fetch(plan, plan.cache) is not None else "absent"
        t = Transfer(plan.spec.name, plan.target.name, plan.key, status, plan.what)
        done.append(t)
        if each is not None:
            each(t)
    return Transferred(tuple(done), tier.settings.url, tier.stats.rejected)


def cmd_pull(args: argparse.Namespace) -> int:
    def said(t: Transfer) -> None:
        if t.status != "present":
            print(f"{t.status:<8} {t.what}")

    res = pull(args.ops, args.device, each=said)
    print(
        f"pull: {res.count('fetched')} fetched, {res.count('present')} already here, "
        f"{res.count('absent')} not in the store, {res.rejected} rejected"
    )
    return 1 if res.rejected else 0


def remote_entries(
    settings: Settings | None = None,
) -> tuple[list[tuple[str, str, str, str]], str, int]:
    """The remote store's entries as (library, target, key, inputs), cleaned for display (store text
    is not trusted; ``inputs``: the name of the set of inputs an entry beside the first was built
    from, else ""), its URL, and how many other names under ``entries/`` were skipped (not written
    by jitops)."""
    tier = _tier(Settings.from_env() if settings is None else settings)
    from .store import clean_text

    names = tier.store.list_blobs("entries/")
    found = [parts[1:] for parts in (n.split("/") for n in names) if len(parts) == 4 and all(parts)]
    entries = []
    for lib, target, name in found:
        key, _, held = name.partition(".")  # an entry for another set of inputs (tier.entry_name)
        entries.append(
            (clean_text(lib, 64), clean_text(target, 64), clean_text(key, 64), clean_text(held, 64))
        )
    return entries, tier.settings.url, len(names) - len(found)


def cmd_ls_remote(settings: Settings) -> int:
    entries, url, stray = remote_entries(settings)
    for lib, target, key, held in entries:
        inputs = f"  inputs {held[:12]}" if held else ""
        print(f"{lib:<14} {target:<18} {key[:12]}{inputs}")
    print(
        f"{len(entries)} entries in {url}"
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
