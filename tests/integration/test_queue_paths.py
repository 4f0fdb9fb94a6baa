"""Queue statements whose cost or correctness depends on what else is in the table, checked
against PostgreSQL's own record (its statistics views, its row locks):

- a paused campaign's backlog is not read by the claim, the alarm's oldest-due probe or
  the backlog gauge, however large it is;
- campaign completion and an inbox retry of the campaign's jobs are serialized on the
  campaign (never `sent` with pending jobs, P8), in both orders;
- an inbox retry of a job whose user already has a live job of the same kind is refused
  with 409 and a message; "retry all" retries the others and says how many it skipped;
- a resend racing a worker that finishes the job is answered, not a 500.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from harness.seed import make_campaign as make_bench_campaign
from harness.seed import seed_list
from tests.helpers import Browser, campaign_status, make_campaign, place_jobs
from webapp.domain import campaigns, inbox, queue_reads
from webapp.domain.errors import Conflict, TooMany
from workers import queue


def _tuples_read(engine: sa.Engine) -> int:
    """Index entries read from delivery_jobs so far, from pg_stat_user_indexes."""
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        return int(conn.execute(sa.text(
            "SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes "
            "WHERE relname = 'delivery_jobs'")).scalar_one())


def _reads_of(engine: sa.Engine, run: Callable[[sa.Connection], Any]) -> int:
    before = _tuples_read(engine)
    with engine.connect() as conn:
        with conn.begin() as tx:
            run(conn)
            tx.rollback()
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
        conn.commit()
    return _tuples_read(engine) - before


def _paused_campaign(engine: sa.Engine, n: int) -> int:
    list_id = seed_list(engine, n, name="paused")
    campaign_id = make_bench_campaign(engine, list_id)
    with engine.begin() as conn:
        broadcast_id = campaigns.send(conn, campaign_id)["broadcast_id"]
        queue.enqueue_broadcast(conn, broadcast_id)
        campaigns.pause(conn, campaign_id)
        conn.execute(sa.text("ANALYZE delivery_jobs"))
    return campaign_id


def test_a_paused_backlog_is_not_read_by_the_claim(engine: sa.Engine) -> None:
    _paused_campaign(engine, 20_000)
    fresh = make_campaign(engine, [f"new{i}@example.org" for i in range(10)], name="New")
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, fresh["broadcast_id"])
    claimed: list[list[queue.ClaimedJob]] = []
    reads = {
        "claim": _reads_of(engine, lambda c: claimed.append(
            queue.claim_batch(c, "probe", 10, "example.com"))),
        "oldest due": _reads_of(engine, queue_reads.oldest_due_age),
        "backlog": _reads_of(engine, queue.backlog),
    }
    print(f"\nindex entries read with a 20,000-job paused campaign ahead: {reads}")
    assert sorted(j.email for j in claimed[0]) == sorted(f"new{i}@example.org"
                                                        for i in range(10))
    assert all(n < 200 for n in reads.values()), reads


def _failed_campaign(engine: sa.Engine) -> dict[str, Any]:
    """A sending campaign whose three jobs all failed: the completer's next candidate."""
    campaign = make_campaign(engine, [f"f{i}@example.org" for i in range(3)])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
        place_jobs(conn, sa.text(
            "UPDATE delivery_jobs SET status = 'failed', attempts = 1, finished_at = now(), "
            "last_error = '550 5.7.1 no', last_error_class = 'rejected' "
            "WHERE campaign_id = :c"), {"c": campaign["id"]})
    return campaign


def _pending(engine: sa.Engine, campaign_id: int) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM delivery_jobs WHERE campaign_id = :c AND status = 'pending'"),
            {"c": campaign_id}).scalar_one())


