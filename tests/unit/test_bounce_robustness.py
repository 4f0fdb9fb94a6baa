"""No input makes the bounce reader raise: random bytes, every corpus message cut
short, charsets Python does not know, broken MIME, a huge part, deep nesting. ``read`` is
called directly (not ``read_safely``), so an exception fails the test instead of becoming
``kind='unreadable'``. Seeded: every run reads the same inputs."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from harness.bounce_corpus import corpus_dir
from workers.after_acceptance.bounces import read, read_safely
from workers.after_acceptance.reports import parse_report

CORPUS = corpus_dir()
needs_corpus = pytest.mark.skipif(CORPUS is None, reason="the bounce corpus is not here "
                                  "(../shared/corpora/bounces from the project's root)")
BOGUS_CHARSETS = ["ANSI_X3.110-1983", "unknown-8bit", "x-nonsense", "utf-7", "", "utf-16",
                  "iso-2022-jp", "\"", "cp1252\x00", "a" * 300]


def corpus_files() -> list[Path]:
    assert CORPUS is not None
    return sorted(p for p in CORPUS.rglob("*") if p.suffix in (".eml", ".txt")
                  and p.name not in ("README.md",) and p.parent.name != "bounces")


def test_random_bytes() -> None:
    rng = random.Random(26)
    for n in range(400):
        size = rng.choice([0, 1, 10, 100, 1000, 20_000])
        raw = bytes(rng.getrandbits(8) for _ in range(size))
        if n % 2:  # random bytes after headers that promise structure
            raw = (b"Content-Type: multipart/report; report-type=delivery-status; "
                   b"boundary=b\r\n\r\n--b\r\nContent-Type: message/delivery-status\r\n\r\n"
                   + raw)
        read(raw)


@needs_corpus
def test_every_corpus_message_cut_short() -> None:
    rng = random.Random(2026)
    for path in corpus_files():
        raw = path.read_bytes()
        for cut in {rng.randrange(len(raw) + 1), len(raw) // 2, len(raw) - 1}:
            read(raw[:max(cut, 0)])


@needs_corpus
def test_corpus_messages_with_mangled_charsets_and_encodings() -> None:
    rng = random.Random(7)
    files = corpus_files()
    for path in rng.sample(files, 150):
        raw = path.read_bytes()
        bogus = rng.choice(BOGUS_CHARSETS).encode("latin-1", "replace")
        mangled = re.sub(rb"charset=\"?[^\s;\"]+\"?", b"charset=" + bogus, raw,
                         flags=re.IGNORECASE)
        mangled = re.sub(rb"Content-Transfer-Encoding: \S+",
                         rng.choice([b"Content-Transfer-Encoding: base64",
                                     b"Content-Transfer-Encoding: quoted-printable",
                                     b"Content-Transfer-Encoding: x-uuencode"]), mangled)
        # Flip some bytes too: 8-bit garbage where 7-bit text was.
        data = bytearray(mangled)
        for _ in range(20):
            if data:
                data[rng.randrange(len(data))] = rng.getrandbits(8)
        read(bytes(data))


def test_the_charset_that_stalled_the_mailbox_is_read() -> None:
    """A DSN whose text part is in ``ANSI_X3.110-1983`` raised LookupError and
    stopped every poll at that message."""
    raw = (b"From: MAILER-DAEMON@mx.example.org\r\nTo: bounces@senddock.test\r\n"
           b"Subject: Undelivered Mail Returned to Sender\r\nMIME-Version: 1.0\r\n"
           b"Content-Type: multipart/report; report-type=delivery-status; boundary=b\r\n\r\n"
           b"--b\r\nContent-Type: text/plain; charset=ANSI_X3.110-1983\r\n\r\n"
           b"<gone@example.org>: host mx said: 550 5.1.1 User unknown \xe9\xff\r\n"
           b"--b\r\nContent-Type: message/delivery-status; charset=unknown-8bit\r\n\r\n"
           b"Reporting-MTA: dns; mx.example.org\r\n\r\n"
           b"Final-Recipient: rfc822; gone@example.org\r\nAction: failed\r\n"
           b"Status: 5.1.1\r\nDiagnostic-Code: smtp; 550 5.1.1 User unknown \xfe\r\n--b--\r\n")
    report = parse_report(raw)
    assert report.kind == "dsn"
    [event] = report.events
    assert (event.email, event.bounce, event.code) == ("gone@example.org", "hard",
                                                       "userunknown")


def test_huge_parts_and_deep_nesting() -> None:
    huge = (b"From: MAILER-DAEMON@x\r\nSubject: Returned mail\r\nContent-Type: multipart/mixed;"
            b" boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n"
            b"Content-Transfer-Encoding: base64\r\n\r\n" + b"QUJD" * 2_000_000 + b"\r\n--b--\r\n")
    assert not read_safely(huge).crashed
    nested = b"".join(b"Content-Type: multipart/mixed; boundary=b%d\r\n\r\n--b%d\r\n" % (i, i)
                      for i in range(400)) + b"Content-Type: text/plain\r\n\r\nhi\r\n"
    assert not read_safely(nested).crashed
    attached = b"".join(b"Content-Type: message/rfc822\r\n\r\n" for _ in range(300))
    assert not read_safely(attached).crashed
