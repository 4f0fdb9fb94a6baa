"""DMARC aggregate reports: RFC 7489 appendix C, its drafts, and DMARCbis (namespaced)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from lxml import etree
from publicsuffixlist import PublicSuffixList

from workers.after_acceptance.receiver_reports.model import (
    AggregateRecord,
    AggregateReport,
    AuthResult,
    ReportError,
)
from workers.core.i18n import N_

_PSL = PublicSuffixList()
_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>", re.S)
_ENTITY = re.compile(r"<!ENTITY", re.I)
_DMARC2_NS = "urn:ietf:params:xml:ns:dmarc-2.0"


def _parser(recover: bool) -> etree.XMLParser:
    return etree.XMLParser(
        recover=recover, resolve_entities=False, load_dtd=False, no_network=True,
        huge_tree=False, remove_comments=True, remove_pis=True,
    )


def _strip_ns(root: etree._Element) -> None:
    for el in root.iter():
        if isinstance(el.tag, str) and "}" in el.tag:
            el.tag = el.tag.rpartition("}")[2]


def parse_aggregate(data: bytes) -> AggregateReport:
    warnings: list[str] = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        warnings.append(f"invalid UTF-8 ({exc.reason} at byte {exc.start}); such bytes dropped")
        text = data.decode("utf-8", "ignore")
    text = text.lstrip("\ufeff")
    if _ENTITY.search(text[:65536]):
        raise ReportError(N_("XML declares entities; refused (entity expansion is not allowed)"))
    text = _DECLARATION.sub("", text, count=1).strip()
    try:
        root = etree.fromstring(text, _parser(recover=False))
    except etree.XMLSyntaxError as exc:
        warnings.append(f"invalid XML, read what could be recovered: {exc}")
        try:
            root = etree.fromstring(text, _parser(recover=True))
        except etree.XMLSyntaxError as exc2:
            raise ReportError(N_("invalid XML: %(error)s", error=str(exc2))) from None
        if root is None:
            raise ReportError(N_("invalid XML: %(error)s", error=str(exc))) from None
    try:
        return _build(root, warnings)
    except ReportError as exc:
        if warnings:  # damaged XML: say so first, it is the likely cause
            raise ReportError(N_("%(damage)s (%(reason)s)", damage=_damage(warnings[0]),
                                 reason=exc.reason)) from None
        raise


def _damage(warning: str) -> str:
    """What was wrong with a damaged file, as the first words of its warning say."""
    return N_("invalid XML") if warning.startswith("invalid XML") else warning.split(",")[0]


def _build(root: etree._Element, warnings: list[str]) -> AggregateReport:
    namespace = root.nsmap.get(None) if isinstance(root.tag, str) else None
    _strip_ns(root)
    if root.tag != "feedback":
        wrapped = root.find(".//feedback")  # some senders wrap the report in an xs:schema
        if wrapped is not None:
            root = wrapped
    if root.tag != "feedback":
        raise ReportError(N_("XML is not a DMARC aggregate report (root element <%(tag)s>)",
                             tag=str(root.tag)))
    meta = root.find("report_metadata")
    policy = root.find("policy_published")
    if meta is None:
        raise ReportError(N_("DMARC report has no <report_metadata>"))
    if policy is None:
        raise ReportError(N_("DMARC report has no <policy_published>"))

    org_name = _text(meta, "org_name")
    org_email = _text(meta, "email")
    if org_name and " " not in org_name:
        org_name = _PSL.privatesuffix(org_name.lower()) or org_name
    if not org_name:
        domain = (org_email or "").rpartition("@")[2].strip("<> ").lower()
        org_name = (_PSL.privatesuffix(domain) or domain) if domain else ""
    if not org_name:
        raise ReportError(N_("DMARC report names no reporting organization (org_name, email)"))
    report_id = (_text(meta, "report_id") or "").replace("<", "").replace(">", "")
    report_id = report_id.split("@")[0].strip()
    if not report_id:
        raise ReportError(N_("DMARC report has no report_id"))
    begin = _timestamp(meta, "date_range/begin")
    end = _timestamp(meta, "date_range/end")

    domain = (_text(policy, "domain") or "").lower()
    if not domain:
        raise ReportError(N_("DMARC report has no published policy domain"))
    p = (_text(policy, "p") or "none").lower()
    version = _text(root, "version")
    if namespace == _DMARC2_NS:
        schema = "2.0"
    elif version:
        schema = version
    else:
        schema = "draft"
    report = AggregateReport(
        org_name=org_name, org_email=org_email, report_id=report_id, begin=begin, end=end,
        domain=domain,
        adkim=(_text(policy, "adkim") or "r").lower(),
        aspf=(_text(policy, "aspf") or "r").lower(),
        p=p,
        sp=(_text(policy, "sp") or p).lower(),
        pct=_text(policy, "pct"),
        schema=schema, warnings=warnings,
    )
    for record in root.iterfind("record"):
        report.records.append(_record(record))
    if not report.records:
        raise ReportError(N_("DMARC report has no <record>"))
    return report


def _record(el: etree._Element) -> AggregateRecord:
    row = el.find("row")
    if row is None:
        raise ReportError(N_("DMARC record has no <row>"))
    source_ip = _text(row, "source_ip")
    if not source_ip:
        raise ReportError(N_("DMARC record has no source_ip"))
    try:
        count = int((_text(row, "count") or "0").strip())
    except ValueError:
        raise ReportError(N_("DMARC record count is not a number: %(value)s",
                                 value=repr(_text(row, "count")))) from None
    auth: list[AuthResult] = []
    results = el.find("auth_results")
    if results is not None:
        for dkim in results.iterfind("dkim"):
            if not _text(dkim, "domain"):
                continue  # a result for no domain says nothing
            auth.append(AuthResult(
                "dkim", (_text(dkim, "domain") or "").lower(),
                (_text(dkim, "result") or "none").lower(),
                selector=_text(dkim, "selector") or "none"))
        for spf in results.iterfind("spf"):
            if not _text(spf, "domain"):
                continue
            auth.append(AuthResult(
                "spf", (_text(spf, "domain") or "").lower(),
                (_text(spf, "result") or "none").lower(),
                scope=(_text(spf, "scope") or "mfrom").lower()))
    ids = el.find("identifiers")
    header_from = (_text(ids, "header_from") or "").lower() if ids is not None else ""
    envelope_from = _text(ids, "envelope_from") if ids is not None else None
    envelope_to = _text(ids, "envelope_to") if ids is not None else None
    if not envelope_from:
        spf_domains = [a.domain for a in auth if a.method == "spf"]
        envelope_from = spf_domains[-1] if spf_domains else None
    evaluated = row.find("policy_evaluated")
    reasons: list[str] = []
    if evaluated is not None:
        for reason in evaluated.iterfind("reason"):
            kind = _text(reason, "type")
            if kind:
                reasons.append(kind.lower())
    return AggregateRecord(
        source_ip=source_ip.strip(), count=count,
        disposition=(_text(evaluated, "disposition") or "none").lower()
        if evaluated is not None else "none",
        dkim=(_text(evaluated, "dkim") or "fail").lower() if evaluated is not None else "fail",
        spf=(_text(evaluated, "spf") or "fail").lower() if evaluated is not None else "fail",
        header_from=header_from,
        envelope_from=envelope_from.lower() if envelope_from else None,
        envelope_to=envelope_to.lower() if envelope_to else None,
        auth=auth, override_reasons=reasons,
    )


def _text(el: etree._Element | None, path: str) -> str | None:
    if el is None:
        return None
    found = el.find(path)
    if found is None or found.text is None or len(found):
        return None  # absent, empty, or markup inside a text field (damaged XML)
    value = found.text.strip()
    return value or None


def _timestamp(meta: etree._Element, path: str) -> datetime:
    raw = _text(meta, path)
    if raw is None:
        raise ReportError(N_("DMARC report has no %(field)s", field=path.replace("/", " ")))
    try:
        return datetime.fromtimestamp(int(float(raw)), UTC).replace(tzinfo=None)
    except (ValueError, OverflowError, OSError):
        name = path.replace("/", " ")
        raise ReportError(N_("DMARC report %(field)s is not a timestamp: %(value)s", field=name,
                             value=repr(raw))) from None
