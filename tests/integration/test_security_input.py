"""Security and bad input, second pass (P9, P10): who reads a job, the one
redirect check, deep JSON, CSV formula cells (header cells too), the /metrics type."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api
from tests.integration.security_fixtures import login, seed
from webapp.domain import lists
from webapp.redirects import is_local_path, local_path

# --- GET /api/v1/jobs/{id}: support and admins; marketers only campaign jobs, no payload --


@pytest.fixture()
def ids(app: Any, engine: sa.Engine) -> dict[str, Any]:
    return seed(engine, app.extensions["senddock"].config)


def _job(client: Any, make_user: Callable[..., dict[str, Any]], role: str, job_id: int
         ) -> Any:
    return Api(client, make_user(role)["token"]).get(f"/jobs/{job_id}")


@pytest.mark.parametrize("role", ["admin", "support"])
def test_support_and_admins_read_every_job_with_its_payload(
        role: str, client: Any, ids: dict[str, Any],
        make_user: Callable[..., dict[str, Any]]) -> None:
    answer = _job(client, make_user, role, ids["verification_job_id"])
    assert answer.status_code == 200
    assert answer.get_json()["payload"]["verify_url"] == "https://app.example.com/verify?t=1"
    assert _job(client, make_user, role, ids["job_id"]).status_code == 200


def test_a_marketer_reads_campaign_jobs_without_payload_and_nothing_else(
        client: Any, ids: dict[str, Any], make_user: Callable[..., dict[str, Any]]) -> None:
    campaign_job = _job(client, make_user, "marketer", ids["job_id"])
    assert campaign_job.status_code == 200
    body = campaign_job.get_json()
    assert body["id"] == ids["job_id"] and body["campaign_id"] == ids["campaign_id"]
    assert not {"payload", "user_ref", "idempotency_key", "requested_by"} & body.keys()
    for other in (ids["verification_job_id"], ids["failed_job_id"]):
        answer = _job(client, make_user, "marketer", other)
        assert answer.status_code == 404, answer.get_json()
        assert "verify" not in answer.get_data(as_text=True)
    # Same answer as for an id that does not exist: no way to tell them apart.
    missing = _job(client, make_user, "marketer", 987_654_321).get_json()
    assert missing["error"]["message"] == "job 987654321 does not exist"


def test_a_marketer_with_a_session_gets_the_same_narrow_answer(
        app: Any, ids: dict[str, Any], make_user: Callable[..., dict[str, Any]]) -> None:
    client = app.test_client()
    login(client, make_user("marketer"))
    assert client.get(f"/api/v1/jobs/{ids['verification_job_id']}").status_code == 404
    assert "payload" not in client.get(f"/api/v1/jobs/{ids['job_id']}").get_json()


# --- one redirect check -------------------------------------------------------------------

# The probe's payloads (decoded, as Flask hands them to the view) and their relatives.
OFFSITE = ["//evil.example.com/x", "/\t/evil.example.com/phish", "/\r/evil.example.com",
           "/\n/evil.example.com", "/\\evil.example.com", "\\\\evil.example.com",
           "/\\/evil.example.com", "https://evil.example.com/", "javascript:alert(1)",
           "http:/evil.example.com", "/\x00/evil.example.com", "/\x7f/evil.example.com",
           "/\u0085/evil.example.com", " //evil.example.com", "evil.example.com", ""]
LOCAL = ["/inbox/", "/inbox/?kind=verification&q=a%2Fb", "/campaigns/3?x=//y",
         "/lists/1#frag"]


@pytest.mark.parametrize("target", OFFSITE)
def test_the_redirect_check_refuses_offsite_targets(target: str) -> None:
    assert not is_local_path(target)
    assert local_path(target, "/home") == "/home"


@pytest.mark.parametrize("target", LOCAL)
def test_the_redirect_check_keeps_local_paths(target: str) -> None:
    assert local_path(target, "/home") == target


def test_every_redirecting_view_uses_the_one_check() -> None:
    # No diverging copies: the views that follow a user-supplied target call local_path.
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "webapp" / "blueprints"
    for name in ("auth.py", "inbox.py", "campaigns.py"):
        source = (root / name).read_text(encoding="utf-8")
        assert "local_path(" in source, name
        assert 'startswith("/")' not in source and "startswith('/')" not in source, name


def test_inbox_back_link_and_dismiss_stay_on_site(
        app: Any, ids: dict[str, Any], make_user: Callable[..., dict[str, Any]]) -> None:
    client = app.test_client()
    csrf = login(client, make_user("admin"))
    job = ids["failed_job_id"]
    page = client.get(f"/inbox/{job}?back=/%09/evil.example.com/phish").get_data(as_text=True)
    assert "evil.example.com" not in page
    answer = client.post(f"/inbox/{job}/dismiss", data={
        "csrf_token": csrf, "back": "//evil.example.com/x"})
    assert answer.status_code == 302 and answer.headers["Location"] == "/inbox/"


def test_login_next_and_campaign_back_stay_on_site(
        app: Any, ids: dict[str, Any], make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("admin")
    client = app.test_client()
    page = client.get("/login").get_data(as_text=True)
    from tests.integration.security_fixtures import CSRF_FIELD

    token = CSRF_FIELD.search(page).group(1)  # type: ignore[union-attr]
    answer = client.post("/login?next=/%09/evil.example.com", data={
        "csrf_token": token, "email": user["email"], "password": user["password"]})
    assert answer.status_code == 302 and answer.headers["Location"] == "/"
    csrf = login(client, user)
    answer = client.post(f"/campaigns/{ids['campaign_id']}/test", data={
        "csrf_token": csrf, "email": "t@example.org", "back": "/\\evil.example.com"})
    assert answer.status_code == 303
    assert answer.headers["Location"] == f"/campaigns/{ids['campaign_id']}"


# --- deep JSON ------------------------------------------------------------------------------

def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [40, 5_000, 100_000])
def test_deep_json_is_a_400_on_every_api_operation(app: Any, api: Api, depth: int) -> None:
    from tests.integration.test_fuzz_api import PREFIX, operations

    for op in operations():
        if op.request_schema is None:
            continue  # pause/resume/cancel read no body
        path = (op.path.replace("{id}", "1").replace("{step}", "1")
                .replace("{domain}", "example.com"))
        for body in (_deep(depth), b'{"name": ' + _deep(depth) + b"}"):
            answer = api.client.open(PREFIX + path, method=op.method.upper(), data=body,
                                     headers={**api.headers,
                                              "Content-Type": "application/json"})
            assert answer.status_code == 400, (str(op), depth, answer.get_data()[:300])
            assert "nested deeper" in answer.get_json()["error"]["message"], str(op)


def test_json_of_documented_depth_is_still_accepted(api: Api) -> None:
    list_id = api.post("/lists", {"name": "Deep enough"}).get_json()["id"]
    answer = api.post(f"/lists/{list_id}/subscribers", {"subscribers": [
        {"email": "nested@example.org", "attributes": {"plan": {"tier": ["a", {"b": 1}]}}}]})
    assert answer.status_code == 200 and answer.get_json()["added"] == 1


def test_deep_json_through_a_session_is_a_400_too(
        app: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    client = app.test_client()
    csrf = login(client, make_user("admin"))
    answer = client.post("/api/v1/lists", data=_deep(100_000),
                         headers={"Content-Type": "application/json", "X-CSRFToken": csrf})
    assert answer.status_code == 400 and answer.is_json


# --- CSV export -----------------------------------------------------------------------------

def test_export_neutralises_every_cell_including_header_cells(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        list_id = lists.create_list(conn, "Formulas", actor="tests")["id"]
        lists.add_subscribers(conn, list_id, [
            {"email": "f@example.org", "name": "+1 cmd",
             "attributes": {"=HYPERLINK(\"http://evil\")": "@SUM(1)", "-2": " =1",
                            "plain": "ok", "\tTAB": "\r\n"}}])
        text = "".join(lists.export_csv(conn, list_id))
    header, row = list(csv.reader(io.StringIO(text)))
    for cell in header + row:
        stripped = cell.lstrip(" ")
        assert not stripped.startswith(("=", "+", "-", "@", "\t", "\r", "\n")), cell
    assert "'=HYPERLINK(\"http://evil\")" in header and "'-2" in header
    assert "'\tTAB" in header and "plain" in header
    assert "'+1 cmd" in row and "'@SUM(1)" in row and "' =1" in row


def test_every_csv_export_uses_the_safe_writer() -> None:
    # A CSV export added later must go through webapp.domain.csv_export.SafeWriter.
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for path in [*root.glob("webapp/**/*.py"), *root.glob("workers/**/*.py")]:
        if path.name == "csv_export.py":
            continue
        source = path.read_text(encoding="utf-8")
        assert "csv.writer(" not in source and "DictWriter(" not in source, \
            f"{path.relative_to(root)} writes CSV without webapp.domain.csv_export"


# --- /metrics -------------------------------------------------------------------------------

def test_metrics_content_type_has_one_charset(app: Any,
                                              make_user: Callable[..., dict[str, Any]]) -> None:
    answer = app.test_client().get("/metrics", headers={
        "Authorization": f"Bearer {make_user('admin')['token']}"})
    assert answer.status_code == 200
    content_type = answer.headers["Content-Type"]
    assert content_type.count("charset") == 1, content_type
    assert content_type.startswith("text/plain; version="), content_type


# --- server-side sessions ---------------------------------------------------------------------

def _copy(client: Any, app: Any) -> Any:
    """A second browser holding a copy of ``client``'s session cookie (a stolen one)."""
    thief = app.test_client()
    thief.set_cookie("session", client.get_cookie("session").value)
    return thief


