"""Bounce reasons: the vocabulary, how a reason is found in a bounce, and what it means.

The vocabulary is Sisimai's (https://libsisimai.org/en/reason/), the bounce classifier with
the largest public corpus, so that a reason here means what it means there. A reason is
found from what the bounce says about one recipient: its enhanced status code (RFC 3463),
its SMTP reply code, the diagnostic text and the DSN action. The text is matched against
the phrases mail servers use for each reason (the phrases are facts about what Postfix,
Exim, Exchange, Gmail… write; the lists here are our own), in an order where the more
specific reason wins, then the status code decides, then the reply code's class.

What a reason *means* for SendDock (:data:`REASONS`):

- ``hard``: the address is dead: ``userunknown``, ``hostunknown``, ``hasmoved``, and
  ``notaccept`` with a permanent (5xx) code. Only these suppress at once (P5). (A bounce
  is the MTA's final word: a "450 4.1.1 user unknown" it gave up on is a dead address too.)
- ``sender``: the refusal is about us, not the recipient: a blocklist, our IP's reputation,
  our rate, our authentication or relaying (``blocked``, ``badreputation``, ``speeding``,
  ``toomanyconn``, ``norelaying``, ``authfailure``, ``requireptr``, ``rejected``,
  ``securityerror``, ``failedstarttls``). A sender alarm; never counted against the recipient.
- ``soft``: any other failure (mailbox full, filtered, spam detected, policy, expired…):
  counts toward the soft-bounce threshold.
- ``delay``: the MTA is still retrying (a delay notice): nothing to do.
- ``complaint`` (``feedback``) and ``ignore`` (``delivered``, ``vacation``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

HARD, SOFT, SENDER, DELAY, COMPLAINT, IGNORE = (
    "hard", "soft", "sender", "delay", "complaint", "ignore")


@dataclass(frozen=True)
class Reason:
    name: str
    effect: str   # HARD (only with a 5xx for notaccept), SOFT, SENDER, COMPLAINT, IGNORE
    label: str    # shown to people (translated where it is shown)


_R = [
    Reason("userunknown", HARD, "user unknown"),
    Reason("hostunknown", HARD, "domain does not exist"),
    Reason("hasmoved", HARD, "address has moved"),
    Reason("notaccept", HARD, "domain accepts no mail"),
    Reason("mailboxfull", SOFT, "mailbox full"),
    Reason("suspend", SOFT, "mailbox suspended"),
    Reason("filtered", SOFT, "refused by the recipient's filter"),
    Reason("spamdetected", SOFT, "content seen as spam"),
    Reason("virusdetected", SOFT, "virus detected"),
    Reason("policyviolation", SOFT, "refused by the recipient's policy"),
    Reason("contenterror", SOFT, "content refused"),
    Reason("notcompliantrfc", SOFT, "message not RFC compliant"),
    Reason("mesgtoobig", SOFT, "message too big"),
    Reason("exceedlimit", SOFT, "message exceeds a limit"),
    Reason("expired", SOFT, "delivery time expired"),
    Reason("systemerror", SOFT, "recipient's server error"),
    Reason("systemfull", SOFT, "recipient's server full"),
    Reason("networkerror", SOFT, "network error"),
    Reason("mailererror", SOFT, "mail program error"),
    Reason("syntaxerror", SOFT, "SMTP syntax error"),
    Reason("onhold", SOFT, "undetermined failure"),
    Reason("undefined", SOFT, "undetermined failure"),
    Reason("suppressed", SOFT, "suppressed by the provider"),
    Reason("blocked", SENDER, "blocked by a blocklist"),
    Reason("badreputation", SENDER, "sender reputation too low"),
    Reason("speeding", SENDER, "sending too fast"),
    Reason("toomanyconn", SENDER, "too many connections"),
    Reason("norelaying", SENDER, "relaying denied"),
    Reason("authfailure", SENDER, "SPF/DKIM/DMARC failure"),
    Reason("requireptr", SENDER, "reverse DNS missing"),
    Reason("rejected", SENDER, "sender address refused"),
    Reason("securityerror", SENDER, "security or authentication error"),
    Reason("failedstarttls", SENDER, "TLS required"),
    Reason("feedback", COMPLAINT, "complaint"),
    Reason("delivered", IGNORE, "delivered"),
    Reason("vacation", IGNORE, "auto-reply"),
]
REASONS: dict[str, Reason] = {r.name: r for r in _R}
VOCABULARY = tuple(REASONS)


def effect_of(reason: str, status: str | None = None, reply: str | None = None,
              *, delayed: bool = False) -> str:
    """What a bounce with this reason means: hard, soft, sender, delay, complaint, ignore."""
    entry = REASONS.get(reason, REASONS["undefined"])
    if entry.effect in (COMPLAINT, IGNORE):
        return entry.effect
    if delayed:
        return DELAY
    if reason == "notaccept" and (status or reply or "5")[:1] == "4":
        return SOFT  # a domain that accepts no mail *for now*
    return entry.effect


def label_of(reason: str) -> str:
    return REASONS.get(reason, REASONS["undefined"]).label


# --- the enhanced status codes (RFC 3463 and the IANA registry) --------------------------

_STATUS = {
    "1.0": "userunknown", "1.1": "userunknown", "1.2": "hostunknown", "1.3": "userunknown",
    "1.4": "filtered", "1.6": "hasmoved", "1.7": "rejected", "1.8": "rejected",
    "1.9": "systemerror", "1.10": "notaccept", "2.0": "filtered", "2.1": "filtered",
    "2.2": "mailboxfull", "2.3": "exceedlimit", "2.4": "filtered", "3.0": "systemerror",
    "3.1": "systemfull", "3.2": "notaccept", "3.3": "systemerror", "3.4": "mesgtoobig",
    "3.5": "systemerror", "4.0": "networkerror", "4.1": "expired", "4.2": "networkerror",
    "4.3": "systemerror", "4.4": "hostunknown", "4.5": "systemfull", "4.6": "networkerror",
    "4.7": "expired", "4.8": "networkerror", "5.2": "syntaxerror", "5.3": "toomanyconn",
    "5.4": "systemerror", "5.5": "systemerror", "5.6": "syntaxerror",
    "6.0": "contenterror", "6.1": "contenterror", "6.2": "contenterror",
    "6.3": "contenterror", "6.5": "contenterror", "6.6": "contenterror",
    "6.7": "contenterror", "6.8": "contenterror", "6.9": "contenterror",
    "7.0": "securityerror", "7.1": "securityerror", "7.2": "securityerror",
    "7.3": "securityerror", "7.4": "securityerror", "7.5": "securityerror",
    "7.6": "securityerror", "7.7": "securityerror", "7.8": "securityerror",
    "7.9": "securityerror", "7.10": "securityerror", "7.11": "securityerror",
    "7.13": "suspend", "7.14": "securityerror", "7.15": "securityerror",
    "7.16": "mesgtoobig", "7.17": "hasmoved", "7.18": "hasmoved", "7.19": "securityerror",
    "7.20": "authfailure", "7.21": "authfailure", "7.22": "authfailure",
    "7.23": "authfailure", "7.24": "authfailure", "7.25": "requireptr",
    "7.26": "authfailure", "7.27": "notaccept", "7.28": "spamdetected",
    "7.29": "authfailure", "7.30": "failedstarttls",
}
# Temporary (4.x.x) codes whose meaning differs from their permanent twin.
_STATUS_4 = {"1.0": "", "1.1": "", "1.3": "", "2.0": "", "2.1": "blocked",
             "3.0": "", "4.0": "", "5.0": "", "7.0": "", "7.1": "blocked", "7.2": "blocked",
             "5.3": "systemerror", "4.1": "expired", "4.7": "expired"}


def status_reason(status: str | None) -> str:
    """The reason an enhanced status code names ('' for none, x.0.0 and 2.x.x)."""
    if not status or not STATUS_RE.fullmatch(status):
        return ""
    cls, rest = status.split(".", 1)
    if cls == "2":
        return "delivered"
    if cls == "4" and rest in _STATUS_4:
        return _STATUS_4[rest]
    return _STATUS.get(rest, "")


_SECURITY_STATUS = re.compile(r"(?<![\d.])[45]\.7\.\d{1,3}(?![\d.]\d)")
STATUS_RE = re.compile(r"[245]\.\d{1,3}\.\d{1,3}")
STATUS_IN_TEXT = re.compile(r"(?<![\d.#])#?([245]\.\d{1,3}\.\d{1,3})(?![\d.]\d)")
REPLY_IN_TEXT = re.compile(r"(?<![\d.\w])([245][0-5]\d)(?=[\s-]|$)")


def find_status(text: str) -> str:
    """The first failure's enhanced status code in ``text`` (4.x.x or 5.x.x), preferring
    one that is not x.0.0; else the first code there is."""
    found = [m[1] for m in STATUS_IN_TEXT.finditer(text or "")]
    failed = [s for s in found if s[0] in "45"]  # a transcript's 2.x.x lines said "ok"
    good = [s for s in failed if not s.endswith(".0.0")]
    return (good or failed or found or [""])[0]


def find_reply(text: str) -> str:
    found = REPLY_IN_TEXT.search(text or "")
    return found[1] if found else ""


# --- the phrases ---------------------------------------------------------------------------


def _rx(*phrases: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in phrases))


P = {
    "mailboxfull": _rx(
        r"mail ?box (?:is |was )?full", r"full mailbox", r"mailbox (?:has )?exceeded",
        r"mailfolder is full",
        r"over (?:the (?:allowed )?)?(?:disk )?quota",
        r"quota (?:exceeded|violation|usage exceeded)",
        r"exceed(?:ed|ing|s)? (?:their |its |the |his )?(?:mailbox |storage |disk )?"
        r"(?:quota|storage allocation)",
        r"(?:insufficient|not enough|not sufficient) (?:disk|storage) space", r"no space left",
        r"disc quota", r"diskspace quota", r"does not have enough space", r"quota (?:full|limit)",
        r"too much mail data", r"too many messages on the server", r"boite du destinataire pleine",
        r"space has been used up", r"mailbox size limit",
        r"maildir (?:over quota|delivery failed: (?:user|domain)disk quota)",
        r"would exceed (?:the )?maximum allowed storage",
        r"mailbox (?:is )?over (?:its )?(?:quota|limit)",
        r"recipient reached disk quota", r"mail file size exceeds",
        r"receiving limits"),
    "mesgtoobig": _rx(
        r"message (?:size|length) exceeds", r"(?:message|mail) (?:file )?too (?:big|large)",
        r"max(?:imum)? (?:inbound |incoming )?message size", r"size limit", r"line limit exceeded",
        r"taille limite du message"),
    "exceedlimit": _rx(r"message length exceeds administrative limit"),
    "suspend": _rx(
        r"(?:is|been|currently) (?:temporarily )?suspended", r"temporar(?:y|ily) locked",
        r"archived recipient", r"boite du destinataire archivee",
        r"mailbox (?:is )?(?:disabled|frozen)",
        r"account (?:has been |is )?(?:disabled|discontinued|inactive|locked)", r"inactive account",
        r"invalid/inactive user", r"deactivated mailbox", r"user is terminated", r"user suspended",
        r"temporarily inactive", r"suspend the service", r"user or domain is disabled",
        r"this mailbox is disabled", r"email account that you tried to reach is disabled",
        r"mailbox unavailable or access denied", r"no longer accepts mail"),
    "hasmoved": _rx(r" has been replaced by "),
    "norelaying": _rx(
        r"relay(?:ing)? (?:access )?(?:denied|not permitted|prohibited)", r"no relaying",
        r"not (?:allowed|permitted) to relay", r"unable to relay", r"as a relay",
        r"insecure mail relay", r"not an open relay", r"not configured to relay",
        r"we don'?t handle mail for", r"relaying mail to ",
        r"requires authentication when attempting to send to a non-local",
        r"not a gateway", r"not local host", r"specified domain is not allowed",
        r"isn'?t in my list of allowed rcpthosts?"),
    "authfailure": _rx(
        r"\bdmarc\b.{0,20}\bfail", r"authentication checks failed",
        r"does not have authentication information", r"fails to pass authentication",
        r"dmarc polic", r"\bspf\b.{0,30}\b(?:fail|violation|record)", r"sender policy framework",
        r"spf\.pobox\.com", r"per it'?s spf record",
        r"unauthenticated email from .{0,80} is not accepted"),
    "userunknown": _rx(
        r"user(?:name)? (?:is )?(?:unknown|not (?:found|known|exist|active))",
        r"unknown (?:user|recipient|mailbox|local ?part|e-?mail address|address|account)",
        r"(?:user|recipient|mailbox|address|account|addressee) "
        r"(?:does not|doesn'?t|did not) exists?",
        r"(?:recipient|mailbox|user|address|addressee)(?: name)? (?:is )?"
        r"(?:not (?:found|exist|known|valid|local)|unknown|invalid|not recognized|unavailable)",
        r"no (?:such|valid) (?:user|recipient|mailbox|address|person|account)s?\b",
        r"invalid (?:recipient|mailbox|address|user)",
        r"mailbox (?:not present|unavaiable|is inactive)",
        r"not a (?:valid|known) (?:user|recipient|mailbox)", r"is not a known user",
        r"not a local address",
        r"address (?:does not exist|unknown|not present|invalid|rejected\.)",
        r"bad (?:destination )?(?:mailbox|address|recipient)",
        r"no mailbox (?:here|found|by that name)", r"no account by that name", r"nonexistent user",
        r"non-existent (?:user|address|recipient|mailbox)", r"no one at this address",
        r"no mail ?box available", r"can'?t accept user", r"badrcptto", r"validrcptto",
        r"badrecipientto", r"envelope recipient has been denied", r"recipient not ok",
        r"recipient refuses to accept your mail", r"not email addresses",
        r"destination addresses were unknown",
        r"destination server rejected recipients",
        r"email address (?:does not exist|could not be found|is wrong)",
        r"the email account that you tried to reach does not exist",
        r"resolver\.adr\.recipient ?notfound",
        r"recipient address rejected: "
        r"(?:invalid|unknown|user ?unknown|access denied|invalid-recipient|undeliverable)",
        r"user .{1,80} (?:was not found|does not exist)", r"user \(.{1,80}\) unknown",
        r"account .{1,80} does not exist", r"recipient .{1,80} was not found in",
        r"<[^>]{1,80}> not found",
        r"mailbox .{0,80}does not exist", r"mailbox unavailable",
        r"requested action not taken: mailbox unavailable",
        r"not our customer", r"no such (?:user|mailbox|recipient)", r"utilisateur inconnu",
        r"no existe (?:dicha persona|ese usuario)", r"nessun utente",
        r"user missing home directory",
        r"vdeliver: invalid or unknown virtual user", r"the user'?s email name is not found",
        r"this spectator does not exist", r"recipient address rejected\. \(in reply to rcpt to",
        r"the following recipients was undeliverable", r"address not present in directory",
        r"is not an active address", r"recipient is not (?:local|accepted)",
        r"that domain or user isn'?t in my list", r"account unavailable",
        r"no mailbox with that name",
        r"delivery error: dd this user doesn'?t have", r"550 address invalid",
        r"mailbox name not allowed",
        r"unknown or illegal alias", r"invalid final delivery userid",
        r"not listed in (?:the )?(?:domino directory|public name & address book)",
        r"please check if (?:the )?address is correct", r"addressee unknown",
        r"user doesn'?t exist",
        r"mailbox does not exist"),
    "filtered": _rx(
        r"this user doesn'?t have a .{1,40} account",
        r"only accepting mail from specific", r"bounced address", r"extended inactivity new mail",
        r"restricted sms e-?mail", r"is not accepting any mail", r"message filtered",
        r"rejected due to user rules", r"not found recipient account",
        r"refused due to recipient preferences",
        r"resolver\.rst\.notauthorized", r"this account is protected by",
        r"user refuses to receive",
        r"user reject", r"refuse to receive mail", r"blocked by the recipient"),
    "requireptr": _rx(
        r"\bptr record", r"reverse dns", r"ip name lookup failed", r"cannot find your hostname",
        r"cannot resolve your address", r"unresolvable relay host name", r"generic dns ptr",
        r"reverse lookup rejected", r"mismatches client ip", r"invalid rdns",
        r"unverifyable sending ips",
        r"forward dns entry does not point to the sending ip"),
    "notcompliantrfc": _rx(
        r"not rfc ?5322 compliant", r"rfcmessagenoncompliant", r" multiple .{1,30} header"),
    "badreputation": _rx(
        r"poor (?:email )?reputation", r"ip reputation", r"reputation problems", r"low reputation",
        r"none/bad reputation", r"unexpected volume or user complaints"),
    "contenterror": _rx(
        r"duplicate header", r"header size exceeds", r"8-bit data in message header",
        r"mime complexity", r"invalid mime headers", r"improperly-formatted binary",
        r"unnecessary base64", r"too many received: headers"),
    "rejected": _rx(
        r"sender (?:address |email address |ip address )?(?:rejected|was rejected|is spammer|"
        r"not pre-approved|verify failed|domain is empty)",
        r"address rejected: (?:domain not found|sender)", r"domain of sender address",
        r"invalid sender",
        r"bogus mail from", r"null sender is not allowed", r"empty envelope senders",
        r"unroutable sender",
        r"mail from not owned by user", r"administrative prohibition", r"batv",
        r"no third-party dsns",
        r"unsigned dsn", r"backscatter", r"sender (?:address )?has been blacklisted",
        r"sender is in my black ?list",
        r"envelope blocked", r"email address is not verified", r"not a registered gateway user",
        r"access denied \((?:in reply to mail from|sender blacklisted)", r"denied \[bouncedeny\]",
        r"fully qualified email address required", r"returned mail not accepted here",
        r"you are not allowed to post to this mailing list",
        r"your email address has been blacklisted",
        r"sending to/from an address that has been blacklisted", r"does not accept mail from",
        r"senderfilterconfig", r"emetteur invalide", r"spam reporting address",
        r"can'?t determine purported responsible address", r"from: domain is invalid",
        r"without a valid sender domain", r"sending this from a different address",
        r"secumail valid-address-filter", r"rule imposed mailbox access for"),
    "hostunknown": _rx(
        r"(?:domain|host)(?: name)? "
        r"(?:does not exist|not found|unknown|is not reachable|unreachable)",
        r"no such domain", r"unknown (?:host|domain)", r"host or domain name not found",
        r"domain must exist", r"name or service not known", r"unrout(?:e)?able address",
        r"mail domain mentioned in email address is unknown", r"account or domain may not exist",
        r"unknown domain name", r"dns lookup failure: host \S+ not found",
        r"553 .{1,80} does not exist"),
    "spamdetected": _rx(
        r"(?:detected|identified|classified|considered|marked|rejected|scored|flagged|"
        r"regarded|recognized|treated) as (?:probable |possible )?spam",
        r"spam (?:detected|message|content|filter|check|score|email|mail|blocked|rejection|"
        r"refused|not accepted|points)", r"(?:looks|appears to be|seems to be|is probably|is|"
        r"be) (?:like )?spam\b", r"spam-like", r"probable spam", r"high probability of spam",
        r"\(spam\)", r" - spam\b", r"no spam please", r"we dont accept spam", r"too much spam",
        r"spamming not allowed", r"spam complaints", r"help_spam", r"unsolicited",
        r"bulk (?:e-?mail|mail|\.advertising)",
        r"content filter rejection", r"rejecting (?:banned|mail) content", r"mail content denied",
        r"message content rejected", r"unacceptable content", r"rejected for policy reasons",
        r"rejected as spam", r"spamassassin", r"spam score", r"probability of being spam",
        r"recurrent pattern detection", r"uribl", r"antispam", r"greylisted.{0,40}please try again",
        r"554 5\.7\.0 reject, id=", r"mail score \(", r"blacklisted url", r"spamprofiler",
        r"has been temporarily blocked by our filter", r"this message scored .{1,40} points",
        r"our system has detected that this message is", r"identified as spam",
        r"classified as spam"),
    "speeding": _rx(r"temporarily rate limited", r"try again slower", r"receiving mail at a rate",
                    r"rate limit(?:ed)? ", r"sending rate exceeded",
                    r"too many (?:messages|emails) (?:from|sent)"),
    "toomanyconn": _rx(
        r"too many (?:connections|concurrent|smtp sessions|errors from your ip|recipients)",
        r"maximum connection limit", r"connection rate limit", r"per-domain connection limit",
        r"max emails per hour", r"throttling failure", r"trop de connexions",
        r"connection frequency limited",
        r"numerous attempts to deliver"),
    "blocked": _rx(
        r"blacklist(?:ed)?\b", r"black list", r"blocklist", r"block list", r"\bdnsbl\b", r"\brbl\b",
        r"spamhaus", r"spamcop", r"barracudacentral", r"abuseat\.org", r"sorbs", r"blocked using",
        r"invalid ip for sending", r"client host blocked", r"ip source bloquee", r"blocked ip\b",
        r"(?:client|sender|bad|sending|your) (?:host|ip)(?: address)? .{0,60}"
        r"(?:rejected|blocked|listed|refused)",
        r"\bip\b.{0,60}\b(?:is )?(?:blocked|listed|banned|rejected)", r"banned sending ip",
        r"connection (?:refused|dropped|reset|was dropped)", r"helo command rejected",
        r"dynamic (?:ip|/zombied)", r"dynamic ips", r"your isp", r"host network not allowed",
        r"not accepting connections", r"go away", r"not allowed to connect",
        r"you are sending spam",
        r"open proxy", r"looks suspiciously like spammer", r"was blocked by ", r"blocked - see",
        r"refused - see", r"refused to talk to me", r"access denied.{0,40}\bip\b",
        r"currently sending spam", r"no access from mail server", r"confirm this mail server",
        r"mail from .{1,80} refused", r"multi-blacklist", r"said: 550 blocked",
        r"not currently accepting mail from your ip", r"is not allowed to send mail from",
        r"service refused, please try later", r"has not passed validation", r"abus detecte",
        r"client host rejected", r"to submit messages to this e-mail system has been rejected",
        r"smtp error from remote mail server after initial connection",
        r"service not available, closing transmission channel",
        r"too many unwanted messages", r"(?:^|\W):blocked\)"),
    # second round (when the first found nothing explicit)
    "policyviolation": _rx(
        r"illegal attachment", r"not accepting mail with ", r"members-only list",
        r"closed mailing list",
        r"denied by policy", r"(?:not accepted|rejected) (?:for|due to) (?:local |security )?polic",
        r"local policy violation", r"organizational settings", r"low priority",
        r"header are not accepted",
        r"header error", r"messages with multiple addresses", r"protocol violation",
        r"rejected by organization policy", r"content presents a potential",
        r"containing images or other attachments", r"mass mailer", r"not subscribed to this group",
        r"without solving a captcha"),
    "virusdetected": _rx(
        r"virus (?:detected|found)", r"(?:infected with|contains?|containing) (?:a )?virus",
        r"virus or spam content", r"malicious_url", r"potentially executable attachment",
        r"used by recent viruses"),
    "systemerror": _rx(
        r"forwarding loop", r"mail loop", r"loops back to myself", r"loop was found",
        r"can'?t create user output file", r"could not load drd", r"internal (?:server )?error",
        r"configuration error", r"config error", r"local error in processing",
        r"queue file write error",
        r"there is no mdb", r"misconfigured", r"service currently unavailable",
        r"temporary local problem",
        r"timeout waiting for input", r"transaction failed ", r"unable to connect .{1,40}daemon",
        r"interrupted system call", r"error while being processed"),
    "networkerror": _rx(
        r"dns error", r"\bnxdomain\b", r"could not connect and send",
        r"dns records for the destination", r"hop count exceeded",
        r"host is unreachable", r"host name lookup failure", r"host not found, try again",
        r"name server reply", r"routing loop", r"message looping", r"no route to host",
        r"too many hops", r"unable to resolve route", r"unrouteable mail domain"),
    "systemfull": _rx(r"mail system full", r"exceeded storage allocation"),
    "notaccept": _rx(
        r"does not accept mail", r"mail receiving disabled", r"host not found", r"null ?mx",
        r"no mx record found", r"no route for current request",
        r"smtp protocol returned a permanent error"),
    "expired": _rx(
        r"connection timed out", r"could not find a gateway", r"delivery attempts will continue",
        r"delivery (?:time )?expired", r"failed to deliver to domain", r"giving up on",
        r"failing for a long time", r"has been delayed", r"not been collected after",
        r"expired after sitting in queue", r"message expired", r"message timed out",
        r"retry time not reached", r"server did not respond", r"in the queue too long",
        r"after multiple retries", r"allowed queue period",
        r"could not be delivered for (?:more than )?\d",
        r"retry timeout exceeded", r"(?:delivery|message) (?:has been )?delayed",
        r"still (?:being )?(?:retried|trying)", r"could not be delivered within"),
    "securityerror": _rx(
        r"account not subscribed to ses", r"turn on smtp authentication",
        r"authentication (?:credentials invalid|failure|required|failed)",
        r"authentication turned on", r"executable files are not allowed",
        r"unauthenticated senders",
        r"verification failure", r"not authorized to send mail", r"is a dead domain",
        r"not authorized to perform ses", r"authentification"),
    "failedstarttls": _rx(
        r"starttls", r"requiretls", r"must issue a starttls", r"encryption required",
        r"does not support tls"),
    "mailererror": _rx(
        r" \|\| exit ", r"procmail", r"maildrop", r"command failed", r"command died with status",
        r"command output:", r"mailer error", r"pipe to \|", r"x-unix;", r"mail for .{1,40} loops",
        r"(?:^|\W)\|/"),
    "vacation": _rx(
        r"out of (?:the )?office", r"auto-?reply", r"on vacation", r"away from (?:the|my) office"),
}

# The order the phrases are tried in: the more specific reasons first.
FIRST = ("mailboxfull", "mesgtoobig", "exceedlimit", "suspend", "hasmoved", "norelaying",
         "authfailure", "userunknown", "filtered", "requireptr", "notcompliantrfc",
         "badreputation", "contenterror", "rejected", "hostunknown", "spamdetected",
         "speeding", "toomanyconn", "blocked")
SECOND = ("mailboxfull", "authfailure", "badreputation", "speeding", "spamdetected",
          "virusdetected", "policyviolation", "norelaying", "systemerror", "networkerror",
          "suspend", "contenterror", "systemfull", "notaccept", "expired", "failedstarttls",
          "securityerror", "mailererror")
# Reasons a status code alone names that the phrases may overrule.
_RETRY = {"", "undefined", "onhold", "systemerror", "securityerror", "expired",
          "networkerror", "hostunknown", "userunknown"}
# What "5.1.1" does not mean when the text says so instead.
_NOT_UNKNOWN = ("norelaying", "blocked", "mailboxfull", "hasmoved", "rejected", "notaccept",
                "suspend", "filtered", "spamdetected", "toomanyconn", "speeding",
                "badreputation", "authfailure", "requireptr", "policyviolation", "virusdetected")


_UNKNOWN_SURELY = _rx(
    r"the recipient name is not recognized", r"\bunknown recipient\b", r"unknown user:",
    r"invalid final delivery userid", r"not listed in (?:the )?(?:domino directory|public name)",
    r"unable to deliver message to <[^>]+> \(and other recipients in the same domain\)",
    r"no mailbox here by that name", r"no such user here", r"delivery error: dd this user",
    r"because the address couldn'?t be found\. check for typos",
    r"adresse (?:d.{0,20})?destinataire invalide",
    r"requested action not taken: mailbox unavailable \(-?\d",
    r"<[^<>\s]+@[^<>\s]+>:? ?(?:user unknown|unknown user)",
    r"mailbox not found", r"user not found", r"no such (?:recipient|mailbox)",
    r"resolver\.adr\.(?:ex)?recip(?:ient)?notfound",
    r"reason: 5\d\d \S+@\S+\.\.\. no such user",  # MessageLabs: the reply it got
    r"(?:recipient|mailbox|address) does not exist", r"user (?:does not|doesn'?t) exist")
_NO_ADDRESS = re.compile(r"\b[45]\d\d:?\s*(?:<>)?\s*:\s*(?:user|recipient|address)")


def surely_unknown(text: str) -> bool:
    """The text uses a format's own words for "no such user" (see ``_UNKNOWN_SURELY``)."""
    text = " ".join(text.lower().split())
    return bool(_UNKNOWN_SURELY.search(text)) and not _NO_ADDRESS.search(text)


