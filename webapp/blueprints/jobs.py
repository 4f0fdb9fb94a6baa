"""The jobs browser for admins: the queue by state with filters and counts (the failed
tab is the failed-jobs inbox, where retry and dismiss are)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, redirect, render_template, request, url_for
from werkzeug.wrappers import Response

from webapp.context import engine
from webapp.domain import inbox, jobs
from workers.building.kinds import job_kinds

bp = Blueprint("jobs", __name__, url_prefix="/jobs")


@bp.get("/")
def index() -> str | Response:
    tab = request.args.get("state", "waiting")
    if tab not in jobs.TABS:
        tab = "waiting"
    with engine().connect() as conn:
        filters = jobs.parse_filters(conn, request.args)
        if tab == "failed":
            target: dict[str, Any] = dict(filters.args())
            return redirect(url_for("inbox.index", **target))
        counts = jobs.counts(conn, filters)
        page = jobs.page(conn, tab, filters, request.args.get("after"))
        campaigns = inbox.campaign_choices(conn)
        kind_names = job_kinds(conn)
    return render_template("jobs/index.html", tab=tab, tabs=jobs.TABS, labels=jobs.LABELS,
                           counts=counts, page=page, filters=filters,
                           filter_args=filters.args(), kinds=kind_names, campaigns=campaigns,
                           first_page=not request.args.get("after"))
