"""Queue health's reads while a campaign drains, before and after the per-minute
attempt counters (migration 0035_minute_counters), side by side on one database.

Seeds ``--recipients`` subscribers, sends and enqueues one campaign, then drains it with
``--drainers`` threads that claim and finish the way the engine does (one finish statement
per ``--group`` outcomes, autocommit; one in 50 a hard bounce). After ``--warmup`` seconds
(the old reads counted the newest 90-150 s of attempts row by row, so the window must be
full), rounds alternate: a fresh process running the code of ``--before`` (a checkout of
the old code, e.g. ``git archive main | tar -x -C /tmp/before``) and one running this
checkout each call ``health.queue_health`` ``--calls`` times on a long-lived connection
(the first call, which fills the old code's per-minute cache, is not counted). Prints
p50/p95 per round with the drain rate and the 1-minute load at that moment.

With ``--trigger-cost``, instead: what the statement trigger adds to each finish
statement, from PostgreSQL's own account (EXPLAIN ANALYZE's trigger times) of the finish
statement with 1 and with 8 outcomes, ``--statements`` of each, beside the statement's
execution time and the outcome-counting trigger already on delivery_jobs.

    python -m bench.bench_minute_counters --before /tmp/before [--recipients 2000000]
        [--drainers 2] [--group 8] [--warmup 180] [--rounds 3] [--calls 20]
    python -m bench.bench_minute_counters --trigger-cost [--statements 500]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.common import fresh_database, machine, percentile, save, table
from bench.seed_subscribers import seed_subscribers
from harness.seed import make_campaign
from webapp import db
from webapp.domain import campaigns
from workers import queue
from workers.queue import finishing

HERE = Path(__file__).resolve().parent.parent

# Run in a fresh interpreter on the code of PYTHONPATH: the page's reads, timed per call.
_PAGE_READS = """
import json, sys, time
import sqlalchemy as sa
from webapp import db
from webapp.domain import health
from workers.core.settings import load
url, calls = sys.argv[1], int(sys.argv[2])
engine = db.make_engine(url, pool_size=1)
config = load({"DATABASE_URL": url, "SECRET_KEY": "bench"})
times = []
with engine.connect() as conn:
    for i in range(calls + 1):
        started = time.perf_counter()
        stats = health.queue_health(conn, config)
        conn.rollback()
        if i:
            times.append((time.perf_counter() - started) * 1000)
print(json.dumps({"ms": times, "sent_hour": sum(p["sent"] for p in stats["chart"])}))
"""


class Drain:
    """Threads claiming and finishing the campaign's jobs as the engine does."""

    def __init__(self, engine: sa.Engine, threads: int, group: int) -> None:
        self.engine = engine
        self.group = group
        self.finished = 0
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(f"bench-{i}",), daemon=True)
                        for i in range(threads)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(60)

    def _run(self, worker: str) -> None:
        autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        with autocommit.connect() as finishing:
            while not self.stopping.is_set():
                with self.engine.begin() as conn:
                    jobs = queue.claim_batch(conn, worker, 400, "example.com")
                if not jobs:
                    return
                outcomes = [queue.Outcome(j.id, j.claim_token, "bounced", True,
                                          "hard_bounce", code=550, reply="550 5.1.1 no")
                            if j.id % 50 == 0 else
                            queue.Outcome(j.id, j.claim_token, "sent", True, "sent",
                                          code=250, reply="250 ok") for j in jobs]
                for i in range(0, len(outcomes), self.group):
                    queue.finish(finishing, worker, outcomes[i:i + self.group])
                with self._lock:
                    self.finished += len(outcomes)


def page_reads(code: Path, url: str, calls: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(code), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run([sys.executable, "-c", _PAGE_READS, url, str(calls)], env=env,
                         cwd=code, capture_output=True, text=True, check=True, timeout=600)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def recent_attempts(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM job_attempts WHERE started_at >= now() - interval '150 s'"
        )).scalar_one())


def prepare(url: str, recipients: int) -> sa.Engine:
    engine = db.make_engine(url, pool_size=8)
    started = time.perf_counter()
    campaign_id = make_campaign(engine, seed_subscribers(engine, recipients))
    with engine.begin() as conn:
        broadcast_id = campaigns.send(conn, campaign_id)["broadcast_id"]
    while True:
        with engine.begin() as conn:
            step = queue.enqueue_chunk(conn, broadcast_id)
        if step is None or step.done:
            break
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE delivery_jobs"))
        jobs = conn.execute(sa.text("SELECT count(*) FROM delivery_jobs")).scalar_one()
    print(f"seeded and enqueued {jobs:,} jobs in {time.perf_counter() - started:.0f} s",
          flush=True)
    return engine


