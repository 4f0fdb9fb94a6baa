"""Every citation in the repository resolves inside it (docs/design.md, introduction).

Code, templates, docs and tests cite the design document as ``docs/design.md §N``; a cited
section must exist. Nothing cites a document outside the repository: no product brief by
name or section, no path into a sibling directory, no issue number (the tracker is not in
the clone; say what the code does, or cite the section that does). (The bounce corpus's
default location, ``../shared/corpora/``, is data the tests read, not a document cited; it
can be moved with ``SENDDOCK_BOUNCE_CORPUS``.)
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"

# Built from pieces so this file does not match its own patterns.
_BRIEF = "SP" + "EC"
OUTSIDE = [
    (re.compile(r"\b" + _BRIEF + r"\b"), "cites the outside product brief"),
    (re.compile(r"\.\./shared/(?!corpora/)"), "cites a file outside the repository"),
    (re.compile(r"(?i)\b" + "iss" + r"ues? #?\d+|\b" + "find" + r"ings? \d+"),
     "cites the issue tracker, which is outside the repository (cite a section instead)"),
]
CITED = re.compile(r"design\.md((?:\s*(?:,|and|\u2013|-|to)?\s*§\s*\d+)+)")
SECTION = re.compile(r"§\s*(\d+)")
HEADING = re.compile(r"^#{2,4} §(\d+)\b", re.MULTILINE)
PROMISE = re.compile(r"\bP(\d+)\b")


def tracked_text_files() -> list[tuple[str, str]]:
    names = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], check=True,
                           capture_output=True).stdout.decode().split("\0")
    files = []
    for name in filter(None, names):
        path = ROOT / name
        if not path.is_file() or path.suffix in {".mo", ".png", ".ico", ".woff2", ".gz"}:
            continue
        try:
            files.append((name, path.read_text(encoding="utf-8")))
        except UnicodeDecodeError:
            continue
    return files


def design_sections() -> set[int]:
    return {int(n) for n in HEADING.findall(DESIGN.read_text(encoding="utf-8"))}


def problems(files: list[tuple[str, str]], sections: set[int]) -> list[str]:
    found = []
    for name, text in files:
        if name == "tests/unit/test_design_citations.py":
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for pattern, what in OUTSIDE:
                if pattern.search(line):
                    found.append(f"{name}:{lineno}: {what}: {line.strip()[:120]}")
        for match in CITED.finditer(text):
            for number in SECTION.findall(match.group(1)):
                if int(number) not in sections:
                    lineno = text.count("\n", 0, match.start()) + 1
                    found.append(f"{name}:{lineno}: docs/design.md §{number} does not exist")
    return found


def test_design_document_numbers_its_sections_in_order():
    numbers = [int(n) for n in HEADING.findall(DESIGN.read_text(encoding="utf-8"))]
    assert numbers == list(range(1, len(numbers) + 1))
    # The promises P1..P10 are §1..§10, named so in their headings.
    text = DESIGN.read_text(encoding="utf-8")
    for n in range(1, 11):
        assert re.search(rf"^### §{n} P{n} ", text, re.MULTILINE), f"§{n} is not P{n}"


def test_every_citation_resolves_inside_the_repository():
    found = problems(tracked_text_files(), design_sections())
    assert not found, "\n".join(found)


def test_the_check_catches_what_it_should():
    # The check itself can fail: an outside citation, a missing section, a sibling path.
    sections = {1, 2, 3}
    bad = [("a.py", "# as " + _BRIEF + " 15 says\n"),
           ("b.md", "see docs/design.md §2, §9\n"),
           ("c.py", "open('../shared/" + "notes.md')\n"),
           ("d.md", "docs/design.md §1\u2013§3, fine; corpus at ../shared/corpora/bounces\n")]
    found = problems(bad, sections)
    assert len(found) == 3, found
    assert "a.py:1" in found[0] and "§9 does not exist" in found[1] and "c.py:1" in found[2]


def test_promise_names_are_the_ten_promises():
    # "P7" in a comment names design §7; a P-number past the promises would name nothing.
    found = []
    for name, text in tracked_text_files():
        if not name.endswith((".py", ".md", ".html")) or name.startswith("static/"):
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for number in PROMISE.findall(line):
                if not 1 <= int(number) <= 10:
                    found.append(f"{name}:{lineno}: P{number}")
    assert not found, "\n".join(found)
