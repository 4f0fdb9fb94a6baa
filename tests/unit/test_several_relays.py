"""SENDDOCK_SMTP_URL with several relays (docs/design.md §17): the syntax, the roles and the route
of each stream (its own relays first, then the others as failover)."""

from __future__ import annotations

import pytest

from workers.core.relays import parse_relays, route
from workers.core.settings import ConfigError, load

TWO = ("smtp://u:p%40ss@tx.example:587?tls=starttls&role=transactional&name=tx, "
       "smtps://bulk.example?role=campaign")


def test_one_url_is_one_relay_for_everything() -> None:
    [relay] = parse_relays("smtp://127.0.0.1:2525?tls=none")
    assert (relay.index, relay.name, relay.role) == (1, "relay", "all")
    assert relay.smtp.port == 2525 and route([relay], "campaign") == [relay]


def test_several_relays_with_roles_names_and_failover_order() -> None:
    tx, bulk = parse_relays(TWO)
    assert (tx.index, tx.name, tx.role, tx.smtp.password) == (1, "tx", "transactional", "p@ss")
    assert (bulk.index, bulk.name, bulk.role) == (2, "bulk.example:465", "campaign")
    assert bulk.smtp.tls == "ssl" and "role" not in bulk.smtp.redacted()
    assert route([tx, bulk], "transactional") == [tx, bulk]  # the other one is failover
    assert route([tx, bulk], "campaign") == [bulk, tx]
    spaced = parse_relays("smtp://a.example?tls=none\n  smtp://b.example?tls=none&role=all")
    assert [r.name for r in spaced] == ["a.example:25", "b.example:25"]
    assert route(spaced, "campaign") == spaced  # both serve it: the order given


@pytest.mark.parametrize(("raw", "message"), [
    ("smtp://a.example?role=bulk", "role='bulk' must be one of all, transactional, campaign"),
    ("smtp://a.example?tls=none, smtp://?tls=none", "relay 2: has no host name"),
    ("smtp://a.example?tls=none&name=x, smtp://b.example?tls=none&name=x", "used twice"),
    ("smtp://a.example?name=no%20spaces", "name='no spaces' must be"),
    ("smtp://a.example?tls=none, smtp://b.example?tls=maybe", "relay 2: tls='maybe'"),
])
def test_a_bad_relay_list_is_one_line_naming_the_variable(raw: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load({"SMTP_URL": raw, "SECRET_KEY": "k" * 32, "DATABASE_URL": "postgresql://x/y"})
    text = str(caught.value)
    assert text.startswith("SENDDOCK_SMTP_URL") and message in text and "\n" not in text
    assert "p@ss" not in text
