"""The figures of docs/reliability.md "Real relays", measured against a private Postfix
3.7 (harness.postfix; needs root and ``apt-get install postfix sasl2-bin``):

1. rate: ``--processes`` ``senddock worker`` processes with ``SENDDOCK_RATE_LIMIT`` each of
   ``--rates``; the most messages in any one second by Postfix's own log timestamps
   (cleanup's ``message-id=`` line, whole seconds), the mean rate, the span;
2. wrong password: a worker with a wrong SASL password for ``--auth-seconds``; Postfix's
   failed-AUTH log lines, extrapolated to an hour (LOGIN_PROBE_INTERVAL at its default);
3. throttling: anvil's recipient rate limit at RCPT; attempts used for the messages.

    python -m bench.bench_real_relay [--rates 20,2,0.5] [--messages 200]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

import sqlalchemy as sa

from bench.common import ROOT, fresh_database, machine, save, table
from harness import postfix
from harness.seed import seed_list
from workers.core.states import SENT, Campaign


def _campaign(engine: sa.Engine, n: int) -> int:
    from webapp.domain import campaigns

    list_id = seed_list(engine, n, name=f"relay-{time.monotonic_ns()}")
    with engine.begin() as conn:
        c = campaigns.create(conn, {"name": "Relay bench", "list_id": list_id,
                                    "subject": "Hello", "text": "Hi {{ name }}"},
                             default_from="bench@example.com")
        campaigns.send(conn, c["id"])
    return int(c["id"])


def _workers(url: str, smtp_url: str, n: int, **extra: str) -> list[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENDDOCK_")}
    env.update({"SENDDOCK_DATABASE_URL": url, "SENDDOCK_SMTP_URL": smtp_url,
                "SENDDOCK_SECRET_KEY": "bench-secret", "SENDDOCK_LOG_LEVEL": "WARNING",
                "SENDDOCK_SMTP_HELO": "bench.senddock.test",
                "SENDDOCK_FROM": "Bench <bench@example.com>"})
    env.update({f"SENDDOCK_{k}": v for k, v in extra.items()})
    return [subprocess.Popen([sys.executable, "-m", "webapp", "worker"], cwd=ROOT,
                             env={**env, "SENDDOCK_NODE": f"bench-{i}"},
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for i in range(n)]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(30)


def _status(engine: sa.Engine, campaign_id: int) -> str:
    with engine.connect() as conn:
        return str(conn.execute(sa.text("SELECT status FROM campaigns WHERE id = :id"),
                                {"id": campaign_id}).scalar_one())


def _wait_sent(engine: sa.Engine, campaign_id: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _status(engine, campaign_id) != Campaign.SENT:
        if time.monotonic() > deadline:
            raise SystemExit(f"campaign {campaign_id} not sent after {timeout}s")
        time.sleep(0.5)


def measure_rate(relay: postfix.Postfix, url: str, rate: float, messages: int,
                 processes: int) -> dict[str, Any]:
    from webapp import db

    engine = db.make_engine(url)
    relay.reset()
    campaign = _campaign(engine, messages)
    procs = _workers(url, relay.smtp_url(), processes, RATE_LIMIT=str(rate), WORKERS="5")
    try:
        _wait_sent(engine, campaign, messages / rate + 60)
    finally:
        _stop(procs)
        engine.dispose()
    times = sorted(relay.accepted_times())
    span = (times[-1] - times[0]).total_seconds() if times else 0.0
    window = max(1, round(1 / rate)) if rate < 1 else 1
    # For a rate below 1/s: the most messages in any window of 1/rate seconds.
    most = postfix.max_in_window(times, window)
    return {"rate": rate, "processes": processes, "messages": len(times),
            "max_in_one_second": postfix.max_per_second(times),
            "max_in_sliding_second": postfix.max_in_window(times, 1.0),
            "window_s": window, "max_in_window": most,
            "mean_per_s": round(len(times) / span, 2) if span else None, "span_s": span}


def measure_wrong_password(relay: postfix.Postfix, url: str, seconds: float) -> dict[str, Any]:
    from webapp import db

    engine = db.make_engine(url)
    relay.reset()
    campaign = _campaign(engine, 50)
    wrong = relay.smtp_url(postfix.USER, "wrong", tls="starttls")
    procs = _workers(url, wrong, 1, WORKERS="5", SMTP_CA_FILE=str(relay.ca_file))
    try:
        time.sleep(seconds)
    finally:
        _stop(procs)
        from webapp.domain import campaigns

        with engine.begin() as conn:  # its mail must not reach the next measurement
            campaigns.cancel(conn, campaign)
            conn.execute(sa.text("UPDATE relay_state SET status = 'ok', reason = NULL"))
        engine.dispose()
    failed = relay.count(r"SASL \S+ authentication failed")
    sessions = relay.count(r"disconnect from .* auth=0/1")
    cascades = relay.count(r"disconnect from .* auth=0/[2-9]")
    return {"seconds": seconds, "failed_auth": failed, "sessions_one_auth": sessions,
            "sessions_several_auth": cascades,
            # the first burst (each thread's first connection) plus one probe per 300 s
            "per_hour_bound": failed + int(3600 / 300)}


def measure_throttling(relay: postfix.Postfix, url: str, messages: int) -> dict[str, Any]:
    from webapp import db

    engine = db.make_engine(url)
    relay.reset()
    relay.configure(smtpd_client_recipient_rate_limit="20", anvil_rate_time_unit="5s")
    campaign = _campaign(engine, messages)
    procs = _workers(url, relay.smtp_url(), 1, WORKERS="5", THROTTLE_BACKOFF="1,2,4")
    try:
        _wait_sent(engine, campaign, 300)
    finally:
        _stop(procs)
    with engine.connect() as conn:
        row = conn.execute(sa.text(
            "SELECT count(*) AS n, sum(attempts) AS attempts, "
            f"count(*) FILTER (WHERE status <> '{SENT}') AS not_sent FROM delivery_jobs "
            "WHERE campaign_id = :c"), {"c": campaign}).one()
    engine.dispose()
    return {"messages": row.n, "attempts": int(row.attempts), "not_sent": row.not_sent,
            "throttled_rcpts": relay.count(r"Recipient address rate limit exceeded"),
            "delivered": len(relay.messages())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", default="20,2,0.5")
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--auth-seconds", type=float, default=60)
    parser.add_argument("--throttle-messages", type=int, default=100)
    parser.add_argument("--only", choices=("rates", "auth", "throttling"), default=None)
    args = parser.parse_args()
    reason = postfix.unavailable_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    results: dict[str, Any] = {"machine": machine()}
    wanted = {args.only} if args.only else {"rates", "auth", "throttling"}
    with postfix.running() as relay, fresh_database() as url:
        rates = []
        for raw in args.rates.split(",") if "rates" in wanted else []:
            rate = float(raw)
            n = min(args.messages, max(10, int(rate * 30)))
            rates.append(measure_rate(relay, url, rate, n, args.processes))
        results["rates"] = rates
        if "auth" in wanted:
            results["auth"] = measure_wrong_password(relay, url, args.auth_seconds)
        if "throttling" in wanted:
            results["throttling"] = measure_throttling(relay, url, args.throttle_messages)
    _print(results)
    print(f"\nsaved {save('real_relay', results)}")
    return 0


def _print(results: dict[str, Any]) -> None:
    print(table("Rate limit, by Postfix's own clock (long queue IDs, microseconds)", [
        "limit/s", "processes", "messages", "max in a calendar s", "max in a sliding s",
        "window", "max in window", "mean/s", "span s"],
        [[r["rate"], r["processes"], r["messages"], r["max_in_one_second"],
          r["max_in_sliding_second"], f"{r['window_s']} s", r["max_in_window"],
          r["mean_per_s"], f"{r['span_s']:.1f}"] for r in results["rates"]]))
    a = results.get("auth")
    if a:
        print(table("Wrong password", ["seconds", "failed AUTH", "sessions with 1 AUTH",
                                       "sessions with >1", "per hour (bound)"],
                    [[a["seconds"], a["failed_auth"], a["sessions_one_auth"],
                      a["sessions_several_auth"], a["per_hour_bound"]]]))
    t = results.get("throttling")
    if not t:
        return
    print(table("Anvil throttling at RCPT (20 recipients / 5 s)", [
        "messages", "attempts", "not sent", "throttled RCPTs", "delivered"],
        [[t["messages"], t["attempts"], t["not_sent"], t["throttled_rcpts"], t["delivered"]]]))


if __name__ == "__main__":
    raise SystemExit(main())
