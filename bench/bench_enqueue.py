"""Enqueue: how long the send request takes, and recipients per second for the set-based
enqueue, for 100k and 1M-recipient broadcasts.

The send request (POST /api/v1/campaigns/{id}/send through the Flask app, bearer token)
records the broadcast and returns; a worker then enqueues the audience in one statement,
timed here on its own.

    python -m bench.bench_enqueue --sizes 100000,1000000
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import sqlalchemy as sa

from bench.common import fresh_database, machine, percentile, save, table
from harness.seed import make_campaign, seed_list
from webapp import create_app, db
from webapp.domain import users
from workers import queue
from workers.core.settings import load
from workers.core.states import PENDING


def measure(size: int) -> dict[str, Any]:
    with fresh_database() as url:
        engine = db.make_engine(url)
        list_id = seed_list(engine, size)
        with engine.begin() as conn:
            user = users.create_user(conn, "bench@example.com", "benchmark-password", "admin")
            token = users.create_token(conn, user["id"])
        app = create_app(load({"DATABASE_URL": url, "SECRET_KEY": "bench"}), engine=engine)
        client = app.test_client()
        headers = {"Authorization": f"Bearer {token}"}
        latencies = []
        broadcast_id = None
        for _ in range(5):  # five campaigns to the same 'size' list: p50 of the request
            campaign_id = make_campaign(engine, list_id)
            t0 = time.perf_counter()
            response = client.post(f"/api/v1/campaigns/{campaign_id}/send", headers=headers)
            latencies.append((time.perf_counter() - t0) * 1000)
            assert response.status_code == 202, response.get_json()
            broadcast_id = broadcast_id or response.get_json()["broadcast_id"]
        t0 = time.perf_counter()
        with engine.begin() as conn:
            summary = queue.enqueue_broadcast(conn, broadcast_id)
        elapsed = time.perf_counter() - t0
        assert summary is not None and summary["total"] == size
        with engine.connect() as conn:
            t1 = time.perf_counter()
            counts = queue.broadcast_counts(conn, broadcast_id)
            count_ms = (time.perf_counter() - t1) * 1000
            assert counts[PENDING] == size
            size_mb = conn.execute(sa.text(
                "SELECT pg_total_relation_size('delivery_jobs') / 1048576.0")).scalar_one()
        engine.dispose()
    return {"size": size, "send_request_ms_p50": percentile(latencies, 50),
            "send_request_ms_max": max(latencies), "enqueue_s": elapsed,
            "enqueue_per_s": size / elapsed, "counts_ms": count_ms,
            "jobs_table_mb": float(size_mb)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100000,1000000")
    args = parser.parse_args()
    results = [measure(int(s)) for s in args.sizes.split(",")]
    info = machine()
    print(table(f"Enqueue ({info['cpus']} cores, PostgreSQL {info['postgres']}, "
                f"load {info['load_1m']})",
                ["recipients", "send request p50 ms", "max ms", "enqueue s", "recipients/s",
                 "exact counts ms", "jobs table MB"],
                [[f"{r['size']:,}", f"{r['send_request_ms_p50']:.1f}",
                  f"{r['send_request_ms_max']:.1f}", f"{r['enqueue_s']:.2f}",
                  f"{r['enqueue_per_s']:,.0f}", f"{r['counts_ms']:.2f}",
                  f"{r['jobs_table_mb']:.0f}"] for r in results]))
    print(f"\nsaved {save('enqueue', {'machine': info, 'results': results})}")


if __name__ == "__main__":
    main()
