"""Campaigns in the browser: list, compose, preview, test, send or schedule, and the live
page (one partial serves the page and its polling fragment)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, session, url_for
from flask_babel import gettext as _
from flask_babel import lazy_gettext as _l
from flask_login import current_user
from sqlalchemy.engine import Connection
from werkzeug.wrappers import Response

from webapp.context import actor, config, engine
from webapp.domain import (
    archive,
    campaigns,
    composer,
    inbox,
    layouts,
    lists,
    progress,
    segments,
    sending_domains,
    tracking,
)
from webapp.domain.errors import Conflict, DomainError, Invalid
from webapp.domain.fields import whole_number
from webapp.form_memory import remember
from webapp.i18n import campaign_state, dt, localize
from webapp.nav import can_open
from webapp.redirects import local_path
from workers.core.i18n import N_
from workers.core.states import Campaign

bp = Blueprint("campaigns", __name__, url_prefix="/campaigns")

ACTIONS = {"pause": campaigns.pause, "resume": campaigns.resume, "cancel": campaigns.cancel,
           "unschedule": campaigns.unschedule}
ACTION_WORDS = {"pause": _l("pause"), "resume": _l("resume"), "cancel": _l("cancel"),
                "unschedule": _l("unschedule")}
AFTER = {"pause": Campaign.PAUSED, "resume": Campaign.SENDING, "cancel": Campaign.CANCELLED,
         "unschedule": Campaign.DRAFT}
DONE_MESSAGES = {"pause": _l("Paused: nothing new is sent until you resume."),
                 "resume": _l("Resumed: sending continues."),
                 "cancel": _l("Cancelled: no other message of it will start."),
                 "unschedule": _l("No longer scheduled: the campaign is a draft again.")}


@bp.app_template_filter("utc")
def utc(moment: datetime | None, fmt: str = "%Y-%m-%d %H:%M") -> str:
    """A time shown in UTC with its zone, whatever the database session's time zone."""
    return "" if moment is None else f"{dt(moment.astimezone(UTC), fmt)} UTC"


def _test_email() -> str:
    """The test-send address: the last one used in this session, else the user's own."""
    return str(session.get("test_email") or current_user.email)


def _link(campaign_id: int) -> str:
    return url_for("campaigns.detail", campaign_id=campaign_id)


def inbox_url(campaign_id: int) -> str:
    """Where this viewer sees the campaign's failures: the failed-jobs inbox filtered to it
    for those who may open the inbox, the campaign's read-only failures page otherwise."""
    if can_open("inbox.index"):
        return url_for("inbox.index", campaign=campaign_id)
    return url_for("campaigns.failures", campaign_id=campaign_id)


@bp.get("/")
def index() -> str:
    query = request.args.get("q", "").strip()[:200]
    with engine().connect() as conn:
        rows = campaigns.all_with_counts(conn, limit=200, query=query)
        has_lists = bool(lists.all_lists(conn))
    template = "partials/_campaign_table.html" if request.args.get("fragment") == \
        "campaigns" else "campaigns/index.html"
    return render_template(template, campaigns=rows, campaign_link=_link,
                           has_lists=has_lists, q=query, duplicate_action=True)


def _form_data() -> dict[str, Any]:
    form = request.form
    list_id = form.get("list_id", "")
    return {"name": form.get("name", ""), "list_id": whole_number(list_id),
            "from": form.get("from", ""), "subject": form.get("subject", ""),
            "html": form.get("html") or None, "text": form.get("text") or None,
            "segment_id": whole_number(form.get("segment_id")),
            "layout_id": whole_number(form.get("layout_id")),
            **tracking.form_values(form)}


def _compose_page(values: dict[str, Any], campaign: dict[str, Any] | None = None,
                  error: DomainError | None = None, *, locked: bool = False
                  ) -> tuple[str, int]:
    with engine().connect() as conn:
        all_lists = lists.all_lists(conn)
        warnings = _warnings(conn, values) if campaign is not None and not error else []
        picks = {"segments": segments.all_segments(conn), "layouts": layouts.all_layouts(conn)}
    status = 409 if locked else 422 if error else 200
    return render_template("campaigns/compose.html", values=values, campaign=campaign,
                           lists=all_lists, error=error, locked=locked, warnings=warnings,
                           default_from=config().mail_from, **picks), status


