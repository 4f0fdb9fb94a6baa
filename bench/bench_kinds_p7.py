"""P7 with transactional kinds (docs/design.md §21): while a 100,000-recipient campaign drains
through a real ``senddock serve`` and a 50,000-message onboarding burst (class ``lifecycle``) lands
on top of it, verification emails (class ``critical``) are requested through the HTTP API;
each one's latency is the time from the API's 202 to the sink accepting it (the sink's own
timestamp, same host clock). Also reported: how the classes were served (onboarding before
the campaign), and onboarding's own time to sent.

    python -m bench.bench_kinds_p7 --recipients 100000 --onboarding 50000 --verifications 40

The onboarding burst lands in one statement that writes the rows exactly as
``POST /messages`` does (class priority, data, event, dedupe window): 50,000 reminders
coming due at the same instant. The API's own enqueue path (``messages.request``: user lock,
dedupe window, insert, audit row) is timed separately on 300 requests. Run it by hand; it is
not a test.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.bench_p7_latency import Client, start_server
from bench.common import free_port, fresh_database, machine, percentile, save, sink_process, table
from harness.seed import make_campaign, seed_list
from webapp import db
from webapp.domain import kinds, messages, users
from workers import queue
from workers.core.settings import load
from workers.core.states import PENDING, RETRY, SENT

ONBOARDING = {"class": "lifecycle", "subject": "{{ data.first_name }}, finish setting up",
              "text": "Hi {{ data.first_name }}, you signed up ({{ event.id }}).\n",
              "dedupe_window": 86400, "sample_data": {"first_name": "Ada"}}


def put_kind(base: str, token: str, name: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(f"{base}/api/v1/kinds/{name}", data=json.dumps(body).encode(),
                                 method="PUT", headers={"Authorization": f"Bearer {token}",
                                                        "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status in (200, 201)


def counts(engine: sa.Engine, broadcast_id: int) -> dict[str, int]:
    with engine.connect() as conn:
        campaign = queue.broadcast_counts(conn, broadcast_id)
        onboarding: dict[str, int] = dict(conn.execute(sa.text(
            "SELECT status, count(*) FROM delivery_jobs WHERE kind = 'onboarding' "
            "GROUP BY status")).all())
    return {"campaign_waiting": campaign[PENDING] + campaign[RETRY],
            "campaign_sent": campaign[SENT],
            "onboarding_waiting": int(onboarding.get(PENDING, 0) + onboarding.get(RETRY, 0)),
            "onboarding_sent": int(onboarding.get(SENT, 0))}


# The burst lands in one statement: rows exactly as workers.queue.enqueue writes
# them for POST /messages (class priority, payload with data/event/kind_version, dedupe
# window), the way 50,000 day-3 reminders scheduled for 09:00 all come due at once.
_BURST = sa.text(f"""
INSERT INTO delivery_jobs (kind, priority, status, email, user_ref, payload, flags,
                           requested_by, available_at, dedupe_until)
SELECT 'onboarding', :priority, '{PENDING}', 'onb-' || g || '@example.org', 'onb-' || g,
       jsonb_build_object('data', jsonb_build_object('first_name', 'U' || g),
                          'event', jsonb_build_object('name', 'signup', 'id', 'evt_' || g),
                          'kind_version', :version),
       '[]'::jsonb, 'bench', now(), now() + interval '1 day'
  FROM generate_series(1, :n) g
""")


def burst(url: str, n: int, done: dict[str, float]) -> None:
    """Make ``n`` onboarding messages due at once (and wake the workers)."""
    engine = db.make_engine(url)
    start = time.time()
    with engine.begin() as conn:
        spec = kinds.get(conn, "onboarding")
        conn.execute(_BURST, {"n": n, "priority": spec.priority, "version": spec.version})
        queue.notify_new_jobs(conn, "onboarding")
    done.update(start=start, end=time.time())
    engine.dispose()


def api_enqueue_rate(url: str, n: int = 300) -> float:
    """Messages per second through the API's own code (one thread, no HTTP)."""
    engine = db.make_engine(url)
    config = load({"DATABASE_URL": url, "SECRET_KEY": "bench-secret"})
    start = time.time()
    for i in range(n):
        with engine.begin() as conn:
            req = messages.parse_request(conn, {
                "kind": "onboarding", "user_id": f"api-{i}", "email": f"api-{i}@example.org",
                "data": {"first_name": f"A{i}"}, "event": {"name": "signup", "id": f"a{i}"}})
            messages.request(conn, config, req, actor="bench")
    rate = n / (time.time() - start)
    with engine.begin() as conn:  # out of the way of the measurement
        conn.execute(sa.text("DELETE FROM delivery_jobs WHERE user_ref LIKE 'api-%'"))
    engine.dispose()
    return rate


