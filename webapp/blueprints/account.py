"""The signed-in user's own account: change the password (every other session of theirs
ends) and, once translations exist, the UI language."""

from __future__ import annotations

from typing import Any

from cryptography.exceptions import InvalidTag
from flask import Blueprint, flash, g, redirect, render_template, request, session, url_for
from flask_babel import gettext as _
from flask_babel import ngettext
from flask_login import current_user
from werkzeug.wrappers import Response

from webapp import i18n
from webapp.auth import count_password_attempt, start_session
from webapp.context import actor, config, engine
from webapp.domain import second_factor, users
from webapp.domain.errors import Invalid
from webapp.redirects import local_path
from workers.core.i18n import message_of

bp = Blueprint("account", __name__, url_prefix="/account")


def _sessions() -> list[dict[str, Any]]:
    with engine().connect() as conn:
        return users.list_sessions(conn, int(current_user.id),
                                   getattr(current_user, "session_token", None))


@bp.get("/")
def index() -> str:
    return render_template("account/index.html", sessions=_sessions())


@bp.post("/sessions/<handle>/end")
def end_session(handle: str) -> Response:
    """End one of your sessions (the one in use: a log out)."""
    mine = getattr(current_user, "session_token", None)
    with engine().begin() as conn:
        ended = users.end_session_by_handle(conn, int(current_user.id), handle, actor())
    if ended and mine and users.session_handle(mine) == handle:
        return redirect(url_for("auth.login"), 303)
    flash(_("That session has ended: its browser is signed out.") if ended
          else _("That session had already ended."), "success" if ended else "error")
    return redirect(url_for("account.index") + "#sessions", 303)


@bp.post("/sessions/end-others")
def end_other_sessions() -> Response:
    with engine().begin() as conn:
        ended = users.end_other_sessions(conn, int(current_user.id),
                                         getattr(current_user, "session_token", None),
                                         actor())
    flash(ngettext("%(num)s other session ended.", "%(num)s other sessions ended.", ended),
          "success")
    return redirect(url_for("account.index") + "#sessions", 303)


@bp.post("/password")
def change_password() -> Response | tuple[str, int]:
    current = request.form.get("current", "")
    new = request.form.get("password", "")
    error = None
    with engine().connect() as conn:
        me = users.get_user(conn, int(current_user.id))
    # The current-password check is a password guess like a login: counted first, under
    # the same per-account and per-address limits (a stolen session cannot guess on).
    attempt, refused = count_password_attempt(me["email"])
    if refused is not None:
        return render_template("account/index.html", sessions=_sessions(),
                               error=i18n.localize(message_of(refused))), 429
    with engine().begin() as conn:
        right = users.verify_password(me["password_hash"], current)
        if right:
            users.attempt_succeeded(conn, attempt)
        if not right:
            error = _("Your current password is not that one: nothing changed.")
        elif new != request.form.get("confirm", ""):
            error = _("The new password and its confirmation differ: nothing changed.")
        else:
            try:
                users.set_password(conn, me["id"], new, actor=actor())
            except Invalid as exc:
                error = _("Not changed: %(why)s.", why=i18n.localize(exc.message))
        fresh = users.get_user(conn, me["id"])
    if error:
        return render_template("account/index.html", error=error, sessions=_sessions()), 422
    # set_password ended every session of this user; this one goes on with the new version.
    start_session(fresh)
    flash(_("Password changed. Your other sessions have ended."), "success")
    return redirect(url_for("account.index"), 303)


@bp.post("/language")
def change_language() -> Response:
    chosen = request.form.get("locale") or None
    try:
        with engine().begin() as conn:
            users.set_locale(conn, int(current_user.id), chosen, allowed=i18n.LANGUAGES,
                             actor=actor())
    except Invalid as exc:
        flash(i18n.localize(exc.message), "error")
    else:
        current_user.locale = chosen
        flash(_("Language saved."), "success")
    return redirect(url_for("account.index"), 303)


# --- two-factor ---------------------------------------------------------------------------

def _pending_secret() -> str:
    """The secret being enrolled, kept sealed in the session until a code confirms it (a
    reload shows the same QR code)."""
    key = config().secret_key
    sealed = session.get("enrol_secret")
    if sealed:
        try:
            return second_factor.unseal(key, sealed, purpose="enrol")
        except (ValueError, InvalidTag):
            pass
    secret = second_factor.new_secret()
    session["enrol_secret"] = second_factor.seal(key, secret, purpose="enrol")
    return secret


def _second_factor_page(error: str | None = None, codes: list[str] | None = None,
                        status: int = 200) -> tuple[str, int]:
    with engine().connect() as conn:
        state = second_factor.status(conn, int(current_user.id))
    qr = secret = None
    if state["totp_enabled_at"] is None:
        secret = _pending_secret()
        qr = second_factor.qr_svg(second_factor.provisioning_uri(secret, current_user.email))
    g.no_store = True  # a secret or recovery codes are on it
    return render_template("account/second_factor.html", state=state, qr=qr, secret=secret,
                           codes=codes, error=error), status


def second_factor_page() -> tuple[str, int]:
    return _second_factor_page()


bp.add_url_rule("/second-factor", endpoint="second_factor", view_func=second_factor_page,
                methods=["GET"])


@bp.post("/second-factor/enrol")
def enrol_second_factor() -> tuple[str, int] | Response:
    if current_user.has_second_factor:
        return redirect(url_for("account.second_factor"), 303)
    secret = _pending_secret()
    attempt, refused = count_password_attempt(current_user.email)
    if refused is not None:
        return _second_factor_page(i18n.localize(message_of(refused)), status=429)
    try:
        with engine().begin() as conn:
            codes = second_factor.enrol(conn, int(current_user.id), config().secret_key,
                                        secret, request.form.get("code", ""), actor=actor())
            users.attempt_succeeded(conn, attempt)
            # Changing the second factor ends the user's other sessions; this one goes on.
            users.end_sessions(conn, int(current_user.id))
            fresh = users.get_user(conn, int(current_user.id))
    except Invalid as exc:
        return _second_factor_page(i18n.localize(exc.message), status=422)
    session.pop("enrol_secret", None)
    start_session(fresh, second_factor=True)
    g.no_store = True
    return render_template("account/second_factor.html", state={
        "totp_enabled_at": fresh["totp_enabled_at"], "recovery_left": len(codes),
        "required": False}, qr=None, secret=None, codes=codes, error=None), 200


@bp.route("/step-up", methods=["GET", "POST"])
def step_up() -> str | Response | tuple[str, int]:
    """Type a code again before a sensitive action; then back to ``next``."""
    next_url = local_path(request.args.get("next"), url_for("home.index"))
    action = url_for("account.step_up", next=next_url)
    if not current_user.has_second_factor:
        return redirect(next_url, 303)  # nothing to check
    if request.method == "GET":
        return render_template("auth/second_factor.html", action=action, step_up=True)
    attempt, refused = count_password_attempt(current_user.email)
    if refused is not None:
        return render_template("auth/second_factor.html", action=action, step_up=True,
                               error=i18n.localize(message_of(refused))), 429
    try:
        with engine().begin() as conn:
            second_factor.verify(conn, int(current_user.id), config().secret_key,
                                 request.form.get("code", ""))
            users.attempt_succeeded(conn, attempt)
            users.second_factor_passed(conn, current_user.session_token)
    except Invalid as exc:
        return render_template("auth/second_factor.html", action=action, step_up=True,
                               error=i18n.localize(exc.message)), 422
    flash(_("Confirmed. Go on with what you were doing."), "success")
    return redirect(next_url, 303)
