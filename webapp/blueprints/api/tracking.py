"""``GET /api/v1/campaigns/{id}/stats``: a campaign's opens and clicks (total, unique, per
link, per hour or day) beside its unsubscribes, bounces and complaints."""

from __future__ import annotations

from flask import request
from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, bp
from webapp.context import engine
from webapp.domain import tracking


@bp.get("/campaigns/<int:campaign_id>/stats")
def campaign_stats(campaign_id: int) -> Response:
    by = tracking.check_bucket(request.args.get("by"))
    with engine().connect() as conn:
        return answer(tracking.stats(conn, campaign_id, by=by))
