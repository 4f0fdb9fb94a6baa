"""Login and logout."""

from __future__ import annotations

from flask import Blueprint, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from webapp.auth import count_password_attempt, end_session, start_session
from webapp.context import engine
from webapp.domain import users
from webapp.i18n import localize
from webapp.redirects import local_path
from workers.core.i18n import message_of

bp = Blueprint("auth", __name__)


def _safe_next(target: str | None) -> str:
    return local_path(target, url_for("home.index"))


@bp.route("/login", methods=["GET", "POST"])
def login() -> str | Response | tuple[str, int]:
    next_url = request.args.get("next")
    if request.method != "POST":
        return render_template("auth/login.html", next=next_url)
    email = (request.form.get("email") or "").strip()
    password = request.form.get("password") or ""
    attempt, refused = count_password_attempt(email)
    if refused is None:
        # Caught inside the transaction, so the refusal's audit entry is committed.
        with engine().begin() as conn:
            try:
                user = users.authenticate(conn, attempt, email, password,
                                          request.remote_addr or "?")
            except users.LoginRefused as exc:
                refused = exc
    if refused is not None:
        status = 429 if "Too many" in str(refused) else 401
        return render_template("auth/login.html", error=localize(message_of(refused)),
                               email=email,
                               next=next_url), status
    start_session(user)
    return redirect(_safe_next(next_url))


@bp.route("/logout", methods=["POST"])
def logout() -> Response:
    end_session()
    return redirect(url_for("auth.login"))
