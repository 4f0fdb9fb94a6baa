"""Admin pages at scale: 1,000,000 suppressions and 1,000,000 failed/bounced jobs, seeded
set-based into a fresh database; p50/p95 of full page requests (Flask app, logged-in
admin session, templates rendered) for the inbox and the suppression list.

    python -m bench.bench_admin_pages [--rows 1000000] [--repeat 30]
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from bench.common import fresh_database, machine, percentile, save, table
from webapp import create_app, db
from webapp.domain import users
from workers.core.settings import load
from workers.core.states import BOUNCED, FAILED, PROBLEM, Campaign, sql_list

CAMPAIGNS = 20

# Jobs: 95 % campaign mail over 20 campaigns, 5 % verification; a quarter bounced; one
# finished per second going back in time (so date filters and deep pages mean something).
_SEED_JOBS = f"""
INSERT INTO delivery_jobs (kind, priority, status, email, campaign_id, broadcast_id, attempts,
                           last_error, last_error_class, finished_at, created_at)
SELECT CASE WHEN i % 20 = 0 THEN 'verification' ELSE 'broadcast' END,
       CASE WHEN i % 20 = 0 THEN 0 ELSE 10 END,
       CASE WHEN i % 4 = 0 THEN '{BOUNCED}' ELSE '{FAILED}' END,
       'user' || i || '@example' || (i % 1000) || '.com',
       CASE WHEN i % 20 = 0 THEN NULL ELSE c.id END,
       CASE WHEN i % 20 = 0 THEN NULL ELSE c.broadcast_id END,
       CASE WHEN i % 4 = 0 THEN 1 ELSE 6 END,
       CASE WHEN i % 4 = 0 THEN '550 5.1.1 <user' || i || '>: Recipient address rejected'
            ELSE '451 4.3.0 Temporary failure, try again later' END,
       CASE WHEN i % 4 = 0 THEN 'hard_bounce' WHEN i % 4 = 1 THEN 'rejected' ELSE 'transient'
       END,
       now() - i * interval '1 second', now() - i * interval '1 second' - interval '2 hours'
  FROM generate_series(1, :n) i
  JOIN campaigns c ON c.id = (SELECT min(id) FROM campaigns) + i % :campaigns
"""

_SEED_SUPPRESSIONS = """
INSERT INTO suppressions (email, reason, job_id, reply, created_by, created_at)
SELECT 'user' || i || '@example' || (i % 1000) || '.com',
       (ARRAY['bounced', 'unsubscribed', 'complaint', 'manual'])[1 + i % 4],
       CASE WHEN i % 4 = 0 THEN (SELECT min(id) FROM delivery_jobs) + i - 1 END,
       CASE WHEN i % 4 = 0 THEN '550 5.1.1 <user' || i || '>: Recipient address rejected' END,
       'system', now() - i * interval '1 second'
  FROM generate_series(1, :n) i
