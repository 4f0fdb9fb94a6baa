"""P7 latency: while a large campaign drains through a real ``senddock serve`` process to a
local SMTP sink, verification emails are requested through the API, spaced over the drain;
each one's latency is the time from the API's 202 to the sink accepting the message (the
sink's own timestamp, same host clock).

    python -m bench.bench_p7_latency --recipients 100000 --verifications 50 --interval 1.2

Only verifications whose 202 arrived while the campaign still had jobs waiting count: the
promise is about a transactional email *behind* a campaign.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

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
from harness.seed import make_campaign, seed_list
from webapp import db
from webapp.domain import users
from workers import queue
from workers.core.states import PENDING, RETRY, SENT


class Client:
    """The JSON API over real HTTP, with a bearer token."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.token = token

    def post(self, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(
            f"{self.base}/api/v1{path}", data=json.dumps(body or {}).encode(), method="POST",
            headers={"Authorization": f"Bearer {self.token}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())


def start_server(url: str, smtp_port: int, log: Path, command: str = "serve",
                 tree: Path | None = None, **settings: str
                 ) -> tuple[subprocess.Popen[bytes], str]:
    """``senddock serve`` (or ``web``: no delivery) on a free port, once it answers; from
    the checkout ``tree`` (default: this one)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = env_for(url, smtp_port, BASE_URL=base, **settings)
    proc = subprocess.Popen([sys.executable, "-m", "webapp", command, "--port", str(port)],
                            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            cwd=tree)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"senddock {command} exited: {log.read_text()}")
        try:
            urllib.request.urlopen(f"{base}/healthz", timeout=2).close()
            return proc, base
        except OSError:
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError(f"senddock {command} did not start within 60 s")


def waiting_jobs(engine: sa.Engine, broadcast_id: int) -> dict[str, int]:
    with engine.connect() as conn:
        return queue.broadcast_counts(conn, broadcast_id)


def sink_times(record: Path) -> dict[str, float]:
    """Recipient -> epoch seconds at which the sink accepted the message (verification only)."""
    times = {}
    for line in record.read_bytes().splitlines():
        if b"verify-" not in line:
            continue
        entry = json.loads(line)
        if "rejected" in entry:
            continue
        for rcpt in entry["rcpt_tos"]:
            times[rcpt] = datetime.fromisoformat(entry["time"]).timestamp()
    return times


def request_verifications(api: Client, engine: sa.Engine, broadcast_id: int, n: int,
                          interval: float) -> list[dict[str, Any]]:
    """Request ``n`` verifications ``interval`` seconds apart; stop early when the campaign
    has nothing left waiting (later ones would not measure P7)."""
    sent = []
    for i in range(n):
        email = f"verify-{i}@example.net"
        t0 = time.time()
        status, body = api.post("/verifications", {
            "user_id": f"bench-{i}", "email": email,
            "verify_url": f"https://app.example/verify?t={i}"})
        t202 = time.time()
        assert status == 202, body
        counts = waiting_jobs(engine, broadcast_id)
        behind = counts[PENDING] + counts[RETRY]
        sent.append({"email": email, "t_request": t0, "t_202": t202, "campaign_waiting": behind,
                     "campaign_sent": counts[SENT]})
        if behind == 0:
            break
        time.sleep(interval)
    return sent


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    smtp_port = free_port()
    record = workdir / "sink.jsonl"
    with fresh_database() as url, sink_process("senddock", smtp_port, record):
        engine = db.make_engine(url)
        campaign_id = make_campaign(engine, seed_list(engine, args.recipients))
        with engine.begin() as conn:
            admin = users.create_user(conn, "bench-admin@example.com", "bench-password-1",
                                      "admin")
            token = users.create_token(conn, admin["id"], "bench")
        server, base = start_server(url, smtp_port, workdir / "serve.log")
        try:
            api = Client(base, token)
            status, campaign = api.post(f"/campaigns/{campaign_id}/send")
            assert status == 202, campaign
            broadcast_id = campaign["broadcast_id"]
            deadline = time.monotonic() + 120
            while waiting_jobs(engine, broadcast_id)[SENT] < 1000:  # draining for real
                if time.monotonic() > deadline:
                    raise RuntimeError("the campaign did not start draining")
                time.sleep(0.2)
            drain_start, sent_start = time.time(), waiting_jobs(engine, broadcast_id)[SENT]
            requests = request_verifications(api, engine, broadcast_id, args.verifications,
                                             args.interval)
            drain_end, sent_end = time.time(), waiting_jobs(engine, broadcast_id)[SENT]
            deadline = time.monotonic() + 60
            while len(sink_times(record)) < len(requests) and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            server.terminate()
            server.wait(60)
            engine.dispose()
        accepted = sink_times(record)
    return {"requests": requests, "accepted": accepted,
            "drain_msgs_per_s": (sent_end - sent_start) / (drain_end - drain_start),
            "campaign_sent_at_end": sent_end}


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    behind = [r for r in run["requests"] if r["campaign_waiting"] > 0]
    latencies = [run["accepted"][r["email"]] - r["t_202"] for r in behind
                 if r["email"] in run["accepted"]]
    api_ms = [(r["t_202"] - r["t_request"]) * 1000 for r in behind]
    return {
        "verifications_behind_campaign": len(behind),
        "delivered": len(latencies),
        "missing": len(behind) - len(latencies),
        "latency_s": {"p50": percentile(latencies, 50), "p95": percentile(latencies, 95),
                      "max": max(latencies, default=float("nan")),
                      "min": min(latencies, default=float("nan"))},
        "api_202_ms": {"p50": percentile(api_ms, 50), "p95": percentile(api_ms, 95)},
        "campaign_waiting_min": min((r["campaign_waiting"] for r in behind), default=0),
        "drain_msgs_per_s": run["drain_msgs_per_s"],
        "campaign_sent_at_end": run["campaign_sent_at_end"],
        "p7_met": bool(latencies) and percentile(latencies, 95) <= 1.0
        and len(latencies) == len(behind),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipients", type=int, default=100_000)
    parser.add_argument("--verifications", type=int, default=50)
    parser.add_argument("--interval", type=float, default=1.2,
                        help="seconds between verification requests")
    args = parser.parse_args()
    before = machine()
    with tempfile.TemporaryDirectory(prefix="senddock-p7-") as tmp:
        run = measure(args, Path(tmp))
    after = machine()
    result = summarize(run)
    lat, api = result["latency_s"], result["api_202_ms"]
    print(table(
        f"P7: verification latency (API 202 -> sink) while a {args.recipients:,}-recipient "
        f"campaign drains through `senddock serve` ({before['cpus']} cores, load "
        f"{before['load_1m']} -> {after['load_1m']})",
        ["measured", "p50 s", "p95 s", "max s", "min s", "API 202 p50/p95 ms",
         "campaign msgs/s", "campaign still waiting (min)", "P7 (p95 <= 1 s)"],
        [[f"{result['delivered']}/{result['verifications_behind_campaign']}",
          f"{lat['p50']:.3f}", f"{lat['p95']:.3f}", f"{lat['max']:.3f}", f"{lat['min']:.3f}",
          f"{api['p50']:.0f} / {api['p95']:.0f}", f"{result['drain_msgs_per_s']:,.0f}",
          f"{result['campaign_waiting_min']:,}", "met" if result["p7_met"] else "NOT met"]]))
    path = save("p7-latency", {"machine": {"before": before, "after": after},
                               "args": vars(args), "result": result,
                               "requests": run["requests"]})
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
