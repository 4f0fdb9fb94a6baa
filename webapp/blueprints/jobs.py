"""The jobs browser for admins: the queue by state with filters and counts (the failed
tab is the failed-jobs inbox, where retry and dismiss are)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_babel import ngettext
from werkzeug.wrappers import Response

from webapp.context import actor, engine
from webapp.domain import inbox, jobs
from webapp.domain.errors import DomainError
from webapp.i18n import localize
from webapp.redirects import local_path
from workers.building.kinds import job_kinds

bp = Blueprint("jobs", __name__, url_prefix="/jobs")


@bp.get("/")
def index() -> str | Response | tuple[str, int]:
    tab = request.args.get("state", "waiting")
    if tab not in jobs.TABS:
        tab = "waiting"
    args = request.args.to_dict()
    # Part of an address is not searched here (every tab finds an address whole, through
    # its index): the page answers with the other filters and keeps what was typed.
    refused = args.pop("q").strip() if jobs.partial_address(args.get("q")) else None
    with engine().connect() as conn:
        filters = jobs.parse_filters(conn, args)
        if tab == "failed":
            target: dict[str, Any] = dict(filters.args())
            if refused is not None:
                target["q"] = refused  # the inbox says why it is not searched
            return redirect(url_for("inbox.index", **target))
        counts = jobs.counts(conn, filters)
        page = jobs.page(conn, tab, filters, request.args.get("after"))
        campaigns = inbox.campaign_choices(conn)
        kind_names = job_kinds(conn)
    html = render_template("jobs/index.html", tab=tab, tabs=jobs.TABS, labels=jobs.LABELS,
                           counts=counts, page=page, filters=filters,
                           filter_args=filters.args(), kinds=kind_names, campaigns=campaigns,
                           first_page=not request.args.get("after"),
                           bulk_actions=jobs.BULK_ACTIONS.get(tab, ()), wide_page=True,
                           refused=refused)
    return (html, 422) if refused is not None else html


@bp.post("/bulk")
def bulk() -> Response:
    """Cancel or run now the jobs chosen on a page (admins only, CSRF-checked like every
    form); back to the page it was sent from."""
    back = local_path(request.form.get("back"), url_for("jobs.index"))
    action = request.form.get("action", "")
    try:
        ids = jobs.chosen_ids(request.form.getlist("job"))
        with engine().begin() as conn:
            result = jobs.bulk(conn, action, ids, actor=actor())
    except DomainError as exc:
        flash(localize(exc.message), "error")
        return redirect(back, 303)
    n, left = result["changed"], result["unchanged"]
    message = ngettext("%(num)s job cancelled.", "%(num)s jobs cancelled.", n) \
        if action == "cancel" else ngettext("%(num)s job is due now.",
                                            "%(num)s jobs are due now.", n)
    if left:
        message += " " + ngettext("%(num)s had already moved on and was left as it is.",
                                  "%(num)s had already moved on and were left as they are.",
                                  left)
    flash(message, "success" if n else "error")
    return redirect(back, 303)
