"""The one request pipeline: ``POST /messages``, ``POST /messages/batch``
and ``POST /verifications`` keep every promise through the same statement — parallel
requests make one message, the verification cooldown holds whichever endpoint is asked,
another address replaces a waiting job, a batch answers per item, a kind edited between two
requests is seen at once, and workers are woken once per statement, not once per message."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import place_jobs
from tests.integration.test_kinds_api import ONBOARDING, message, put_kind
from webapp import create_app
from webapp.domain import intake, kinds
from webapp.domain.flags import FLAG_DISPOSABLE
from workers.core import pg
from workers.core.settings import Config

VERIFY = {"user_id": "u-7", "email": "ada@example.org", "verify_url": "https://app.example/v"}


def as_message(body: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "verification", "user_id": body["user_id"], "email": body["email"],
            "data": {"verify_url": body["verify_url"]}}


def rows(engine: sa.Engine, kind: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM delivery_jobs WHERE kind = :k ORDER BY id"), {"k": kind}).mappings()]


def audit_actions(engine: sa.Engine, action: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM audit_log WHERE action = :a ORDER BY id"), {"a": action}).mappings()]


def parallel(api: Api, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Each call on its own thread and test client, released together."""
    barrier = threading.Barrier(len(calls))
    answers: list[Any] = [None] * len(calls)

    def run(i: int, path: str, body: dict[str, Any]) -> None:
        client = Api(api.client.application.test_client(),
                     api.headers["Authorization"].removeprefix("Bearer "))
        barrier.wait(timeout=60)
        answers[i] = client.post(path, body)

    threads = [threading.Thread(target=run, args=(i, path, body))
               for i, (path, body) in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return answers


def test_eight_parallel_requests_make_one_message(api: Api, engine: sa.Engine) -> None:
    assert put_kind(api, "onboarding", ONBOARDING).status_code == 201
    answers = parallel(api, [("/messages", message())] * 8)
    assert [a.status_code for a in answers] == [202] * 8, [a.get_json() for a in answers]
    bodies = [a.get_json() for a in answers]
    assert len({b["id"] for b in bodies}) == 1
    assert sorted(b["existing"] for b in bodies) == [False] + [True] * 7
    assert {b["existing_because"] for b in bodies if b["existing"]} == {"dedupe_window"}
    assert len(rows(engine, "onboarding")) == 1
    assert len(audit_actions(engine, "message.request")) == 1


def test_eight_parallel_verifications_through_both_endpoints_make_one(
        api: Api, engine: sa.Engine) -> None:
    calls = [("/verifications", VERIFY), ("/messages", as_message(VERIFY))] * 4
    answers = parallel(api, calls)
    assert [a.status_code for a in answers] == [202] * 8, [a.get_json() for a in answers]
    assert len({a.get_json()["id"] for a in answers}) == 1
    assert len(rows(engine, "verification")) == 1
    assert len(audit_actions(engine, "verification.request")) == 1


def _sent_moments_ago(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'sent', "
                                 "finished_at = now() WHERE kind = 'verification'"))


def test_the_cooldown_holds_through_both_endpoints(api: Api, engine: sa.Engine) -> None:
    first = api.post("/verifications", VERIFY)
    assert first.status_code == 202
    _sent_moments_ago(engine)
    for path, body in [("/verifications/resend", {"user_id": "u-7"}),
                       ("/verifications", VERIFY), ("/messages", as_message(VERIFY)),
                       ("/messages/resend", {"kind": "verification", "user_id": "u-7"})]:
        r = api.post(path, body)
        assert r.status_code == 429, (path, r.get_json())
        assert 1 <= int(r.headers["Retry-After"]) <= 60
    batch = api.post("/messages/batch", {"messages": [as_message(VERIFY)]}).get_json()
    assert batch["results"][0]["http_status"] == 429
    assert len(rows(engine, "verification")) == 1
    # Over: a new request is a new email.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE delivery_jobs SET created_at = now() - interval '3 min', "
                             "finished_at = now() - interval '2 min', "
                             "cooldown_until = now() - interval '2 min'"))
    again = api.post("/messages", as_message(VERIFY))
    assert again.status_code == 202 and again.get_json()["existing"] is False
    assert len(rows(engine, "verification")) == 2


def test_another_address_replaces_a_waiting_job(api: Api, engine: sa.Engine) -> None:
    first = api.post("/verifications", VERIFY).get_json()
    moved = api.post("/verifications", {**VERIFY, "email": "ada@new.example.org"})
    assert moved.status_code == 202, moved.get_json()
    body = moved.get_json()
    assert body["id"] != first["id"] and body["existing"] is False
    assert body["email"] == "ada@new.example.org"
    old, new = rows(engine, "verification")
    assert old["status"] == "cancelled" and "another address" in old["last_error"]
    assert new["status"] == "pending" and new["email"] == "ada@new.example.org"
    [entry] = [e for e in audit_actions(engine, "verification.request")
               if e["details"]["job_id"] == body["id"]]
    assert entry["details"]["replaced_job_id"] == first["id"]
    # The same (new) address again: the live job, as before.
    same = api.post("/messages", as_message({**VERIFY, "email": "ADA@new.example.org"}))
    assert same.get_json()["id"] == body["id"] and same.get_json()["existing"] is True


