"""Storing what the reader returns: one row per report (org + report id kept once), one
per aggregate record and per TLS policy; a file that is no report is listed with the reason
in ``receiver_report_rejects``. Used by the upload page, ``POST /api/v1/reports`` and the
report mailbox poller alike."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from workers.after_acceptance.receiver_reports.model import (
    AggregateReport,
    FailureReport,
    ReportError,
    TlsReport,
)
from workers.after_acceptance.receiver_reports.reader import Report, read_report
from workers.core.i18n import text_to_data

SOURCES = ("upload", "api", "mailbox")


@dataclass
class Stored:
    kind: str
    org_name: str
    report_id: str
    domain: str
    id: int | None  # None: the same report was already stored
    records: int

    @property
    def duplicate(self) -> bool:
        return self.id is None


@dataclass
class IngestResult:
    filename: str
    reports: list[Stored] = field(default_factory=list)
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "filename": self.filename, "error": self.error,
            "reports": [{"kind": r.kind, "org_name": r.org_name, "report_id": r.report_id,
                         "domain": r.domain, "id": r.id, "duplicate": r.duplicate,
                         "records": r.records} for r in self.reports],
        }


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _json(value: Any) -> str:
    return orjson.dumps(value).decode()


def ingest(conn: Connection, data: bytes, *, filename: str = "",
           source: str = "upload") -> IngestResult:
    """Read ``data`` and store its reports in the caller's transaction."""
    assert source in SOURCES, source
    result = IngestResult(filename=filename)
    try:
        reports = read_report(data, filename)
    except ReportError as exc:
        result.error = exc.reason
        record_reject(conn, data, filename=filename, source=source, reason=exc.reason)
        return result
    for report in reports:
        result.reports.append(_store(conn, report, source, filename))
    return result


def record_reject(conn: Connection, data: bytes, *, filename: str, source: str,
                  reason: str) -> None:
    conn.execute(sa.text("""
        INSERT INTO receiver_report_rejects (digest, source, filename, reason, size,
                                             reason_i18n)
        VALUES (:digest, :source, :filename, :reason, :size, CAST(:i18n AS jsonb))
        ON CONFLICT (digest) DO UPDATE SET created_at = now(), reason = EXCLUDED.reason,
            reason_i18n = EXCLUDED.reason_i18n"""),
        {"digest": hashlib.sha256(data).hexdigest(), "source": source,
         "filename": filename[:500], "reason": reason[:1000], "size": len(data),
         "i18n": _json(said) if (said := text_to_data(reason)) else None})


def _store(conn: Connection, report: Report, source: str, filename: str) -> Stored:
    if isinstance(report, AggregateReport):
        domain = report.domain
        begin, end = report.begin, report.end
        policy = {"adkim": report.adkim, "aspf": report.aspf, "p": report.p, "sp": report.sp,
                  "pct": report.pct, "schema": report.schema}
        detail: dict[str, Any] = {"org_email": report.org_email}
        warnings = report.warnings
        records, messages = len(report.records), sum(r.count for r in report.records)
    elif isinstance(report, TlsReport):
        domain = report.policies[0].policy_domain if report.policies else ""
        begin, end = report.begin, report.end
        policy, detail, warnings = {}, {"contact_info": report.contact_info}, []
        records = len(report.policies)
        messages = sum(p.successful_session_count + p.failed_session_count
                       for p in report.policies)
    else:
        assert isinstance(report, FailureReport)
        domain = report.reported_domain or ""
        begin = end = report.arrival or datetime.now(UTC).replace(tzinfo=None)
        policy, warnings, records, messages = {}, [], 1, 1
        detail = {k: v for k, v in asdict(report).items() if k not in ("report_id", "kind")}
        detail["arrival"] = report.arrival.isoformat() if report.arrival else None
    row = conn.execute(sa.text("""
        INSERT INTO receiver_reports (kind, org_name, report_id, domain, begin_at, end_at,
            policy, detail, warnings, records, messages, source, filename)
        VALUES (:kind, :org, :rid, :domain, :begin, :end, CAST(:policy AS jsonb),
            CAST(:detail AS jsonb), CAST(:warnings AS jsonb), :records, :messages, :source,
            :filename)
        ON CONFLICT (org_name, report_id) DO NOTHING RETURNING id"""),
        {"kind": report.kind, "org": report.org_name[:500], "rid": report.report_id[:500],
         "domain": domain, "begin": _utc(begin), "end": _utc(end), "policy": _json(policy),
         "detail": _json(detail), "warnings": _json(warnings), "records": records,
         "messages": messages, "source": source, "filename": filename[:500]}).first()
    stored = Stored(report.kind, report.org_name, report.report_id, domain,
                    row.id if row else None, records)
    if row is None:
        return stored
    day = begin.date()
    if isinstance(report, AggregateReport):
        rows = [{
            "report": row.id, "domain": domain, "day": day, "reporter": report.org_name,
            "source_ip": r.source_ip, "count": r.count, "disposition": r.disposition,
            "dkim": r.dkim, "spf": r.spf, "header_from": r.header_from,
            "envelope_from": r.envelope_from,
            "auth": _json([{k: v for k, v in asdict(a).items() if v is not None}
                           for a in r.auth]),
        } for r in report.records]
        _copy(conn, "receiver_report_records", rows)
        _summarize(conn, domain, day, report.org_name, policy, rows)
    elif isinstance(report, TlsReport):
        rows = [{
            "report": row.id, "policy_domain": p.policy_domain, "day": day,
            "reporter": report.org_name, "policy_type": p.policy_type,
            "successful": p.successful_session_count, "failed": p.failed_session_count,
            "details": _json([{k: v for k, v in asdict(d).items() if v is not None}
                              for d in p.failure_details]),
        } for p in report.policies]
        _copy(conn, "receiver_tls_policies", rows)
    return stored


