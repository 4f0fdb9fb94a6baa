"""``POST /api/v1/lists/{id}/subscribe``: the public side of a list's subscription form,
for sites that draw their own form. Anyone may call it (no token); it asks for a double
opt-in exactly as the form does, and answers the same whether or not the address is
already on the list."""

from __future__ import annotations

from flask import request
from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, body, bp
from webapp.context import config, engine
from webapp.domain import subscriptions


@bp.post("/lists/<int:list_id>/subscribe")
def subscribe(list_id: int) -> Response:
    data = body("email", "name", "locale")
    with engine().begin() as conn:
        subscriptions.request(conn, config(), list_id, email=data.get("email"),
                              name=data.get("name", ""),
                              locale=subscriptions.check_locale(data.get("locale")),
                              remote_addr=request.remote_addr or "unknown", source="api")
    return answer({"status": "pending",
                   "message": "If the address can subscribe, a confirmation email is on its "
                              "way; the subscription starts when its link is confirmed."},
                  202)
