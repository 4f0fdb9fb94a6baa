"""Bad input gets a clear answer and loses nothing (P9), checked against the OpenAPI
document: it lists every API route; a property-based fuzz run (hypothesis, through the
Flask test client) sends bodies built from the documented request schemas, mutated ones
(wrong types, nulls, huge and odd strings, nested junk), arbitrary JSON, broken JSON and
bad ids to every operation, and requires no 5xx, only documented statuses, and answers
that match their documented schemas (jsonschema). Oversized bodies answer 413.

``SENDDOCK_FUZZ_EXAMPLES`` sets the number of examples (default 300, well under a
minute); ``SENDDOCK_FUZZ_REPORT=path`` writes what the run tried as JSON.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jsonschema
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.security_fixtures import seed
from webapp import openapi

DOC = openapi.document()
PREFIX = "/api/v1"
FUZZ_EXAMPLES = int(os.environ.get("SENDDOCK_FUZZ_EXAMPLES", "300"))
HTTP_METHODS = ("get", "post", "put", "patch", "delete")


# --- the document ------------------------------------------------------------------------

def resolve(schema: Any, _open: frozenset[str] = frozenset()) -> Any:
    """The schema with every ``#/components/schemas/...`` reference inlined (a recursive
    one, such as Storable inside itself, becomes ``{}`` below its first level)."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[1]
            if name in _open:
                return {}
            return resolve(DOC["components"]["schemas"][name], _open | {name})
        return {key: resolve(value, _open) for key, value in schema.items()}
    if isinstance(schema, list):
        return [resolve(item, _open) for item in schema]
    return schema


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # as documented, e.g. /campaigns/{id}/send
    spec: dict[str, Any] = field(hash=False)
    parameters: tuple[dict[str, Any], ...] = field(hash=False)

    @property
    def request_schema(self) -> dict[str, Any] | None:
        content = self.spec.get("requestBody", {}).get("content", {})
        schema = content.get("application/json", {}).get("schema")
        return resolve(schema) if schema is not None else None

    def __str__(self) -> str:
        return f"{self.method.upper()} {self.path}"


def operations() -> list[Operation]:
    found = []
    for path, item in DOC["paths"].items():
        for method in HTTP_METHODS:
            if method in item:
                params = tuple(item.get("parameters", [])) + tuple(
                    item[method].get("parameters", []))
                found.append(Operation(method, path, item[method], params))
    return found


def _shape(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def _flask_paths(rule: Any) -> list[str]:
    """The documented-path shapes a Flask rule serves (``any(...)`` expanded)."""
    paths = [rule.rule[len(PREFIX):]]
    for name, converter in rule._converters.items():
        items = sorted(getattr(converter, "items", ()))
        pattern = re.compile(r"<[^>]*:?" + re.escape(name) + ">")
        paths = [pattern.sub(item, p) for p in paths for item in items] if items else [
            pattern.sub("{}", p) for p in paths]
    return [_shape(p) for p in paths]


def test_the_document_lists_every_api_route_with_its_methods(app: Any) -> None:
    documented = {(_shape(path), method) for path, item in DOC["paths"].items()
                  for method in HTTP_METHODS if method in item}
    missing = sorted(
        f"{method.upper()} {rule.rule}" for rule in app.url_map.iter_rules()
        if rule.rule.startswith(PREFIX + "/")
        for method in (m.lower() for m in (rule.methods or ()) if m not in ("HEAD", "OPTIONS"))
        for path in _flask_paths(rule) if (path, method) not in documented)
    assert not missing, f"API routes missing from webapp/openapi.py: {missing}"


def test_the_document_is_served_publicly_and_well_formed(client: Any) -> None:
    answer = client.get(f"{PREFIX}/openapi.json")
    assert answer.status_code == 200 and answer.get_json() == json.loads(json.dumps(DOC))
    for op in operations():
        assert op.spec.get("summary"), op
        for status, response in op.spec["responses"].items():
            schema = response.get("content", {}).get("application/json", {}).get("schema")
            if schema is not None:
                jsonschema.Draft202012Validator.check_schema(resolve(schema))
            assert re.fullmatch(r"[1-5]\d\d", status), (op, status)
        if op.request_schema is not None:
            jsonschema.Draft202012Validator.check_schema(op.request_schema)
        for param in op.parameters:
            assert {"name", "in", "schema"} <= param.keys(), (op, param)


# --- strategies --------------------------------------------------------------------------

NASTY_STRINGS = st.sampled_from([
    "", " ", "\x00", "a\x00b", "\ud800", "é" * 300, "😀" * 50, "\u202eevil",
    "'; DROP TABLE lists; --", "{{ 7*7 }}", "{% include 'x' %}", "../../etc/passwd",
    "%s%n%x", "-1", "1e309", "NaN", "null", "true", "0x10", " 42 ", "a@b", "@example.org",
    "someone@example.org", "SOMEONE@EXAMPLE.ORG", "someone@例え.jp", "\r\nBcc: x@y.z",
    "<script>alert(1)</script>", "https://example.com/verify?t=1", "javascript:alert(1)",
    "manual", "bounced", "unsubscribed", "complaint"])
HUGE_STRINGS = st.integers(60_000, 80_000).map(lambda n: "x" * n)
TEXT = st.one_of(NASTY_STRINGS, st.text(max_size=40), st.emails().map(str), HUGE_STRINGS)
INTEGERS = st.one_of(st.integers(-3, 50), st.sampled_from(
    [2**31, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63) - 1]), st.integers())
