"""POST /api/v1/verifications: 202 at once, idempotency, and clear answers to bad input."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import place_jobs
from webapp import create_app
from workers.core.settings import Config

GOOD = {"user_id": "u-1", "email": "Ada@Example.org", "verify_url": "https://app.example/v?t=1"}


def jobs(engine: sa.Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM delivery_jobs WHERE kind = 'verification' ORDER BY id")).mappings()]


def audit_entries(engine: sa.Engine, action: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM audit_log WHERE action = :a ORDER BY id"), {"a": action}).mappings()]


def test_request_answers_202_with_the_job(api: Api, engine: sa.Engine) -> None:
    r = api.post("/verifications", GOOD)
    assert r.status_code == 202, r.get_json()
    body = r.get_json()
    assert set(body) >= {"id", "status", "correlation_id", "flags", "email", "user_id",
                         "created_at"}
    assert body["status"] == "pending" and body["flags"] == [] and body["existing"] is False
    assert body["user_id"] == "u-1" and body["email"].lower() == "ada@example.org"
    [row] = jobs(engine)
    assert row["id"] == body["id"] and str(row["correlation_id"]) == body["correlation_id"]
    # One pipeline for both endpoints: the payload is the one POST /messages writes.
    assert row["payload"]["verify_url"] == GOOD["verify_url"]
    assert row["payload"]["data"] == {"verify_url": GOOD["verify_url"]}
    assert row["priority"] == 0 and row["requested_by"].endswith("(token 1)")
    [entry] = audit_entries(engine, "verification.request")
    assert entry["target"] == "user:u-1" and entry["details"]["job_id"] == body["id"]


def test_same_user_while_live_returns_that_job(api: Api, engine: sa.Engine) -> None:
    first = api.post("/verifications", GOOD).get_json()
    again = api.post("/verifications", {**GOOD, "verify_url": "https://app.example/v?t=2"})
    assert again.status_code == 202
    assert again.get_json()["id"] == first["id"] and again.get_json()["existing"] is True
    assert len(jobs(engine)) == 1
    # Sent moments ago: the resend cooldown holds for a new request too.
    with engine.begin() as conn:
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'sent', finished_at = now()"))
    refused = api.post("/verifications", GOOD)
    assert refused.status_code == 429 and 55 <= int(refused.headers["Retry-After"]) <= 60
    assert len(jobs(engine)) == 1
    # Once that job is terminal and the cooldown over, asking again creates a new one.
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE delivery_jobs SET created_at = now() - interval '3 min', "
                             "finished_at = now() - interval '2 min', "
                             "cooldown_until = now() - interval '2 min'"))
    third = api.post("/verifications", GOOD).get_json()
    assert third["id"] != first["id"] and third["existing"] is False
    assert len(jobs(engine)) == 2


def test_integer_user_id_is_stored_as_text(api: Api, engine: sa.Engine) -> None:
    r = api.post("/verifications", {**GOOD, "user_id": 42})
    assert r.status_code == 202 and r.get_json()["user_id"] == "42"
    again = api.post("/verifications", {**GOOD, "user_id": "42"})
    assert again.get_json()["id"] == r.get_json()["id"]
    assert jobs(engine)[0]["user_ref"] == "42"


def test_idempotency_key_returns_the_same_job_even_when_finished(api: Api,
                                                                 engine: sa.Engine) -> None:
    headers = {"Idempotency-Key": "signup-7"}
    first = api.client.post("/api/v1/verifications", json=GOOD,
                            headers={**api.headers, **headers})
    assert first.status_code == 202
    with engine.begin() as conn:
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'sent', finished_at = now()"))
    again = api.client.post("/api/v1/verifications", json=GOOD,
                            headers={**api.headers, **headers})
    assert again.status_code == 202
    assert again.get_json()["id"] == first.get_json()["id"]
    assert again.get_json()["existing"] is True and again.get_json()["status"] == "sent"
    assert len(jobs(engine)) == 1


def test_idempotency_key_reused_for_another_request_is_a_conflict(api: Api,
                                                                  engine: sa.Engine) -> None:
    headers = {**api.headers, "Idempotency-Key": "k-1"}
    assert api.client.post("/api/v1/verifications", json=GOOD, headers=headers).status_code \
        == 202
    other = api.client.post("/api/v1/verifications", headers=headers,
                            json={**GOOD, "user_id": "someone-else"})
    assert other.status_code == 409
    assert "Idempotency-Key" in other.get_json()["error"]["fields"]
    assert len(jobs(engine)) == 1


@pytest.mark.parametrize(("payload", "fields"), [
    ({}, {"user_id", "email", "verify_url"}),
    ({**GOOD, "email": "not-an-address"}, {"email"}),
    ({**GOOD, "email": "two@@example.org"}, {"email"}),
    ({**GOOD, "verify_url": "ftp://app.example/v"}, {"verify_url"}),
    ({**GOOD, "verify_url": "/relative/path"}, {"verify_url"}),
    ({**GOOD, "verify_url": 12}, {"verify_url"}),
    ({**GOOD, "user_id": 1.5}, {"user_id"}),
    ({**GOOD, "user_id": True}, {"user_id"}),
    ({**GOOD, "user_id": ["u"]}, {"user_id"}),
    ({**GOOD, "user_id": "   "}, {"user_id"}),
    ({**GOOD, "user_id": "x" * 256}, {"user_id"}),
    ({"user_id": "u", "email": None, "verify_url": "https://a.example/"}, {"email"}),
])
def test_bad_fields_are_named_in_a_422(api: Api, engine: sa.Engine, payload: dict[str, Any],
                                       fields: set[str]) -> None:
    r = api.post("/verifications", payload)
    assert r.status_code == 422, r.get_json()
    error = r.get_json()["error"]
    assert set(error["fields"]) == fields and error["message"]
    assert jobs(engine) == []


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"a string"', b""])
def test_malformed_or_non_object_json_is_a_400(api: Api, raw: bytes) -> None:
    r = api.client.post("/api/v1/verifications", data=raw, headers=api.headers,
                        content_type="application/json")
    assert r.status_code == 400
    assert r.get_json()["error"]["message"]


def test_bad_idempotency_key_is_refused(api: Api) -> None:
    r = api.client.post("/api/v1/verifications", json=GOOD,
                        headers={**api.headers, "Idempotency-Key": "é" * 3})
    assert r.status_code == 422
    assert "Idempotency-Key" in r.get_json()["error"]["fields"]


def test_full_backlog_answers_503_with_retry_after(engine: sa.Engine, sink: Any,
                                                   config_for: Callable[..., Config],
                                                   make_user: Callable[..., dict[str, Any]]
                                                   ) -> None:
    app = create_app(config_for(sink.port, MAX_BACKLOG="0"), engine=engine)
    api = Api(app.test_client(), make_user("support")["token"])
    r = api.post("/verifications", GOOD)
    assert r.status_code == 503 and r.headers["Retry-After"]
    assert "queue is full" in r.get_json()["error"]["message"]
    assert jobs(engine) == []


def test_marketers_may_not_request_verifications(client: Any,
                                                 make_user: Callable[..., dict[str, Any]]
                                                 ) -> None:
    api = Api(client, make_user("marketer")["token"])
    assert api.post("/verifications", GOOD).status_code == 403


def test_new_jobs_wake_idle_workers(api: Api, db_url: str) -> None:
    import psycopg

    url = db_url
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute("LISTEN senddock_jobs")
        assert api.post("/verifications", GOOD).status_code == 202
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == ["verification"]


def test_openapi_documents_the_verification_calls(api: Api) -> None:
    paths = api.get("/openapi.json").get_json()["paths"]
    assert "202" in paths["/verifications"]["post"]["responses"]
    assert "429" in paths["/verifications/resend"]["post"]["responses"]


def test_suppressed_address_is_flagged_at_once(api: Api, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO suppressions (email, reason) "
                             "VALUES ('ada@example.org', 'bounced')"))
    body = api.post("/verifications", GOOD).get_json()
    assert body["flags"] == ["suppressed"] and body["status"] == "pending"
