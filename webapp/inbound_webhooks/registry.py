"""The provider webhooks SendDock accepts, by name (docs/design.md §18). A provider is one
module of this package plus one line here."""

from __future__ import annotations

from webapp.inbound_webhooks.base import Provider
from webapp.inbound_webhooks.generic import Generic
from webapp.inbound_webhooks.mailgun import Mailgun
from webapp.inbound_webhooks.postmark import Postmark
from webapp.inbound_webhooks.sendgrid import SendGrid
from webapp.inbound_webhooks.ses import Ses

PROVIDERS: dict[str, Provider] = {p.name: p for p in (
    Ses(),
    SendGrid(),
    Postmark(),
    Mailgun(),
    Generic(),
)}


def get(name: str) -> Provider | None:
    """The provider served at ``POST /webhooks/<name>``, or None."""
    return PROVIDERS.get(name)


def names() -> tuple[str, ...]:
    return tuple(PROVIDERS)
