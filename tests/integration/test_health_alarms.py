"""Queue health and alarms: the banner on every page (relay down, oldest waiting job,
failure rate, no worker), the health page with its chart, the backlog limit."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import Browser, place_jobs
from webapp import create_app
from webapp.domain import health, limits
from webapp.domain.errors import Overloaded
from workers import queue
from workers.core.settings import Config


@pytest.fixture(autouse=True)
def fresh_caches() -> None:
    health._alarm_cache.clear()


def names(engine: sa.Engine, config: Config) -> set[str]:
    with engine.connect() as conn:
        return {a.name for a in health.compute_alarms(conn, config)}


def test_each_alarm_is_raised_by_its_condition(engine: sa.Engine,
                                               config_for: Callable[..., Config]) -> None:
    config = config_for(ALARM_OLDEST_PENDING="600", ALARM_FAILURE_RATE="0.2")
    assert names(engine, config) == set()
    with engine.begin() as conn:
        queue.mark_relay_down(conn, "421 4.3.2 <going down>")
        conn.execute(sa.text("""
            INSERT INTO delivery_jobs (kind, priority, status, email, available_at)
            VALUES ('verification', 0, 'pending', 'w@example.org', now() - interval '1 hour')
        """))
    assert names(engine, config) == {"relay_down", "oldest_pending", "no_workers"}
    with engine.begin() as conn:
        queue.mark_relay_ok(conn)
        place_jobs(conn, sa.text("UPDATE delivery_jobs SET status = 'sent', finished_at = now()"))
        # 10 failed and 15 sent in the last 15 minutes: 40 % > 20 %.
        conn.execute(sa.text("""
            INSERT INTO delivery_jobs (kind, priority, status, email, finished_at)
            SELECT 'verification', 0, 'failed', 'f' || i || '@example.org', now()
              FROM generate_series(1, 10) i"""))
        conn.execute(sa.text("""
            INSERT INTO job_attempts (job_id, attempt, outcome)
            SELECT (SELECT min(id) FROM delivery_jobs), 1, 'sent' FROM generate_series(1, 15)
        """))
    assert names(engine, config) == {"failure_rate"}
    assert names(engine, config_for(ALARM_FAILURE_RATE="0.5")) == set()


def test_banner_on_every_page_escapes_the_relay_error(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    with engine.begin() as conn:
        queue.mark_relay_down(conn, "535 5.7.8 <img src=x onerror=alert(1)>")
    browser = Browser(client, make_user("marketer"))
    html = browser.get("/").get_data(as_text=True)
    assert 'data-alarm="relay_down"' in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "<img src=x" not in html


def test_health_page_shows_counts_chart_and_workers(
        client: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    minute_ago = datetime.now(UTC) - timedelta(minutes=1)
    with engine.begin() as conn:
        job = conn.execute(sa.text("""
            INSERT INTO delivery_jobs (kind, priority, status, email, finished_at)
            VALUES ('verification', 0, 'sent', 'a@example.org', now()) RETURNING id""")
        ).scalar_one()
        conn.execute(sa.text("""
            INSERT INTO job_attempts (job_id, attempt, outcome, started_at)
            SELECT :j, 1, 'sent', :t FROM generate_series(1, 7)"""), {"j": job, "t": minute_ago})
        queue.register_worker(conn, worker_id="node-a:1:abc", node="node-a", lease=30,
                              hostname="host-a", pid=1, threads=5)
    browser = Browser(client, make_user("support"))
    html = browser.get("/health/").get_data(as_text=True)
    assert '<svg class="chart"' in html and "7 sent, 0 failed" in html
    assert "node-a:1:abc" in html and "badge-ok\">live" in html
    fragment = browser.get("/health/?fragment=status").get_data(as_text=True)
    assert "<html" not in fragment and 'id="health-status"' in fragment


def test_backlog_limit_refuses_with_retry_after(engine: sa.Engine, sink: Any,
                                                config_for: Callable[..., Config],
                                                make_user: Callable[..., dict[str, Any]]) -> None:
    config = config_for(sink.port, MAX_BACKLOG="3")
    with engine.begin() as conn:
        conn.execute(sa.text("""
            INSERT INTO delivery_jobs (kind, priority, status, email)
            SELECT 'verification', 0, 'pending', 'q' || i || '@example.org'
              FROM generate_series(1, 3) i"""))
    with engine.connect() as conn, pytest.raises(Overloaded) as refused:
        limits.check_backlog(conn, config)
    assert refused.value.retry_after > 0
    app = create_app(config, engine=engine)
    app.config["TESTING"] = True
    api = Api(app.test_client(), make_user("admin")["token"])
    response = api.post("/verifications", {"user_id": "u1", "email": "u1@example.org",
                                           "verify_url": "https://app.example/v"})
    assert response.status_code == 503
    assert int(response.headers["Retry-After"]) > 0
    assert "SENDDOCK_MAX_BACKLOG" in response.get_json()["error"]["message"]


def test_jobs_under_an_expired_lease_raise_an_alarm_a_line_and_a_metric(
        client: Any, engine: sa.Engine, config_for: Callable[..., Config],
        make_user: Callable[..., dict[str, Any]]) -> None:
    """docs/design.md §15: a vanished host's jobs stay `sending` until the grace period is over;
    while they do, the lease_expired alarm, a Queue health line and senddock_in_flight (which
    counts them) and senddock_in_flight_lease_expired say so."""
    config = config_for()
    with engine.begin() as conn:
        queue.register_worker(conn, worker_id="gone:7:abc", node="gone", hostname="host-b",
                              pid=7, threads=2, lease=30)
        conn.execute(sa.text("""
            INSERT INTO delivery_jobs (kind, priority, status, email, claimed_by, claim_token,
                                       claimed_at)
            SELECT 'verification', 0, 'sending', 's' || i || '@example.org', 'gone:7:abc',
                   gen_random_uuid(), now() FROM generate_series(1, 3) i"""))
    assert "lease_expired" not in names(engine, config)  # its lease still runs
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE workers SET lease_until = now() - interval '20 seconds'"))
    assert "lease_expired" in names(engine, config)
    admin = make_user("admin")
    html = Browser(client, admin).get("/health/").get_data(as_text=True)
    assert 'id="lease-expired"' in html and "lease expired" in html
    metrics = client.get("/metrics", headers={"Authorization": f"Bearer {admin['token']}"}
                         ).get_data(as_text=True)
    assert "\nsenddock_in_flight 3.0" in metrics
    assert "\nsenddock_in_flight_lease_expired 3.0" in metrics
    assert 'senddock_alarm{name="lease_expired"} 1.0' in metrics
    with engine.begin() as conn:  # taken back: the alarm goes
        queue.take_back(conn, me="someone-else", grace=10)
        assert conn.execute(sa.text(
            "SELECT count(*) FROM delivery_jobs WHERE status = 'pending'")).scalar_one() == 3
    health._alarm_cache.clear()
    assert "lease_expired" not in names(engine, config)
