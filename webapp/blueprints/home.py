"""The dashboard home: every campaign with its live counts."""

from __future__ import annotations

from flask import Blueprint, render_template, request, url_for

from webapp.context import engine
from webapp.domain import campaigns
from webapp.nav import can_open

bp = Blueprint("home", __name__)


def _campaign_link(campaign_id: int) -> str | None:
    if can_open("campaigns.detail"):
        return url_for("campaigns.detail", campaign_id=campaign_id)
    return None


@bp.route("/")
def index() -> str:
    with engine().connect() as conn:
        rows = campaigns.all_with_counts(conn, limit=50)
    template = "partials/_campaign_table.html" if request.args.get("fragment") == "campaigns" \
        else "home/index.html"
    return render_template(template, campaigns=rows, campaign_link=_campaign_link)
