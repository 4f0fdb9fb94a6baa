"""Classify an SMTP reply into what the delivery engine must do with the job.

``stage`` says which step of the SMTP conversation produced the reply: ``connect``,
``greeting``, ``ehlo``, ``starttls``, ``auth``, ``mail``, ``noop`` (relay probe), ``rcpt``,
``data`` (the DATA command), ``data_end`` (the reply after the final dot) and ``send``
(while the message itself was being transmitted). ``code is None`` means no reply at all:
a refused or timed-out connection, a TLS failure or a disconnect.

Where a refusal is reported says nothing about whom it concerns (docs/design.md §16): Postfix
reports client, HELO and sender restrictions at RCPT (``smtpd_delay_reject = yes``), so
the table first asks *who* a refusal is about -- our relay, our login, our sender, the
recipient's domain -- and only then what the stage says. The enhanced status code
(RFC 3463) decides when present; the text when it is not, or when the text names the
restriction (Postfix's "Sender address rejected", "Relay access denied"...).

The table (:data:`RULES`), first match wins:

====  ==============================================================  ================
row   reply                                                           class
====  ==============================================================  ================
1     no reply at starttls (TLS handshake failed)                       relay
2     no reply at connect/greeting/ehlo/auth/mail/noop                  relay
3     no reply at rcpt/data/send/data_end (lost mid-message)            transient
4     4xx 4.7.28, 4.7.650, 4.7.651 (Gmail, Outlook rate limits)         domain_throttle
5     x.7.23-x.7.30, x.7.515 (SPF/DKIM/DMARC alignment of our domain)   relay
6     4xx/421 "too many ... from <us>", "too much mail from",           relay_throttle
      "throttling", "sending rate", "quota exceeded"
7     421 at any stage (the relay closing the channel)                  relay_throttle
8     4.2.1 "rate" / "too quickly" (Gmail), 4xx x.7.x "too many" /      domain_throttle
      "rate" / "try again later" (the recipient's domain slows us)
9     530/534/535/538, x.7.8, x.7.9, x.7.57 (login required/refused)    relay (login)
10    "Must issue a STARTTLS", x.7.10, x.7.11 (encryption required)    relay
11    "Client host rejected", "Helo command rejected", "Relay access    relay
      denied", x.7.64 (tenant relay), "not authenticated"
12    "Sender address rejected", "not owned by user", "send as this      sender
      sender", x.7.60, x.1.7/x.1.8 (our From, at any stage)
13    any other failure at connect/greeting/ehlo/starttls/auth/noop     relay
14    any other 5xx at mail (MAIL FROM refused) / 4xx at mail           sender / relay
15    2xx at data_end (or noop)                                         sent
16    any other 1xx/2xx/3xx (a protocol violation by the relay)        relay
17    4.2.2 / 5.2.2, or 452 / 552 with no or an x.2.x code (full)      transient
18    5xx 5.1.1 / 5.1.2 / 5.1.3 / 5.1.6 / 5.1.10                        hard_bounce
19    5xx 5.2.1 whose text says disabled/inactive (not temporarily)     hard_bounce
20    5xx without enhanced code saying the user/mailbox does not exist  hard_bounce
21    other 4xx at rcpt/data/data_end                                   transient
22    other 5xx at rcpt/data/data_end (policy, content, too big)        rejected
====  ==============================================================  ================

Plus one rule the table cannot see, :class:`RefusalStreak`: the same refusal for many
different recipients in a row is about us, whatever the text says (it becomes ``relay``).

What the engine does with each class: ``hard_bounce`` -> job ``bounced``, address
suppressed; ``rejected`` -> job ``failed``, address not suppressed; ``transient`` -> retry
on the schedule; ``relay`` -> job back to ``pending``, no attempt, delivery paused and
probed (P6); ``relay_throttle`` -> back to ``pending``, no attempt, every process paced
slower (and, after a 421, paused for a backoff); ``domain_throttle`` -> back to
``pending``, no attempt, that recipient domain waits for a backoff alone; which of the two
a throttle is, is decided by evidence across domains (:class:`ThrottleJudge`, docs/design.md §17);
``sender`` -> back to ``pending``, no attempt, that campaign paused with the reason shown,
its From probed until the relay accepts it and the campaign resumed by itself
(transactional mail: delivery paused like ``relay``); ``sent`` -> ``sent``.
"""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from workers.core.addresses import domain_of
from workers.core.i18n import N_


