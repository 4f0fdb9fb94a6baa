"""API: verification emails (docs/design.md §21). Answers ``202`` at once; never waits for the
relay."""

from __future__ import annotations

from flask import request
from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, body, bp
from webapp.context import actor, config, engine, request_connection, yield_to_delivery
from webapp.domain import verifications


@bp.post("/verifications")
def create_verification() -> Response:
    yield_to_delivery()
    req = verifications.parse_request(body("user_id", "email", "verify_url"))
    key = verifications.check_idempotency_key(request.headers.get("Idempotency-Key"))
    with request_connection() as conn:
        job, existing = verifications.request(conn, config(), req, idempotency_key=key,
                                              actor=actor())
    return answer({**verifications.as_json(job), "existing": existing}, 202)


@bp.post("/verifications/resend")
def resend_verification() -> Response:
    user_ref = verifications.check_user_id(body("user_id").get("user_id"))
    with engine().begin() as conn:
        job, reused = verifications.resend(conn, config(), user_ref, actor=actor())
    return answer({**verifications.as_json(job), "reused": reused}, 202)