"""


def seed(engine: sa.Engine, n: int) -> None:
    t0 = time.perf_counter()
    with engine.begin() as conn:
        list_id = conn.execute(sa.text(
            "INSERT INTO lists (name) VALUES ('bench') RETURNING id")).scalar_one()
        for k in range(CAMPAIGNS):
            cid = conn.execute(sa.text("""
                INSERT INTO campaigns (name, list_id, from_addr, subject, text_body, status)
                VALUES (:n, :l, 'bench@example.com', 'Hi', 'Hi', :status) RETURNING id"""),
                {"n": f"Campaign {k}", "l": list_id, "status": Campaign.SENT}).scalar_one()
            bid = conn.execute(sa.text("INSERT INTO broadcasts (campaign_id, enqueued_at) "
                                       "VALUES (:c, now()) RETURNING id"), {"c": cid}).scalar_one()
            conn.execute(sa.text("UPDATE campaigns SET broadcast_id = :b WHERE id = :c"),
                         {"b": bid, "c": cid})
        conn.execute(sa.text(_SEED_JOBS), {"n": n, "campaigns": CAMPAIGNS})
        conn.execute(sa.text(_SEED_SUPPRESSIONS), {"n": n})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE delivery_jobs"))
        conn.execute(sa.text("VACUUM ANALYZE suppressions"))
    print(f"seeded {n:,} failed/bounced jobs and {n:,} suppressions in "
          f"{time.perf_counter() - t0:.1f} s")


def logged_in_client(app: Any, email: str, password: str) -> Any:
    client = app.test_client()
    page = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)[1]  # type: ignore[index]
    r = client.post("/login", data={"email": email, "password": password, "csrf_token": token})
    assert r.status_code == 302, r.get_data(as_text=True)[:500]
    return client


def timed(fetch: Callable[[], Any], repeat: int) -> tuple[float, float, int]:
    fetch()  # warm: templates compiled, plans cached, pages in shared buffers
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        response = fetch()
        times.append((time.perf_counter() - t0) * 1000)
        assert response.status_code == 200, response.get_data(as_text=True)[:500]
    return percentile(times, 50), percentile(times, 95), response.get_data().count(b"<tr")


def measure_pages(client: Any, pages: dict[str, str], repeat: int) -> list[dict[str, Any]]:
    """p50/p95 of each named page (GET through the logged-in test client)."""
    results = []
    for name, path in pages.items():
        p50, p95, rows = timed(lambda path=path: client.get(path), repeat)
        results.append({"page": name, "path": path, "p50_ms": round(p50, 1),
                        "p95_ms": round(p95, 1), "table_rows": rows})
    return results


def page_table(title: str, results: list[dict[str, Any]]) -> str:
    return table(title, ["page", "p50 ms", "p95 ms", "rows shown"],
                 [(r["page"], r["p50_ms"], r["p95_ms"], r["table_rows"]) for r in results])


def scenarios(engine: sa.Engine, n: int) -> dict[str, str]:
    with engine.connect() as conn:
        deep_job = conn.execute(sa.text(f"""
            SELECT finished_at, id FROM delivery_jobs
             WHERE status IN {sql_list(PROBLEM)} AND dismissed_at IS NULL
             ORDER BY finished_at DESC, id DESC OFFSET :o LIMIT 1"""),
            {"o": int(n * 0.9)}).one()
        deep_supp = conn.execute(sa.text("""
            SELECT created_at, email FROM suppressions ORDER BY created_at DESC, email DESC
             OFFSET :o LIMIT 1"""), {"o": int(n * 0.9)}).one()
        campaign = conn.execute(sa.text("SELECT min(id) + 7 FROM campaigns")).scalar_one()
    probe = n // 2 + 3
    cursor = f"{deep_job.finished_at.isoformat()}|{deep_job.id}"
    supp_cursor = f"t|{deep_supp.created_at.isoformat()}|{deep_supp.email}"
    return {
        "inbox: first page": "/inbox/",
        "inbox: deep page (90 %)": "/inbox/?" + _query(after=cursor),
        "inbox: filter by campaign": f"/inbox/?campaign={campaign}",
        "inbox: campaign, deep page": f"/inbox/?campaign={campaign}&" + _query(after=cursor),
        "inbox: filter by class (rejected)": "/inbox/?class=rejected",
        "inbox: filter by kind (verification)": "/inbox/?kind=verification",
        "inbox: search by email": f"/inbox/?q=user{probe}@example{probe % 1000}.com",
        "suppressions: first page": "/admin/suppressions",
        "suppressions: deep page (90 %)": "/admin/suppressions?" + _query(after=supp_cursor),
        "suppressions: search (prefix user4242)": "/admin/suppressions?q=user4242",
        "suppressions: search (full address)":
            f"/admin/suppressions?q=user{probe}@example{probe % 1000}.com",
        "suppressions: filter by reason": "/admin/suppressions?reason=complaint",
        "queue health page": "/health/",
    }


def _query(**params: str) -> str:
    from urllib.parse import urlencode

    return urlencode(params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    info = machine()
    with fresh_database() as url:
        engine = db.make_engine(url)
        seed(engine, args.rows)
        with engine.begin() as conn:
            users.create_user(conn, "bench-admin@example.com", "benchmark-password", "admin")
        app = create_app(load({"DATABASE_URL": url, "SECRET_KEY": "bench"}), engine=engine)
        client = logged_in_client(app, "bench-admin@example.com", "benchmark-password")
        results = measure_pages(client, scenarios(engine, args.rows), args.repeat)
        engine.dispose()
    print(page_table(f"Admin pages at {args.rows:,} jobs and suppressions ({info['cpus']} "
                     f"cores, PostgreSQL {info['postgres']}, {args.repeat} requests each)",
                     results))
    saved = save("admin_pages", {"machine": info, "rows": args.rows, "results": results})
    print(f"\nsaved {saved}")


if __name__ == "__main__":
    main()