def test_another_address_while_the_old_is_being_sent_is_a_409(api: Api,
                                                               engine: sa.Engine) -> None:
    first = api.post("/verifications", VERIFY).get_json()
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE delivery_jobs SET status = 'sending'"))
    r = api.post("/verifications", {**VERIFY, "email": "ada@new.example.org"})
    assert r.status_code == 409, r.get_json()
    assert "email" in r.get_json()["error"]["fields"]
    assert [j["status"] for j in rows(engine, "verification")] == ["sending"]
    assert rows(engine, "verification")[0]["id"] == first["id"]


def test_a_batch_answers_each_item(api: Api, engine: sa.Engine) -> None:
    assert put_kind(api, "onboarding", ONBOARDING).status_code == 201
    items = [
        message(user_id="u-1", idempotency_key="k-1"),
        message(user_id="u-2", email="not an address"),
        message(kind="nope", user_id="u-3"),
        {"kind": "verification", "user_id": "u-4", "email": "b@example.org"},
        message(user_id="u-1"),  # the first one's dedupe window
        message(user_id="u-5", data="text"),
        message(user_id="u-6", idempotency_key=""),
        message(user_id="u-7", colour="blue"),
    ]
    r = api.post("/messages/batch", {"messages": items})
    assert r.status_code == 207, r.get_json()
    body = r.get_json()
    results = body["results"]
    assert [x["index"] for x in results] == list(range(len(items)))
    assert [x["http_status"] for x in results] == [202, 422, 404, 422, 202, 422, 422, 422]
    assert body["accepted"] == 2 and body["rejected"] == 6
    assert results[0]["existing"] is False and results[4]["existing"] is True
    assert results[4]["id"] == results[0]["id"]
    assert results[4]["existing_because"] == "dedupe_window"
    assert "email" in results[1]["error"]["fields"]
    assert "kind" in results[2]["error"]["fields"]
    assert "data.verify_url" in results[3]["error"]["fields"]
    assert "data" in results[5]["error"]["fields"]
    assert "idempotency_key" in results[6]["error"]["fields"]
    assert results[7]["error"]["fields"] == {"colour": "unknown field"}
    [job] = rows(engine, "onboarding")
    assert job["idempotency_key"] == "k-1" and job["user_ref"] == "u-1"
    # The same key again returns the same message; used for another user it is a 409.
    again = api.post("/messages/batch", {"messages": [
        message(user_id="u-1", idempotency_key="k-1"),
        message(user_id="u-9", idempotency_key="k-1")]}).get_json()["results"]
    assert again[0]["id"] == job["id"] and again[0]["existing_because"] == "idempotency_key"
    assert again[1]["http_status"] == 409 and "Idempotency-Key" in again[1]["error"]["fields"]
    # An item that is not an object is a malformed call, not a bad message.
    odd = api.post("/messages/batch", {"messages": [message(user_id="u-8"), "text"]})
    assert odd.status_code == 422 and odd.get_json()["error"]["fields"] == {
        "messages[1]": "must be a JSON object"}
    assert len(rows(engine, "onboarding")) == 1


def test_a_batch_of_500_is_one_call_and_501_is_refused(api: Api, engine: sa.Engine) -> None:
    items = [as_message({**VERIFY, "user_id": f"u-{i}", "email": f"u{i}@example.org"})
             for i in range(500)]
    r = api.post("/messages/batch", {"messages": items})
    assert r.status_code == 207 and r.get_json()["accepted"] == 500
    assert len(rows(engine, "verification")) == 500
    assert len(audit_actions(engine, "verification.request")) == 500
    too_many = api.post("/messages/batch", {"messages": items + items[:1]})
    assert too_many.status_code == 422 and "messages" in too_many.get_json()["error"]["fields"]


