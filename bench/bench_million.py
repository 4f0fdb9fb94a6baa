"""A 1,000,000-recipient campaign from end to end on one machine: the send request, the
set-based enqueue, the drain by one `senddock worker` process (default pool) to Postfix's
smtp-sink, the worker's memory sampled throughout, and the dashboard's polling endpoints
(the campaign counter fragment and the campaigns list) timed *while* it drains.

    python -m bench.bench_million [--recipients 1000000] [--sink postfix]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from typing import Any

import psutil
import sqlalchemy as sa

from bench.bench_admin_pages import logged_in_client
from bench.common import (
    env_for,
    free_port,
    fresh_database,
    machine,
    percentile,
    save,
    sink_process,
    table,
)
from bench.seed_subscribers import seed_subscribers
from harness.seed import make_campaign
from webapp import create_app, db
from webapp.domain import campaigns, users
from workers import queue
from workers.core.settings import load
from workers.core.states import BOUNCED, FAILED, SENT


class Poller(threading.Thread):
    """Polls the dashboard fragments like a browser tab would (every 2 s, several tabs)."""

    def __init__(self, app: Any, paths: dict[str, str], interval: float) -> None:
        super().__init__(daemon=True)
        self.client = logged_in_client(app, "bench@example.com", "benchmark-password")
        self.paths = paths
        self.interval = interval
        self.samples: dict[str, list[float]] = {name: [] for name in paths}
        self.errors = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for name, path in self.paths.items():
                t0 = time.perf_counter()
                response = self.client.get(path)
                self.samples[name].append((time.perf_counter() - t0) * 1000)
                self.errors += response.status_code != 200
            self.done.wait(self.interval)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipients", type=int, default=1_000_000)
    parser.add_argument("--sink", choices=["postfix", "senddock"], default="postfix")
    args = parser.parse_args()
    info = machine()
    port = free_port()
    with fresh_database() as url, sink_process(args.sink, port):
        engine = db.make_engine(url)
        list_id = seed_subscribers(engine, args.recipients)
        campaign_id = make_campaign(engine, list_id)
        with engine.begin() as conn:
            users.create_user(conn, "bench@example.com", "benchmark-password", "marketer")
        app = create_app(load({"DATABASE_URL": url, "SECRET_KEY": "bench"}), engine=engine)
        t0 = time.perf_counter()
        with engine.begin() as conn:
            broadcast_id = campaigns.send(conn, campaign_id)["broadcast_id"]
        send_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        with engine.begin() as conn:
            total = queue.enqueue_broadcast(conn, broadcast_id)["total"]  # type: ignore[index]
        enqueue_s = time.perf_counter() - t0
        with engine.connect() as conn:
            conn.execute(sa.text("ANALYZE delivery_jobs"))

        worker = subprocess.Popen([sys.executable, "-m", "webapp", "worker"],
                                  env=env_for(url, port), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
        ps = psutil.Process(worker.pid)
        live = f"/campaigns/{campaign_id}?fragment=live"
        poller = Poller(app, {"campaign counter fragment": live,
                              "campaigns list fragment": "/campaigns/?fragment=campaigns"},
                        interval=0.5)
        poller.start()
        timeline: list[dict[str, Any]] = []
        started = time.perf_counter()
        sent = 0
        try:
            while sent < total:
                time.sleep(5)
                with engine.connect() as conn:
                    counts = queue.broadcast_counts(conn, broadcast_id)
                sent = counts[SENT] + counts[FAILED] + counts[BOUNCED]
                timeline.append({"t": round(time.perf_counter() - started),
                                 "done": sent, "rss_mb": ps.memory_info().rss / 2**20})
                if worker.poll() is not None:
                    raise RuntimeError(worker.stderr.read().decode() if worker.stderr else "")
        finally:
            poller.done.set()
            worker.terminate()
            worker.wait(60)
        elapsed = time.perf_counter() - started
        engine.dispose()

    rss = [p["rss_mb"] for p in timeline]
    third = max(1, len(rss) // 3)
    rows = [["send request", f"{send_ms:.1f} ms"],
            ["enqueue", f"{total:,} jobs in {enqueue_s:.1f} s ({total / enqueue_s:,.0f}/s)"],
            ["drain", f"{elapsed:.0f} s, {total / elapsed:,.0f} msgs/s"],
            ["worker RSS", f"first third max {max(rss[:third]):.0f} MB, last third max "
                           f"{max(rss[-third:]):.0f} MB, peak {max(rss):.0f} MB"],
            *([f"{name} (while draining)",
               f"p50 {percentile(v, 50):.1f} ms, p95 {percentile(v, 95):.1f} ms, n={len(v)}"]
              for name, v in poller.samples.items()),
            ["dashboard errors", str(poller.errors)]]
    print(table(f"1M campaign end to end ({info['cpus']} cores, {info['cpu_model']}, "
                f"PostgreSQL {info['postgres']}, load {info['load_1m']})",
                ["what", "measured"], rows))
    minutes = [timeline[i] for i in range(0, len(timeline), 12)]
    print(table("Throughput and memory over time", ["t (s)", "done", "worker RSS MB"],
                [[p["t"], f"{p['done']:,}", f"{p['rss_mb']:.0f}"] for p in minutes]))
    payload = {"machine": info, "send_ms": send_ms, "enqueue_s": enqueue_s, "total": total,
               "drain_s": elapsed, "timeline": timeline,
               "dashboard": {k: {"p50": percentile(v, 50), "p95": percentile(v, 95),
                                 "n": len(v)} for k, v in poller.samples.items()}}
    print(f"\nsaved {save('million', payload)}")


if __name__ == "__main__":
    main()
