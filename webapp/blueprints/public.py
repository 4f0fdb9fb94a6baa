"""Pages for recipients and visitors, reachable without logging in: the unsubscribe link
(the person's preference page),
and a list's subscription form with its confirmation link (double opt-in). The signed
token in the URL is the proof (P10); a GET never unsubscribes or confirms by itself,
because link scanners and mail previewers follow links."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, g, render_template, request
from flask_babel import gettext as _
from werkzeug.wrappers import Response

from webapp.context import config, engine
from webapp.domain import subscriptions, unsubscribe_links
from webapp.domain.errors import Invalid, NotFound, TooMany
from webapp.i18n import LANGUAGES, current_language, localize

bp = Blueprint("public", __name__)


def _invalid(token: str) -> tuple[str, int]:
    return render_template("public/unsubscribe.html", invalid=True,
                           test_link=token in ("test-message", "preview")), 404


def _preferences(recipient: dict[str, Any], token: str, status: int = 200,
                 **extra: Any) -> tuple[str, int]:
    """The preference page (in the language the person chose, else ``?lang=``, else the
    browser's): the lists they are on, leave one or all, their language."""
    language = _language(recipient.get("locale"))
    return render_template("public/unsubscribe.html", recipient=recipient, token=token,
                           language=language, languages=LANGUAGES, **extra), status


@bp.get("/u/<token>")
def unsubscribe(token: str) -> str | tuple[str, int]:
    """The link in every message: the preference page. A GET changes nothing."""
    with engine().connect() as conn:
        recipient = unsubscribe_links.recipient_for(conn, config().secret_key, token)
    if recipient is None:
        return _invalid(token)
    return _preferences(recipient, token)


@bp.post("/u/<token>/confirm")
def unsubscribe_confirm(token: str) -> str | tuple[str, int]:
    """The page's main button: leave the list the message came from (every list when the
    message names none); the others stay."""
    try:
        with engine().begin() as conn:
            recipient = unsubscribe_links.unsubscribe(conn, config().secret_key, token,
                                                      via="unsubscribe page")
    except NotFound:
        return _invalid(token)
    return _preferences(recipient, token, done=True)


@bp.post("/u/<token>/preferences")
def preferences_save(token: str) -> str | tuple[str, int]:
    """The preference form: leave the ticked lists (or all of them), set the language."""
    form = request.form
    try:
        leave_ids = [int(v) for v in form.getlist("leave")]
    except ValueError:
        leave_ids = [-1]  # not a list id: refused below with a message
    locale = form.get("locale") or None
    try:
        with engine().begin() as conn:
            recipient = unsubscribe_links.update(
                conn, config().secret_key, token, leave_ids=leave_ids,
                leave_all=form.get("leave_all") == "1", locale=locale,
                tracking=form.get("tracking") == "1" if form.get("tracking_shown") else None)
    except NotFound:
        return _invalid(token)
    except Invalid as exc:
        with engine().connect() as conn:
            found = unsubscribe_links.recipient_for(conn, config().secret_key, token)
        assert found is not None
        _language(found["locale"])
        return _preferences(found, token, 422, error=localize(exc.message))
    return _preferences(recipient, token, saved=True)


@bp.post("/u/<token>")
def unsubscribe_one_click(token: str) -> Response:
    """RFC 8058 one-click: the mail client POSTs ``List-Unsubscribe=One-Click`` to the
    List-Unsubscribe URL, without a session or CSRF token (the signed URL is the proof).
    It leaves the list the message came from; the person's other lists stay."""
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


# --- subscription forms with double opt-in (webapp.domain.subscriptions) -----------------

def _language(default: str | None = None) -> str:
    """The public pages' language: ``?lang=`` (the embed snippet may fix it), else the
    request's own (a confirmation link), else the browser's Accept-Language."""
    chosen = request.values.get("lang") or default
    if chosen in LANGUAGES:
        g.locale_override = chosen
    return current_language()


def _frameable(response: Response) -> Response:
    """Let any site embed the page in an iframe (the embed snippet): it uses no session,
    so there is nothing to click-jack."""
    g.frameable = True
    return response


def _form_page(list_id: int, status: int = 200, **extra: Any) -> Response:
    language = _language()
    with engine().connect() as conn:
        form = subscriptions.public_form(conn, list_id)
    html = render_template("public/subscribe.html", form=form, language=language,
                           languages=LANGUAGES,
                           token=subscriptions.form_token(config().secret_key, list_id),
                           **extra)
    return _frameable(Response(html, status=status, mimetype="text/html"))


@bp.get("/subscribe/<int:list_id>")
def subscribe_form(list_id: int) -> Response:
    return _form_page(list_id)


@bp.get("/subscribe/<int:list_id>/form.css")
def subscribe_css(list_id: int) -> Response:
    """The form's accent colour as a stylesheet (the pages allow no inline style). The
    colour was checked to be ``#rrggbb`` when saved, so nothing else can get in."""
    with engine().connect() as conn:
        form = subscriptions.public_form(conn, list_id)
    return Response(f":root {{ --form-accent: {form['accent']}; }}\n", mimetype="text/css")


@bp.post("/subscribe/<int:list_id>")
def subscribe_submit(list_id: int) -> Response:
    """The form's POST: no session, so no session CSRF token; the signed form token in the
    hidden field proves the form came from here for this list within a day. A filled
    honeypot field is answered like a success, and nothing is kept or sent."""
    form = request.form
    language = _language()
    if not subscriptions.form_token_ok(config().secret_key, form.get("form_token", ""),
                                       list_id):
        return _form_page(list_id, 400, values=form,
                          error=_("This form is out of date. Please submit it again."))
    if form.get("website"):
        return _form_page(list_id, 200, done=True)
    try:
        with engine().begin() as conn:
            subscriptions.request(conn, config(), list_id, email=form.get("email", ""),
                                  name=form.get("name", ""), locale=language,
                                  remote_addr=request.remote_addr or "unknown",
                                  source="form")
    except (Invalid, TooMany) as exc:
        return _form_page(list_id, exc.status, values=form, error=localize(exc.message))
    return _form_page(list_id, 200, done=True)


def _requester_language(token: str) -> None:
    """Speak the requester's language on the page saying a confirmation link no longer
    works: read from the link even once it expired (docs/design.md §34)."""
    with engine().connect() as conn:
        _language(subscriptions.request_locale(conn, config().secret_key, token))


def _confirm_page(token: str, status: int = 200, **extra: Any) -> Response:
    with engine().connect() as conn:
        try:
            found = subscriptions.pending_request(conn, config().secret_key, token)
        except NotFound:
            _requester_language(token)
            raise
    language = _language(found["locale"])
    html = render_template("public/subscribe_confirm.html", found=found, token=token,
                           language=language, **extra)
    return Response(html, status=status, mimetype="text/html")


@bp.get("/subscribe/confirm/<token>")
def subscribe_confirm(token: str) -> Response:
    """The link in the confirmation email shows a button; a GET changes nothing (mail
    scanners follow links)."""
    return _confirm_page(token)


@bp.post("/subscribe/confirm/<token>")
def subscribe_confirm_post(token: str) -> Response:
    try:
        with engine().begin() as conn:
            subscriptions.confirm(conn, config().secret_key, token,
                                  remote_addr=request.remote_addr or "unknown")
    except NotFound:
        _requester_language(token)
        raise
    return _confirm_page(token, done=True)
