"""Login and logout."""

from __future__ import annotations

import time
from typing import Any

from flask import (
    Blueprint,
    abort,
    current_app,
    flash,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask_babel import gettext as _
from werkzeug.wrappers import Response

from webapp import sso
from webapp.auth import count_password_attempt, end_session, start_session
from webapp.context import config, engine
from webapp.domain import audit, users
from webapp.domain import second_factor as second_factor_codes
from webapp.i18n import localize
from webapp.redirects import local_path
from workers.core.i18n import message_of

bp = Blueprint("auth", __name__)


@bp.context_processor
def _sso_button() -> dict[str, Any]:
    return {"sso_enabled": sso.enabled(config())}


def _safe_next(target: str | None) -> str:
    return local_path(target, url_for("home.index"))


@bp.route("/login", methods=["GET", "POST"])
def login() -> str | Response | tuple[str, int]:
    next_url = request.args.get("next")
    if request.method != "POST":
        return render_template("auth/login.html", next=next_url)
    email = (request.form.get("email") or "").strip()
    password = request.form.get("password") or ""
    if sso.sso_only(config(), email):
        return render_template("auth/login.html", email=email, next=next_url, error=_(
            "Addresses at this domain sign in with single sign-on, not a password.")), 403
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
    return _signed_in(user, next_url)


def _signed_in(user: dict[str, Any], next_url: str | None) -> Response:
    """The first factor (password or single sign-on) passed: the second, or the session."""
    if user.get("totp_enabled_at") is not None:
        # The password was right; the session starts only once the second factor is too.
        session.clear()
        session["pending_second_factor"] = {"user": int(user["id"]),
                                            "version": int(user["session_version"]),
                                            "at": time.time(), "next": next_url}
        return redirect(url_for("auth.second_factor"), 303)
    start_session(user)
    with engine().connect() as conn:
        if user["role"] in second_factor_codes.required_roles(conn):
            # Their role requires a second factor they have not set up: enrolment first.
            return redirect(url_for("account.second_factor"))
    return redirect(_safe_next(next_url))


PENDING_SECONDS = 300  # the second step must follow the password within this


def _pending_user() -> dict[str, Any] | None:
    pending = session.get("pending_second_factor")
    if not isinstance(pending, dict) or time.time() - pending.get("at", 0) > PENDING_SECONDS:
        return None
    with engine().connect() as conn:
        user = users.get_user(conn, int(pending["user"]))
    if not user["active"] or user["session_version"] != pending["version"]:
        return None
    return user


@bp.route("/login/second-factor", methods=["GET", "POST"])
def second_factor() -> str | Response | tuple[str, int]:
    """The login's second step: a code from the authenticator or a recovery code."""
    user = _pending_user()
    if user is None:
        session.pop("pending_second_factor", None)
        flash(_("Log in again: the second step waits at most five minutes."), "error")
        return redirect(url_for("auth.login"))
    if request.method == "GET":
        return render_template("auth/second_factor.html",
                               action=url_for("auth.second_factor"))
    attempt, refused = count_password_attempt(user["email"])
    error = None
    if refused is not None:
        return render_template("auth/second_factor.html", action=url_for(
            "auth.second_factor"), error=localize(message_of(refused))), 429
    with engine().begin() as conn:
        try:
            how = second_factor_codes.verify(conn, user["id"], config().secret_key,
                                             request.form.get("code", ""))
        except second_factor_codes.CodeRefused as exc:
            error = localize(exc.message)
            audit.record(conn, "anonymous", "user.login_failed", user["email"].lower(),
                         remote_addr=request.remote_addr or "?", reason="wrong second factor")
        else:
            users.attempt_succeeded(conn, attempt)
            audit.record(conn, user["email"], "user.login", f"user:{user['id']}",
                         remote_addr=request.remote_addr or "?", second_factor=how)
    if error is not None:
        return render_template("auth/second_factor.html", action=url_for(
            "auth.second_factor"), error=error), 401
    next_url = session["pending_second_factor"].get("next")
    start_session(user, second_factor=True)
    if how == "recovery":
        flash(_("You used a recovery code: it works only once."), "success")
    return redirect(_safe_next(next_url))


@bp.route("/logout", methods=["POST"])
def logout() -> Response:
    end_session()
    return redirect(url_for("auth.login"))


# --- single sign-on (OpenID Connect) -----------------------------------------------------

@bp.get("/login/sso")
def sso_start() -> Response:
    cfg = config()
    if not sso.enabled(cfg):
        abort(404)
    session["sso_next"] = request.args.get("next")
    response: Response = sso.client(cfg).authorize_redirect(sso.redirect_uri(cfg))
    return response


@bp.get("/login/sso/callback")
def sso_callback() -> Response | tuple[str, int]:
    cfg = config()
    if not sso.enabled(cfg):
        abort(404)
    if request.args.get("error"):
        return _sso_refused(_("The identity provider refused: %(why)s",
                              why=request.args.get("error_description")
                              or request.args["error"]))
    try:
        # State (once), PKCE verifier, nonce, and the ID token's signature, issuer,
        # audience and expiry: all checked here, else an exception.
        token = sso.client(cfg).authorize_access_token(
            claims_options=sso.claims_options(cfg), leeway=sso.LEEWAY_SECONDS)
        claims = dict(token.get("userinfo") or {})
        if not claims:
            raise ValueError("no ID token")
    except sso.FAILURES as exc:
        current_app.logger.warning("single sign-on refused: %s", exc)
        return _sso_refused(_("Single sign-on failed: the answer of the identity provider "
                              "could not be verified (%(why)s). Try again.",
                              why=type(exc).__name__))
    try:
        with engine().begin() as conn:
            user = sso.user_for(conn, cfg, claims, request.remote_addr or "?")
    except sso.SignInRefused as exc:
        return _sso_refused(localize(exc.message))
    return _signed_in(user, session.pop("sso_next", None))


def _sso_refused(message: str) -> tuple[str, int]:
    return render_template("auth/login.html", error=message), 403
