"""Every claimed job gets an outcome of its own (P2, docs/design.md §14 and §16), with the real
pool, real PostgreSQL and a real SMTP server on loopback:

- a message that cannot be built fails alone, with a readable error, next to a good
  campaign's messages in the same claimed batch; nothing stays `sending`;
- a mark that comes too late (the job was taken back meanwhile) is refused and said so
  in the log;
- a test send after an edit shows the edit (the template cache follows the version);
- attempt numbers continue across a manual retry, and the timeline is in time order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import wait_for
from tests.helpers import campaign_status, jobs_by_email, make_campaign
from webapp.domain import campaigns, inbox, queue_reads
from workers import queue
from workers.core.settings import Config
from workers.delivery.pool import Pool


def _states(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text(
            "SELECT status, count(*) FROM delivery_jobs GROUP BY status")).all())


def test_a_message_that_cannot_be_built_fails_alone(engine: sa.Engine, sink: Any,
                                                   config_for: Callable[..., Config]) -> None:
    good = make_campaign(engine, [f"good{i}@example.org" for i in range(5)], name="Good")
    bad = make_campaign(engine, [f"bad{i}@example.org" for i in range(5)], name="Bad")
    with engine.begin() as conn:
        # A From display name with a line break (stored before validation caught it):
        # building the message raises, which is not a template error.
        conn.execute(sa.text("UPDATE campaigns SET from_addr = :f WHERE id = :id"),
                     {"f": "News\r\nBcc: everyone@example.net <news@example.com>",
                      "id": bad["id"]})
        for campaign in (bad, good):  # both audiences claimable at once: one batch of 10
            queue.enqueue_broadcast(conn, campaign["broadcast_id"])
    pool = Pool(engine, config_for(sink.port, WORKERS="1", CLAIM_BATCH="10"), node="t")
    pool.start()
    try:
        wait_for(lambda: campaign_status(engine, good["id"]) == "sent"
                 and campaign_status(engine, bad["id"]) == "sent", timeout=30,
                 message="both campaigns to finish")
    finally:
        pool.stop()
    assert _states(engine) == {"sent": 5, "failed": 5}
    assert sorted(r["rcpt_tos"][0] for r in sink.records()) == [
        f"good{i}@example.org" for i in range(5)]
    for job in jobs_by_email(engine, bad["id"]).values():
        assert job["status"] == "failed" and job["last_error_class"] == "build"
        assert job["last_error"].startswith("could not build the message"), job["last_error"]
        assert "line break" in job["last_error"] or "ValueError" in job["last_error"]


def test_a_late_mark_is_refused_and_logged(engine: sa.Engine, sink: Any,
                                         config_for: Callable[..., Config],
                                         caplog: pytest.LogCaptureFixture) -> None:
    sink.set_rules({"rules": [], "delay": 1.5})
    campaign = make_campaign(engine, ["late@example.org"])
    pool = Pool(engine, config_for(sink.port, WORKERS="1"), node="t")
    caplog.set_level(logging.INFO, logger="senddock.worker")
    pool.start()
    try:
        wait_for(lambda: _states(engine).get("sending") == 1, timeout=30,
                 message="the job in flight")
        with engine.begin() as conn:  # what a rescuer and another worker's claim do
            conn.execute(sa.text("UPDATE delivery_jobs SET claim_token = gen_random_uuid(), "
                                 "claimed_by = 'someone-else' WHERE status = 'sending'"))
        wait_for(lambda: any("refused" in r.getMessage() for r in caplog.records),
                 timeout=30, message="the refused mark in the log")
    finally:
        pool.stop()
    line = next(r.getMessage() for r in caplog.records if "refused" in r.getMessage())
    job = jobs_by_email(engine, campaign["id"])["late@example.org"]
    assert str(job["id"]) in line and "sent" in line, line
    assert job["status"] == "sending" and job["claimed_by"] == "someone-else"
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM job_attempts")).scalar_one() == 0


def test_a_test_send_after_an_edit_shows_the_edit(engine: sa.Engine, sink: Any,
                                                  config_for: Callable[..., Config]) -> None:
    draft = make_campaign(engine, ["member@example.org"], send=False, name="Draft")
    pool = Pool(engine, config_for(sink.port), node="t")
    pool.start()
    try:
        with engine.begin() as conn:
            campaigns.test_send(conn, draft["id"], "tester@example.org")
        wait_for(lambda: len(sink.records()) == 1, timeout=30, message="the first test")
        with engine.begin() as conn:
            current = campaigns.get(conn, draft["id"])
            campaigns.update(conn, draft["id"], {
                "name": current["name"], "list_id": current["list_id"],
                "subject": "Edited {{ name }}", "text": "Second version, {{ name }}.",
                "html": "<p>Second version</p>"}, default_from="news@example.com")
            campaigns.test_send(conn, draft["id"], "tester@example.org")
        wait_for(lambda: len(sink.records()) == 2, timeout=30, message="the second test")
    finally:
        pool.stop()
    subjects = [r["subject"] for r in sink.records()]
    assert subjects[0].startswith("[Test] Hello") and subjects[1].startswith("[Test] Edited")


def test_attempt_numbers_continue_across_a_manual_retry(
        engine: sa.Engine, sink: Any, config_for: Callable[..., Config]) -> None:
    sink.set_rules({"rules": [{"match": "refused@example.org",
                               "reply": "550 5.7.1 Message refused"}]})
    campaign = make_campaign(engine, ["refused@example.org"])
    pool = Pool(engine, config_for(sink.port), node="t")
    pool.start()
    try:
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=30)
        job = jobs_by_email(engine, campaign["id"])["refused@example.org"]
        assert job["status"] == "failed" and job["attempts"] == 1
        with engine.begin() as conn:
            inbox.retry(conn, job["id"], actor="admin@example.com")
        wait_for(lambda: jobs_by_email(engine, campaign["id"])["refused@example.org"]
                 ["status"] == "failed" and campaign_status(engine, campaign["id"]) == "sent",
                 timeout=30, message="the retried job to fail again")
    finally:
        pool.stop()
    job = jobs_by_email(engine, campaign["id"])["refused@example.org"]
    assert job["attempts"] == 2  # "Attempts 2" after two tries
    with engine.connect() as conn:
        timeline = queue_reads.job_attempts(conn, job["id"])
        by_user = queue_reads.attempts_for_jobs(conn, [job["id"]])[job["id"]]
    assert [a["attempt"] for a in timeline] == [1, 2]
    assert [a["attempt"] for a in by_user] == [1, 2]
    started = [a["started_at"] for a in timeline]
    assert started == sorted(started) and started[-1] <= datetime.now(UTC)


def test_a_database_error_while_building_hands_the_message_back(
        engine: sa.Engine, sink: Any, config_for: Callable[..., Config]) -> None:
    """Building a message reads the database (templates, DKIM keys) when its caches miss.
    The database unreachable at that moment is not the message's fault: the job goes back
    to `pending` unsent and uncounted, and is sent once the database answers -- it is not
    failed (a recipient lost to a network blip)."""
    campaign = make_campaign(engine, [f"blip{i}@example.org" for i in range(3)])
    pool = Pool(engine, config_for(sink.port, WORKERS="1"), node="t")
    build = pool.composer.build
    failures = [0]

    def flaky(job: Any) -> Any:
        if failures[0] < 2:
            failures[0] += 1
            raise sa.exc.OperationalError("SELECT 1", {}, Exception(
                "consuming input failed: could not receive data from server: "
                "Connection timed out"))
        return build(job)

    pool.composer.build = flaky  # type: ignore[method-assign]
    pool.start()
    try:
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=30,
                 message="the campaign to finish")
    finally:
        pool.stop()
    assert failures[0] == 2
    assert _states(engine) == {"sent": 3}
    assert sorted(r["rcpt_tos"][0] for r in sink.records()) == [
        f"blip{i}@example.org" for i in range(3)]
    for job in jobs_by_email(engine, campaign["id"]).values():
        assert job["attempts"] == 1, job
