"""Queue health (docs/design.md §22): jobs per state and kind, the oldest waiting job, sends per
minute, live workers and the relay; and the alarm banner shown on every page."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, flash, redirect, render_template, request, url_for
from flask_babel import gettext as _
from werkzeug.wrappers import Response

from webapp import dbhealth
from webapp.context import actor, config, engine, role
from webapp.domain import audit, health
from workers import queue

bp = Blueprint("health", __name__, url_prefix="/health")


@bp.get("/")
def index() -> str:
    ext = current_app.extensions["senddock"]
    probe = ext.health_probe()
    probe.start()  # the database check runs while the page reads the queue
    with engine().connect() as conn:
        stats = health.queue_health(conn, config())
    stats["database"] = dbhealth.details(probe, ext.engine)
    template = "partials/_health_status.html" if request.args.get("fragment") == "status" \
        else "health/index.html"
    return render_template(template, stats=stats, chart=health.chart_bars(stats["chart"]))


@bp.post("/relay/retry")
def retry_relay() -> Response:
    """An admin's "Retry now": the relay is probed at once, whatever its backoff (after
    fixing the credentials, say). Nothing else changes."""
    with engine().begin() as conn:
        probing = queue.probe_now(conn)
        if probing:
            queue.notify_new_jobs(conn, "relay")
            audit.record(conn, actor(), "relay.retry", "relay")
    flash(_("The relay is probed now.") if probing else _("The relay is not down."),
          "success" if probing else "error")
    return redirect(url_for("health.index"))


@bp.app_context_processor
def alarm_banner() -> dict[str, Any]:
    """``alarms()`` for partials/_alarms.html: computed only when a page calls it, and
    then at most every few seconds per process (see health.cached_alarms); each user sees
    the alarms meant for their role."""
    def alarms() -> list[health.Alarm]:
        ext = current_app.extensions["senddock"]
        mine = role()
        return [a for a in health.cached_alarms(ext.engine, ext.config) if a.shown_to(mine)]

    return {"alarms": alarms}
