"""What receivers report about a sending domain (docs/deliverability.md): the reads behind
the domain's deliverability page, the DMARC alarm on Queue health and its metrics.

"Our relays" are the addresses in ``SENDDOCK_SENDING_IPS``; every other source that sends
as the domain is listed as not ours, with what the receivers did with its mail."""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from sqlalchemy.engine import Connection

from workers.core.i18n import N_, text_from_data
from workers.core.settings import Config

ALARM_DAYS = 7
PAGE_DAYS = 30
TOP = 50


def _networks(config: Config) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(n) for n in config.reports.sending_ips]


def is_ours(ip: str, networks: list[Any]) -> bool:
    try:
        address = ipaddress.ip_address(ip.strip())
    except ValueError:
        return False
    return any(address.version == n.version and address in n for n in networks)


MAX_SPAN = 400


def span(text: str, default: int) -> int:
    """The period a page or the API asks for (``?days=``, 1 to :data:`MAX_SPAN`); anything
    else is the default."""
    if text.isascii() and text.isdigit() and len(text) <= 3 and 1 <= int(text) <= MAX_SPAN:
        return int(text)
    return default


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass
class Source:
    ip: str
    ours: bool
    messages: int = 0
    dmarc_pass: int = 0
    spf_aligned: int = 0
    dkim_aligned: int = 0
    reporters: set[str] = field(default_factory=set)
    dispositions: dict[str, int] = field(default_factory=dict)

    @property
    def pass_rate(self) -> float | None:
        return _rate(self.dmarc_pass, self.messages)


def _since(days: int) -> date:
    return (datetime.now(UTC) - timedelta(days=days)).date()


# One scan of the domain's per-day summary (``dmarc_daily``, kept at intake) for the period,
# aggregated several ways at once (GROUPING SETS): by source (with reporter and
# disposition), by day, by reporter, by the policy applied, and the biggest lines by day,
# source and reporter.
_ONE_SCAN = """
WITH g AS MATERIALIZED (
    SELECT CASE WHEN GROUPING(source_ip, reporter, disposition) = 0 THEN 'src'
                WHEN GROUPING(day, source_ip, reporter) = 0 THEN 'dsr'
                WHEN GROUPING(day) = 0 THEN 'day'
                WHEN GROUPING(policy_p, policy_sp, policy_pct, disposition) = 0 THEN 'pol'
                ELSE 'rep' END AS grp,
           day, source_ip, reporter, disposition, policy_p, policy_sp, policy_pct,
           sum(messages)::bigint AS messages, sum(dmarc_pass)::bigint AS dmarc_pass,
           sum(spf_aligned)::bigint AS spf_aligned, sum(dkim_aligned)::bigint AS dkim_aligned
      FROM dmarc_daily WHERE domain = :domain AND day >= :since
     GROUP BY GROUPING SETS ((source_ip, reporter, disposition), (day, source_ip, reporter),
                            (day), (policy_p, policy_sp, policy_pct, disposition), (reporter))
)
SELECT * FROM g WHERE grp <> 'dsr'
UNION ALL
(SELECT * FROM g WHERE grp = 'dsr'
  ORDER BY day DESC, messages DESC, source_ip, reporter LIMIT :top)
"""


def _policy_field(value: str) -> str | None:
    return value or None


