"""SMTP TLS reports (RFC 8460 section 4, JSON)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

from workers.after_acceptance.receiver_reports.model import (
    ReportError,
    TlsFailure,
    TlsPolicy,
    TlsReport,
)
from workers.core.i18n import N_


def parse_tls(data: bytes) -> TlsReport:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ReportError(N_("invalid JSON: %(error)s", error=str(exc))) from None
    if not isinstance(doc, dict) or "policies" not in doc:
        raise ReportError(N_('JSON is not an SMTP TLS report (no "policies")'))
    missing = [k for k in ("organization-name", "date-range", "report-id") if not doc.get(k)]
    if missing:
        raise ReportError(N_("SMTP TLS report lacks %(fields)s", fields=", ".join(missing)))
    dates = doc["date-range"]
    if not isinstance(dates, dict):
        raise ReportError(N_("SMTP TLS report date-range is not an object"))
    report = TlsReport(
        org_name=str(doc["organization-name"]), report_id=str(doc["report-id"]),
        begin=_when(dates.get("start-datetime"), "start-datetime"),
        end=_when(dates.get("end-datetime"), "end-datetime"),
        contact_info=_opt(doc.get("contact-info")),
    )
    policies = doc["policies"]
    if not isinstance(policies, list):
        raise ReportError(N_("SMTP TLS report policies is not a list"))
    for item in policies:
        report.policies.append(_policy(item))
    return report


def _policy(item: Any) -> TlsPolicy:
    if not isinstance(item, dict) or not isinstance(item.get("policy"), dict):
        raise ReportError(N_('SMTP TLS report has a policy entry without "policy"'))
    policy = item["policy"]
    summary = item.get("summary") or {}
    if not policy.get("policy-domain") or not policy.get("policy-type"):
        raise ReportError(N_("SMTP TLS policy lacks policy-domain or policy-type"))
    result = TlsPolicy(
        policy_domain=str(policy["policy-domain"]).lower(),
        policy_type=str(policy["policy-type"]),
        successful_session_count=_int(summary.get("total-successful-session-count", 0)),
        failed_session_count=_int(summary.get("total-failure-session-count", 0)),
        policy_strings=[str(s) for s in policy.get("policy-string") or []],
        mx_host=[str(s) for s in policy.get("mx-host") or []],
    )
    for detail in item.get("failure-details") or []:
        if not isinstance(detail, dict) or not detail.get("result-type"):
            raise ReportError(N_("SMTP TLS failure detail lacks result-type"))
        result.failure_details.append(TlsFailure(
            result_type=str(detail["result-type"]),
            failed_session_count=_int(detail.get("failed-session-count", 0)),
            sending_mta_ip=_opt(detail.get("sending-mta-ip")),
            receiving_ip=_opt(detail.get("receiving-ip")),
            receiving_mx_hostname=_opt(detail.get("receiving-mx-hostname")),
            receiving_mx_helo=_opt(detail.get("receiving-mx-helo")),
            failure_reason_code=_opt(detail.get("failure-reason-code")),
            additional_info_uri=_opt(detail.get("additional-information")),
        ))
    return result


def _opt(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ReportError(N_("SMTP TLS session count is not a number: %(value)s",
                             value=repr(value))) from None


def _when(value: Any, name: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise ReportError(N_("SMTP TLS report %(field)s is not a date: %(value)s", field=name,
                             value=repr(value))) from None
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(UTC).replace(tzinfo=None)
    return parsed
