"""The reader refuses, with a reason, what could hurt it or is no report."""

from __future__ import annotations

import gzip
import io
import zipfile

import pytest

from workers.after_acceptance.receiver_reports import (
    MAX_EXPANDED_BYTES,
    ReportError,
    read_report,
)

REPORT = b"""<?xml version="1.0"?><feedback><report_metadata><org_name>example.net</org_name>
<email>d@example.net</email><report_id>r1</report_id><date_range><begin>1700000000</begin>
<end>1700086399</end></date_range></report_metadata><policy_published><domain>example.com
</domain><p>none</p></policy_published><record><row><source_ip>192.0.2.1</source_ip>
<count>3</count><policy_evaluated><disposition>none</disposition><dkim>pass</dkim>
<spf>fail</spf></policy_evaluated></row><identifiers><header_from>example.com</header_from>
</identifiers><auth_results><dkim><domain>example.com</domain><selector>s1</selector>
<result>pass</result></dkim></auth_results></record></feedback>"""


def _reason(data: bytes) -> str:
    with pytest.raises(ReportError) as exc:
        read_report(data)
    return exc.value.reason


def test_gzip_bomb_stops_at_the_limit() -> None:
    bomb = gzip.compress(b"<" + b" " * (MAX_EXPANDED_BYTES + 1024), compresslevel=9)
    assert len(bomb) < MAX_EXPANDED_BYTES // 100
    assert "expands beyond" in _reason(bomb)


def test_zip_bomb_stops_at_the_limit() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("r.xml", b"<" + b" " * (MAX_EXPANDED_BYTES + 1024))
    assert "expands beyond" in _reason(buf.getvalue())


def test_entities_are_refused() -> None:
    laughs = (b'<?xml version="1.0"?><!DOCTYPE feedback [<!ENTITY a "aaaaaaaaaa">'
              b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;">]><feedback>&b;</feedback>')
    assert "entities" in _reason(laughs)
    external = (b'<?xml version="1.0"?><!DOCTYPE f [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
                b'<feedback>&x;</feedback>')
    assert "entities" in _reason(external)


def test_every_container_reads_the_same_report() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("example.net!example.com!1.xml", REPORT)
    for data in (REPORT, gzip.compress(REPORT), buf.getvalue()):
        [report] = read_report(data)
        assert report.kind == "aggregate"
        assert (report.org_name, report.report_id, report.domain) == (
            "example.net", "r1", "example.com")
        assert [(r.source_ip, r.count, r.dkim, r.spf) for r in report.records] == [
            ("192.0.2.1", 3, "pass", "fail")]


@pytest.mark.parametrize(("data", "words"), [
    (b"", "empty"),
    (b"   \n", "empty"),
    (b"hello there", "not a recognized report format"),
    (b"\x1f\x8bgarbage", "damaged gzip"),
    (b"PK\x03\x04garbage", "damaged zip"),
    (b"<html><body>hi</body></html>", "not a DMARC aggregate report"),
    (b"{\"a\": 1}", "not an SMTP TLS report"),
    (b"{broken", "invalid JSON"),
    (b"From: a@example.com\nTo: b@example.com\nSubject: hi\n\nhello\n", "carries no DMARC"),
    (REPORT.replace(b"<report_id>r1</report_id>", b""), "no report_id"),
    (REPORT.replace(b"<count>3</count>", b"<count>x</count>"), "count is not a number"),
])
def test_broken_files_have_a_reason(data: bytes, words: str) -> None:
    assert words in _reason(data)
