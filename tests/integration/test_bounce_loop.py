"""The whole loop against real servers (docs/design.md §18): SendDock sends a campaign through a
private Postfix, which accepts everything (250) and then bounces the mail for an unknown
local user back to the VERP bounce address; Postfix delivers that DSN into a private
Dovecot mailbox; SendDock's workers poll the mailbox and turn the job ``sent → bounced``,
suppress the address and keep the campaign counts exact.

Asserted through each component's own record: Postfix's log (the bounce), Dovecot's
mailbox (the DSN, moved to Processed), PostgreSQL (the job, the suppression, P8)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from harness.dovecot import Mailbox
from harness.postfix import Postfix
from tests.conftest import settings, wait_for
from tests.helpers import make_campaign
from workers import queue
from workers.after_acceptance.pool import worker_pool
from workers.building.links import job_from_bounce_address
from workers.core.settings import load

SECRET = "test-secret-key-not-for-production"
BOUNCES = "bounces@senddock.test"


def route_bounces_into(relay: Postfix, dovecot: Mailbox) -> None:
    """dead.example.org is local (no such users: local(8) bounces); senddock.test is a virtual
    mailbox domain whose bounces@ (and every bounces+token@) lands in Dovecot's maildir."""
    server = dovecot.server
    relay.write_map("bounce_mailboxes", {BOUNCES: f"{dovecot.user}/Maildir/"}, reload=False)
    relay.configure(
        mydestination="dead.example.org", local_recipient_maps="", alias_maps="",
        recipient_delimiter="+", virtual_mailbox_domains="senddock.test",
        virtual_mailbox_base=str(server.root / "mail"),
        virtual_mailbox_maps=relay.map_ref("bounce_mailboxes"),
        virtual_uid_maps=f"static:{server.uid}", virtual_gid_maps=f"static:{server.gid}",
        virtual_minimum_uid="1")


@pytest.mark.slow
def test_postfix_bounce_reaches_dovecot_and_the_job(engine: sa.Engine, db_url: str,
                                                     relay: Postfix,
                                                     dovecot: Mailbox) -> None:
    route_bounces_into(relay, dovecot)
    config = load(settings(
        db_url, SMTP_URL=relay.smtp_url(), FROM="News <news@senddock.test>",
        BOUNCE_ADDRESS=BOUNCES, BOUNCE_MAILBOX=dovecot.url("imaps"),
        BOUNCE_MAILBOX_CA_FILE=str(dovecot.server.tls.ca_file),
        BOUNCE_MAILBOX_INTERVAL="1", WORKERS="2"))
    campaign = make_campaign(engine, ["ghost@dead.example.org", "reader@example.net"])
    pool = worker_pool(engine, config, node="bounce-loop")
    pool.start()
    try:
        def statuses() -> dict[str, str]:
            with engine.connect() as conn:
                return dict(conn.execute(sa.text(
                    "SELECT email, status FROM delivery_jobs WHERE campaign_id = :c"),
                    {"c": campaign["id"]}).all())

        # The relay accepted both (250): SendDock could only say "sent".
        relay.wait_for_log(r"status=bounced .*unknown user", timeout=60)
        wait_for(lambda: statuses().get("ghost@dead.example.org") == "bounced", timeout=60,
                 interval=0.2, message="the DSN to bounce the job")
    finally:
        pool.stop(timeout=20)
    assert statuses() == {"ghost@dead.example.org": "bounced", "reader@example.net": "sent"}
    with engine.connect() as conn:
        job = conn.execute(sa.text("SELECT id FROM delivery_jobs WHERE email = :e"),
                           {"e": "ghost@dead.example.org"}).scalar_one()
        sup = conn.execute(sa.text("SELECT reason, reply, job_id FROM suppressions")).one()
        event = conn.execute(sa.text("SELECT source, bounce, status, raw FROM job_events")).one()
        counts = queue.broadcast_counts(conn, campaign["broadcast_id"])
        assert counts == queue.broadcast_counts_slow(conn, campaign["broadcast_id"])  # P8
    assert (sup.reason, sup.job_id) == ("bounced", job) and "unknown user" in sup.reply
    assert (event.source, event.bounce, event.status) == ("mailbox", "hard", "5.1.1")
    assert "MAILER-DAEMON" in event.raw
    assert (counts["sent"], counts["bounced"]) == (1, 1)
    # The envelope sender Postfix bounced to was the job's own VERP address.
    [delivered] = [m for m in relay.messages() if m.recipient == "reader@example.net"]
    assert job_from_bounce_address(SECRET, delivered.sender, BOUNCES) is not None
    # Dovecot's record: the DSN was delivered to the bounce mailbox and moved after use.
    assert dovecot.count("INBOX") == 0
    assert dovecot.count("Processed") == 1
