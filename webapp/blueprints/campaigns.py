"""Campaigns in the browser: list, compose, preview, test, send or schedule, and the live
page (one partial serves the page and its polling fragment)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from webapp.context import actor, config, engine
from webapp.domain import campaigns, inbox, lists, progress
from webapp.domain.errors import DomainError, Invalid
from webapp.nav import can_open
from webapp.redirects import local_path

bp = Blueprint("campaigns", __name__, url_prefix="/campaigns")

ACTIONS = {"pause": campaigns.pause, "resume": campaigns.resume, "cancel": campaigns.cancel,
           "unschedule": campaigns.unschedule}
AFTER = {"pause": "paused", "resume": "sending", "cancel": "cancelled", "unschedule": "draft"}
DONE_MESSAGES = {"pause": "Paused: nothing new is sent until you resume.",
                 "resume": "Resumed: sending continues.",
                 "cancel": "Cancelled: messages not yet sent will not be sent.",
                 "unschedule": "No longer scheduled: the campaign is a draft again."}


@bp.app_template_filter("utc")
def utc(moment: datetime | None, fmt: str = "%Y-%m-%d %H:%M") -> str:
    """A time shown in UTC with its zone, whatever the database session's time zone."""
    return "" if moment is None else f"{moment.astimezone(UTC).strftime(fmt)} UTC"


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
    with engine().connect() as conn:
        rows = campaigns.all_with_counts(conn, limit=200)
        has_lists = bool(lists.all_lists(conn))
    if request.args.get("fragment") == "campaigns":
        return render_template("partials/_campaign_table.html", campaigns=rows,
                               campaign_link=_link)
    return render_template("campaigns/index.html", campaigns=rows, campaign_link=_link,
                           has_lists=has_lists)


def _form_data() -> dict[str, Any]:
    form = request.form
    list_id = form.get("list_id", "")
    return {"name": form.get("name", ""), "list_id": int(list_id) if list_id.isdigit() else None,
            "from": form.get("from", ""), "subject": form.get("subject", ""),
            "html": form.get("html") or None, "text": form.get("text") or None}


def _compose_page(values: dict[str, Any], campaign: dict[str, Any] | None = None,
                  error: Invalid | None = None) -> tuple[str, int]:
    with engine().connect() as conn:
        all_lists = lists.all_lists(conn)
    return render_template("campaigns/compose.html", values=values, campaign=campaign,
                           lists=all_lists, error=error,
                           default_from=config().mail_from), 422 if error else 200


@bp.route("/new", methods=["GET", "POST"])
def new() -> Response | tuple[str, int]:
    if request.method == "GET":
        list_id = request.args.get("list", "")
        return _compose_page({"list_id": int(list_id) if list_id.isdigit() else None,
                              "from": config().mail_from})
    values = _form_data()
    try:
        with engine().begin() as conn:
            campaign = campaigns.create(conn, values, default_from=config().mail_from,
                                        actor=actor())
    except Invalid as exc:
        return _compose_page(values, error=exc)
    flash("Draft saved. Preview it, send yourself a test, then send it.", "success")
    return redirect(_link(campaign["id"]))


@bp.route("/<int:campaign_id>/edit", methods=["GET", "POST"])
def edit(campaign_id: int) -> Response | tuple[str, int]:
    with engine().connect() as conn:
        campaign = campaigns.get(conn, campaign_id)
    if request.method == "GET":
        return _compose_page({"name": campaign["name"], "list_id": campaign["list_id"],
                              "from": campaign["from_addr"], "subject": campaign["subject"],
                              "html": campaign["html_body"], "text": campaign["text_body"]},
                             campaign)
    values = _form_data()
    try:
        with engine().begin() as conn:
            campaigns.update(conn, campaign_id, values, default_from=config().mail_from,
                             actor=actor())
    except Invalid as exc:
        return _compose_page(values, campaign, error=exc)
    flash("Changes saved.", "success")
    return redirect(_link(campaign_id))


