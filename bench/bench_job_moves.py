"""What the legal-move trigger on delivery_jobs (migration 0021_arch) costs: the same
statements with the trigger enabled and disabled, alternating round by round on one
database so the machine's load hits both alike.

- claim: ``workers.queue.claim_batch`` of 10 jobs (pending -> sending), one
  transaction each;
- finish: the finisher's statement (``finishing._FINISH``) for 2 outcomes (sending -> sent),
  autocommit;
- cancel: ``queue.cancel_broadcast`` of a whole broadcast in one statement
  (pending -> cancelled, --cancel rows): a row trigger's worst case.

Enqueueing is an INSERT, which the trigger (BEFORE UPDATE OF status) never sees.

    python -m bench.bench_job_moves [--jobs 2000] [--rounds 3] [--cancel 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import sqlalchemy as sa

from bench.common import fresh_database, machine, save, table
from harness.seed import make_campaign, seed_list
from webapp import db
from webapp.domain import campaigns
from workers import queue
from workers.core.states import CANCELLED, PENDING
from workers.queue import Outcome, finishing

TRIGGER = "delivery_jobs_legal_move"


def _broadcast(engine: sa.Engine, n: int) -> int:
    campaign_id = make_campaign(engine, seed_list(engine, n))
    with engine.begin() as conn:
        broadcast_id = int(campaigns.send(conn, campaign_id)["broadcast_id"])
        queue.enqueue_broadcast(conn, broadcast_id)
    return broadcast_id


def _finish(conn: sa.Connection, jobs: list[queue.ClaimedJob]) -> None:
    driver = conn.connection.driver_connection
    assert driver is not None
    outcomes = [Outcome(j.id, j.claim_token, "sent", True, "sent", code=250, reply="250 ok",
                        stage="data_end") for j in jobs]
    driver.execute(finishing._FINISH, {"outcomes": queue.finish_document(outcomes),
                                   "worker": "bench"}, prepare=True).fetchone()


def _round(engine: sa.Engine, jobs: int, cancel_broadcast: int) -> dict[str, float]:
    claims: list[float] = []
    claimed: list[queue.ClaimedJob] = []
    while len(claimed) < jobs:
        with engine.begin() as conn:
            started = time.perf_counter()
            batch = queue.claim_batch(conn, "bench", 10, "example.com")
            claims.append(time.perf_counter() - started)
        assert batch, "the campaign ran out of jobs"
        claimed += batch
    finishes: list[float] = []
    autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
    with autocommit.connect() as conn:
        for i in range(0, len(claimed), 2):
            started = time.perf_counter()
            _finish(conn, claimed[i:i + 2])
            finishes.append(time.perf_counter() - started)
    with engine.begin() as conn:
        started = time.perf_counter()
        cancelled = queue.cancel_broadcast(conn, cancel_broadcast)
        cancel = time.perf_counter() - started
    return {"claim_ms": statistics.median(claims) * 1000,
            "finish_ms": statistics.median(finishes) * 1000,
            "cancel_ms": cancel * 1000, "cancelled": cancelled}


def trigger_calls(engine: sa.Engine, broadcast_id: int) -> dict[str, int]:
    """Which triggers' functions PostgreSQL called for a cancel of the whole broadcast
    (EXPLAIN ANALYZE counts them; rolled back): the legal-move trigger's WHEN clause keeps
    its function from being called for a legal move."""
    with engine.connect() as conn, conn.begin() as tx:
        plan = conn.execute(sa.text("EXPLAIN (ANALYZE, FORMAT JSON) UPDATE delivery_jobs "
                                    f"SET status = '{CANCELLED}' WHERE broadcast_id = :b "
                                    f"AND status = '{PENDING}'"), {"b": broadcast_id}
                            ).scalar_one()
        tx.rollback()
    return {t["Trigger Name"]: int(t["Calls"]) for t in plan[0].get("Triggers", [])}


def measure(jobs: int, rounds: int, cancel: int) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    with fresh_database() as url:
        engine = db.make_engine(url)
        _broadcast(engine, jobs * rounds * 2)
        cancels = [_broadcast(engine, cancel) for _ in range(rounds * 2)]
        with engine.begin() as conn:
            conn.execute(sa.text("ANALYZE delivery_jobs"))
        calls = trigger_calls(engine, cancels[0])
        print(f"trigger functions called for {cancel:,} legal moves in one statement: {calls}")
        for n in range(rounds):
            for enabled in (True, False):
                with engine.begin() as conn:
                    switch = "ENABLE" if enabled else "DISABLE"
                    conn.execute(sa.text(f"ALTER TABLE delivery_jobs {switch} TRIGGER {TRIGGER}"))
                row = _round(engine, jobs, cancels.pop())
                results.append({"trigger": "on" if enabled else "off", "round": n + 1, **row})
        engine.dispose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000,
                        help="jobs claimed and finished per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cancel", type=int, default=20_000, help="jobs cancelled at once")
    args = parser.parse_args()
    results = measure(args.jobs, args.rounds, args.cancel)
    info = machine()
    print(table(f"Legal-move trigger: median ms per statement, {args.jobs:,} jobs per round "
                f"({info['cpus']} cores, PostgreSQL {info['postgres']}, load {info['load_1m']})",
                ["trigger", "round", "claim 10", "finish 2", f"cancel {args.cancel:,}"],
                [[r["trigger"], r["round"], f"{r['claim_ms']:.3f}", f"{r['finish_ms']:.3f}",
                  f"{r['cancel_ms']:.1f}"] for r in results]))
    for label in ("on", "off"):
        rows = [r for r in results if r["trigger"] == label]
        print(f"trigger {label}: claim {statistics.median(r['claim_ms'] for r in rows):.3f} ms, "
              f"finish {statistics.median(r['finish_ms'] for r in rows):.3f} ms, cancel "
              f"{statistics.median(r['cancel_ms'] for r in rows):.1f} ms (medians of rounds)")
    print(f"\nsaved {save('job_moves', {'machine': info, 'args': vars(args), 'results': results})}")


if __name__ == "__main__":
    main()
