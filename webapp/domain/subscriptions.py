"""Subscription forms with double opt-in (docs/design.md §20).

A list's public form (off until a marketer turns it on) and the public API both create a
*subscription request*: the consent asked (when, from which IP, through which form) and a
confirmation email of the transactional kind ``subscription_confirmation`` (class critical,
so P7 serves it before campaigns; its dedupe window and resend cooldown keep one person
from being mailed over and over). The address joins the list only when the signed link in
that email is confirmed; the request row then keeps the confirmation time and IP.

Guarantees kept here:

- a pending request is not a membership: the broadcast enqueue, which reads memberships,
  cannot reach it;
- someone who left the list (``list_unsubscribes``) or unsubscribed from everything can
  ask again: the form sends the confirmation email, and only confirming it (a new consent)
  puts them back on the list;
- the answer to a request is the same whether or not the address is already on the list
  (nobody learns who is subscribed), and the same for a honeypot hit (a bot learns nothing);
- at most :data:`RATE_PER_HOUR` requests per IP address per hour, counted in the database
  (any web process), serialized per address so the count is exact;
- confirmation links are signed, expire after :data:`CONFIRM_MAX_AGE` seconds, and
  confirming twice is the same as once.
"""

from __future__ import annotations

import html
import re
from typing import Any

import sqlalchemy as sa
from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer
from sqlalchemy.engine import Connection

from webapp.domain import audit, intake, kinds, lists, messages
from webapp.domain.errors import Conflict, Invalid, NotFound, TooMany
from workers.core.i18n import N_
from workers.core.settings import Config

KIND = "subscription_confirmation"
RATE_PER_HOUR = 10
CONFIRM_MAX_AGE = 7 * 86400
FORM_MAX_AGE = 86400
MAX_TITLE = 200
MAX_INTRO = 2000
LOCALES = ("en", "es")
_CONFIRM_SALT = "senddock-subscribe-confirm-v1"
_FORM_SALT = "senddock-subscribe-form-v1"
_COLOUR = re.compile(r"#[0-9a-fA-F]{6}")


# --- the form's settings (marketers) ------------------------------------------------------

def get_form(conn: Connection, list_id: int) -> dict[str, Any]:
    """The list's form settings (defaults when never saved); NotFound for no such list."""
    the_list = lists.get_list(conn, list_id)
    row = conn.execute(sa.text("SELECT enabled, title, intro, accent FROM list_forms "
                               "WHERE list_id = :l"), {"l": list_id}).mappings().first()
    form = dict(row) if row else {"enabled": False, "title": "", "intro": "",
                                  "accent": "#2b6cb0"}
    pending = conn.execute(sa.text(
        "SELECT count(*) FROM subscription_requests WHERE list_id = :l AND confirmed_at IS "
        "NULL AND requested_at > now() - make_interval(secs => :age)"),
        {"l": list_id, "age": CONFIRM_MAX_AGE}).scalar_one()
    return {**form, "list_id": list_id, "list_name": the_list["name"], "pending": pending}


def save_form(conn: Connection, list_id: int, *, enabled: bool, title: str, intro: str,
              accent: str, actor: str) -> dict[str, Any]:
    lists.get_list(conn, list_id)
    title, intro, accent = (title or "").strip(), (intro or "").strip(), (accent or "").strip()
    fields = {}
    if len(title) > MAX_TITLE:
        fields["title"] = N_("at most %(max)s characters", max=MAX_TITLE)
    if len(intro) > MAX_INTRO:
        fields["intro"] = N_("at most %(max)s characters", max=MAX_INTRO)
    if not _COLOUR.fullmatch(accent):
        fields["accent"] = N_("a colour like #2b6cb0")
    if fields:
        raise Invalid(N_("check %(fields)s", fields=", ".join(fields)),
                      fields=fields)
    conn.execute(sa.text("""
        INSERT INTO list_forms (list_id, enabled, title, intro, accent)
        VALUES (:l, :e, :t, :i, :a)
        ON CONFLICT (list_id) DO UPDATE SET enabled = :e, title = :t, intro = :i,
               accent = :a, updated_at = now()"""),
        {"l": list_id, "e": enabled, "t": title, "i": intro, "a": accent})
    audit.record(conn, actor, "list.form", f"list:{list_id}", enabled=enabled)
    return get_form(conn, list_id)


