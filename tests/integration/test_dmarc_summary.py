"""The per-day DMARC summary (docs/design.md §30): the domain page and the relay alarm read
it, so every number they show must equal the one computed from the stored records — after
intake (summary kept in the records' transaction) and after the migration's backfill."""

from __future__ import annotations

import random
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from webapp import db
from webapp.domain import deliverability
from workers.after_acceptance.receiver_reports.store import ingest
from workers.core.settings import Config, load

CORPUS = Path("/work/shared/corpora/dmarc/aggregate")
DOMAINS = ("one.test", "two.test")
IPS = [f"192.0.2.{i}" for i in range(1, 9)] + [f"203.0.113.{i}" for i in range(1, 9)]


def report_xml(rng: random.Random, n: int) -> tuple[str, bytes]:
    """A random aggregate report of the last few days; keys repeat across reports."""
    begin = int(time.time()) - rng.randrange(0, 6) * 86400
    domain = rng.choice(DOMAINS)
    policy = rng.choice(["<p>reject</p><sp>reject</sp><pct>100</pct>",
                         "<p>none</p><pct>50</pct>", "<p>quarantine</p>"])
    rows = []
    for _ in range(rng.randrange(0, 12)):
        rows.append(
            f"<record><row><source_ip>{rng.choice(IPS)}</source_ip>"
            f"<count>{rng.randrange(1, 40)}</count><policy_evaluated><disposition>"
            f"{rng.choice(['none', 'none', 'quarantine', 'reject'])}</disposition>"
            f"<dkim>{rng.choice(['pass', 'fail'])}</dkim><spf>{rng.choice(['pass', 'fail'])}"
            f"</spf></policy_evaluated></row><identifiers><header_from>{domain}</header_from>"
            "</identifiers><auth_results><spf><domain>x.test</domain><result>pass</result>"
            "</spf></auth_results></record>")
    reporter = rng.choice(["google.com", "Yahoo", "Microsoft Corporation"])
    xml = (f'<?xml version="1.0"?><feedback><report_metadata><org_name>{reporter}</org_name>'
           f"<email>r@x.test</email><report_id>s-{n}</report_id><date_range><begin>{begin}"
           f"</begin><end>{begin + 86399}</end></date_range></report_metadata>"
           f"<policy_published><domain>{domain}</domain>{policy}</policy_published>"
           f"{''.join(rows)}</feedback>")
    return f"s-{n}.xml", xml.encode()