def _signed_in(client: Any) -> bool:
    return client.get("/").status_code == 200


def test_logout_ends_every_copy_of_the_session(
        app: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    user = make_user("marketer")
    client = app.test_client()
    csrf = login(client, user)
    thief = _copy(client, app)
    assert _signed_in(thief)
    other_device = app.test_client()
    login(other_device, user)
    assert client.post("/logout", data={"csrf_token": csrf}).status_code == 302
    assert not _signed_in(thief) and not _signed_in(client)
    assert _signed_in(other_device)  # logging out here is not logging out everywhere


def test_password_change_and_disabling_end_every_session(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    from webapp.domain import users

    user = make_user("support")
    first, second = app.test_client(), app.test_client()
    login(first, user)
    csrf = login(second, user)
    thief = _copy(first, app)
    answer = second.post("/account/password", data={
        "csrf_token": csrf, "current": user["password"], "password": "another long one!",
        "confirm": "another long one!"})
    assert answer.status_code == 303, answer.get_data(as_text=True)[:300]
    assert _signed_in(second)  # the session that changed it goes on
    assert not _signed_in(first) and not _signed_in(thief)
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM web_sessions WHERE user_id = :u"),
                            {"u": user["id"]}).scalar_one() == 1
        users.set_active(conn, user["id"], False, actor="tests")
        assert conn.execute(sa.text("SELECT count(*) FROM web_sessions WHERE user_id = :u"),
                            {"u": user["id"]}).scalar_one() == 0
        users.set_active(conn, user["id"], True, actor="tests")
    assert not _signed_in(second)  # enabling the user again revives nothing


def test_a_session_row_older_than_the_lifetime_is_refused(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    client = app.test_client()
    login(client, make_user("admin"))
    assert _signed_in(client)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE web_sessions SET created_at = now() - interval '32 days'"))
    assert not _signed_in(client)