def embed_snippet(form_url: str, title: str) -> str:
    """The HTML a marketer pastes into their site: the public form in an iframe (the
    page sets a fresh form token each time it loads; a static copy of the form could not)."""
    return (f'<iframe src="{html.escape(form_url)}" title="{html.escape(title)}" '
            'style="border:0;width:100%;max-width:32rem;height:28rem"></iframe>')


def public_form(conn: Connection, list_id: int) -> dict[str, Any]:
    """The form a visitor sees; NotFound for an unknown list, Conflict (409) when the
    list's form is off."""
    row = conn.execute(sa.text("""
        SELECT f.list_id, f.title, f.intro, f.accent, l.name AS list_name
          FROM list_forms f JOIN lists l ON l.id = f.list_id
         WHERE f.list_id = :l AND f.enabled"""), {"l": list_id}).mappings().first()
    if row is None:
        if conn.execute(sa.text("SELECT 1 FROM lists WHERE id = :l"), {"l": list_id}).first():
            raise Conflict(N_("this list's subscription form is off"),
                           fields={"list_id": N_("subscription form off")})
        raise NotFound(N_("there is no subscription form here"),
                       fields={"list_id": N_("no subscription form")})
    return dict(row)


# --- signed tokens ------------------------------------------------------------------------

def form_token(secret_key: str, list_id: int) -> str:
    """What the form page puts in its hidden field: proof the POST comes from a form this
    server handed out for this list, less than a day ago (the public form's CSRF check)."""
    return URLSafeTimedSerializer(secret_key, salt=_FORM_SALT).dumps(list_id)


def form_token_ok(secret_key: str, token: str, list_id: int) -> bool:
    try:
        value = URLSafeTimedSerializer(secret_key, salt=_FORM_SALT).loads(
            token, max_age=FORM_MAX_AGE)
    except BadSignature:  # SignatureExpired is one
        return False
    return bool(value == list_id)


def confirm_token(secret_key: str, request_id: int) -> str:
    return URLSafeTimedSerializer(secret_key, salt=_CONFIRM_SALT).dumps(request_id)


def _request_for(conn: Connection, secret_key: str, token: str) -> dict[str, Any] | None:
    try:
        request_id = URLSafeTimedSerializer(secret_key, salt=_CONFIRM_SALT).loads(
            token, max_age=CONFIRM_MAX_AGE)
    except BadSignature:
        return None
    if not isinstance(request_id, int):
        return None
    row = conn.execute(sa.text("""
        SELECT r.id, r.list_id, r.email, r.name, r.locale, r.confirmed_at,
               l.name AS list_name, f.title, f.accent
          FROM subscription_requests r JOIN lists l ON l.id = r.list_id
          LEFT JOIN list_forms f ON f.list_id = r.list_id
         WHERE r.id = :id"""), {"id": request_id}).mappings().first()
    return dict(row) if row else None


# --- requests (anyone) --------------------------------------------------------------------

def _check_rate(conn: Connection, remote_addr: str) -> None:
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext('subscribe:' || :a))"),
                 {"a": remote_addr})
    recent = conn.execute(sa.text(
        "SELECT count(*) FROM subscription_requests WHERE remote_addr = :a AND "
        "requested_at > now() - interval '1 hour'"), {"a": remote_addr}).scalar_one()
    if recent >= RATE_PER_HOUR:
        raise TooMany(N_("too many subscription requests from your address; try again in "
                         "an hour"), retry_after=3600)


def check_locale(raw: Any) -> str:
    return raw if raw in LOCALES else "en"


