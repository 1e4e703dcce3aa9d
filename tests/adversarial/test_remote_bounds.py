"""Issue 28, item 4: every wait and every read of the remote tier is bounded by a wall clock.

Audit 2026-11-24 defects 5 (a lease without or with an absurd expiry; a store that drips
bytes), 7 (a failure record that never lapses; store text with escape sequences), 11 (raw
errors from environment values), 13 (leases judged by the reader's ttl) and from 16
(`cache ls --remote` on a stray key; negative JITOPS_LOCK_TIMEOUT). Each case is a real store
on 127.0.0.1 (redis-server, moto's S3 server, a shared dir, a TCPStore) and real node
processes with the fake builder; forged values are written the way any store client could.
Every test carries a timeout small enough that a regression to an unbounded wait fails fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO, child_env, last_json, run_scenario_proc
from tests.remote_helpers import keygen, moto_s3, node_env, redis_server

pytestmark = [pytest.mark.process]

ESC = "\x1b[2J\x1b[31mPWNED\x1b]0;title\x07\u202e"


# ---------------------------------------------------------- scenarios (run in a node's own process)


def _plan_and_store() -> tuple[Any, Any]:
    from jitops.store.cache import Cache
    from jitops.plan import make_plan
    from jitops.remote.backends import open_store
    from jitops.base.settings import Settings
    from tests import fakelib

    s = Settings.from_env()
    plan = make_plan(fakelib.FAKEADD, "cpu", settings=s, cache=Cache(s.cache_root()))
    if s.remote is None:  # the job's store
        from jitops.remote.c10d_store import C10dStore

        d = s.distributed
        assert d is not None and d.master_addr and d.master_port
        return plan, C10dStore.connect(d.master_addr, d.master_port, 5, 5)
    return plan, open_store(s.remote)


def forge_then_get(what: str, kind: str, age: float = 0.0, message: str = "") -> dict[str, Any]:
    """Write a forged lease or failure record for fakeadd's key into the store, then get fakeadd: what happened."""
    import warnings

    from tests import scenarios as S

    plan, store = _plan_and_store()
    holder = {"host": "evil" + ESC, "pid": 4242, "since": time.time(), "token": "f" * 16}
    lease = f"leases/{plan.spec.name}/{plan.key}"
    # compare_set, as a holder takes it; never renewed
    if what.startswith("lease") and kind == "c10d":
        rec = {**holder, "ttl": 1e300} if what == "lease-absurd-ttl" else holder
        store._cas(lease, b"", json.dumps(rec).encode() + b"\n0")
    # redis: SET without PX; file: a lease touched in 2100; s3: expires 1e300
    elif what == "lease-no-expiry":
        if kind == "redis":
            store.put_blob(lease, json.dumps(holder).encode())
        elif kind == "file":
            path = store._lease_path(lease)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(json.dumps(holder).encode())
            os.utime(path, (4102444800, 4102444800))  # 2100-01-01
        else:
            store.put_blob(
                f"leases/{lease}/0", json.dumps({"holder": holder, "expires": 1e300}).encode()
            )
    elif what == "lease-absurd-ttl":  # states a ttl of 1e300 and the matching expiry
        rec = {**holder, "ttl": 1e300, "expires": 1e300}
        if kind == "s3":
            store.put_blob(
                f"leases/{lease}/0", json.dumps({"holder": rec, "expires": 1e300}).encode()
            )
        elif kind == "file":
            path = store._lease_path(lease)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(json.dumps(rec).encode())
            os.utime(path, (4102444800, 4102444800))
        else:
            store.put_blob(lease, json.dumps(rec).encode())
    # a failure record with no expiry (redis) or one in 1e300 (file, s3), dated `age` seconds ago
    else:
        body = json.dumps(
            {"host": "evil" + ESC, "pid": 4242, "at": time.time() - age, "message": message}
        ).encode()
        name = f"failures/{plan.spec.name}/{plan.target.name}/{plan.key}"
        if kind == "redis":
            store.put_blob(name, body)
        elif kind == "c10d":
            store._s.set(f"jitops/v1/records/{name}", b"1e300\n" + body)
        elif kind == "file":
            import base64

            store.put_blob(
                name,
                json.dumps({"expires": 1e300, "data": base64.b64encode(body).decode()}).encode(),
            )
        else:
            store.put_blob(name, json.dumps({"expires": 1e300, "data": body.decode()}).encode())
    store.close()
    t0 = time.monotonic()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            got: dict[str, Any] = S.get_and_check("fakeadd")
        except Exception as e:  # noqa: BLE001 - the test reads it
            got = {"error": type(e).__name__, "msg": str(e)}
    got["seconds"] = time.monotonic() - t0
    got["warnings"] = [str(w.message) for w in caught]
    return got


