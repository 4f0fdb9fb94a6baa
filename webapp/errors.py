"""Errors become clear answers: JSON with a message and the offending fields on the API,
a readable page elsewhere. Bad input is never a 500 (P9)."""

from __future__ import annotations

import logging

from flask import Flask, current_app, g, jsonify, make_response, render_template, request
from flask_babel import gettext as _
from flask_babel import lazy_gettext as _l
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.wrappers import Response

from webapp.db import DatabaseUnavailable
from webapp.domain.errors import DomainError, Overloaded, TooMany
from webapp.i18n import localize
from workers.core import pg
from workers.core.i18n import N_

log = logging.getLogger("senddock.web")

TITLES = {
    "disk_full": _l("The database's disk is full"),
    "too_many_connections": _l("Too many database connections"),
    "read_only": _l("The database is read-only"),
    "shutdown": _l("The database is restarting"),
    "busy": _l("The database is busy"),
    "unreachable": _l("Database unavailable"),
}
# What a page says for an HTTP error (the API keeps the English of api_error's callers).
HTTP_MESSAGES = {
    404: N_("Not found."),
    405: N_("Method not allowed here."),
    413: N_("The request is too large."),
    403: N_("Your role does not allow this."),
}
HTTP_TITLES = {404: _l("Not found"), 405: _l("Method not allowed"),
               413: _l("Request too large"), 403: _l("Forbidden")}


def api_error(status: int, message: str, fields: dict[str, str] | None = None,
              **extra: object) -> Response:
    body: dict[str, object] = {"message": message, "fields": fields or {}}
    body.update(extra)
    response = jsonify({"error": body})
    response.status_code = status
    return response


def _wants_json() -> bool:
    return request.path.startswith("/api/") or (request.headers.get("HX-Request") == "true" \
        and request.accept_mimetypes.best == "application/json")


def _render_without_database() -> None:
    """Let the error page render when the database is what failed: if the user could not
    be loaded (flask-login keeps it in ``g._login_user``), show the page as to a visitor
    instead of asking the database again from inside base.html."""
    if "_login_user" not in g:
        g._login_user = current_app.login_manager.anonymous_user()  # type: ignore[attr-defined]


def _public() -> bool:
    """Whether the error is shown with the public layout (docs/design.md §34): on a page
    anyone may open, or to a visitor who is not logged in."""
    from flask_login import current_user

    from webapp import access

    if request.endpoint in access.PUBLIC and request.endpoint != "static":
        return True
    try:
        return not current_user.is_authenticated
    except Exception:  # the user could not be loaded (the database is what failed)
        return True


def _page(status: int, title: object, message: object) -> tuple[str, int]:
    """The error page, its message in the page's language."""
    template = "public/error.html" if _public() else "error.html"
    return render_template(template, status=status, title=str(title),
                           message=localize(message)), status


def http_error(exc: HTTPException) -> Response:
    """An HTTP error (404, 405, 413, ...) as JSON on the API, a page elsewhere."""
    status = exc.code or 500
    message = HTTP_MESSAGES.get(status, exc.description or exc.name)
    response = api_error(status, message) if _wants_json() else make_response(
        _page(status, HTTP_TITLES.get(status, exc.name), message))
    if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
        # RFC 9110: a 405 lists the methods the resource supports.
        response.headers["Allow"] = ", ".join(sorted(exc.valid_methods))
    return response


def init_app(app: Flask) -> None:
    @app.errorhandler(DomainError)
    def domain_error(exc: DomainError) -> Response | tuple[str, int]:
        if _wants_json():
            response = api_error(exc.status, exc.message, exc.fields, **exc.extra)
        else:
            return _page(exc.status, _("That did not work"), exc.message)
        if isinstance(exc, TooMany | Overloaded):
            response.headers["Retry-After"] = str(exc.retry_after)
        return response

    @app.errorhandler(CSRFError)
    def csrf_error(exc: CSRFError) -> Response | tuple[str, int]:
        message = "The form expired or was not sent by SendDock ({}). Reload the page and " \
                  "try again."
        if _wants_json():
            return api_error(400, message.format(exc.description))
        return _page(400, _("Please try again"), _(
            "The form expired or was not sent by SendDock (%(why)s). Reload the page and "
            "try again.", why=exc.description))

    @app.errorhandler(DatabaseUnavailable)
    def db_unavailable(exc: DatabaseUnavailable) -> Response | tuple[str, int]:
        return db_problem(pg.translate(exc.__cause__ or exc) or
                          pg.DatabaseProblem(pg.UNREACHABLE, str(exc)))

    @app.errorhandler(pg.DatabaseProblem)
    def db_problem(exc: pg.DatabaseProblem) -> Response | tuple[str, int]:
        """Every database problem, translated once by :func:`workers.core.pg.classify`: a 503
        with the problem's own plain message and a Retry-After, as JSON or a page."""
        problem = exc.problem
        log.warning("database %s on %s %s: %s", problem.status, request.method,
                    request.path, exc.detail or problem.kind)
        if _wants_json():
            response = api_error(503, problem.message, problem=problem.kind)
        else:
            _render_without_database()
            title = TITLES.get(problem.kind, TITLES["unreachable"])
            html, status = _page(503, title, problem.message)
            response = current_app.make_response((html, status))
        response.headers["Retry-After"] = str(problem.retry_after)
        return response

    app.errorhandler(HTTPException)(http_error)

    def bad_value(exc: Exception) -> Response | tuple[str, int]:
        # A value the database refused (out of range, malformed): the input's fault, not
        # ours. The checks in views and domain functions should catch it first, naming
        # the field; this answer keeps a missed one from becoming a 500 (P9).
        reason = str(getattr(exc, "orig", exc)).splitlines()[0]
        log.warning("database refused a value on %s %s: %s", request.method, request.path,
                    reason)
        message = N_("A value in the request cannot be stored: %(reason)s", reason=reason)
        if _wants_json():
            return api_error(400, message)
        return _page(400, _("That did not work"), message)

    @app.errorhandler(RecursionError)
    def too_deep(exc: RecursionError) -> Response | tuple[str, int]:
        # Input nested too deeply for a recursive parser (a template's blocks, say) that no
        # earlier check caught by name: still the input's fault (P9).
        log.warning("input nested too deeply on %s %s", request.method, request.path)
        message = N_("The input is nested too deeply to process; simplify it.")
        if _wants_json():
            return api_error(400, message)
        return _page(400, _("That did not work"), message)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response | tuple[str, int]:
        import sqlalchemy as sa

        translated = pg.translate(exc)
        if translated is not None:
            return db_problem(translated)
        if isinstance(exc, sa.exc.DataError):
            return bad_value(exc)
        log.exception("unexpected error on %s %s", request.method, request.path)
        message = N_("Something went wrong on our side. It has been logged.")
        if _wants_json():
            return api_error(500, message)
        return _page(500, _("Internal error"), message)
