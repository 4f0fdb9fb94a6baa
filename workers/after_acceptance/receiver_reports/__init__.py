"""Reader for what receivers report back about our mail (docs/deliverability.md).

``read_report(data, filename)`` takes one file as uploaded, posted or found in the report
mailbox and returns the reports in it:

- DMARC aggregate reports (RFC 7489 appendix C and the DMARCbis schema), as plain XML,
  gzip, zip, or attached to an email message;
- DMARC failure reports (RFC 6591 ARF ``message/feedback-report``, and the plain-text
  reports some receivers send instead);
- SMTP TLS reports (RFC 8460 JSON, plain, gzip, or attached to an email message).

A file that is none of these, or that is damaged beyond reading, raises
:class:`ReportError` whose ``reason`` says why in one line.
"""

from workers.after_acceptance.receiver_reports.model import (
    AggregateRecord,
    AggregateReport,
    AuthResult,
    FailureReport,
    ReportError,
    TlsFailure,
    TlsPolicy,
    TlsReport,
)
from workers.after_acceptance.receiver_reports.reader import MAX_EXPANDED_BYTES, read_report

__all__ = [
    "MAX_EXPANDED_BYTES",
    "AggregateRecord",
    "AggregateReport",
    "AuthResult",
    "FailureReport",
    "ReportError",
    "TlsFailure",
    "TlsPolicy",
    "TlsReport",
    "read_report",
]
