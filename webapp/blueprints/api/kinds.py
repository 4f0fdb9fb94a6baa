"""API: transactional kinds (docs/design.md §21). Admins define them; support and admins read
them."""

from __future__ import annotations

from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, body, bp
from webapp.context import actor, engine
from webapp.domain import kinds


@bp.get("/kinds")
def list_kinds() -> Response:
    with engine().connect() as conn:
        return answer({"kinds": kinds.all_as_json(conn)})


@bp.get("/kinds/<name>")
def get_kind(name: str) -> Response:
    with engine().connect() as conn:
        return answer(kinds.as_json(conn, kinds.get(conn, name)))


@bp.put("/kinds/<name>")
def put_kind(name: str) -> Response:
    """Create or edit a kind: 201 when created, 200 when edited; template errors are 422
    naming the template and its line."""
    data = body()
    with engine().begin() as conn:
        kind, created = kinds.parse_kind(conn, name, data)
        saved = kinds.save(conn, kind, actor=actor(), created=created)
    # A class change says which timings took the new class's defaults.
    saved["class_defaults_applied"] = kind.class_changes
    return answer(saved, 201 if created else 200)
