"""API: segments of a list and layouts. A campaign picks them by
``segment_id`` and ``layout_id`` in ``POST /campaigns``; ``POST /campaigns/{id}/send``
then sends to the segment."""

from __future__ import annotations

from typing import Any

from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, body, bp
from webapp.context import actor, engine
from webapp.domain import layouts, lists, segments


def _segment_json(conn: Any, segment: dict[str, Any]) -> dict[str, Any]:
    return {**segment, "audience": segments.count(conn, segment["list_id"],
                                                  segment["conditions"])}


@bp.get("/lists/<int:list_id>/segments")
def list_segments(list_id: int) -> Response:
    with engine().connect() as conn:
        return answer({"segments": segments.for_list(conn, list_id)})


@bp.post("/lists/<int:list_id>/segments")
def create_segment(list_id: int) -> Response:
    data = body("name", "conditions")
    with engine().begin() as conn:
        segment = segments.create(conn, list_id, data.get("name"), data.get("conditions", []),
                                  actor=actor())
        return answer(_segment_json(conn, segment), 201)


@bp.post("/lists/<int:list_id>/segments/count")
def count_segment(list_id: int) -> Response:
    """Who these conditions pick on the list right now, without saving them."""
    data = body("conditions")
    with engine().connect() as conn:
        lists.get_list(conn, list_id)
        checked = segments.validate(conn, data.get("conditions", []))
        return answer({"conditions": checked,
                       "audience": segments.count(conn, list_id, checked)})


@bp.get("/segments/<int:segment_id>")
def get_segment(segment_id: int) -> Response:
    with engine().connect() as conn:
        return answer(_segment_json(conn, segments.get(conn, segment_id)))


@bp.put("/segments/<int:segment_id>")
def update_segment(segment_id: int) -> Response:
    data = body("name", "conditions")
    with engine().begin() as conn:
        segment = segments.update(conn, segment_id, data.get("name"),
                                  data.get("conditions", []), actor=actor())
        return answer(_segment_json(conn, segment))


@bp.delete("/segments/<int:segment_id>")
def delete_segment(segment_id: int) -> Response:
    with engine().begin() as conn:
        segments.delete(conn, segment_id, actor=actor())
    return Response(status=204)


LAYOUT_FIELDS = ("name", "html", "postal_address")


@bp.get("/layouts")
def list_layouts() -> Response:
    with engine().connect() as conn:
        return answer({"layouts": layouts.all_layouts(conn)})


@bp.post("/layouts")
def create_layout() -> Response:
    data = body(*LAYOUT_FIELDS)
    with engine().begin() as conn:
        return answer(layouts.create(conn, data, actor=actor()), 201)


@bp.get("/layouts/<int:layout_id>")
def get_layout(layout_id: int) -> Response:
    with engine().connect() as conn:
        return answer(layouts.get(conn, layout_id))


@bp.put("/layouts/<int:layout_id>")
def update_layout(layout_id: int) -> Response:
    data = body(*LAYOUT_FIELDS)
    with engine().begin() as conn:
        return answer(layouts.update(conn, layout_id, data, actor=actor()))


@bp.delete("/layouts/<int:layout_id>")
def delete_layout(layout_id: int) -> Response:
    with engine().begin() as conn:
        layouts.delete(conn, layout_id, actor=actor())
    return Response(status=204)
