"""Every stored word a page shows (a job's state, its error class, a subscriber's status)
has a Spanish label: the crawl in tests/integration/test_spanish_pages.py finds English
fragments of three words or more, and these words are one or two, so they are checked
here, one by one, against the catalogue."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from babel.messages.pofile import read_po

from webapp.domain import subscriptions
from webapp.i18n import VOCABULARY
from workers.core.states import KINDS, STATES
from workers.delivery.classify import ReplyClass

CATALOG = Path(__file__).resolve().parents[2] / "translations" / "es" / "LC_MESSAGES" / \
    "messages.po"
# Error classes SendDock writes itself besides the reply classes (workers/queue/).
ENGINE_CLASSES = ("orphan", "dropped", "relay", "cancelled", "build", "unknown")
SUBSCRIBER_STATUSES = ("active", "unsubscribed", "blocklisted")
# Kinds: the engine's and the built-in transactional ones (queue health's table, the event
# webhooks' form; "sequence" and "subscription_confirmation" showed as stored in Spanish).
BUILT_IN_KINDS = (*KINDS, subscriptions.KIND)
WORDS = sorted({*STATES, *(c.value for c in ReplyClass), *ENGINE_CLASSES,
                *SUBSCRIBER_STATUSES, *BUILT_IN_KINDS})


def _spanish() -> dict[str, str]:
    with CATALOG.open("rb") as handle:
        catalog = read_po(handle)
    return {str(m.id): str(m.string) for m in catalog if m.id and isinstance(m.id, str)}


@pytest.mark.parametrize("word", WORDS)
def test_the_word_has_a_label_and_a_spanish_translation(word: str) -> None:
    assert word in VOCABULARY, f"{word!r} would reach pages untranslated: add it to " \
        "webapp/i18n.py VOCABULARY"
    english = str(VOCABULARY[word]._args[0])  # type: ignore[attr-defined]
    assert _spanish().get(english), f"no Spanish for {english!r} in messages.po"


def test_built_in_kind_descriptions_are_shown_in_spanish() -> None:
    """The migrations store the built-in kinds' descriptions in English; the transactional
    page showed them so on Spanish pages. Each is a key of BUILT_IN_DESCRIPTIONS, with its
    Spanish in the catalogue."""
    from webapp.i18n import BUILT_IN_DESCRIPTIONS

    migrations = Path(__file__).resolve().parents[2] / "migrations" / "versions"
    insert = re.compile(r"INSERT INTO kinds .*?VALUES \('\w+', '\w+',\s*'([^']+)'", re.S)
    stored = [text for path in sorted(migrations.glob("*.py"))
              for text in insert.findall(path.read_text(encoding="utf-8"))]
    assert len(stored) >= 2, stored
    spanish = _spanish()
    for text in stored:
        assert text in BUILT_IN_DESCRIPTIONS, f"{text!r}: add it to BUILT_IN_DESCRIPTIONS"
        english = str(BUILT_IN_DESCRIPTIONS[text]._args[0])  # type: ignore[attr-defined]
        assert spanish.get(english) not in (None, "", english), f"no Spanish for {english!r}"
