"""What the reader returns: plain dataclasses, independent of the storage."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


class ReportError(ValueError):
    """A file that is no report we can read; ``reason`` is one line for a person."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class AuthResult:
    method: str  # "dkim" or "spf"
    domain: str
    result: str
    selector: str | None = None  # DKIM
    scope: str | None = None  # SPF: "mfrom" or "helo"


@dataclass
class AggregateRecord:
    source_ip: str
    count: int
    disposition: str
    dkim: str  # policy_evaluated: DKIM aligned pass/fail
    spf: str  # policy_evaluated: SPF aligned pass/fail
    header_from: str
    envelope_from: str | None
    envelope_to: str | None
    auth: list[AuthResult] = field(default_factory=list)
    override_reasons: list[str] = field(default_factory=list)

    @property
    def dmarc_pass(self) -> bool:
        return self.dkim == "pass" or self.spf == "pass"


@dataclass
class AggregateReport:
    org_name: str
    org_email: str | None
    report_id: str
    begin: datetime
    end: datetime
    domain: str
    adkim: str
    aspf: str
    p: str
    sp: str
    pct: str | None  # absent in DMARCbis
    schema: str  # "draft", "1.0" or "2.0"
    records: list[AggregateRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    kind: str = "aggregate"


@dataclass
class FailureReport:
    feedback_type: str
    reported_domain: str | None
    source_ip: str | None
    arrival: datetime | None
    original_mail_from: str | None
    original_rcpt_to: str | None
    auth_failure: list[str]
    delivery_result: str | None
    report_id: str  # the report message's Message-ID, else a digest of the report part
    org_name: str  # who sent the report (From domain)
    kind: str = "failure"


@dataclass
class TlsFailure:
    result_type: str
    failed_session_count: int
    sending_mta_ip: str | None = None
    receiving_ip: str | None = None
    receiving_mx_hostname: str | None = None
    receiving_mx_helo: str | None = None
    failure_reason_code: str | None = None
    additional_info_uri: str | None = None


@dataclass
class TlsPolicy:
    policy_domain: str
    policy_type: str
    successful_session_count: int
    failed_session_count: int
    policy_strings: list[str] = field(default_factory=list)
    mx_host: list[str] = field(default_factory=list)
    failure_details: list[TlsFailure] = field(default_factory=list)


@dataclass
class TlsReport:
    org_name: str
    report_id: str
    begin: datetime
    end: datetime
    contact_info: str | None
    policies: list[TlsPolicy] = field(default_factory=list)
    kind: str = "smtp_tls"
