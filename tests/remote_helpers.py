"""Real stores for the remote-tier tests, started and stopped by the tests on loopback.

- :func:`redis_server`: Debian's ``redis-server`` on a free loopback port, no persistence.
- :func:`silent_server`: a listener that accepts connections and never answers.
- :class:`CutProxy`: forwards to a real server and drops the connection halfway
  through the first large transfer in one direction (the server dying mid-upload
  or mid-download, as the client sees it).
- :func:`node_env`: the environment of one simulated node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, child_env, scenario_argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def need_redis() -> str:
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does it)")
    return exe


@contextlib.contextmanager
def redis_server(tmp: Path, *extra: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    exe = need_redis()
    port = free_port()
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            assert proc.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A TCP listener that accepts and then never sends a byte."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"redis://127.0.0.1:{srv.getsockname()[1]}/0"
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()


class CutProxy:
    """Forward 127.0.0.1:<port> to ``target``; cut every connection halfway through the first
    transfer larger than ``big`` bytes in direction ``cut`` ("up": client to server, "down")."""

    def __init__(self, target_port: int, cut: str, big: int = 1500) -> None:
        self.target, self.cut, self.big = target_port, cut, big
        self.cuts = 0
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        self._stop = threading.Event()
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
            for a, b, way in ((client, upstream, "up"), (upstream, client, "down")):
                threading.Thread(
                    target=self._pump, args=(a, b, way, (client, upstream)), daemon=True
                ).start()

    def _pump(
        self,
        src: socket.socket,
        dst: socket.socket,
        way: str,
        both: tuple[socket.socket, socket.socket],
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if way == self.cut and len(data) >= self.big and not self.cuts:
                    dst.sendall(data[: len(data) // 2])
                    self.cuts += 1
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in both:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._stop.set()
        self._threads[0].join()
        self.srv.close()


@contextlib.contextmanager
def moto_s3(tmp: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """moto's standalone S3 server on loopback, with one empty bucket: (URL, the environment to reach it)."""
    pytest.importorskip("s3fs")
    exe = Path(sys.executable).with_name("moto_server")
    if not exe.exists():
        pytest.skip("moto[server] is not installed (it is in the test extra)")
    port = free_port()
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                assert proc.poll() is None, "moto_server exited at start"
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        subprocess.run(
            scenario_argv("scenarios_inert.s3_mkdir", bucket="jitops-test"),
            env={**os.environ, **env},
            check=True,
            timeout=60,
            cwd=REPO,
        )
        yield "s3://jitops-test/cache", env
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)


def keygen(cfg: Path) -> str:
    """A key pair in ``cfg`` (trusted there automatically); its public key text."""
    from jitops.remote.config import RemoteSettings
    from jitops.remote.signing import keygen as _keygen

    settings = RemoteSettings("file:///x", "write", None, None, str(cfg))
    return _keygen(settings)[2]


def node_env(cache: Path, url: str, cfg: Path, **more: str | None) -> dict[str, str]:
    return child_env(
        **{
            "JITOPS_CACHE_DIR": str(cache),
            "JITOPS_REMOTE_CACHE": url,
            "JITOPS_CONFIG_DIR": str(cfg),
            "JITOPS_BUILDER": "fake",
            **more,
        }
    )
