"""Everything outsiders wrote is escaped where it is shown (P10): SMTP reply text (through
the real pool and the sink's scripted replies), subscriber names and attributes, CSV cells
and file names, campaign and list names, verification user ids, suppression notes, and
search terms reflected back. The pages are discovered by walking every GET route as an
admin, each also with the payload in the common query parameters."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import pytest
import sqlalchemy as sa

from tests.conftest import wait_for
from tests.helpers import campaign_status
from tests.integration.security_fixtures import calls, login
from workers.building import links
from workers.delivery.pool import Pool

PAYLOADS = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>']
QUERY_PARAMS = ("q", "email", "reason", "kind", "class", "campaign", "after", "subscriber",
                "since", "until", "status", "user", "next", "from", "to")


def _api(client: Any, token: str, path: str, json: Any) -> dict[str, Any]:
    answer = client.post(f"/api/v1{path}", json=json,
                         headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code < 300, answer.get_json()
    body: dict[str, Any] = answer.get_json()
    return body


def _deliver_with_payload_replies(engine: sa.Engine, sink: Any, config: Any, client: Any,
                                  token: str, payload: str) -> dict[str, Any]:
    """A campaign whose recipients get a rejection and a hard bounce carrying the payload,
    and a verification email for a user whose id is the payload, through the real pool."""
    sink.set_rules({"rules": [
        {"match": "rejected@example.org", "reply": f"550 5.7.1 {payload}"},
        {"match": "bounced@example.org", "reply": f"550 5.1.1 {payload}"},
        {"match": "verify@example.org", "reply": f"554 5.7.1 {payload}"}]})
    the_list = _api(client, token, "/lists", {"name": payload})
    _api(client, token, f"/lists/{the_list['id']}/subscribers", {"subscribers": [
        {"email": email, "name": payload, "attributes": {"note": payload, payload: "x"}}
        for email in ("rejected@example.org", "bounced@example.org", "fine@example.org")]})
    campaign = _api(client, token, "/campaigns", {
        "name": payload, "list_id": the_list["id"], "subject": "Hi {{ name }}",
        "text": "Hello {{ name }}", "html": "<p>Hello {{ name }}</p>"})
    _api(client, token, f"/campaigns/{campaign['id']}/send", {})
    job = _api(client, token, "/verifications", {
        "user_id": payload, "email": "verify@example.org",
        "verify_url": "https://app.example.com/verify?t=1"})
    _api(client, token, "/suppressions", {"email": "noted@example.org", "note": payload})
    pool = Pool(engine, config, node="escaping-test")
    pool.start()
    try:
        wait_for(lambda: campaign_status(engine, campaign["id"]) == "sent", timeout=60,
                 message="campaign to finish")
        wait_for(lambda: client.get(f"/api/v1/jobs/{job['id']}", headers={
            "Authorization": f"Bearer {token}"}).get_json()["status"] == "failed",
            timeout=30, message="verification to fail")
    finally:
        pool.stop()
    return {"campaign": campaign, "list": the_list, "verification": job}


def _ids(engine: sa.Engine, config: Any, seeded: dict[str, Any], payload: str
         ) -> dict[str, Any]:
    """Path parameters that name the rows carrying the payload."""
    with engine.connect() as conn:
        subscriber_id, job_id = conn.execute(sa.text("""
            SELECT s.id, j.id FROM subscribers s JOIN delivery_jobs j ON j.email = s.email
             WHERE s.email = 'rejected@example.org'""")).one()
    campaign_id = seeded["campaign"]["id"]
    return {"campaign_id": campaign_id, "list_id": seeded["list"]["id"],
            "subscriber_id": subscriber_id, "job_id": job_id, "user_ref": payload,
            "suppressed_email": "bounced@example.org", "static_file": "css/app.css",
            "unsubscribe": links.make_token(config.secret_key, subscriber_id,
                                                        campaign_id)}


def _unescaped(answer: Any, payload: str) -> bool:
    return answer.mimetype == "text/html" and payload in answer.get_data(as_text=True)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_outsiders_text_is_escaped_on_every_page(
        payload: str, app: Any, engine: sa.Engine, sink: Any,
        make_user: Callable[..., dict[str, Any]]) -> None:
    config = app.extensions["senddock"].config
    admin = make_user("admin")
    client = app.test_client()
    seeded = _deliver_with_payload_replies(engine, sink, config, client, admin["token"],
                                           payload)
    login(client, admin)
    ids = _ids(engine, config, seeded, payload)
    query = urlencode(dict.fromkeys(QUERY_PARAMS, payload))
    seen, problems = 0, []
    for call in calls(app, ids):
        if call.method != "GET" or call.endpoint == "static":
            continue
        for url in (call.url, f"{call.url}?{query}"):
            for headers in ({}, {"HX-Request": "true"}):
                answer = client.get(url, headers=headers)
                # An image (the open pixel) has no text to escape.
                text = "" if answer.mimetype.startswith("image/") else \
                    answer.get_data(as_text=True)
                seen += payload in text or \
                    payload.replace('"', "&#34;").replace("<", "&lt;") in text
                if answer.status_code >= 500:
                    problems.append(f"{url} {headers}: {answer.status_code}")
                if _unescaped(answer, payload):
                    problems.append(f"{url} {headers}: the payload is not escaped")
    assert not problems, "\n".join(problems)
    assert seen >= 10  # the payload was really shown (escaped) on the pages walked
    _check_what_the_pages_show(client, ids, payload)


def _check_what_the_pages_show(client: Any, ids: dict[str, Any], payload: str) -> None:
    # The places each kind of outsider text is expected, escaped (not merely absent).
    escaped = payload.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    escaped = escaped.replace('"', "&#34;")
    for path in (f"/inbox/{ids['job_id']}", "/inbox/", "/admin/suppressions",
                 f"/lists/{ids['list_id']}", f"/campaigns/{ids['campaign_id']}",
                 "/campaigns/", "/lists/", "/support/?q=verify%40example.org"):
        html = client.get(path, follow_redirects=True).get_data(as_text=True)
        assert escaped in html, f"{path} does not show the payload (escaped)"


@pytest.mark.parametrize("payload", PAYLOADS)
def test_csv_cells_and_file_names_are_escaped_in_the_import_report(
        payload: str, app: Any, api: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    list_id = api.post("/lists", {"name": "CSV"}).get_json()["id"]
    client = app.test_client()
    csrf = login(client, make_user("marketer"))
    cell = payload.replace('"', '""')
    csv = (f'email,name,"{cell}"\n'
           f'ok@example.org,"{cell}","{cell}"\n'
           f'"{cell}","{cell}",x\n'
           f'not-an-address,"{cell}",y\n').encode()
    # (The test client does not escape a quote in a file name as browsers do: use ').
    filename = payload.replace('"', "'") + ".csv"
    answer = client.post(f"/lists/{list_id}/import", data={
        "csrf_token": csrf, "file": (io.BytesIO(csv), filename)},
        content_type="multipart/form-data")
    assert answer.status_code == 200, answer.get_data(as_text=True)[:2000]
    html = answer.get_data(as_text=True)
    assert payload not in html and filename.replace(".csv", "") not in html
    assert '<td class="num">3</td>' in html and '<td class="num">4</td>' in html
    for path in (f"/lists/{list_id}", f"/lists/{list_id}?q=ok"):
        page = client.get(path).get_data(as_text=True)
        assert payload not in page