class ReplyClass(StrEnum):
    """Outcome class of one delivery attempt."""

    SENT = "sent"
    HARD_BOUNCE = "hard_bounce"
    REJECTED = "rejected"
    TRANSIENT = "transient"
    RELAY = "relay"
    RELAY_THROTTLE = "relay_throttle"
    DOMAIN_THROTTLE = "domain_throttle"
    SENDER = "sender"


#: Classes that are not an attempt at the recipient (P6): no attempt is used.
NOT_ABOUT_RECIPIENT = frozenset({ReplyClass.RELAY, ReplyClass.RELAY_THROTTLE,
                                 ReplyClass.DOMAIN_THROTTLE, ReplyClass.SENDER})

RELAY_STAGES = frozenset({"connect", "greeting", "ehlo", "starttls", "auth", "mail", "noop"})
MESSAGE_STAGES = frozenset({"rcpt", "data", "data_end", "send"})
STAGES = RELAY_STAGES | MESSAGE_STAGES
SESSION_STAGES = RELAY_STAGES - {"mail"}

_ENHANCED = re.compile(r"\s*([245])\.(\d{1,3})\.(\d{1,3})(?![\d.])")


def parse_enhanced(text: str) -> str | None:
    """Return the RFC 3463 enhanced status code at the start of a reply text.

    Guarantees: the result is ``"c.s.d"`` with class 2, 4 or 5 as written by the server,
    or None when the text does not start (after whitespace) with such a code.
    """
    match = _ENHANCED.match(text)
    if match is None:
        return None
    return f"{match[1]}.{match[2]}.{match[3]}"


def _words(*patterns: str) -> re.Pattern[str]:
    return re.compile("|".join(patterns), re.IGNORECASE)


@dataclass(frozen=True)
class Rule:
    """One row of the table. Every condition given must hold; an omitted one always does.

    ``codes``: reply codes as strings, "4xx"/"5xx"/"2xx" wildcards or "none" (no reply);
    ``detail``: enhanced codes with the class left out ("7.1" matches 4.7.1 and 5.7.1);
    ``text``: a regex searched in the reply text; ``no_enhanced``: only without a code.
    """

    row: int
    cls: ReplyClass
    why: str  # the short plain phrase shown to people (never the server's own text)
    stages: frozenset[str] = STAGES
    codes: frozenset[str] = frozenset()
    detail: frozenset[str] = frozenset()
    detail_range: tuple[str, int, int] | None = None
    text: re.Pattern[str] | None = None
    no_enhanced: bool = False
    login: bool = False  # the relay refused our credentials ("login refused")

    def matches(self, code: int | None, enhanced: str | None, text: str, stage: str) -> bool:
        if stage not in self.stages:
            return False
        if self.codes and not _code_in(code, self.codes):
            return False
        detail = enhanced.split(".", 1)[1] if enhanced else None
        if self.detail and detail not in self.detail:
            return False
        if self.detail_range is not None:
            if detail is None:
                return False
            subject, number = detail.split(".")
            prefix, low, high = self.detail_range
            if subject != prefix or not low <= int(number) <= high:
                return False
        if self.no_enhanced and enhanced is not None:
            return False
        return self.text is None or bool(self.text.search(text))


def _code_in(code: int | None, codes: frozenset[str]) -> bool:
    if code is None:
        return "none" in codes
    return str(code) in codes or f"{code // 100}xx" in codes


