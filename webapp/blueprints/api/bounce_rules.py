"""API: bounce rules (admins; docs/design.md §36): the corrections that decide how later
bounces are read, listed, added and deleted as on the Bounce review page."""

from __future__ import annotations

from typing import Any

from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, body, bp
from webapp.context import actor, engine
from webapp.domain import bounce_review

FIELDS = ("id", "pattern", "reason", "note", "created_by", "created_at", "hits",
          "last_hit_at")


def _rule(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in FIELDS}


@bp.get("/bounce-rules")
def list_bounce_rules() -> Response:
    with engine().connect() as conn:
        return answer({"rules": [_rule(r) for r in bounce_review.rules(conn)]})


@bp.post("/bounce-rules")
def add_bounce_rule() -> Response:
    data = body("pattern", "reason", "note")
    with engine().begin() as conn:
        rule_id = bounce_review.add_rule(conn, data.get("pattern", ""), data.get("reason", ""),
                                         data.get("note", ""), actor())
        [row] = bounce_review.rules(conn, rule_id)
    return answer(_rule(row), 201)


@bp.delete("/bounce-rules/<int:rule_id>")
def delete_bounce_rule(rule_id: int) -> Response:
    with engine().begin() as conn:
        bounce_review.delete_rule(conn, rule_id, actor())
    return Response(status=204)
