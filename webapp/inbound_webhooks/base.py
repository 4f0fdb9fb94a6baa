"""What every provider webhook shares (docs/design.md §18): the :class:`Provider` interface,
the request it is given, the events it reads, and the refusal it raises.

A provider is one module of this package: a :class:`Provider` subclass with a name (the
route is ``POST /webhooks/<name>``), the setting that turns it on, :meth:`Provider.verify`
(is this request really from the provider? raises :class:`WebhookRejected` when not, and
returns the request's replay key) and :meth:`Provider.parse` (the body as events), plus one
line in :mod:`webapp.inbound_webhooks.registry`.

Every failure is a :class:`WebhookRejected` with the HTTP status and a plain message; the
caller changes nothing in that case. Signed timestamps older than the configured maximum
age are refused, and so are timestamps that are not finite numbers.
"""

from __future__ import annotations

import json
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sqlalchemy.engine import Connection

from workers.after_acceptance.reports import Feedback
from workers.core.settings import FeedbackConfig

CORRELATION_HEADER = "x-senddock-correlation-id"


class WebhookRejected(Exception):
    """The request is refused as a whole: nothing may be changed. ``fields`` names the
    offending fields of a body that was read but is not valid (a 422)."""

    def __init__(self, status: int, message: str,
                 fields: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.fields = fields


@dataclass
class Refs:
    """What a provider tells us about the message an event concerns."""

    addresses: list[str] = field(default_factory=list)      # envelope senders (VERP)
    message_ids: list[str] = field(default_factory=list)    # "<...>" Message-IDs
    correlation_ids: list[str] = field(default_factory=list)


@dataclass
class ProviderEvent:
    feedback: Feedback
    refs: Refs
    raw: dict[str, Any]


@dataclass
class Inbound:
    """One authenticated webhook request: its events, the key that identifies the request
    itself (a replay of the same signed request has the same key), and for SNS the
    subscription URL to confirm."""

    source: str
    replay_key: str | None
    events: list[ProviderEvent] = field(default_factory=list)
    confirm_url: str | None = None
    ignored: int = 0  # events of kinds SendDock does not act on (deliveries, opens, ...)


@dataclass
class WebhookRequest:
    """What a provider sees of one POST: the raw body, the headers, the after-acceptance
    settings, a way to open a transaction (for checks kept in the database) and the app's
    shared objects (``extensions``: caches such as SNS certificates, replaceable by tests)."""

    body: bytes
    headers: Any  # werkzeug's Headers (case-insensitive .get), or a dict in tests
    settings: FeedbackConfig
    connect: Callable[[], AbstractContextManager[Connection]]
    extensions: dict[str, Any] = field(default_factory=dict)


class Provider(ABC):
    """One source of bounce and complaint webhooks."""

    #: The route's last segment and the ``source`` stored with each event.
    name: ClassVar[str]
    #: How the provider is called in messages ("SES", "SendGrid").
    title: ClassVar[str]
    #: The SENDDOCK_* setting (without the prefix) that turns the provider on; its value is
    #: the :class:`FeedbackConfig` attribute of the same name in lower case. Empty: always on.
    setting: ClassVar[str] = ""
    #: A request carries many events: events for messages that are not ours are recorded as
    #: unmatched instead of refusing the whole request (the provider would retry it all).
    batch: ClassVar[bool] = False
    #: The provider names no message: an event without references is matched to the newest
    #: job sent to its address (within intake's window).
    match_newest_to_address: ClassVar[bool] = False
    #: An event without a Message-ID is about the address alone (applied without a job).
    address_events: ClassVar[bool] = False
    #: The replay key :meth:`verify` returns is consumed before :meth:`parse` runs, refused or
    #: not (the signature does not cover the body, so it must not be usable twice).
    consume_before_parse: ClassVar[bool] = False

    def configured(self, settings: FeedbackConfig) -> Any:
        """The provider's setting, or a 403 saying it is off."""
        if not self.setting:
            return None
        value = getattr(settings, self.setting.lower())
        if not value:
            raise turned_off(self.setting, self.title)
        return value

    @abstractmethod
    def verify(self, request: WebhookRequest) -> str | None:
        """Raise :class:`WebhookRejected` unless the request is authentic (and fresh);
        return the request's replay key, or None when the provider signs none."""

    @abstractmethod
    def parse(self, request: WebhookRequest) -> Inbound:
        """The verified request's body as events (raises :class:`WebhookRejected` for a body
        that is not what the provider sends)."""

    def respond(self, inbound: Inbound, request: WebhookRequest) -> dict[str, Any] | None:
        """An answer of the provider's own instead of applying the events (an SNS
        subscription confirmation), or None."""
        return None


def read_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise WebhookRejected(400, "the body is not valid JSON") from None


def turned_off(setting: str, title: str) -> WebhookRejected:
    """The 403 of a provider whose setting (``SENDDOCK_`` + ``setting``) is empty."""
    return WebhookRejected(403, f"SENDDOCK_{setting} is not set: {title} webhooks are off")


def fresh_stamp(stamp: Any, max_age: float, what: str) -> None:
    """:func:`fresh` for a timestamp as the provider sent it (text or number): a 400 naming
    ``what`` unless it reads as a finite number of seconds within ``max_age`` of now."""
    try:
        value = float(stamp)
    except (TypeError, ValueError, OverflowError):
        raise WebhookRejected(400, f"{what} is not a number") from None
    fresh(value, max_age, what)


def fresh(stamp: float, max_age: float, what: str) -> None:
    """Raise unless ``stamp`` (seconds since the epoch) is within ``max_age`` of now."""
    if not math.isfinite(stamp):
        raise WebhookRejected(400, f"{what} is not a number")
    age = time.time() - stamp
    if age > max_age:
        raise WebhookRejected(400, f"{what} is too old ({int(age)} s; at most {int(max_age)} s)"
                                   " — a replay, or a clock far off")
    if age < -300:
        raise WebhookRejected(400, f"{what} is in the future")


def message_id_of(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return None
    value = value.strip()
    return value if value.startswith("<") else f"<{value}>"


def email_of(value: Any) -> str | None:
    if not isinstance(value, str) or "@" not in value:
        return None
    return value.strip().strip("<>").lower()
