"""Operations endpoints: ``/metrics`` (Prometheus; an admin's session or bearer token) and
``/healthz`` (public; for load balancers and orchestrators)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from werkzeug.wrappers import Response

from webapp.metrics import registry_for

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
    """Within a second, whatever the database does (its own connection and thread, see
    :mod:`webapp.dbhealth`). Status words only — anyone may call this; the details (the
    driver's words, hosts, the relay's reply) are on Queue health for admins.

    - ``ok`` (200): the database reads and writes, the pool (if hosted here) runs;
    - ``degraded`` (200): this process works but something is wrong that it cannot fix:
      writes fail (disk full, read-only standby), the database is busy or out of
      connections, or the relay is down (delivery pauses by itself, P6);
    - ``down`` (503): the database cannot be reached or did not answer, or this
      process's delivery pool stopped."""
    ext = current_app.extensions["senddock"]
    result, problem, _detail = ext.health_probe().summary()
    relay = result.relay.get("status", "ok")
    body: dict[str, Any] = {
        "status": "ok",
        "database": "ok" if problem is None else problem.status,
        "relay": {"status": relay},
    }
    if problem is not None:
        body["message"] = problem.message
    pool = ext.pool
    body["pool"] = "not in this process" if pool is None else \
        ("running" if pool.status()["running"] else "stopped")
    down = not result.reachable or body["pool"] == "stopped"
    if down:
        body["status"] = "down"
    elif problem is not None or relay == "down":
        body["status"] = "degraded"
    response = jsonify(body)
    response.headers["Cache-Control"] = "no-store"
    if problem is not None:
        response.headers["Retry-After"] = str(problem.retry_after)
    return response, 503 if down else 200
