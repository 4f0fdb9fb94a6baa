"""The delivery engine end to end: real PostgreSQL, real SMTP on loopback, the real pool."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.conftest import wait_for
from tests.helpers import (
    attempts_of,
    campaign_status,
    jobs_by_email,
    make_campaign,
    place_jobs,
    suppressed,
)
from workers import queue
from workers.core.settings import Config
from workers.delivery.pool import Pool

RULES = {"rules": [
    {"match": "hard@example.org", "reply": "550 5.1.1 User unknown"},
    {"match": "policy@example.org", "reply": "550 5.7.1 Rejected by policy"},
    {"match": "soft@example.org", "reply": "451 4.3.0 Try again later", "times": 2},
    {"match": "forever@example.org", "reply": "451 4.3.0 Try again later"},
    {"match": "full@example.org", "reply": "452 4.2.2 Mailbox full", "times": 1},
]}


def run_pool(engine: sa.Engine, config: Config) -> Pool:
    pool = Pool(engine, config, node="test-node")
    pool.start()
    return pool


def test_broadcast_ends_in_the_right_states(engine: sa.Engine, sink: Any,
                                            config_for: Callable[..., Config]) -> None:
    sink.set_rules(RULES)
    emails = [f"ok{i}@example.org" for i in range(20)] + [
        "hard@example.org", "policy@example.org", "soft@example.org", "forever@example.org",
        "full@example.org"]
    campaign = make_campaign(engine, emails)
    pool = run_pool(engine, config_for(sink.port, RETRY_SCHEDULE_BROADCAST="1,1"))
    try:
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=60,
                 message="campaign to finish")
    finally:
        pool.stop()
    jobs = jobs_by_email(engine, campaign["id"])
    assert {e: j["status"] for e, j in jobs.items() if e.startswith("ok")} == {
        e: "sent" for e in emails if e.startswith("ok")}
    assert jobs["hard@example.org"]["status"] == "bounced"
    assert jobs["policy@example.org"]["status"] == "failed"
    assert jobs["soft@example.org"]["status"] == "sent"
    assert jobs["forever@example.org"]["status"] == "failed"
    assert jobs["full@example.org"]["status"] == "sent"
    # Only the dead address is suppressed: never for policy or transient replies (P5).
    assert suppressed(engine) == {"hard@example.org"}

    # The attempts table tells the story.
    soft = attempts_of(engine, jobs["soft@example.org"]["id"])
    assert [(a["attempt"], a["outcome"], a["smtp_code"]) for a in soft] == [
        (1, "transient", 451), (2, "transient", 451), (3, "sent", 250)]
    gap = (soft[1]["started_at"] - soft[0]["started_at"]).total_seconds()
    assert 0.9 <= gap < 5, gap  # the 1 s schedule step, not immediately
    forever = attempts_of(engine, jobs["forever@example.org"]["id"])
    assert len(forever) == 3  # two delays in the schedule: three attempts, then failed
    hard = attempts_of(engine, jobs["hard@example.org"]["id"])
    assert [(a["outcome"], a["enhanced_code"]) for a in hard] == [("hard_bounce", "5.1.1")]
    assert "5.1.1" in jobs["hard@example.org"]["last_error"]

    # What the sink accepted is exactly what is marked sent, each once.
    accepted = [r["rcpt_tos"][0] for r in sink.records()]
    sent = sorted(e for e, j in jobs.items() if j["status"] == "sent")
    assert sorted(accepted) == sent
    with engine.connect() as conn:
        counts = queue.broadcast_counts(conn, campaign["broadcast_id"])
        assert counts == queue.broadcast_counts_slow(conn, campaign["broadcast_id"])
    assert counts["sent"] == 22 and counts["bounced"] == 1 and counts["failed"] == 2


def test_message_headers(engine: sa.Engine, sink: Any,
                         config_for: Callable[..., Config]) -> None:
    import email
    from email import policy

    campaign = make_campaign(engine, ["reader@example.org"])
    pool = run_pool(engine, config_for(sink.port))
    try:
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=30)
    finally:
        pool.stop()
    (raw,) = sink.raw_messages()
    job = jobs_by_email(engine, campaign["id"])["reader@example.org"]
    record = sink.records()[0]
    assert record["message_id"] == job["message_id"]
    # Random (reveals no volume), on the campaign's From domain (news@example.com).
    assert re.fullmatch(r"<[0-9a-f]{32}@example\.com>", job["message_id"])
    msg = email.message_from_bytes(raw, policy=policy.default)
    assert msg["Message-ID"] == job["message_id"]
    assert msg["List-Unsubscribe"].startswith("<http://127.0.0.1:5000/u/")
    assert msg["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert msg["X-SendDock-Correlation-ID"] == str(job["correlation_id"])


def test_relay_down_and_refusing_login_loses_nothing(engine: sa.Engine, sink: Any,
                                                     config_for: Callable[..., Config]) -> None:
    """P6: no recipient bounced, failed or suppressed, no attempt used; all sent later."""
    sink.set_rules({"rules": [], "auth": {"username": "u", "password": "right"}})
    emails = [f"r{i}@example.org" for i in range(10)]
    campaign = make_campaign(engine, emails)
    # First the relay refuses our login (a rotated password)...
    bad = config_for(sink.port, SMTP_URL=f"smtp://u:wrong@127.0.0.1:{sink.port}?tls=none")
    pool = run_pool(engine, bad)
    try:
        wait_for(lambda: _relay(engine)["status"] == "down", timeout=20,
                 message="relay marked down")
        assert "535" in (_relay(engine)["last_error"] or "")
    finally:
        pool.stop()
    jobs = jobs_by_email(engine, campaign["id"])
    assert {j["status"] for j in jobs.values()} == {"pending"}
    assert all(j["attempts"] == 0 for j in jobs.values())
    assert suppressed(engine) == set()
    # ...then the right password: delivery resumes by itself after the probe.
    good = config_for(sink.port, SMTP_URL=f"smtp://u:right@127.0.0.1:{sink.port}?tls=none")
    pool = run_pool(engine, good)
    try:
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=60,
                 message="campaign to finish after relay recovery")
    finally:
        pool.stop()
    jobs = jobs_by_email(engine, campaign["id"])
    assert {j["status"] for j in jobs.values()} == {"sent"}
    assert all(j["attempts"] == 1 for j in jobs.values())
    assert _relay(engine)["status"] == "ok"


def test_relay_unreachable_then_back(engine: sa.Engine, sink: Any,
                                     config_for: Callable[..., Config]) -> None:
    from tests.conftest import free_port
    from webapp.sink import SinkServer

    port = free_port()  # nothing listens here yet: connection refused
    emails = [f"d{i}@example.org" for i in range(5)]
    campaign = make_campaign(engine, emails)
    pool = run_pool(engine, config_for(port))
    late = None
    try:
        wait_for(lambda: _relay(engine)["status"] == "down", timeout=20)
        jobs = jobs_by_email(engine, campaign["id"])
        assert {j["status"] for j in jobs.values()} <= {"pending", "sending"}
        late = SinkServer(host="127.0.0.1", port=port, record_path=sink.record_path.parent
                          / "late.jsonl")
        late.start()
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=90,
                 message="delivery to resume when the relay comes up")
    finally:
        pool.stop()
        if late is not None:
            late.stop()
    jobs = jobs_by_email(engine, campaign["id"])
    assert all(j["status"] == "sent" and j["attempts"] == 1 for j in jobs.values())


def _relay(engine: sa.Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return queue.relay_status(conn)


def test_lost_claim_is_put_back_by_its_live_worker(engine: sa.Engine, sink: Any,
                                                   config_for: Callable[..., Config]) -> None:
    """A claim whose reply never reached the worker (the connection died on the way back)
    does not stay in `sending` while that worker lives: its heartbeat puts it back."""
    campaign = make_campaign(engine, ["lost@example.org"], send=True)
    pool = run_pool(engine, config_for(sink.port))
    try:
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=30)
        with engine.begin() as conn:
            place_jobs(conn, sa.text("""
                UPDATE delivery_jobs SET status = 'sending', claimed_by = :w,
                       claim_token = gen_random_uuid(),
                       claimed_at = now() - interval '2 minutes', finished_at = NULL
                 WHERE campaign_id = :c"""), {"w": pool.worker_id, "c": campaign["id"]})
            conn.execute(sa.text("UPDATE workers SET stopped_at = now() WHERE id = :w"),
                         {"w": pool.worker_id})
            # As it is while a claim is lost mid-campaign: the campaign still sending.
            conn.execute(sa.text("UPDATE campaigns SET status = 'sending', finished_at = NULL "
                                 "WHERE id = :c"), {"c": campaign["id"]})
            conn.execute(sa.text("UPDATE broadcasts SET finished_at = NULL WHERE id = :b"),
                         {"b": campaign["broadcast_id"]})
        wait_for(lambda: jobs_by_email(engine, campaign["id"])["lost@example.org"]["status"]
                 == "sent" and len(sink.records()) == 2, timeout=30,
                 message="the lost claim to be put back and sent")
        with engine.connect() as conn:
            stopped = conn.execute(sa.text("SELECT stopped_at FROM workers WHERE id = :w"),
                                   {"w": pool.worker_id}).scalar()
        assert stopped is None  # a live worker wrongly marked dead is watched again
    finally:
        pool.stop()


def test_relay_answering_421_at_mail_is_throttling(engine: sa.Engine, sink: Any,
                                                   config_for: Callable[..., Config]) -> None:
    """A relay that greets fine but answers 421 at MAIL FROM is closing the channel: that
    is throttling (docs/design.md §16), so delivery slows down on an escalating backoff -- nothing
    is claimed meanwhile, no attempt is used -- and resumes by itself once the relay is fine."""
    sink.set_rules({"rules": [{"match": "*", "reply": "421 4.7.0 Try later",
                               "stage": "mail"}]})
    campaign = make_campaign(engine, [f"m{i}@example.org" for i in range(3)])
    pool = run_pool(engine, config_for(sink.port, THROTTLE_BACKOFF="1,2,30"))
    try:
        wait_for(lambda: (_relay(engine)["throttle_hits"] or 0) >= 2, timeout=20)
        assert _relay(engine)["status"] == "ok"  # slowed down, not down
        sink.set_rules({"rules": []})
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=60)
    finally:
        pool.stop()
    jobs = jobs_by_email(engine, campaign["id"])
    assert all(j["attempts"] == 1 for j in jobs.values())
