"""API: the deliverability console (admins; docs/deliverability.md): a sending domain's
figures from receiver reports, SendDock's own attempts per receiving provider, and
warm-up schedules (docs/design.md §33)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from flask import request
from werkzeug.wrappers import Response

from webapp.blueprints.api import answer, body, bp
from webapp.context import actor, config, engine
from webapp.domain import deliverability, providers, warmups
from webapp.domain.errors import Invalid
from workers.core.i18n import N_
from workers.delivery import warmup


def _days(default: int) -> int:
    """``?days=`` (1 to 400; absent: ``default``); anything else is a 422 naming it."""
    if "days" not in request.args:
        return default
    values = request.args.getlist("days")
    days = deliverability.span(values[0], 0) if len(values) == 1 else 0
    if not days:
        raise Invalid(N_("days is a whole number from 1 to %(max)s",
                         max=deliverability.MAX_SPAN), fields={"days": N_("invalid")})
    return days


def _plain(value: Any) -> Any:
    """Dates and sets as JSON has them."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set):
        return sorted(_plain(v) for v in value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


@bp.get("/domains/<domain>/deliverability")
def domain_deliverability(domain: str) -> Response:
    """What receivers reported about mail sent as ``domain`` over ``?days=`` (1-400)."""
    name = warmups.domain_name(domain)
    with engine().connect() as conn:
        view = deliverability.domain_view(conn, config(), name, _days(deliverability.PAGE_DAYS))
    for key in ("ours", "not_ours"):
        view[key] = [{**asdict(s), "pass_rate": s.pass_rate} for s in view[key]]
    return answer(_plain(view))


@bp.get("/providers")
def provider_figures() -> Response:
    """SendDock's own attempts and complaints per receiving provider group and day."""
    with engine().connect() as conn:
        view = providers.provider_view(conn, config(), _days(30))
    return answer(_plain(view))


@bp.get("/warmups")
def list_warmups() -> Response:
    with engine().connect() as conn:
        return answer({"warmups": [warmups.as_json(t) for t in warmup.all_today(conn)]})


@bp.get("/domains/<domain>/warmup")
def get_warmup(domain: str) -> Response:
    name = warmups.domain_name(domain)
    with engine().connect() as conn:
        return answer(warmups.as_json(warmups.get(conn, name)))


@bp.put("/domains/<domain>/warmup")
def put_warmup(domain: str) -> Response:
    """Start the domain's warm-up today with ``caps`` (null: the built-in ramp) and
    ``hour_share_percent``; a running warm-up restarts from day 1."""
    name = warmups.domain_name(domain)
    data = body("caps", "hour_share_percent")
    caps = warmups.check_caps(data.get("caps"))
    share = warmups.check_hour_share(data.get("hour_share_percent"))
    with engine().begin() as conn:
        return answer(warmups.as_json(warmups.start(conn, name, caps, share, actor())))


@bp.delete("/domains/<domain>/warmup")
def delete_warmup(domain: str) -> Response:
    name = warmups.domain_name(domain)
    with engine().begin() as conn:
        warmups.get(conn, name)
        warmups.stop(conn, name, actor())
    return answer({"domain": name, "stopped": True})