def _warnings(conn: Connection, values: dict[str, Any]) -> list[Any]:
    """Which variables will render as nothing for the list (saved anyway: it may be
    intended), said on every page of an editable campaign while they apply."""
    if not isinstance(values.get("list_id"), int):
        return []
    return list(composer.warnings_for(conn, values, values["list_id"]))


def _stored_values(campaign: dict[str, Any]) -> dict[str, Any]:
    return {"name": campaign["name"], "list_id": campaign["list_id"],
            "from": campaign["from_addr"], "subject": campaign["subject"],
            "html": campaign["html_body"], "text": campaign["text_body"],
            "segment_id": campaign["segment_id"], "layout_id": campaign["layout_id"]}


@bp.route("/new", methods=["GET", "POST"])
def new() -> Response | tuple[str, int]:
    if request.method != "POST":
        list_id = request.args.get("list", "")
        return _compose_page({"list_id": whole_number(list_id),
                              "segment_id": whole_number(request.args.get("segment")),
                              "from": config().mail_from})
    values = _form_data()
    try:
        composer.check_templates(values)  # every field's error at once
        with engine().begin() as conn:
            campaign = campaigns.create(conn, values, default_from=config().mail_from,
                                        actor=actor())
            tracking.save_settings(conn, campaign["id"], values, actor=actor())
    except (Invalid, Conflict) as exc:  # Conflict: a segment of another list
        return _compose_page(values, error=exc)
    flash(_("Draft saved. Preview it, send yourself a test, then send it."), "success")
    return redirect(_link(campaign["id"]))


@bp.route("/<int:campaign_id>/edit", methods=["GET", "POST"])
def edit(campaign_id: int) -> Response | tuple[str, int]:
    with engine().connect() as conn:
        campaign = campaigns.get(conn, campaign_id)
        settings = tracking.get_settings(conn, campaign_id)
    if request.method != "POST":
        if campaign["status"] not in campaigns.EDITABLE:
            flash(_("This campaign is %(status)s: what was sent cannot change. Duplicate it "
                    "to send it again with changes.", status=campaign_state(campaign["status"])),
                  "info")
            return redirect(_link(campaign_id))
        return _compose_page({**_stored_values(campaign), **settings}, campaign)
    values = _form_data()
    try:
        composer.check_templates(values)
        with engine().begin() as conn:
            campaigns.update(conn, campaign_id, values, default_from=config().mail_from,
                             actor=actor())
            tracking.save_settings(conn, campaign_id, values, actor=actor())
    except Invalid as exc:
        return _compose_page(values, campaign, error=exc)
    except Conflict as exc:
        if "segment_id" in exc.fields:  # a segment of another list: say so, not "locked"
            return _compose_page(values, campaign, error=exc)
        # Sent while this form was open: keep what was typed, offer it as a new draft.
        return _compose_page(values, campaign, error=exc, locked=True)
    flash(_("Changes saved."), "success")
    return redirect(_link(campaign_id))


@bp.post("/<int:campaign_id>/duplicate")
def duplicate(campaign_id: int) -> Response:
    """A new draft with the campaign's list, sender, subject and bodies."""
    with engine().begin() as conn:
        original = campaigns.get(conn, campaign_id)
        values = _stored_values(original)
        values["name"] = f"{original['name']} (copy)"[:200]
        copy = campaigns.create(conn, values, default_from=config().mail_from,
                                actor=actor())
        tracking.copy_settings(conn, campaign_id, copy["id"])
    flash(_("“%(name)s” is a new draft: change what you need, then send it.",
            name=values["name"]), "success")
    return redirect(url_for("campaigns.edit", campaign_id=copy["id"]), 303)


