"""Provider webhooks (docs/design.md §18): ``POST /webhooks/ses|sendgrid|postmark|mailgun|generic``.

Public routes (no session, no CSRF): each authenticates itself the way its provider
documents (:mod:`webapp.webhooks`). A refused request answers a JSON error (4xx) and
changes nothing; an accepted one answers 200 with what it did.
"""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, current_app, jsonify, request
from werkzeug.wrappers import Response

from webapp import context
from webapp.domain import feedback_intake
from webapp.domain.errors import DomainError
from webapp.errors import api_error
from webapp.webhooks import (
    Inbound,
    SnsCertificates,
    WebhookRejected,
    check_basic_auth,
    parse_generic,
    parse_postmark,
    parse_sendgrid,
    parse_ses,
    read_mailgun,
    sendgrid_public_key,
    sns_url_allowed,
    verify_mailgun,
)
from workers.after_acceptance.pool import thresholds
from workers.core import outgoing

log = logging.getLogger("senddock.web")
bp = Blueprint("webhooks", __name__, url_prefix="/webhooks")

MAX_BODY = 5 * 1024 * 1024  # SendGrid batches are at most a few MB


class SnsClient:
    """What /webhooks/ses needs from the outside: the signing certificates and the
    subscription confirmation GET. Tests replace ``app.extensions["senddock.sns"]``."""

    def __init__(self, certificates: SnsCertificates | None = None) -> None:
        self.certificates = certificates or SnsCertificates()
        self.confirmed: list[str] = []

    def confirm(self, url: str) -> None:
        if not sns_url_allowed(url, self.certificates.host_pattern):
            raise WebhookRejected(403, "SubscribeURL is not an Amazon SNS URL")
        answer = outgoing.request("GET", url, self.certificates.guard)
        if answer.status != 200:
            raise OSError(answer.error)
        self.confirmed.append(url)


def _sns() -> SnsClient:
    client = current_app.extensions.get("senddock.sns")
    if client is None:
        guard = context.config().feedback.guard(timeout=10)
        client = current_app.extensions["senddock.sns"] = SnsClient(
            SnsCertificates(guard=guard))
    return client


def _body() -> bytes:
    if (request.content_length or 0) > MAX_BODY:
        raise WebhookRejected(413, "the body is too large")
    return request.get_data(cache=False)


def _apply(inbound: Inbound) -> Response:
    cfg = context.config()
    with context.engine().begin() as conn:
        summary = feedback_intake.receive(conn, inbound, secret_key=cfg.secret_key,
                                          bounce_address=cfg.feedback.bounce_address,
                                          thresholds=thresholds(cfg))
    if summary["received"] or summary["ignored"]:
        log.info("webhook %s: %s", inbound.source, summary)
    return jsonify(summary)


def _answer(handler: Any) -> Response:
    try:
        result: Response = handler()
        return result
    except WebhookRejected as exc:
        return api_error(exc.status, exc.message)
    except DomainError as exc:
        return api_error(exc.status, exc.message, exc.fields)


@bp.post("/ses")
def ses() -> Response:
    """Amazon SES notifications through an SNS HTTPS subscription."""
    def handle() -> Response:
        cfg = context.config()
        client = _sns()
        inbound = parse_ses(_body(), client.certificates, cfg.feedback.ses_topic_arns,
                            cfg.feedback.webhook_max_age)
        if inbound.confirm_url is not None:
            try:
                client.confirm(inbound.confirm_url)
            except WebhookRejected:
                raise
            except outgoing.Refused as exc:
                raise WebhookRejected(403, f"could not confirm the subscription: {exc}"
                                      ) from None
            except Exception as exc:
                raise WebhookRejected(502, f"could not confirm the subscription: "
                                           f"{type(exc).__name__}") from None
            log.info("confirmed the SNS subscription (%s)", inbound.replay_key)
            return jsonify({"confirmed": True})
        return _apply(inbound)
    return _answer(handle)


@bp.post("/sendgrid")
def sendgrid() -> Response:
    """SendGrid's Signed Event Webhook."""
    def handle() -> Response:
        cfg = context.config()
        raw_key = cfg.feedback.sendgrid_webhook_key
        key = sendgrid_public_key(raw_key) if raw_key else None
        return _apply(parse_sendgrid(_body(), request.headers, key,
                                     cfg.feedback.webhook_max_age))
    return _answer(handle)


@bp.post("/postmark")
def postmark() -> Response:
    """Postmark's bounce and spam-complaint webhooks (basic auth in the webhook URL)."""
    def handle() -> Response:
        check_basic_auth(request.headers.get("Authorization"),
                         context.config().feedback.postmark_webhook_auth)
        return _apply(parse_postmark(_body()))
    return _answer(handle)


@bp.post("/mailgun")
def mailgun() -> Response:
    """Mailgun's webhooks (signature object, HMAC-SHA256)."""
    def handle() -> Response:
        cfg = context.config()
        item, key = verify_mailgun(_body(), cfg.feedback.mailgun_signing_key)
        with context.engine().begin() as conn:  # consumed even if refused below
            feedback_intake.consume(conn, "mailgun", key)
        return _apply(read_mailgun(item, cfg.feedback.webhook_max_age))
    return _answer(handle)


@bp.post("/generic")
def generic() -> Response:
    """Any other source: ``Authorization: Bearer <webhook token>``, body as docs/design.md §18."""
    def handle() -> Response:
        with context.engine().begin() as conn:
            ok = feedback_intake.check_webhook_token(conn, request.headers.get("Authorization"))
        if not ok:
            raise WebhookRejected(401, "a valid webhook token is required "
                                       "(Authorization: Bearer <token from senddock "
                                       "webhook-token create>)")
        inbound, errors = parse_generic(_body())
        if errors:
            return api_error(422, "the event is not valid",
                             {e["field"]: e["error"] for e in errors})
        return _apply(inbound)
    return _answer(handle)
