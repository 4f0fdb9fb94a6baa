"""Delivery promises under faults, with real processes: PostgreSQL restarted mid-drain
(P2, P3, and the web's 503), a relay that answers 421 or refuses our login (P6), and
SIGTERM during a drain (graceful stop)."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
import sqlalchemy as sa

from tests.conftest import Proc, free_port, settings, wait_for
from tests.helpers import (
    attempts_of,
    campaign_status,
    check_final,
    in_flight,
    jobs_by_email,
    make_campaign,
    start_worker,
    suppressed,
)
from webapp import db
from webapp.pgserver import PostgresServer, private_postgres
from webapp.sink import SinkServer
from workers import queue
from workers.core.settings import Config
from workers.delivery.pool import Pool

pytestmark = pytest.mark.slow


# --- PostgreSQL restarted mid-drain ---------------------------------------------------


@pytest.fixture()
def private_pg() -> Iterator[PostgresServer]:
    """A PostgreSQL of this test's own: the machine's shared server is never stopped."""
    with private_postgres() as server:
        yield server


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _login(base: str, email: str, password: str) -> requests.Session:
    session = requests.Session()
    page = session.get(f"{base}/login", timeout=10).text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)[1]  # type: ignore[index]
    r = session.post(f"{base}/login", data={"email": email, "password": password,
                                            "csrf_token": token}, timeout=10)
    assert r.ok and "/login" not in r.url, r.text[:500]
    return session


def test_postgres_restart_mid_drain(private_pg: PostgresServer, tmp_path: Path,
                                   spawn: Callable[..., Proc]) -> None:
    from webapp.domain import users

    with psycopg.connect(private_pg.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE senddock")
    url = private_pg.url("senddock")
    db.upgrade(url)
    engine = db.make_engine(url, pool_size=3)
    sink = SinkServer(record_path=tmp_path / "sink.jsonl", rules={"delay": 0.01})
    sink.start()
    try:
        emails = [f"p{i}@example.org" for i in range(3000)]
        campaign = make_campaign(engine, emails)
        with engine.begin() as conn:
            users.create_user(conn, "ops@example.com", "correct horse battery", "admin")
        values = settings(url, sink.port)
        worker = start_worker(spawn, values)
        port = free_port()
        web = spawn(["web", "--port", str(port)], values)
        wait_for(lambda: _listening(port), timeout=30, message="the web process to listen")
        base = f"http://127.0.0.1:{port}"
        browser = _login(base, "ops@example.com", "correct horse battery")
        assert browser.get(f"{base}/", timeout=10).status_code == 200
        wait_for(lambda: len(sink.records()) >= 300, timeout=60, message="drain under way")

        flying = in_flight(engine)
        private_pg.stop()
        stopped = time.monotonic()
        time.sleep(2)
        page = browser.get(f"{base}/", timeout=15)
        assert page.status_code == 503, page.text[:500]
        assert "Database unavailable" in page.text and "Traceback" not in page.text
        time.sleep(max(0.0, 15 - (time.monotonic() - stopped)))
        private_pg.start()
        engine.dispose()

        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=120,
                 interval=0.5, message="the drain to finish after PostgreSQL came back")
        assert worker.popen.poll() is None and web.popen.poll() is None  # same processes
        assert browser.get(f"{base}/", timeout=10).status_code == 200
        received = check_final(engine, sink, campaign, emails)
        duplicates = sum(n - 1 for n in received.values())
        print(f"\nPostgreSQL down 15 s with {flying} job(s) sending: duplicates {duplicates}")
        assert duplicates <= flying
        with engine.connect() as conn:
            registered = conn.execute(sa.text(
                "SELECT pid FROM workers WHERE stopped_at IS NULL")).scalars().all()
        assert registered == [worker.popen.pid]  # nobody took the live worker for dead
        log = worker.output()
        # One line when the worker lost the database, one when it was back (its length).
        assert "database unreachable" in log and "database usable again after" in log
        assert "maximum number of running instances" not in log
        assert "Traceback" not in log and "Traceback" not in web.output()
    finally:
        sink.stop()
        engine.dispose()


# --- the relay is not the recipient (P6) ----------------------------------------------

# A refused login (535) is covered once, in test_engine.py
# (test_relay_down_and_refusing_login_loses_nothing): a 535 is not a relay that heals by
# itself, so it is not one of these.
RELAY_TROUBLE = {
    "421 to everything": ({"rules": [{"match": "*", "reply": "421 4.7.0 Try later",
                                      "stage": "mail"}]}, "421"),
}


@pytest.mark.parametrize("trouble", list(RELAY_TROUBLE))
def test_relay_trouble_uses_no_attempt_and_heals(trouble: str, engine: sa.Engine, sink: Any,
                                                 config_for: Callable[..., Config],
                                                 client: Any, make_user: Any) -> None:
    rules, code = RELAY_TROUBLE[trouble]
    sink.set_rules(rules)
    emails = [f"r{i}@example.org" for i in range(12)]
    campaign = make_campaign(engine, emails)
    # Short backoffs so the test sees several rounds: a relay throttle (421) pauses the
    # relay for the backoff step; a refused login probes every LOGIN_PROBE_INTERVAL.
    config = config_for(sink.port, SMTP_URL=f"smtp://u:old@127.0.0.1:{sink.port}?tls=none",
                        THROTTLE_BACKOFF="1,1,8", LOGIN_PROBE_INTERVAL="1")
    pool = Pool(engine, config, node="test-node")
    pool.start()
    throttling = code == "421"
    try:
        if throttling:
            wait_for(lambda: (_relay(engine)["throttle_hits"] or 0) >= 3, timeout=30,
                     message="several throttled rounds")
        else:
            wait_for(lambda: _relay(engine)["status"] == "down", timeout=20, message="alarm")
            wait_for(lambda: len(sink.rejections()) >= 3 or _relay(engine)["failures"] >= 3,
                     timeout=30, message="several refused rounds")
        relay = _relay(engine)
        assert code in ((relay["throttle_reply"] if throttling else relay["last_error"]) or "")
        jobs = jobs_by_email(engine, campaign["id"])
        assert {j["status"] for j in jobs.values()} <= {"pending", "sending"}
        assert all(j["attempts"] == 0 for j in jobs.values())
        assert all(attempts_of(engine, j["id"]) == [] for j in jobs.values())
        assert suppressed(engine) == set()
        _assert_banner(client, make_user, code,
                       "relay_throttled" if throttling else "relay_down")

        # The relay is fixed (the 421s stop; the password is rotated back): no one acts.
        sink.set_rules({"rules": [], "auth": {"username": "u", "password": "old"}})
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=90,
                 interval=0.5, message="delivery to resume by itself")
    finally:
        pool.stop()
    jobs = jobs_by_email(engine, campaign["id"])
    assert all(j["status"] == "sent" and j["attempts"] == 1 for j in jobs.values())
    assert _relay(engine)["status"] == "ok"
    assert sorted(r["rcpt_tos"][0] for r in sink.records()) == sorted(emails)


def _assert_banner(client: Any, make_user: Any, code: str, alarm: str = "relay_down") -> None:
    """The alarm banner on every page names the relay trouble (partials/_alarms.html)."""
    user = make_user("marketer")
    page = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)[1]  # type: ignore[index]
    client.post("/login", data={"email": user["email"], "password": user["password"],
                                "csrf_token": token})
    home = client.get("/").get_data(as_text=True)
    assert f'data-alarm="{alarm}"' in home and code in home


def _relay(engine: sa.Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return queue.relay_status(conn)


# --- SIGTERM during a drain -----------------------------------------------------------


def test_sigterm_mid_drain_finishes_in_flight_and_claims_nothing(
        engine: sa.Engine, db_url: str, sink: Any, spawn: Callable[..., Proc]) -> None:
    sink.set_rules({"delay": 1.5})  # a slow relay: every worker thread is mid-send
    emails = [f"s{i}@example.org" for i in range(200)]
    campaign = make_campaign(engine, emails)
    worker = start_worker(spawn, settings(db_url, sink.port, WORKERS="3", CLAIM_BATCH="4"))
    wait_for(lambda: len(sink.records()) >= 3, timeout=60, message="sends under way")
    # The threads finished their first messages together; half a second on, each is inside
    # the relay's 1.5 s for its next one (a message still waiting for its 354 when the
    # stop comes is not sent at all: that is not "in flight").
    time.sleep(0.5)
    assert in_flight(engine) > 0
    with engine.connect() as conn:
        sigterm_at = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
    started = time.monotonic()
    before = len(sink.records())
    worker.popen.terminate()
    code = worker.popen.wait(60)
    took = time.monotonic() - started
    after = len(sink.records())
    print(f"\nSIGTERM with 3 threads mid-send (1.5 s per message): exited in {took:.1f}s, "
          f"{after - before} message(s) finished after it")
    assert code == 0, worker.output()
    # The sends in flight (one per thread) and nothing more: the rest of the queue (100 s
    # of sending) is left. Counted, not timed, so a busy machine cannot make it red.
    assert after - before <= 3 and after < len(emails) / 2
    assert in_flight(engine) == 0  # nothing left claimed

    jobs = jobs_by_email(engine, campaign["id"])
    records = sink.records()
    accepted = [r["rcpt_tos"][0] for r in records]
    sent = sorted(e for e, j in jobs.items() if j["status"] == "sent")
    assert sorted(accepted) == sent and len(set(accepted)) == len(accepted)  # all marked
    assert any(datetime.fromisoformat(r["time"]) > sigterm_at for r in records), \
        "no send in flight at SIGTERM finished after it"
    assert {j["status"] for e, j in jobs.items() if e not in sent} == {"pending"}
    assert all(j["attempts"] == 0 for e, j in jobs.items() if e not in sent)
    with engine.connect() as conn:
        last_start = conn.execute(sa.text(
            "SELECT max(started_at) FROM job_attempts")).scalar_one()
    assert last_start <= sigterm_at, "a send started after SIGTERM"
    assert "stopped after sending" in worker.output()