@bp.get("/<int:campaign_id>")
def detail(campaign_id: int) -> str:
    with engine().connect() as conn:
        campaign = progress.live(conn, campaign_id)
        the_list = lists.get_list(conn, campaign["list_id"])
        warnings = _warnings(conn, {**composer.campaign_values(campaign),
                                    "list_id": campaign["list_id"]}) \
            if campaign["status"] in campaigns.EDITABLE and not request.args.get("fragment") \
            else []
        # Engagement and the web version: on the page, not in its 2 s polling fragment.
        stats = archive_urls = None
        if not request.args.get("fragment"):
            stats = tracking.stats(conn, campaign_id)
            archive_urls = archive.urls_for_campaign(
                conn, campaign, base_url=config().base_url, secret_key=config().secret_key)
    template = "partials/_campaign_live.html" if request.args.get("fragment") == "live" \
        else "campaigns/detail.html"
    return render_template(template, c=campaign, the_list=the_list,
                           inbox_url=inbox_url(campaign_id), page_status=campaign["status"],
                           test_email=_test_email(), warnings=warnings,
                           complaint_alarm=config().feedback.complaint_alarm_rate,
                           stats=stats, archive_urls=archive_urls)


@bp.get("/<int:campaign_id>/failures")
def failures(campaign_id: int) -> str:
    """The campaign's failed and bounced messages, read-only: who, the reply, its class
    (the admin inbox's retry and dismiss stay with admins)."""
    error_class = request.args.get("class", "").strip()
    with engine().connect() as conn:
        campaign = campaigns.get(conn, campaign_id)
        where = inbox.parse_filter({"campaign": str(campaign_id), "class": error_class})
        page = inbox.page(conn, where, request.args.get("after"))
        counts = campaigns.with_counts(conn, campaign_id)["counts"]
    return render_template("campaigns/failures.html", c=campaign, page=page,
                           counts=counts, error_class=error_class,
                           classes=inbox.ERROR_CLASSES,
                           first_page=not request.args.get("after"))


def _subscriber_arg() -> int | None:
    return whole_number(request.values.get("subscriber"))


@bp.get("/<int:campaign_id>/preview")
def preview(campaign_id: int) -> str:
    """The campaign as one subscriber receives it. The picker searches the whole list
    (any part of the address or name); the preview is always of the subscriber the page
    names as shown: the one picked, else the first match."""
    query = request.args.get("q", "").strip()[:200]
    with engine().connect() as conn:
        campaign = campaigns.get(conn, campaign_id)
        matches = lists.subscriber_page(conn, campaign["list_id"], query=query,
                                        limit=PICKER_SIZE)
        chosen = _subscriber_arg()
        if chosen is None and matches["rows"]:
            chosen = matches["rows"][0]["id"]
        result = None
        if chosen is not None or not query:
            result = campaigns.preview(conn, campaign_id, base_url=config().base_url,
                                       secret_key=config().secret_key, subscriber_id=chosen)
    return render_template("campaigns/preview.html", c=campaign, p=result,
                           matches=matches["rows"], more=matches["next_after"] is not None,
                           q=query, test_email=_test_email())


PICKER_SIZE = 20


# The rendered HTML body shown in the preview's iframe: the campaign's own styles may apply,
# but nothing in it can run (CSP sandbox, no scripts) or reach the app (unique origin).
PREVIEW_CSP = ("sandbox; default-src 'none'; style-src 'unsafe-inline'; img-src * data:; "
               "font-src * data:; frame-ancestors 'self'")


@bp.get("/<int:campaign_id>/preview.html")
def preview_html(campaign_id: int) -> Response:
    with engine().connect() as conn:
        result = campaigns.preview(conn, campaign_id, base_url=config().base_url,
                                   secret_key=config().secret_key,
                                   subscriber_id=_subscriber_arg())
    rendered = result["rendered"]
    body = rendered.html if rendered and rendered.html is not None else ""
    response = Response(body, mimetype="text/html")
    response.headers["Content-Security-Policy"] = PREVIEW_CSP
    response.headers["X-Frame-Options"] = "SAMEORIGIN"
    return response


def _back(default: str) -> Response:
    """Redirect to the local page the form came from (never elsewhere: no open redirect)."""
    return redirect(local_path(request.form.get("back"), default), 303)


