"""One process's view of its relays (docs/design.md §17): which of SENDDOCK_SMTP_URL's relays a
message goes through, which are down, the probes that bring a relay back, and each drain
thread's connections to them."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from workers import queue
from workers.core.jobs import ClaimedJob
from workers.core.settings import Config
from workers.delivery import outcomes, send_guard
from workers.delivery.classify import ReplyClass
from workers.delivery.smtp import LoginGate, RelaySpec, SmtpTransport, parse_relays, route

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from workers.delivery.pool import StatementDb

RELAY_CHECK = 1.0  # seconds between looks at which relays the other processes saw down

log = logging.getLogger("senddock.worker")


class RelayBoard:
    """The relays of SENDDOCK_SMTP_URL: a stream goes through the first of its route that
    is not down; each relay has its own state row, login gate (one failed AUTH per process
    and relay) and fingerprint (a keyed hash of its URL, never the password itself)."""

    def __init__(self, engine: Engine, config: Config, probe_sender: str,
                 on_back: Callable[[], None]) -> None:
        self.engine = engine
        self.config = config
        self.relays = parse_relays(config.smtp_url)
        self.fingerprints = {r.index: hmac.new(config.secret_key.encode(), r.url.encode(),
                                               hashlib.sha256).hexdigest()[:16]
                             for r in self.relays}
        self.login_gates = {r.index: LoginGate() for r in self.relays}
        self.down: set[int] = set()  # as this process last saw them
        self._checked = 0.0
        self._probed_at = 0.0
        self.probe_sender = probe_sender
        self.on_back = on_back  # a relay is back up (the refusal streak starts over)

    def name(self, index: int) -> str | None:
        """The relay's name in log lines; None when there is only one."""
        return self.relays[index - 1].name if len(self.relays) > 1 else None

    def transport(self, relay: RelaySpec) -> SmtpTransport:
        config = self.config
        return SmtpTransport(relay.smtp, timeout=config.smtp_timeout,
                             local_hostname=config.smtp_helo, ca_file=config.smtp_ca_file,
                             max_messages=config.smtp_max_messages, max_age=config.smtp_max_age,
                             login_gate=self.login_gates[relay.index])

    def for_job(self, job: ClaimedJob) -> RelaySpec:
        """The relay for ``job``: the first of its stream's route (campaign mail and test
        sends: the campaign stream; everything else: transactional) that this process
        does not know to be down; the first of the route when all are."""
        stream = "campaign" if job.kind in ("broadcast", "test") else "transactional"
        candidates = route(self.relays, stream)
        return next((r for r in candidates if r.index not in self.down), candidates[0])

    def watch(self, db: StatementDb, timeout: float, transports: Transports) -> None:
        """Every RELAY_CHECK seconds, learn which relays are down (another process may have
        seen it, or probed one back up). A relay this process sees go down is marked at
        once (:func:`workers.delivery.reply_policy.record`): its threads fail over without
        waiting. While one is down and another carries its traffic, probe it meanwhile."""
        if len(self.relays) == 1:
            return
        if time.monotonic() - self._checked >= RELAY_CHECK:
            with db.connect(timeout) as conn:
                states = queue.relay_states(conn, len(self.relays))
            self.down = {s["id"] for s in states if s["status"] == "down" or s["paused"]}
            self._checked = time.monotonic()
        if self.down and time.monotonic() - self._probed_at > RELAY_CHECK:
            self._probed_at = time.monotonic()
            self.probe_due(transports)

    def probe_due(self, transports: Transports) -> None:
        """Probe each relay that is down whose turn has come (one process at a time, on
        its backoff). Back up, it takes its traffic back."""
        for relay in self.relays:
            self._probe(relay, transports.get(relay))

    def _probe(self, relay: RelaySpec, transport: SmtpTransport) -> None:
        interval = self.config.login_probe_interval
        with self.engine.begin() as conn:
            state = queue.relay_status(conn, relay.index)
            if state["status"] != "down" or not queue.take_probe_turn(
                    conn, interval, self.config.relay_probe_max, relay.index):
                return
        result = transport.probe(self.probe_sender, state.get("probe_recipient"))
        name = f"relay {relay.name}" if len(self.relays) > 1 else "relay"
        with self.engine.begin() as conn:
            if result.reply_class is ReplyClass.SENT:
                queue.mark_relay_ok(conn, relay.index)
                queue.notify_new_jobs(conn, "relay")
                self.down.discard(relay.index)
                self.on_back()
                log.info("%s is back; delivery resumes", name)
            else:
                queue.mark_relay_down(conn, outcomes.reply_line(result),
                                      login=result.login_refused,
                                      fingerprint=self.fingerprints[relay.index],
                                      login_interval=interval,
                                      probe_max=self.config.relay_probe_max, probe=True,
                                      relay=relay.index)
                log.warning("%s still unavailable: %s", name, outcomes.reply_line(result))


class Transports:
    """A drain thread's connections: one per relay, opened when first used
    (docs/design.md §17)."""

    def __init__(self, board: RelayBoard, guard: send_guard.SendGuard) -> None:
        self.board = board
        self.open: dict[int, SmtpTransport] = {}
        # The check at 354 that a campaign message may go out (pause, cancel): the
        # process's one guard session, shared by the drain threads.
        self.guard = guard

    def get(self, relay: RelaySpec) -> SmtpTransport:
        if relay.index not in self.open:
            self.open[relay.index] = self.board.transport(relay)
        return self.open[relay.index]

    def close(self) -> None:
        for transport in self.open.values():
            transport.close()
