"""The signed-in user's own account: change the password (every other session of theirs
ends) and, once translations exist, the UI language."""

from __future__ import annotations

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_babel import gettext as _
from flask_login import current_user
from werkzeug.wrappers import Response

from webapp import i18n
from webapp.auth import count_password_attempt, start_session
from webapp.context import actor, engine
from webapp.domain import users
from webapp.domain.errors import Invalid
from workers.core.i18n import message_of

bp = Blueprint("account", __name__, url_prefix="/account")


@bp.get("/")
def index() -> str:
    return render_template("account/index.html")


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
        return render_template("account/index.html",
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
        return render_template("account/index.html", error=error), 422
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
