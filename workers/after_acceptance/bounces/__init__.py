"""Bounce mail as Sisimai reads it: every bounce gets a reason from a documented vocabulary
(:mod:`workers.after_acceptance.bounces.reasons`) and what SendDock does follows from the reason.

- :mod:`.mime`: reading any mail as text without raising (charsets, broken MIME, size);
- :mod:`.fields`: RFC 3464 delivery-status fields, read leniently;
- :mod:`.read`: the formats: Amazon SES notifications by mail, ARF complaints and
  Microsoft's JMRP, auto-replies (RFC 3834), DSNs (RFC 3464, broken ones too), and bounces
  in text (Postfix, Sendmail, Exim, qmail, Courier, Exchange, Gmail, Yahoo, OpenSMTPD,
  DragonFly, Japanese carriers…), recognised by their shape rather than by their software.
"""

from workers.after_acceptance.bounces.read import Failure, Reading, read, read_safely
from workers.after_acceptance.bounces.reasons import REASONS, VOCABULARY, label_of

__all__ = ["REASONS", "VOCABULARY", "Failure", "Reading", "label_of", "read", "read_safely"]
