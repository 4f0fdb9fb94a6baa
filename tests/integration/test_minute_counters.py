"""Per-minute attempt counters (migration 0035_minute_counters): the statement
trigger on job_attempts keeps attempt_minutes equal to a row-by-row count, whatever mix of
finishes wrote the attempts; Queue health reads them and shows what the row count says;
the counters are pruned in bounded batches, and Maintenance prunes them and rate_minutes."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from tests.helpers import Browser, make_campaign
from webapp import db
from webapp.domain import health
from workers import queue
from workers.core import pg
from workers.delivery.maintenance import Maintenance
from workers.queue import rate_limit

# The row-by-row count the page made before the counters (and a reference for them).
ROW_COUNT = """
SELECT date_trunc('minute', a.started_at) AS minute, coalesce(a.kind, j.kind) AS kind,
       a.outcome, count(*) AS n
  FROM job_attempts a JOIN delivery_jobs j ON j.id = a.job_id
 GROUP BY 1, 2, 3
"""
COUNTERS = "SELECT minute, kind, outcome, sum(n) AS n FROM attempt_minutes GROUP BY 1, 2, 3"


@pytest.fixture(autouse=True)
def fresh_caches() -> None:
    health._alarm_cache.clear()


def counted(engine: sa.Engine, sql: str) -> dict[tuple[datetime, str, str], int]:
    with engine.connect() as conn:
        return {(r.minute, r.kind, r.outcome): int(r.n) for r in conn.execute(sa.text(sql))}


def claimed(engine: sa.Engine, n: int) -> list[queue.ClaimedJob]:
    campaign = make_campaign(engine, [f"r{i}@example.net" for i in range(n)])
    with engine.begin() as conn:
        assert queue.enqueue_broadcast(conn, campaign["broadcast_id"]) is not None
        return queue.claim_batch(conn, "test-worker", n, "example.com")


def outcome(job: queue.ClaimedJob, i: int, started_at: datetime | None = None
            ) -> queue.Outcome:
    """Sent, hard bounce, transient (retried), or a relay outage that is no attempt."""
    if i % 7 == 3:
        return queue.Outcome(job.id, job.claim_token, "bounced", True, "hard_bounce",
                             code=550, reply="550 5.1.1 no such user", started_at=started_at)
    if i % 7 == 5:
        return queue.Outcome(job.id, job.claim_token, "retry", True, "transient", delay=60,
                             code=451, reply="451 try later", started_at=started_at)
    if i % 7 == 6:
        return queue.Outcome(job.id, job.claim_token, "pending", False, None,
                             started_at=started_at)
    return queue.Outcome(job.id, job.claim_token, "sent", True, "sent", code=250,
                         reply="250 ok", started_at=started_at)


def finish(engine: sa.Engine, outcomes: list[queue.Outcome], group: int) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for i in range(0, len(outcomes), group):
            part = outcomes[i:i + group]
            assert len(queue.finish(conn, "test-worker", part)) == len(part)


def test_counters_equal_a_row_count_after_single_and_multi_row_finishes(
        engine: sa.Engine) -> None:
    jobs = claimed(engine, 60)
    now = datetime.now(UTC)
    # Three minutes of attempts: some finished one by one, some eight to a statement.
    outcomes = [outcome(j, i, now - timedelta(minutes=i % 3)) for i, j in enumerate(jobs)]
    finish(engine, outcomes[:20], group=1)
    finish(engine, outcomes[20:], group=8)
    with engine.begin() as conn:  # by hand, without the kind: counted under its job's
        conn.execute(sa.text("""
            INSERT INTO job_attempts (job_id, attempt, outcome, started_at)
            SELECT :job, 2, 'sent', now() - interval '2 minutes' FROM generate_series(1, 5)
        """), {"job": jobs[0].id})
    expected = counted(engine, ROW_COUNT)
    assert sum(expected.values()) == 60 - len(range(6, 60, 7)) + 5
    assert {kind for _m, kind, _o in expected} == {"broadcast"}
    assert len({minute for minute, _k, _o in expected}) == 3
    assert counted(engine, COUNTERS) == expected


def _same_slot_sessions(engine: sa.Engine) -> tuple[sa.Connection, sa.Connection]:
    """Two sessions whose backends write the same counter slot (pid % 8): of nine, two
    share one."""
    by_slot: dict[int, sa.Connection] = {}
    for _ in range(9):
        conn = engine.connect()
        slot = conn.execute(sa.text("SELECT pg_backend_pid() % 8")).scalar_one()
        if slot in by_slot:
            first = by_slot.pop(slot)
            for other in by_slot.values():
                other.close()
            first.commit()
            conn.commit()
            return first, conn
        by_slot[slot] = conn
    raise AssertionError("no two sessions of the same slot")


def test_concurrent_finishes_of_the_same_minute_row_wait_and_add_up(
        engine: sa.Engine) -> None:
    """Two sessions upsert the same (minute, kind, outcome, slot) row: the second waits
    for the first's commit and adds to it (no unique violation, no lost count)."""
    jobs = claimed(engine, 10)
    first, second = _same_slot_sessions(engine)
    insert = sa.text("""
        INSERT INTO job_attempts (job_id, kind, attempt, outcome, started_at)
        SELECT id, 'broadcast', 1, outcome, date_trunc('minute', now())
          FROM unnest(CAST(:ids AS bigint[])) id,
               unnest(CAST(:outcomes AS text[])) outcome""")
    ids = [j.id for j in jobs]
    first.execute(insert, {"ids": ids[:5], "outcomes": ["sent", "transient"]})
    pid = second.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
    errors: list[BaseException] = []

    def later() -> None:
        try:  # the same rows, named in the other order
            second.execute(insert, {"ids": ids[5:], "outcomes": ["transient", "sent"]})
            second.commit()
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=later)
    thread.start()
    with engine.connect() as watcher:
        deadline = time.monotonic() + 10
        while watcher.execute(sa.text(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": pid}).scalar() != "Lock":
            assert time.monotonic() < deadline, "the second session never waited"
            time.sleep(0.02)
    first.commit()
    thread.join(10)
    first.close()
    second.close()
    assert not errors and not thread.is_alive()
    counters = counted(engine, COUNTERS)
    assert sorted(counters.values()) == [10, 10]
    assert counters == counted(engine, ROW_COUNT)


def test_finishers_in_two_sessions_at_once_keep_the_counts_exact(engine: sa.Engine) -> None:
    jobs = claimed(engine, 400)
    outcomes = [outcome(j, i) for i, j in enumerate(jobs)]
    threads = [threading.Thread(target=finish, args=(engine, outcomes[k::2], 1 + 7 * k))
               for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert counted(engine, COUNTERS) == counted(engine, ROW_COUNT)


def test_queue_health_shows_what_a_row_count_says(
        engine: sa.Engine, client: Any, make_user: Any) -> None:
    jobs = claimed(engine, 90)
    now = datetime.now(UTC)
    outcomes = [outcome(j, i, now - timedelta(minutes=i % 20)) for i, j in enumerate(jobs)]
    finish(engine, outcomes, group=8)
    per_minute: dict[datetime, dict[str, int]] = {}
    window: dict[tuple[str, str], int] = {}
    since = (now - health.WINDOW).replace(second=0, microsecond=0)
    for (minute, kind, outcome_class), n in counted(engine, ROW_COUNT).items():
        shown = per_minute.setdefault(minute, {"sent": 0, "failed": 0})
        shown["sent" if outcome_class == "sent" else "failed"] += n
        if minute >= since:
            window[(kind, outcome_class)] = window.get((kind, outcome_class), 0) + n
    with engine.connect() as conn:
        chart = health.sent_per_minute(conn)
        assert health.attempts_in_window(conn) == window
    assert len(chart) == 60
    assert {p["minute"]: {"sent": p["sent"], "failed": p["failed"]}
            for p in chart if p["sent"] or p["failed"]} == per_minute
    sent = sum(m["sent"] for m in per_minute.values())
    failed = sum(m["failed"] for m in per_minute.values())
    assert (sent, failed) == (sum(1 for o in outcomes if o.reply_class == "sent"),
                              sum(1 for o in outcomes if o.reply_class in (
                                  "hard_bounce", "transient")))
    html = Browser(client, make_user("support")).get("/health/").get_data(as_text=True)
    for minute, shown in per_minute.items():  # each bar's title
        assert f"{minute:%H:%M} UTC: {shown['sent']} sent, {shown['failed']} failed" in html


def test_pruning_deletes_old_minutes_in_bounded_batches(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("""
            INSERT INTO attempt_minutes (minute, kind, outcome, slot, n)
            SELECT date_trunc('minute', now()) - m * interval '1 minute', 'broadcast', 'sent',
                   s, 1
              FROM generate_series(0, 179) m, generate_series(0, 1) s"""))
    kept = queue.MINUTES_KEPT
    old = 2 * (180 - int(kept / timedelta(minutes=1)))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        assert conn.execute(rate_limit._PRUNE_MINUTES, {"kept": kept.total_seconds(),
                                                   "batch": 7}).rowcount == 7
        assert queue.prune_minutes(conn, batch=7) == old - 7
        left = conn.execute(sa.text(
            "SELECT count(*), min(minute) FROM attempt_minutes")).one()
    assert left[0] == 2 * 180 - old
    assert left[1] >= datetime.now(UTC) - kept - timedelta(minutes=1)
    assert health.CHART <= kept  # the chart never asks for a pruned minute


def test_maintenance_prunes_counters_at_its_first_tick_and_then_hourly(
        engine: sa.Engine) -> None:
    """rate_minutes grew forever (prune_rate_minutes was never called): Maintenance prunes
    it and attempt_minutes on its first tick, and again once an hour has passed."""
    def add_old_rows() -> None:
        with engine.begin() as conn:
            conn.execute(sa.text("""
                INSERT INTO rate_minutes (minute, used)
                SELECT date_trunc('minute', now()) - m * interval '1 hour', 3
                  FROM generate_series(0, 30) m ON CONFLICT (minute) DO NOTHING"""))
            conn.execute(sa.text("""
                INSERT INTO attempt_minutes (minute, kind, outcome, slot, n)
                SELECT date_trunc('minute', now()) - m * interval '1 hour', 'broadcast',
                       'sent', 0, 1
                  FROM generate_series(0, 5) m ON CONFLICT DO NOTHING"""))

    def rows() -> tuple[int, int]:
        with engine.connect() as conn:
            return (conn.execute(sa.text("SELECT count(*) FROM rate_minutes")).scalar_one(),
                    conn.execute(sa.text("SELECT count(*) FROM attempt_minutes")).scalar_one())

    add_old_rows()
    assert rows() == (31, 6)
    maintenance = Maintenance(engine, pg.Outage("test", logging.getLogger("test")),
                              threading.Event())
    maintenance.run()
    assert rows() == (25, 2)  # rate: the last 25 hours; attempts: queue.MINUTES_KEPT
    add_old_rows()
    maintenance.run()  # within the hour: nothing pruned
    assert rows() == (31, 6)
    maintenance._prune_at = time.monotonic()  # an hour later
    maintenance.run()
    assert rows() == (25, 2)


def test_the_upgrade_counts_the_last_hours_and_the_downgrade_removes_the_counters(
        db_url: str, engine: sa.Engine) -> None:
    jobs = claimed(engine, 30)
    with engine.connect() as conn:
        config = db.alembic_config(db_url)
        config.attributes["connection"] = conn
        command.downgrade(config, "0034_trigger_plans")
        conn.commit()
        assert conn.execute(sa.text(
            "SELECT to_regclass('attempt_minutes')")).scalar() is None
    now = datetime.now(UTC)
    outcomes = [outcome(j, i, now - timedelta(minutes=7 * i)) for i, j in enumerate(jobs)]
    finish(engine, outcomes, group=4)  # up to 3.5 hours ago, without any trigger
    db.upgrade(db_url)
    engine.dispose()
    horizon = (now - timedelta(hours=3)).replace(second=0, microsecond=0)
    expected = {k: n for k, n in counted(engine, ROW_COUNT).items() if k[0] >= horizon}
    assert 0 < len(expected) < len(counted(engine, ROW_COUNT))
    assert counted(engine, COUNTERS) == expected
