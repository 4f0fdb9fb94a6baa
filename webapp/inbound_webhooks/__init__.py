"""Provider webhooks (docs/design.md §18): bounces and complaints that a relay reports after
it accepted a message, each request authenticated the way its provider documents and turned
into :class:`~workers.after_acceptance.reports.Feedback` events with the references that find
the job (VERP bounce address, Message-ID, correlation ID).

One module per provider (:mod:`.ses`, :mod:`.sendgrid`, :mod:`.postmark`, :mod:`.mailgun`,
:mod:`.generic`), each a :class:`~.base.Provider`; :mod:`.registry` lists them and the route
``POST /webhooks/<name>`` looks them up there. Outgoing event webhooks (to the team's own
app) are another thing: :mod:`workers.after_acceptance.event_webhooks`.
"""

from __future__ import annotations

from webapp.inbound_webhooks.base import (
    CORRELATION_HEADER,
    Inbound,
    Provider,
    ProviderEvent,
    Refs,
    WebhookRejected,
    WebhookRequest,
)
from webapp.inbound_webhooks.generic import parse_generic
from webapp.inbound_webhooks.mailgun import parse_mailgun, read_mailgun, verify_mailgun
from webapp.inbound_webhooks.postmark import check_basic_auth, parse_postmark
from webapp.inbound_webhooks.sendgrid import parse_sendgrid, sendgrid_public_key
from webapp.inbound_webhooks.ses import (
    SNS_CERT_HOST,
    SnsCertificates,
    SnsClient,
    parse_ses,
    ses_events,
    sns_string_to_sign,
    sns_url_allowed,
    verify_sns,
)

__all__ = [
    "CORRELATION_HEADER", "SNS_CERT_HOST", "Inbound", "Provider", "ProviderEvent", "Refs",
    "SnsCertificates", "SnsClient", "WebhookRejected", "WebhookRequest", "check_basic_auth",
    "parse_generic", "parse_mailgun", "parse_postmark", "parse_sendgrid", "parse_ses",
    "read_mailgun", "sendgrid_public_key", "ses_events", "sns_string_to_sign",
    "sns_url_allowed", "verify_mailgun", "verify_sns",
]
