"""POST /api/v1/verifications/resend: the cooldown (429 + Retry-After), reuse of a waiting
job, a new job once the last one is finished, and an audit entry naming who asked."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import place_jobs
from webapp import create_app
from workers.core.settings import Config

GOOD = {"user_id": "u-9", "email": "grace@example.org", "verify_url": "https://app.example/v"}


@pytest.fixture()
def support(make_user: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    return make_user("support")


def api_with(engine: sa.Engine, config: Config, token: str) -> Api:
    return Api(create_app(config, engine=engine).test_client(), token)


def age_jobs(engine: sa.Engine, *, created: str, finished: str | None = None,
             status: str | None = None) -> None:
    """Move the user's jobs into the past (and optionally to a status): the cooldown each
    opened moves with its creation."""
    with engine.begin() as conn:
        place_jobs(conn, sa.text(
            "UPDATE delivery_jobs SET created_at = now() - CAST(:created AS interval), "
            "cooldown_until = cooldown_until - (created_at - now() "
            "                                   + CAST(:created AS interval)), "
            "finished_at = now() - CAST(:finished AS interval), "
            "status = coalesce(:status, status)"),
            {"created": created, "finished": finished, "status": status})


def resend_entries(engine: sa.Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT * FROM audit_log WHERE action = 'verification.resend' ORDER BY id"))
            .mappings()]


def count_jobs(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM delivery_jobs")).scalar_one())


def test_resend_inside_the_cooldown_is_429_with_retry_after(api: Api, engine: sa.Engine) -> None:
    first = api.post("/verifications", GOOD).get_json()
    r = api.post("/verifications/resend", {"user_id": "u-9"})
    assert r.status_code == 429
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    error = r.get_json()["error"]
    assert "resend in" in error["message"] and error["retry_at"] and error["job_id"] == first["id"]
    assert count_jobs(engine) == 1 and resend_entries(engine) == []


def test_cooldown_counts_from_when_the_last_job_was_sent(api: Api, engine: sa.Engine) -> None:
    api.post("/verifications", GOOD)
    age_jobs(engine, created="10 minutes", finished="10 seconds", status="sent")
    r = api.post("/verifications/resend", {"user_id": "u-9"})
    assert r.status_code == 429
    assert 45 <= int(r.headers["Retry-After"]) <= 51


def test_resend_after_a_finished_job_creates_a_new_one(api: Api, engine: sa.Engine,
                                                       support: dict[str, Any]) -> None:
    first = api.post("/verifications", GOOD).get_json()
    age_jobs(engine, created="5 minutes", finished="4 minutes", status="failed")
    by_support = Api(api.client, support["token"])
    r = by_support.post("/verifications/resend", {"user_id": "u-9"})
    assert r.status_code == 202, r.get_json()
    body = r.get_json()
    assert body["id"] != first["id"] and body["status"] == "pending"
    assert body["reused"] is False and body["email"] == GOOD["email"]
    assert count_jobs(engine) == 2
    with engine.connect() as conn:
        payload = conn.execute(sa.text("SELECT payload FROM delivery_jobs WHERE id = :id"),
                               {"id": body["id"]}).scalar_one()
    assert payload["verify_url"] == GOOD["verify_url"]
    assert payload["data"] == {"verify_url": GOOD["verify_url"]}
    [entry] = resend_entries(engine)
    assert entry["actor"].startswith(f"{support['email']} (token ")
    assert entry["target"] == "user:u-9"
    assert entry["details"]["job_id"] == body["id"] and entry["details"]["reused"] is False
    assert entry["details"]["previous_status"] == "failed"
    # ... and the cooldown starts again from the new job.
    assert by_support.post("/verifications/resend", {"user_id": "u-9"}).status_code == 429


def test_resend_reuses_a_job_that_is_still_waiting(api: Api, engine: sa.Engine) -> None:
    first = api.post("/verifications", GOOD).get_json()
    with engine.begin() as conn:
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'retry', attempts = 1, "
                             "available_at = now() + interval '10 minutes', "
                             "created_at = now() - interval '2 minutes'"))
    r = api.post("/verifications/resend", {"user_id": "u-9"})
    assert r.status_code == 202
    assert r.get_json()["id"] == first["id"] and r.get_json()["reused"] is True
    assert count_jobs(engine) == 1
    with engine.connect() as conn:
        job = conn.execute(sa.text("SELECT available_at <= now() AS due, payload "
                                   "FROM delivery_jobs")).mappings().one()
    assert job["due"] and job["payload"]["resends"] == 1 and job["payload"]["resent_at"]
    [entry] = resend_entries(engine)
    assert entry["details"]["reused"] is True and entry["actor"].endswith("(token 1)")
    # The reuse restarts the cooldown: a second click at once is refused.
    assert api.post("/verifications/resend", {"user_id": "u-9"}).status_code == 429


def test_unknown_user_is_404_naming_the_field(api: Api) -> None:
    r = api.post("/verifications/resend", {"user_id": "nobody"})
    assert r.status_code == 404
    assert r.get_json()["error"]["fields"] == {"user_id": "unknown user"}


@pytest.mark.parametrize("payload", [{}, {"user_id": None}, {"user_id": 2.5},
                                     {"user_id": ""}, {"user_id": {"id": 1}}])
def test_resend_bad_user_id_is_422(api: Api, payload: dict[str, Any]) -> None:
    r = api.post("/verifications/resend", payload)
    assert r.status_code == 422
    assert list(r.get_json()["error"]["fields"]) == ["user_id"]


def test_resend_malformed_json_is_400(api: Api) -> None:
    r = api.client.post("/api/v1/verifications/resend", data=b"{", headers=api.headers,
                        content_type="application/json")
    assert r.status_code == 400


def test_resend_to_a_suppressed_address_is_refused_clearly(api: Api, engine: sa.Engine) -> None:
    api.post("/verifications", GOOD)
    age_jobs(engine, created="5 minutes", finished="5 minutes", status="bounced")
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO suppressions (email, reason) "
                             "VALUES ('grace@example.org', 'bounced')"))
    r = api.post("/verifications/resend", {"user_id": "u-9"})
    assert r.status_code == 409
    assert "suppression list" in r.get_json()["error"]["message"]
    assert count_jobs(engine) == 1


def test_cooldown_setting_is_honoured(engine: sa.Engine, sink: Any,
                                      config_for: Callable[..., Config],
                                      support: dict[str, Any]) -> None:
    api = api_with(engine, config_for(sink.port, RESEND_COOLDOWN="0"), support["token"])
    first = api.post("/verifications", GOOD).get_json()
    r = api.post("/verifications/resend", {"user_id": "u-9"})
    assert r.status_code == 202 and r.get_json()["id"] == first["id"]
    strict = api_with(engine, config_for(sink.port, RESEND_COOLDOWN="3600"), support["token"])
    age_jobs(engine, created="30 minutes", finished="30 minutes", status="sent")
    r = strict.post("/verifications/resend", {"user_id": "u-9"})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) > 1700
