"""The JSON API (``/api/v1``): one blueprint, one module per area. Views parse input, call
one domain function and answer JSON; errors are JSON with a message and the offending
fields (P9, see :mod:`webapp.errors`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import Blueprint, current_app, jsonify, request
from werkzeug.wrappers import Response

from webapp.domain.errors import DomainError, Invalid
from workers.core import fastjson

bp = Blueprint("api", __name__)


def body(*allowed: str) -> dict[str, Any]:
    """The request's JSON object, or a 400 that says what is wrong with it; with
    ``allowed``, a field outside it is a 422 naming it (a misspelt field is not silently
    ignored, and the OpenAPI document's ``additionalProperties: false`` is true)."""
    if not request.data:
        raise DomainError("the request body must be a JSON object")
    if not request.is_json:
        raise DomainError("the request body is not valid JSON (Content-Type must be "
                          "application/json)")
    data = request.get_json()  # bad or too deeply nested JSON: a 400 saying why
    if not isinstance(data, dict):
        raise DomainError("the request body must be a JSON object")
    unknown = sorted(set(data) - set(allowed)) if allowed else []
    if unknown:
        raise Invalid(f"unknown field{'s' if len(unknown) > 1 else ''}: "
                      f"{', '.join(unknown)}", fields={k: "unknown field" for k in unknown})
    return data


def jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def _iso(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


def answer(payload: dict[str, Any], status: int = 200) -> Response:
    """``payload`` as JSON, times as ISO 8601, keys sorted, as Flask's ``jsonify`` wrote it
    (through orjson: a batch's 207 answer cost a tenth of its Python), except that a NaN or
    infinity (never stored: PostgreSQL's JSON refuses them) would be ``null``, valid JSON,
    where ``jsonify`` wrote ``NaN``."""
    text = fastjson.dumps(payload, sort_keys=True, default=_iso, nan_as_null=True)
    if text is None:
        response = jsonify(jsonable(payload))
    else:
        response = current_app.response_class(text + "\n", mimetype="application/json")
    response.status_code = status
    return response




# The route modules register themselves on ``bp``.
from webapp.blueprints.api import core  # noqa: E402, F401, I001
from webapp.blueprints.api import suppressions  # noqa: E402, F401
from webapp.blueprints.api import verifications  # noqa: E402, F401
from webapp.blueprints.api import kinds  # noqa: E402, F401
from webapp.blueprints.api import messages  # noqa: E402, F401
from webapp.blueprints.api import subscriptions  # noqa: E402, F401
from webapp.blueprints.api import segments  # noqa: E402, F401
from webapp.blueprints.api import tracking  # noqa: E402, F401
from webapp.blueprints.api import sequences  # noqa: E402, F401
from webapp.blueprints.api import reports  # noqa: E402, F401
from webapp.blueprints.api import deliverability  # noqa: E402, F401
from webapp.blueprints.api import bounce_rules  # noqa: E402, F401
from webapp.blueprints.api import personal_data  # noqa: E402, F401