def _s(*names: str) -> frozenset[str]:
    return frozenset(names)


FAIL = _s("4xx", "5xx")
_NOT_STARTTLS = RELAY_STAGES - {"starttls"}

RULES: tuple[Rule, ...] = (
    # --- no reply at all -------------------------------------------------------------
    Rule(1, ReplyClass.RELAY, N_("secure connection (TLS) to the mail server failed"),
         stages=_s("starttls"), codes=_s("none")),
    Rule(2, ReplyClass.RELAY, N_("mail server unreachable"), stages=_NOT_STARTTLS,
         codes=_s("none")),
    Rule(3, ReplyClass.TRANSIENT, N_("connection lost while sending; will retry"),
         stages=MESSAGE_STAGES, codes=_s("none")),
    # --- a recipient domain's rate limit (Gmail 4.7.28, Outlook 4.7.650/651) -------------
    Rule(4, ReplyClass.DOMAIN_THROTTLE, N_("the recipient's domain is throttling us"),
         codes=_s("4xx"), detail=_s("7.28", "7.650", "7.651")),
    # --- our domain's authentication ---------------------------------------------------
    Rule(5, ReplyClass.RELAY, N_("sender authentication (SPF/DKIM/DMARC) failed for our domain"),
         codes=FAIL, detail_range=("7", 23, 30)),
    Rule(5, ReplyClass.RELAY, N_("sender authentication (SPF/DKIM/DMARC) failed for our domain"),
         codes=FAIL, detail=_s("7.515")),
    # --- throttling: slow down, never fail ---------------------------------------------
    Rule(6, ReplyClass.RELAY_THROTTLE, N_("the relay is throttling us"),
         codes=_s("4xx"), text=_words(r"too (many|much) \w+( \w+)? from", r"throttl",
                                      r"sending rate", r"quota exceeded",
                                      r"rate limit(ed)? exceeded")),
    Rule(7, ReplyClass.RELAY_THROTTLE, N_("the relay closed the connection (busy or going down)"),
         codes=_s("421")),
    Rule(8, ReplyClass.DOMAIN_THROTTLE, N_("the recipient's domain is throttling us"),
         codes=_s("4xx"), detail=_s("2.1"), text=_words(r"\brate\b", r"too quickly")),
    Rule(8, ReplyClass.DOMAIN_THROTTLE, N_("the recipient's domain is throttling us"),
         codes=_s("4xx"), detail_range=("7", 0, 999),
         text=_words(r"too many", r"\brate\b", r"try again later")),
    # --- our login, our client, our HELO, our TLS: the relay, not the recipient ---------
    Rule(9, ReplyClass.RELAY, N_("login refused - check the credentials"),
         codes=_s("535", "534", "538"), login=True),
    Rule(9, ReplyClass.RELAY, N_("login refused - check the credentials"),
         codes=FAIL, detail=_s("7.8", "7.9"), login=True),
    Rule(10, ReplyClass.RELAY, N_("the relay requires an encrypted connection (STARTTLS)"),
         codes=FAIL, text=_words(r"must issue a starttls", r"starttls (is )?required")),
    Rule(10, ReplyClass.RELAY, N_("the relay requires an encrypted connection (STARTTLS)"),
         codes=FAIL, detail=_s("7.10", "7.11")),
    Rule(9, ReplyClass.RELAY, N_("the relay requires a login"),
         codes=_s("530"), login=True),
    Rule(9, ReplyClass.RELAY, N_("the relay requires a login"),
         codes=FAIL, detail=_s("7.57"), login=True),
    Rule(11, ReplyClass.RELAY, N_("the relay refuses our connection (client, HELO or relaying)"),
         codes=FAIL, text=_words(r"client host rejected", r"helo command rejected",
                                 r"relay access denied", r"relaying denied",
                                 r"not authenticated", r"authentication required")),
    Rule(11, ReplyClass.RELAY, N_("the relay refuses our connection (client, HELO or relaying)"),
         codes=FAIL, detail=_s("7.64")),
    # --- our sender address --------------------------------------------------------------
    Rule(12, ReplyClass.SENDER, N_("the relay refuses this From address"),
         codes=FAIL, text=_words(r"sender address rejected", r"not owned by",
                                 r"send as this sender", r"sender (address )?(is )?not allowed")),
    Rule(12, ReplyClass.SENDER, N_("the relay refuses this From address"),
         codes=FAIL, detail=_s("7.60", "1.7", "1.8")),
    # --- anything else before RCPT ---------------------------------------------------------
    Rule(13, ReplyClass.RELAY, N_("mail server refused our session"), stages=SESSION_STAGES,
         codes=FAIL),
    Rule(14, ReplyClass.SENDER, N_("the relay refuses this From address"), stages=_s("mail"),
         codes=_s("5xx")),
    Rule(14, ReplyClass.RELAY, N_("mail server temporarily unavailable"), stages=_s("mail"),
         codes=_s("4xx")),
    # --- success and nonsense ------------------------------------------------------------
    Rule(15, ReplyClass.SENT, N_("accepted by the mail server"), stages=_s("data_end", "noop"),
         codes=_s("2xx")),
    Rule(16, ReplyClass.RELAY, N_("mail server answered out of turn"),
         codes=_s("1xx", "2xx", "3xx")),
    # --- about the recipient ---------------------------------------------------------------
    Rule(17, ReplyClass.TRANSIENT, N_("mailbox full"), codes=FAIL, detail=_s("2.2")),
    Rule(17, ReplyClass.TRANSIENT, N_("mailbox full"), codes=_s("452", "552"), no_enhanced=True),
    Rule(17, ReplyClass.TRANSIENT, N_("mailbox full"), codes=_s("452", "552"),
         detail_range=("2", 0, 999)),
    Rule(18, ReplyClass.HARD_BOUNCE, N_("recipient domain does not accept mail"),
         codes=_s("5xx"), detail=_s("1.2", "1.10")),
    Rule(18, ReplyClass.HARD_BOUNCE, N_("invalid address"), codes=_s("5xx"), detail=_s("1.3")),
    Rule(18, ReplyClass.HARD_BOUNCE, N_("mailbox does not exist"), codes=_s("5xx"),
         detail=_s("1.1", "1.6")),
    Rule(19, ReplyClass.HARD_BOUNCE, N_("mailbox disabled"), codes=_s("5xx"), detail=_s("2.1"),
         text=re.compile(r"^(?!.*temporar).*\b(disabled|inactive|deactivated)\b",
                         re.IGNORECASE | re.DOTALL)),
    Rule(20, ReplyClass.HARD_BOUNCE, N_("mailbox does not exist"), codes=_s("5xx"),
         no_enhanced=True, text=_words(
             r"\buser\s+unknown", r"\bunknown\s+(?:user|recipient|mailbox|address)",
             r"\brecipient\s+unknown", r"\bno\s+such\s+(?:user|mailbox|recipient|account"
             r"|address|person)", r"\b(?:mailbox|user|recipient|account|address)\s+"
             r"(?:not\s+found|not\s+exist)", r"\b(?:does\s+not|doesn't|did\s+not)\s+exist",
             r"\binvalid\s+(?:recipient|mailbox|user)",
             r"\bnot\s+a\s+valid\s+(?:mailbox|user|recipient)")),
    Rule(21, ReplyClass.TRANSIENT, N_("temporarily deferred by the receiving server"),
         codes=_s("4xx")),
    Rule(22, ReplyClass.REJECTED, N_("message too large"), codes=_s("5xx"), detail=_s("3.4")),
    Rule(22, ReplyClass.REJECTED, N_("rejected by the receiving server as policy/spam"),
         codes=_s("5xx"), detail_range=("7", 0, 999)),
    Rule(22, ReplyClass.REJECTED, N_("message content rejected"), codes=_s("5xx"),
         detail_range=("6", 0, 999)),
    Rule(22, ReplyClass.REJECTED, N_("rejected by the receiving server as policy/spam"),
         codes=_s("5xx"), text=_words(r"spam|polic|block|blacklist|denylist|reputation"
                                      r"|\brbl\b|spamhaus")),
    Rule(22, ReplyClass.REJECTED, N_("message too large"), codes=_s("552"), no_enhanced=True),
    Rule(22, ReplyClass.REJECTED, N_("rejected by the receiving server"), codes=_s("5xx")),
)

