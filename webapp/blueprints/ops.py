"""Operations endpoints: ``/metrics`` (Prometheus; an admin's session or bearer token) and
``/healthz`` (public; for load balancers and orchestrators)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from flask import Blueprint, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from werkzeug.wrappers import Response

from webapp.metrics import registry_for
from workers import queue

bp = Blueprint("ops", __name__)


@bp.get("/metrics")
def metrics() -> Response:
    ext = current_app.extensions["senddock"]
    registry = current_app.extensions.get("senddock_metrics")
    if registry is None:
        registry = current_app.extensions["senddock_metrics"] = registry_for(ext.engine,
                                                                            ext.config)
    # content_type, not mimetype: CONTENT_TYPE_LATEST already carries its charset, and
    # werkzeug would append a second one to a mimetype.
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


@bp.get("/healthz")
def healthz() -> tuple[Response, int]:
    """200 when this process can do its job: the database answers and, if this process
    hosts the delivery pool, the pool is running. A down relay is reported (delivery
    pauses by itself, P6) but is not this process's failure, so it stays 200."""
    ext = current_app.extensions["senddock"]
    body: dict[str, Any] = {"status": "ok"}
    try:
        with ext.engine.connect() as conn:
            relay = queue.relay_status(conn)
        body["database"] = "ok"
        body["relay"] = {"status": relay.get("status", "ok"), "since": relay.get("since"),
                         "last_error": relay.get("last_error")}
        if relay.get("status") == "down":
            body["status"] = "degraded"
    except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
        body.update(status="down", database=f"unreachable: {str(exc).splitlines()[0]}")
    pool = ext.pool
    body["pool"] = "not in this process" if pool is None else \
        ("running" if pool.status()["running"] else "stopped")
    healthy = body["database"] == "ok" and body["pool"] != "stopped"
    if not healthy:
        body["status"] = "down"
    response = jsonify(body)
    response.headers["Cache-Control"] = "no-store"
    return response, 200 if healthy else 503
