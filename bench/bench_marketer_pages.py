"""Marketer pages at scale: a list of 1,000,000 subscribers and a campaign of 1,000,000 jobs
(most sent, some waiting, failed and bounced, 100,000 finished in the last minute), seeded
set-based into a fresh database; p50/p95 of full page requests (Flask app, logged-in
marketer session, templates rendered): the subscriber table (first page, a deep keyset
page, searches), the campaign live fragment and page, and the campaigns list.

    python -m bench.bench_marketer_pages [--rows 1000000] [--repeat 30]
"""

from __future__ import annotations

import argparse
import time

import sqlalchemy as sa

from bench.bench_admin_pages import logged_in_client, measure_pages, page_table
from bench.common import fresh_database, machine, save
from bench.seed_subscribers import seed_subscribers
from webapp import create_app, db
from webapp.domain import users
from workers.core.settings import load
from workers.core.states import BOUNCED, FAILED, PENDING, PROBLEM, SENT, Campaign, sql_list

CAMPAIGNS = 30

_ERRORS = ["451 4.3.0 Temporary failure, try again later", "550 5.1.1 User unknown",
           "552 5.2.2 Mailbox full", "550 5.7.1 Message rejected as spam",
           "421 4.7.0 Too many connections"]

# The big campaign's jobs: 90 % sent (finished over the last 10 minutes, so the last
# minute holds about 100,000), 5 % waiting, 3 % failed, 2 % bounced.
_SEED_JOBS = sa.text(f"""
INSERT INTO delivery_jobs (kind, priority, status, email, campaign_id, broadcast_id, attempts,
                           last_error, last_error_class, finished_at)
SELECT 'broadcast', 10, s.status, 'user' || i || '@example.com', :campaign_id, :broadcast_id,
       CASE WHEN s.status = '{PENDING}' THEN 0 ELSE 1 END,
       CASE WHEN s.status IN {sql_list(PROBLEM)}
            THEN (CAST(:errors AS text[]))[1 + i % 5] END,
       CASE WHEN s.status IN {sql_list(PROBLEM)} THEN 'rejected' END,
       CASE WHEN s.status = '{PENDING}' THEN NULL
            ELSE now() - (i % 600) * interval '1 second' END
  FROM generate_series(1, :n) i,
       LATERAL (SELECT CASE WHEN i % 100 < 90 THEN '{SENT}' WHEN i % 100 < 95 THEN '{PENDING}'
                            WHEN i % 100 < 98 THEN '{FAILED}' ELSE '{BOUNCED}' END AS status) s
""")


def seed_campaigns(engine: sa.Engine, list_id: int, jobs: int) -> int:
    """CAMPAIGNS sending campaigns on the list; the newest gets ``jobs`` jobs. Returns it."""
    with engine.begin() as conn:
        ids = []
        for k in range(CAMPAIGNS):
            cid = conn.execute(sa.text("""
                INSERT INTO campaigns (name, list_id, from_addr, subject, text_body, status,
                                       started_at)
                VALUES (:n, :l, 'bench@example.com', 'Hi {{ name }}', 'Hi', :status, now())
                RETURNING id"""), {"n": f"Campaign {k}", "l": list_id,
                                   "status": Campaign.SENDING}).scalar_one()
            bid = conn.execute(sa.text(
                "INSERT INTO broadcasts (campaign_id, enqueued_at, total) "
                "VALUES (:c, now() - interval '20 minutes', :t) RETURNING id"),
                {"c": cid, "t": jobs}).scalar_one()
            conn.execute(sa.text("UPDATE campaigns SET broadcast_id = :b WHERE id = :c"),
                         {"b": bid, "c": cid})
            ids.append((cid, bid))
        campaign_id, broadcast_id = ids[-1]
        conn.execute(_SEED_JOBS, {"n": jobs, "campaign_id": campaign_id,
                                  "broadcast_id": broadcast_id, "errors": _ERRORS})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE delivery_jobs"))
        conn.execute(sa.text("VACUUM ANALYZE broadcast_counts"))
    return int(campaign_id)


def scenarios(engine: sa.Engine, list_id: int, campaign_id: int, n: int) -> dict[str, str]:
    with engine.connect() as conn:
        deep = conn.execute(sa.text("""
            SELECT subscriber_id FROM memberships WHERE list_id = :l
             ORDER BY subscriber_id OFFSET :o LIMIT 1"""),
            {"l": list_id, "o": int(n * 0.9)}).scalar_one()
    probe = n // 2 + 7
    lists_page = f"/lists/{list_id}"
    return {
        "subscribers: first page": lists_page,
        "subscribers: deep page (90 %, keyset)": f"{lists_page}?after={deep}",
        "subscribers: previous page from 90 %": f"{lists_page}?before={deep}",
        f"subscribers: search one address (user{probe}-)": f"{lists_page}?q=user{probe}-",
        "subscribers: search common word (lovelace)": f"{lists_page}?q=lovelace",
        "subscribers: search rare name (hopper 4241)": f"{lists_page}?q=hopper+4241",
        "subscribers: search, no match": f"{lists_page}?q=nobody-by-that-name",
        "subscribers: search fragment (HTMX)": f"{lists_page}?q=lovelace&fragment=subscribers",
        "campaign live fragment (HTMX poll)": f"/campaigns/{campaign_id}?fragment=live",
        "campaign page": f"/campaigns/{campaign_id}",
        "send review (audience of the whole list)": f"/campaigns/{campaign_id}/send",
        f"campaigns list ({CAMPAIGNS} sending)": "/campaigns/",
        "campaigns list fragment (HTMX poll)": "/campaigns/?fragment=campaigns",
        "lists page": "/lists/",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    info = machine()
    with fresh_database() as url:
        engine = db.make_engine(url)
        t0 = time.perf_counter()
        list_id = seed_subscribers(engine, args.rows)
        t1 = time.perf_counter()
        campaign_id = seed_campaigns(engine, list_id, args.rows)
        print(f"seeded {args.rows:,} subscribers in {t1 - t0:.1f} s and {args.rows:,} jobs in "
              f"{time.perf_counter() - t1:.1f} s")
        with engine.begin() as conn:
            users.create_user(conn, "bench-marketer@example.com", "benchmark-password",
                              "marketer")
        app = create_app(load({"DATABASE_URL": url, "SECRET_KEY": "bench"}), engine=engine)
        client = logged_in_client(app, "bench-marketer@example.com", "benchmark-password")
        results = measure_pages(client, scenarios(engine, list_id, campaign_id, args.rows),
                                args.repeat)
        engine.dispose()
    print(page_table(f"Marketer pages at {args.rows:,} subscribers and jobs ({info['cpus']} "
                     f"cores, PostgreSQL {info['postgres']}, {args.repeat} requests each)",
                     results))
    saved = save("marketer_pages", {"machine": info, "rows": args.rows, "results": results})
    print(f"\nsaved {saved}")


if __name__ == "__main__":
    main()
