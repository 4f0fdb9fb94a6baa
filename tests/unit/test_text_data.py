"""A translatable message stored as data and read back says the same in every language
(refused report files keep their reason this way: docs/design.md §30)."""

from __future__ import annotations

import orjson

from workers.core.i18n import N_, Text, text_from_data, text_to_data


def shout(msgid: str) -> str:
    return "¡" + msgid + "!"


def test_round_trip_keeps_the_message_its_parameters_and_parts() -> None:
    inner = N_("empty file")
    messages = [
        N_("file is larger than %(n)s MiB", n=25),
        N_("%(part)s: %(reason)s", part="a.xml", reason=inner),
        Text.joined("; ", [N_("%(part)s: %(reason)s", part="x", reason=inner), "raw words"]),
        Text.verbatim("a library's own words"),
    ]
    for message in messages:
        data = text_to_data(message)
        assert data is not None
        back = text_from_data(orjson.loads(orjson.dumps(data)))
        assert str(back) == str(message)
        assert back.say(shout) == message.say(shout)
    assert text_to_data("plain") is None
    assert N_("%(part)s: %(reason)s", part="x", reason=inner).say(shout) == "¡x: ¡empty file!!"