def _in_thread(target: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def _retry_all(engine: sa.Engine, where: queue.ProblemFilter, as_of: datetime) -> None:
    with engine.begin() as conn:
        assert inbox.retry_all(conn, where, as_of, actor="admin@x")["retried"] == 3


def _complete(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        queue.complete_finished_campaigns(conn)


@pytest.mark.parametrize("first", ["retry", "completion"])
def test_completion_and_retry_are_serialized_on_the_campaign(engine: sa.Engine,
                                                            first: str) -> None:
    campaign = _failed_campaign(engine)
    where = queue.ProblemFilter(campaign_id=campaign["id"])
    as_of = datetime.now(UTC) + timedelta(seconds=1)
    with engine.connect() as conn:
        tx = conn.begin()
        if first == "retry":
            assert inbox.retry_all(conn, where, as_of, actor="admin@x")["retried"] == 3
            other = _in_thread(lambda: _complete(engine))
        else:
            queue.complete_finished_campaigns(conn)
            other = _in_thread(lambda: _retry_all(engine, where, as_of))
        time.sleep(1.0)  # the other transaction runs into our row lock meanwhile
        tx.commit()
    other.join(15)
    assert not other.is_alive()
    _complete(engine)  # whatever the completer does next
    assert _pending(engine, campaign["id"]) == 3
    assert campaign_status(engine, campaign["id"]) == "sending"  # not `sent` (P8)


def _verification_job(conn: sa.Connection, user: str, status: str, email: str) -> int:
    return int(conn.execute(sa.text("""
        INSERT INTO delivery_jobs (kind, priority, status, email, user_ref, attempts,
                                   last_error, last_error_class, finished_at)
        VALUES ('verification', 0, :status, :email, :user, 1, '550 5.7.1 no', 'rejected',
                CASE WHEN :status = 'failed' THEN now() - interval '1 minute' END)
        RETURNING id"""), {"status": status, "email": email, "user": user}).scalar_one())


def test_retry_of_a_job_whose_user_has_a_live_one(engine: sa.Engine, client: Any,
                                                  make_user: Callable[..., dict[str, Any]]
                                                  ) -> None:
    with engine.begin() as conn:
        busy = _verification_job(conn, "u-1", "failed", "one@example.org")
        _verification_job(conn, "u-1", "pending", "one@example.org")  # asked again since
        free = _verification_job(conn, "u-2", "failed", "two@example.org")
    with engine.begin() as conn, pytest.raises(Conflict, match="already has a live"):
        inbox.retry(conn, busy, actor="admin@x")
    admin = Browser(client, make_user("admin"))
    answer = admin.post(f"/inbox/{busy}/retry", follow_redirects=False)
    assert answer.status_code == 409
    assert "already has a live" in answer.get_data(as_text=True)
    where = inbox.parse_filter({"kind": "verification"})
    with engine.begin() as conn:
        result = inbox.retry_all(conn, where, datetime.now(UTC), actor="admin@x")
        states = dict(conn.execute(sa.text("SELECT id, status FROM delivery_jobs")).all())
    assert (result["retried"], result["busy"]) == (1, 1)
    assert "1 were left out because their users already have a live" in \
        inbox.describe_retry(result)
    assert states[free] == "pending" and states[busy] == "failed"


def test_a_resend_racing_a_worker_is_answered(engine: sa.Engine, config_for: Callable[..., Any],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from webapp.domain import verifications

    config = config_for(None, RESEND_COOLDOWN="60")
    with engine.begin() as conn:
        job_id = _verification_job(conn, "u-9", "pending", "nine@example.org")
        conn.execute(sa.text("UPDATE delivery_jobs SET created_at = now() - interval '1 hour' "
                             "WHERE id = :id"), {"id": job_id})
    real = queue.latest_job_for_user
    calls = []

    def latest_then_worker_finishes(*args: Any, **kwargs: Any) -> Any:
        row = real(*args, **kwargs)
        if not calls:  # a worker marks the job sent right after the support page read it
            with engine.begin() as other:
                place_jobs(other, sa.text("UPDATE delivery_jobs SET status = 'sent', "
                                      "finished_at = now() WHERE id = :id"), {"id": job_id})
        calls.append(row)
        return row

    monkeypatch.setattr(queue, "latest_job_for_user", latest_then_worker_finishes)
    with engine.begin() as conn, pytest.raises(TooMany, match="resend in"):
        verifications.resend(conn, config, "u-9", actor="support@x")
    assert len(calls) == 2  # judged again after the worker's mark
