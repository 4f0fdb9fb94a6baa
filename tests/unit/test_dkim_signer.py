"""The DKIM signer against dkimpy: the same canonical forms, and signatures dkimpy's
verifier accepts (the key given directly here; through real DNS in tests/integration)."""

from __future__ import annotations

import dkim
import pytest
from dkim.canonicalization import Relaxed
from hypothesis import given, settings
from hypothesis import strategies as st

from webapp.domain.domain_checks import tags
from workers.building import dkim as sd
from workers.building.message import build_mime

KEYS = {alg: sd.generate_private_key(alg) for alg in sd.ALGORITHMS}


def record(alg: str) -> bytes:
    return sd.dns_value(alg, sd.public_key_b64(KEYS[alg])).encode()


def verify(message: bytes, alg: str) -> bool:
    return bool(dkim.verify(message, dnsfunc=lambda name, timeout=5: record(alg)))


def message(**overrides: object) -> bytes:
    args: dict[str, object] = {
        "from_addr": "Équipe Nouvelles <news@example.com>", "to_addr": "zoë@example.org",
        "subject": "Ünïcode and a long subject " * 10, "text": "Hi  there\t \n\n.dot\n\n\n",
        "html": "<p>Hi</p>   \n", "message_id": "<1.abc@example.com>",
        "headers": {"List-Unsubscribe": "<https://x.example.com/u/abc>",
                    "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
                    "X-SendDock-Correlation-ID": "abc"}}
    args.update(overrides)
    return build_mime(**args)  # type: ignore[arg-type]


WSP_TEXT = st.lists(st.sampled_from(["a", "b", " ", "\t", "\r\n", "é", "."]),
                    max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(WSP_TEXT)
def test_body_canonicalisation_is_dkimpys(body: str) -> None:
    raw = body.encode()
    assert sd.canonical_body(raw) == Relaxed.canonicalize_body(raw)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["x", " ", "\t", "\r\n ", "\r\n\t", ":"]),
                max_size=40).map("".join))
def test_header_canonicalisation_is_dkimpys(value: str) -> None:
    ours = sd.canonical_header(b"Subject", value.encode())
    theirs = Relaxed.canonicalize_headers([(b"Subject", value.encode())])
    assert ours == theirs[0][0] + b":" + theirs[0][1]


@pytest.mark.parametrize("alg", sd.ALGORITHMS)
def test_signature_verifies_and_covers_gmail_headers(alg: str) -> None:
    key = sd.SigningKey("example.com", "sd1", alg, KEYS[alg])
    signed = sd.sign_message(message(), [key])
    assert verify(signed, alg)
    assert all(len(line) <= 78 for line in signed.split(b"\r\n"))
    sig = dkim.DKIM(signed)
    fields = dict(sig.headers)
    h = tags(fields[b"DKIM-Signature"].decode())["h"].split(":")
    for name in ("from", "to", "subject", "date", "message-id", "list-unsubscribe",
                 "list-unsubscribe-post", "mime-version", "content-type"):
        assert h.count(name) == 2, (name, h)  # signed and oversigned
    assert "x-senddock-correlation-id" not in h


@pytest.mark.parametrize("alg", sd.ALGORITHMS)
def test_tampering_breaks_the_signature(alg: str) -> None:
    key = sd.SigningKey("example.com", "sd1", alg, KEYS[alg])
    signed = sd.sign_message(message(), [key])
    assert not verify(signed.replace(b"List-Unsubscribe-Post: List-Unsubscribe=One-Click",
                                     b"List-Unsubscribe-Post: List-Unsubscribe=Two-Click"), alg)
    assert not verify(b"From: evil@example.net\r\n" + signed, alg)  # a second From
    assert not verify(signed.replace(b"Hi", b"Ho", 1), alg)  # the body


def test_both_keys_sign_and_each_verifies() -> None:
    keys = [sd.SigningKey("example.com", "rsa1", "rsa", KEYS["rsa"]),
            sd.SigningKey("example.com", "ed1", "ed25519", KEYS["ed25519"])]
    signed = sd.sign_message(message(html=None), keys)
    d = dkim.DKIM(signed)
    records = {b"rsa1._domainkey.example.com.": record("rsa"),
               b"ed1._domainkey.example.com.": record("ed25519")}

    def dnsfunc(name: bytes, timeout: int = 5) -> bytes:
        return records[name if name.endswith(b".") else name + b"."]

    assert d.verify(0, dnsfunc=dnsfunc) and d.verify(1, dnsfunc=dnsfunc)


def test_bare_line_feeds_are_signed_as_sent() -> None:
    key = sd.SigningKey("example.com", "sd1", "rsa", KEYS["rsa"])
    signed = sd.sign_message(b"From: a@example.com\nSubject: x\n\nline\n", [key])
    assert b"\n" not in signed.replace(b"\r\n", b"")
    assert verify(signed, "rsa")


def test_a_message_without_from_is_refused() -> None:
    key = sd.SigningKey("example.com", "sd1", "rsa", KEYS["rsa"])
    with pytest.raises(sd.DkimError):
        sd.sign_message(b"Subject: x\r\n\r\nbody\r\n", [key])


def test_private_keys_are_encrypted_and_bound_to_their_row() -> None:
    der = sd.private_bytes(KEYS["ed25519"])
    stored = sd.encrypt_private_key("secret-one", "example.com", "sd1", der)
    assert der not in stored.encode() and stored.startswith("v1.")
    assert sd.decrypt_private_key("secret-one", "example.com", "sd1", stored) == der
    with pytest.raises(sd.KeyDecryptError, match="SENDDOCK_SECRET_KEY"):
        sd.decrypt_private_key("secret-two", "example.com", "sd1", stored)
    with pytest.raises(sd.KeyDecryptError):
        sd.decrypt_private_key("secret-one", "example.com", "sd2", stored)


def test_zone_line_splits_long_values() -> None:
    value = sd.dns_value("rsa", sd.public_key_b64(KEYS["rsa"]))
    line = sd.zone_line("example.com", "sd1", value)
    strings = line.split("( ", 1)[1].rsplit(" )", 1)[0].split('" "')
    assert all(len(s.strip('"')) <= 255 for s in strings)
    assert "".join(s.strip('"') for s in strings) == value
    assert line.startswith("sd1._domainkey.example.com. 3600 IN TXT")


def test_signing_domain_prefers_the_closest() -> None:
    assert sd.signing_domain("news.example.com", {"example.com"}) == "example.com"
    assert sd.signing_domain("news.example.com",
                             {"example.com", "news.example.com"}) == "news.example.com"
    assert sd.signing_domain("example.org", {"example.com"}) is None
    assert sd.signing_domain("com", {"com"}) is None


@pytest.mark.parametrize("bad", ["", "exa mple.com", "-x.com", "a..b", "x" * 300])
def test_bad_domains_are_refused(bad: str) -> None:
    with pytest.raises(sd.DkimError):
        sd.normalize_domain(bad)