def get_with_wait_default(seconds: float) -> dict[str, Any]:
    """get_node with the tier's default wait bound (30 min) shortened to ``seconds``, to see what follows it."""
    from jitops.remote import tier
    from tests import remote_scenarios

    tier.WAIT_DEFAULT = seconds
    t0 = time.monotonic()
    out = remote_scenarios.get_node(["fakeadd"])
    out["seconds"] = time.monotonic() - t0
    return out


# ------------------------------------------------------------------ helpers


@contextlib.contextmanager
def store(kind: str, tmp: Path) -> Iterator[tuple[str, dict[str, str | None]]]:
    """A fresh store: (URL, the variables that reach it)."""
    if kind == "redis":
        with redis_server(tmp) as (url, _):
            yield url, {}
    elif kind == "c10d":  # the job's store: a TCPStore server here, the node a rank of a 2-rank job
        import torch.distributed as dist

        server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        yield (
            "unused",
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(server.port),
                "WORLD_SIZE": "2",
                "JITOPS_REMOTE_CACHE": None,
            },
        )  # type: ignore[dict-item]
        del server
    elif kind == "s3":
        with moto_s3(tmp) as (url, env):
            yield url, env
    else:
        (tmp / "shared").mkdir()
        yield f"file://{tmp / 'shared'}", {}


def node(
    tmp: Path,
    name: str,
    url: str,
    extra: dict[str, str | None],
    scenario: str = "remote_scenarios.get_node",
    timeout: float = 60,
    **kwargs: Any,
) -> dict[str, Any]:
    cfg = tmp / "cfg"
    if not cfg.exists():
        keygen(cfg)
    env = node_env(tmp / name, url, cfg, **extra)
    args = {"ops": ["fakeadd"]} if scenario.endswith("get_node") else kwargs
    return last_json(run_scenario_proc(scenario, env=env, timeout=timeout, **args).stdout)


BACKENDS = ["redis", "file", "s3", "c10d"]


# --------------------------------------------------------- 5(a): leases without a believable expiry


@pytest.mark.timeout(90)
@pytest.mark.parametrize("what", ["lease-no-expiry", "lease-absurd-ttl"])
@pytest.mark.parametrize("kind", BACKENDS)
def test_forged_endless_lease_is_taken_over(tmp_path: Path, kind: str, what: str) -> None:
    """A lease that never expires (no PX, an mtime in 2100, expires 1e300, a stated ttl of 1e300) is judged
    lapsed after the holder's stated ttl capped at 4x the reader's own (here 1 s): the node builds."""
    with store(kind, tmp_path) as (url, env):
        out = node(
            tmp_path,
            "b",
            url,
            {**env, "JITOPS_REMOTE_LEASE_SECONDS": "1"},
            scenario="adversarial.test_remote_bounds.forge_then_get",
            what=what,
            kind=kind,
        )
    assert out.get("built") and out["works"], out
    # 1 s (no stated ttl) or 4 s (capped) of observation, plus polls
    assert out["seconds"] < 20, out
    assert not any("\x1b" in w for w in out["warnings"]), out["warnings"]


@pytest.mark.timeout(120)
def test_endless_lease_is_bounded_under_default_settings(tmp_path: Path) -> None:
    """The audit's case with nothing set: a file lease touched in 2100, no stated ttl. The reader believes
    it for its own 30 s (JITOPS_REMOTE_LEASE_SECONDS' default), then builds; on 309e589 it waited forever."""
    with store("file", tmp_path) as (url, env):
        out = node(
            tmp_path,
            "b",
            url,
            env,
            scenario="adversarial.test_remote_bounds.forge_then_get",
            what="lease-no-expiry",
            kind="file",
            timeout=100,
        )
    assert out.get("built") and out["works"], out
    assert 25 < out["seconds"] < 75, out


