"""Ten million recipients on one machine, as a new user would try it: subscribers
seeded set-based, one `senddock serve` with defaults (UI + API + worker pool) against
Postfix's smtp-sink, the campaign sent through the API. Prints:

- the send request, and the enqueue until the campaign's total is there (recipients/s);
- the drain with no page open, then every page a marketer or admin opens polled back to
  back while it drains (p50/p95, and the drain meanwhile), and serve's RSS;
- pause, resume and cancel through the API (answer time), what was claimed after each
  decision, how long the engine takes to settle the cancel (every job terminal) and
  whether the counters still equal GROUP BY status;
- retention: several campaigns sent (cancelled) and rolled up in turn, with the jobs
  table's and its indexes' sizes after each, and the rate of the batched delete against
  the cost of dropping a partition holding the same rows (the measurement behind
  docs/scale-out.md's choice).

    python -m bench.bench_ten_million [--recipients 10000000] [--drain 60] [--idle 15]
        [--retention-recipients 500000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
import time
from typing import Any

import psutil
import requests
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
from bench.seed_subscribers import seed_subscribers
from harness.seed import make_campaign
from webapp import db
from webapp.domain import campaigns, users
from workers import queue
from workers.core.states import CANCELLED, FAILED, PENDING, RETRY, SENDING, SENT
from workers.delivery import lifecycle, retention

PASSWORD = "benchmark-password"


def _login(base: str, email: str) -> requests.Session:
    session = requests.Session()
    page = session.get(f"{base}/login", timeout=30).text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token, page[:500]
    r = session.post(f"{base}/login", data={"email": email, "password": PASSWORD,
                                            "csrf_token": token[1]},
                     allow_redirects=False, timeout=30)
    assert r.status_code == 302, r.text[:500]
    return session


class Sampler(threading.Thread):
    """Serve's RSS every second (its threads included: one process)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.rss: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            try:
                self.rss.append(self.process.memory_info().rss / 2**20)
            except psutil.Error:
                return


def _poll_pages(session: requests.Session, base: str, pages: dict[str, str],
                seconds: float) -> tuple[dict[str, list[float]], dict[str, int]]:
    samples: dict[str, list[float]] = {name: [] for name in pages}
    errors: dict[str, int] = dict.fromkeys(pages, 0)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for name, path in pages.items():
            t0 = time.perf_counter()
            r = session.get(f"{base}{path}", allow_redirects=False, timeout=60)
            samples[name].append((time.perf_counter() - t0) * 1000)
            errors[name] += r.status_code not in (200, 302)
    return samples, errors


def _counts(engine: sa.Engine, broadcast_id: int) -> dict[str, int]:
    with engine.connect() as conn:
        return queue.broadcast_counts(conn, broadcast_id)


def _sizes(engine: sa.Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        row = conn.execute(sa.text("""
            SELECT pg_relation_size('delivery_jobs') AS heap,
                   pg_indexes_size('delivery_jobs') AS indexes,
                   (SELECT count(*) FROM delivery_jobs) AS rows,
                   (SELECT n_dead_tup FROM pg_stat_user_tables
                     WHERE relname = 'delivery_jobs') AS dead""")).one()
    return {"heap_mb": row.heap / 2**20, "indexes_mb": row.indexes / 2**20,
            "rows": int(row.rows), "dead": int(row.dead or 0)}


def _vacuum(url: str) -> None:
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text("VACUUM (ANALYZE) delivery_jobs"))
    engine.dispose()