_FALLBACK = Rule(0, ReplyClass.RELAY, N_("mail server misbehaved"))


def find_rule(code: int | None, text: str, stage: str) -> Rule:
    """The first row of :data:`RULES` this reply matches.

    Raises ValueError only for an unknown ``stage`` (a programming error).
    """
    if stage not in STAGES:
        raise ValueError(f"unknown SMTP stage {stage!r}")
    enhanced = parse_enhanced(text) if code is not None else None
    for rule in _candidates(code, stage):
        if rule.matches(code, enhanced, text, stage):
            return rule
    return _FALLBACK


# The rows that may match a reply code at a stage, in the table's order: every message's
# "250" reads a few rows instead of the whole table. Bounded: codes are three digits.
_CANDIDATES: dict[tuple[int | None, str], tuple[Rule, ...]] = {}


def _candidates(code: int | None, stage: str) -> tuple[Rule, ...]:
    rules = _CANDIDATES.get((code, stage))
    if rules is None:
        rules = tuple(rule for rule in RULES if stage in rule.stages
                      and (not rule.codes or _code_in(code, rule.codes)))
        if code is None or 100 <= code <= 999:
            _CANDIDATES[(code, stage)] = rules
    return rules


def classify_reply(code: int | None, text: str, stage: str) -> ReplyClass:
    """Classify one SMTP reply (or the lack of one) per the module table.

    Guarantees: never raises for any ``code``/``text``; HARD_BOUNCE is only returned for a
    5xx reply that says the address itself is dead (P5); every refusal that concerns our
    relay, login, client, HELO, TLS or sender -- at whatever stage it is reported -- is
    one of the classes in :data:`NOT_ABOUT_RECIPIENT` (P6).
    """
    return find_rule(code, text, stage).cls


