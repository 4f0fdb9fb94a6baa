"""Pages for recipients, reachable without logging in: the unsubscribe link. The signed
token in the URL is the proof (P10); a GET never unsubscribes by itself, because link
scanners and mail previewers follow links."""

from __future__ import annotations

from flask import Blueprint, render_template, request
from werkzeug.wrappers import Response

from webapp.context import config, engine
from webapp.domain import unsubscribe_links
from webapp.domain.errors import NotFound

bp = Blueprint("public", __name__)


def _invalid(token: str) -> tuple[str, int]:
    return render_template("public/unsubscribe.html", invalid=True,
                           test_link=token in ("test-message", "preview")), 404


@bp.get("/u/<token>")
def unsubscribe(token: str) -> str | tuple[str, int]:
    with engine().connect() as conn:
        recipient = unsubscribe_links.recipient_for(conn, config().secret_key, token)
    if recipient is None:
        return _invalid(token)
    return render_template("public/unsubscribe.html", recipient=recipient, token=token)


@bp.post("/u/<token>/confirm")
def unsubscribe_confirm(token: str) -> str | tuple[str, int]:
    try:
        with engine().begin() as conn:
            recipient = unsubscribe_links.unsubscribe(conn, config().secret_key, token,
                                                      via="unsubscribe page")
    except NotFound:
        return _invalid(token)
    return render_template("public/unsubscribe.html", recipient=recipient, done=True)


@bp.post("/u/<token>")
def unsubscribe_one_click(token: str) -> Response:
    """RFC 8058 one-click: the mail client POSTs ``List-Unsubscribe=One-Click`` to the
    List-Unsubscribe URL, without a session or CSRF token (the signed URL is the proof)."""
    if request.form.get("List-Unsubscribe") != "One-Click":
        return Response("Expected the form body List-Unsubscribe=One-Click (RFC 8058).\n",
                        status=400, mimetype="text/plain")
    try:
        with engine().begin() as conn:
            unsubscribe_links.unsubscribe(conn, config().secret_key, token,
                                          via="one-click")
    except NotFound:
        return Response("This unsubscribe link is not valid.\n", status=404,
                        mimetype="text/plain")
    return Response("You are unsubscribed.\n", status=200, mimetype="text/plain")
