"""Receiver reports at scale: the reader's speed (records/s, reading only and reading +
storing), and the domain's deliverability page with many reports stored.

    python -m bench.bench_reports [--reports 10000] [--records 1000000] [--days 90]
                                  [--domains 1] [--repeat 10]

The page's data is seeded set-based (``--reports`` aggregate reports holding ``--records``
records in all, spread over ``--days`` days and ``--domains`` domains, 200 source IPs, 20
reporters); the page shows the last 30 days of one domain. Ingest is measured on real
aggregate XML generated in memory (100 reports of 1,000 records), gzip-compressed as
receivers send it.
"""

from __future__ import annotations

import argparse
import gzip
import re
import statistics
import time
from typing import Any

import sqlalchemy as sa

from bench.common import fresh_database, machine, percentile, save, table
from webapp import create_app, db
from webapp.domain import users
from workers.after_acceptance.receiver_reports import read_report
from workers.after_acceptance.receiver_reports.store import ingest
from workers.core.settings import load


def report_xml(n: int, records: int, begin: int) -> bytes:
    rows = []
    for i in range(records):
        ok = "pass" if i % 10 else "fail"
        rows.append(
            f"<record><row><source_ip>10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
            f"</source_ip><count>{1 + i % 7}</count><policy_evaluated><disposition>none"
            f"</disposition><dkim>{ok}</dkim><spf>pass</spf></policy_evaluated></row>"
            "<identifiers><header_from>bench.example</header_from></identifiers><auth_results>"
            f"<dkim><domain>bench.example</domain><selector>s1</selector><result>{ok}</result>"
            "</dkim><spf><domain>bench.example</domain><result>pass</result></spf>"
            "</auth_results></record>")
    return (f'<?xml version="1.0"?><feedback><report_metadata><org_name>reporter{n % 20}.example'
            f"</org_name><email>r@reporter.example</email><report_id>bench-{n}</report_id>"
            f"<date_range><begin>{begin}</begin><end>{begin + 86399}</end></date_range>"
            "</report_metadata><policy_published><domain>bench.example</domain><p>none</p>"
            f"</policy_published>{''.join(rows)}</feedback>").encode()


_SEED_REPORTS = """
INSERT INTO receiver_reports (kind, org_name, report_id, domain, begin_at, end_at, policy,
                              records, messages, source)
SELECT 'aggregate', 'reporter' || (i % 20) || '.example', 'seed-' || i,
       'domain' || (i % :domains) || '.example',
       date_trunc('day', now()) - (i % :days) * interval '1 day',
       date_trunc('day', now()) - (i % :days) * interval '1 day' + interval '1 day',
       '{"p": "reject", "sp": "reject", "pct": "100"}', :per, :per * 3, 'api'
  FROM generate_series(1, :reports) i
"""
_SEED_RECORDS = """
INSERT INTO receiver_report_records (report, domain, day, reporter, source_ip, count,
                                     disposition, dkim, spf, header_from, auth)
SELECT r.id, r.domain, r.begin_at::date, r.org_name, '10.0.' || (k % 200) || '.1', 1 + k % 5,
       CASE WHEN k % 50 = 0 THEN 'reject' ELSE 'none' END,
       CASE WHEN k % 20 = 0 THEN 'fail' ELSE 'pass' END,
       CASE WHEN k % 7 = 0 THEN 'fail' ELSE 'pass' END, r.domain, '[]'
  FROM receiver_reports r, generate_series(1, :per) k
"""
# The per-day summary that intake keeps (workers/after_acceptance/receiver_reports/store.py),
# filled from the seeded records as the migration fills it from stored ones.
_SEED_SUMMARY = [
    """INSERT INTO dmarc_daily SELECT c.domain, day, reporter, source_ip, disposition,
           r.policy->>'p', r.policy->>'sp', r.policy->>'pct', sum(count),
           sum(CASE WHEN dkim = 'pass' OR spf = 'pass' THEN count ELSE 0 END),
           sum(CASE WHEN spf = 'pass' THEN count ELSE 0 END),
           sum(CASE WHEN dkim = 'pass' THEN count ELSE 0 END)
      FROM receiver_report_records c JOIN receiver_reports r ON r.id = c.report
     WHERE r.report_id LIKE 'seed-%' GROUP BY 1, 2, 3, 4, 5, 6, 7, 8""",
    """INSERT INTO dmarc_daily_reports SELECT domain, begin_at::date, org_name, count(*)
      FROM receiver_reports WHERE report_id LIKE 'seed-%' GROUP BY 1, 2, 3""",
]


def login(client: Any, email: str, password: str) -> None:
    page = client.get("/login").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token
    r = client.post("/login", data={"email": email, "password": password,
                                    "csrf_token": token[1]})
    assert r.status_code == 302


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reports", type=int, default=10_000)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--domains", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    info = machine()
    begin = int(time.time()) - 5 * 86400
    files = [gzip.compress(report_xml(n, 1000, begin)) for n in range(100)]
    total_records = 100 * 1000
    t0 = time.perf_counter()
    for data in files:
        read_report(data)
    read_rate = total_records / (time.perf_counter() - t0)
    with fresh_database() as url:
        engine = db.make_engine(url)
        t0 = time.perf_counter()
        for i, data in enumerate(files):
            with engine.begin() as conn:
                ingest(conn, data, filename=f"{i}.xml.gz", source="api")
        ingest_rate = total_records / (time.perf_counter() - t0)
        per = max(1, args.records // args.reports)
        t0 = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(sa.text(_SEED_REPORTS), {"reports": args.reports, "per": per,
                                                  "days": args.days, "domains": args.domains})
            conn.execute(sa.text(_SEED_RECORDS), {"per": per})
            for statement in _SEED_SUMMARY:
                conn.execute(sa.text(statement))
        with engine.connect() as conn:
            conn.execute(sa.text("ANALYZE receiver_report_records, dmarc_daily, "
                                 "dmarc_daily_reports"))
            conn.commit()
        seeded = time.perf_counter() - t0
        with engine.begin() as conn:
            users.create_user(conn, "bench@example.com", "bench password 1", "admin")
        app = create_app(load({"DATABASE_URL": url, "SECRET_KEY": "bench",
                               "SENDING_IPS": "10.0.0.0/20"}), engine=engine)
        client = app.test_client()
        login(client, "bench@example.com", "bench password 1")
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            r = client.get("/admin/domains/domain0.example/deliverability")
            times.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200
        engine.dispose()
    rows = [
        ["reader (gzip XML, 100 reports x 1,000 records)", f"{read_rate:,.0f} records/s"],
        ["reader + store (COPY), one transaction per report", f"{ingest_rate:,.0f} records/s"],
        [f"domain page, {args.reports:,} reports / {per * args.reports:,} records over "
         f"{args.days} days, {args.domains} domain(s): p50",
         f"{statistics.median(times):.0f} ms"],
        ["domain page p95", f"{percentile(times, 95):.0f} ms"],
        ["seeding", f"{seeded:.1f} s"],
    ]
    print(table(f"Receiver reports ({info['cpus']} CPUs, load {info['load_1m']})",
                ["measure", "value"], rows))
    saved = save("reports", {"machine": info, "args": vars(args), "read_rate": read_rate,
                             "ingest_rate": ingest_rate, "page_ms": times})
    print(f"saved {saved}")


if __name__ == "__main__":
    main()