def is_login_refusal(code: int | None, text: str, stage: str) -> bool:
    """True when the relay refused (or demands) our credentials: "login refused"."""
    return find_rule(code, text, stage).login


def humanize(reply_class: ReplyClass, code: int | None, enhanced: str | None, text: str,
             stage: str | None = None) -> str:
    """A short plain-English phrase for a classified reply.

    Guarantees: a lower-case phrase of a few words meant for marketers and support
    staff; it never contains the server's own text, so it is safe to show anywhere and
    stable enough to group errors by.
    """
    if reply_class is ReplyClass.SENT:
        return N_("accepted by the mail server")
    rule = find_rule(code, text, stage if stage in STAGES else "rcpt")
    if rule.cls is reply_class:
        return rule.why
    if reply_class is RefusalStreak.CLASS:
        return RefusalStreak.WHY
    return {ReplyClass.HARD_BOUNCE: N_("mailbox does not exist"),
            ReplyClass.REJECTED: N_("rejected by the receiving server"),
            ReplyClass.TRANSIENT: N_("temporarily deferred by the receiving server"),
            ReplyClass.RELAY_THROTTLE: N_("the relay is throttling us"),
            ReplyClass.DOMAIN_THROTTLE: N_("the recipient's domain is throttling us"),
            ReplyClass.SENDER: N_("the relay refuses this From address"),
            }.get(reply_class, N_("mail server temporarily unavailable"))


