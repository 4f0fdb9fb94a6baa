"""API: the suppression list (admins)."""

from __future__ import annotations

from typing import Any

from flask import request
from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, body, bp
from webapp.context import actor, engine
from webapp.domain import suppressions
from webapp.domain.errors import Invalid, NotFound
from webapp.domain.fields import whole_number

FIELDS = ("email", "reason", "job_id", "reply", "note", "created_by", "created_at")


def _entry(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in FIELDS}


@bp.get("/suppressions")
def list_suppressions() -> Response:
    """``email`` matches one address exactly, ``q`` the start of addresses, ``reason``
    filters; pages of ``limit`` (≤ 1000) continue from ``after`` (the previous ``next``)."""
    email, reason = request.args.get("email"), request.args.get("reason") or None
    if reason is not None:
        suppressions.check_reason(reason)
    suppressions.check_cursor(request.args.get("after"))
    limit = request.args.get("limit", str(suppressions.PAGE_SIZE))
    if not 1 <= (whole_number(limit) or 0) <= 1000:
        raise Invalid("limit must be a whole number from 1 to 1000",
                      fields={"limit": "out of range"})
    with engine().connect() as conn:
        if email:
            row = suppressions.get(conn, email)
            rows = [row] if row and (reason is None or row["reason"] == reason) else []
            return answer({"suppressions": [_entry(r) for r in rows], "next": None})
        page = suppressions.search(conn, query=request.args.get("q"), reason=reason,
                                   after=request.args.get("after"), limit=int(limit))
    return answer({"suppressions": [_entry(r) for r in page.rows], "next": page.next_cursor})


@bp.post("/suppressions")
def add_suppression() -> Response:
    data = body("email", "reason", "note")
    note = data.get("note", "")
    reason = data.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise Invalid("reason must be a string", fields={"reason": "must be a string"})
    if not isinstance(note, str):
        raise Invalid("note must be a string", fields={"note": "must be a string"})
    with engine().begin() as conn:
        email = data.get("email")
        if not isinstance(email, str) or not email.strip():
            raise Invalid("email is required", fields={"email": "required string"})
        created = suppressions.suppress(conn, email, "manual" if reason is None else reason,
                                        note=note, actor=actor())
        row = suppressions.get(conn, email)
    assert row is not None
    return answer({**_entry(row), "created": created}, 201 if created else 200)


@bp.delete("/suppressions/<path:email>")
def delete_suppression(email: str) -> Response:
    with engine().begin() as conn:
        cleared = suppressions.clear(conn, [email], request.args.get("note", ""),
                                     actor=actor())
    if not cleared:
        raise NotFound(f"{email} is not on the suppression list")
    return Response(status=204)
