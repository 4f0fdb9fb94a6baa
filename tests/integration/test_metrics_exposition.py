"""/metrics parsed as Prometheus text and checked against the database; who may scrape;
/healthz."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Browser, place_jobs
from webapp.domain import health


@pytest.fixture(autouse=True)
def fresh_caches() -> None:
    health._alarm_cache.clear()


def seed(engine: sa.Engine) -> None:
    from tests.helpers import make_campaign
    from workers import queue

    campaign = make_campaign(engine, [f"c{i}@example.org" for i in range(12)])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
        place_jobs(conn, sa.text("""
            UPDATE delivery_jobs SET status = 'sent', finished_at = created_at + interval '3 s'
             WHERE id IN (SELECT id FROM delivery_jobs ORDER BY id LIMIT 5)"""))
        # Jobs reach their outcome by an UPDATE, as the engine's finish does (the counters
        # are kept by a trigger on status changes).
        conn.execute(sa.text("""
            INSERT INTO delivery_jobs (kind, priority, status, email, created_at)
            SELECT 'verification', 0, 'pending', 'v' || i || '@example.org',
                   now() - interval '0.2 s'
              FROM generate_series(1, 9) i"""))
        place_jobs(conn, sa.text("""
            UPDATE delivery_jobs SET status = x.s,
                   finished_at = CASE WHEN x.s = 'sent' THEN created_at + interval '0.3 s' END
              FROM (SELECT id, (ARRAY['sent', 'pending', 'failed'])[1 + (row_number() OVER
                           (ORDER BY id))::int % 3] AS s
                      FROM delivery_jobs WHERE kind = 'verification') x
             WHERE delivery_jobs.id = x.id AND x.s <> 'pending'"""))
        conn.execute(sa.text("""
            INSERT INTO job_attempts (job_id, attempt, outcome)
            SELECT id, 1, CASE WHEN status = 'sent' THEN 'sent' ELSE 'transient' END
              FROM delivery_jobs WHERE status IN ('sent', 'failed')"""))


def scrape_text(client: Any, token: str) -> str:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.get_data(as_text=True)
    return str(response.get_data(as_text=True))


def scrape(client: Any, token: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(scrape_text(client, token))}


def samples(families: dict[str, Any], family: str, name: str | None = None) -> dict[
        tuple[str, ...], float]:
    """{label values (sorted by label name): value} of one family's samples."""
    return {tuple(v for _k, v in sorted(s.labels.items())): s.value
            for s in families[family].samples if name is None or s.name == name}


def test_metrics_match_the_database(client: Any, engine: sa.Engine,
                                    make_user: Callable[..., dict[str, Any]]) -> None:
    seed(engine)
    families = scrape(client, make_user("admin")["token"])
    with engine.connect() as conn:
        truth = {(r.kind, r.status): r.n for r in conn.execute(sa.text(
            "SELECT kind, status, count(*) AS n FROM delivery_jobs GROUP BY 1, 2"))}
    jobs = {(s.labels["kind"], s.labels["state"]): s.value
            for s in families["senddock_jobs"].samples}
    assert {k: v for k, v in jobs.items() if v} == truth
    assert families["senddock_oldest_pending_seconds"].samples[0].value >= 0
    assert families["senddock_backlog"].samples[0].value == truth[("broadcast", "pending")] \
        + truth[("verification", "pending")]
    # Counters (class, kind, outcome): every terminal outcome the jobs reached.
    messages = samples(families, "senddock_messages", "senddock_messages_total")
    assert messages[("campaign", "broadcast", "sent")] == 5
    assert messages[("critical", "verification", "sent")] == 3
    assert messages[("critical", "verification", "failed")] == 3
    assert messages[("critical", "verification", "bounced")] == 0
    # A real cumulative histogram per kind and class (buckets never go down).
    buckets = samples(families, "senddock_time_to_sent_seconds",
                      "senddock_time_to_sent_seconds_bucket")
    count = samples(families, "senddock_time_to_sent_seconds",
                    "senddock_time_to_sent_seconds_count")
    total = samples(families, "senddock_time_to_sent_seconds",
                    "senddock_time_to_sent_seconds_sum")
    assert count[("campaign", "broadcast")] == 5 and count[("critical", "verification")] == 3
    assert total[("campaign", "broadcast")] == pytest.approx(15.0)
    assert buckets[("campaign", "broadcast", "2.0")] == 0
    assert buckets[("campaign", "broadcast", "5.0")] == 5
    assert buckets[("critical", "verification", "0.25")] == 0
    assert buckets[("critical", "verification", "0.5")] == 3
    assert buckets[("critical", "verification", "+Inf")] == 3
    assert families["senddock_relay_up"].samples[0].value == 1
    alarms = {s.labels["name"]: s.value for s in families["senddock_alarm"].samples}
    assert alarms["no_workers"] == 1 and alarms["relay_down"] == 0


def test_counters_only_grow(client: Any, engine: sa.Engine,
                            make_user: Callable[..., dict[str, Any]]) -> None:
    """An admin retrying failed jobs moves them back to pending: a gauge would go down, the
    counters keep what happened."""
    seed(engine)
    token = make_user("admin")["token"]
    before = samples(scrape(client, token), "senddock_messages", "senddock_messages_total")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE delivery_jobs SET status = 'pending', finished_at = NULL "
                             "WHERE status = 'failed'"))
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'failed', finished_at = now() "
                             "WHERE kind = 'verification' AND status = 'pending'"))
    after = samples(scrape(client, token), "senddock_messages", "senddock_messages_total")
    assert all(after[k] >= v for k, v in before.items())
    assert after[("critical", "verification", "failed")] == 9


def test_promtool_accepts_the_exposition(client: Any, engine: sa.Engine,
                                         make_user: Callable[..., dict[str, Any]]) -> None:
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("apt-get install prometheus (for promtool)")
    seed(engine)
    text = scrape_text(client, make_user("admin")["token"])
    result = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                            capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
    # Not even a lint warning (promtool prints those and still exits 0).
    assert result.stdout.strip() == "" and result.stderr.strip() == "", \
        result.stdout + result.stderr


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