SCALARS = st.one_of(st.none(), st.booleans(), INTEGERS,
                    st.floats(allow_nan=False, allow_infinity=False), TEXT)
JUNK = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)


def from_schema(schema: dict[str, Any], ids: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    """Values shaped like ``schema`` (often valid, so the deep code runs) with odd content."""
    kinds = schema.get("type")
    if isinstance(kinds, list):
        return st.one_of([from_schema({**schema, "type": k}, ids) for k in kinds])
    if "enum" in schema:
        return st.one_of(st.sampled_from(schema["enum"]), TEXT)
    if kinds == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {k: _value(k, v, ids) for k, v in props.items() if k in required},
            optional={k: _value(k, v, ids) for k, v in props.items() if k not in required})
    if kinds == "array":
        return st.lists(from_schema(schema.get("items", {}), ids), max_size=6)
    if kinds == "integer":
        return st.one_of(ids, INTEGERS)
    if kinds == "string":
        if schema.get("format") == "uri":
            return st.one_of(TEXT, TEXT.map(lambda s: "https://app.example.com/v?t=" + s))
        return TEXT
    if kinds == "boolean":
        return st.booleans()
    if kinds == "null":
        return st.none()
    return JUNK


def _value(name: str, schema: dict[str, Any], ids: st.SearchStrategy[int]
           ) -> st.SearchStrategy[Any]:
    return from_schema(schema, ids)


def _mutated(value: Any, junk: Any) -> Any:
    """``value`` with one field (or the whole) replaced by junk of another type."""
    if isinstance(value, dict) and value:
        key = sorted(value, key=str)[hash(repr(junk)) % len(value)]
        return {**value, key: junk}
    return junk


