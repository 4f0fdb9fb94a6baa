"""Layouts in the browser: the list of layouts, the editor with its
preview, and the composer's "text from HTML" (the plain-text part the marketer edits)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_babel import gettext as _
from werkzeug.wrappers import Response

from webapp.blueprints.campaigns import PREVIEW_CSP
from webapp.context import actor, config, engine
from webapp.domain import layouts
from webapp.domain.errors import DomainError
from webapp.domain.fields import whole_number
from webapp.i18n import localize
from workers.building.compose import recipient_context
from workers.building.message import PREVIEW_SECONDS, Layout, TemplateError, compile_campaign

bp = Blueprint("layouts", __name__, url_prefix="/layouts")
SAMPLE_BODY = "<h1>{{ campaign.subject }}</h1>\n<p>Hello {{ name }},</p>\n<p>…</p>"


def _values() -> dict[str, Any]:
    form = request.form
    return {"name": form.get("name", ""), "html": form.get("html", ""),
            "postal_address": form.get("postal_address", "")}


def _page(layout: dict[str, Any] | None, values: dict[str, Any],
          error: DomainError | None = None) -> tuple[str, int]:
    with engine().connect() as conn:
        every = layouts.all_layouts(conn)
    return render_template("layouts/index.html", layouts=every, layout=layout, values=values,
                           error=error), 422 if error else 200


@bp.get("/")
def index() -> tuple[str, int]:
    chosen = whole_number(request.args.get("edit"))
    if chosen is None:
        return _page(None, {"name": "", "html": layouts.STARTER, "postal_address": ""})
    with engine().connect() as conn:
        layout = layouts.get(conn, chosen)
    return _page(layout, layout)


@bp.post("/")
def save() -> Response | tuple[str, int]:
    layout_id = whole_number(request.form.get("layout_id"))
    values = _values()
    try:
        with engine().begin() as conn:
            if layout_id is None:
                saved = layouts.create(conn, values, actor=actor())
            else:
                saved = layouts.update(conn, layout_id, values, actor=actor())
    except DomainError as exc:
        return _page({"id": layout_id} if layout_id is not None else None, values, exc)
    flash(_("Layout “%(name)s” saved.", name=saved["name"]), "success")
    return redirect(url_for("layouts.index", edit=saved["id"]), 303)


@bp.post("/<int:layout_id>/delete")
def delete(layout_id: int) -> Response:
    try:
        with engine().begin() as conn:
            layouts.delete(conn, layout_id, actor=actor())
    except DomainError as exc:
        flash(localize(exc.message), "error")
        return redirect(url_for("layouts.index", edit=layout_id), 303)
    flash(_("Layout deleted."), "success")
    return redirect(url_for("layouts.index"), 303)


@bp.get("/<int:layout_id>/preview.html")
def preview(layout_id: int) -> Response:
    """The layout around a sample body, for a sample recipient (shown in a sandboxed
    iframe: no script runs, whatever the HTML holds)."""
    with engine().connect() as conn:
        layout = layouts.get(conn, layout_id)
    try:
        html = compile_campaign("Sample subject", None, SAMPLE_BODY, Layout(
            layout["html"], layout["postal_address"])).render(recipient_context(
                email="someone@example.com", name="Ada", attributes={},
                unsubscribe_url=f"{config().base_url}/u/preview",
                campaign_name="", subject="Sample subject"), seconds=PREVIEW_SECONDS).html
    except TemplateError as exc:
        html = f"<p>{localize(exc.message)}</p>"
    response = Response(html or "", mimetype="text/html")
    response.headers["Content-Security-Policy"] = PREVIEW_CSP
    response.headers["X-Frame-Options"] = "SAMEORIGIN"
    return response


@bp.post("/text")
def text_from_html() -> str:
    """The composer's "Text from HTML": the plain-text part generated from its HTML body in
    the chosen layout, put in the text field for the marketer to edit (HTMX)."""
    layout_id = whole_number(request.form.get("layout_id"))
    error = None
    text = request.form.get("text", "")
    try:
        with engine().connect() as conn:
            layout = layouts.check_for_campaign(conn, layout_id)
        html = request.form.get("html", "")
        if html.strip():
            text = layouts.text_from_html(layout, html)
        else:
            error = _("Write an HTML body first: the text is made from it.")
    except DomainError as exc:
        error = localize(exc.message)
    return render_template("partials/_compose_text.html", text=text, text_error=error)