def matches(reason: str, text: str) -> bool:
    pattern = P.get(reason)
    return bool(pattern and pattern.search(text))


def find_reason(diagnostic: str, status: str | None = None, reply: str | None = None, *,
                action: str | None = None, command: str | None = None) -> str:
    """The reason for one recipient's failure, from its diagnostic text, enhanced status,
    reply code, DSN action and the SMTP command it failed at (when known)."""
    text = " ".join((diagnostic or "").lower().split())
    status = status or find_status(text)
    reply = reply or find_reply(text)
    named = status_reason(status)
    if named == "delivered" and not (reply or "").startswith(("4", "5")):
        return "delivered"
    command = (command or "").upper()
    found = _find(text, status, named, reply, action, command)
    if command == "MAIL" and found in ("userunknown", "hostunknown"):
        return "rejected"  # refused at MAIL FROM: the sender's address, not the recipient's
    return found


def _find(text: str, status: str, named: str, reply: str, action: str | None,
          command: str) -> str:
    temporary = status.startswith("4")
    for reason in FIRST:
        if _probe(reason, text, named, reply, command, temporary):
            return reason
    for reason in SECOND:
        if matches(reason, text):
            return reason
    if named in ("userunknown", "hostunknown"):
        # The status says the address, the text says otherwise: the text is more precise.
        other = next((r for r in _NOT_UNKNOWN if matches(r, text)), "")
        if other:
            return other
        security = _SECURITY_STATUS.search(text)
        if security and named == "userunknown":
            return status_reason(security[0]) or "securityerror"
    if named and named != "delivered":
        return named
    major = status[:3] if status else ""
    if major in ("5.6", "4.6"):
        return "contenterror"
    if major in ("5.7", "4.7"):
        return "securityerror"
    if (action or "").lower() in ("delayed", "expired"):
        return "expired"
    if command in ("EHLO", "HELO", "CONN"):
        return "blocked"
    if matches("vacation", text):
        return "vacation"
    return "onhold" if text else "undefined"


