"""Public endpoints of the analytics and the archive, reachable
without logging in; the signed token in each URL is the proof:

- ``/r/<token>``: a tracked link. Records the click, redirects to the link's stored URL.
- ``/o/<token>.gif``: the open pixel. Records the open, answers a 1x1 GIF.
- ``/archive/<token>``: a campaign's public web version, when its archive is on.
- ``/archive/list/<token>``: a list's published web versions.

A forged, tampered or unknown token is a 404 that says so, never a redirect.
"""

from __future__ import annotations

from flask import Blueprint, g, render_template, request
from werkzeug.wrappers import Response

from webapp.context import config, engine
from webapp.domain import archive, tracking
from webapp.domain.errors import NotFound
from webapp.i18n import LANGUAGES

bp = Blueprint("tracking", __name__)

NO_STORE = "no-store, private"
# The web version's HTML is the campaign's own: its styles may apply, nothing in it runs
# (sandbox, no scripts), its links open in a new tab or the top window on a click.
ARCHIVE_CSP = ("sandbox allow-popups allow-popups-to-escape-sandbox "
               "allow-top-navigation-by-user-activation; default-src 'none'; "
               "style-src 'unsafe-inline'; img-src * data:; font-src * data:; "
               "frame-ancestors 'none'")


def _language() -> None:
    chosen = request.args.get("lang")
    if chosen in LANGUAGES:
        g.locale_override = chosen


@bp.get("/r/<token>")
def click(token: str) -> Response:
    try:
        with engine().begin() as conn:
            url = tracking.click(conn, config().secret_key, token)
    except NotFound:
        _language()
        html = render_template("public/link_invalid.html")
        return Response(html, status=404, mimetype="text/html")
    response = Response(status=302, headers={"Location": url})
    response.headers["Cache-Control"] = NO_STORE
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


@bp.get("/o/<token>")
def open_pixel(token: str) -> Response:
    status = 200
    try:
        with engine().begin() as conn:
            tracking.open_(conn, config().secret_key, token)
    except NotFound:
        status = 404  # said by the status; the body is still an image, so nothing breaks
    response = Response(tracking.PIXEL, status=status, mimetype="image/gif")
    response.headers["Cache-Control"] = NO_STORE
    return response


@bp.get("/archive/list/<token>")
def list_archive(token: str) -> Response:
    _language()
    try:
        with engine().connect() as conn:
            page = archive.list_page(conn, base_url=config().base_url,
                                     secret_key=config().secret_key, token=token)
    except NotFound:
        return Response(render_template("public/archive.html", missing=True), status=404,
                        mimetype="text/html")
    response = Response(render_template("public/archive_list.html", page=page),
                        mimetype="text/html")
    response.headers["X-Robots-Tag"] = "noindex"
    return response


@bp.get("/archive/<token>")
def web_version(token: str) -> Response:
    _language()
    try:
        with engine().connect() as conn:
            found = archive.web_version(conn, base_url=config().base_url,
                                        secret_key=config().secret_key, token=token)
    except NotFound:
        return Response(render_template("public/archive.html", missing=True), status=404,
                        mimetype="text/html")
    if found["html"] is not None:
        response = Response(found["html"], mimetype="text/html")
        response.headers["Content-Security-Policy"] = ARCHIVE_CSP
    else:
        response = Response(render_template("public/archive.html", found=found),
                            mimetype="text/html")
    response.headers["X-Robots-Tag"] = "noindex"
    return response
