"""Provider webhooks (docs/design.md §18): ``POST /webhooks/<name>``, one route for every
provider in :mod:`webapp.inbound_webhooks.registry`.

Public routes (no session, no CSRF): each provider authenticates its requests the way it
documents (:meth:`~webapp.inbound_webhooks.base.Provider.verify`). A refused request
answers a JSON error (4xx) and changes nothing; an accepted one answers 200 with what it did.
"""

from __future__ import annotations

import logging

from flask import Blueprint, current_app, jsonify, request
from werkzeug.wrappers import Response

from webapp import context
from webapp.domain import feedback_intake
from webapp.domain.errors import DomainError
from webapp.errors import api_error
from webapp.inbound_webhooks import registry
from webapp.inbound_webhooks.base import Provider, WebhookRejected, WebhookRequest
from workers.after_acceptance.pool import thresholds

log = logging.getLogger("senddock.web")
bp = Blueprint("webhooks", __name__, url_prefix="/webhooks")

MAX_BODY = 5 * 1024 * 1024  # SendGrid batches are at most a few MB


def _body() -> bytes:
    if (request.content_length or 0) > MAX_BODY:
        raise WebhookRejected(413, "the body is too large")
    return request.get_data(cache=False)


def _receive(provider: Provider) -> Response:
    cfg = context.config()
    hook = WebhookRequest(_body(), request.headers, cfg.feedback, context.engine().begin,
                          current_app.extensions)
    key = provider.verify(hook)
    if key is not None and provider.consume_before_parse:
        with context.engine().begin() as conn:  # consumed even if refused below
            feedback_intake.consume(conn, provider.name, key)
        key = None
    inbound = provider.parse(hook)
    if key is not None:
        inbound.replay_key = key
    answer = provider.respond(inbound, hook)
    if answer is not None:
        return jsonify(answer)
    with context.engine().begin() as conn:
        summary = feedback_intake.receive(conn, inbound, provider,
                                          secret_key=cfg.secret_key,
                                          bounce_address=cfg.feedback.bounce_address,
                                          thresholds=thresholds(cfg))
    if summary["received"] or summary["ignored"]:
        log.info("webhook %s: %s", inbound.source, summary)
    return jsonify(summary)


@bp.post("/<name>")
def receive(name: str) -> Response:
    """A provider's bounce and complaint webhook (SES through SNS, SendGrid's signed event
    webhook, Postmark with basic auth, Mailgun's HMAC, or the generic bearer-token one)."""
    provider = registry.get(name)
    if provider is None:
        return api_error(404, f"no webhook provider called {name!r} "
                              f"(one of: {', '.join(registry.names())})")
    try:
        return _receive(provider)
    except WebhookRejected as exc:
        return api_error(exc.status, exc.message, exc.fields)
    except DomainError as exc:
        return api_error(exc.status, exc.message, exc.fields)