@bp.post("/<int:campaign_id>/test")
def test(campaign_id: int) -> Response:
    email = request.form.get("email", "")
    try:
        with engine().begin() as conn:
            campaigns.test_send(conn, campaign_id, email, subscriber_id=_subscriber_arg(),
                                actor=actor())
    except DomainError as exc:
        flash(_("No test was sent: %(why)s", why=localize(exc.message)), "error")
        return _back(_link(campaign_id))
    session["test_email"] = email.strip()  # prefilled next time
    flash(_("Test message queued to %(email)s. It arrives with “[Test]” before the subject.",
            email=email.strip()), "success")
    return _back(_link(campaign_id))


@bp.get("/<int:campaign_id>/send")
def review(campaign_id: int) -> str:
    with engine().connect() as conn:
        campaign = campaigns.get(conn, campaign_id)
        audience = campaigns.audience(conn, campaign["list_id"], campaign["segment_id"])
        segment = segments.get(conn, campaign["segment_id"]) if campaign["segment_id"] else None
        the_list = lists.get_list(conn, campaign["list_id"])
        warnings = composer.warnings_for(conn, composer.campaign_values(campaign),
                                         campaign["list_id"])
        deliverability = sending_domains.review_checks(conn, config(), campaign)
    return render_template("campaigns/review.html", c=campaign, audience=audience,
                           the_list=the_list, warnings=warnings, deliverability=deliverability,
                           segment=segment)


def _schedule_time() -> datetime | None:
    """The form's schedule (``when=later``) in UTC, or None to send now."""
    if request.form.get("when") != "later":
        return None
    raw = request.form.get("at", "")
    try:
        local = datetime.fromisoformat(raw)
    except ValueError:
        raise Invalid(N_("choose a date and time to send at"),
                      fields={"at": N_("required")}) from None
    offset = request.form.get("tz_offset", "")
    # The browser's offset from UTC in minutes: at most a day either way.
    minutes = whole_number(offset.removeprefix("-"), high=24 * 60) or 0
    minutes = -minutes if offset.startswith("-") else minutes
    at = local.replace(tzinfo=UTC) + timedelta(minutes=minutes)
    if at <= datetime.now(UTC):
        raise Invalid(N_("the time to send at has already passed; choose a later one, or "
                         "send now"), fields={"at": N_("in the past")})
    return at


@bp.post("/<int:campaign_id>/send")
def send(campaign_id: int) -> Response:
    try:
        at = _schedule_time()
        with engine().begin() as conn:
            campaign = campaigns.send(conn, campaign_id, actor=actor(), at=at)
    except DomainError as exc:
        flash(_("Not sent: %(why)s", why=localize(exc.message)), "error")
        remember("schedule")
        return redirect(url_for("campaigns.review", campaign_id=campaign_id), 303)
    if campaign["status"] == Campaign.SCHEDULED:
        flash(_("Scheduled for %(at)s. It will be sent then, even if SendDock restarts in "
                "between.", at=utc(campaign["scheduled_at"])), "success:scheduled")
    else:
        flash(_("Sending started. This page updates by itself."), "success:sending")
    return redirect(_link(campaign_id), 303)


@bp.post("/<int:campaign_id>/<any(pause, resume, cancel, unschedule):action>")
def action(campaign_id: int, action: str) -> Response:
    try:
        with engine().begin() as conn:
            result = ACTIONS[action](conn, campaign_id, actor=actor())
    except DomainError as exc:
        flash(_("Could not %(action)s: %(why)s", action=str(ACTION_WORDS[action]),
                why=localize(exc.message)), "error")
    else:
        # The message lasts only while it is true (base.html, app.js: data-while-status).
        done = str(DONE_MESSAGES[action])
        if action in ("pause", "cancel"):
            done += " " + _("Messages in flight at that moment (they finished): %(n)s.",
                            n=result.get("in_flight", 0))
        flash(done, f"success:{AFTER[action]}")
    return redirect(_link(campaign_id), 303)
