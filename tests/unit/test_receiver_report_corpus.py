"""Every file of the shared DMARC/TLS corpus, read by our reader and compared with
parsedmarc's reading (``expected.json``) on the fields the corpus README names.

The comparison is generic: both readings are mapped to the same plain fields and compared
record by record; nothing here knows a particular file. It prints an agreement table and
fails below 99 % of records agreeing, on any exception, on any total that differs, or when a
file parsedmarc refuses is read (or one it reads is refused).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from workers.after_acceptance.receiver_reports import (
    AggregateReport,
    FailureReport,
    ReportError,
    TlsReport,
    read_report,
)

CORPUS = Path(os.environ.get("SENDDOCK_DMARC_CORPUS", "/work/shared/corpora/dmarc"))
TARGET = 0.99

pytestmark = pytest.mark.skipif(
    not (CORPUS / "expected.json").exists(), reason=f"no corpus at {CORPUS}")


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _tls_when(value: str) -> str:
    from datetime import UTC, datetime

    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if parsed.tzinfo:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return _when(parsed)


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


# --- parsedmarc's reading → plain fields ---------------------------------------------------

def oracle_aggregate(rep: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    meta, pol = rep["report_metadata"], rep["policy_published"]
    head = {
        "org": meta["org_name"], "id": meta["report_id"],
        "begin": meta["begin_date"], "end": meta["end_date"],
        "domain": _lower(pol["domain"]), "adkim": pol["adkim"], "aspf": pol["aspf"],
        "p": pol["p"], "sp": pol["sp"], "pct": pol["pct"],
    }
    rows = []
    for r in rep["records"]:
        pe, ids, auth = r["policy_evaluated"], r["identifiers"], r["auth_results"]
        rows.append({
            "source_ip": r["source"]["ip_address"], "count": r["count"],
            "disposition": pe["disposition"], "dkim": pe["dkim"], "spf": pe["spf"],
            "header_from": _lower(ids["header_from"]) or "",
            "envelope_from": _lower(ids["envelope_from"]) or None,
            "dkim_results": sorted((_lower(a.get("domain")) or "", a.get("selector"),
                                    _lower(a.get("result"))) for a in auth["dkim"]),
            "spf_results": sorted((_lower(a.get("domain")) or "", _lower(a.get("scope")),
                                   _lower(a.get("result"))) for a in auth["spf"]),
        })
    return head, rows


def oracle_tls(rep: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    head = {"org": rep["organization_name"], "id": rep["report_id"],
            "begin": _tls_when(rep["begin_date"]), "end": _tls_when(rep["end_date"])}
    rows = []
    for p in rep["policies"]:
        rows.append({
            "domain": _lower(p["policy_domain"]), "type": p["policy_type"],
            "ok": p["successful_session_count"], "failed": p["failed_session_count"],
            "details": sorted(
                tuple(sorted((k, v) for k, v in d.items() if v is not None))
                for d in p.get("failure_details", [])),
        })
    return head, rows


def oracle_failure(rep: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return {}, [{"type": rep["feedback_type"], "domain": _lower(rep["reported_domain"]),
                 "source_ip": rep["source"]["ip_address"],
                 "arrival": rep["arrival_date_utc"]}]


# --- our reading → the same plain fields ---------------------------------------------------

def ours_aggregate(rep: AggregateReport) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    head = {"org": rep.org_name, "id": rep.report_id, "begin": _when(rep.begin),
            "end": _when(rep.end), "domain": rep.domain, "adkim": rep.adkim,
            "aspf": rep.aspf, "p": rep.p, "sp": rep.sp, "pct": rep.pct}
    rows = []
    for r in rep.records:
        rows.append({
            "source_ip": r.source_ip, "count": r.count, "disposition": r.disposition,
            "dkim": r.dkim, "spf": r.spf, "header_from": r.header_from,
            "envelope_from": r.envelope_from,
            "dkim_results": sorted((a.domain, a.selector, a.result)
                                   for a in r.auth if a.method == "dkim"),
            "spf_results": sorted((a.domain, a.scope, a.result)
                                  for a in r.auth if a.method == "spf"),
        })
    return head, rows


def ours_tls(rep: TlsReport) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    head = {"org": rep.org_name, "id": rep.report_id, "begin": _when(rep.begin),
            "end": _when(rep.end)}
    rows = []
    for p in rep.policies:
        rows.append({
            "domain": p.policy_domain, "type": p.policy_type,
            "ok": p.successful_session_count, "failed": p.failed_session_count,
            "details": sorted(
                tuple(sorted((k, v) for k, v in vars(d).items() if v is not None))
                for d in p.failure_details),
        })
    return head, rows


def ours_failure(rep: FailureReport) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return {}, [{"type": rep.feedback_type, "domain": rep.reported_domain,
                 "source_ip": rep.source_ip,
                 "arrival": _when(rep.arrival) if rep.arrival else None}]


ORACLE = {"aggregate": oracle_aggregate, "smtp_tls": oracle_tls, "failure": oracle_failure}


def ours(rep: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if isinstance(rep, AggregateReport):
        return ours_aggregate(rep)
    if isinstance(rep, TlsReport):
        return ours_tls(rep)
    return ours_failure(rep)


def _key(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, default=str)


def test_corpus_agrees_with_parsedmarc() -> None:
    expected = json.loads((CORPUS / "expected.json").read_text())["reports"]
    table: dict[str, Counter[str]] = {}
    problems: list[str] = []
    for entry in expected:
        kind = entry["type"]
        stats = table.setdefault(kind, Counter())
        stats["files"] += 1
        data = (CORPUS / entry["file"]).read_bytes()
        try:
            reports = read_report(data, entry["file"])
        except ReportError as exc:
            if kind == "invalid":
                stats["refused"] += 1
                assert exc.reason.strip(), entry["file"]
            else:
                problems.append(f"{entry['file']}: refused ({exc.reason}), parsedmarc reads it")
            continue
        except Exception as exc:  # any other exception is a failure to report
            stats["exceptions"] += 1
            problems.append(f"{entry['file']}: exception {exc!r}")
            continue
        if kind == "invalid":
            problems.append(f"{entry['file']}: read, parsedmarc refuses it ({entry['error']})")
            continue
        assert len(reports) == 1, f"{entry['file']}: {len(reports)} reports"
        assert reports[0].kind == kind, f"{entry['file']}: read as {reports[0].kind}"
        want_head, want_rows = ORACLE[kind](entry["report"])
        got_head, got_rows = ours(reports[0])
        stats["headers"] += 1
        if want_head == got_head:
            stats["headers agreeing"] += 1
        else:
            diff = {k: (want_head.get(k), got_head.get(k)) for k in want_head
                    if want_head.get(k) != got_head.get(k)}
            problems.append(f"{entry['file']}: header differs {diff}")
        stats["records"] += len(want_rows)
        if len(want_rows) != len(got_rows):
            problems.append(f"{entry['file']}: {len(got_rows)} records, parsedmarc "
                            f"{len(want_rows)}")
        remaining = Counter(_key(r) for r in got_rows)
        for row in want_rows:
            if remaining[_key(row)] > 0:
                remaining[_key(row)] -= 1
                stats["records agreeing"] += 1
            elif len(problems) < 40:
                problems.append(f"{entry['file']}: no record like {_key(row)[:400]}")
        if kind == "aggregate":
            want_total = sum(r["count"] for r in want_rows)
            got_total = sum(r["count"] for r in got_rows)
            stats["messages"] += want_total
            if want_total != got_total:
                problems.append(f"{entry['file']}: total {got_total}, parsedmarc {want_total}")

    print("\nkind        files  records  agreeing   rate    headers ok  refused  exceptions")
    total = agreeing = 0
    for kind, s in sorted(table.items()):
        rate = s["records agreeing"] / s["records"] if s["records"] else 1.0
        total += s["records"]
        agreeing += s["records agreeing"]
        print(f"{kind:<11} {s['files']:>5} {s['records']:>8} {s['records agreeing']:>9} "
              f"{rate:>7.2%} {s['headers agreeing']:>5}/{s['headers']:<5} {s['refused']:>8} "
              f"{s['exceptions']:>10}")
    overall = agreeing / total if total else 1.0
    print(f"all records: {agreeing}/{total} = {overall:.2%} (target {TARGET:.0%})")
    for line in problems:
        print("  ", line)
    assert not any("exception" in p or "refused" in p or "total" in p or "read, parsedmarc"
                   in p or "header" in p for p in problems), problems
    assert overall >= TARGET
