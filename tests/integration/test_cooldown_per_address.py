"""The verification cooldown holds per address (lower-cased, trimmed) as well as per user:
new user ids and a changed letter case inside the cooldown are a 429 with the retry time,
through /verifications, /messages, a batch and a resend."""

from __future__ import annotations

import json
import threading
from typing import Any

import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import enqueue_verification, place_jobs
from tests.integration.test_api_pipeline import as_message, rows
from workers import queue

URL = "https://app.example/v"


def _too_many(response: Any) -> None:
    assert response.status_code == 429, response.get_json()
    assert 1 <= int(response.headers["Retry-After"]) <= 60
    assert "moments ago" in response.get_json()["error"]["message"]


def test_new_user_ids_and_letter_case_do_not_walk_around_the_cooldown(
        api: Api, engine: sa.Engine) -> None:
    first = api.post("/verifications", {"user_id": "a-1", "email": "Ada@Example.org",
                                        "verify_url": URL})
    assert first.status_code == 202
    _too_many(api.post("/verifications", {"user_id": "a-2", "email": "ada@example.ORG",
                                          "verify_url": URL}))
    _too_many(api.post("/messages", as_message({"user_id": "a-3", "email": "ADA@example.org",
                                                "verify_url": URL})))
    batch = api.post("/messages/batch", {"messages": [
        as_message({"user_id": f"a-{i}", "email": email, "verify_url": URL})
        for i, email in ((4, "aDa@example.org"), (5, "grace@example.org"),
                         (6, "Grace@Example.org"))]}).get_json()["results"]
    # Two asks of one batch for one address: the first is sent, the second waits.
    assert [r["http_status"] for r in batch] == [429, 202, 429], batch
    assert all("ask again in" in batch[i]["error"]["message"] for i in (0, 2))
    assert sorted(r["email"].lower() for r in rows(engine, "verification")) == \
        ["ada@example.org", "grace@example.org"]


def test_the_cooldown_is_kept_after_the_mail_was_sent(api: Api, engine: sa.Engine) -> None:
    assert api.post("/verifications", {"user_id": "b-1", "email": "bo@example.org",
                                       "verify_url": URL}).status_code == 202
    with engine.begin() as conn:  # sent a moment ago, created long before
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'sent', "
                                 "created_at = now() - interval '1 hour', finished_at = now()"))
    _too_many(api.post("/verifications", {"user_id": "b-2", "email": "Bo@example.org",
                                          "verify_url": URL}))


def test_a_resend_for_another_user_id_waits_for_the_address(api: Api,
                                                              engine: sa.Engine) -> None:
    with engine.begin() as conn:  # c-1 was mailed at the address an hour ago
        job = enqueue_verification(conn, "cy@example.org", "c-1")
        place_jobs(conn, sa.text(
            "UPDATE delivery_jobs SET status = 'sent', created_at = now() - interval '1 hour', "
            "finished_at = now() - interval '1 hour' WHERE id = :id"), {"id": job})
    assert api.post("/verifications", {"user_id": "c-2", "email": "CY@example.org",
                                       "verify_url": URL}).status_code == 202
    _too_many(api.post("/verifications/resend", {"user_id": "c-1"}))
    _too_many(api.post("/messages/resend", {"kind": "verification", "user_id": "c-1"}))
    assert len(rows(engine, "verification")) == 2


def test_the_address_lookup_reads_an_index(engine: sa.Engine) -> None:
    """delivery_jobs_email_idx (lower(email), transactional jobs) serves the lookup: no
    migration needed."""
    ask = queue.Ask("verification", "Dee@example.org", 0, {}, user_ref="d-1", cooldown=60)
    with engine.begin() as conn:
        raw = conn.connection.driver_connection
        with raw.cursor() as cur:  # type: ignore[union-attr]
            cur.execute("SET LOCAL enable_seqscan = off")
            cur.execute("EXPLAIN " + queue.ENQUEUE, {
                "items": json.dumps([{"i": 0, "k": 0, "email": ask.email, "payload": {},
                                      "user_ref": ask.user_ref}]),
                "kinds": json.dumps([{"k": 0, "name": ask.kind, "priority": 0,
                                      "dedupe_window": 0, "one_live": True, "cooldown": 60}]),
                "actor": None, "max_backlog": None, "notify": False})
            plan = "\n".join(row[0] for row in cur.fetchall())
        conn.rollback()
    assert "delivery_jobs_email_idx" in plan, plan


def test_asks_at_the_same_moment_for_one_address_send_one_email(
        app: Any, api: Api, engine: sa.Engine) -> None:
    """Eight new users ask at once for one address (a burst of sign-ups naming someone
    else's mailbox): each request's statement reads before the others have committed, so
    the lookup alone would let several through. The database's constraint lets one in;
    the others are asked again (webapp/domain/intake.py) and find it: 429."""
    start = threading.Barrier(8)
    answers: list[Any] = []

    def ask(i: int) -> None:
        client = app.test_client()
        start.wait()
        answers.append(client.post("/api/v1/verifications", headers=api.headers, json={
            "user_id": f"e-{i}", "email": "Eve@example.org", "verify_url": URL}))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(a.status_code for a in answers) == [202] + [429] * 7
    for answer in answers:
        if answer.status_code == 429:
            _too_many(answer)
    assert len(rows(engine, "verification")) == 1


def test_a_cooldown_shortened_since_keeps_the_one_a_job_opened(engine: sa.Engine) -> None:
    """The constraint holds the cooldown a job was created with; so does the lookup, so a
    setting shortened since answers `cooldown` with that job's time left, not `busy`."""
    with engine.begin() as conn:
        first = queue.enqueue_one(conn, queue.Ask("verification", "fay@example.org", 0, {},
                                                  user_ref="f-1", cooldown=60), actor=None)
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET created_at = now() - interval "
                                 "'30 s', cooldown_until = now() + interval '30 s' "
                                 "WHERE id = :id"), {"id": first.job["id"]})
    with engine.begin() as conn:
        second = queue.enqueue_one(conn, queue.Ask("verification", "Fay@example.org", 0, {},
                                                   user_ref="f-2", cooldown=10), actor=None)
    assert second.outcome == "cooldown" and second.wait is not None
    assert 25 <= second.wait <= 30
    with engine.begin() as conn:  # once it is over, the shorter cooldown is the rule
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET created_at = now() - "
                                 "interval '61 s', cooldown_until = now() - interval '1 s'"))
        third = queue.enqueue_one(conn, queue.Ask("verification", "fay@example.org", 0, {},
                                                  user_ref="f-3", cooldown=10), actor=None)
    assert third.outcome == "new"
