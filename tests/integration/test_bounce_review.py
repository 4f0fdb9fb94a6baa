"""Bounce review (docs/design.md §36): an admin corrects how a bounce was read, the correction
becomes a rule (reply pattern → reason) that decides later bounces from every source, and
the rule is listed, exported and deleted; the corrected event's own consequences follow
(suppression lifted or added, complaint counts), each change audited."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from tests.helpers import Browser, accepted_campaign
from webapp.domain import bounce_review
from workers.after_acceptance import feedback
from workers.after_acceptance.bounces.read import Failure
from workers.after_acceptance.mailbox import BouncePoller
from workers.after_acceptance.reports import Feedback, MailReport

T = feedback.Thresholds(complaint_min_sent=1)
OVER_QUOTA = ("550 5.2.2 <{email}>: Recipient address rejected: this mailbox is over its "
              "storage allowance (queue id 4Fz9Qm2kT1z8Xv)")


def _sent(engine: sa.Engine, emails: list[str]) -> tuple[dict[str, Any], dict[str, int]]:
    campaign, jobs = accepted_campaign(engine, emails)
    return campaign, {email: job["id"] for email, job in jobs.items()}


def _bounce(engine: sa.Engine, email: str, job_id: int, *, bounce: str = "hard",
            code: str | None = "userunknown", source: str = "mailbox",
            text: str = OVER_QUOTA) -> feedback.Applied:
    with engine.begin() as conn:
        return feedback.apply_event(conn, source, Feedback(
            "bounce", email, bounce, text.format(email=email), "5.2.2", code=code),
            job_id, "raw", T)


def _event(engine: sa.Engine, event_id: int | None) -> dict[str, Any]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT * FROM job_events WHERE id = :i"),
                                 {"i": event_id}).mappings().one())


def _suppressed(engine: sa.Engine, email: str) -> bool:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT 1 FROM suppressions WHERE email = :e"),
                            {"e": email}).first() is not None


def _audit(engine: sa.Engine, prefix: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text(
            "SELECT action, target, details FROM audit_log WHERE action LIKE :p ORDER BY id"),
            {"p": prefix + "%"}).mappings()]


def test_a_correction_becomes_a_rule_that_reads_later_bounces(
        client: Any, engine: sa.Engine, make_user: Callable[..., Any]) -> None:
    _campaign, ids = _sent(engine, ["ann@example.com", "bob@example.net"])
    first = _bounce(engine, "ann@example.com", ids["ann@example.com"])
    assert first.effect == "bounced" and _suppressed(engine, "ann@example.com")

    browser = Browser(client, make_user("admin"))
    page = browser.get("/admin/bounces").get_data(as_text=True)
    assert f'id="event-{first.event_id}"' in page
    assert "this mailbox is over its storage allowance" in html.unescape(page)
    suggested = re.search(r'name="pattern" required minlength="3" maxlength="500" '
                          r'value="([^"]*)"', page)
    assert suggested is not None
    pattern = html.unescape(suggested[1])
    # The suggestion names neither the address nor the queue id: it matches anyone's bounce.
    assert "ann@" not in pattern and "4Fz9" not in pattern
    assert "over its storage allowance" in pattern

    done = browser.post(f"/admin/bounces/{first.event_id}/correct",
                        {"reason": "mailboxfull", "pattern": pattern, "note": "their quota"})
    assert done.status_code == 200
    assert "Its suppression was lifted" in done.get_data(as_text=True)
    event = _event(engine, first.event_id)
    assert (event["reason_code"], event["bounce"], event["read_as"]) == (
        "mailboxfull", "soft", "userunknown")
    assert event["corrected_at"] is not None and event["rule_id"] is not None
    assert not _suppressed(engine, "ann@example.com")
    [correction] = _audit(engine, "bounce.correct")
    assert correction["details"]["was"] == "userunknown"
    assert correction["details"]["suppression"] == "lifted"
    assert [a["action"] for a in _audit(engine, "bounce_rule.")] == ["bounce_rule.add"]

    # A later bounce with the same wording, about someone else, from a provider's webhook
    # this time: the rule decides.
    later = _bounce(engine, "bob@example.net", ids["bob@example.net"], source="generic",
                    code=None)
    assert later.effect == "soft" and not _suppressed(engine, "bob@example.net")
    event = _event(engine, later.event_id)
    assert (event["reason_code"], event["bounce"], event["rule_id"]) == (
        "mailboxfull", "soft", _event(engine, first.event_id)["rule_id"])
    assert event["read_as"] and event["corrected_at"] is None

    page = browser.get("/admin/bounces?show=ruled").get_data(as_text=True)
    assert f'id="event-{later.event_id}"' in page
    assert f'id="event-{first.event_id}"' not in page  # corrected, not ruled
    rules = browser.get("/admin/bounces").get_data(as_text=True)
    assert 'id="bounce-rules-table"' in rules and "1 time" in rules


def test_rules_are_exported_and_deleted_and_the_reader_decides_again(
        client: Any, engine: sa.Engine, make_user: Callable[..., Any]) -> None:
    _campaign, ids = _sent(engine, ["c@example.com", "d@example.com"])
    browser = Browser(client, make_user("admin"))
    added = browser.post("/admin/bounce-rules/add", {
        "pattern": "  Over Its   STORAGE allowance ", "reason": "mailboxfull"})
    assert "Rule kept" in added.get_data(as_text=True)
    exported = browser.get("/admin/bounce-rules/export.json")
    assert exported.status_code == 200
    assert "attachment" in exported.headers["Content-Disposition"]
    [rule] = exported.get_json()["rules"]
    assert (rule["pattern"], rule["reason"]) == ("Over Its STORAGE allowance", "mailboxfull")

    assert _bounce(engine, "c@example.com", ids["c@example.com"]).effect == "soft"
    with engine.connect() as conn:
        [listed] = bounce_review.rules(conn)
    assert listed["hits"] == 1 and listed["last_hit_at"] is not None
    browser.post(f"/admin/bounce-rules/{listed['id']}/delete")
    assert [a["action"] for a in _audit(engine, "bounce_rule.")] == [
        "bounce_rule.add", "bounce_rule.delete"]
    assert _bounce(engine, "d@example.com", ids["d@example.com"]).effect == "bounced"
    # The event the rule decided keeps its reading, and no longer names the rule.
    with engine.connect() as conn:
        ruled = conn.execute(sa.text(
            "SELECT reason_code, rule_id FROM job_events WHERE email = 'c@example.com'")).one()
    assert tuple(ruled) == ("mailboxfull", None)


def test_bad_corrections_are_refused_and_change_nothing(
        client: Any, engine: sa.Engine, make_user: Callable[..., Any]) -> None:
    _campaign, ids = _sent(engine, ["e@example.com"])
    applied = _bounce(engine, "e@example.com", ids["e@example.com"])
    browser = Browser(client, make_user("admin"))
    url = f"/admin/bounces/{applied.event_id}/correct"
    for form, message in (
            ({"reason": "mailboxfull", "pattern": "not in this reply at all"},
             "must be part of this bounce"),
            ({"reason": "mailboxfull", "pattern": "ab"}, "at least 3 characters"),
            ({"reason": "nonsense", "pattern": "storage allowance"}, "reason must be one of"),
            ({"reason": "mailboxfull", "pattern": "storage allowance", "note": "n" * 501},
             "500")):
        answer = browser.post(url, form)
        assert answer.status_code == 200
        assert message in html.unescape(answer.get_data(as_text=True)), form
    assert browser.post("/admin/bounces/999999/correct", {
        "reason": "mailboxfull", "pattern": "abc"}).status_code == 200
    event = _event(engine, applied.event_id)
    assert (event["reason_code"], event["corrected_at"]) == ("userunknown", None)
    assert _suppressed(engine, "e@example.com")
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM bounce_rules")).scalar() == 0
    assert browser.get("/admin/bounces?q=" + "x" * 400).status_code == 200  # told, not 500
    assert browser.get("/admin/bounces?show=bogus").status_code == 200


def test_a_soft_reading_corrected_to_hard_suppresses_and_bounces_the_job(
        client: Any, engine: sa.Engine, make_user: Callable[..., Any]) -> None:
    _campaign, ids = _sent(engine, ["f@example.com"])
    applied = _bounce(engine, "f@example.com", ids["f@example.com"], bounce="soft",
                      code="undefined", text="550 account disabled permanently <{email}>")
    assert applied.effect == "soft" and not _suppressed(engine, "f@example.com")
    browser = Browser(client, make_user("admin"))
    done = browser.post(f"/admin/bounces/{applied.event_id}/correct", {
        "reason": "userunknown", "pattern": "account disabled permanently"})
    assert "The address is suppressed now" in done.get_data(as_text=True)
    assert _suppressed(engine, "f@example.com")
    with engine.connect() as conn:
        status = conn.execute(sa.text("SELECT status FROM delivery_jobs WHERE id = :i"),
                              {"i": ids["f@example.com"]}).scalar()
    assert status == "bounced"


def test_a_complaint_corrected_away_leaves_the_campaigns_complaint_count(
        client: Any, engine: sa.Engine, make_user: Callable[..., Any]) -> None:
    campaign, ids = _sent(engine, ["g@example.com", "h@example.com"])
    with engine.begin() as conn:
        applied = feedback.apply_event(conn, "mailbox", Feedback(
            "complaint", "g@example.com", None, "Thank you, I am away until Monday"),
            ids["g@example.com"], "raw", feedback.Thresholds())
        broadcast = conn.execute(sa.text("SELECT broadcast_id FROM delivery_jobs "
                                         "WHERE id = :i"), {"i": ids["g@example.com"]}).scalar()

    def complaints() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT complaints FROM broadcasts WHERE id = :b"),
                                    {"b": broadcast}).scalar())

    assert complaints() == 1 and _suppressed(engine, "g@example.com")
    browser = Browser(client, make_user("admin"))
    browser.post(f"/admin/bounces/{applied.event_id}/correct", {
        "reason": "vacation", "pattern": "I am away until"})
    assert complaints() == 0 and not _suppressed(engine, "g@example.com")
    event = _event(engine, applied.event_id)
    assert (event["type"], event["bounce"], event["reason_code"]) == ("bounce", None,
                                                                      "vacation")
    # The same words later: kept on the job, nothing done.
    with engine.begin() as conn:
        later = feedback.apply_event(conn, "mailbox", Feedback(
            "complaint", "h@example.com", None, "thank you, I am away until Friday"),
            ids["h@example.com"], "raw", feedback.Thresholds())
    assert later.effect == "ignored" and not _suppressed(engine, "h@example.com")
    assert complaints() == 0
    assert campaign["id"]


def test_a_rule_turns_what_the_reader_set_aside_into_a_complaint(engine: sa.Engine) -> None:
    """A provider's complaint worded like an auto-reply: the reader sets it aside, a rule
    makes it the complaint it is (the bounce mailbox's path)."""
    report = MailReport("autoreply", ignored=[Failure(
        "k@example.com", "vacation", "ignore",
        diagnostic="Abuse report: the recipient marked this message as junk")])
    with engine.begin() as conn:
        assert BouncePoller._ruled(conn, report) == []
        bounce_review.add_rule(conn, "marked this message as junk", "feedback", "", "admin")
        [event] = BouncePoller._ruled(conn, report)
    assert (event.type, event.email, event.code) == ("complaint", "k@example.com", "feedback")


def test_only_admins_review_bounces(client: Any, make_user: Callable[..., Any]) -> None:
    for role in ("marketer", "support"):
        browser = Browser(client, make_user(role))
        assert browser.get("/admin/bounces").status_code == 403
        assert browser.post("/admin/bounce-rules/add", {
            "pattern": "abc", "reason": "mailboxfull"}).status_code == 403
        client.get("/logout")


def test_rules_through_the_api(api: Any, engine: sa.Engine) -> None:
    made = api.post("/bounce-rules", {"pattern": "quota  exceeded", "reason": "mailboxfull",
                                      "note": "a provider's words"})
    assert made.status_code == 201, made.get_json()
    rule = made.get_json()
    assert (rule["pattern"], rule["reason"], rule["hits"]) == ("quota exceeded",
                                                               "mailboxfull", 0)
    # The same pattern in other capitals replaces it.
    again = api.post("/bounce-rules", {"pattern": "QUOTA exceeded", "reason": "systemfull"})
    assert again.status_code == 201 and again.get_json()["id"] == rule["id"]
    [listed] = api.get("/bounce-rules").get_json()["rules"]
    assert (listed["pattern"], listed["reason"]) == ("QUOTA exceeded", "systemfull")
    for bad, field in (({"pattern": "a b", "reason": "mailboxfull"}, "pattern"),
                       ({"pattern": "abc", "reason": "nonsense"}, "reason"),
                       ({"pattern": 5, "reason": "mailboxfull"}, "pattern"),
                       ({"pattern": "abc", "reason": "mailboxfull", "x": 1}, "x")):
        answer = api.post("/bounce-rules", bad)
        assert answer.status_code == 422 and field in answer.get_json()["error"]["fields"], bad
    assert api.delete(f"/bounce-rules/{rule['id']}").status_code == 204
    assert api.delete(f"/bounce-rules/{rule['id']}").status_code == 404
    assert api.get("/bounce-rules").get_json()["rules"] == []
    assert [a["action"] for a in _audit(engine, "bounce_rule.")] == [
        "bounce_rule.add", "bounce_rule.change", "bounce_rule.delete"]
