"""The report mailbox (``SENDDOCK_REPORT_MAILBOX``): polled like the bounce mailbox
(:mod:`workers.after_acceptance.mailbox` — same IMAP/POP3 handling, folders and "one poller"
lock), but each message is read by the receiver-report reader and stored.

A message is stored and its digest recorded in ``feedback_receipts`` (source
``report-mailbox``) in one transaction, and only then moved, so a crash between the two
never stores a report twice (the unique org + report id would keep it once anyway). A
message holding no readable report is listed in ``receiver_report_rejects`` with the reason
and moved to the "could not read" folder; any other failure with one message does the same
with the error, and the poll goes on with the next message. Only database trouble ends a
poll (the message then stays, to be read again).
"""

from __future__ import annotations

import hashlib
import logging
from email.parser import BytesHeaderParser

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from workers.after_acceptance.mailbox import BouncePoller, PollResult, parse_mailbox_url
from workers.after_acceptance.receiver_reports.store import ingest, record_reject
from workers.core import pg

log = logging.getLogger("senddock.reports")

RECEIPT_SOURCE = "report-mailbox"


def _subject(raw: bytes) -> str:
    try:
        headers = BytesHeaderParser().parsebytes(raw[:65536])
        return str(headers.get("Subject") or "")[:300]
    except Exception:  # a header we cannot parse: the subject is only a label
        return ""


class ReportPoller(BouncePoller):
    lock_key = 2

    def __init__(self, engine: Engine, url: str, *, ca_file: str | None = None,
                 processed_folder: str = "Processed",
                 unreadable_folder: str = "Could not read", timeout: float = 30) -> None:
        self.engine = engine
        self.url = parse_mailbox_url(url)
        self.ca_file = ca_file
        self.processed_folder = processed_folder
        self.unreadable_folder = unreadable_folder
        self.timeout = timeout

    def process(self, raw: bytes, result: PollResult) -> str:
        digest = hashlib.sha256(raw).hexdigest()
        with self.engine.begin() as conn:
            first = conn.execute(sa.text("""
                INSERT INTO feedback_receipts (source, key) VALUES (:source, :key)
                ON CONFLICT DO NOTHING RETURNING key"""),
                {"source": RECEIPT_SOURCE, "key": digest}).first()
            if first is None:
                result.duplicates += 1
                known = conn.execute(sa.text(
                    "SELECT 1 FROM receiver_report_rejects WHERE digest = :d"),
                    {"d": digest}).first()
                return "unreadable" if known else "processed"
            stored = ingest(conn, raw, filename=_subject(raw), source="mailbox")
            if stored.error is not None:
                log.warning("report mailbox: no report in a message (%s); moved to %r",
                            stored.error, self.unreadable_folder)
                result.unreadable += 1
                return "unreadable"
            for report in stored.reports:
                if report.duplicate:
                    result.duplicates += 1
                else:
                    result.applied += 1
                key = f"{report.kind}:{'duplicate' if report.duplicate else 'stored'}"
                result.effects[key] = result.effects.get(key, 0) + 1
        return "processed"

    def read_one(self, raw: bytes, result: PollResult) -> str:
        try:
            return self.process(raw, result)
        except Exception as exc:
            if pg.classify(exc) is not None:
                raise
            log.exception("report mailbox: processing a message failed")
            error = f"processing failed: {type(exc).__name__}: {exc}"[:1000]
        with self.engine.begin() as conn:
            conn.execute(sa.text("""
                INSERT INTO feedback_receipts (source, key) VALUES (:source, :key)
                ON CONFLICT DO NOTHING"""),
                {"source": RECEIPT_SOURCE, "key": hashlib.sha256(raw).hexdigest()})
            record_reject(conn, raw, filename=_subject(raw), source="mailbox", reason=error)
        result.unreadable += 1
        return "unreadable"
