"""Authentication (sessions for pages, bearer tokens for the API) and the role check.

The check itself is :func:`enforce_access`, run before every request against the matrix in
:mod:`webapp.access`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, abort, g, jsonify, redirect, request, session, url_for
from flask_login import LoginManager, UserMixin, current_user, login_user, logout_user
from werkzeug.wrappers import Response

from webapp import access
from webapp.context import config, engine, request_connection, role
from webapp.domain import users
from webapp.domain.fields import whole_number
from webapp.redirects import local_path

login_manager = LoginManager()
# Paths outside /api that also accept ``Authorization: Bearer`` (scrapers have no session).
METRICS_PATHS = frozenset({"/metrics"})


class User(UserMixin):
    def __init__(self, row: dict[str, Any], session_token: str) -> None:
        self.id = row["id"]
        self.email = row["email"]
        self.role = row["role"]
        self.session_version = row["session_version"]
        self.session_token = session_token
        self.locale = row.get("locale")  # the UI language they chose (None: the browser's)
        self.has_second_factor = bool(row.get("has_second_factor"))
        self.second_factor_required = bool(row.get("second_factor_required"))
        self.second_factor_at = row.get("second_factor_at")

    def get_id(self) -> str:
        # The cookie names the user, the session version and the server-side session: a
        # logout deletes the session's row, a password change or a disable every row of
        # the user (and bumps the version), so no copy of the cookie works afterwards.
        return f"{self.id}:{self.session_version}:{self.session_token}"


@login_manager.user_loader
def load_user(user_key: str) -> User | None:
    parts = user_key.split(":")
    user_id, version = (whole_number(p) for p in parts[:2]) if len(parts) == 3 else (None,
                                                                                      None)
    if user_id is None or version is None:
        return None  # includes cookies from before server-side sessions: log in again
    with engine().begin() as conn:
        row = users.session_user(conn, user_id, version, parts[2])
        if row is not None:
            users.seen(conn, parts[2], request.remote_addr or "")
    return User(row, parts[2]) if row is not None else None


def count_password_attempt(email: str) -> tuple[int, users.LoginRefused | None]:
    """Count a password check (login, or the current password on the account page)
    against the failed-attempt limits before it is made, committed at once: ``(attempt
    id, None)``, or ``(0, the refusal)`` when a limit is reached (that is recorded too)."""
    with engine().begin() as conn:
        try:
            return users.reserve_attempt(conn, email, request.remote_addr or "?"), None
        except users.LoginRefused as exc:
            return 0, exc  # caught inside the transaction: the attempt is committed


def start_session(user: dict[str, Any], *, second_factor: bool = False) -> None:
    """Log ``user`` in with a new server-side session (login, and after a password change,
    which ended the old ones); ``second_factor``: the login passed it."""
    with engine().begin() as conn:
        token = users.start_session(conn, int(user["id"]), second_factor=second_factor,
                                    user_agent=request.headers.get("User-Agent", ""),
                                    address=request.remote_addr or "")
    # A new cookie session too: nothing from before the login survives in it, the CSRF
    # token included (a token an attacker planted or read before the login is worthless).
    session.clear()
    login_user(User(user, token))


def end_session() -> None:
    """Log out: the session's row goes, so a copy of this cookie is worthless too."""
    token = getattr(current_user, "session_token", None)
    if token:
        with engine().begin() as conn:
            users.end_session(conn, token)
    logout_user()


def _api_user() -> dict[str, Any] | None:
    header = request.headers.get("Authorization", "")
    if not header.lower().startswith("bearer "):
        return None
    token = header[7:].strip()
    if not token:
        return None
    with request_connection() as conn:  # one statement: no transaction around it
        return users.user_for_token(conn, token, request.remote_addr)


def _api_error(status: int, message: str) -> Response:
    response = jsonify({"error": {"message": message, "fields": {}}})
    response.status_code = status
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="senddock"'
    return response


def enforce_access() -> Response | None:
    """Authenticate and check the role for this request's endpoint (deny by default)."""
    endpoint = request.endpoint
    allowed = access.allowed_roles(endpoint)
    # /metrics is scraped by Prometheus with an admin's bearer token, like the API.
    is_api = request.path.startswith("/api/") or request.path in METRICS_PATHS
    if is_api and endpoint not in access.PUBLIC:
        g.api_user = _api_user()
        has_header = "Authorization" in request.headers
        # A logged-in browser may use the API with its session (CSRF then applies).
        if g.api_user is None and (has_header or not current_user.is_authenticated):
            return _api_error(401, "missing or invalid API token (Authorization: Bearer …)")
    if endpoint is None:
        return None  # unknown URL: let routing answer 404/405
    if allowed is None:
        abort(403)
    if "anonymous" in allowed:
        return None
    current = role()
    if current == "anonymous":
        return redirect(url_for("auth.login", next=request.full_path.rstrip("?")))
    if current not in allowed:
        if is_api:
            return _api_error(403, f"your role ({current}) may not do this")
        abort(403)
    if not is_api and getattr(current_user, "second_factor_required", False) and \
            not current_user.has_second_factor and endpoint not in ENROLMENT_OPEN:
        # Their role requires a second factor they have not set up: enrolment first.
        return redirect(url_for("account.second_factor"))
    token = g.get("api_user") if is_api else None
    if token is not None and not access.token_allows(token["scopes"], endpoint):
        return _api_error(403, "this token's scopes ({}) do not cover this: it needs "
                          "the scope {}".format(", ".join(token["scopes"]) or "none",
                                                access.endpoint_scope(endpoint)))
    return None


# What a user whose role requires a second factor may reach before enrolling.
ENROLMENT_OPEN = frozenset({"account.second_factor", "account.enrol_second_factor",
                            "account.index", "account.change_language", "auth.logout",
                            "static"})


def step_up() -> Response | None:
    """Before a sensitive action (creating a token, changing a role, exporting a list): a
    user with a second factor whose session last passed it more than
    ``SENDDOCK_STEP_UP_MINUTES`` ago is sent to type a code, then back (a form is submitted
    again there). None: go on."""
    if not getattr(current_user, "has_second_factor", False):
        return None
    last = current_user.second_factor_at
    window = timedelta(minutes=config().step_up_minutes)
    if last is not None and datetime.now(UTC) - last < window:
        return None
    back = request.full_path.rstrip("?") if request.method == "GET" else \
        local_path(_referrer_path(), url_for("home.index"))
    return redirect(url_for("account.step_up", next=back), 303)


def _referrer_path() -> str | None:
    ref = urlsplit(request.referrer or "")
    if ref.netloc and ref.netloc != request.host:
        return None
    return ref.path + (f"?{ref.query}" if ref.query else "") if ref.path else None


def init_app(app: Flask) -> None:
    login_manager.init_app(app)
    login_manager.login_view = "auth.login"
    login_manager.session_protection = "strong"
    app.before_request(enforce_access)

    @app.context_processor
    def inject_user() -> dict[str, Any]:
        return {"current_role": role(), "session": session}
