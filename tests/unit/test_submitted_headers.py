"""Submitted messages (workers/building/submitted.py): our X-SendDock-* headers and Bcc
go, every other byte stays."""

from __future__ import annotations

from datetime import UTC, datetime

from workers.building import submitted

RAW = (b"From: Shop <orders@shop.example.com>\r\n"
       b"X-SendDock-Kind: receipt\r\n"
       b"To: ann@example.org\r\n"
       b"Bcc: hidden@example.org,\r\n"
       b"  other@example.org\r\n"
       b"x-senddock-user:  u-42\r\n"
       b"Subject: =?utf-8?q?Gr=C3=BC=C3=9Fe?=\r\n"
       b"\tfolded\r\n"
       b"BCC: second@example.org\r\n"
       b"X-SendDockish: kept (not our prefix)\r\n"
       b"\r\n"
       b"Bcc: in the body stays\r\n"
       b"X-SendDock-Kind: body too\r\n"
       + "Grüße\r\n".encode())


def test_strips_our_headers_and_bcc_with_their_continuation_lines() -> None:
    out = submitted.strip_headers(RAW)
    head, body = submitted.split(out)
    assert head == (b"From: Shop <orders@shop.example.com>\r\n"
                    b"To: ann@example.org\r\n"
                    b"Subject: =?utf-8?q?Gr=C3=BC=C3=9Fe?=\r\n"
                    b"\tfolded\r\n"
                    b"X-SendDockish: kept (not our prefix)\r\n")
    assert body == submitted.split(RAW)[1]  # the body byte for byte, "Bcc:" lines included


def test_bare_lf_messages_and_no_body() -> None:
    raw = b"From: a@example.com\nX-SendDock-Kind: k\nSubject: s\n\nbody\n"
    assert submitted.strip_headers(raw) == b"From: a@example.com\nSubject: s\n\nbody\n"
    assert submitted.strip_headers(b"From: a@example.com\r\nBcc: b@x\r\n") == \
        b"From: a@example.com\r\n"


def test_header_values_are_unfolded_and_case_blind() -> None:
    assert submitted.header_values(RAW, "x-senddock-kind") == ["receipt"]
    assert submitted.header_values(RAW, "X-SendDock-User") == ["u-42"]
    assert submitted.header_values(RAW, "bcc") == ["hidden@example.org,  other@example.org",
                                                   "second@example.org"]
    assert submitted.from_address(RAW) == "orders@shop.example.com"


def test_prepared_adds_correlation_and_missing_message_id_and_date_only() -> None:
    now = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
    out = submitted.prepared(RAW, correlation_id="c-1", message_id="<j@x>", now=now)
    assert out.startswith(b"X-SendDock-Correlation-ID: c-1\r\nMessage-ID: <j@x>\r\n"
                          b"Date: Sun, 06 Dec 2026 09:00:00 +0000\r\nFrom: Shop")
    with_ids = b"Message-ID: <own@x>\r\nDate: Mon, 1 Jan 2024 00:00:00 +0000\r\n" + RAW
    out = submitted.prepared(with_ids, correlation_id="c-2", message_id="<j@x>", now=now)
    assert out.count(b"Message-ID:") == 1 and b"<own@x>" in out
    assert out.endswith("Grüße\r\n".encode())


def test_signature_binds_the_stored_message() -> None:
    good = {"data": {"smtp_message_id": 7,
                     "smtp_signature": submitted.signature("k", 7)}}
    assert submitted.stored_id(good) == 7
    assert submitted.signature("k", 7) != submitted.signature("k", 8)
    assert submitted.signature("k", 7) != submitted.signature("other", 7)
    assert submitted.stored_id({"data": {"smtp_message_id": True}}) is None
    assert submitted.stored_id({"data": {"x": 1}}) is None
