"""The deliverability console through the API (docs/deliverability.md): a sending domain's
figures from receiver reports, the per-provider figures, and warm-up schedules started,
read and stopped — each answer as the OpenAPI document says, admins only, each change
audited, bad input refused naming the field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
import sqlalchemy as sa

from tests.conftest import Api
from tests.integration.test_deliverability_pages import recent_report
from webapp import create_app, openapi
from workers.core.settings import Config
from workers.delivery import warmup


@pytest.fixture()
def admin(engine: sa.Engine, config_for: Callable[..., Config], sink: Any,
          make_user: Callable[..., dict[str, Any]]) -> Api:
    application = create_app(config_for(sink.port, SENDING_IPS="192.0.2.0/28"),
                             engine=engine)
    application.config["TESTING"] = True
    return Api(application.test_client(), make_user("admin")["token"])


def _check(answer: Any, path: str, method: str, status: int) -> dict[str, Any]:
    assert answer.status_code == status, answer.get_json()
    document = openapi.document()
    schema = document["paths"][path][method]["responses"][str(status)]["content"][
        "application/json"]["schema"]
    data: dict[str, Any] = answer.get_json()
    jsonschema.validate(data, {**schema, "components": document["components"]},
                        cls=jsonschema.Draft202012Validator)
    return data


def _put(api: Api, path: str, json: Any) -> Any:
    return api.client.put(f"/api/v1{path}", json=json, headers=api.headers)


def test_domain_figures_and_providers(admin: Api) -> None:
    assert admin.post("/reports", data=recent_report()).status_code == 201
    view = _check(admin.get("/domains/senddock.test/deliverability?days=7"),
                  "/domains/{domain}/deliverability", "get", 200)
    assert view["domain"] == "senddock.test" and view["days"] == 7
    assert view["messages"] > 0
    assert sum(s["messages"] for s in view["ours"] + view["not_ours"]) == view["messages"]
    assert all(isinstance(s["reporters"], list) for s in view["ours"] + view["not_ours"])
    # Upper case and a trailing dot are the same domain; no domain at all is not found.
    same = admin.get("/domains/SendDock.Test./deliverability?days=7").get_json()
    assert same["messages"] == view["messages"]
    assert admin.get("/domains/not%20a%20domain/deliverability").status_code == 404
    assert admin.get("/domains/senddock.test/deliverability").get_json()["days"] == 30
    for days in ("9999", "0", "null", "7&days=8"):
        refused = admin.get(f"/domains/senddock.test/deliverability?days={days}")
        assert refused.status_code == 422 and "days" in refused.get_json()["error"]["fields"]
    figures = _check(admin.get("/providers?days=3"), "/providers", "get", 200)
    assert figures["days"] == 3 and [t["group"] for t in figures["totals"]] == figures[
        "groups"]


def test_a_warm_up_started_read_and_stopped(admin: Api, engine: sa.Engine) -> None:
    assert admin.get("/domains/warm.example/warmup").status_code == 404
    started = _check(_put(admin, "/domains/Warm.Example/warmup",
                          {"caps": [10, 20, 40], "hour_share_percent": 50}),
                     "/domains/{domain}/warmup", "put", 200)
    assert started["domain"] == "warm.example" and started["day"] == 1
    assert (started["daily_cap"], started["hourly_cap"]) == (10, 5)
    assert started["allowed_now"] == 5 and started["custom_schedule"] is True
    listed = _check(admin.get("/warmups"), "/warmups", "get", 200)
    assert [w["domain"] for w in listed["warmups"]] == ["warm.example"]
    ramp = _check(_put(admin, "/domains/warm.example/warmup", {}),
                  "/domains/{domain}/warmup", "put", 200)
    assert ramp["daily_cap"] == warmup.RAMP[0] and ramp["custom_schedule"] is False
    assert _check(admin.get("/domains/warm.example/warmup"), "/domains/{domain}/warmup",
                  "get", 200)["daily_cap"] == warmup.RAMP[0]
    stopped = _check(admin.delete("/domains/warm.example/warmup"),
                     "/domains/{domain}/warmup", "delete", 200)
    assert stopped == {"domain": "warm.example", "stopped": True}
    assert admin.delete("/domains/warm.example/warmup").status_code == 404
    with engine.connect() as conn:
        actions = conn.execute(sa.text(
            "SELECT action FROM audit_log WHERE target = 'domain:warm.example' ORDER BY id"
        )).scalars().all()
    assert actions == ["warmup.start", "warmup.start", "warmup.stop"]


@pytest.mark.parametrize(("body", "field"), [
    ({"caps": []}, "caps"), ({"caps": [0]}, "caps"), ({"caps": [1.5]}, "caps"),
    ({"caps": [True]}, "caps"), ({"caps": "50 100"}, "caps"),
    ({"caps": [1] * (warmup.MAX_DAYS + 1)}, "caps"),
    ({"hour_share_percent": 0}, "hour_share_percent"),
    ({"hour_share_percent": 101}, "hour_share_percent"),
    ({"hour_share_percent": "25"}, "hour_share_percent"), ({"days": 3}, "days")])
def test_bad_schedules_are_refused_naming_the_field(admin: Api, engine: sa.Engine,
                                                   body: dict[str, Any], field: str) -> None:
    refused = _put(admin, "/domains/warm.example/warmup", body)
    assert refused.status_code == 422, refused.get_json()
    assert field in refused.get_json()["error"]["fields"]
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM warmups")).scalar_one() == 0


def test_only_admins(engine: sa.Engine, config_for: Callable[..., Config], sink: Any,
                     make_user: Callable[..., dict[str, Any]]) -> None:
    client = create_app(config_for(sink.port), engine=engine).test_client()
    for role in ("marketer", "support"):
        api = Api(client, make_user(role)["token"])
        for path in ("/warmups", "/providers", "/domains/warm.example/warmup",
                     "/domains/warm.example/deliverability"):
            assert api.get(path).status_code == 403, (role, path)
        assert _put(api, "/domains/warm.example/warmup", {}).status_code == 403
        assert api.delete("/domains/warm.example/warmup").status_code == 403