def request(conn: Connection, config: Config, list_id: int, *, email: Any, name: Any = "",
            locale: str = "en", remote_addr: str, source: str) -> None:
    """Ask for a subscription to the list (its form must be on): validate, count against
    the address's hourly limit, keep the request and send the confirmation email. Says
    nothing about whether the address is already on the list."""
    form = public_form(conn, list_id)
    address = lists.check_email(email)
    if not isinstance(name, str) or len(name) > lists.MAX_NAME:
        raise Invalid(N_("name must be text of at most %(max)s characters",
                         max=lists.MAX_NAME), fields={"name": N_("too long")})
    spec = kinds.get(conn, KIND)
    if not spec.active:
        raise Conflict(N_("subscriptions are paused; try again later"))
    _check_rate(conn, remote_addr)
    member = conn.execute(sa.text("""
        SELECT 1 FROM memberships m JOIN subscribers s ON s.id = m.subscriber_id
         WHERE m.list_id = :l AND lower(s.email) = lower(:e) AND s.status = 'active'"""),
        {"l": list_id, "e": address}).first()
    request_id = conn.execute(sa.text("""
        INSERT INTO subscription_requests (list_id, email, name, source, locale, remote_addr,
                                           confirmed_at, confirmed_addr)
        VALUES (:l, :e, :n, :s, :loc, :a, CASE WHEN :member THEN now() END,
                CASE WHEN :member THEN 'already on the list' END)
        RETURNING id"""),
        {"l": list_id, "e": address, "n": name.strip(), "s": source, "loc": locale,
         "a": remote_addr, "member": member is not None}).scalar_one()
    if member is not None:
        return  # counted against the rate limit, answered the same, nothing sent
    url = f"{config.base_url}/subscribe/confirm/{confirm_token(config.secret_key, request_id)}"
    req = intake.Ask(
        spec=spec, user_ref=f"list-{list_id}:{address.lower()}", email=address,
        data={"list_name": form["list_name"], "confirm_url": url, "locale": locale},
        event={"name": "subscribe", "id": request_id, "source": source})
    _, existing = messages.request(conn, config, req, actor=f"visitor ({source})")
    if existing:  # a confirmation for this list and address is already on its way
        conn.execute(sa.text("DELETE FROM subscription_requests WHERE id = :id"),
                     {"id": request_id})


def request_locale(conn: Connection, secret_key: str, token: str) -> str | None:
    """The language of the request a confirmation link names, even once the link has
    expired (its signature must still be genuine), so that the page saying it expired
    speaks the requester's language; None for a link that is not ours."""
    serializer = URLSafeTimedSerializer(secret_key, salt=_CONFIRM_SALT)
    try:
        request_id = serializer.loads(token)
    except SignatureExpired as exc:
        request_id = exc.payload
    except BadSignature:
        return None
    if not isinstance(request_id, int) or isinstance(request_id, bool):
        return None
    locale = conn.execute(sa.text("SELECT locale FROM subscription_requests WHERE id = :id"),
                          {"id": request_id}).scalar()
    return str(locale) if locale else None


def pending_request(conn: Connection, secret_key: str, token: str) -> dict[str, Any]:
    """The request a genuine, unexpired confirmation link names, or NotFound."""
    found = _request_for(conn, secret_key, token)
    if found is None:
        raise NotFound(N_("this confirmation link is not valid or has expired"))
    return found


def confirm(conn: Connection, secret_key: str, token: str, *,
            remote_addr: str) -> dict[str, Any]:
    """Confirm the request: the address joins the list (created as an active subscriber
    when new) and the request keeps when and from where it was confirmed. Idempotent."""
    found = pending_request(conn, secret_key, token)
    conn.execute(sa.text("SELECT 1 FROM subscription_requests WHERE id = :id FOR UPDATE"),
                 {"id": found["id"]})
    # A new confirmed consent: whoever left this list (or, before per-list unsubscribing,
    # every list) joins it again.
    rejoined = conn.execute(sa.text("""
        DELETE FROM list_unsubscribes u USING subscribers s
         WHERE u.list_id = :l AND s.id = u.subscriber_id AND lower(s.email) = lower(:e)"""),
        {"l": found["list_id"], "e": found["email"]}).rowcount
    rejoined += conn.execute(sa.text(
        "UPDATE subscribers SET status = 'active' WHERE lower(email) = lower(:e) "
        "AND status = 'unsubscribed'"), {"e": found["email"]}).rowcount
    lists.upsert_subscribers(conn, found["list_id"], [
        lists.SubscriberInput(found["email"], found["name"], {})])
    changed = conn.execute(sa.text("""
        UPDATE subscription_requests SET confirmed_at = now(), confirmed_addr = :a
         WHERE id = :id AND confirmed_at IS NULL"""),
        {"id": found["id"], "a": remote_addr}).rowcount
    if changed:
        audit.record(conn, "visitor (confirmation link)", "subscriber.confirm",
                     f"list:{found['list_id']}", email=found["email"],
                     request=found["id"], rejoined=bool(rejoined))
    return found
