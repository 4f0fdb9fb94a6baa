"""What the outgoing-event triggers (migration 0015) cost the engine's hot path.

Finishes N sending jobs the way the pool does (``workers.queue.finish``, batches of
10, one transaction each) three ways: the event trigger disabled (the baseline), enabled
with no endpoint (what every installation without event webhooks pays), and enabled with
one endpoint subscribed to ``sent`` (one delivery row queued per job).

    python -m bench.bench_event_triggers --jobs 20000
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
from workers.after_acceptance import event_queue
from workers.queue import Outcome

BATCH = 10


def _finish_all(engine: sa.Engine, broadcast_id: int) -> float:
    with engine.begin() as conn:
        jobs = queue.claim_batch(conn, "bench", 1_000_000, "example.com")
    started = time.perf_counter()
    for i in range(0, len(jobs), BATCH):
        with engine.begin() as conn:
            queue.finish(conn, "bench", [
                Outcome(j.id, j.claim_token, "sent", True, "sent", code=250, reply="250 ok",
                        stage="data_end") for j in jobs[i:i + BATCH]])
    return time.perf_counter() - started


def measure(n: int, mode: str) -> dict[str, Any]:
    with fresh_database() as url:
        engine = db.make_engine(url)
        list_id = seed_list(engine, n)
        campaign_id = make_campaign(engine, list_id)
        with engine.begin() as conn:
            broadcast_id = campaigns.send(conn, campaign_id)["broadcast_id"]
            queue.enqueue_broadcast(conn, broadcast_id)
            if mode == "disabled":
                conn.execute(sa.text("ALTER TABLE delivery_jobs "
                                     "DISABLE TRIGGER delivery_jobs_event_webhooks"))
            if mode == "one endpoint":
                event_queue.create_endpoint(conn, url="http://127.0.0.1:9/", events=["sent"],
                                            secret="whsec_MTIzNDU2Nzg5MDEy")
        elapsed = _finish_all(engine, broadcast_id)
        with engine.connect() as conn:
            queued = conn.execute(sa.text("SELECT count(*) FROM webhook_deliveries")).scalar()
        engine.dispose()
    return {"mode": mode, "jobs": n, "seconds": elapsed, "per_s": n / elapsed,
            "us_per_job": elapsed / n * 1e6, "deliveries_queued": int(queued or 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20000)
    args = parser.parse_args()
    results = [measure(args.jobs, mode) for mode in ("disabled", "no endpoint",
                                                     "one endpoint")]
    info = machine()
    print(table(f"Finishing {args.jobs:,} jobs in batches of {BATCH} ({info['cpus']} cores, "
                f"PostgreSQL {info['postgres']}, load {info['load_1m']})",
                ["event trigger", "s", "jobs/s", "µs per job", "deliveries queued"],
                [[r["mode"], f"{r['seconds']:.2f}", f"{r['per_s']:,.0f}",
                  f"{r['us_per_job']:.0f}", f"{r['deliveries_queued']:,}"] for r in results]))
    print(f"\nsaved {save('event_triggers', {'machine': info, 'results': results})}")


if __name__ == "__main__":
    main()