def sink_times(record: Path, marker: bytes) -> dict[str, float]:
    times = {}
    for line in record.read_bytes().splitlines():
        if marker not in line:
            continue
        entry = json.loads(line)
        if "rejected" in entry:
            continue
        for rcpt in entry["rcpt_tos"]:
            times[rcpt] = datetime.fromisoformat(entry["time"]).timestamp()
    return times


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
            kinds.known_names(conn)
        server, base = start_server(url, smtp_port, workdir / "serve.log")
        try:
            put_kind(base, token, "onboarding", ONBOARDING)
            enqueue_rate = api_enqueue_rate(url) if args.api_sample else 0.0
            api = Client(base, token)
            status, campaign = api.post(f"/campaigns/{campaign_id}/send")
            assert status == 202, campaign
            broadcast_id = campaign["broadcast_id"]
            deadline = time.monotonic() + 120
            while counts(engine, broadcast_id)["campaign_sent"] < 1000:
                if time.monotonic() > deadline:
                    raise RuntimeError("the campaign did not start draining")
                time.sleep(0.2)
            burst_times: dict[str, float] = {}
            loader = threading.Thread(target=burst, args=(url, args.onboarding, burst_times))
            loader.start()
            timeline, requests = [], []
            for i in range(args.verifications):
                email = f"verify-{i}@example.net"
                t0 = time.time()
                status, body = api.post("/verifications", {
                    "user_id": f"bench-{i}", "email": email,
                    "verify_url": f"https://app.example/verify?t={i}"})
                t202 = time.time()
                assert status == 202, body
                now = counts(engine, broadcast_id)
                timeline.append({"t": t202, **now})
                requests.append({"email": email, "t_request": t0, "t_202": t202, **now})
                if now["campaign_waiting"] == 0 and now["onboarding_waiting"] == 0 \
                        and not loader.is_alive():
                    break
                time.sleep(args.interval)
            loader.join()
            deadline = time.monotonic() + 60
            while len(sink_times(record, b"verify-")) < len(requests) \
                    and time.monotonic() < deadline:
                time.sleep(0.5)
            # Let onboarding finish draining, to measure its own time to sent.
            deadline = time.monotonic() + args.drain_timeout
            while counts(engine, broadcast_id)["onboarding_waiting"] and \
                    time.monotonic() < deadline:
                timeline.append({"t": time.time(), **counts(engine, broadcast_id)})
                time.sleep(2)
            final = counts(engine, broadcast_id)
            with engine.connect() as conn:
                onboarding_tts = [float(v) for v in conn.execute(sa.text(
                    "SELECT extract(epoch FROM finished_at - to_timestamp(:visible)) "
                    f"FROM delivery_jobs WHERE kind = 'onboarding' AND status = '{SENT}'"),
                    {"visible": burst_times["end"]}).scalars()]
                # From the burst's commit (when its rows became visible to the claim) to
                # the last onboarding message sent: campaign mail sent meanwhile can only be
                # the batches already claimed at that moment.
                sent_while_onboarding = conn.execute(sa.text(f"""
                    SELECT count(*) FROM delivery_jobs WHERE kind = 'broadcast'
                       AND status = '{SENT}' AND finished_at BETWEEN to_timestamp(:visible)
                       AND (SELECT max(finished_at) FROM delivery_jobs
                             WHERE kind = 'onboarding')"""),
                    {"visible": burst_times["end"]}).scalar_one()
        finally:
            server.terminate()
            server.wait(60)
            engine.dispose()
        accepted = sink_times(record, b"verify-")
    return {"requests": requests, "accepted": accepted, "timeline": timeline,
            "burst": burst_times, "final": final, "onboarding_tts": onboarding_tts,
            "campaign_sent_while_onboarding_drained": int(sent_while_onboarding),
            "api_enqueue_per_s": enqueue_rate}