def body_strategy(op: Operation, ids: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    schema = op.request_schema or {"type": "object", "properties": {}}
    shaped = from_schema(schema, ids)
    return st.one_of(
        shaped, shaped,
        st.tuples(shaped, JUNK).map(lambda pair: _mutated(*pair)),
        JUNK.map(lambda j: {"subscribers": [j]} if "subscribers" in str(op) else j),
        st.builds(lambda raw: RawBody(raw), st.one_of(
            st.binary(max_size=64), st.sampled_from(
                [b"{", b"[1,", b'{"name": "x"', b"\xff\xfe", b"null", b"", b"{}" * 1000])),
    ))


@dataclass(frozen=True)
class RawBody:
    data: bytes


def path_value(param: dict[str, Any], ids: st.SearchStrategy[int]) -> st.SearchStrategy[str]:
    if param["schema"].get("type") == "integer":
        return st.one_of(ids, INTEGERS, st.sampled_from(["abc", "1.5", "-1", "%00"])).map(str)
    return st.one_of(TEXT, st.sampled_from(["suppressed@example.org"])).map(
        lambda s: quote(s.encode("utf-8", "surrogatepass"), safe="") or "x")


def query_strategy(op: Operation, ids: st.SearchStrategy[int]) -> st.SearchStrategy[str]:
    names = [p for p in op.parameters if p["in"] == "query"]
    if not names:
        return st.just("")
    pairs = st.fixed_dictionaries({}, optional={
        p["name"]: st.one_of(TEXT, INTEGERS.map(str)) for p in names})
    return pairs.map(lambda values: urlencode(values, errors="surrogatepass"))


# --- checking an answer ------------------------------------------------------------------

def check_answer(op: Operation, answer: Any) -> None:
    status = answer.status_code
    text = answer.get_data(as_text=True)
    assert status < 500, f"{op}: {status} {text[:500]}"
    documented = op.spec["responses"]
    assert str(status) in documented, f"{op}: undocumented status {status}: {text[:300]}"
    if status == 204:
        return
    assert answer.mimetype == "application/json", f"{op}: {status} {answer.mimetype}"
    body = answer.get_json()
    schema = documented[str(status)].get("content", {}).get("application/json", {}).get(
        "schema")
    if schema is not None:
        errors = sorted(jsonschema.Draft202012Validator(resolve(schema)).iter_errors(body),
                        key=str)
        assert not errors, f"{op}: {status} breaks its schema: {errors[0].message}\n{body}"
    if status >= 400:
        assert body["error"]["message"].strip(), body
        if status == 422:
            assert body["error"]["fields"], f"{op}: 422 without the field named: {body}"


def make_request(client: Any, op: Operation, path_values: dict[str, str], query: str,
                 body: Any, headers: dict[str, str]) -> Any:
    path = op.path
    for name, value in path_values.items():
        path = path.replace("{" + name + "}", value)
    url = PREFIX + path + (f"?{query}" if query else "")
    if op.method in ("get", "delete"):
        return client.open(url, method=op.method.upper(), headers=headers)
    if isinstance(body, RawBody):
        return client.open(url, method=op.method.upper(), headers=headers, data=body.data,
                           content_type="application/json")
    return client.open(url, method=op.method.upper(), headers=headers, json=body)


class FuzzLog:
    """What a fuzz run tried, for the report."""

    def __init__(self) -> None:
        self.per_operation: Counter[str] = Counter()
        self.per_status: Counter[str] = Counter()
        self.raw_bodies = 0

    def note(self, op: Operation, status: int, raw: bool) -> None:
        self.per_operation[str(op)] += 1
        self.per_status[f"{op} -> {status}"] += 1
        self.raw_bodies += raw

    def write(self) -> None:
        target = os.environ.get("SENDDOCK_FUZZ_REPORT")
        if target:
            Path(target).write_text(json.dumps({
                "examples": sum(self.per_operation.values()), "raw_bodies": self.raw_bodies,
                "per_operation": dict(self.per_operation),
                "per_status": dict(sorted(self.per_status.items()))}, indent=2))


@pytest.fixture()
def seeded(app: Any, engine: sa.Engine) -> dict[str, Any]:
    return seed(engine, app.extensions["senddock"].config)


def test_fuzz_the_api(app: Any, seeded: dict[str, Any],
                      make_user: Callable[..., dict[str, Any]]) -> None:
    headers = {"Authorization": f"Bearer {make_user('admin')['token']}"}
    client = app.test_client()
    ops = operations()
    ids = st.sampled_from([seeded[k] for k in (
        "campaign_id", "list_id", "job_id", "failed_job_id", "verification_job_id")])
    log = FuzzLog()

    def fuzz(chosen: list[Operation], examples: int) -> None:
        @settings(max_examples=examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(data=st.data())
        def run(data: st.DataObject) -> None:
            op = data.draw(st.sampled_from(chosen), label="operation")
            path_values = {p["name"]: data.draw(path_value(p, ids), label=p["name"])
                           for p in op.parameters if p["in"] == "path"}
            query = data.draw(query_strategy(op, ids), label="query")
            body = data.draw(body_strategy(op, ids), label="body")
            extra = data.draw(st.fixed_dictionaries({}, optional={
                "Idempotency-Key": st.text(max_size=300).filter(
                    lambda s: s.isprintable() and s.isascii())}), label="headers")
            answer = make_request(client, op, path_values, query, body, {**headers, **extra})
            log.note(op, answer.status_code, isinstance(body, RawBody))
            check_answer(op, answer)

        run()

    try:
        fuzz(ops, FUZZ_EXAMPLES)
        # Random draws (biased, as Hypothesis's are, towards the first of a list) can miss
        # an operation now and then: each of those gets a round of its own.
        for op in [op for op in ops if str(op) not in log.per_operation]:
            fuzz([op], 30)
    finally:
        log.write()
    assert set(log.per_operation) == {str(op) for op in ops}, "some operations never ran"


# --- specific promises -------------------------------------------------------------------

def test_unknown_ids_are_404_with_a_message(api: Any) -> None:
    for path in ("/campaigns/987654321", "/jobs/987654321", "/campaigns/99999999999999999999",
                 "/jobs/99999999999999999999999"):
        answer = api.get(path)
        assert answer.status_code == 404, (path, answer.get_json())
        assert answer.get_json()["error"]["message"]
    for path, body in (("/lists/987654321/subscribers", {"subscribers": []}),
                       ("/campaigns/987654321/send", {}),
                       ("/campaigns", {"name": "x", "list_id": 987654321, "subject": "s",
                                       "text": "t"})):
        assert api.post(path, body).status_code == 404, path
    assert api.delete("/suppressions/nobody%40example.org").status_code == 404
    assert api.get("/no/such/thing").status_code == 404


@pytest.mark.parametrize(("path", "body", "field_name"), [
    ("/lists", {"name": 5}, "name"),
    ("/lists", {"name": None}, "name"),
    ("/campaigns", {"name": "x", "list_id": "1", "subject": "s", "text": "t"}, "list_id"),
    ("/campaigns", {"name": "x", "list_id": True, "subject": "s", "text": "t"}, "list_id"),
    ("/campaigns", {"name": "x", "list_id": "{list}", "subject": "s", "text": "t",
                    "from": "News <no-at-sign>"}, "from"),
    ("/lists/{list}/subscribers", {"subscribers": "a@b.c"}, "subscribers"),
    ("/verifications", {"user_id": [1], "email": "a@example.org",
                        "verify_url": "https://x.example/v"}, "user_id"),
    ("/verifications", {"user_id": 1, "email": 7, "verify_url": "https://x.example/v"},
     "email"),
    ("/verifications", {"user_id": 1, "email": "a@example.org", "verify_url": 3},
     "verify_url"),
    ("/verifications/resend", {"user_id": {"x": 1}}, "user_id"),
    ("/suppressions", {"email": ["a@example.org"]}, "email"),
    ("/suppressions", {"email": "a@example.org", "note": 1}, "note"),
])
def test_wrong_types_are_422_naming_the_field(api: Any, path: str, body: dict[str, Any],
                                              field_name: str) -> None:
    list_id = api.post("/lists", {"name": "Types"}).get_json()["id"]
    body = json.loads(json.dumps(body).replace('"{list}"', str(list_id)))
    answer = api.post(path.replace("{list}", str(list_id)), body)
    assert answer.status_code == 422, answer.get_json()
    assert field_name in answer.get_json()["error"]["fields"], answer.get_json()


def test_a_batch_with_bad_items_keeps_the_good_ones(api: Any, engine: sa.Engine) -> None:
    # Nothing is lost to a bad neighbour: each bad item is reported with its index.
    list_id = api.post("/lists", {"name": "Mixed"}).get_json()["id"]
    items: list[Any] = [{"email": "good1@example.org"}, {"email": "not an address"},
                        None, {"email": "good2@example.org", "name": 5},
                        {"email": "good3@example.org", "attributes": "x"}, "x@example.org",
                        {"email": "GOOD1@example.org"}, {"email": "good4@example.org",
                                                         "name": "Ok", "attributes": {"a": 1}}]
    answer = api.post(f"/lists/{list_id}/subscribers", {"subscribers": items})
    assert answer.status_code == 200, answer.get_json()
    result = answer.get_json()
    reported = {e["index"] for e in result["errors"]}
    assert result["added"] + result["updated"] + len(reported) >= 2
    with engine.connect() as conn:
        stored = set(conn.execute(sa.text("""
            SELECT lower(s.email) FROM subscribers s JOIN memberships m
              ON m.subscriber_id = s.id WHERE m.list_id = :l"""), {"l": list_id}).scalars())
    assert {"good1@example.org", "good4@example.org"} <= stored
    assert {1, 2, 5} <= reported
    for error in result["errors"]:
        assert error["error"], error


def test_oversized_bodies_answer_413(app: Any, engine: sa.Engine, sink: Any,
                                     config_for: Callable[..., Any],
                                     make_user: Callable[..., dict[str, Any]]) -> None:
    from tests.integration.security_fixtures import login
    from webapp import create_app

    small = create_app(config_for(sink.port, MAX_REQUEST_BYTES="2048"), engine=engine)
    client = small.test_client()
    user = make_user("admin")
    big = "x" * 4096
    answer = client.post(f"{PREFIX}/lists", json={"name": big},
                         headers={"Authorization": f"Bearer {user['token']}"})
    assert answer.status_code == 413 and answer.get_json()["error"]["message"]
    csrf = login(client, user)
    form = client.post("/lists/", data={"csrf_token": csrf, "name": big})
    assert form.status_code == 413 and "too large" in form.get_data(as_text=True)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM lists")).scalar_one() == 0
    fine = client.post(f"{PREFIX}/lists", json={"name": "small"},
                       headers={"Authorization": f"Bearer {user['token']}"})
    assert fine.status_code == 201


# --- the pages get bad input too ---------------------------------------------------------

BAD_VALUES = ["\x00", "a\x00b", "-1", "0", "abc", "99999999999999999999999", "1.5",
              "2026-13-45", "2026-02-30T25:61", "<script>", "%", "😀" * 3, " ", "x" * 5000,
              # An unknown kind (KeyError), a valid address (the suppression form's
              # TypeError), digits int() refuses ("²", 5,000 of them), a huge count.
              "zzz", "walk@example.com", "²", "9" * 5000, "5000000"]
FORM_FIELDS = ("name", "email", "emails", "role", "active", "q", "note", "reason", "list_id",
               "subject", "text", "html", "from", "at", "tz", "password", "as_of", "campaign",
               "kind", "class", "description", "attributes", "subscriber", "action", "after",
               "before", "columns", "role_0", "state", "page", "only", "reason", "event",
               "events", "kinds", "url", "user_id", "language", "secret_for", "fragment",
               "back", "next", "scope", "status", "sort", "limit", "offset", "days")


def test_text_the_database_cannot_store_is_422_naming_the_field(
        app: Any, api: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    from tests.integration.security_fixtures import login

    answer = api.post("/lists/1/subscribers", {"subscribers": [{"email": "a@example.org",
                                                                "name": "a\x00b"}]})
    assert answer.status_code == 422
    assert answer.get_json()["error"]["fields"] == {"subscribers.0.name":
                                                    "must not contain a NUL character"}
    assert api.post("/lists", {"name": "\ud800"}).get_json()["error"]["fields"] == {
        "name": "is not valid Unicode"}
    assert api.get("/suppressions?q=a%00").status_code == 422
    assert api.delete("/suppressions/a%00b%40example.org").status_code == 422
    client = app.test_client()
    csrf = login(client, make_user("admin"))
    page = client.post("/lists/", data={"csrf_token": csrf, "name": "a\x00b"})
    assert page.status_code == 422 and "NUL" in page.get_data(as_text=True)


def test_pages_survive_bad_query_values_and_form_fields(
        app: Any, seeded: dict[str, Any], make_user: Callable[..., dict[str, Any]]) -> None:
    from tests.integration.security_fixtures import calls, login

    client = app.test_client()
    admin = make_user("admin")
    csrf = login(client, admin)
    problems = []
    for call in calls(app, seeded, existing_for_writes=True):
        if call.is_api or call.endpoint in ("static", "auth.logout", "auth.login"):
            continue
        for value in BAD_VALUES:
            fields = dict.fromkeys(FORM_FIELDS, value)
            url = f"{call.url}?{urlencode(fields)}"
            if call.method == "GET":
                answer = client.get(url)
            else:
                answer = client.open(call.url, method=call.method,
                                     data={**fields, "csrf_token": csrf})
            if answer.status_code >= 500:
                problems.append(f"{call} with {value[:20]!r}: {answer.status_code}")
        if client.get("/").status_code != 200:  # the walk disabled or demoted us
            admin = make_user("admin")
            csrf = login(client, admin)
    assert not problems, "\n".join(problems)


def test_a_double_slash_is_not_redirected_to_another_target(api: Any) -> None:
    api.post("/suppressions", {"email": "b@example.org"})
    answer = api.delete("/suppressions/%2Fb%40example.org")
    assert answer.status_code in (404, 422) and answer.mimetype == "application/json"
    assert api.get("/suppressions?email=b%40example.org").get_json()["suppressions"]