def measure(args: argparse.Namespace, url: str) -> list[dict[str, Any]]:
    engine = prepare(url, args.recipients)
    drain = Drain(engine, args.drainers, args.group)
    drain.start()
    time.sleep(args.warmup)
    results = []
    try:
        for n in range(args.rounds):
            for label, code in (("before", Path(args.before)), ("after", HERE)):
                done, t0 = drain.finished, time.perf_counter()
                reads = page_reads(code, url, args.calls)
                rate = (drain.finished - done) / (time.perf_counter() - t0)
                results.append({
                    "code": label, "round": n + 1, "p50": percentile(reads["ms"], 50),
                    "p95": percentile(reads["ms"], 95), "max": max(reads["ms"]),
                    "sent_hour": reads["sent_hour"], "drain_per_s": rate,
                    "attempts_150s": recent_attempts(engine),
                    "load_1m": os.getloadavg()[0]})
                print(results[-1], flush=True)
    finally:
        drain.stop()
        with engine.connect() as conn:
            results.append({"jobs": conn.execute(sa.text(
                "SELECT count(*) FROM delivery_jobs")).scalar_one(),
                "finished": drain.finished})
        engine.dispose()
    return results


_TRIGGER_TIME = re.compile(r"Trigger (\w+(?: on \w+)?): time=([0-9.]+) calls=(\d+)")
_EXECUTION_TIME = re.compile(r"Execution Time: ([0-9.]+) ms")


def trigger_cost(statements: int) -> list[dict[str, Any]]:
    """Per group size: median ms of the finish statement and of each trigger it fires."""
    results = []
    with fresh_database() as url:
        engine = db.make_engine(url, pool_size=2)
        campaign_id = make_campaign(engine, seed_subscribers(engine, 10 * statements))
        with engine.begin() as conn:
            queue.enqueue_broadcast(conn, campaigns.send(conn, campaign_id)["broadcast_id"])
        explain = "EXPLAIN (ANALYZE) " + finishing._FINISH
        autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        for group in (1, 8):
            times: dict[str, list[float]] = {}
            with engine.begin() as conn:
                jobs = queue.claim_batch(conn, "bench", group * statements, "example.com")
            with autocommit.connect() as conn:
                driver = conn.connection.driver_connection
                assert driver is not None
                for i in range(0, len(jobs), group):
                    outcomes = [queue.Outcome(j.id, j.claim_token, "sent", True, "sent",
                                              code=250, reply="250 ok")
                                for j in jobs[i:i + group]]
                    plan = "\n".join(r[0] for r in driver.execute(explain, {
                        "outcomes": queue.finish_document(outcomes), "worker": "bench"}))
                    for name, ms, _calls in _TRIGGER_TIME.findall(plan):
                        times.setdefault(name, []).append(float(ms))
                    found = _EXECUTION_TIME.search(plan)
                    assert found, plan
                    times.setdefault("(the whole statement)", []).append(float(found[1]))
            results += [{"group": group, "what": name, "median_ms": percentile(ms, 50),
                         "p95_ms": percentile(ms, 95)} for name, ms in sorted(times.items())]
        engine.dispose()
    return results


def main_trigger_cost(statements: int) -> None:
    results = trigger_cost(statements)
    info = machine()
    print(table(f"The finish statement and its triggers, {statements} statements per group "
                f"size, PostgreSQL's EXPLAIN ANALYZE times ({info['cpus']} cores, "
                f"PostgreSQL {info['postgres']}, load {info['load_1m']})",
                ["outcomes per statement", "statement / trigger", "median ms", "p95 ms"],
                [[r["group"], r["what"], f"{r['median_ms']:.3f}", f"{r['p95_ms']:.3f}"]
                 for r in results]))
    saved = save("minute_trigger_cost", {"machine": info, "results": results})
    print(f"\nsaved {saved}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", help="a checkout of the old code")
    parser.add_argument("--trigger-cost", action="store_true",
                        help="measure the trigger's cost per finish statement instead")
    parser.add_argument("--statements", type=int, default=500)
    parser.add_argument("--recipients", type=int, default=2_000_000)
    parser.add_argument("--drainers", type=int, default=2)
    parser.add_argument("--group", type=int, default=8, help="outcomes per finish statement")
    parser.add_argument("--warmup", type=float, default=180.0, help="seconds of drain first")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    if args.trigger_cost:
        main_trigger_cost(args.statements)
        return
    if not args.before:
        parser.error("--before is required (a checkout of the old code)")
    with fresh_database() as url:
        results = measure(args, url)
    info = machine()
    totals = results.pop()
    print(table(f"Queue health's reads (health.queue_health) while {args.drainers} threads "
                f"drain a campaign of {totals['jobs']:,} jobs ({totals['finished']:,} "
                f"finished by the end; {info['cpus']} cores, PostgreSQL {info['postgres']})",
                ["code", "round", "p50 ms", "p95 ms", "max ms", "sent in the chart's hour",
                 "attempts in the last 150 s", "drain jobs/s meanwhile", "load 1m"],
                [[r["code"], r["round"], f"{r['p50']:.1f}", f"{r['p95']:.1f}",
                  f"{r['max']:.1f}", f"{r['sent_hour']:,}", f"{r['attempts_150s']:,}",
                  f"{r['drain_per_s']:,.0f}", f"{r['load_1m']:.2f}"] for r in results]))
    saved = save("minute_counters", {"machine": info, "args": vars(args), "totals": totals,
                                     "results": results})
    print(f"\nsaved {saved}")


if __name__ == "__main__":
    main()