def test_a_batch_of_two_kinds_answers_what_was_stored(api: Api, engine: sa.Engine) -> None:
    """Each kind is sent to the statement once per call and every item keeps its own kind's
    rules; a new message is answered with the payload the request gave, which is the one
    stored; a kind edited between two batches is read again for its own items only."""
    assert put_kind(api, "onboarding", ONBOARDING).status_code == 201
    items = [message(user_id="m-1", data={"first_name": "Ada", "n": [1, 2.5, "ü"]}),
             as_message({**VERIFY, "user_id": "m-1", "email": "m1@mailinator.com"}),
             message(user_id="m-1"),  # the first item's dedupe window
             {**message(user_id="m-2"), "idempotency_key": None},
             as_message({**VERIFY, "user_id": "m-2", "email": "m2@example.org"})]
    results = api.post("/messages/batch", {"messages": items}).get_json()["results"]
    assert [r["http_status"] for r in results] == [202] * 5, results
    assert [r["existing"] for r in results] == [False, False, True, False, False]
    assert results[2]["id"] == results[0]["id"]
    assert [r["kind"] for r in results] == ["onboarding", "verification", "onboarding",
                                           "onboarding", "verification"]
    assert results[1]["flags"] == [FLAG_DISPOSABLE] and results[4]["flags"] == []
    stored = {j["id"]: j for j in rows(engine, "onboarding") + rows(engine, "verification")}
    assert len(stored) == 4
    for r in results:
        job = stored[r["id"]]
        assert (r["email"], r["user_id"], r["status"], r["flags"], r["correlation_id"]) == (
            job["email"], job["user_ref"], job["status"], job["flags"],
            str(job["correlation_id"]))
        assert r["data"] == job["payload"]["data"] and r["event"] == job["payload"].get("event")
        assert datetime.fromisoformat(r["created_at"]) == job["created_at"]
    version = stored[results[0]["id"]]["payload"]["kind_version"]
    assert put_kind(api, "onboarding", {"dedupe_window": 0}).status_code == 200
    again = api.post("/messages/batch", {"messages": [
        message(user_id="m-3"), as_message({**VERIFY, "user_id": "m-3"})]}).get_json()
    assert [r["existing"] for r in again["results"]] == [False, False]
    [newest] = [j for j in rows(engine, "onboarding") if j["user_ref"] == "m-3"]
    assert newest["payload"]["kind_version"] == version + 1
    assert again["results"][0]["data"] == newest["payload"]["data"]


def test_the_backlog_limit_holds_per_item(engine: sa.Engine, make_user: Callable[..., Any],
                                          config_for: Callable[..., Config]) -> None:
    app = create_app(config_for(MAX_BACKLOG="3"), engine=engine)
    api = Api(app.test_client(), make_user("admin")["token"])
    items = [as_message({**VERIFY, "user_id": f"u-{i}", "email": f"u{i}@example.org"})
             for i in range(5)]
    results = api.post("/messages/batch", {"messages": items}).get_json()["results"]
    assert [x["http_status"] for x in results] == [202, 202, 202, 503, 503]
    assert api.post("/verifications", {**VERIFY, "user_id": "u-9", "email": "u9@example.org"}
                    ).status_code == 503


def test_a_kind_edited_between_two_requests_is_seen_at_once(api: Api,
                                                             engine: sa.Engine) -> None:
    assert put_kind(api, "onboarding", {**ONBOARDING, "dedupe_window": 0}).status_code == 201
    assert api.post("/messages", message()).get_json()["existing"] is False
    assert api.post("/messages", message()).get_json()["existing"] is False
    assert put_kind(api, "onboarding", {"dedupe_window": 3600}).status_code == 200
    third = api.post("/messages", message()).get_json()
    assert third["existing"] is False  # the window opens with this one
    assert api.post("/messages", message()).get_json()["existing_because"] == "dedupe_window"
    assert put_kind(api, "onboarding", {"active": False}).status_code == 200
    assert api.post("/messages", message()).status_code == 409
    assert len(rows(engine, "onboarding")) == 3


@pytest.fixture()
def listener(db_url: str) -> Any:
    with psycopg.connect(pg.conninfo(db_url), autocommit=True) as conn:
        conn.execute("LISTEN senddock_jobs")
        yield conn


def _notifications(conn: psycopg.Connection[Any]) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0.5)]


def test_workers_are_woken_once_per_statement(engine: sa.Engine, listener: Any,
                                              config_for: Callable[..., Config]) -> None:
    config = config_for()
    with engine.connect() as conn:
        spec = kinds.active(conn, "verification")

        def ask(i: int, **more: Any) -> intake.Ask:
            return intake.Ask(spec, f"u-{i}", f"u{i}@example.org",
                              {"verify_url": "https://app.example/v"}, **more)

        intake.submit(conn, config, [ask(1)], actor="test")
        conn.commit()
        assert _notifications(listener) == ["verification"]
        # A batch of 200 wakes the workers once; a scheduled one not at all (not due).
        intake.submit(conn, config, [ask(i) for i in range(2, 202)], actor="test")
        conn.commit()
        assert _notifications(listener) == ["verification"]
        later = datetime.now(UTC) + timedelta(hours=1)
        intake.submit(conn, config, [ask(300, send_at=later)], actor="test")
        conn.commit()
        assert _notifications(listener) == []
