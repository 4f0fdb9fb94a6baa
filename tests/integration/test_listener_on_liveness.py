"""The LISTEN rides on the liveness session (workers/delivery/listener.py): a NOTIFY wakes
the drain loops at once, renewals go on while it listens, and a new session (after a
failure) listens again. No connection of its own: one session fewer per process."""

from __future__ import annotations

import threading
import time

import psycopg
import sqlalchemy as sa

from workers import queue
from workers.core import pg
from workers.delivery.heartbeat import Heartbeat
from workers.delivery.lease import Lease
from workers.delivery.listener import Listener


def _sessions(engine: sa.Engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        return [(r[0], r[1]) for r in conn.execute(sa.text(
            "SELECT application_name, pid FROM pg_stat_activity "
            "WHERE application_name LIKE 'senddock-tests/%' ORDER BY 1"))]


def _notify(url: str) -> float:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("NOTIFY senddock_jobs, 'verification'")
    return time.monotonic()


def test_a_notify_wakes_through_the_liveness_session(engine: sa.Engine, db_url: str) -> None:
    woken = threading.Event()
    stopping = threading.Event()
    heartbeat = Heartbeat(engine, worker_id="w-listen", lease=Lease(30, 5), interval=1,
                          outage=pg.Outage("tests"), process="tests", in_flight=lambda: 0,
                          register=lambda conn: queue.register_worker(
                              conn, worker_id="w-listen", node="tests", hostname="tests",
                              pid=1, threads=1, lease=30))
    heartbeat.start()
    listener = Listener(heartbeat, stopping=stopping, wake=woken.set)
    listener.start()
    try:
        time.sleep(0.3)
        latencies = []
        for _ in range(3):
            woken.clear()
            sent = _notify(db_url)
            assert woken.wait(5), "the NOTIFY did not wake the drain loops"
            latencies.append(time.monotonic() - sent)
            heartbeat.run()  # a renewal on the same session, while it listens
        assert max(latencies) < 0.5, latencies
        names = [name for name, _ in _sessions(engine)]
        assert names == ["senddock-tests/liveness w-listen"], names
        # The session fails; the next renewal opens one that listens again.
        first_pid = _sessions(engine)[0][1]
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": first_pid})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and heartbeat.listening() is not None:
            heartbeat.run()  # finds out, drops it
            time.sleep(0.1)
        heartbeat.run()  # a fresh session
        assert heartbeat.listening() is not None
        assert _sessions(engine)[0][1] != first_pid
        woken.clear()
        _notify(db_url)
        assert woken.wait(5), "the new session does not listen"
    finally:
        stopping.set()
        listener.thread.join(5)
        heartbeat.close()
