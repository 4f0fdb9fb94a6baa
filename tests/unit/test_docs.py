"""Docs kept true by tests: what a newcomer reads first must match the code."""

from __future__ import annotations

from pathlib import Path

from workers.core.settings import SETTINGS, markdown_table, with_table

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_configuration_doc_is_the_generated_table() -> None:
    document = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert with_table(document) == document, (
        "docs/configuration.md is out of date: run "
        "`senddock config --write docs/configuration.md`")
    for setting in SETTINGS:
        assert f"`SENDDOCK_{setting.name}`" in document


def test_table_lists_every_setting_once() -> None:
    table = markdown_table()
    for setting in SETTINGS:
        assert table.count(f"`SENDDOCK_{setting.name}`") == 1
