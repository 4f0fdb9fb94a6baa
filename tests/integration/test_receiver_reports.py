"""Receiver reports stored in PostgreSQL: per report and per record, the same report kept
once, a broken file listed with its reason; and the report mailbox against the private
Dovecot (a broken message never stops the poll)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import sqlalchemy as sa

from harness.dovecot import Mailbox
from workers.after_acceptance.receiver_reports.mailbox import ReportPoller
from workers.after_acceptance.receiver_reports.store import ingest

CORPUS = Path("/work/shared/corpora/dmarc")
HERE = Path(__file__).resolve().parents[1] / "unit" / "receiver_reports"

needs_corpus = pytest.mark.skipif(not CORPUS.exists(), reason="no DMARC corpus")


def sample(name: str) -> bytes:
    return (HERE / name).read_bytes()


def counts(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in (
            "receiver_reports", "receiver_report_records", "receiver_tls_policies",
            "receiver_report_rejects")}


def test_reports_and_records_are_stored_once(engine: sa.Engine) -> None:
    xml = sample("aggregate.xml")
    with engine.begin() as conn:
        first = ingest(conn, xml, filename="a.xml", source="upload")
    assert first.error is None
    assert [(r.kind, r.domain, r.duplicate, r.records) for r in first.reports] == [
        ("aggregate", "senddock.test", False, 3)]
    with engine.begin() as conn:  # the same report again, gzipped: kept once
        again = ingest(conn, gzip.compress(xml), filename="a.xml.gz", source="api")
    assert [r.duplicate for r in again.reports] == [True]
    with engine.begin() as conn:
        tls = ingest(conn, sample("tls.json"), filename="t.json", source="upload")
        bad = ingest(conn, b"<feedback><oops", filename="bad.xml", source="upload")
    assert tls.reports[0].kind == "smtp_tls"
    assert bad.error is not None and "invalid XML" in bad.error
    assert counts(engine) == {"receiver_reports": 2, "receiver_report_records": 3,
                              "receiver_tls_policies": 1, "receiver_report_rejects": 1}
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT source_ip, count, dkim, spf, disposition, day::text, reporter "
            "FROM receiver_report_records ORDER BY id")).all()
        reject = conn.execute(sa.text(
            "SELECT filename, reason, source FROM receiver_report_rejects")).one()
    assert [tuple(r) for r in rows] == [
        ("192.0.2.10", 40, "pass", "pass", "none", "2025-11-30", "google.com"),
        ("192.0.2.11", 2, "fail", "fail", "none", "2025-11-30", "google.com"),
        ("203.0.113.9", 5, "fail", "fail", "reject", "2025-11-30", "google.com")]
    assert reject.filename == "bad.xml" and reject.source == "upload"


@needs_corpus
def test_report_mailbox_reads_each_message_once_and_a_broken_one_never_stops_it(
        engine: sa.Engine, dovecot: Mailbox) -> None:
    messages = [
        (CORPUS / "aggregate" / "twilight.eml").read_bytes(),
        b"From: someone@example.org\r\nTo: dmarc@senddock.test\r\nSubject: hello\r\n\r\nhi\r\n",
        (CORPUS / "smtp_tls" / "google.com_smtp_tls_report.eml").read_bytes(),
        (CORPUS / "failure" / "dmarc_ruf_report_linkedin.eml").read_bytes(),
        (CORPUS / "aggregate" / "mimecast-weird-gzip.eml").read_bytes(),
    ]
    for raw in messages:
        dovecot.deliver(raw)
    poller = ReportPoller(engine, dovecot.url("imaps"),
                          ca_file=str(dovecot.server.tls.ca_file))
    result = poller.poll_once()
    assert result is not None
    assert (result.seen, result.applied, result.unreadable) == (5, 4, 1)
    assert dovecot.count("INBOX") == 0
    assert dovecot.count("Processed") == 4
    assert dovecot.count('"Could not read"') == 1
    with engine.connect() as conn:
        kinds = sorted(conn.execute(sa.text(
            "SELECT kind FROM receiver_reports")).scalars())
        reject = conn.execute(sa.text(
            "SELECT filename, reason, source FROM receiver_report_rejects")).one()
    assert kinds == ["aggregate", "aggregate", "failure", "smtp_tls"]
    assert (reject.filename, reject.source) == ("hello", "mailbox")
    assert "carries no DMARC or SMTP TLS report" in reject.reason
    # The same reports delivered again (a receiver resending): kept once.
    dovecot.deliver(messages[0])
    again = poller.poll_once()
    assert again is not None and (again.seen, again.applied, again.duplicates) == (1, 0, 1)
    assert counts(engine)["receiver_reports"] == 4
