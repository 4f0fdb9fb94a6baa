"""Messages that the engine and the domain code build and the UI shows in the reader's
language (docs/design.md §25), without the engine importing Flask or the web app.

``N_("the template has %(tags)s tags", tags=n)`` marks the English text for extraction
(``pybabel extract -k N_``, see ``babel.cfg``) and returns a :class:`Text`: a ``str`` that
*is* the English sentence, so the API, the CLI and the logs use it as they always did
(API messages stay English: they are a contract), and that remembers its message id and
parameters, so the web layer (``webapp.i18n.localize``) can say it in the page's
language at display time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

Translate = Callable[[str], str]


def _english_number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


class Text(str):
    """An English message that can be said again in another language.

    Parameters may be integers (each language groups digits its own way), plain strings
    (names, addresses, DNS records: shown as they are) or other :class:`Text` (translated
    with the message).
    """

    msgid: str
    params: Mapping[str, Any]
    parts: tuple[Text, ...]
    separator: str

    def __new__(cls, msgid: str, /, **params: Any) -> Text:
        english = msgid % {k: _english_number(v) for k, v in params.items()} if params \
            else msgid
        text = super().__new__(cls, english)
        text.msgid, text.params, text.parts, text.separator = msgid, params, (), ""
        return text

    @classmethod
    def joined(cls, separator: str, parts: Iterable[str]) -> Text:
        """Several messages shown as one ("a; b"), each translated on its own."""
        items = tuple(p if isinstance(p, Text) else Text.verbatim(p) for p in parts)
        text = super().__new__(cls, separator.join(items))
        text.msgid, text.params, text.parts, text.separator = "", {}, items, separator
        return text

    @classmethod
    def verbatim(cls, words: str) -> Text:
        """Words that are not translated (a library's own message, a record, a name)."""
        text = super().__new__(cls, words)
        text.msgid, text.params, text.parts, text.separator = "", {}, (), ""
        return text

    def say(self, gettext: Translate, number: Callable[[Any], str] = _english_number
                  ) -> str:
        """This message in the language ``gettext`` speaks; numbers written by ``number``."""
        if self.parts:
            return self.separator.join(p.say(gettext, number) for p in self.parts)
        if not self.msgid:
            return str.__str__(self)
        if not self.params:
            return gettext(self.msgid)
        values = {k: v.say(gettext, number) if isinstance(v, Text)
                  else number(v) if isinstance(v, int) and not isinstance(v, bool)
                  else v for k, v in self.params.items()}
        return gettext(self.msgid) % values

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (a multiprocessing pool, a cache) it stays a plain English string.
        return (str, (str.__str__(self),))


def N_(msgid: str, /, **params: Any) -> Text:
    """Mark ``msgid`` for translation; returns the English :class:`Text`."""
    return Text(msgid, **params)


def word(value: str) -> Text:
    """A stored vocabulary word (a state, a role, a kind) as a parameter: shown translated
    when the catalog has it (webapp.i18n.VOCABULARY marks them), else as it is."""
    return Text(value)


def message_of(exc: BaseException) -> str:
    """An exception's message, still translatable when it was raised with a :class:`Text`
    (``str(exc)`` would be a plain copy)."""
    first = exc.args[0] if exc.args else None
    return first if isinstance(first, Text) else str(exc) or type(exc).__name__


def text_to_data(message: str) -> dict[str, Any] | None:
    """A :class:`Text` as JSON-able data, to be said again later in the reader's language
    (:func:`text_from_data`); None for a plain string."""
    if not isinstance(message, Text):
        return None
    if message.parts:
        return {"separator": message.separator,
                "parts": [text_to_data(p) or {"verbatim": str(p)} for p in message.parts]}
    if not message.msgid:
        return {"verbatim": str.__str__(message)}
    return {"msgid": message.msgid,
            "params": {k: text_to_data(v) or {"verbatim": v} if isinstance(v, Text)
                       else v for k, v in message.params.items()}}


def text_from_data(data: Mapping[str, Any]) -> Text:
    """The :class:`Text` that :func:`text_to_data` stored."""
    if "parts" in data:
        return Text.joined(str(data.get("separator", "")),
                           [text_from_data(p) for p in data["parts"]])
    if "msgid" in data:
        return Text(str(data["msgid"]), **{
            k: text_from_data(v) if isinstance(v, Mapping) else v
            for k, v in dict(data.get("params") or {}).items()})
    return Text.verbatim(str(data.get("verbatim", "")))