def domain_view(conn: Connection, config: Config, domain: str,
                days: int = PAGE_DAYS) -> dict[str, Any]:
    networks = _networks(config)
    since = _since(days)
    params = {"domain": domain, "since": since}
    found: dict[str, Source] = {}
    per_day: list[dict[str, Any]] = []
    by_day_source: list[dict[str, Any]] = []
    reporters: list[dict[str, Any]] = []
    policies: dict[tuple[Any, Any, Any, str], int] = defaultdict(int)
    for row in conn.execute(sa.text(_ONE_SCAN), {**params, "top": TOP * 4}):
        if row.grp == "src":
            src = found.get(row.source_ip)
            if src is None:
                src = found[row.source_ip] = Source(row.source_ip,
                                                    is_ours(row.source_ip, networks))
            src.messages += row.messages
            src.dmarc_pass += row.dmarc_pass
            src.spf_aligned += row.spf_aligned
            src.dkim_aligned += row.dkim_aligned
            src.reporters.add(row.reporter)
            src.dispositions[row.disposition] = (src.dispositions.get(row.disposition, 0)
                                                 + row.messages)
        elif row.grp == "dsr":
            by_day_source.append({"day": row.day, "source_ip": row.source_ip,
                                  "reporter": row.reporter, "messages": row.messages,
                                  "dmarc_pass": row.dmarc_pass,
                                  "ours": is_ours(row.source_ip, networks)})
        elif row.grp == "day":
            per_day.append({"day": row.day, "messages": row.messages,
                            "dmarc_pass": row.dmarc_pass, "spf_aligned": row.spf_aligned,
                            "dkim_aligned": row.dkim_aligned})
        elif row.grp == "pol":
            policies[(_policy_field(row.policy_p), _policy_field(row.policy_sp),
                      _policy_field(row.policy_pct), row.disposition)] += row.messages
        else:
            reporters.append({"reporter": row.reporter, "messages": row.messages,
                              "dmarc_pass": row.dmarc_pass})
    day_reporters: dict[Any, int] = defaultdict(int)
    report_org: dict[str, int] = defaultdict(int)
    for r in conn.execute(sa.text("""
            SELECT day, reporter, reports FROM dmarc_daily_reports
            WHERE domain = :domain AND day >= :since"""), params):
        day_reporters[r.day] += 1
        report_org[r.reporter] += int(r.reports)
    for d in per_day:
        d["reporters"] = day_reporters.get(d["day"], 0)
    for entry in reporters:
        entry["reports"] = report_org.get(entry["reporter"], 0)
    per_day.sort(key=lambda d: d["day"], reverse=True)
    reporters.sort(key=lambda entry: -entry["messages"])
    policy = [{"p": p, "sp": sp, "pct": pct, "disposition": disp, "messages": n}
              for (p, sp, pct, disp), n in sorted(policies.items(), key=lambda kv: -kv[1])]
    all_sources = sorted(found.values(), key=lambda s: (-s.messages, s.ip))
    total = sum(s.messages for s in all_sources)
    ours = [s for s in all_sources if s.ours]
    ours_total = sum(s.messages for s in ours)
    reporters = reporters[:TOP]
    tls = [dict(r._mapping) for r in conn.execute(sa.text("""
        SELECT p.policy_domain, d->>'result_type' AS result_type,
               coalesce(d->>'receiving_mx_hostname', '') AS mx,
               sum((d->>'failed_session_count')::bigint) AS failed
        FROM receiver_tls_policies p, jsonb_array_elements(p.details) d
        WHERE (p.policy_domain = :domain OR p.policy_domain LIKE :sub) AND p.day >= :since
        GROUP BY 1, 2, 3 ORDER BY failed DESC LIMIT :top"""),
        {**params, "sub": f"%.{domain}", "top": TOP})]
    tls_totals = conn.execute(sa.text("""
        SELECT coalesce(sum(successful), 0) AS ok, coalesce(sum(failed), 0) AS failed
        FROM receiver_tls_policies
        WHERE (policy_domain = :domain OR policy_domain LIKE :sub) AND day >= :since"""),
        {**params, "sub": f"%.{domain}"}).one()
    failures = conn.execute(sa.text("""
        SELECT count(*) FROM receiver_reports
        WHERE kind = 'failure' AND domain = :domain AND begin_at >= :since"""),
        params).scalar_one()
    return {
        "domain": domain, "days": days, "since": since, "messages": total,
        "rates": {
            "spf": _rate(sum(s.spf_aligned for s in all_sources), total),
            "dkim": _rate(sum(s.dkim_aligned for s in all_sources), total),
            "dmarc": _rate(sum(s.dmarc_pass for s in all_sources), total),
            "ours_dmarc": _rate(sum(s.dmarc_pass for s in ours), ours_total),
        },
        "ours_messages": ours_total, "networks": [str(n) for n in networks],
        "per_day": per_day, "by_day_source": by_day_source, "reporters": reporters,
        "ours": ours[:TOP], "not_ours": [s for s in all_sources if not s.ours][:TOP],
        "not_ours_count": sum(1 for s in all_sources if not s.ours),
        "policy": policy, "tls": tls, "tls_ok": int(tls_totals.ok),
        "tls_failed": int(tls_totals.failed), "failure_reports": int(failures),
        "threshold": config.reports.dmarc_pass_alarm,
    }


