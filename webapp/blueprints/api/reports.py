"""API: receiver reports (admins; docs/deliverability.md). ``POST /reports`` takes one
report file as the request body (XML, JSON, gzip, zip or an email message, any
Content-Type); ``GET /reports`` lists the latest stored reports and refused files."""

from __future__ import annotations

from flask import request
from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, bp
from webapp.context import engine
from webapp.domain import deliverability
from webapp.domain.errors import Invalid
from workers.after_acceptance.receiver_reports.store import ingest


@bp.post("/reports")
def upload_report() -> Response:
    data = request.get_data(cache=False)
    filename = request.args.get("filename", "")[:500]
    with engine().begin() as conn:
        result = ingest(conn, data, filename=filename, source="api")
    if result.error is not None:  # the refusal is listed (committed) before answering
        raise Invalid(f"not a readable report: {result.error}", fields={"body": result.error})
    created = any(not r.duplicate for r in result.reports)
    return answer(result.as_json(), 201 if created else 200)


@bp.get("/reports")
def list_reports() -> Response:
    with engine().connect() as conn:
        latest = deliverability.recent(conn)
    return answer(latest)
