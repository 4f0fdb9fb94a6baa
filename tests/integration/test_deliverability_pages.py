"""Receiver reports through the pages and the API: upload, the domain's deliverability
page, the DMARC alarm on Queue health and /metrics, in both languages, admins only."""

from __future__ import annotations

import html
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.conftest import Api
from tests.helpers import Browser
from webapp import create_app
from workers.core.settings import Config

HERE = Path(__file__).resolve().parents[1] / "unit" / "receiver_reports"


def recent_report(days_ago: int = 2, report_id: str = "recent-1") -> bytes:
    """tests/unit/receiver_reports/aggregate.xml, dated ``days_ago`` days back."""
    begin = int(time.time()) - days_ago * 86400
    xml = (HERE / "aggregate.xml").read_text()
    xml = xml.replace("<begin>1764460800</begin>", f"<begin>{begin}</begin>")
    xml = xml.replace("<end>1764547199</end>", f"<end>{begin + 86399}</end>")
    return xml.replace("1700000000000000001", report_id).encode()


@pytest.fixture()
def app(engine: sa.Engine, config_for: Callable[..., Config], sink: Any) -> Any:
    application = create_app(config_for(sink.port, SENDING_IPS="192.0.2.0/28"),
                             engine=engine)
    application.config["TESTING"] = True
    return application


def text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    return html.unescape(response.get_data(as_text=True))


def test_upload_then_the_domain_page_and_the_alarm(
        app: Any, engine: sa.Engine, make_user: Callable[..., dict[str, Any]]) -> None:
    admin = Browser(app.test_client(), make_user("admin"))
    page = text(admin.client.post("/admin/domains/reports", data={
        "csrf_token": admin.token,
        "files": [(io.BytesIO(recent_report()), "google.xml"),
                  (io.BytesIO(b"not a report"), "junk.txt"),
                  (io.BytesIO((HERE / "tls.json").read_bytes()), "tls.json")]},
        content_type="multipart/form-data", follow_redirects=True))
    assert "2 report(s) stored, 0 already stored before." in page
    assert "junk.txt was not read: not a recognized report format" in page
    assert "senddock.test" in page and "Google Inc." in page
    # The same file again: kept once.
    again = text(admin.client.post("/admin/domains/reports", data={
        "csrf_token": admin.token, "files": [(io.BytesIO(recent_report()), "google.xml")]},
        content_type="multipart/form-data", follow_redirects=True))
    assert "0 report(s) stored, 1 already stored before." in again

    view = text(admin.get("/admin/domains/senddock.test/deliverability"))
    assert "47" in view  # messages reported: 40 + 2 + 5
    # DMARC pass, SPF and DKIM aligned: 40 of 47; our relays: 40 of 42.
    assert "85.1 %" in view and "95.2 %" in view and "below 98 %" in view
    assert "203.0.113.9" in view and "rejected: 5" in view
    assert "certificate-expired" in view and "120 succeeded, 4 failed" in view
    assert "p=reject sp=reject pct=100" in view

    spanish = text(admin.get("/admin/domains/senddock.test/deliverability",
                             headers={"Accept-Language": "es"}))
    assert "Fuentes que no son sus relays" in spanish

    # The alarm: 2 of 42 messages from our relays (192.0.2.10-11) fail → 95.2 % < 98 %.
    health = text(admin.get("/health/"))
    assert "failing DMARC" in health and "95.2%" in health
    metrics = admin.get("/metrics").get_data(as_text=True)
    assert 'senddock_dmarc_relay_failures{domain="senddock.test"} 2.0' in metrics
    assert 'senddock_alarm{name="dmarc_alignment"} 1.0' in metrics


