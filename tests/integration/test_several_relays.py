"""Several relays (docs/design.md §17), against two real SMTP servers on loopback (the sink): each
stream goes through its own relay; a relay that goes away hands its traffic to the other
within seconds and takes it back once a probe finds it working; Queue health shows each
relay; `senddock check` checks each."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import wait_for
from tests.helpers import (
    Browser,
    campaign_status,
    enqueue_verification,
    jobs_by_email,
    make_campaign,
)
from webapp.sink import SinkServer
from workers import queue
from workers.core.settings import Config
from workers.delivery.pool import Pool

pytestmark = pytest.mark.slow

WORKERS = 3


@pytest.fixture()
def bulk_sink(tmp_path: Path) -> Iterator[SinkServer]:
    server = SinkServer(host="127.0.0.1", port=0, record_path=tmp_path / "bulk.jsonl")
    server.start()
    yield server
    server.stop()


def two_relays(tx: Any, bulk: SinkServer) -> str:
    return (f"smtp://127.0.0.1:{tx.port}?tls=none&role=transactional&name=tx, "
            f"smtp://127.0.0.1:{bulk.port}?tls=none&role=campaign&name=bulk")


def recipients(server: Any) -> list[str]:
    return [r["rcpt_tos"][0] for r in server.records()]


def test_streams_route_and_fail_over(engine: sa.Engine, sink: Any, bulk_sink: SinkServer,
                                     config_for: Callable[..., Config], make_user: Any) -> None:
    tx = sink
    for server in (tx, bulk_sink):
        server.set_rules({"delay": 0.03})  # a drain of a few seconds, to stop one mid-way
    with engine.begin() as conn:
        for i in range(5):
            enqueue_verification(conn, f"v{i}@example.org", f"u-{i}")
    emails = [f"c{i:03d}@example.org" for i in range(300)]
    campaign = make_campaign(engine, emails)
    config = config_for(None, SMTP_URL=two_relays(tx, bulk_sink), WORKERS=str(WORKERS),
                        RELAY_PROBE_MAX="1")
    pool = Pool(engine, config, node="two-relays")
    pool.start()
    try:
        wait_for(lambda: len(bulk_sink.records()) >= 40, timeout=60, message="campaign under way")
        # routing by stream: verification mail through tx, the campaign through bulk
        assert set(recipients(tx)) == {f"v{i}@example.org" for i in range(5)}
        assert all(r.startswith("c") for r in recipients(bulk_sink))

        bulk_sink.stop()  # the campaign relay goes away mid-drain
        stopped = time.monotonic()
        wait_for(lambda: any(r.startswith("c") for r in recipients(tx)), timeout=30,
                 message="the campaign carried on through the other relay")
        failover = time.monotonic() - stopped
        with engine.connect() as conn:
            states = queue.relay_states(conn, 2)
        assert states[0]["status"] == "ok" and states[1]["status"] == "down"

        from webapp import create_app  # Queue health lists both, with the state of each

        web = Browser(create_app(config, engine=engine).test_client(), make_user("admin"))
        health = web.get("/health/").get_data(as_text=True)
        assert 'data-relay="tx" data-state="ok"' in health
        assert 'data-relay="bulk" data-state="down"' in health
        assert re.search(r"Relay bulk \(campaign\) is down since", health)
        metrics = web.get("/metrics").get_data(as_text=True)
        assert 'senddock_relay_up{relay="bulk"} 0.0' in metrics
        assert 'senddock_relay_up{relay="tx"} 1.0' in metrics

        time.sleep(2)
        bulk_sink.start()  # back on the same port: a probe finds it and it takes its traffic back
        restarted = time.monotonic()

        def bulk_state() -> str:
            with engine.connect() as conn:
                return str(queue.relay_states(conn, 2)[1]["status"])

        wait_for(lambda: bulk_state() == "ok", timeout=30, message="the probe finds it back")
        takeback = time.monotonic() - restarted
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=90,
                 interval=0.5)
        before = set(recipients(tx))
        later = make_campaign(engine, [f"d{i:02d}@example.org" for i in range(20)],
                              name="after the take-back")
        wait_for(lambda: campaign_status(engine, later["id"]) == "sent", timeout=60,
                 interval=0.5)
        # the campaign stream is back on its own relay
        assert set(recipients(tx)) == before
        assert {f"d{i:02d}@example.org" for i in range(20)} <= set(recipients(bulk_sink))
    finally:
        pool.stop()
    jobs = jobs_by_email(engine, campaign["id"])
    assert {j["status"] for j in jobs.values()} == {"sent"}
    got = Counter(r for r in recipients(tx) + recipients(bulk_sink) if r.startswith("c"))
    assert set(got) == set(emails)  # 0 lost
    duplicates = sum(n - 1 for n in got.values())
    # the honest window: a message each thread had in the stopped relay's hands
    assert duplicates <= WORKERS
    # a message cut mid-transfer is a transient attempt (retried), never a failure
    assert all(j["attempts"] <= 2 for j in jobs.values())
    assert sum(j["attempts"] == 2 for j in jobs.values()) <= WORKERS
    with engine.connect() as conn:
        assert [s["status"] for s in queue.relay_states(conn, 2)] == ["ok", "ok"]
    print(f"\ntwo relays: failover in {failover:.1f} s, back up (probe) {takeback:.1f} s after "
          f"the restart, {duplicates} duplicate(s), {sum(got.values())} copies for "
          f"{len(emails)} campaign messages")
    assert failover < 10


def test_check_checks_each_relay(sink: Any, bulk_sink: SinkServer,
                                 config_for: Callable[..., Config]) -> None:
    from webapp.checks import relay_checks

    bulk_sink.stop()
    checks = relay_checks(config_for(None, SMTP_URL=two_relays(sink, bulk_sink)))
    by_name = {c.name: c for c in checks}
    assert by_name["relay connection (tx, transactional)"].status == "ok"
    assert by_name["relay MAIL FROM (tx, transactional)"].status == "ok"
    assert by_name["relay connection (bulk, campaign)"].status == "problem"


def test_a_relay_refusing_our_login_hands_its_traffic_over(
        engine: sa.Engine, sink: Any, bulk_sink: SinkServer,
        config_for: Callable[..., Config], make_user: Any) -> None:
    """The campaign relay refuses our login (535): one failed AUTH, the relay is marked
    'login refused' (probed at most every LOGIN_PROBE_INTERVAL), and the campaign goes out
    through the other relay meanwhile; nobody is charged an attempt for it."""
    bulk_sink.set_rules({"auth": {"username": "u", "password": "right"}})
    url = (f"smtp://127.0.0.1:{sink.port}?tls=none&role=transactional&name=tx, "
           f"smtp://u:wrong@127.0.0.1:{bulk_sink.port}?tls=none&role=campaign&name=bulk")
    emails = [f"l{i:02d}@example.org" for i in range(20)]
    campaign = make_campaign(engine, emails)
    config = config_for(None, SMTP_URL=url, WORKERS=str(WORKERS))
    pool = Pool(engine, config, node="login-refused")
    pool.start()
    try:
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=60)
    finally:
        pool.stop()
    assert sorted(recipients(sink)) == emails and bulk_sink.records() == []
    assert all(j["attempts"] == 1 for j in jobs_by_email(engine, campaign["id"]).values())
    with engine.connect() as conn:
        tx, bulk = queue.relay_states(conn, 2)
    assert tx["status"] == "ok" and bulk["status"] == "down" and bulk["reason"] == "login"
    from webapp import create_app

    web = Browser(create_app(config, engine=engine).test_client(), make_user("admin"))
    health = web.get("/health/").get_data(as_text=True)
    assert re.search(r"Relay bulk \(campaign\) refused our login since", health)
