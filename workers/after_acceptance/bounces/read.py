"""One bounce mail → what it says about each recipient (see the package docstring)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from email.message import Message
from email.utils import getaddresses

from workers.after_acceptance.bounces import fields as dsnf
from workers.after_acceptance.bounces import reasons as rs
from workers.after_acceptance.bounces.mime import Letter, header_text, own_text, read_letter

ADDRESS = re.compile(
    r"(?<![\w.!#$%&'*+/=?^`{|}~@-])"
    r"([a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
    r"@(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,24})(?![\w-]*@)(?![a-z0-9-])",
    re.IGNORECASE)
_DAEMON = re.compile(
    r"^(?:postmaster|mailer-daemon|mail-daemon|maildaemon|mailer_daemon|double-bounce|"
    r"mdaemon|mail\.daemon|nobody|root|abuse|noreply|no-reply|bounce|bounces|"
    r"bounce-notification|notification)(?:[+=].*)?@", re.IGNORECASE)
# Lines of the returned original's headers (or of SMTP traces) whose addresses are not
# the failed recipients.
_NOT_RECIPIENT_LINE = re.compile(
    r"^\s*(?:>+\s*)?(?:from|sender|reply-to|return-path|message-id|in-reply-to|references|"
    r"received|x-[a-z-]+|list-[a-z-]+|dkim-signature|authentication-results|arc-[a-z-]+|"
    r"feedback-id|errors-to|envelope-from|mail from|resent-[a-z-]+|"
    r"reporting-mta|received-from-mta|arrival-date|delivered-to)\s*:", re.IGNORECASE)
_MAIL_FROM = re.compile(r"mail from\s*:?\s*<", re.IGNORECASE)
_TRANSCRIPT_LINE = re.compile(r"\s*[245]\d\d[ -]<?[^\s<>]+@[^\s<>]+>?\.\.\.\s")
_SECTION = re.compile(r"\s*(?:while talking to|-{3,}|={5,}|\*{5,})", re.IGNORECASE)
_URLISH = re.compile(r"https?://\S+", re.IGNORECASE)
_COMMAND = re.compile(
    r"(?:>>>\s*|in reply to |after |did not like our |command[: ]+|rejected our |"
    r"error in reply to |after end of |to )(rcpt|mail from|mail|data|ehlo|helo|"
    r"end of data|conn)\b", re.IGNORECASE)
_RCPT_ANYWHERE = re.compile(
    r"\brcpt to\b|\bsmtp:rcpt\b|does not like recipient|after rcpt\b", re.IGNORECASE)
_DELAY_SUBJECT = re.compile(
    r"delayed|delay(?:ed)? (?:notification|warning)|warning: could not send|still being "
    r"retried|\(delay\)|delivery status notification \(delay\)|not yet been delivered|"
    r"retry (?:warning|notification)|will retry|delivery is delayed", re.IGNORECASE)
_DELAY_TEXT = re.compile(
    r"has not yet been delivered|will (?:continue to )?(?:be )?retr(?:y|ied)|"
    r"no action is required on your part|is still being retried|still trying to deliver|"
    r"delivery attempts will continue|this is a warning message only|"
    r"message (?:has been|was) delayed|has been delayed|not been delivered yet|"
    r"temporarily deferred|will keep trying", re.IGNORECASE)
_PERMANENT_TEXT = re.compile(
    r"(?:permanent(?:ly)?|fatal) (?:error|failure|fail)|could not be delivered|undeliverable|"
    r"delivery (?:has )?failed|failed permanently|giving up|gave up|returned mail|"
    r"delivery to the following recipients? failed|mail delivery failed|"
    r"couldn'?t be delivered|not be delivered|unable to deliver|i'?m sorry to (?:have to )?inform|"
    r"rejected|message not delivered|failure notice|non-?delivery", re.IGNORECASE)
_AUTO_SUBJECT = re.compile(
    r"^(?:auto(?:matic)?[ -]?(?:reply|response|antwort)|auto:|out of (?:the )?office|"
    r"abwesenheit|vacation|absence|away from)|autoreply|\bout of office\b",
    re.IGNORECASE)
_BOUNCE_SUBJECT = re.compile(
    r"undeliver|returned mail|delivery (?:status )?notif|failure notice|mail delivery|"
    r"delivery fail|non[- ]?delivery|not delivered|could not|bounce|rejected|"
    r"delivery report|delivery problem|error|failed|warning|nondeliverable|"
    r"unzustellbar|no se puede entregar|r[ée]ponse|配信|不達|エラー|未送達|returned", re.IGNORECASE)
_SURE_SUBJECT = re.compile(
    r"undeliver|returned mail|delivery status notification|failure notice|mail delivery "
    r"fail|non[- ]?delivery|delivery failure|nondeliverable|unzustellbar|配信|不達|未送達",
    re.IGNORECASE)
_DAEMON_FROM = re.compile(
    r"mailer-daemon|post_?master|mail delivery|mail administrator|mail\.delivery|"
    r"microsoftexchange|mailerdaemon|mdaemon|daemon|noreply|no-reply|bounce|"
    r"system administrator|mail system|mail router", re.IGNORECASE)

FEEDBACK_COMPLAINTS = {"abuse", "fraud", "virus", "other", "opt-out", "optout"}


@dataclass
class Failure:
    """What the bounce says about one recipient."""

    recipient: str
    reason: str
    effect: str                     # reasons.HARD/SOFT/SENDER/DELAY/COMPLAINT/IGNORE
    status: str = ""
    reply: str = ""
    diagnostic: str = ""
    alt: str = ""                   # the DSN's other name for the recipient
    feedback_type: str = ""

    @property
    def label(self) -> str:
        return rs.label_of(self.reason)


@dataclass
class Reading:
    """What one mail says. ``kind``: ``dsn``, ``arf``, ``ses``, ``bounce`` (a bounce in
    text), ``autoreply``, ``other`` (not a report) or ``unreadable`` (``error`` says why)."""

    kind: str
    failures: list[Failure] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)
    original_message_id: str | None = None
    report_message_id: str | None = None
    subject: str = ""
    error: str = ""
    crashed: bool = False           # unreadable because reading raised (a bug to report)


# --- helpers ---------------------------------------------------------------------------


def _clean(addr: str) -> str:
    """An address as found in text, without the quoting around it (``'a@b``,
    ``smtp=a@b``, ``SMTP:a@b``), lower-cased."""
    addr = addr.lower().strip(".'`")
    local, _, domain = addr.rpartition("@")
    for prefix in ("smtp=", "smtp:", "rfc822;", "rfc822="):
        if local.startswith(prefix):
            local = local[len(prefix):]
    return f"{local.lstrip(chr(39))}@{domain}"


def _addresses_in(value: str) -> list[str]:
    return [_clean(a) for a in ADDRESS.findall(value or "")]


def _header_addresses(letter: Letter, *names: str) -> list[str]:
    found: list[str] = []
    for name in names:
        try:
            values = [header_text(v) for v in letter.msg.get_all(name, [])]
        except Exception:
            values = []
        for _n, addr in getaddresses(values):
            if "@" in addr and addr.lower() not in found:
                found.append(addr.lower())
    return found


def _orig_header(orig: Message | None, name: str) -> str:
    if orig is None:
        return ""
    try:
        return header_text(orig.get(name))
    except Exception:
        return ""


def _message_id(value: str) -> str | None:
    found = re.search(r"<[^<>\s]+>", value or "")
    if found:
        return found[0]
    value = (value or "").strip()
    return f"<{value}>" if value and "@" in value and " " not in value else None


def _original_id(letter: Letter, trailing: str) -> str | None:
    mid = _message_id(_orig_header(letter.original, "Message-ID"))
    if mid:
        return mid
    for text in (letter.original_text, trailing, letter.text):
        found = re.search(r"^\s*message-id\s*:\s*(<[^<>\s]+>)", text or "",
                          re.IGNORECASE | re.MULTILINE)
        if found:
            return found[1]
    return None


def _command(text: str) -> str:
    """The SMTP command a failure answered, when the text says (the last one named)."""
    found = list(_COMMAND.finditer(text or ""))
    if not found:
        return "RCPT" if _RCPT_ANYWHERE.search(text or "") else ""
    word = found[-1][1].upper()
    return {"MAIL FROM": "MAIL", "END OF DATA": "DATA"}.get(word, word)


def _failure(recipient: str, diagnostic: str, status: str = "", *, action: str = "",
             alt: str = "", delayed: bool = False, dtype: str = "",
             extra: str = "", near: str = "") -> Failure:
    """One recipient's failure from its diagnostic (and status, action): ``extra`` is more
    text to read when the diagnostic alone says too little, ``near`` the lines about this
    recipient (where the SMTP command it failed at is named, when the diagnostic does not)."""
    text = " ".join(diagnostic.split())
    status = status if status and rs.STATUS_RE.fullmatch(status) else ""
    found_status = rs.find_status(text)
    if not status or (status.endswith(".0.0") and found_status):
        status = found_status or status
    reply = rs.find_reply(text)
    command = _command(text) or _command(near)
    if dtype.startswith("X-UNIX") and not rs.matches("mailboxfull", text.lower()):
        reason = "mailererror"
    else:
        reason = rs.find_reason(text, status, reply, action=action, command=command)
        if reason in ("onhold", "undefined", "systemerror", "securityerror",
                      "expired", "networkerror") and extra and extra.strip() != text:
            more = " ".join(extra.split())
            # A status that says nothing (x.0.0) gives way to the one the text quotes.
            known = status if status and not status.endswith(".0.0") else \
                rs.find_status(" ".join(near.split())) or status
            better = rs.find_reason(f"{text} {more}", known, reply or rs.find_reply(extra),
                                    action=action, command=command)
            if better not in ("onhold", "undefined"):
                reason = better
    if reason == "filtered" and command not in ("MAIL",) and rs.surely_unknown(near) and \
            not (status or "").startswith("5.2"):
        reason = "userunknown"  # the lines about this recipient say it in their own words
    if not status and not reply and extra:
        status = rs.find_status(" ".join(extra.split()))
    effect = rs.effect_of(reason, status, reply, delayed=delayed)
    return Failure(recipient, reason, effect, status, reply, text[:1000], alt)


# --- the readers ---------------------------------------------------------------------


def _from_json(text: str) -> dict | None:
    start = text.find("{")
    if start < 0:
        return None
    body = text[start:]
    for candidate in (body, re.sub(r"!?\n[ \t]?", "", body), body.replace("\n", "")):
        end = candidate.rfind("}")
        try:
            data = json.loads(candidate[:end + 1])
        except (ValueError, RecursionError):
            continue
        if isinstance(data, dict):
            if isinstance(data.get("Message"), str):  # an SNS envelope
                try:
                    inner = json.loads(data["Message"])
                    if isinstance(inner, dict):
                        return inner
                except ValueError:
                    pass
            return data
    return None


def _ses(letter: Letter) -> list[Failure] | None:
    """An Amazon SES notification sent by SNS as mail (JSON in the body)."""
    text = letter.json_text or letter.text
    if "notificationType" not in text and "eventType" not in text:
        return None
    data = _from_json(text)
    if data is None:
        return None
    kind = str(data.get("notificationType") or data.get("eventType") or "")
    out: list[Failure] = []
    if kind == "Bounce" and isinstance(data.get("bounce"), dict):
        bounce = data["bounce"]
        sub = str(bounce.get("bounceSubType") or "")
        for item in bounce.get("bouncedRecipients") or []:
            if not isinstance(item, dict):
                continue
            addr = str(item.get("emailAddress") or "").lower()
            diag = str(item.get("diagnosticCode") or "")
            status = str(item.get("status") or "")
            failure = _failure(addr, diag or sub, status, action=str(item.get("action") or ""))
            if bounce.get("bounceType") == "Permanent" and sub in ("NoEmail", "General") \
                    and failure.reason in ("onhold", "undefined"):
                failure.reason, failure.effect = "userunknown", rs.HARD
            if sub == "Suppressed" and failure.reason in ("onhold", "undefined"):
                failure.reason, failure.effect = "suppressed", rs.SOFT
            if sub == "MailboxFull":
                failure.reason, failure.effect = "mailboxfull", rs.SOFT
            out.append(failure)
    elif kind == "Complaint" and isinstance(data.get("complaint"), dict):
        complaint = data["complaint"]
        ftype = str(complaint.get("complaintFeedbackType") or "abuse").lower()
        effect = rs.COMPLAINT if ftype in FEEDBACK_COMPLAINTS or ftype == "" else rs.IGNORE
        for item in complaint.get("complainedRecipients") or []:
            if isinstance(item, dict) and item.get("emailAddress"):
                out.append(Failure(str(item["emailAddress"]).lower(), "feedback", effect,
                                   feedback_type=ftype, diagnostic="SES complaint"))
    elif kind == "Delivery" and isinstance(data.get("delivery"), dict):
        delivery = data["delivery"]
        for addr in delivery.get("recipients") or []:
            out.append(Failure(str(addr).lower(), "delivered", rs.IGNORE,
                               diagnostic=str(delivery.get("smtpResponse") or "")[:1000]))
    return out


def _arf(letter: Letter) -> list[Failure] | None:
    """An ARF complaint (RFC 5965), or Microsoft's JMRP (the complained message attached,
    its recipient in ``X-HmXmrOriginalRecipient``)."""
    orig = letter.original
    if not letter.feedback_parts:
        jmrp = _orig_header(orig, "X-HmXmrOriginalRecipient")
        if not jmrp:
            return None
        return [Failure(a, "feedback", rs.COMPLAINT, feedback_type="abuse",
                        diagnostic="complaint (Microsoft JMRP)") for a in _addresses_in(jmrp)
                ] or [Failure("", "feedback", rs.COMPLAINT, feedback_type="abuse")]
    per_message, _groups = dsnf.groups("\n".join(letter.feedback_parts))
    if "feedback-type" not in per_message and orig is None:
        return None  # no field of a report and nothing reported: not a complaint
    ftype = per_message.get("feedback-type", "abuse").strip().lower() or "abuse"
    effect = rs.COMPLAINT if ftype in FEEDBACK_COMPLAINTS else rs.IGNORE
    rcpts: list[str] = []
    for part in letter.feedback_parts:
        for found in re.finditer(r"^(?:original-rcpt-to|removal-recipient)\s*:\s*(.*)$",
                                 part, re.IGNORECASE | re.MULTILINE):
            rcpts += [a for a in _addresses_in(found[1]) if a not in rcpts]
    if not rcpts:
        rcpts = [a for a in _addresses_in(_orig_header(orig, "To"))]
    if not rcpts:
        rcpts = [a for a in _addresses_in(_orig_header(orig, "X-HmXmrOriginalRecipient"))]
    agent = per_message.get("user-agent", "")
    diag = f"complaint ({ftype})" + (f" via {agent}" if agent else "")
    return [Failure(a, "feedback", effect, feedback_type=ftype, diagnostic=diag[:1000])
            for a in dict.fromkeys(rcpts)] or [
        Failure("", "feedback", effect, feedback_type=ftype, diagnostic=diag[:1000])]


def _autoreply(letter: Letter) -> list[Failure] | None:
    """An auto-reply (RFC 3834): about the person who was away, nothing to do."""
    auto = letter.header("auto-submitted").lower()
    subject = letter.header("subject")
    flagged = auto.startswith("auto-replied") or letter.header("x-autoreply") or \
        letter.header("x-autorespond") or "auto_reply" in letter.header("precedence").lower()
    if not flagged and not _AUTO_SUBJECT.search(subject):
        return None
    if letter.status_parts or _DAEMON_FROM.search(letter.header("from")):
        return None
    who = _header_addresses(letter, "From")
    return [Failure(a, "vacation", rs.IGNORE, diagnostic=subject[:1000]) for a in who[:1]]


def _context(lines: list[str], addr: str) -> str:
    """The paragraphs that mention ``addr``: its line and the lines that follow it until a
    blank line (or another address's line)."""
    out: list[str] = []
    for i, line in enumerate(lines):
        if addr not in line.lower():
            continue
        chunk = [line]
        if i and lines[i - 1].lstrip().startswith(">>>"):
            chunk.insert(0, lines[i - 1])  # the command this reply answered
        if _TRANSCRIPT_LINE.match(line):
            out.append("\n".join(chunk))  # "550 <a@b>... User unknown": one line each
            continue
        for follow in lines[i + 1:i + 14]:
            if not follow.strip():
                if len(chunk) > 1 or len(out) > 0:
                    break
                continue
            named = _addresses_in(follow)
            if (named and addr not in named) or _SECTION.match(follow):
                break  # another recipient's lines, or the next part of a transcript
            chunk.append(follow)
        out.append("\n".join(chunk))
    return "\n".join(out)


def _excluded(letter: Letter, trailing: str) -> set[str]:
    """Addresses that are not failed recipients: the bounce's own headers' and the returned
    original's sender (ours), and whoever a transcript's MAIL FROM names."""
    ours = set(_header_addresses(letter, "From", "To", "Cc", "Reply-To", "Return-Path",
                                 "Delivered-To", "Envelope-To", "X-Envelope-To", "Sender",
                                 "Errors-To"))
    orig = letter.original
    for name in ("From", "Sender", "Return-Path", "Reply-To", "Errors-To"):
        ours.update(_addresses_in(_orig_header(orig, name)))
    for found in re.finditer(r"^\s*(?:from|return-path|sender|reply-to)\s*:(.*)$", trailing,
                             re.IGNORECASE | re.MULTILINE):
        ours.update(_addresses_in(found[1]))
    for found in _MAIL_FROM.finditer(letter.text):
        ours.update(_addresses_in(letter.text[found.end():found.end() + 200].split(">")[0]))
    return ours


def _candidates(text: str, excluded: set[str], *, daemons: bool = False) -> list[str]:
    """The addresses ``text`` names that may be failed recipients, in order: not ours (the
    ``excluded`` senders), not a Message-ID, not a mail daemon's (unless ``daemons``)."""
    found: list[str] = []
    for line in text.split("\n"):
        if _NOT_RECIPIENT_LINE.match(line) or _MAIL_FROM.search(line):
            continue
        line = _URLISH.sub(" ", line)
        for match in ADDRESS.finditer(line):
            addr = _clean(match[1])
            before = line[max(0, match.start() - 4):match.start()].lower()
            if "id " in before or before.endswith(("id<", "=")) or addr in excluded:
                continue
            if (_DAEMON.match(addr) and not daemons) or addr in found:
                continue
            # A Message-ID (`<…@…>` with a long random local part and digits) is no address.
            local = addr.split("@", 1)[0]
            if len(local) > 40 and sum(c.isdigit() for c in local) > 10:
                continue
            found.append(addr)
    return found


def _is_delay(letter: Letter, own: str) -> bool:
    """A delay notice (the MTA still retries), not a final failure: its subject says so, or
    its text says it will retry and nothing else in it says the delivery failed."""
    subject = letter.header("subject")
    if _DELAY_SUBJECT.search(subject):
        return True
    return bool(_DELAY_TEXT.search(own)) and not _PERMANENT_TEXT.search(
        _DELAY_TEXT.sub("", own[:3000]))


def _dsn(letter: Letter, own: str) -> list[Failure]:
    """One failure per recipient group of the delivery-status fields (in a
    ``message/delivery-status`` part, else in the bounce's own text)."""
    text = "\n".join(letter.status_parts)
    if not dsnf.HAS_FIELDS.search(text) and dsnf.HAS_FIELDS.search(own):
        text = own
    _per_message, groups = dsnf.groups(text)
    out: list[Failure] = []
    lines = own.split("\n")
    for group in groups:
        final = dsnf.address_field(group.get("final-recipient"))
        original = dsnf.address_field(group.get("original-recipient"))
        actual = dsnf.address_field(group.get("x-actual-recipient"))
        rcpt = final or original or actual
        if not rcpt or any(f.recipient == rcpt for f in out):
            continue
        alt = original if original and original != rcpt else (actual if actual != rcpt else "")
        action = group.get("action").split()[0].lower() if group.get("action") else ""
        status = (group.get("status").split() or [""])[0] if group.get("status") else ""
        dtype, diag = dsnf.diagnostic_field(group.get("diagnostic-code"))
        near = _context(lines, rcpt) or (_context(lines, alt) if alt else "")
        context = near
        if len(groups) == 1 and context != own:
            context = f"{context}\n{own}" if context else own
        if action in ("delivered", "relayed", "expanded"):
            out.append(Failure(rcpt, "delivered", rs.IGNORE, status, "", diag[:1000], alt))
            continue
        delayed = action == "delayed" or (
            not action and _is_delay(letter, own))
        if not diag and group.get("x-supplementary-info"):
            diag = group.get("x-supplementary-info")
        failure = _failure(rcpt, diag, status, action=action, alt=alt, delayed=delayed,
                           dtype=dtype, extra=context, near=near)
        out.append(failure)
    return out


def _text_bounce(letter: Letter, own: str, trailing: str) -> list[Failure]:
    excluded = _excluded(letter, trailing)
    # Exim, Gmail and Google Groups name the failed recipients in a header.
    rcpts = [a for a in _addresses_in(letter.header("x-failed-recipients"))]
    if not rcpts:
        rcpts = _candidates(own, excluded)
    if not rcpts:
        # A daemon's address can be the recipient (postmaster@…), and an anonymised sample
        # can name the sender as the recipient: the bounce's own From is still not one.
        rcpts = _candidates(own, set(_header_addresses(letter, "From")), daemons=True)
    if not rcpts:
        orig_to = _addresses_in(_orig_header(letter.original, "To"))
        if not orig_to:
            found = re.search(r"^\s*to\s*:(.*)$", trailing, re.IGNORECASE | re.MULTILINE)
            orig_to = _addresses_in(found[1]) if found else []
        rcpts = [a for a in orig_to if a not in excluded and not _DAEMON.match(a)][:1]
    delayed = _is_delay(letter, own)
    lines = own.split("\n")
    out = []
    for rcpt in rcpts[:50]:
        context = _context(lines, rcpt)
        signal = context and (rs.find_status(context) or rs.find_reply(context) or any(
            rs.matches(r, " ".join(context.lower().split())) for r in rs.FIRST))
        diag = context if signal and len(rcpts) > 1 else (context + "\n" + own
                                                          if context else own)
        out.append(_failure(rcpt, diag, delayed=delayed, extra=own, near=context))
    return out


def _looks_like_bounce(letter: Letter, own: str) -> bool:
    if letter.status_parts:
        return True
    subject = letter.header("subject")
    sender = letter.header("from") + " " + letter.header("return-path")
    if _DAEMON_FROM.search(sender) or _SURE_SUBJECT.search(subject) or \
            letter.header("from").strip() in ("", "<>"):
        return True
    # From a person (or an unknown program): only when the text reads like a bounce too.
    says_so = bool(_PERMANENT_TEXT.search(own) or _DELAY_TEXT.search(own))
    return says_so and bool(_BOUNCE_SUBJECT.search(subject)
                            or letter.header("return-path").strip() in ("<>", ""))


def _nested_bounce(orig: Message) -> bool:
    try:
        sender = header_text(orig.get("From")) + " " + header_text(orig.get("Return-Path"))
        subject = header_text(orig.get("Subject"))
        return orig.get_content_type() == "multipart/report" or bool(
            _DAEMON_FROM.search(sender) and _BOUNCE_SUBJECT.search(subject))
    except Exception:
        return False


def _as_bytes(msg: Message) -> bytes:
    try:
        return msg.as_bytes()
    except Exception:
        try:
            return msg.as_string().encode("utf-8", "replace")
        except Exception:
            return b""


def read(raw: bytes, depth: int = 0) -> Reading:
    """Read one mail from the bounce mailbox. Raises only on a bug; callers that must go
    on whatever happens use :func:`read_safely`."""
    letter = read_letter(raw)
    subject = letter.header("subject")
    reading = Reading("other", subject=subject[:300])
    reading.addresses = _header_addresses(letter, "Delivered-To", "X-Original-To",
                                          "Envelope-To", "X-Envelope-To", "To")
    reading.report_message_id = _message_id(letter.header("message-id"))
    own, trailing = own_text(letter.text)
    reading.original_message_id = _original_id(letter, trailing)

    ses = _ses(letter)
    if ses is not None:
        reading.kind, reading.failures = "ses", ses
        return reading
    arf = _arf(letter)
    if arf is not None:
        reading.kind, reading.failures = "arf", arf
        sender = dsnf.groups("\n".join(letter.feedback_parts))[0].get("original-mail-from")
        reading.addresses = _addresses_in(sender or "") + reading.addresses
        return reading
    auto = _autoreply(letter)
    if auto is not None:
        reading.kind, reading.failures = "autoreply", auto
        return reading
    if not _looks_like_bounce(letter, own):
        return reading
    if letter.status_parts or dsnf.HAS_FIELDS.search(own):
        failures = _dsn(letter, own)
        if failures:
            reading.kind, reading.failures = "dsn", failures
            return reading
    if depth == 0 and letter.original is not None and _nested_bounce(letter.original):
        # The report returned a bounce (a bounce of a bounce): the inner one names them.
        inner = read(_as_bytes(letter.original), depth=1)
        if inner.failures:
            reading.kind, reading.failures = inner.kind, inner.failures
            reading.original_message_id = inner.original_message_id \
                or reading.original_message_id
            return reading
    failures = _text_bounce(letter, own, trailing)
    if failures:
        reading.kind, reading.failures = "bounce", failures
    elif letter.status_parts or (_DAEMON_FROM.search(letter.header("from"))
                                 and _BOUNCE_SUBJECT.search(subject)):
        reading.kind = "unreadable"
        reading.error = "a bounce report that names no recipient the reader can find"
    return reading


def read_safely(raw: bytes) -> Reading:
    """:func:`read`, but an exception becomes ``kind='unreadable'`` with its reason."""
    try:
        return read(raw)
    except RecursionError:
        return Reading("unreadable", error="the message is nested too deeply to read",
                       crashed=True)
    except Exception as exc:  # any input must leave the poll going
        return Reading("unreadable", error=f"{type(exc).__name__}: {exc}"[:500], crashed=True)