# --- the rule the table cannot see -------------------------------------------------------

_ADDRESSES = re.compile(r"<[^<>]*>|[\w.+%=-]+@[\w.-]+")
_SPACE = re.compile(r"\s+")
STREAK_CLASSES = frozenset({ReplyClass.REJECTED, ReplyClass.TRANSIENT,
                            ReplyClass.HARD_BOUNCE})


def refusal_key(code: int | None, text: str, recipient: str) -> str:
    """A refusal with everything recipient-specific taken out (addresses in or out of
    angle brackets, the recipient's local part and domain), so two recipients' refusals
    compare equal exactly when the relay said the same thing to both."""
    local, domain = recipient.lower().rpartition("@")[0], domain_of(recipient)
    normalized = _ADDRESSES.sub("<>", text.lower())
    for part in (domain, local):
        if len(part) >= 3:
            normalized = normalized.replace(part, "*")
    return f"{code} {_SPACE.sub(' ', normalized).strip()}"


class RefusalStreak:
    """"The same refusal for many different recipients in a row is about us" (docs/design.md §16).

    Fed every classified outcome of the process (all worker threads: a row is a row
    whichever thread sent it). When ``threshold`` consecutive refusals carry the same
    :func:`refusal_key` for as many different recipients (for hard bounces: as many
    different recipient *domains*, so a dead company domain is still a bounce), the last
    one is reclassified ``relay`` and the keys of the earlier ones are handed back so
    the engine can undo what it charged them. Any other outcome breaks the streak.
    Thread-safe.
    """

    CLASS = ReplyClass.RELAY
    WHY = N_("the relay gives every recipient the same refusal: treated as our problem")

    def __init__(self, threshold: int = 10) -> None:
        self.threshold = threshold
        self._lock = threading.Lock()
        self._row: deque[tuple[object, str, str, str]] = deque()

    def observe(self, job: object, recipient: str, cls: ReplyClass, code: int | None,
                text: str) -> tuple[ReplyClass, list[object]]:
        """Feed one outcome; returns (its class, possibly RELAY now; earlier jobs of the
        streak to reprieve, only when the streak just tripped)."""
        if self.threshold < 2:
            return cls, []
        with self._lock:
            if cls not in STREAK_CLASSES:
                if cls is not ReplyClass.SENT and cls in NOT_ABOUT_RECIPIENT:
                    return cls, []  # the relay's own trouble neither breaks nor extends it
                self._row.clear()
                return cls, []
            key = f"{cls}:{refusal_key(code, text, recipient)}"
            who = recipient.lower()
            if cls is ReplyClass.HARD_BOUNCE:
                who = domain_of(who)
            if self._row and self._row[-1][1] != key:
                self._row.clear()
            if any(entry[2] == who for entry in self._row):
                # the same recipient (or domain) again says nothing new; keep the row
                return cls, []
            self._row.append((job, key, who, recipient))
            if len(self._row) < self.threshold:
                return cls, []
            earlier = [entry[0] for entry in list(self._row)[:-1]]
            self._row.clear()
            return self.CLASS, earlier

    def reset(self) -> None:
        with self._lock:
            self._row.clear()


# --- whom a throttle concerns: evidence across domains (docs/design.md §17) -----------------------

THROTTLES = frozenset({ReplyClass.RELAY_THROTTLE, ReplyClass.DOMAIN_THROTTLE})


