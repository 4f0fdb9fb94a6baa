"""A person's data on request: export everything about an
address (API and page, JSON) and erase it; the suppression survives as a hash and comes
back when the address does."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import Browser
from tests.integration.security_fixtures import failed_job, seed
from webapp.domain import lists, personal_data, suppressions

ADDRESS = "Person@Example.org"


def _seeded(app: Any, engine: sa.Engine) -> dict[str, Any]:
    ids = seed(engine, app.extensions["senddock"].config, email=ADDRESS.lower())
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE subscribers SET attributes = '{\"plan\": \"pro\"}', "
                             "name = 'Pat Person' WHERE id = :s"), {"s": ids["subscriber_id"]})
        job = failed_job(conn, ADDRESS, f"550 5.1.1 <{ADDRESS.lower()}> unknown user")
        suppressions.suppress(conn, ADDRESS, "bounced", actor="tests")
        conn.execute(sa.text("""
            INSERT INTO subscription_requests (list_id, email, source, remote_addr)
            VALUES (:l, :e, 'form', '192.0.2.1')"""), {"l": ids["list_id"], "e": ADDRESS})
    return {**ids, "bounced_job": job}


def test_export_then_erase_through_the_api(app: Any, engine: sa.Engine,
                                           make_user: Callable[..., dict[str, Any]]) -> None:
    ids = _seeded(app, engine)
    api = Api(app.test_client(), make_user("admin")["token"])
    exported = api.post("/personal-data/export", {"email": ADDRESS})
    assert exported.status_code == 200, exported.get_json()
    data = exported.get_json()
    assert data["subscriber"]["attributes"] == {"plan": "pro"}
    assert [m["list_id"] for m in data["memberships"]] == [ids["list_id"]]
    assert data["consent_records"][0]["remote_addr"] == "192.0.2.1"
    jobs = {j["id"]: j for j in data["jobs"]}
    assert ids["bounced_job"] in jobs and ids["job_id"] in jobs
    assert jobs[ids["bounced_job"]]["attempt_log"][0]["smtp_code"] == 550
    assert data["suppressions"][0]["reason"] == "bounced"
    assert api.post("/personal-data/export", {"email": "not an address"}).status_code == 422

    erased = api.post("/personal-data/erase", {"email": ADDRESS})
    assert erased.status_code == 200, erased.get_json()
    assert erased.get_json()["counts"]["subscribers"] == 1
    with engine.connect() as conn:
        for sql in ("SELECT count(*) FROM subscribers WHERE lower(email) = :e",
                    "SELECT count(*) FROM delivery_jobs WHERE lower(email) = :e",
                    "SELECT count(*) FROM subscription_requests WHERE lower(email) = :e",
                    "SELECT count(*) FROM suppressions WHERE email = :e",
                    "SELECT count(*) FROM job_attempts WHERE reply ILIKE '%' || :e || '%'",
                    "SELECT count(*) FROM audit_log WHERE action LIKE 'personal_data.%' "
                    "AND target ILIKE '%' || :e || '%'"):
            assert conn.execute(sa.text(sql), {"e": ADDRESS.lower()}).scalar_one() == 0, sql
        # The jobs keep their rows and counts, without the address.
        kept = conn.execute(sa.text("SELECT email, status FROM delivery_jobs WHERE id = :j"),
                            {"j": ids["bounced_job"]}).one()
        assert kept.email.endswith("@erased.invalid") and kept.status == "failed"
        assert conn.execute(sa.text("SELECT count(*) FROM memberships WHERE list_id = :l"),
                            {"l": ids["list_id"]}).scalar_one() == 0
        actions = conn.execute(sa.text("SELECT action FROM audit_log WHERE target = :t"),
                               {"t": f"address:{personal_data.address_hash(ADDRESS)}"}
                               ).scalars().all()
    assert sorted(actions) == ["personal_data.erase", "personal_data.export"]
    again = api.post("/personal-data/export", {"email": ADDRESS}).get_json()
    assert again["subscriber"] is None and again["jobs"] == []
    assert again["erased_before"][0]["reason"] == "bounced"

    # The address comes back (added to a list again): suppressed again at once.
    with engine.begin() as conn:
        lists.add_member(conn, ids["list_id"], ADDRESS, actor="tests")
        back = conn.execute(sa.text("SELECT reason, created_by FROM suppressions "
                                    "WHERE email = :e"), {"e": ADDRESS.lower()}).one()
    assert back.reason == "bounced" and back.created_by == "personal data erase"


def test_a_job_for_an_erased_address_is_suppressed_again(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    api = Api(app.test_client(), make_user("admin")["token"])
    assert api.post("/personal-data/erase", {"email": "gone@example.org"}).status_code == 200
    with engine.begin() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM suppressions")).scalar_one() == 0
        failed_job(conn, "Gone@example.org", "250 ok")
        assert conn.execute(sa.text("SELECT reason FROM suppressions WHERE email = "
                                    "'gone@example.org'")).scalar_one() == "manual"


def test_only_admins_and_admin_tokens(app: Any, engine: sa.Engine,
                                      make_user: Callable[..., dict[str, Any]]) -> None:
    for role in ("marketer", "support"):
        api = Api(app.test_client(), make_user(role)["token"])
        assert api.post("/personal-data/export", {"email": ADDRESS}).status_code == 403


def test_the_page_exports_and_erases_in_both_languages(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    _seeded(app, engine)
    browser = Browser(app.test_client(), make_user("admin"))
    page = browser.get("/admin/personal-data").get_data(as_text=True)
    assert "GDPR article 15" in page
    download = browser.post("/admin/personal-data/export", {"email": ADDRESS})
    assert download.status_code == 200
    assert "attachment" in download.headers["Content-Disposition"]
    assert json.loads(download.get_data())["subscriber"]["name"] == "Pat Person"
    refused = browser.post("/admin/personal-data/erase", {"email": ADDRESS,
                                                          "confirm": "other@example.org"})
    assert refused.status_code == 422 and "nothing was erased" in refused.get_data(
        as_text=True)
    browser.post("/account/language", {"locale": "es"})
    done = browser.post("/admin/personal-data/erase", {"email": ADDRESS,
                                                       "confirm": ADDRESS.lower()})
    assert "Borrado" in done.get_data(as_text=True)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM subscribers WHERE lower(email) = "
                                    ":e"), {"e": ADDRESS.lower()}).scalar_one() == 0
