"""The OpenAPI document says what the server checks: each case
Schemathesis's default checks found, through the document's own schema and the server."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from tests.conftest import Api
from webapp import openapi


def _body_schema(path: str, method: str) -> dict[str, Any]:
    document = openapi.document()
    schema = document["paths"][path][method]["requestBody"]["content"]["application/json"][
        "schema"]
    return {**schema, "components": document["components"]}


def _put(api: Api, path: str, body: dict[str, Any]) -> Any:
    return api.client.put(f"/api/v1{path}", json=body, headers=api.headers)


def _valid(path: str, method: str, body: dict[str, Any]) -> bool:
    resolver_schema = _body_schema(path, method)
    try:
        jsonschema.validate(body, resolver_schema, cls=jsonschema.Draft202012Validator)
    except jsonschema.ValidationError:
        return False
    return True


@pytest.fixture()
def list_id(api: Api) -> int:
    return int(api.post("/lists", {"name": "truth"}).get_json()["id"])


@pytest.mark.parametrize(("changes", "accepted"), [
    ({"subject": "o\u0093\u00b7"}, False),   # a C1 control character (what Schemathesis sent)
    ({"subject": "Hello\t"}, False),          # a control character at the end
    ({"from": "Ann <ann@example.com>"}, True),
    ({"from": "ann@example.com"}, True),
    ({"from": "  "}, True),                    # blank: SENDDOCK_FROM
    ({"from": None}, True),
    ({"from": "Ann <ann@example.com>\r\n"}, False),
    ({"from": "Ann <ann@host.test>"}, False),  # a special-use domain
])
def test_campaign_headers_document_and_server_agree(api: Api, list_id: int,
                                                    changes: dict[str, Any],
                                                    accepted: bool) -> None:
    body = {"name": "c", "list_id": list_id, "subject": "Hi", "text": "Hello", **changes}
    assert _valid("/campaigns", "post", body) is accepted
    answer = api.post("/campaigns", body)
    assert answer.status_code == (201 if accepted else 422), answer.get_json()


def test_kind_samples_may_be_null_and_the_builtin_kind_answers_409(api: Api) -> None:
    body = {"class": "lifecycle", "subject": "Hi", "text": "Hello", "sample_data": None,
            "sample_event": None}
    assert _valid("/kinds/{name}", "put", body)
    assert _put(api, "/kinds/onboarding", body).status_code == 201
    # A new kind without a class: lifecycle, as the document's default says.
    created = _put(api, "/kinds/churn", {"subject": "Hi", "text": "Hello"})
    assert created.status_code == 201 and created.get_json()["class"] == "lifecycle"
    assert _valid("/kinds/{name}", "put", {"subject": "Hi", "text": "Hello"})
    # A new kind given no subject (Schemathesis, random seed): 409, as for a missing body.
    assert _put(api, "/kinds/nosubject", {"text": "Hello"}).status_code == 409
    answer = _put(api, "/kinds/verification", {"class": "lifecycle"})
    assert answer.status_code == 409  # schema-valid, conflicts with the built-in kind
    assert "409" in openapi.document()["paths"]["/kinds/{name}"]["put"]["responses"]


def test_send_at_rule_is_published(api: Api) -> None:
    base = {"kind": "verification", "user_id": 5, "email": "a@example.org",
            "data": {"verify_url": "https://app.example/v"}}
    assert _valid("/messages", "post", {**base, "send_at": "0471-02-13T17:08:28.946+10:40"})
    assert not _valid("/messages", "post", {**base, "send_at": "3000-01-01T00:00:00Z"})
    assert api.post("/messages", {**base, "send_at": "0471-02-13T17:08:28.946+10:40"}
                    ).status_code == 202
    assert api.post("/messages", {**base, "user_id": 6, "send_at": "3000-01-01T00:00:00Z"}
                    ).status_code == 422


def test_the_resend_link_names_the_user_the_job_was_stored_for(api: Api) -> None:
    """The Resend link takes the user id from the answer (the stored one, as text), not
    from the request, so the linked resend finds the job whatever form the id came in."""
    link = openapi.document()["paths"]["/verifications"]["post"]["responses"]["202"][
        "links"]["Resend"]
    assert link["requestBody"] == {"user_id": "$response.body#/user_id"}
    for n, user_id in enumerate((-3951, "  spaced  ", 0)):
        created = api.post("/verifications", {"user_id": user_id,
                                              "email": f"r{n}@example.org",
                                              "verify_url": "https://app.example/v"})
        assert created.status_code == 202, created.get_json()
        resent = api.post("/verifications/resend", {"user_id": created.get_json()["user_id"]})
        assert resent.status_code in (202, 429), resent.get_json()  # never 404
