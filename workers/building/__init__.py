"""Building a message: the kinds of mail (kinds), campaign templates and MIME (message,
compose, html_text, mail_templates/), tracking and unsubscribe links (links) and DKIM
signing (dkim)."""