_ADD_DAILY = """
INSERT INTO dmarc_daily AS d (domain, day, reporter, source_ip, disposition, policy_p,
    policy_sp, policy_pct, messages, dmarc_pass, spf_aligned, dkim_aligned)
SELECT * FROM unnest(CAST(:domain AS text[]), CAST(:day AS date[]), CAST(:reporter AS text[]),
    CAST(:source_ip AS text[]), CAST(:disposition AS text[]), CAST(:p AS text[]),
    CAST(:sp AS text[]), CAST(:pct AS text[]), CAST(:messages AS bigint[]),
    CAST(:dmarc_pass AS bigint[]), CAST(:spf_aligned AS bigint[]),
    CAST(:dkim_aligned AS bigint[]))
ON CONFLICT ON CONSTRAINT dmarc_daily_pkey DO UPDATE SET
    messages = d.messages + EXCLUDED.messages, dmarc_pass = d.dmarc_pass + EXCLUDED.dmarc_pass,
    spf_aligned = d.spf_aligned + EXCLUDED.spf_aligned,
    dkim_aligned = d.dkim_aligned + EXCLUDED.dkim_aligned
"""


def _summarize(conn: Connection, domain: str, day: Any, reporter: str,
               policy: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Add an aggregate report's records to the per-day summary the domain page reads
    (docs/design.md §30), in the transaction that stores them. Keys are written in sorted
    order so that two reports stored at once never deadlock on the same rows."""
    p, sp, pct = ("" if policy.get(k) is None else str(policy[k]) for k in ("p", "sp", "pct"))
    sums: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        n = int(r["count"])
        entry = sums.setdefault((r["source_ip"], r["disposition"]), [0, 0, 0, 0])
        entry[0] += n
        entry[1] += n if r["dkim"] == "pass" or r["spf"] == "pass" else 0
        entry[2] += n if r["spf"] == "pass" else 0
        entry[3] += n if r["dkim"] == "pass" else 0
    keys = sorted(sums)
    k = len(keys)
    if not k:
        return
    conn.execute(sa.text(_ADD_DAILY), {
        "domain": [domain] * k, "day": [day] * k, "reporter": [reporter] * k,
        "source_ip": [ip for ip, _ in keys], "disposition": [d for _, d in keys],
        "p": [p] * k, "sp": [sp] * k, "pct": [pct] * k,
        **{name: [sums[key][i] for key in keys] for i, name in enumerate(
            ("messages", "dmarc_pass", "spf_aligned", "dkim_aligned"))}})
    conn.execute(sa.text("""
        INSERT INTO dmarc_daily_reports AS d (domain, day, reporter, reports)
        VALUES (:domain, :day, :reporter, 1)
        ON CONFLICT ON CONSTRAINT dmarc_daily_reports_pkey DO UPDATE SET
            reports = d.reports + 1"""), {"domain": domain, "day": day, "reporter": reporter})


def _copy(conn: Connection, table: str, rows: list[dict[str, Any]]) -> None:
    """COPY the rows in (an aggregate report can hold tens of thousands of records)."""
    if not rows:
        return
    columns = list(rows[0])
    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cur, cur.copy(
            f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for r in rows:
            copy.write_row([r[c] for c in columns])