@pytest.mark.timeout(120)
def test_live_lease_is_waited_for_a_bounded_time_then_the_node_builds(tmp_path: Path) -> None:
    """A holder that keeps renewing (a build that hangs) is waited for at most the tier's default bound
    (30 min; 3 s here), then the node builds itself with a warning naming the holder and the fix.
    On 309e589 a node without JITOPS_LOCK_TIMEOUT waited for as long as the holder renewed."""
    from tests.helpers import scenario_argv

    keygen(tmp_path / "cfg")
    (tmp_path / "shared").mkdir()
    url = f"file://{tmp_path / 'shared'}"
    a = subprocess.Popen(
        scenario_argv("remote_scenarios.get_node", ops=["fakeadd"]),
        cwd=REPO,
        text=True,
        env=node_env(
            tmp_path / "a",
            url,
            tmp_path / "cfg",
            JITOPS_REMOTE_LEASE_SECONDS="3",
            JITOPS_FAKE_BUILD_SECONDS="40",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(
            lambda: any(p.name.endswith(".lease") for p in (tmp_path / "shared").rglob("*")),
            "node a's lease",
        )
        b = run_scenario_proc(
            "adversarial.test_remote_bounds.get_with_wait_default",
            seconds=3,
            timeout=60,
            env=node_env(tmp_path / "b", url, tmp_path / "cfg", JITOPS_REMOTE_LEASE_SECONDS="3"),
        )
    finally:
        a.kill()
        a.communicate(timeout=30)
    out = last_json(b.stdout)
    assert out["ops"]["fakeadd"]["built"] and out["ops"]["fakeadd"]["works"], b.stderr[-3000:]
    assert out["seconds"] < 25, out  # 3 s, plus start-up; the holder's build needs 40
    assert "building it here" in b.stderr and "JITOPS_LOCK_TIMEOUT" in b.stderr, b.stderr[-3000:]


# ---------------------------------------------------- 13: the holder's stated ttl, not the reader's


def _wait_for(cond: Any, what: str, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, f"{what} did not happen within {limit}s"
        time.sleep(0.1)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["file", "c10d"])
def test_reader_with_a_shorter_lease_setting_does_not_take_a_live_lease(
    tmp_path: Path, kind: str
) -> None:
    """Holder: lease 20 s (renewed every 6.7 s) and a 30 s build. Reader: lease 3 s (so it believes up to
    12 s unrenewed). One build, the reader fetches it; on 309e589 the reader judged the lease by its own 3 s
    and built too (file, job store)."""
    keygen(tmp_path / "cfg")
    server = None
    if kind == "file":
        (tmp_path / "shared").mkdir()
        url, base = f"file://{tmp_path / 'shared'}", {}

        def leased() -> bool:
            return any(p.name.endswith(".lease") for p in (tmp_path / "shared").rglob("*"))
    else:
        import torch.distributed as dist

        server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        url, base = (
            "",
            {
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(server.port),
                "WORLD_SIZE": "2",
                "JITOPS_REMOTE_CACHE": None,
            },
        )

        def leased() -> bool:
            return any("/leases/" in k and server.get(k) for k in server.list_keys())  # type: ignore[union-attr]

    def env(name: str, lease: str, **more: str) -> dict[str, str]:
        e = node_env(
            tmp_path / name,
            url or "unused",
            tmp_path / "cfg",
            JITOPS_REMOTE_LEASE_SECONDS=lease,
            **more,
        )
        for k, v in base.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
        return e

    from tests.helpers import scenario_argv

    a = subprocess.Popen(
        scenario_argv("remote_scenarios.get_node", ops=["fakeadd"]),
        cwd=REPO,
        text=True,
        env=env("a", "20", JITOPS_FAKE_BUILD_SECONDS="30"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(leased, "node a's lease")
        t0 = time.monotonic()
        b = run_scenario_proc(
            "remote_scenarios.get_node", env=env("b", "3"), ops=["fakeadd"], timeout=100
        )
        b_seconds = time.monotonic() - t0
        a_out, a_err = a.communicate(timeout=100)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait(timeout=10)
    ra, rb = last_json(a_out)["ops"]["fakeadd"], last_json(b.stdout)["ops"]["fakeadd"]
    assert ra["built"] and ra["works"], a_err
    assert not rb["built"] and rb["works"], (
        f"the reader built a key whose lease was live\n{b.stderr[-3000:]}"
    )
    assert ra["sha256"] == rb["sha256"]
    assert b_seconds < 60, b_seconds


# -------------------------------------------------------------- 5(b): a store that drips its answer


class DripProxy:
    """Forwards 127.0.0.1:<port> to a real server; a reply chunk of ``big`` bytes or more is sent on at 2 B/s.

    Bounded: each drip stops after ``limit`` seconds or when either side closes; ``close`` stops everything.
    """

    def __init__(self, target_port: int, big: int = 2048, limit: float = 120) -> None:
        self.target, self.big, self.limit = target_port, big, limit
        self.drips = 0
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        self.srv.settimeout(0.1)
        while not self._stop.is_set():
            try:
                client = self.srv.accept()[0]
            except OSError:
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self._socks += [client, upstream]
            for a, b, down in ((client, upstream, False), (upstream, client, True)):
                t = threading.Thread(target=self._pump, args=(a, b, down), daemon=True)
                self._threads.append(t)
                t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, down: bool) -> None:
        with contextlib.suppress(OSError):
            while not self._stop.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if not (down and len(data) >= self.big):
                    dst.sendall(data)
                    continue
                self.drips += 1
                end = time.monotonic() + self.limit
                for i in range(0, len(data), 1):  # 2 bytes a second
                    if self._stop.is_set() or time.monotonic() > end:
                        break
                    dst.sendall(data[i : i + 1])
                    self._stop.wait(0.5)
                break
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        for s in self._socks:
            s.close()
        self.srv.close()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind", ["redis", "s3"])
def test_dripping_store_fails_open_within_the_operation_timeout(tmp_path: Path, kind: str) -> None:
    """Node a uploads fakeadd; node b reads it through a proxy that drips the blob at 2 B/s (about 30 min
    for the entry). With JITOPS_REMOTE_TIMEOUT=3 the download gives up at 3 s, the tier switches off and
    b builds locally. On 309e589 the timeout applied to each socket read and b hung."""
    with store(kind, tmp_path) as (url, env):
        port = (
            int(url.split(":")[2].split("/")[0])
            if kind == "redis"
            else int(env["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
        )
        a = node(tmp_path, "a", url, env)
        assert a["ops"]["fakeadd"]["built"] and a["stats"]["uploads"] == 1, a
        proxy = DripProxy(port)
        try:
            if kind == "redis":
                via, venv = f"redis://127.0.0.1:{proxy.port}/0", env
            else:
                via, venv = url, {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}
            t0 = time.monotonic()
            b = node(tmp_path, "b", via, {**venv, "JITOPS_REMOTE_TIMEOUT": "3"}, timeout=120)
            elapsed = time.monotonic() - t0
        finally:
            proxy.close()
    assert proxy.drips >= 1, "the proxy dripped the blob"
    assert b["ops"]["fakeadd"]["built"] and b["ops"]["fakeadd"]["works"], b
    assert b["stats"]["timeouts"] == 1 and b["stats"]["hits"] == 0, b["stats"]
    # the 3 s deadline (plus the ping), not the blob's 26 min
    assert b["stats"]["seconds"] < 8, b["stats"]
    assert elapsed < 60, elapsed
    assert any("more than 3s" in w for w in b["warnings"]), b["warnings"]


# ------------------------------------------------------------------ 7: failure records


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", BACKENDS)
def test_failure_record_without_expiry_lapses_by_the_readers_setting(
    tmp_path: Path, kind: str
) -> None:
    """A failure record that never expires, dated 10 006 s ago: older than the reader's
    JITOPS_REMOTE_FAILURE_SECONDS (300), so it no longer stops the build. On 309e589: BuildError forever."""
    with store(kind, tmp_path) as (url, env):
        out = node(
            tmp_path,
            "b",
            url,
            env,
            scenario="adversarial.test_remote_bounds.forge_then_get",
            what="failure",
            kind=kind,
            age=10006,
            message="old news",
        )
    assert out.get("built") and out["works"], out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", BACKENDS)
def test_fresh_failure_record_is_shown_truthfully_and_cleaned(tmp_path: Path, kind: str) -> None:
    """A fresh failure record still fails the node at once, but its forged text is shown without escape
    sequences or bidi controls, and the message says when this node retries by its own setting."""
    with store(kind, tmp_path) as (url, env):
        out = node(
            tmp_path,
            "b",
            url,
            {**env, "JITOPS_REMOTE_FAILURE_SECONDS": "120"},
            scenario="adversarial.test_remote_bounds.forge_then_get",
            what="failure",
            kind=kind,
            age=20,
            message="compile error" + ESC + "\nline two",
        )
    assert out.get("error") == "BuildError", out
    msg = out["msg"]
    assert "PWNED" in msg and "line two" in msg and "evil" in msg
    assert not any(c in msg for c in "\x1b\x07\u202e"), repr(msg)
    import re

    age, left = int(re.search(r"(\d+)s ago", msg)[1]), int(re.search(r"lapses, in (\d+)s", msg)[1])  # type: ignore[index]
    assert 20 <= age < 50 and 119 <= age + left <= 121, msg  # dated 20 s ago, by this node's 120 s
    assert "JITOPS_REMOTE_FAILURE_SECONDS=120" in msg, msg


# ------------------------------------------------------------------ 11, 16: settings and raw errors

SECONDS_VARS = [
    "JITOPS_REMOTE_CONNECT_TIMEOUT",
    "JITOPS_REMOTE_TIMEOUT",
    "JITOPS_REMOTE_LEASE_SECONDS",
    "JITOPS_REMOTE_FAILURE_SECONDS",
    "JITOPS_LOCK_TIMEOUT",
]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("value", ["inf", "-inf", "1e300", "-1", "-0.5", "nan", "1e6"])
@pytest.mark.parametrize("var", SECONDS_VARS)
def test_seconds_settings_are_finite_and_bounded(var: str, value: str) -> None:
    from jitops.errors import ConfigError
    from jitops.base.settings import Settings

    env = {"JITOPS_REMOTE_CACHE": "file:///nowhere", var: value}
    with pytest.raises(ConfigError) as e:
        Settings.from_env(env)
    msg = str(e.value)
    assert var in msg and repr(value) in msg and "86400" in msg and "Fix:" in msg, msg
    if var != "JITOPS_LOCK_TIMEOUT":
        with pytest.raises(ConfigError, match=var):  # the job store's copy of the same settings
            Settings.from_env(
                {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "2", var: value}
            )


@pytest.mark.timeout(20)
def test_sane_seconds_still_parse() -> None:
    from jitops.base.settings import Settings

    s = Settings.from_env(
        {
            "JITOPS_REMOTE_CACHE": "file:///x",
            "JITOPS_REMOTE_TIMEOUT": "2.5",
            "JITOPS_LOCK_TIMEOUT": "0",
            "JITOPS_REMOTE_FAILURE_SECONDS": "86400",
        }
    )
    assert s.remote is not None and s.remote.op_timeout == 2.5 and s.remote.failure_seconds == 86400
    assert s.lock_timeout == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("port", ["70000", "0", "-5", "99999999999999999999"])
def test_master_port_out_of_range_is_no_job_store(tmp_path: Path, port: str) -> None:
    """MASTER_PORT that is no TCP port: not a job (like non-numeric junk); the op builds locally.
    On 309e589 70000 reached TCPStore and raised pybind11's raw TypeError."""
    from jitops.base.settings import Settings

    d = Settings.from_env(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
    ).distributed
    assert d is not None and d.master_port is None and not d.in_job()
    if port == "70000":
        env = child_env(
            JITOPS_CACHE_DIR=str(tmp_path / "c"),
            JITOPS_BUILDER="fake",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            WORLD_SIZE="2",
            RANK="1",
            JITOPS_REMOTE_CACHE=None,
        )
        out = last_json(
            run_scenario_proc(
                "remote_scenarios.get_node", env=env, ops=["fakeadd"], timeout=50
            ).stdout
        )
        assert out.get("ops", {}).get("fakeadd", {}).get("works"), out


@pytest.mark.timeout(30)
def test_c10d_connect_to_an_impossible_port_is_a_store_error() -> None:
    pytest.importorskip("torch.distributed")
    from jitops.remote.c10d_store import C10dStore
    from jitops.remote.store import StoreError

    with pytest.raises(StoreError, match="70000"):
        C10dStore.connect("127.0.0.1", 70000, 1, 1)


@pytest.mark.timeout(60)
def test_exit_while_daemon_threads_poll_the_job_store_is_clean() -> None:
    pytest.importorskip("torch.distributed")
    for _ in range(3):  # without the store's exit gate, each run aborted (SIGABRT)
        proc = run_scenario_proc(
            "remote_scenarios.poll_job_store_then_exit", threads=3, timeout=40, check=False
        )
        assert proc.returncode == 0 and "terminate called" not in proc.stderr, (
            proc.returncode,
            proc.stderr[-2000:],
        )
        polls = last_json(proc.stdout)["polls"]
        assert len(polls) == 3 and all(n > 0 for n in polls), polls  # each was polling


@pytest.mark.timeout(30)
def test_the_exit_gate_lets_calls_under_way_finish_and_refuses_new_ones() -> None:
    from jitops.remote.c10d_store import _Gate
    from jitops.remote.store import StoreError

    gate, inside = _Gate(), threading.Event()

    def slow_call(seconds: float) -> None:
        with gate.call("a slow call"):
            inside.set()
            time.sleep(seconds)

    t = threading.Thread(target=slow_call, args=(0.3,))
    t.start()
    assert inside.wait(10)
    began = time.monotonic()
    assert gate.close(wait=10) is True  # waited for the call under way
    assert time.monotonic() - began > 0.2
    t.join()
    with pytest.raises(StoreError, match="this process is exiting"), gate.call("a late call"):
        pass
    gate.reopen()  # a forked child's gate: open, nothing under way
    inside.clear()
    t = threading.Thread(target=slow_call, args=(2.0,))
    t.start()
    assert inside.wait(10)
    began = time.monotonic()
    assert gate.close(wait=0.2) is False  # bounded: gives up on a call that outlasts the wait
    assert time.monotonic() - began < 1.5
    t.join()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("url", ["zip://x", "tar://x", "reference://x"])
def test_archive_and_wrapper_urls_are_named_store_errors(url: str) -> None:
    from jitops.remote.backends import open_store
    from jitops.remote.store import StoreError
    from jitops.base.settings import remote_settings

    settings = remote_settings({"JITOPS_REMOTE_CACHE": url})
    assert settings is not None
    with pytest.raises(StoreError, match="Fix:"):
        open_store(settings).ping()


@pytest.mark.timeout(60)
def test_zip_url_fails_open_in_a_node(tmp_path: Path) -> None:
    out = node(tmp_path, "b", "zip://x", {})
    assert out.get("ops", {}).get("fakeadd", {}).get("built"), out
    assert any("zip://x" in w and "Fix:" in w for w in out["warnings"]), out["warnings"]


@pytest.mark.timeout(20)
@pytest.mark.parametrize("what", ["binary", "/dev/zero", "huge"])
def test_trusted_keys_file_is_read_bounded(tmp_path: Path, what: str) -> None:
    """A binary file, /dev/zero or a 2 MiB file as JITOPS_REMOTE_TRUSTED_KEYS: a prompt ConfigError naming it.
    On 309e589: UnicodeDecodeError, or MemoryError after about 29 s for /dev/zero."""
    from jitops.errors import ConfigError
    from jitops.remote.signing import load_trust
    from jitops.base.settings import remote_settings

    path = tmp_path / "keys"
    if what == "binary":
        path.write_bytes(bytes(range(128, 256)) * 8)
    elif what == "huge":
        path.write_bytes(b"# comment\n" * 210_000)
    else:
        path = Path("/dev/zero")
    settings = remote_settings(
        {
            "JITOPS_REMOTE_CACHE": "file:///x",
            "JITOPS_REMOTE_TRUSTED_KEYS": str(path),
            "JITOPS_CONFIG_DIR": str(tmp_path / "cfg"),
        }
    )
    assert settings is not None
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="JITOPS_REMOTE_TRUSTED_KEYS") as e:
        load_trust(settings)
    assert str(path) in str(e.value) and "Fix:" in str(e.value)
    assert time.monotonic() - t0 < 5


@pytest.mark.timeout(60)
def test_ls_remote_skips_and_counts_stray_keys(tmp_path: Path) -> None:
    """`jitops cache ls --remote` with a stray key under entries/ (and one with escape sequences in its name):
    lists the entry, counts the others, exit 0. On 309e589: `error: not enough values to unpack`."""
    with store("file", tmp_path) as (url, env):
        a = node(tmp_path, "a", url, env)
        assert a["stats"]["uploads"] == 1, a
        entries = tmp_path / "shared" / "v1" / "entries"
        (entries / "stray").write_bytes(b"junk")
        (entries / "fakeadd" / ("x" + ESC)).mkdir()
        (entries / "fakeadd" / ("x" + ESC) / "k").write_bytes(b"junk")
        (entries / "a" / "b" / "c").mkdir(parents=True)
        (entries / "a" / "b" / "c" / "d").write_bytes(b"too deep")
        proc = subprocess.run(
            [sys.executable, "-m", "jitops", "cache", "ls", "--remote"],
            cwd=REPO,
            text=True,
            capture_output=True,
            timeout=50,
            env=node_env(tmp_path / "a", url, tmp_path / "cfg", JITOPS_REMOTE_CACHE_MODE="read"),
        )
    assert proc.returncode == 0, proc.stderr
    assert "2 entries in" in proc.stdout and "2 other keys under entries/ skipped" in proc.stdout, (
        proc.stdout
    )
    assert proc.stdout.startswith("fakeadd ") and "\x1b" not in proc.stdout, proc.stdout
