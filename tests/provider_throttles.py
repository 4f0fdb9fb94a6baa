"""Throttle replies as the receiving providers document them (docs/design.md §17), each with the
public page it was taken from (IP addresses and recipients replaced by documentation
values). docs/reliability.md shows the same table; tests/unit/test_throttle_judge.py and
tests/integration/test_provider_throttles.py check every row."""

from __future__ import annotations

from typing import NamedTuple


class ProviderReply(NamedTuple):
    provider: str
    reply: str  # as the provider words it, at RCPT
    source: str


PROVIDER_THROTTLES: tuple[ProviderReply, ...] = (
    ProviderReply(
        "Gmail", "421 4.7.28 [192.0.2.1] Our system has detected an unusual rate of "
        "unsolicited mail originating from your IP address. To protect our users from spam, "
        "mail sent from your IP address has been temporarily rate limited. Please visit "
        "https://support.google.com/mail/?p=UnsolicitedRateLimitError to review our Bulk "
        "Email Senders Guidelines. - gsmtp",
        "https://smtp.codes/google"),
    ProviderReply(
        "Gmail", "450 4.2.1 The user you are trying to contact is receiving mail at a rate "
        "that prevents additional messages from being delivered. Please resend your message "
        "at a later time. If the user is able to receive mail at that time, your message "
        "will be delivered. - gsmtp",
        "https://support.google.com/a/answer/3726730"),
    ProviderReply(
        "Gmail", "450 4.2.1 The user you are trying to contact is receiving mail too "
        "quickly. Please resend your message at a later time. If the user is able to "
        "receive mail at that time, your message will be delivered.",
        "https://support.google.com/a/answer/3726730"),
    ProviderReply(
        "Gmail", "421 4.7.0 Try again later, closing connection.",
        "https://support.google.com/a/answer/3726730"),
    ProviderReply(
        "Yahoo", "421 4.7.0 [TSS04] Messages from 192.0.2.1 temporarily deferred due to "
        "unexpected volume or user complaints - 4.16.55.1; see "
        "https://postmaster.yahooinc.com/error-codes",
        "https://smtpfieldmanual.com/provider/yahoo/421/4.7.0"),
    ProviderReply(
        "Microsoft (Outlook.com)", "451 4.7.650 The mail server [192.0.2.1] has been "
        "temporarily rate limited due to IP reputation. For e-mail delivery information, "
        "see https://aka.ms/postmaster (S775)",
        "https://forum.directadmin.com/threads/hotmail-ip-has-been-temporarily-rate-limited-"
        "due-to-ip-reputation-for-e-mail-delivery-information-see-https-aka-ms-postmaster-"
        "s775.82240/post-400368"),
    ProviderReply(
        "Microsoft (Outlook.com)", "451 4.7.651 The mail server [192.0.2.1] has been "
        "temporarily rate limited due to IP reputation. For e-mail delivery information, "
        "see https://postmaster.live.com (S3114)",
        "https://www.suped.com/email-deliverability/answers/what-causes-temporary-rate-"
        "limiting-due-to-ip-reputation-with-microsoft-email-servers"),
    ProviderReply(
        "Microsoft 365", "451 4.7.500 Server busy. Please try again later",
        "https://support.office.com/en-ie/article/fix-email-delivery-issues-for-error-code-"
        "451-4-7-500-699-asxxx-in-office-365-51356082-9fef-4639-a18a-fc7c5beae0c8"),
    ProviderReply(
        "Apple (iCloud)", "421 4.7.1 Messages to s0@icloud.example deferred due to "
        "excessive volume. Try again later - https://support.apple.com/en-us/HT204137",
        "https://smtp.codes/icloud"),
    ProviderReply(
        "Apple (iCloud)", "451 4.7.1 Service unavailable - try again later",
        "https://smtp.codes/icloud"),
    ProviderReply(
        "Comcast", "421 4.1.0 192.0.2.1 Throttled - try again later",
        "https://www.suped.com/knowledge/email-deliverability/troubleshooting/what-should-"
        "i-do-about-comcast-throttling-and-deferral-errors"),
    ProviderReply(
        "Comcast", "421 Too many sessions opened",
        "https://mdpcontent-ho-1p-187062.sys.comcast.net/smtp-error-codes.php"),
    ProviderReply(
        "GMX / web.de", "421 web.de (mxweb113) Nemesis ESMTP Service not available Service "
        "unavailable Reject due to policy restrictions Please try again later. Too many "
        "messages have been received in a short period of time. Please try again in a few "
        "hours and reduce the sending rate.",
        "https://www.suped.com/learn/email-deliverability/how-to-resolve-smtp-421-errors-"
        "with-webde-and-gmxnet-due-to-rate-limiting"),
    ProviderReply(
        "Mimecast", "421 Unable to process connection at this time",
        "https://mimecastsupport.zendesk.com/hc/en-us/articles/34000709564691-Policies-"
        "Mimecast-SMTP-Error-Codes"),
    ProviderReply(
        "Proofpoint Essentials", "450 4.7.1 Sender address rejected",
        "https://wiki.hbscloudservices.com/wiki/Limits_Rate_for_Sending_%26_Receiving"),
)
