"""The failed-jobs inbox (docs/design.md §22): admins retry and dismiss; support reads."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_babel import gettext as _
from flask_babel import ngettext
from werkzeug.wrappers import Response

from webapp import access
from webapp.context import actor, engine, role
from webapp.domain import inbox, jobs, queue_reads
from webapp.domain.errors import DomainError, Invalid
from webapp.i18n import localize
from webapp.nav import can_open
from webapp.redirects import local_path
from workers.building.kinds import job_kinds
from workers.queue import ProblemFilter

bp = Blueprint("inbox", __name__, url_prefix="/inbox")

FILTER_KEYS = ("kind", "campaign", "class", "from", "to", "q")


def _filter_args(source: Any) -> dict[str, Any]:
    return {k: v for k in FILTER_KEYS if (v := (source.get(k) or "").strip())}


def _local(url: str | None) -> str:
    """``url`` if it is a path on this site, else the inbox (no open redirects)."""
    return local_path(url, url_for("inbox.index"))


def _can_act() -> bool:
    return role() in (access.allowed_roles("inbox.retry") or frozenset())


def _search_refused(args: dict[str, Any]) -> str | None:
    """The search ``q`` the list cannot run (part of an address: the list finds whole
    addresses, ids and correlation IDs through their indexes), taken out of ``args`` so
    that the page answers with the other filters and keeps what was typed."""
    if not args.get("q"):
        return None
    try:
        inbox.parse_filter({"q": args["q"]})
    except Invalid:
        return str(args.pop("q"))
    return None


@bp.get("/")
def index() -> str | tuple[str, int]:
    args = _filter_args(request.args)
    refused = _search_refused(args)
    as_of = datetime.now(UTC)
    tabs: dict[str, Any] = {}
    with engine().connect() as conn:
        where = inbox.parse_filter(args)
        page = inbox.page(conn, where, request.args.get("after"))
        campaigns = inbox.campaign_choices(conn)
        kind_names = job_kinds(conn)
        matching = queue_reads.count_problems(conn, where, as_of)
        retryable = queue_reads.count_retryable(conn, where, as_of) if matching else 0
        if can_open("jobs.index"):  # the jobs browser's tabs, with this page's filters
            tab_filters = jobs.parse_filters(conn, {
                k: v for k, v in args.items() if k in ("kind", "campaign")
                or (k == "q" and "@" in v)})
            # The failed tab counts what this list shows (its class, date and search
            # filters too), never a different number than the list below it.
            tabs = {"tabs": jobs.TABS, "labels": jobs.LABELS, "tab": "failed",
                    "counts": {**jobs.counts(conn, tab_filters), "failed": matching},
                    "filter_args": tab_filters.args()}
    html = render_template("inbox/index.html", page=page, args=args, campaigns=campaigns,
                           kinds=kind_names, classes=inbox.ERROR_CLASSES, can_act=_can_act(),
                           as_of=as_of.isoformat(), matching=matching,
                           retryable=retryable, job_tabs=tabs, wide_page=True,
                           first_page=not request.args.get("after"), refused=refused)
    return (html, 422) if refused is not None else html


@bp.get("/<int:job_id>")
def detail(job_id: int) -> str:
    with engine().connect() as conn:
        job = inbox.detail(conn, job_id)
    return render_template("inbox/detail.html", job=job, can_act=_can_act(),
                           back=_local(request.args.get("back")))


@bp.post("/<int:job_id>/retry")
def retry(job_id: int) -> Response | tuple[str, int]:
    try:
        with engine().begin() as conn:
            result = inbox.retry(conn, job_id, actor=actor())
    except DomainError as exc:
        # The refusal is the answer (409 and why), on the job's own page.
        flash(localize(exc.message), "error")
        with engine().connect() as conn:
            job = inbox.detail(conn, job_id)
        return render_template("inbox/detail.html", job=job, can_act=_can_act(),
                               back=_local(request.form.get("back"))), exc.status
    flash(inbox.describe_retry(result), "success")
    # Back to where the button was (the filtered list, or the job's page).
    return redirect(local_path(request.form.get("back"),
                               url_for("inbox.detail", job_id=job_id)), 303)


@bp.post("/retry-all")
def retry_all() -> Response:
    args = _filter_args(request.form)
    back = url_for("inbox.index", **args)
    try:
        as_of = datetime.fromisoformat(request.form.get("as_of", ""))
    except ValueError:
        flash(_("The form was incomplete (no page time); reload the inbox and try again."),
              "error")
        return redirect(back)
    try:
        with engine().begin() as conn:
            result = inbox.retry_all(conn, inbox.parse_filter(args), as_of, actor=actor())
    except Invalid as exc:
        flash(localize(exc.message), "error")
        return redirect(back)
    flash(inbox.describe_retry(result), "success" if result["retried"] else "error")
    return redirect(back)


@bp.post("/chosen")
def act_on_chosen() -> Response:
    """Retry or dismiss the jobs chosen on the page (Oban Web's bulk actions): the retry
    is "retry all" narrowed to them (suppressed addresses left out and said)."""
    back = _local(request.form.get("back"))
    try:
        ids = jobs.chosen_ids(request.form.getlist("job"))
        with engine().begin() as conn:
            if request.form.get("action") == "dismiss":
                dismissed = inbox.dismiss_chosen(conn, ids, actor=actor())
                message = ngettext("%(num)s job dismissed.", "%(num)s jobs dismissed.",
                                   dismissed)
                ok = bool(dismissed)
            else:
                result = inbox.retry_all(conn, ProblemFilter(job_ids=ids),
                                         datetime.now(UTC), actor=actor())
                message, ok = inbox.describe_retry(result), bool(result["retried"])
    except DomainError as exc:
        flash(localize(exc.message), "error")
        return redirect(back, 303)
    flash(message, "success" if ok else "error")
    return redirect(back, 303)


@bp.post("/<int:job_id>/dismiss")
def dismiss(job_id: int) -> Response:
    try:
        with engine().begin() as conn:
            inbox.dismiss(conn, job_id, actor=actor())
    except DomainError as exc:
        flash(localize(exc.message), "error")
        return redirect(url_for("inbox.detail", job_id=job_id))
    flash(_("Job %(id)s dismissed: it no longer shows in the inbox.", id=job_id), "success")
    return redirect(_local(request.form.get("back")))
