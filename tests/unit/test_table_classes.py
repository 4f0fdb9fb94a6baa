"""Every data table of the UI is a ``table.grid`` (static/css/app.css: full width, muted
uppercase headings, lines between rows, numbers on the right): the screenshot pass found
the sequences' list and funnel, a person's enrollments, the saved layouts and the saved
segments drawn as bare HTML tables. A table that is part of a form says so by its class."""

from __future__ import annotations

import re
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
# Not the UI's data tables: the engine's mail, and the segment editor's condition rows.
SKIP_DIRS = {"mail"}
FORM_TABLES = {"conditions"}
TABLE = re.compile(r"<table\b([^>]*)>")
CLASSES = re.compile(r'\bclass="([^"]*)"')


def test_every_data_table_is_a_grid() -> None:
    seen, bare = 0, []
    for path in sorted(TEMPLATES.rglob("*.html")):
        if path.relative_to(TEMPLATES).parts[0] in SKIP_DIRS:
            continue
        for attributes in TABLE.findall(path.read_text(encoding="utf-8")):
            seen += 1
            found = CLASSES.search(attributes)
            classes = set(found.group(1).split()) if found else set()
            if "grid" not in classes and not classes & FORM_TABLES:
                bare.append(f"{path.relative_to(TEMPLATES)}: <table{attributes}>")
    assert seen >= 40, seen
    assert not bare, "tables without class grid:\n" + "\n".join(bare)
