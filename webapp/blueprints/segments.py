"""Segments in the browser: a list's saved segments, the builder with
its live count (one partial serves the page and the HTMX fragment), and the composer's
audience count."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_babel import gettext as _
from werkzeug.wrappers import Response

from webapp.context import actor, engine
from webapp.domain import lists, segments
from webapp.domain.errors import DomainError
from webapp.domain.fields import whole_number
from webapp.i18n import localize

bp = Blueprint("segments", __name__)
PAGE = "/lists/<int:list_id>/segments"
EMPTY_ROWS = 3  # blank condition rows the builder offers under the saved ones


def _conditions() -> list[dict[str, Any]]:
    form = request.form
    return segments.from_form(list(zip(form.getlist("choice"), form.getlist("key"),
                                       form.getlist("value"), strict=False)))


def _rows(conditions: list[dict[str, Any]]) -> list[dict[str, str]]:
    rows = segments.as_rows(conditions)
    return rows + [{"choice": "", "key": "", "value": ""}] * EMPTY_ROWS


def _count(list_id: int, conditions: list[dict[str, Any]]) -> dict[str, Any]:
    """The live count, or the first bad condition said plainly (never an error page)."""
    with engine().connect() as conn:
        try:
            checked = segments.validate(conn, conditions)
        except DomainError as exc:
            return {"error": exc}
        return {"count": segments.count(conn, list_id, checked)}


def _page(list_id: int, segment: dict[str, Any] | None, name: str,
          conditions: list[dict[str, Any]], error: DomainError | None = None
          ) -> tuple[str, int]:
    with engine().connect() as conn:
        the_list = lists.get_list(conn, list_id)
        saved = segments.for_list(conn, list_id)
    live = _count(list_id, conditions) if error is None else {}
    return render_template("segments/index.html", the_list=the_list, saved=saved,
                           segment=segment, name=name, rows=_rows(conditions),
                           choices=segments.CHOICES, error=error,
                           count=live.get("count"), count_error=live.get("error")
                           ), 422 if error else 200


@bp.get(f"{PAGE}/")
def index(list_id: int) -> tuple[str, int]:
    chosen = whole_number(request.args.get("edit"))
    segment = None
    if chosen is not None:
        with engine().connect() as conn:
            segment = segments.get(conn, chosen)
        if segment["list_id"] != list_id:
            segment = None
    return _page(list_id, segment, segment["name"] if segment else "",
                 segment["conditions"] if segment else [])


@bp.post(f"{PAGE}/count")
def count(list_id: int) -> str:
    """The builder's live count (HTMX, on every change)."""
    with engine().connect() as conn:
        lists.get_list(conn, list_id)
    return render_template("partials/_segment_count.html", list_id=list_id,
                           **_count(list_id, _conditions()))


@bp.post(f"{PAGE}/")
def save(list_id: int) -> Response | tuple[str, int]:
    segment_id = whole_number(request.form.get("segment_id"))
    name, conditions = request.form.get("name", ""), _conditions()
    try:
        with engine().begin() as conn:
            if segment_id is None:
                saved = segments.create(conn, list_id, name, conditions, actor=actor())
            else:
                if segments.get(conn, segment_id)["list_id"] != list_id:
                    segment_id = None
                    raise DomainError(_("That segment belongs to another list."))
                saved = segments.update(conn, segment_id, name, conditions, actor=actor())
    except DomainError as exc:
        segment = {"id": segment_id} if segment_id is not None else None
        return _page(list_id, segment, name, conditions, error=exc)
    flash(_("Segment “%(name)s” saved.", name=saved["name"]), "success")
    return redirect(url_for("segments.index", list_id=list_id), 303)


@bp.post(f"{PAGE}/<int:segment_id>/delete")
def delete(list_id: int, segment_id: int) -> Response:
    try:
        with engine().begin() as conn:
            if segments.get(conn, segment_id)["list_id"] == list_id:
                segments.delete(conn, segment_id, actor=actor())
    except DomainError as exc:
        flash(localize(exc.message), "error")
    else:
        flash(_("Segment deleted."), "success")
    return redirect(url_for("segments.index", list_id=list_id), 303)


@bp.get("/segments/audience")
def audience() -> str:
    """The composer's live count: who the campaign would reach with the chosen list and
    segment (HTMX, on every change of either)."""
    list_id = whole_number(request.args.get("list_id"))
    segment_id = whole_number(request.args.get("segment_id"))
    if list_id is None:
        return render_template("partials/_segment_count.html", count=None, error=None)
    try:
        with engine().connect() as conn:
            lists.get_list(conn, list_id)
            segments.check_for_campaign(conn, list_id, segment_id)
            conditions = segments.get(conn, segment_id)["conditions"] if segment_id else []
            live: dict[str, Any] = {"count": segments.count(conn, list_id, conditions)}
    except DomainError as exc:
        live = {"error": exc}
    return render_template("partials/_segment_count.html", composer=True, **live)
