"""Accepted mail goes out before more is accepted (P7 on a busy machine): a claim tells how
long each job had been due (``waited``); the pool is *behind* while the transactional mail
it claims had waited more than BEHIND_LAG; and while it is, the API's intake endpoints wait
PACE seconds before they take more mail, which lets the delivery threads have the CPU
(measured in bench/bench_api.py: docs/performance.md, "The transactional API")."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api
from webapp import context
from workers import queue
from workers.delivery import pool as pool_module
from workers.delivery.pool import Pool


def _verification(api: Api, user: str) -> int:
    response = api.post("/messages", {"kind": "verification", "user_id": user,
                                      "email": f"{user}@example.org",
                                      "data": {"verify_url": "https://app.example/v/1"}})
    assert response.status_code == 202, response.get_json()
    return int(response.get_json()["id"])


def test_a_claim_says_how_long_each_job_was_due(engine: sa.Engine, api: Api) -> None:
    late = _verification(api, "late")
    fresh = _verification(api, "fresh")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE delivery_jobs SET available_at = now() - interval '3 s'"
                             " WHERE id = :id"), {"id": late})
    with engine.begin() as conn:
        jobs = {j.id: j for j in queue.claim_batch(conn, "w-pace", 10, "example.com")}
    assert 3.0 <= jobs[late].waited < 60
    assert 0.0 <= jobs[fresh].waited < jobs[late].waited


def _job(kind: str, waited: float, priority: int = 0) -> queue.ClaimedJob:
    return queue.ClaimedJob(id=1, kind=kind, email="a@example.org", claim_token="t",
                            attempts=0, correlation_id="c", message_id="<m@x>",
                            campaign_id=None, subscriber_id=None, broadcast_id=None,
                            user_ref="u", payload={}, suppressed=False, waited=waited,
                            priority=priority)


def test_the_pool_is_behind_while_claimed_verification_mail_waited_too_long(
        engine: sa.Engine, config_for: Any) -> None:
    pool = Pool(engine, config_for())
    assert not pool.behind()
    late = pool_module.BEHIND_LAG + 0.5
    pool._note_lag([_job("verification", 0.01), _job("verification", late)], asked=10)
    assert pool.behind()
    # Campaign mail waits by design: it never makes the pool behind, and a full batch of
    # it says nothing about the transactional mail.
    pool._note_lag([_job("broadcast", 3600.0)] * 10, asked=10)
    assert pool.behind()
    # A claim that found less than it asked for, none of it transactional: caught up.
    pool._note_lag([_job("broadcast", 3600.0)], asked=10)
    assert not pool.behind()
    pool._note_lag([_job("verification", late)], asked=10)
    assert pool.behind()
    pool._note_lag([_job("verification", 0.0)], asked=10)
    assert not pool.behind()


class _Pool:
    def __init__(self, behind: bool) -> None:
        self.is_behind = behind

    def behind(self) -> bool:
        return self.is_behind


@pytest.mark.parametrize("path, body", [
    ("/messages", {"kind": "verification", "user_id": "p1", "email": "p1@example.org",
                   "data": {"verify_url": "https://app.example/v/1"}}),
    ("/messages/batch", {"messages": [{"kind": "verification", "user_id": "p2",
                                       "email": "p2@example.org",
                                       "data": {"verify_url": "https://app.example/v/2"}}]}),
    ("/verifications", {"user_id": "p3", "email": "p3@example.org",
                        "verify_url": "https://app.example/v/3"}),
])
def test_intake_waits_while_delivery_is_behind(
        app: Any, api: Api, monkeypatch: pytest.MonkeyPatch, path: str,
        body: dict[str, Any]) -> None:
    waits: list[float] = []
    monkeypatch.setattr(context.time, "sleep", waits.append)
    ext = app.extensions["senddock"]
    ext.pool = _Pool(behind=False)
    assert api.post(path, body).status_code in (202, 207)
    assert waits == []
    ext.pool = _Pool(behind=True)
    response = api.post(path, {**body, "user_id": "again", "email": "again@example.org"}
                        if "user_id" in body else body)
    assert response.status_code in (202, 207), response.get_json()
    assert waits == [context.PACE]
    # Reads never wait.
    assert api.get("/kinds").status_code == 200
    assert waits == [context.PACE]
