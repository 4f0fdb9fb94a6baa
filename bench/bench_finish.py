"""The finish statement (``workers.queue.finish``, what the finisher runs for every group
of outcomes) as a drain goes on: claims jobs and finishes them in groups of --group in
autocommit, round after round with no vacuum in between, and prints the milliseconds per
statement of each round.

Three forms: the one in workers/queue/finishing.py (the ids as an array restriction, and
the guard "still `sending`, under the same claim token" as a join condition: one
primary-key lookup per outcome); the same without the id array, as it was before the id array,
whose generic plan (100 outcomes guessed from jsonb_to_recordset) scans the whole table
with a hash join while the table is small (a new install: a few thousand jobs); and a
plain ``status = 'sending'`` restriction (the older form of the guard), which
lets the planner read delivery_jobs_sending_idx; that index keeps an entry for every job
finished since the last vacuum, so that form grows slower with the drain.

``--minute-trigger off`` disables job_attempts' per-minute counter trigger (migration
0035_minute_counters) in the bench database, to measure what it adds to each statement.

    python -m bench.bench_finish [--jobs 4000] [--rounds 4] [--group 2]
        [--minute-trigger on|off]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import sqlalchemy as sa

from bench.common import fresh_database, machine, save, table
from harness.seed import make_campaign, seed_list
from webapp import db
from webapp.domain import campaigns
from workers import queue
from workers.core.states import SENDING
from workers.queue import Outcome, finishing

ID_ARRAY = ("WHERE j.id = ANY (ARRAY(SELECT x.id FROM o x))  -- the primary key at any table "
            "size\n       AND ")
NEW_GUARD = f"CASE WHEN j.status = '{SENDING}' THEN j.claim_token END = o.token"
OLD_GUARD = f"j.status = '{SENDING}' AND j.claim_token = o.token"


def _finish(conn: sa.Connection, sql: str, jobs: list[queue.ClaimedJob]) -> None:
    driver = conn.connection.driver_connection
    assert driver is not None
    outcomes = [Outcome(j.id, j.claim_token, "sent", True, "sent", code=250, reply="250 ok",
                        stage="data_end") for j in jobs]
    driver.execute(sql, {"outcomes": queue.finish_document(outcomes), "worker": "bench"},
                   prepare=True).fetchone()


def measure(jobs: int, rounds: int, group: int,
            minute_trigger: bool = True) -> list[dict[str, Any]]:
    assert NEW_GUARD in finishing._FINISH and ID_ARRAY in finishing._FINISH
    without_array = finishing._FINISH.replace(ID_ARRAY, "WHERE ")
    forms = {"join on the primary key (now)": finishing._FINISH,
             "without the id array (older form)": without_array,
             f"status = '{SENDING}' (oldest form)": without_array.replace(NEW_GUARD,
                                                                           OLD_GUARD)}
    results: list[dict[str, Any]] = []
    for label, sql in forms.items():
        with fresh_database() as url:
            engine = db.make_engine(url)
            campaign_id = make_campaign(engine, seed_list(engine, jobs * rounds))
            with engine.begin() as conn:
                broadcast_id = campaigns.send(conn, campaign_id)["broadcast_id"]
                queue.enqueue_broadcast(conn, broadcast_id)
                conn.execute(sa.text("ALTER TABLE delivery_jobs SET (autovacuum_enabled = off)"))
                if not minute_trigger:
                    conn.execute(sa.text(
                        "ALTER TABLE job_attempts DISABLE TRIGGER job_attempts_minutes"))
            autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
            for n in range(rounds):
                with engine.begin() as conn:
                    claimed = queue.claim_batch(conn, "bench", jobs, "example.com")
                with autocommit.connect() as conn:
                    started = time.perf_counter()
                    for i in range(0, len(claimed), group):
                        _finish(conn, sql, claimed[i:i + group])
                    elapsed = time.perf_counter() - started
                statements = -(-len(claimed) // group)
                results.append({"form": label, "round": n + 1,
                                "finished_before": n * jobs,
                                "ms_per_statement": elapsed / statements * 1000})
            engine.dispose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=4000, help="jobs finished per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--group", type=int, default=2, help="outcomes per statement")
    parser.add_argument("--minute-trigger", choices=("on", "off"), default="on",
                        help="job_attempts' per-minute counter trigger")
    args = parser.parse_args()
    results = measure(args.jobs, args.rounds, args.group, args.minute_trigger == "on")
    info = machine()
    print(table(f"Finish statement, {args.group} outcomes each, {args.jobs:,} per round, no "
                f"vacuum, minute trigger {args.minute_trigger} ({info['cpus']} cores, "
                f"PostgreSQL {info['postgres']}, "
                f"load {info['load_1m']})",
                ["guard", "round", "jobs finished before", "ms per statement"],
                [[r["form"], r["round"], f"{r['finished_before']:,}",
                  f"{r['ms_per_statement']:.3f}"] for r in results]))
    print(f"\nsaved {save('finish', {'machine': info, 'args': vars(args), 'results': results})}")


if __name__ == "__main__":
    main()