@bp.get("/<int:campaign_id>")
def detail(campaign_id: int) -> str:
    with engine().connect() as conn:
        campaign = progress.live(conn, campaign_id)
        the_list = lists.get_list(conn, campaign["list_id"])
    template = "partials/_campaign_live.html" if request.args.get("fragment") == "live" \
        else "campaigns/detail.html"
    return render_template(template, c=campaign, the_list=the_list,
                           inbox_url=inbox_url(campaign_id), page_status=campaign["status"])


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
    raw = request.values.get("subscriber", "")
    return int(raw) if raw.isdigit() else None


@bp.get("/<int:campaign_id>/preview")
def preview(campaign_id: int) -> str:
    query = request.args.get("q", "").strip()  # a search wins over the drop-down
    with engine().connect() as conn:
        result = campaigns.preview(conn, campaign_id, base_url=config().base_url,
                                   secret_key=config().secret_key,
                                   subscriber_id=None if query else _subscriber_arg(),
                                   email=query)
        choices = lists.subscriber_page(conn, result["campaign"]["list_id"], limit=20)["rows"]
    return render_template("campaigns/preview.html", p=result, choices=choices, q=query)


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
        flash(f"No test was sent: {exc.message}", "error")
        return _back(_link(campaign_id))
    flash(f"Test message queued to {email.strip()}. It arrives with “[Test]” before the "
          "subject.", "success")
    return _back(_link(campaign_id))


@bp.get("/<int:campaign_id>/send")
def review(campaign_id: int) -> str:
    with engine().connect() as conn:
        campaign = campaigns.get(conn, campaign_id)
        audience = campaigns.audience(conn, campaign["list_id"])
        the_list = lists.get_list(conn, campaign["list_id"])
    return render_template("campaigns/review.html", c=campaign, audience=audience,
                           the_list=the_list)


def _schedule_time() -> datetime | None:
    """The form's schedule (``when=later``) in UTC, or None to send now."""
    if request.form.get("when") != "later":
        return None
    raw = request.form.get("at", "")
    try:
        local = datetime.fromisoformat(raw)
    except ValueError:
        raise Invalid("choose a date and time to send at", fields={"at": "required"}) from None
    offset = request.form.get("tz_offset", "")
    minutes = int(offset) if offset.lstrip("-").isdigit() else 0
    at = local.replace(tzinfo=UTC) + timedelta(minutes=minutes)
    if at <= datetime.now(UTC):
        raise Invalid("the time to send at has already passed; choose a later one, or send "
                      "now", fields={"at": "in the past"})
    return at


@bp.post("/<int:campaign_id>/send")
def send(campaign_id: int) -> Response:
    try:
        at = _schedule_time()
        with engine().begin() as conn:
            campaign = campaigns.send(conn, campaign_id, actor=actor(), at=at)
    except DomainError as exc:
        flash(f"Not sent: {exc.message}", "error")
        return redirect(url_for("campaigns.review", campaign_id=campaign_id), 303)
    if campaign["status"] == "scheduled":
        flash(f"Scheduled for {utc(campaign['scheduled_at'])}. It will be sent then, even if "
              "SendDock restarts in between.", "success:scheduled")
    else:
        flash("Sending started. This page updates by itself.", "success:sending")
    return redirect(_link(campaign_id), 303)


@bp.post("/<int:campaign_id>/<any(pause, resume, cancel, unschedule):action>")
def action(campaign_id: int, action: str) -> Response:
    try:
        with engine().begin() as conn:
            ACTIONS[action](conn, campaign_id, actor=actor())
    except DomainError as exc:
        flash(f"Could not {action}: {exc.message}", "error")
    else:
        # The message lasts only while it is true (base.html, app.js: data-while-status).
        flash(DONE_MESSAGES[action], f"success:{AFTER[action]}")
    return redirect(_link(campaign_id), 303)
