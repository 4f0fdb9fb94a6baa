"""Outgoing event webhooks (docs/design.md §18), for admins: endpoints (URL, events, kinds, secret),
their health and delivery log, enable/disable, retry failed deliveries, delete."""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Blueprint, abort, flash, redirect, render_template, request, url_for
from flask_babel import gettext as _
from flask_babel import ngettext
from werkzeug.wrappers import Response

from webapp.context import actor, config, engine
from webapp.domain import audit
from webapp.form_memory import remember
from workers.after_acceptance import event_queue
from workers.after_acceptance.event_webhooks import new_secret
from workers.building.kinds import job_kinds
from workers.core import outgoing

bp = Blueprint("event_webhooks", __name__, url_prefix="/admin/event-webhooks")


def _validate(url: str, events: list[str], kinds: list[str], known: list[str]) -> list[str]:
    errors = []
    try:
        parts = urlsplit(url)
        scheme_ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # "http://[" and the like
        scheme_ok = False
    if not scheme_ok:
        errors.append(_("The URL must be an http:// or https:// address."))
    else:
        try:
            # Checked again before every delivery: DNS may change (SSRF guard).
            outgoing.check(url, config().feedback.guard())
        except outgoing.Unresolvable:
            pass  # may resolve later; each delivery checks
        except outgoing.Refused as exc:
            errors.append(_("This URL cannot be called: %(reason)s", reason=str(exc)))
    if not events or not set(events) <= set(event_queue.EVENTS):
        errors.append(_("Choose at least one event."))
    if not set(kinds) <= set(known):
        errors.append(_("Unknown message kind."))
    return errors


@bp.get("/")
def index() -> str:
    with engine().connect() as conn:
        endpoints = event_queue.endpoints(conn)
        kinds = job_kinds(conn)  # the admins' kinds too, not only the built-in
    return render_template("event_webhooks/index.html", endpoints=endpoints,
                           events=event_queue.EVENTS, kinds=kinds,
                           new_secret=request.args.get("secret_for"))


@bp.post("/")
def create() -> Response | tuple[str, int]:
    url = request.form.get("url", "").strip()
    events = request.form.getlist("events")
    kinds = request.form.getlist("kinds")
    with engine().connect() as conn:
        errors = _validate(url, events, kinds, job_kinds(conn))
    if errors:
        for e in errors:
            flash(e, "error")
        remember("add_endpoint")
        return redirect(url_for("event_webhooks.index"), 303)
    secret = new_secret()
    with engine().begin() as conn:
        endpoint_id = event_queue.create_endpoint(
            conn, url=url, events=events, kinds=kinds, secret=secret,
            description=request.form.get("description", "").strip()[:200])
        audit.record(conn, actor(), "event_webhook.create", f"event_webhook:{endpoint_id}",
                     url=url, events=events)
    flash(_("Endpoint added. Its signing secret is shown on its page."), "success")
    return redirect(url_for("event_webhooks.detail", endpoint_id=endpoint_id), 303)


@bp.get("/<int:endpoint_id>")
def detail(endpoint_id: int) -> str:
    with engine().connect() as conn:
        endpoint = event_queue.get_endpoint(conn, endpoint_id)
        if endpoint is None:
            abort(404)
        log = event_queue.deliveries(conn, endpoint_id)
    return render_template("event_webhooks/detail.html", e=endpoint, deliveries=log)


@bp.post("/<int:endpoint_id>/<any(enable, disable, retry, delete):action>")
def act(endpoint_id: int, action: str) -> Response:
    with engine().begin() as conn:
        if action in ("enable", "disable"):
            found = event_queue.set_endpoint_enabled(conn, endpoint_id, action == "enable")
            message = _("Endpoint enabled.") if action == "enable" else _("Endpoint disabled.")
        elif action == "retry":
            n = event_queue.retry_failed(conn, endpoint_id)
            found, message = True, ngettext("%(num)s failed delivery queued again.",
                                            "%(num)s failed deliveries queued again.", n)
        else:
            found = event_queue.delete_endpoint(conn, endpoint_id)
            message = _("Endpoint deleted with its delivery log.")
        if not found:
            abort(404)
        audit.record(conn, actor(), f"event_webhook.{action}", f"event_webhook:{endpoint_id}")
    flash(message, "success")
    if action == "delete":
        return redirect(url_for("event_webhooks.index"), 303)
    return redirect(url_for("event_webhooks.detail", endpoint_id=endpoint_id), 303)