def from_records(conn: sa.Connection, config: Config, domain: str,
                 days: int) -> dict[str, Any]:
    """What the domain page shows, computed from the raw records (the oracle)."""
    networks = deliverability._networks(config)
    since = deliverability._since(days)
    rows = conn.execute(sa.text("""
        SELECT c.*, r.policy->>'p' AS p, r.policy->>'sp' AS sp, r.policy->>'pct' AS pct
          FROM receiver_report_records c JOIN receiver_reports r ON r.id = c.report
         WHERE c.domain = :domain AND c.day >= :since"""),
        {"domain": domain, "since": since}).all()
    day: dict[Any, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    day_reporters: dict[Any, set[str]] = defaultdict(set)
    reporters: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    reports: dict[str, set[int]] = defaultdict(set)
    sources: dict[str, dict[str, Any]] = {}
    policy: dict[tuple[Any, ...], int] = defaultdict(int)
    dsr: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        ok = r.count if "pass" in (r.dkim, r.spf) else 0
        spf = r.count if r.spf == "pass" else 0
        dkim = r.count if r.dkim == "pass" else 0
        for i, v in enumerate((r.count, ok, spf, dkim)):
            day[r.day][i] += v
        day_reporters[r.day].add(r.reporter)
        reporters[r.reporter][0] += r.count
        reporters[r.reporter][1] += ok
        reports[r.reporter].add(r.report)
        s = sources.setdefault(r.source_ip, {"messages": 0, "dmarc_pass": 0, "spf": 0,
                                             "dkim": 0, "reporters": set(),
                                             "dispositions": defaultdict(int)})
        s["messages"] += r.count
        s["dmarc_pass"] += ok
        s["spf"] += spf
        s["dkim"] += dkim
        s["reporters"].add(r.reporter)
        s["dispositions"][r.disposition] += r.count
        policy[(r.p, r.sp, r.pct, r.disposition)] += r.count
        dsr[(r.day, r.source_ip, r.reporter)][0] += r.count
        dsr[(r.day, r.source_ip, r.reporter)][1] += ok
    total = sum(s["messages"] for s in sources.values())
    ours = {ip: s for ip, s in sources.items() if deliverability.is_ours(ip, networks)}
    top = deliverability.TOP
    by_size = sorted(sources, key=lambda ip: (-sources[ip]["messages"], ip))
    shown = ([ip for ip in by_size if ip in ours][:top]
             + [ip for ip in by_size if ip not in ours][:top])
    biggest = sorted(reporters, key=lambda k: -reporters[k][0])[:top]
    return {
        "messages": total,
        "ours_messages": sum(s["messages"] for s in ours.values()),
        "ours_pass": sum(s["dmarc_pass"] for s in ours.values()),
        "per_day": {d: (*v, len(day_reporters[d])) for d, v in day.items()},
        "reporters": {k: (*reporters[k], len(reports[k])) for k in biggest},
        "sources": {ip: (s["messages"], s["dmarc_pass"], s["spf"], s["dkim"],
                         sorted(s["reporters"]), dict(s["dispositions"]))
                    for ip, s in ((ip, sources[ip]) for ip in shown)},
        "policy": dict(policy),
        "dsr": sorted(((k[0], k[1], k[2], v[0], v[1]) for k, v in dsr.items()),
                      key=lambda t: (-t[0].toordinal(), -t[3], t[1], t[2])),
    }


def from_page(view: dict[str, Any]) -> dict[str, Any]:
    sources = view["ours"] + view["not_ours"]
    return {
        "messages": view["messages"],
        "ours_messages": view["ours_messages"],
        "ours_pass": sum(s.dmarc_pass for s in view["ours"]),
        "per_day": {d["day"]: (d["messages"], d["dmarc_pass"], d["spf_aligned"],
                               d["dkim_aligned"], d["reporters"]) for d in view["per_day"]},
        "reporters": {r["reporter"]: (r["messages"], r["dmarc_pass"], r["reports"])
                      for r in view["reporters"]},
        "sources": {s.ip: (s.messages, s.dmarc_pass, s.spf_aligned, s.dkim_aligned,
                           sorted(s.reporters), s.dispositions) for s in sources},
        "policy": {(p["p"], p["sp"], p["pct"], p["disposition"]): p["messages"]
                   for p in view["policy"]},
        "dsr": [(d["day"], d["source_ip"], d["reporter"], d["messages"], d["dmarc_pass"])
                for d in view["by_day_source"]],
    }


def assert_page_equals_records(engine: sa.Engine, config: Config, days: int) -> int:
    checked = 0
    with engine.connect() as conn:
        domains = conn.execute(sa.text(
            "SELECT DISTINCT domain FROM receiver_report_records")).scalars().all()
        for domain in domains:
            expected = from_records(conn, config, domain, days)
            expected["dsr"] = expected["dsr"][:deliverability.TOP * 4]
            got = from_page(deliverability.domain_view(conn, config, domain, days))
            assert got == expected, domain
            checked += expected["messages"]
        relay = deliverability.relay_dmarc(conn, config, days)
        for domain in domains:
            e = from_records(conn, config, domain, days)
            if e["ours_messages"]:
                assert relay[domain] == (e["ours_messages"], e["ours_pass"])
    return checked


@pytest.fixture()
def config(db_url: str) -> Config:
    return load({"DATABASE_URL": db_url, "SECRET_KEY": "t", "SENDING_IPS": "192.0.2.0/29"})


def test_page_numbers_equal_the_records_after_intake(engine: sa.Engine,
                                                     config: Config) -> None:
    rng = random.Random(45)
    stored = 0
    for n in range(60):
        name, data = report_xml(rng, n)
        with engine.begin() as conn:
            stored += sum(r.records for r in ingest(conn, data, filename=name).reports)
        if n % 7 == 0:  # the same report again is kept once, and counted once
            with engine.begin() as conn:
                assert all(r.duplicate for r in ingest(conn, data, filename=name).reports)
    assert stored > 200
    assert assert_page_equals_records(engine, config, days=30) > 0
    # Old reports (the shared corpus, years back) over a window wide enough to hold them.
    if CORPUS.exists():
        for path in sorted(CORPUS.iterdir()):
            with engine.begin() as conn:
                ingest(conn, path.read_bytes(), filename=path.name)
        days = (datetime.now(UTC).date() - datetime(2010, 1, 1).date()).days
        assert assert_page_equals_records(engine, config, days=days) > 0


def test_migration_fills_the_summary_from_stored_records(engine: sa.Engine, db_url: str,
                                                         config: Config) -> None:
    rng = random.Random(7)
    for n in range(25):
        name, data = report_xml(rng, n)
        with engine.begin() as conn:
            ingest(conn, data, filename=name)
    with engine.connect() as conn:
        before = conn.execute(sa.text(
            "SELECT * FROM dmarc_daily ORDER BY 1, 2, 3, 4, 5, 6, 7, 8")).all()
        reports = conn.execute(sa.text(
            "SELECT * FROM dmarc_daily_reports ORDER BY 1, 2, 3")).all()
    assert len(before) > 20
    cfg = db.alembic_config(db_url)
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0042_preferences")
        conn.commit()
    db.upgrade(db_url)
    with engine.connect() as conn:
        assert conn.execute(sa.text(
            "SELECT * FROM dmarc_daily ORDER BY 1, 2, 3, 4, 5, 6, 7, 8")).all() == before
        assert conn.execute(sa.text(
            "SELECT * FROM dmarc_daily_reports ORDER BY 1, 2, 3")).all() == reports
    assert assert_page_equals_records(engine, config, days=30) > 0
