"""The dashboard: what each role looks at first (admin: the queue, failures, relay and
campaigns; support: failed and held verification mail; marketer: campaigns)."""

from __future__ import annotations

from flask import Blueprint, render_template, request, url_for

from webapp.context import config, engine, role
from webapp.domain import campaigns, dashboard
from webapp.nav import can_open

bp = Blueprint("home", __name__)


def _campaign_link(campaign_id: int) -> str | None:
    if can_open("campaigns.detail"):
        return url_for("campaigns.detail", campaign_id=campaign_id)
    return None


@bp.route("/")
def index() -> str:
    current = role()
    with engine().connect() as conn:
        if request.args.get("fragment") == "campaigns":
            limit = 10 if current == "admin" else 20
            return render_template("partials/_campaign_table.html",
                                   campaigns=campaigns.all_with_counts(conn, limit=limit),
                                   campaign_link=_campaign_link)
        if current == "admin":
            board = dashboard.for_admin(conn, config())
        elif current == "support":
            board = dashboard.for_support(conn)
        else:
            board = dashboard.for_marketer(conn)
    return render_template("home/index.html", board=board, role=current,
                           campaigns=board.get("campaigns", []),
                           campaign_link=_campaign_link)
