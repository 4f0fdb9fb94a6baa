"""API: a person's data on request (GDPR articles 15 and 17), admins; the address is in
the body, never in the URL (kept out of access logs)."""

from __future__ import annotations

from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, body, bp
from webapp.context import actor, engine
from webapp.domain import personal_data


@bp.post("/personal-data/export")
def export_personal_data() -> Response:
    email = str(body("email").get("email") or "")
    with engine().begin() as conn:
        return answer(personal_data.export(conn, email, actor=actor()))


@bp.post("/personal-data/erase")
def erase_personal_data() -> Response:
    email = str(body("email").get("email") or "")
    with engine().begin() as conn:
        counts = personal_data.erase(conn, email, actor=actor())
    return answer({"erased": True, "counts": counts})