def test_other_roles_are_refused(app: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    for role in ("marketer", "support"):
        user = Browser(app.test_client(), make_user(role))
        assert user.get("/admin/domains/reports").status_code == 403
        assert user.get("/admin/domains/senddock.test/deliverability").status_code == 403
        api = Api(app.test_client(), make_user(role)["token"])
        assert api.post("/reports", data=recent_report()).status_code == 403


def test_api_stores_once_and_refuses_with_the_reason(app: Any, engine: sa.Engine,
                                                     make_user: Callable[..., dict]) -> None:
    api = Api(app.test_client(), make_user("admin")["token"])
    first = api.client.post("/api/v1/reports?filename=r.xml", data=recent_report(),
                            headers={**api.headers, "Content-Type": "application/xml"})
    assert first.status_code == 201, first.get_json()
    assert first.get_json()["reports"][0]["duplicate"] is False
    second = api.client.post("/api/v1/reports", data=recent_report(),
                             headers={**api.headers, "Content-Type": "application/xml"})
    assert second.status_code == 200 and second.get_json()["reports"][0]["duplicate"]
    bad = api.client.post("/api/v1/reports?filename=x.gz", data=b"\x1f\x8bbroken",
                          headers={**api.headers, "Content-Type": "application/gzip"})
    assert bad.status_code == 200 and bad.get_json()["reports"] == []
    assert "damaged gzip" in bad.get_json()["error"]
    empty = api.client.post("/api/v1/reports", data=b"", headers=api.headers)
    assert empty.status_code == 400
    assert "must be the report file" in empty.get_json()["error"]["message"]
    listed = api.get("/reports").get_json()
    assert [r["filename"] for r in listed["rejects"]] == ["x.gz"]
    assert len(listed["reports"]) == 1
    doc = api.get("/openapi.json").get_json()
    assert "/reports" in doc["paths"]



def test_providers_page_groups_by_domain_and_mx(
        app: Any, engine: sa.Engine, dns_server: Any,
        make_user: Callable[..., dict[str, Any]]) -> None:
    from tests.helpers import accepted_campaign
    from webapp.domain import providers

    providers.forget()
    dns_server.zone.add("corp.example", "MX", "aspmx.l.google.com")
    dns_server.zone.add("shop.example", "MX", "mx1.shop.example")
    emails = [f"u{i}@gmail.com" for i in range(6)] + ["a@corp.example", "b@yahoo.com",
              "c@yahoo.com", "d@outlook.com", "e@shop.example", "f@icloud.com"]
    _campaign, jobs = accepted_campaign(engine, emails)
    outcome = {"u0@gmail.com": "transient", "c@yahoo.com": "hard_bounce",
               "d@outlook.com": "rejected"}
    with engine.begin() as conn:
        for email, job in jobs.items():
            conn.execute(sa.text(
                "INSERT INTO job_attempts (job_id, attempt, outcome, kind) "
                "VALUES (:j, 1, :o, 'broadcast')"),
                {"j": job["id"], "o": outcome.get(email, "sent")})
        conn.execute(sa.text(
            "INSERT INTO job_events (job_id, source, type, email, effect) "
            "VALUES (:j, 'mailbox', 'complaint', 'u1@gmail.com', 'suppressed')"),
            {"j": jobs["u1@gmail.com"]["id"]})
    admin = Browser(app.test_client(), make_user("admin"))
    page = text(admin.get("/admin/domains/providers"))
    row = page.split('id="provider-gmail"', 1)[1].split("</tr>", 1)[0]
    # Gmail: 5 gmail.com accepted + corp.example (Google MX) = 6; 1 deferred; 1 complaint.
    assert "<td>6</td><td>1</td><td>0</td><td>1</td><td>16.67 %" in row
    assert "above 0.1 %" in row
    yahoo = page.split('id="provider-yahoo"', 1)[1].split("</tr>", 1)[0]
    assert "<td>1</td><td>0</td><td>1</td><td>0</td><td>0.00 %" in yahoo
    assert "below 0.3 %" in yahoo
    for group, expected in (("microsoft", "<td>0</td><td>0</td><td>1</td>"),
                            ("apple", "<td>1</td><td>0</td><td>0</td>"),
                            ("other", "<td>1</td><td>0</td><td>0</td>")):
        assert expected in page.split(f'id="provider-{group}"', 1)[1].split("</tr>", 1)[0]
    spanish = text(admin.get("/admin/domains/providers", headers={"Accept-Language": "es"}))
    assert "Proveedores receptores" in spanish


def test_refusal_reasons_are_said_in_the_pages_language(
        app: Any, make_user: Callable[..., dict[str, Any]]) -> None:
    admin = Browser(app.test_client(), make_user("admin"))
    spanish = {"Accept-Language": "es"}
    page = text(admin.client.post("/admin/domains/reports", data={
        "csrf_token": admin.token,
        "files": [(io.BytesIO(b"not a report"), "junk.txt"),
                  (io.BytesIO(b"<feedback><oops"), "bad.xml")]},
        content_type="multipart/form-data", follow_redirects=True, headers=spanish))
    assert "junk.txt was not read" not in page
    assert "no es un formato de informe reconocido" in page
    assert "XML no válido (el informe DMARC no tiene <report_metadata>)" in page
    # Listed later, in either language, from what was stored.
    listed = text(admin.get("/admin/domains/reports", headers=spanish))
    assert "no es un formato de informe reconocido" in listed
    english = text(admin.get("/admin/domains/reports"))
    assert "not a recognized report format" in english
    assert "no es un formato" not in english
