"""Slowloris against a real ``senddock web`` (waitress, the same server ``serve`` runs):
connections trickling one header byte every 2 s must not keep anyone else out.
Before the fix, 110 such connections filled waitress's 100 connection slots and
every new request waited until they stopped; waitress's inactivity timeout never fired.

Bounded by counts: the connections trickle in rounds, and the timings are taken after the
rounds that matter have happened. The timing thresholds are generous for a busy machine;
before the fix every GET waited out its whole client timeout."""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from tests.conftest import free_port, settings, wait_for

HEAD = b"GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200


class Trickler:
    """``count`` connections, each sending one more byte of a request head every
    ``every`` seconds, never finishing it. Counts the rounds and the connections the
    server closed."""

    def __init__(self, port: int, count: int, every: float = 2.0) -> None:
        self.socks = []
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(HEAD[:1])
            self.socks.append(sock)
        self.sent = [1] * count
        self.closed: set[int] = set()
        self.rounds = 0
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            for i, sock in enumerate(self.socks):
                if i in self.closed:
                    continue
                try:
                    sock.sendall(HEAD[self.sent[i] % len(HEAD):][:1] or b"a")
                    self.sent[i] += 1
                    sock.setblocking(False)
                    try:
                        if sock.recv(1) == b"":
                            self.closed.add(i)
                    except BlockingIOError:
                        pass
                    finally:
                        sock.setblocking(True)
                except OSError:
                    self.closed.add(i)
            self.rounds += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for sock in self.socks:
            sock.close()


@pytest.fixture()
def web(db_url: str, sink: Any, spawn: Callable[..., Any]) -> Callable[..., int]:
    def start(**overrides: str) -> int:
        port = free_port()
        proc = spawn(["web", "--port", str(port)],
                     settings(db_url, sink.port, WORKERS="0", **overrides))

        def up() -> bool:
            assert proc.popen.poll() is None, proc.output()
            try:
                return requests.get(f"http://127.0.0.1:{port}/healthz",
                                    timeout=5).status_code == 200
            except requests.RequestException:
                return False

        wait_for(up, timeout=60, message="senddock web")
        return port

    return start


@pytest.fixture()
def tricklers() -> Iterator[list[Trickler]]:
    made: list[Trickler] = []
    yield made
    for trickler in made:
        trickler.stop()


def _login_times(port: int, count: int, timeout: float) -> list[float]:
    times = []
    for _ in range(count):
        started = time.monotonic()
        try:
            answer = requests.get(f"http://127.0.0.1:{port}/login", timeout=timeout)
            assert answer.status_code == 200
            times.append(time.monotonic() - started)
        except requests.Timeout:
            times.append(float("inf"))
    return times


@pytest.mark.slow
def test_200_trickling_connections_leave_login_answering(
        web: Callable[..., int], tricklers: list[Trickler]) -> None:
    port = web()
    tricklers.append(Trickler(port, 200))
    trickler = tricklers[0]
    wait_for(lambda: trickler.rounds >= 2, timeout=60, message="two trickle rounds")
    assert not trickler.closed  # all 200 open and trickling (their deadline is 10 s)
    times = _login_times(port, 7, timeout=10)
    assert statistics.median(times) < 1.0, times
    assert max(times) < 5.0, times  # slack for a busy machine; before: every one timed out


@pytest.mark.slow
def test_past_the_connection_limit_slow_heads_are_closed_at_their_deadline(
        web: Callable[..., int], tricklers: list[Trickler]) -> None:
    """More trickling connections than slots: the head deadline frees them, so a new
    client waits at most about that deadline, and the slow connections are closed."""
    port = web(WEB_CONNECTION_LIMIT="40", WEB_HEAD_TIMEOUT="2")
    tricklers.append(Trickler(port, 60, every=0.5))
    trickler = tricklers[0]
    wait_for(lambda: trickler.rounds >= 2, timeout=60, message="two trickle rounds")
    times = _login_times(port, 3, timeout=30)
    assert max(times) < 15.0, times  # 2 s deadline + 1 s sweep, with slack; before: never
    wait_for(lambda: len(trickler.closed) == 60, timeout=60,
             message="every trickling connection closed by the server")
