"""Refused From addresses, probed on their backoff until the relay accepts them again
(docs/design.md §17): the campaigns a refusal paused then resume by themselves."""

from __future__ import annotations

import logging

from sqlalchemy.engine import Engine

from workers import queue
from workers.delivery import lifecycle, outcomes
from workers.delivery.classify import ReplyClass
from workers.delivery.relay_board import RelayBoard
from workers.delivery.smtp import SmtpTransport, route

SENDER_PROBE_MAX = 30.0  # seconds: the longest wait between probes of a refused From
PER_TICK = 5  # probes per tick at most; the rest wait for the next one

log = logging.getLogger("senddock.worker")


def probe_senders(engine: Engine, board: RelayBoard) -> None:
    """Probe refused From addresses whose turn has come, with the same MAIL FROM (and
    RCPT, where the relay reported the refusal): accepted, the campaigns it paused
    resume."""
    transport: SmtpTransport | None = None
    try:
        for _ in range(PER_TICK):
            with engine.begin() as conn:
                due = queue.take_sender_probe(conn, min(board.config.relay_probe_max,
                                                        SENDER_PROBE_MAX))
            if due is None:
                return
            sender, recipient = due
            transport = transport or board.transport(route(board.relays, "campaign")[0])
            result = transport.probe(sender, recipient)
            with engine.begin() as conn:
                if result.reply_class is ReplyClass.SENT:
                    resumed = [c for c in queue.sender_accepted(conn, sender)
                               if lifecycle.resume_campaign(conn, c, "system")]
                    log.info("the relay accepts %s again; campaign(s) %s resume", sender,
                             ", ".join(map(str, resumed)) or "none")
                else:
                    queue.sender_still_refused(conn, sender, outcomes.reply_line(result))
    finally:
        if transport is not None:
            transport.close()
