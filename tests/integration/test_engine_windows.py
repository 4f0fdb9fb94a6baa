"""The duplicate window and liveness under real processes (P2, P3, P4, docs/design.md §16).

- A live worker never has a job taken back: PostgreSQL's table lock held longer than the
  worker timeout mid-drain (what a non-concurrent REINDEX or ALTER does) sends nobody
  twice, with two worker processes draining.
- SIGTERM while the relay is slow (the graceful stop runs out of time with messages in
  flight), then SIGKILL: after a restart every job is terminal.
- The window is one message per thread: when the relay gets a message's final dot, the
  outcome of the message before it on that connection is already committed.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.conftest import Proc, settings, wait_for
from tests.helpers import campaign_status, check_final, make_campaign, start_worker

pytestmark = pytest.mark.slow


def _sent(sink: Any) -> int:
    return len(sink.records())


def test_table_lock_longer_than_worker_timeout_sends_nobody_twice(
        engine: sa.Engine, db_url: str, sink: Any, spawn: Callable[..., Proc]) -> None:
    emails = [f"lock{i}@example.org" for i in range(2500)]
    campaign = make_campaign(engine, emails)
    # Worker timeout 3 s (heartbeat every second): the lock below lasts three timeouts.
    values = settings(db_url, sink.port, WORKER_TIMEOUT="3", HEARTBEAT_INTERVAL="1")
    a = start_worker(spawn, dict(values, NODE="host-a"))
    b = start_worker(spawn, dict(values, NODE="host-b"))
    wait_for(lambda: _sent(sink) >= 300, timeout=60, message="the drain under way")
    with psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://")) as lock:
        lock.execute("LOCK TABLE delivery_jobs IN ACCESS EXCLUSIVE MODE")
        locked_at = _sent(sink)
        time.sleep(9)
        # Every claim, finish, heartbeat and rescue statement waited on the lock meanwhile.
        lock.commit()
    try:
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=120,
                 message="the campaign to finish after the lock")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{a.output()[-4000:]}\n{b.output()[-4000:]}") from None
    assert a.terminate() == 0 and b.terminate() == 0
    received = check_final(engine, sink, campaign, emails)
    twice = sorted(e for e, n in received.items() if n > 1)
    print(f"\nlock held 9 s at {locked_at} sent; recipients sent twice: {len(twice)}")
    assert twice == []
    with engine.connect() as conn:
        multi = conn.execute(sa.text(
            "SELECT count(*) FROM (SELECT job_id FROM job_attempts GROUP BY job_id "
            "HAVING count(*) > 1) x")).scalar_one()
    assert multi == 0
    for proc in (a, b):
        log = proc.output()
        assert not re.search(r"took back [1-9]", log) and "put back" not in log, log[-3000:]
        assert "refused" not in log, log[-3000:]


class TrickleRelay:
    """A real SMTP server on loopback that, while ``slow`` is set, answers the final dot
    with a ``250-`` continuation line every half second and the closing ``250`` only
    when ``slow`` is cleared: a relay slower than any graceful-stop bound whose client
    never hits its socket timeout. It records each message (recipient, Message-ID) when
    the final dot arrives: from then on the relay has it (its own acceptance window)."""

    def __init__(self, check: Callable[[str, str], None] | None = None) -> None:
        self.check = check  # (previous recipient on this connection, this one) at the dot
        self.slow = threading.Event()
        self.received: list[tuple[str, str]] = []
        self.in_data = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True).start()

    def _session(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as rfile:
            conn.sendall(b"220 trickle ESMTP\r\n")
            rcpt = previous = ""
            while not self._stop.is_set():
                line = rfile.readline()
                if not line:
                    return
                verb = line[:4].upper()
                if verb in (b"EHLO", b"HELO"):
                    conn.sendall(b"250-trickle\r\n250 8BITMIME\r\n")
                elif verb == b"RCPT":
                    rcpt = line.decode().split(":", 1)[1].strip().strip("<>")
                    conn.sendall(b"250 ok\r\n")
                elif verb == b"DATA":
                    conn.sendall(b"354 go on\r\n")
                    message_id = ""
                    while (body := rfile.readline()) not in (b".\r\n", b""):
                        if not message_id and body.lower().startswith(b"message-id:"):
                            message_id = body.split(b":", 1)[1].strip().decode()
                    if self.check is not None:
                        self.check(previous, rcpt)
                    previous = rcpt
                    with self._lock:
                        self.received.append((rcpt, message_id))
                        self.in_data += 1
                    while self.slow.is_set() and not self._stop.is_set():
                        conn.sendall(b"250-still working on it\r\n")
                        time.sleep(0.5)
                    with self._lock:
                        self.in_data -= 1
                    conn.sendall(b"250 2.0.0 queued\r\n")
                elif verb == b"QUIT":
                    conn.sendall(b"221 bye\r\n")
                    return
                else:  # MAIL, RSET, NOOP
                    conn.sendall(b"250 ok\r\n")


def test_sigterm_with_a_slow_relay_then_sigkill_leaves_nothing_sending(
        engine: sa.Engine, db_url: str, spawn: Callable[..., Proc]) -> None:
    relay = TrickleRelay()
    relay.slow.set()
    try:
        emails = [f"slow{i}@example.org" for i in range(30)]
        campaign = make_campaign(engine, emails)
        # Two threads; the stop bound is SMTP_TIMEOUT + 10 = 12 s, the relay never ends.
        values = settings(db_url, relay.port, WORKERS="2", CLAIM_BATCH="5",
                          SMTP_TIMEOUT="2", NODE="slow-node")
        worker = start_worker(spawn, values)
        wait_for(lambda: relay.in_data == 2, timeout=30, message="both threads mid-send")
        worker.popen.terminate()
        wait_for(lambda: "stopped after" in worker.output() or worker.popen.poll() is not None,
                 timeout=30, message="the graceful stop to run out of time")
        time.sleep(0.5)
        worker.kill()  # SIGKILL: the threads stuck in the relay never finished
        with engine.connect() as conn:
            stuck = conn.execute(sa.text(
                "SELECT count(*) FROM delivery_jobs WHERE status = 'sending'")).scalar_one()
        assert stuck >= 1, "the test meant to leave messages in flight"
        relay.slow.clear()
        again = start_worker(spawn, values)
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=60,
                 message="every job terminal after the restart")
        assert again.terminate() == 0
        with engine.connect() as conn:
            states = dict(conn.execute(sa.text(
                "SELECT status, count(*) FROM delivery_jobs GROUP BY status")).all())
        assert states == {"sent": 30}
        received = Counter(r for r, _ in relay.received)
        assert set(received) == set(emails)
        # Only the messages in the relay's hands at the kill can arrive twice: <= 1 per thread.
        assert sum(n - 1 for n in received.values()) <= 2
        assert re.search(r"took back [1-9]\d* orphaned", again.output()), again.output()
    finally:
        relay.close()


def test_each_outcome_is_committed_before_the_next_message_reaches_the_relay(
        engine: sa.Engine, db_url: str, spawn: Callable[..., Proc]) -> None:
    """docs/design.md §16: a kill can resend at most one message per thread. So when the relay has a
    message in full (its final dot), the previous message of that connection must no
    longer be `sending` in the database -- its outcome committed, not just sent."""
    unsettled: list[tuple[str, str]] = []
    checked = Counter[str]()
    with psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://"),
                         autocommit=True) as probe:
        probe_lock = threading.Lock()

        def check(previous: str, current: str) -> None:
            if not previous:
                return
            with probe_lock:
                status = probe.execute("SELECT status FROM delivery_jobs WHERE email = %s",
                                       (previous,)).fetchone()
                checked["checked"] += 1
            if status is None or status[0] == "sending":
                unsettled.append((previous, current))

        relay = TrickleRelay(check)
        try:
            emails = [f"window{i}@example.org" for i in range(300)]
            campaign = make_campaign(engine, emails)
            values = settings(db_url, relay.port, WORKERS="3", NODE="window-node")
            worker = start_worker(spawn, values)
            wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=120,
                     message="the campaign to finish")
            assert worker.terminate() == 0
        finally:
            relay.close()
    print(f"\n{checked['checked']} messages checked at the relay's final dot; previous "
          f"outcome not yet committed: {len(unsettled)}")
    assert checked["checked"] >= 250
    assert unsettled == []
