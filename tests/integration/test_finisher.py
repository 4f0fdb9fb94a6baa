"""The finisher (workers/finisher.py) against a real PostgreSQL: outcomes handed over by
many threads at once are each committed, several to a statement; a refused mark says so;
a database error reaches every outcome of its group, and the next group succeeds on a
fresh session; after stop() outcomes are committed in the caller's thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from tests.helpers import make_campaign
from workers import queue
from workers.finisher import Finisher
from workers.pool import StatementDb


def _claimed(engine: sa.Engine, n: int) -> list[queue.ClaimedJob]:
    campaign = make_campaign(engine, [f"fin{i}@example.org" for i in range(n)])
    with engine.begin() as conn:
        queue.enqueue_broadcast(conn, campaign["broadcast_id"])
    jobs: list[queue.ClaimedJob] = []
    with engine.begin() as conn:
        while batch := queue.claim_batch(conn, "w-fin", 50, "example.com"):
            jobs.extend(batch)
    assert len(jobs) == n
    return jobs


def _sent(job: queue.ClaimedJob) -> queue.Outcome:
    return queue.Outcome(job_id=job.id, claim_token=job.claim_token, status="sent",
                         counted=True, reply_class="sent", code=250, enhanced="2.0.0",
                         reply="250 2.0.0 ok", stage="data_end", duration_ms=1.0)


def _statuses(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text(
            "SELECT status, count(*) FROM delivery_jobs GROUP BY status")).all())


def test_outcomes_from_many_threads_are_each_committed_in_groups(
        engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = _claimed(engine, 200)
    statements: list[int] = []
    original = queue.finish

    def finish(conn: Connection, worker_id: str, outcomes: list[queue.Outcome]) -> set[int]:
        statements.append(len(outcomes))
        return original(conn, worker_id, outcomes)

    monkeypatch.setattr(queue, "finish", finish)
    finisher = Finisher(StatementDb(engine).connect, "w-fin")
    finisher.start()
    results: list[bool] = []
    lock = threading.Lock()

    def drain(part: list[queue.ClaimedJob]) -> None:
        for job in part:
            ok = finisher.submit(_sent(job)).result(timeout=30)
            with lock:
                results.append(ok)

    try:
        threads = [threading.Thread(target=drain, args=(jobs[i::8],)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        finisher.stop()
    assert results == [True] * 200
    assert _statuses(engine) == {"sent": 200}
    with engine.connect() as conn:
        attempts = conn.execute(sa.text("SELECT count(*) FROM job_attempts")).scalar_one()
    assert attempts == 200
    assert sum(statements) == 200
    assert len(statements) < 200, "no outcome was ever grouped with another"
    assert not finisher.alive


def test_refused_error_and_after_stop(engine: sa.Engine) -> None:
    jobs = _claimed(engine, 3)
    db = StatementDb(engine)
    opened: list[int] = []

    @contextmanager
    def first_fails() -> Iterator[Connection]:
        opened.append(1)
        if len(opened) == 1:
            raise sa.exc.OperationalError("SELECT 1", {}, Exception("database away"))
        with db.connect() as conn:
            yield conn

    finisher = Finisher(first_fails, "w-fin", sessions=1)
    finisher.start()
    try:
        with pytest.raises(sa.exc.OperationalError):
            finisher.submit(_sent(jobs[0])).result(timeout=30)
        # Handed over again (as the drain thread's retry does): a fresh session commits it.
        assert finisher.submit(_sent(jobs[0])).result(timeout=30) is True
        # The same job once more: no longer claimed under that token, so it is refused.
        assert finisher.submit(_sent(jobs[0])).result(timeout=30) is False
    finally:
        finisher.stop()
    assert not finisher.alive
    # After stop: committed at once, in this thread.
    future = finisher.submit(_sent(jobs[1]))
    assert future.done() and future.result() is True
    with engine.connect() as conn:
        left = conn.execute(sa.text(
            "SELECT email FROM delivery_jobs WHERE status = 'sending'")).scalars().all()
    assert left == [jobs[2].email]