def relay_dmarc(conn: Connection, config: Config,
                days: int = ALARM_DAYS) -> dict[str, tuple[int, int]]:
    """Per domain: (messages from our relays, of them passing DMARC), last ``days`` days."""
    networks = _networks(config)
    result: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    if not networks:
        return {}
    for row in conn.execute(sa.text("""
            SELECT domain, source_ip, sum(messages)::bigint AS n,
                   sum(dmarc_pass)::bigint AS passed
            FROM dmarc_daily WHERE day >= :since GROUP BY 1, 2"""),
            {"since": _since(days)}):
        if is_ours(row.source_ip, networks):
            result[row.domain][0] += int(row.n)
            result[row.domain][1] += int(row.passed or 0)
    return {d: (v[0], v[1]) for d, v in result.items()}


def alarms(conn: Connection, config: Config) -> list[Any]:
    from webapp.domain.health import Alarm

    found = []
    threshold = config.reports.dmarc_pass_alarm
    for domain, (messages, passed) in sorted(relay_dmarc(conn, config).items()):
        failed = messages - passed
        rate = passed / messages if messages else 1.0
        if failed and rate < threshold:
            found.append(Alarm("dmarc_alignment", N_(
                "Receivers report %(failed)s of %(messages)s messages from your own relays "
                "as %(domain)s failing DMARC in the last %(days)s days (pass rate %(rate)s, "
                "alarm below %(limit)s): check DKIM signing and SPF for %(domain)s.",
                failed=failed, messages=messages, domain=domain, days=ALARM_DAYS,
                rate=f"{rate:.1%}", limit=f"{threshold:.0%}"), "warn", roles=("admin",)))
    return found


def metrics(conn: Connection, config: Config) -> Iterator[Metric]:
    rate = GaugeMetricFamily(
        "senddock_dmarc_pass_rate", "DMARC pass rate receivers report for mail from your "
        f"own relays (SENDDOCK_SENDING_IPS), last {ALARM_DAYS} days.", labels=["domain"])
    failed = GaugeMetricFamily(
        "senddock_dmarc_relay_failures", "Messages from your own relays that receivers "
        f"report failing DMARC, last {ALARM_DAYS} days.", labels=["domain"])
    for domain, (messages, passed) in sorted(relay_dmarc(conn, config).items()):
        if messages:
            rate.add_metric([domain], passed / messages)
            failed.add_metric([domain], messages - passed)
    yield rate
    yield failed


def recent(conn: Connection, limit: int = 50) -> dict[str, list[dict[str, Any]]]:
    """The latest stored reports and refused files (the upload page)."""
    return {
        "reports": [dict(r._mapping) for r in conn.execute(sa.text("""
            SELECT id, kind, org_name, report_id, domain, begin_at, end_at, records,
                   messages, source, filename, created_at, jsonb_array_length(warnings) AS
                   warnings
            FROM receiver_reports ORDER BY id DESC LIMIT :limit"""), {"limit": limit})],
        "rejects": [{**r._mapping, "reason": text_from_data(r.reason_i18n)
                     if r.reason_i18n else r.reason} for r in conn.execute(sa.text("""
            SELECT filename, reason, reason_i18n, source, size, created_at
            FROM receiver_report_rejects ORDER BY created_at DESC LIMIT :limit"""),
            {"limit": limit})],
    }
