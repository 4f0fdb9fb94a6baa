"""One domain_of for every "domain of an address" (workers.core.addresses)."""

from __future__ import annotations

import pytest

from workers.core.addresses import domain_of


@pytest.mark.parametrize(("address", "domain"), [
    ("jane@example.com", "example.com"),
    ("Jane@Example.COM", "example.com"),
    ("  jane@example.com.  ", "example.com"),
    ("<jane@example.com>", "example.com"),
    ('"Jane Doe" <jane@Mail.Example.com>', "mail.example.com"),
    ("Jane (work) <jane@example.org>", "example.org"),
    ('"a@b" <jane@example.net>', "example.net"),
    ("bounces+1f.abc@bounce.example.com", "bounce.example.com"),
    ("weird@local@example.com", "example.com"),
    ("jané@exämple.com", "exämple.com"),
    # Malformed: no domain, never an exception.
    ("", ""), ("jane", ""), ("jane@", ""), ("@", ""), ("<>", ""), ('"Jane"', ""),
])
def test_domain_of(address: str, domain: str) -> None:
    assert domain_of(address) == domain


def test_callers_that_need_a_domain_add_their_fallback() -> None:
    from workers.building.compose import message_id_domain

    assert message_id_domain("news@Example.com") == "example.com"
    assert message_id_domain("not an address") == "senddock.local"