class ThrottleJudge:
    """Whether a throttle reply is about the relay or about the recipient's domain, decided
    by what the relay does with the other domains; the table's class (from the wording) is
    only the hint used when there is no evidence.

    - the same reply (recipient and its domain taken out: :func:`refusal_key`) for a
      second domain within ``window`` seconds: the relay throttles us (the domains judged
      throttled for that reply are handed back, so their backoff can be lifted);
    - else, another domain accepted within ``window`` seconds: this domain throttles us;
    - else the hint. A throttle before RCPT (no recipient yet) is always the relay's.
      When the hint said "the relay" and, within ``window``, another domain is accepted
      while no other domain got that reply, the hint was wrong: :meth:`accepted` hands
      that domain back (its backoff instead of the relay's pace).

    A *temporary* refusal of our sender at RCPT (Proofpoint's inbound limit says "450
    4.7.1 Sender address rejected") is judged the same way, with the evidence that the
    same sender was accepted for another domain within ``window``.

    Fed every outcome of the process (all threads). Thread-safe."""

    def __init__(self, window: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._accepted: dict[str, float] = {}  # domain -> last 250
        self._senders: dict[tuple[str, str], float] = {}  # (sender, domain) -> last 250
        self._seen: dict[str, dict[str, float]] = {}  # reply key -> domain -> last seen
        # reply key -> (domain, time, reply): judged the relay's on the wording alone
        self._hinted: dict[str, tuple[str, float, str]] = {}
        self._prune_at = 2000

    def accepted(self, domain: str, sender: str = "") -> dict[str, str]:
        """Record a 250 for ``domain`` (and ``sender``). Returns {domain: reply} for
        throttles judged the relay's on wording alone that this acceptance contradicts:
        they were that domain's."""
        domain = domain.lower()
        with self._lock:
            now = self._clock()
            if len(self._accepted) + len(self._senders) > self._prune_at:
                # only the last window's acceptances matter; pruned at doubling sizes, so
                # a busy window costs amortized constant time per acceptance
                self._accepted = {d: t for d, t in self._accepted.items()
                                  if t >= now - self.window}
                self._senders = {k: t for k, t in self._senders.items()
                                 if t >= now - self.window}
                self._prune_at = max(2000, 2 * (len(self._accepted) + len(self._senders)))
            self._accepted[domain] = now
            wrong: dict[str, str] = {}
            for key, (hinted, at, reply) in list(self._hinted.items()):
                if at < now - self.window:
                    del self._hinted[key]
                elif hinted != domain and set(self._seen.get(key, {})) <= {hinted}:
                    wrong[hinted] = reply
                    del self._hinted[key]
            if sender:
                self._senders[(sender.lower(), domain)] = now
            return wrong

    def judge(self, cls: ReplyClass, code: int | None, text: str, recipient: str,
              stage: str, sender: str = "") -> tuple[ReplyClass, list[str]]:
        """(the class to act on; domains earlier judged throttled for the same reply, now
        known to be the relay's: their backoff should be lifted)."""
        if stage not in MESSAGE_STAGES:
            return cls, []
        domain = domain_of(recipient)
        if cls is ReplyClass.SENDER:
            if code is None or code // 100 != 4 or not sender:
                return cls, []
            horizon = self._clock() - self.window
            with self._lock:
                elsewhere = any(t >= horizon and s == sender.lower() and d != domain
                                for (s, d), t in self._senders.items())
            return (ReplyClass.DOMAIN_THROTTLE if elsewhere else cls), []
        if cls not in THROTTLES:
            return cls, []
        key = refusal_key(code, text, recipient)
        now = self._clock()
        with self._lock:
            horizon = now - self.window
            seen = {d: t for d, t in self._seen.get(key, {}).items() if t >= horizon}
            others = [d for d in seen if d != domain]
            seen[domain] = now
            self._seen[key] = seen
            if len(self._seen) > 1000:  # forget replies nobody repeats
                self._seen = {k: v for k, v in self._seen.items()
                              if max(v.values()) >= horizon}
            if others:
                self._hinted.pop(key, None)
                return ReplyClass.RELAY_THROTTLE, others
            if any(t >= horizon for d, t in self._accepted.items() if d != domain):
                return ReplyClass.DOMAIN_THROTTLE, []
            if cls is ReplyClass.RELAY_THROTTLE:
                self._hinted[key] = (domain, now, f"{code} {text}".strip())
            return cls, []
