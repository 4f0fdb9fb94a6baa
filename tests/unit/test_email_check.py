"""check_email's fast path for common addresses answers exactly what email-validator's full
path answers: the same addresses accepted, normalized the same way, the same refused with
the same wording."""

from __future__ import annotations

import itertools

import pytest
from email_validator import EmailNotValidError, validate_email

from webapp.domain import lists
from webapp.domain.errors import Invalid

LOCALS = ["a", "Bob", "first.last", "x+tag", "o'neil", "a_b-c", "#!$%&*/=?^`{|}~", "1",
          "a" * 64, "a" * 65, ".lead", "trail.", "two..dots", "sp ace", "quo\"te", "\"q\"",
          "(c)x", "a,b", "a;b", "a\\b", "ü", "josé", "a@b", "", "x\ty", "tab\t"]
DOMAINS = ["example.net", "Example.NET", "sub.example.org", "xn--bcher-kva.example",
           "bücher.example", "localhost", "test", "x.test", "x.invalid", "x.local",
           "example", "a.b", "-bad.com", "bad-.com", "a..com", ".com", "com.", "example.com.",
           "1.2.3.4", "[1.2.3.4]", "x.123", "under_score.com", "a" * 63 + ".com",
           "a" * 64 + ".com", ".".join(["abcdefghij"] * 24) + ".com", "ex ample.com",
           "EXAMPLE.COM", "mail.example.co.uk", "x.onion", "x.arpa", ""]


def reference(raw: str) -> tuple[str, str]:
    """What check_email answered before the fast path: email-validator's full path."""
    try:
        return "ok", str(validate_email(raw.strip(), check_deliverability=False).normalized)
    except EmailNotValidError as exc:
        return "refused", lists.email_problem(str(exc)).__str__()


def ours(raw: str) -> tuple[str, str]:
    try:
        return "ok", lists.check_email(raw)
    except Invalid as exc:
        return "refused", str((exc.fields or {})["email"])


CORPUS = [f"{local}@{domain}" for local, domain in itertools.product(LOCALS, DOMAINS)] + [
    "no-at-sign", "two@@example.net", "a@b@example.net", " padded@example.net ",
    "x" * 240 + "@example.com", "x" * 60 + "@" + "d" * 60 + "." + "e" * 60 + "." + "f" * 60
    + ".com", "MiXeD@ExAmPlE.CoM", "a@example.net\n"]


@pytest.mark.parametrize("raw", CORPUS)
def test_same_answer_as_email_validator(raw: str) -> None:
    assert ours(raw) == reference(raw)


def test_common_addresses_take_the_fast_path() -> None:
    assert lists._plain("new.user+signup@Example.NET") == "new.user+signup@example.net"
    assert lists._plain("josé@example.net") is None  # email-validator's own path
    assert lists._plain("a@localhost") is None


def test_the_domain_cache_answers_like_the_first_time() -> None:
    for _ in range(2):
        assert ours("a@x.test") == reference("a@x.test")
        assert ours("a@Example.ORG") == ("ok", "a@example.org")
