"""Queue statements against a big table: the claim and the oldest-due probe with a
1,000,000-job paused campaign ahead of a new campaign that is draining, and the stats
queries (jobs per kind and state, attempts per minute) with 1,000,000 verification jobs
and 1,000,000 attempts of the last 15 minutes.

    python -m bench.bench_queue_paths [--paused 1000000] [--stats 1000000] [--repeat 50]

Each claim runs in a transaction that is rolled back, so every repetition claims the same
ten jobs. Prints p50/p95 in milliseconds and the index entries each statement read
(pg_stat_user_indexes), which is what must not grow with the paused backlog.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from bench.common import fresh_database, machine, percentile, save, table
from harness.seed import make_campaign, seed_list
from webapp import db
from webapp.domain import campaigns, queue_reads
from workers import queue
from workers.core.states import SENT
from workers.delivery.classify import ReplyClass


def _index_reads(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        return int(conn.execute(sa.text(
            "SELECT coalesce(sum(idx_tup_read), 0) FROM pg_stat_user_indexes "
            "WHERE relname IN ('delivery_jobs', 'job_attempts')")).scalar_one())


def measure(engine: sa.Engine, run: Callable[[sa.Connection], Any],
            repeat: int) -> dict[str, float]:
    """p50/p95 ms of ``run`` (rolled back each time) and index entries read per run."""
    times = []
    before = _index_reads(engine)
    with engine.connect() as conn:
        for _ in range(repeat):
            with conn.begin() as tx:
                t0 = time.perf_counter()
                run(conn)
                times.append((time.perf_counter() - t0) * 1000)
                tx.rollback()
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
        conn.commit()
    reads = (_index_reads(engine) - before) / repeat
    return {"p50_ms": percentile(times, 50), "p95_ms": percentile(times, 95),
            "index_entries_read": reads}


def seed_paused(engine: sa.Engine, n: int) -> None:
    list_id = seed_list(engine, n, name="paused")
    campaign_id = make_campaign(engine, list_id)
    with engine.begin() as conn:
        broadcast_id = campaigns.send(conn, campaign_id)["broadcast_id"]
        queue.enqueue_broadcast(conn, broadcast_id)
        campaigns.pause(conn, campaign_id)


def seed_draining(engine: sa.Engine, n: int) -> None:
    list_id = seed_list(engine, n, name="new")
    campaign_id = make_campaign(engine, list_id)
    with engine.begin() as conn:
        broadcast_id = campaigns.send(conn, campaign_id)["broadcast_id"]
        queue.enqueue_broadcast(conn, broadcast_id)


def seed_stats(engine: sa.Engine, n: int) -> None:
    """``n`` sent verification jobs, each with one attempt in the last 15 minutes."""
    with engine.begin() as conn:
        has_kind = conn.execute(sa.text(
            "SELECT count(*) FROM information_schema.columns WHERE table_name = "
            "'job_attempts' AND column_name = 'kind'")).scalar_one()
        conn.execute(sa.text(f"""
            INSERT INTO delivery_jobs (kind, priority, status, email, user_ref, attempts,
                                       finished_at)
            SELECT 'verification', 0, '{SENT}', 'v' || g || '@example.com', 'user-' || g, 1,
                   now() - random() * interval '15 minutes'
              FROM generate_series(1, :n) g"""), {"n": n})
        kind = ("kind, ", "'verification', ") if has_kind else ("", "")
        conn.execute(sa.text(f"""
            INSERT INTO job_attempts (job_id, {kind[0]}attempt, started_at, outcome, smtp_code)
            SELECT id, {kind[1]}1, finished_at, '{ReplyClass.SENT}', 250 FROM delivery_jobs
             WHERE kind = 'verification'"""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paused", type=int, default=1_000_000)
    parser.add_argument("--draining", type=int, default=10_000)
    parser.add_argument("--stats", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with fresh_database() as url:
        engine = db.make_engine(url, pool_size=3)
        t0 = time.perf_counter()
        seed_paused(engine, args.paused)
        seed_draining(engine, args.draining)
        seed_stats(engine, args.stats)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE delivery_jobs"))
            conn.execute(sa.text("VACUUM ANALYZE job_attempts"))
        print(f"seeded in {time.perf_counter() - t0:.0f} s")
        now = datetime.now(UTC)
        runs: dict[str, Callable[[sa.Connection], Any]] = {
            "claim 10 (1M paused ahead)":
                lambda c: queue.claim_batch(c, "bench", 10, "example.com"),
            "oldest due (alarm, metrics, health)": queue_reads.oldest_due_age,
            "backlog": queue.backlog,
            "jobs by kind and state (metrics, health)": queue_reads.jobs_by_kind_and_state,
            "attempts per minute, 15 min (health, metrics)":
                lambda c: queue_reads.attempts_per_minute(c, now - timedelta(minutes=15),
                                                    now + timedelta(minutes=1)),
        }
        for name, run in runs.items():
            results[name] = measure(engine, run, args.repeat)
        engine.dispose()
    info = machine()
    rows = [[name, f"{r['p50_ms']:.2f}", f"{r['p95_ms']:.2f}", f"{r['index_entries_read']:,.0f}"]
            for name, r in results.items()]
    print(table(f"Queue statements: {args.paused:,} paused jobs, {args.draining:,} draining, "
                f"{args.stats:,} verification jobs and attempts ({info['cpus']} cores, "
                f"PostgreSQL {info['postgres']}, load {info['load_1m']})",
                ["statement", "p50 ms", "p95 ms", "index entries read per call"], rows))
    saved = save("queue_paths", {"machine": info, "args": vars(args), "results": results})
    print(f"\nsaved {saved}")


if __name__ == "__main__":
    main()