def _probe(reason: str, text: str, named: str, reply: str | None, command: str,
           temporary: bool = False) -> bool:
    if reason == "userunknown":
        # Refused at MAIL FROM, or with a security status (5.7.x) anywhere in the reply:
        # about the sender or a policy, not the address (P5).
        if named == "suspend" or command == "MAIL" or _SECURITY_STATUS.search(text):
            return False
        if named == "userunknown":
            return not any(matches(r, text) for r in _NOT_UNKNOWN)
        # Without a 5.1.x status, "user unknown" means the address only when it was the
        # answer to RCPT TO; after DATA it is a filter's answer (Japanese carriers, Exchange).
        # A rejection that names no recipient ("550 : User unknown") came after DATA.
        if command == "RCPT":
            return matches(reason, text)
        # No command and no address status: only a format's own words for "no such user"
        # (Exchange, Notes, IMail, qmail…) or a rejection naming the address ("550 <a@b>:
        # User unknown", answered at RCPT) say the address is dead. A bare "user unknown"
        # may be a filter's answer after DATA: Sisimai reads it as ``filtered``.
        if named in ("", "undefined", "onhold", "expired", "networkerror", "systemerror",
                     "notaccept") and command in ("", "DATA") and not _NO_ADDRESS.search(text):
            return bool(_UNKNOWN_SURELY.search(text))
        return False
    if reason == "hostunknown":
        if named == "hostunknown":
            return not matches("networkerror", text)
        # A name server's temporary answer (4.x.x: "DNS Error … NXDOMAIN" from Gmail) is a
        # network error, not a domain that does not exist.
        return matches(reason, text) and not matches("networkerror", text) and \
            not temporary
    if reason == "filtered":
        if named == "suspend":
            return False
        if named == "filtered":
            return matches("userunknown", text) or matches("filtered", text)
        if command in ("CONN", "EHLO", "HELO", "MAIL", "RCPT"):
            return False
        # "User unknown" that is not a dead address (after DATA, no 5.1.x): a filter; but
        # not where a security status (5.7.x) says what the refusal was.
        return matches("filtered", text) or (matches("userunknown", text)
                                             and not _SECURITY_STATUS.search(text))
    if reason == "hasmoved" and named == "hasmoved":
        return True  # 5.1.6: "mailbox has moved, no forwarding address"
    if reason == "suspend" and reply == "525":
        return True
    if reason == "mesgtoobig":
        if named == "mesgtoobig":
            return True
        if named == "exceedlimit":
            return False
        return matches(reason, text)
    if reason == "spamdetected":
        if named == "spamdetected":
            return True
        if command in ("CONN", "EHLO", "HELO", "MAIL", "RCPT"):
            return False
        return matches(reason, text)
    if reason == "rejected":
        if named == "rejected":
            return True
        if command == "MAIL" or named != "userunknown":
            return matches(reason, text)
        return False
    if reason == "norelaying" and command in ("CONN", "EHLO", "HELO"):
        return False
    if reason in ("mailboxfull", "exceedlimit", "toomanyconn", "blocked", "requireptr",
                  "authfailure", "contenterror") and named == reason:
        return True
    return matches(reason, text)
