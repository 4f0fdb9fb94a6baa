"""/metrics parsed as Prometheus text and checked against the database; who may scrape;
/healthz."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Browser
from webapp.domain import health


@pytest.fixture(autouse=True)
def fresh_caches() -> None:
    health._alarm_cache.clear()
    health.ATTEMPTS.reset()
    health.TIME_TO_SENT.reset()


def seed(engine: sa.Engine) -> None:
    from tests.helpers import make_campaign
    from workers import queue

    campaign = make_campaign(engine, [f"c{i}@example.org" for i in range(12)])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
        conn.execute(sa.text("""
            UPDATE delivery_jobs SET status = 'sent', finished_at = created_at + interval '3 s'
             WHERE id IN (SELECT id FROM delivery_jobs ORDER BY id LIMIT 5)"""))
        conn.execute(sa.text("""
            INSERT INTO delivery_jobs (kind, priority, status, email, finished_at, created_at)
            SELECT 'verification', 0, s, 'v' || i || '@example.org',
                   CASE WHEN s = 'sent' THEN now() END, now() - interval '0.2 s'
              FROM generate_series(1, 9) i,
                   LATERAL (SELECT (ARRAY['sent', 'pending', 'failed'])[1 + i % 3] AS s) x"""))
        conn.execute(sa.text("""
            INSERT INTO job_attempts (job_id, attempt, outcome)
            SELECT id, 1, CASE WHEN status = 'sent' THEN 'sent' ELSE 'transient' END
              FROM delivery_jobs WHERE status IN ('sent', 'failed')"""))


def scrape(client: Any, token: str) -> dict[str, Any]:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.get_data(as_text=True)
    return {f.name: f for f in text_string_to_metric_families(response.get_data(as_text=True))}


def test_metrics_match_the_database(client: Any, engine: sa.Engine,
                                    make_user: Callable[..., dict[str, Any]]) -> None:
    seed(engine)
    families = scrape(client, make_user("admin")["token"])
    with engine.connect() as conn:
        truth = {(r.kind, r.status): r.n for r in conn.execute(sa.text(
            "SELECT kind, status, count(*) AS n FROM delivery_jobs GROUP BY 1, 2"))}
        attempts = {(r.kind, r.outcome): r.n for r in conn.execute(sa.text("""
            SELECT j.kind, a.outcome, count(*) AS n FROM job_attempts a
              JOIN delivery_jobs j ON j.id = a.job_id GROUP BY 1, 2"""))}
    jobs = {(s.labels["kind"], s.labels["state"]): s.value
            for s in families["senddock_jobs"].samples}
    assert {k: v for k, v in jobs.items() if v} == truth
    window = {(s.labels["kind"], s.labels["class"]): s.value
              for s in families["senddock_attempts_15m"].samples}
    assert window == attempts
    assert families["senddock_oldest_pending_seconds"].samples[0].value >= 0
    assert families["senddock_backlog"].samples[0].value == truth[("broadcast", "pending")] \
        + truth[("verification", "pending")]
    ttsent = {(s.name, s.labels["kind"], s.labels.get("le")): s.value
              for s in families["senddock_time_to_sent_seconds"].samples}
    gcount = {s.labels["kind"]: s.value
              for s in families["senddock_time_to_sent_seconds_gcount"].samples}
    gsum = {s.labels["kind"]: s.value
            for s in families["senddock_time_to_sent_seconds_gsum"].samples}
    assert gcount == {"broadcast": 5, "verification": 3}
    assert gsum["broadcast"] == pytest.approx(15.0)
    assert ttsent[("senddock_time_to_sent_seconds_bucket", "broadcast", "2.0")] == 0
    assert ttsent[("senddock_time_to_sent_seconds_bucket", "broadcast", "5.0")] == 5
    assert ttsent[("senddock_time_to_sent_seconds_bucket", "verification", "0.5")] == 3
    assert families["senddock_relay_up"].samples[0].value == 1
    alarms = {s.labels["name"]: s.value for s in families["senddock_alarm"].samples}
    assert alarms["no_workers"] == 1 and alarms["relay_down"] == 0


def test_who_may_scrape(client: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    assert client.get("/metrics").status_code == 401
    bearer = {"Authorization": f"Bearer {make_user('marketer')['token']}"}
    assert client.get("/metrics", headers=bearer).status_code == 403
    assert client.get("/metrics", headers={"Authorization": "Bearer sd_wrong"}).status_code \
        == 401
    admin = Browser(client, make_user("admin"))
    assert admin.get("/metrics").status_code == 200


def test_healthz(client: Any) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.get_json()
    assert body["database"] == "ok" and body["relay"]["status"] == "ok"
    assert body["pool"] == "not in this process"


def test_healthz_reports_an_unreachable_database(config_for: Callable[..., Any],
                                                 sink: Any) -> None:
    from webapp import create_app, db

    dead = db.make_engine("postgresql://nobody@127.0.0.1:1/none")
    app = create_app(config_for(sink.port), engine=dead)
    response = app.test_client().get("/healthz")
    assert response.status_code == 503
    body = response.get_json()
    assert body["database"] == "unreachable" and body["status"] == "down"
    assert "127.0.0.1" not in response.get_data(as_text=True)  # status words only
