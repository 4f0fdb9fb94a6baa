"""A plain-text alternative for HTML-only mail (docs/design.md §16: spam filters score an HTML part
without a text twin, e.g. SpamAssassin's MIME_HTML_ONLY).

Standard library only: :class:`html.parser.HTMLParser` walks the markup once; block
elements become line breaks, list items "- ", links "text (url)", images their alt text;
scripts, styles and the head are dropped; whitespace runs collapse as a browser would.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

_BLOCKS = frozenset({
    "address", "article", "aside", "blockquote", "div", "dl", "dt", "dd", "fieldset",
    "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header",
    "hr", "main", "nav", "ol", "p", "pre", "section", "table", "tr", "ul",
})
_DROPPED = frozenset({"script", "style", "head", "title", "template", "noscript"})
_SPACES = re.compile(r"[ \t\r\f\v]+")
_BLANK_LINES = re.compile(r"\n{3,}")


class _TextExtractor(HTMLParser):
    def __init__(self, template_links: bool = False) -> None:
        super().__init__(convert_charrefs=True)
        self._link_starts: tuple[str, ...] = ("http://", "https://", "mailto:") + (
            ("{{",) if template_links else ())
        self.parts: list[str] = []
        self._dropping = 0
        self._links: list[str | None] = []
        self._pre = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _DROPPED:
            self._dropping += 1
        elif tag == "br":
            self.parts.append("\n")
        elif tag == "li":
            self.parts.append("\n- ")
        elif tag == "img":
            alt = dict(attrs).get("alt")
            if alt:
                self.parts.append(alt)
        elif tag == "a":
            self._links.append(dict(attrs).get("href"))
        elif tag in ("td", "th"):
            self.parts.append(" ")
        elif tag in _BLOCKS:
            self.parts.append("\n\n" if tag in ("p", "h1", "h2", "h3", "table") else "\n")
        if tag == "pre":
            self._pre += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in _DROPPED:
            self._dropping = max(0, self._dropping - 1)
        elif tag == "a" and self._links:
            href = self._links.pop()
            if href and href.startswith(self._link_starts) and \
                    href not in "".join(self.parts[-3:]):
                self.parts.append(f" ({href.removeprefix('mailto:')})")
        elif tag in _BLOCKS:
            self.parts.append("\n\n" if tag in ("p", "h1", "h2", "h3", "table") else "\n")
        if tag == "pre":
            self._pre = max(0, self._pre - 1)

    def handle_data(self, data: str) -> None:
        if self._dropping:
            return
        self.parts.append(data if self._pre else _SPACES.sub(" ", data.replace("\n", " ")))


def html_to_text(html: str, *, template_links: bool = False) -> str:
    """The readable text of an HTML body, ending in one line break.

    Guarantees: no markup, script or style content survives; link targets stay readable
    next to their text; at most one blank line in a row; never raises for broken HTML.
    With ``template_links`` (the composer's text made from an HTML *template*), a link
    whose target is a template expression (``{{ unsubscribe_url }}``) is kept too.
    """
    extractor = _TextExtractor(template_links)
    extractor.feed(html)
    extractor.close()
    lines = [line.strip() for line in "".join(extractor.parts).split("\n")]
    text = _BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()
    return text + "\n"