def summarize(run: dict[str, Any], onboarding: int) -> dict[str, Any]:
    behind = [r for r in run["requests"]
              if r["campaign_waiting"] > 0 or r["onboarding_waiting"] > 0]
    both = [r for r in behind if r["campaign_waiting"] > 0 and r["onboarding_waiting"] > 0]
    lat = [run["accepted"][r["email"]] - r["t_202"] for r in behind if r["email"] in
           run["accepted"]]
    lat_both = [run["accepted"][r["email"]] - r["t_202"] for r in both
                if r["email"] in run["accepted"]]
    burst = run["burst"]
    tts = run["onboarding_tts"]
    return {
        "verifications_behind": len(behind), "behind_both": len(both), "delivered": len(lat),
        "latency_s": {"p50": percentile(lat, 50), "p95": percentile(lat, 95),
                      "max": max(lat, default=float("nan"))},
        "latency_behind_both_s": {"p50": percentile(lat_both, 50),
                                  "p95": percentile(lat_both, 95),
                                  "max": max(lat_both, default=float("nan"))},
        "api_202_ms_p95": percentile([(r["t_202"] - r["t_request"]) * 1000 for r in behind],
                                     95),
        "burst_insert_s": burst["end"] - burst["start"] if burst else 0,
        "onboarding_sent": len(tts),
        "onboarding_tts_s": {"p50": percentile(tts, 50), "p95": percentile(tts, 95)},
        "campaign_sent_while_onboarding_drained": run["campaign_sent_while_onboarding_drained"],
        "final": run["final"], "api_enqueue_per_s": run["api_enqueue_per_s"],
        "p7_met": bool(lat) and percentile(lat, 95) <= 1.0 and len(lat) == len(behind),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipients", type=int, default=100_000)
    parser.add_argument("--onboarding", type=int, default=50_000)
    parser.add_argument("--verifications", type=int, default=40)
    parser.add_argument("--interval", type=float, default=1.5)
    parser.add_argument("--drain-timeout", type=float, default=600)
    parser.add_argument("--api-sample", type=int, default=1,
                        help="1: first time 300 requests through the API's code (no HTTP)")
    args = parser.parse_args()
    before = machine()
    with tempfile.TemporaryDirectory(prefix="senddock-kinds-p7-") as tmp:
        run = measure(args, Path(tmp))
    after = machine()
    result = summarize(run, args.onboarding)
    lat, both = result["latency_s"], result["latency_behind_both_s"]
    print(table(
        f"P7 with kinds: verification (critical) latency, API 202 -> sink, while a "
        f"{args.recipients:,}-recipient campaign drains and a {args.onboarding:,}-message "
        f"onboarding burst (lifecycle) lands ({before['cpus']} cores, load "
        f"{before['load_1m']} -> {after['load_1m']})",
        ["measured", "p50 s", "p95 s", "max s", "behind both: n / p95 s", "API 202 p95 ms",
         "P7 (p95 <= 1 s)"],
        [[f"{result['delivered']}/{result['verifications_behind']}", f"{lat['p50']:.3f}",
          f"{lat['p95']:.3f}", f"{lat['max']:.3f}",
          f"{result['behind_both']} / {both['p95']:.3f}", f"{result['api_202_ms_p95']:.0f}",
          "met" if result["p7_met"] else "NOT met"]]))
    tts = result["onboarding_tts_s"]
    print(table(
        "Classes: the onboarding burst (lifecycle) and the campaign",
        ["burst insert s", "API-path enqueue msgs/s (1 thread)", "onboarding sent",
         "onboarding time to sent p50 / p95 s",
         "campaign msgs sent while onboarding waited", "left waiting (campaign, onboarding)"],
        [[f"{result['burst_insert_s']:.1f}", f"{result['api_enqueue_per_s']:,.0f}",
          f"{result['onboarding_sent']:,}",
          f"{tts['p50']:.1f} / {tts['p95']:.1f}",
          f"{result['campaign_sent_while_onboarding_drained']:,}",
          f"{result['final']['campaign_waiting']:,}, "
          f"{result['final']['onboarding_waiting']:,}"]]))
    path = save("kinds-p7", {"machine": {"before": before, "after": after}, "args": vars(args),
                             "result": result, "requests": run["requests"],
                             "timeline": run["timeline"]})
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