def _api(base: str, token: str, method: str, path: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = requests.request(method, f"{base}/api/v1{path}", timeout=60,
                         headers={"Authorization": f"Bearer {token}"})
    return (time.perf_counter() - t0) * 1000, r.status_code


def _wait(predicate: Any, timeout: float, every: float = 0.5) -> float:
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"not within {timeout} s")
        time.sleep(every)
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipients", type=int, default=10_000_000)
    parser.add_argument("--drain", type=float, default=60, help="seconds of page polling")
    parser.add_argument("--idle", type=float, default=15,
                        help="seconds of draining with no page open, before the polling")
    parser.add_argument("--retention-recipients", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle-timeout", type=float, default=900,
                        help="seconds to wait for every job to be terminal after the cancel "
                             "(past it, the settled count and rate so far are printed)")
    parser.add_argument("--port-base", type=int, default=0,
                        help="smtp-sink on this port, serve on the next (default: free ones)")
    args = parser.parse_args()
    info = machine()
    smtp_port, web_port = ((args.port_base, args.port_base + 1) if args.port_base
                           else (free_port(), free_port()))
    base = f"http://127.0.0.1:{web_port}"
    out: dict[str, Any] = {"machine": info, "recipients": args.recipients}
    rows = _Rows()
    with fresh_database() as url, sink_process("postfix", smtp_port):
        engine = db.make_engine(url)
        t0 = time.perf_counter()
        list_id = seed_subscribers(engine, args.recipients)
        rows.append(["seed subscribers (set-based)", f"{time.perf_counter() - t0:.0f} s"])
        campaign_id = make_campaign(engine, list_id)
        with engine.begin() as conn:
            users.create_user(conn, "bench-admin@example.com", PASSWORD, "admin")
            user = users.create_user(conn, "bench@example.com", PASSWORD, "marketer")
            token = users.create_token(conn, user["id"], "bench")
        with engine.connect() as conn:
            conn.execute(sa.text("ANALYZE"))
        serve = subprocess.Popen(
            [sys.executable, "-m", "webapp", "serve", "--port", str(web_port)],
            env=env_for(url, smtp_port), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        sampler = Sampler(serve.pid)
        try:
            _wait(lambda: _up(base), 60)
            sampler.start()
            send_ms, status = _api(base, token, "POST", f"/campaigns/{campaign_id}/send")
            assert status in (200, 202), status
            rows.append(["POST /campaigns/1/send", f"{send_ms:.0f} ms (target < 300)"])
            with engine.connect() as conn:
                broadcast_id = int(conn.execute(sa.text(
                    "SELECT broadcast_id FROM campaigns WHERE id = :c"),
                    {"c": campaign_id}).scalar_one())
            _wait(lambda: _enqueued(engine, broadcast_id), 3600)
            with engine.connect() as conn:
                b = conn.execute(sa.text(
                    "SELECT total, extract(epoch FROM enqueued_at - created_at) AS s "
                    "FROM broadcasts WHERE id = :b"), {"b": broadcast_id}).one()
            total, enqueue_s = int(b.total), float(b.s)
            rows.append(["enqueue (request to jobs committed)",
                         f"{total:,} in {enqueue_s:.0f} s = {total / enqueue_s:,.0f}/s "
                         "(target ≤ 100 s at 10M)"])
            admin = _login(base, "bench-admin@example.com")
            probe = args.recipients // 2 + 7
            address = f"user{probe}-l{list_id}@example{probe % 97}.com"
            pages = {
                "dashboard": "/",
                "campaign page": f"/campaigns/{campaign_id}",
                "campaign counter fragment": f"/campaigns/{campaign_id}?fragment=live",
                "campaigns list": "/campaigns/",
                "list page": f"/lists/{list_id}",
                "suppressions": "/admin/suppressions",
                "inbox": "/inbox/",
                "queue health": "/health/",
                "support search (an address)": f"/support/?q={address}",
                "jobs browser": "/jobs/",
                "jobs browser, campaign filter": f"/jobs/?state=waiting&campaign={campaign_id}",
                "jobs browser, retrying": "/jobs/?state=retrying",
                "jobs browser, an address": f"/jobs/?state=waiting&q={address}",
                "API campaign": f"/api/v1/campaigns/{campaign_id}",
            }
            admin.headers["Authorization"] = f"Bearer {token}"  # for the API path
            # The drain with no page open, then while the pages are polled back to back
            # (in serve, campaign mail gives way to pages: workers.delivery.foreground).
            sent0 = _counts(engine, broadcast_id)[SENT]
            t_idle = time.monotonic()
            time.sleep(args.idle)
            idle = _counts(engine, broadcast_id)[SENT] - sent0
            idle_s = time.monotonic() - t_idle
            rows.append([f"sent during {idle_s:.0f} s with no page open",
                         f"{idle:,} ({idle / idle_s:,.0f}/s)"])
            sent0 = _counts(engine, broadcast_id)[SENT]
            t_drain = time.monotonic()
            samples, errors = _poll_pages(admin, base, pages, args.drain)
            drained = _counts(engine, broadcast_id)[SENT] - sent0
            drain_s = time.monotonic() - t_drain
            rows.append([f"sent during {drain_s:.0f} s of polling pages back to back",
                         f"{drained:,} ({drained / drain_s:,.0f}/s; "
                         f"{sum(map(len, samples.values())):,} pages answered)"])
            for name, v in samples.items():
                rows.append([f"{name} (while draining)",
                             f"p50 {percentile(v, 50):.0f} ms, p95 {percentile(v, 95):.0f} ms,"
                             f" n={len(v)}, errors {errors[name]}"])
            out["pages"] = {k: {"p50": percentile(v, 50), "p95": percentile(v, 95),
                                "n": len(v), "errors": errors[k]} for k, v in samples.items()}
            # The brake: pause, resume, cancel through the API.
            pause_ms, status = _api(base, token, "POST", f"/campaigns/{campaign_id}/pause")
            assert status in (200, 202), status
            _wait(lambda: _counts(engine, broadcast_id)[SENDING] == 0, 120)
            frozen = _counts(engine, broadcast_id)
            time.sleep(3)
            moved = _counts(engine, broadcast_id)[SENT] - frozen[SENT]
            rows.append(["POST pause", f"{pause_ms:.0f} ms (target < 1 s); sent in the 3 s "
                                       f"after the in-flight ones finished: {moved}"])
            resume_ms, status = _api(base, token, "POST", f"/campaigns/{campaign_id}/resume")
            assert status in (200, 202), status
            _wait(lambda: _counts(engine, broadcast_id)[SENT] > frozen[SENT] + 100, 120)
            rows.append(["POST resume", f"{resume_ms:.0f} ms; sending again"])
            cancel_ms, status = _api(base, token, "POST", f"/campaigns/{campaign_id}/cancel")
            assert status in (200, 202), status
            t_cancel = time.monotonic()
            left = _counts(engine, broadcast_id)
            page = admin.get(f"{base}/campaigns/{campaign_id}?fragment=live", timeout=60).text
            honest = "Cancelling:" in page
            rows.append(["POST cancel", f"{cancel_ms:.0f} ms (target < 1 s); "
                                        f"{left[PENDING] + left[RETRY]:,} waiting then"])
            try:
                _wait(lambda: not any(_counts(engine, broadcast_id)[s]
                                      for s in (PENDING, RETRY, SENDING)),
                      args.settle_timeout, every=1.0)
                reached = True
            except TimeoutError:
                reached = False
            settle_s = time.monotonic() - t_cancel
            final = _counts(engine, broadcast_id)
            with engine.connect() as conn:
                exact = final == queue.broadcast_counts_slow(conn, broadcast_id)
            settled = final[CANCELLED] - left[CANCELLED]
            rows.append(["every job terminal after the cancel",
                         (f"{settle_s:.0f} s" if reached else
                          f"NOT reached in {settle_s:.0f} s: {settled:,} settled "
                          f"({settled / settle_s:,.0f}/s), "
                          f"{final[PENDING] + final[RETRY]:,} still waiting")
                         + f" (target ≤ 120 s); page said 'Cancelling: … "
                         f"left': {honest}; counters = GROUP BY: {exact}; "
                         f"sent {final[SENT]:,} + cancelled {final[CANCELLED]:,} = "
                         f"{final[SENT] + final[CANCELLED] + final[FAILED]:,}"])
            out.update(send_ms=send_ms, enqueue_s=enqueue_s, total=total, pause_ms=pause_ms,
                       resume_ms=resume_ms, cancel_ms=cancel_ms, settle_s=settle_s,
                       exact=exact, final=final)
        finally:
            sampler.done.set()
            serve.terminate()
            serve.wait(120)
        rss = sampler.rss or [0.0]
        rows.append(["serve RSS", f"peak {max(rss):.0f} MB, last {rss[-1]:.0f} MB "
                                  "(target < 300)"])
        out["rss_peak"] = max(rss)
        print(table(f"{args.recipients:,} recipients ({info['cpus']} cores, "
                    f"{info['cpu_model']}, PostgreSQL {info['postgres']}, load "
                    f"{info['load_1m']} at the start)", ["step", "measured"], rows))
        out["retention"] = _retention(engine, url, broadcast_id, args)
        engine.dispose()
    print(f"\nsaved {save('ten_million', out)}")


class _Rows(list[list[Any]]):
    """The table's rows, each also printed as it is measured (a long run that is stopped
    still leaves its figures in the log)."""

    def append(self, row: list[Any]) -> None:
        print("  ".join(str(c) for c in row), flush=True)
        super().append(row)


def _up(base: str) -> bool:
    try:
        return requests.get(f"{base}/login", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def _enqueued(engine: sa.Engine, broadcast_id: int) -> bool:
    with engine.connect() as conn:
        return bool(conn.execute(sa.text(
            "SELECT enqueued_at IS NOT NULL FROM broadcasts WHERE id = :b"),
            {"b": broadcast_id}).scalar_one())


def _roll_up(engine: sa.Engine, url: str) -> tuple[int, float]:
    with engine.begin() as conn:
        queue.complete_finished_campaigns(conn)
        conn.execute(sa.text("UPDATE broadcasts SET finished_at = now() - interval '31 days' "
                             "WHERE finished_at IS NOT NULL AND rolled_up_at IS NULL"))
    service = retention.Retention(engine, 30, 90, budget=3600)
    t0 = time.perf_counter()
    done = service.tick()
    seconds = time.perf_counter() - t0
    _vacuum(url)  # what autovacuum does after it, at once
    return done["campaign_rows"], seconds


def _retention(engine: sa.Engine, url: str, broadcast_id: int,
               args: argparse.Namespace) -> dict[str, Any]:
    """Roll up the big campaign, then send (and cancel) smaller ones in rounds, rolling
    each up: the table's size follows retention, not history."""
    rows = _Rows()
    before = _sizes(engine)
    counts = _counts(engine, broadcast_id)
    rows.append(["after the big campaign", *_size_cells(before), "", ""])
    deleted, seconds = _roll_up(engine, url)
    exact = _counts(engine, broadcast_id) == counts
    after = _sizes(engine)
    rows.append(["rolled up (30 days later)", *_size_cells(after), f"{deleted:,}",
                 f"{deleted / max(seconds, 1e-9):,.0f}/s"])
    list_id = seed_subscribers(engine, args.retention_recipients, name="retention rounds")
    for i in range(args.rounds):
        campaign_id = make_campaign(engine, list_id)
        with engine.begin() as conn:
            b = campaigns.send(conn, campaign_id)["broadcast_id"]
            queue.enqueue_broadcast(conn, b)
        grown = _sizes(engine)
        with engine.begin() as conn:
            campaigns.cancel(conn, campaign_id)
        settler = lifecycle.Settler(engine, budget=3600)
        t0 = time.perf_counter()
        settled = settler.tick()
        settle_rate = settled / max(time.perf_counter() - t0, 1e-9)
        rows.append([f"round {i + 1}: campaign enqueued", *_size_cells(grown),
                     f"settled {settled:,}", f"{settle_rate:,.0f}/s"])
        deleted, seconds = _roll_up(engine, url)
        rows.append([f"round {i + 1}: rolled up", *_size_cells(_sizes(engine)),
                     f"{deleted:,}", f"{deleted / max(seconds, 1e-9):,.0f}/s"])
    drop = _partition_drop(engine, args.retention_recipients)
    print(table("Retention: the jobs table through campaigns and roll-ups (VACUUM after each, "
                f"as autovacuum would); the big campaign's counters unchanged: {exact}",
                ["step", "rows", "heap MB", "indexes MB", "dead", "rows deleted/settled",
                 "rate"], rows))
    print(table("Batched delete vs. dropping a partition of the same rows",
                ["way", "rows", "seconds", "rows/s"],
                [["retention's batched delete (last round)", f"{deleted:,}",
                  f"{seconds:.1f}", f"{deleted / max(seconds, 1e-9):,.0f}"],
                 ["DROP TABLE of a partition-sized copy (same indexes)",
                  f"{drop['rows']:,}", f"{drop['drop_s']:.2f}",
                  f"{drop['rows'] / max(drop['drop_s'], 1e-9):,.0f}"],
                 ["  filling that copy (INSERT … SELECT, for scale)", f"{drop['rows']:,}",
                  f"{drop['fill_s']:.1f}", f"{drop['rows'] / max(drop['fill_s'], 1e-9):,.0f}"]]))
    return {"rows": rows, "partition_drop": drop, "counters_kept": exact}


def _size_cells(s: dict[str, Any]) -> list[Any]:
    return [f"{s['rows']:,}", f"{s['heap_mb']:.0f}", f"{s['indexes_mb']:.0f}", f"{s['dead']:,}"]


def _partition_drop(engine: sa.Engine, n: int) -> dict[str, Any]:
    """What partitioning would cost per campaign rolled up: a table like delivery_jobs (its
    indexes included) holding ``n`` rows, dropped."""
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE bench_partition (LIKE delivery_jobs "
                             "INCLUDING DEFAULTS INCLUDING INDEXES)"))
        t0 = time.perf_counter()
        conn.execute(sa.text(f"""
            INSERT INTO bench_partition (kind, priority, status, email, broadcast_id,
                                         campaign_id, subscriber_id, finished_at)
            SELECT 'broadcast', 10, '{SENT}', 'user' || g || '@example.com', 0, 0, g, now()
              FROM generate_series(1, :n) g"""), {"n": n})
    fill_s = time.perf_counter() - t0
    with engine.begin() as conn:
        t0 = time.perf_counter()
        conn.execute(sa.text("DROP TABLE bench_partition"))
    return {"rows": n, "fill_s": fill_s, "drop_s": time.perf_counter() - t0}


if __name__ == "__main__":
    main()
