"""API: messages of any transactional kind (docs/design.md §21). ``202`` at once; never waits for
the relay. ``POST /messages``, ``POST /messages/batch`` and ``POST /verifications`` share one
pipeline (:mod:`webapp.domain.intake`), answered by one autocommit statement each."""

from __future__ import annotations

from flask import request
from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, body, bp
from webapp.context import actor, config, engine, request_connection, yield_to_delivery
from webapp.domain import messages, verifications


@bp.post("/messages")
def create_message() -> Response:
    yield_to_delivery()
    data = body()
    key = verifications.check_idempotency_key(request.headers.get("Idempotency-Key"))
    with request_connection() as conn:
        req = messages.parse_request(conn, data, key=key)
        job, why = messages.request(conn, config(), req, actor=actor())
    return answer({**messages.as_json(job), "existing": bool(why),
                   "existing_because": why or None}, 202)


@bp.post("/messages/batch")
def create_messages() -> Response:
    """Up to 500 messages in one call: ``207`` with one result per item (``202`` with the
    message, or the item's own status and error naming its fields)."""
    yield_to_delivery()
    data = body("messages")
    with request_connection() as conn:
        asks, errors = messages.parse_batch(conn, data)
        results = messages.batch(conn, config(), asks, errors, actor=actor())
    accepted = sum(1 for r in results if r["http_status"] == 202)
    return answer({"accepted": accepted, "rejected": len(results) - accepted,
                   "results": results}, 207)


@bp.delete("/messages")
def cancel_messages() -> Response:
    with engine().begin() as conn:
        result = messages.cancel(conn, request.args.get("kind"), request.args.get("user_id"),
                                 actor=actor())
    return answer(result)


@bp.post("/messages/resend")
def resend_message() -> Response:
    data = body("kind", "user_id")
    user_ref = verifications.check_user_id(data.get("user_id"))
    kind = data.get("kind")
    with engine().begin() as conn:
        job, reused = messages.resend(conn, config(), kind if isinstance(kind, str) else "",
                                      user_ref, actor=actor())
    return answer({**messages.as_json({**job, "kind": job.get("kind", kind)}),
                   "reused": reused}, 202)
