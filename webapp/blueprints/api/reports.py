"""API: receiver reports (admins; docs/deliverability.md). ``POST /reports`` takes one
report file as the request body (XML, JSON, gzip, zip or an email message, any
Content-Type) and answers what was stored, or why the file holds no readable report;
``GET /reports`` lists the latest stored reports and refused files."""

from __future__ import annotations

from flask import request
from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, bp
from webapp.context import engine
from webapp.domain import deliverability
from webapp.domain.errors import DomainError
from workers.after_acceptance.receiver_reports.store import ingest


@bp.post("/reports")
def upload_report() -> Response:
    data = request.get_data(cache=False)
    if not data:
        raise DomainError("the request body must be the report file (it is empty)")
    filename = request.args.get("filename", "")[:500]
    with engine().begin() as conn:
        result = ingest(conn, data, filename=filename, source="api")
    # A file that holds no readable report is received all the same: it is listed among the
    # refused files, and the answer (200, no report) says why in ``error``. Any bytes are a
    # valid request (the body is a file), so this is an outcome, not a malformed request.
    created = any(not r.duplicate for r in result.reports)
    return answer(result.as_json(), 201 if created else 200)


@bp.get("/reports")
def list_reports() -> Response:
    with engine().connect() as conn:
        latest = deliverability.recent(conn)
    return answer(latest)
