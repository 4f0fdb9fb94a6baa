"""What transactional kinds cost the engine (docs/design.md §21): the outcome-counter trigger of
migration 0014 on the finish path, and the dedupe window (the gist exclusion constraint)
on the enqueue path.

- finish: N claimed campaign jobs finished as the pool does (``finish_batch``, batches of
  10), with ``delivery_jobs_outcomes`` disabled and enabled, alternated twice (the noise);
- enqueue: N onboarding messages inserted one per transaction by
  ``queue.enqueue`` (one ask each) with no dedupe window (no row in the gist index) and with one.

    python -m bench.bench_kind_costs --jobs 10000
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import sqlalchemy as sa

from bench.bench_event_triggers import _finish_all
from bench.common import fresh_database, machine, save, table
from harness.seed import make_campaign, seed_list
from webapp import db
from webapp.domain import campaigns
from workers import queue


def finish(n: int, enabled: bool) -> dict[str, Any]:
    with fresh_database() as url:
        engine = db.make_engine(url)
        campaign_id = make_campaign(engine, seed_list(engine, n))
        with engine.begin() as conn:
            broadcast_id = campaigns.send(conn, campaign_id)["broadcast_id"]
            queue.enqueue_broadcast(conn, broadcast_id)
            if not enabled:
                conn.execute(sa.text("ALTER TABLE delivery_jobs "
                                     "DISABLE TRIGGER delivery_jobs_outcomes"))
        elapsed = _finish_all(engine, broadcast_id)
        with engine.connect() as conn:
            counted = conn.execute(sa.text("SELECT coalesce(sum(n), 0) FROM job_outcome_counts"
                                           )).scalar_one()
        engine.dispose()
    return {"what": f"finish, outcome trigger {'on' if enabled else 'off'}", "n": n,
            "seconds": elapsed, "us": elapsed / n * 1e6, "check": f"{int(counted):,} counted"}


def enqueue_jobs(n: int, window: int) -> dict[str, Any]:
    with fresh_database() as url:
        engine = db.make_engine(url)
        payload = {"data": {"first_name": "Ada"}, "event": {"name": "signup", "id": "evt"}}
        started = time.perf_counter()
        for i in range(n):
            with engine.begin() as conn:
                assert queue.enqueue_one(conn, queue.Ask(
                    "verification", f"u{i}@example.org", 0, payload, user_ref=f"u{i}",
                    dedupe_window=window), actor=None).outcome == "new"
        elapsed = time.perf_counter() - started
        engine.dispose()
    return {"what": f"enqueue, dedupe window {window} s", "n": n, "seconds": elapsed,
            "us": elapsed / n * 1e6, "check": ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10000)
    args = parser.parse_args()
    before = machine()
    results = [finish(args.jobs, on) for on in (False, True, False, True)]
    results += [enqueue_jobs(args.jobs, w) for w in (0, 86400, 0, 86400)]
    after = machine()
    print(table(f"Kinds' costs, {args.jobs:,} jobs each ({before['cpus']} cores, PostgreSQL "
                f"{before['postgres']}, load {before['load_1m']} -> {after['load_1m']})",
                ["what", "s", "µs per job", "check"],
                [[r["what"], f"{r['seconds']:.2f}", f"{r['us']:.0f}", r["check"]]
                 for r in results]))
    print(f"\nsaved {save('kind_costs', {'machine': before, 'results': results})}")


if __name__ == "__main__":
    main()
