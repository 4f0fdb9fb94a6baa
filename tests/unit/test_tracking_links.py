"""Tracking URLs and link rewriting, without a database: tokens that
cannot be forged or altered, only links written out in full are tracked, the pixel goes
inside the body."""

from __future__ import annotations

import pytest

from workers.building import tracking

SECRET = "unit-secret"


def test_click_token_round_trip_and_every_alteration_fails() -> None:
    token = tracking.click_token(SECRET, 7, 1234, 99, 5)
    assert tracking.read_click_token(SECRET, token) == (7, 1234, 99, 5)
    assert tracking.read_click_token(SECRET, token.upper()) == (7, 1234, 99, 5)
    parts = token.split(".")
    for i in range(4):  # each id changed by one, the MAC kept
        altered = parts.copy()
        altered[i] = f"{int(parts[i], 16) + 1:x}"
        assert tracking.read_click_token(SECRET, ".".join(altered)) is None
    assert tracking.read_click_token("another-secret", token) is None
    # An open token is not a click token, nor the other way round (the MAC names the kind).
    opened = tracking.open_token(SECRET, 7, 1234, 99)
    assert tracking.read_open_token(SECRET, opened) == (7, 1234, 99)
    assert tracking.read_click_token(SECRET, opened + ".5") is None
    assert tracking.read_open_token(SECRET, ".".join(parts[:3] + parts[4:])) is None


@pytest.mark.parametrize("garbage", [
    "", ".", "....", "zz.1.1.1.abc", "-1.1.1.1.abc", "1.1.1.1.1.1", "1..1.1.abc",
    "ffffffffffffffffff.1.1.1.abc", "8000000000000000.1.1.1.abc", "1.1.1.1." + "a" * 500,
])
def test_garbage_tokens_are_refused(garbage: str) -> None:
    assert tracking.read_click_token(SECRET, garbage) is None
    assert tracking.read_open_token(SECRET, garbage) is None


def test_archive_token() -> None:
    token = tracking.archive_token(SECRET, 42)
    assert tracking.read_archive_token(SECRET, token) == 42
    assert tracking.read_archive_token("other", token) is None
    assert tracking.read_archive_token(SECRET, token[:-2] + "xx") is None
    assert tracking.archive_url("https://x.example", SECRET, 42).startswith(
        "https://x.example/archive/")


HTML = """<html><body><p>Hi {{ name }}</p>
<a href="https://shop.example/sale?a=1&amp;b=2">Sale</a>
<a href='http://blog.example/post'>Blog</a>
<a href="{{ unsubscribe_url }}">Unsubscribe</a>
<a href="https://shop.example/u/{{ email }}">Personal</a>
<a href="mailto:hi@example.com">Mail us</a>
</body></html>"""
TEXT = "Sale: https://shop.example/sale?a=1&b=2. Blog (http://blog.example/post)\n" \
       "Personal: https://shop.example/u/{{ email }}\n"


def test_only_links_written_in_full_are_tracked() -> None:
    found = tracking.static_links(HTML, TEXT)
    assert set(found.html) == {"https://shop.example/sale?a=1&amp;b=2",
                               "http://blog.example/post"}
    assert set(found.text) == {"https://shop.example/sale?a=1&b=2", "http://blog.example/post"}


def test_rewriting_swaps_tracked_links_only() -> None:
    links = tracking.Links({"https://shop.example/sale?a=1&amp;b=2": 1,
                            "http://blog.example/post": 2},
                           {"https://shop.example/sale?a=1&b=2": 1,
                            "http://blog.example/post": 2})
    rendered = HTML.replace("{{ name }}", "Ann").replace(
        "{{ unsubscribe_url }}", "https://s.example/u/tok").replace("{{ email }}", "ann@x.org")
    out = tracking.rewrite_html(rendered, links, lambda i: f"https://t.example/r/{i}?a&b")
    assert 'href="https://t.example/r/1?a&amp;b"' in out
    assert "href='https://t.example/r/2?a&amp;b'" in out
    assert 'href="https://s.example/u/tok"' in out  # the unsubscribe link is left alone
    assert 'href="https://shop.example/u/ann@x.org"' in out  # so is a personal one
    assert 'href="mailto:hi@example.com"' in out
    text = tracking.rewrite_text(TEXT.replace("{{ email }}", "ann@x.org"), links,
                                 lambda i: f"https://t.example/r/{i}")
    assert text.startswith("Sale: https://t.example/r/1. Blog (https://t.example/r/2)\n")
    assert "https://shop.example/u/ann@x.org" in text


def test_pixel_goes_before_the_last_closing_body() -> None:
    out = tracking.add_pixel("<html><body><p>x</p></BODY></html>", "https://t.example/o/1.gif")
    assert out.index('<img src="https://t.example/o/1.gif"') < out.index("</BODY>")
    assert tracking.add_pixel("<p>x</p>", "https://t/o.gif").endswith(
        'style="display:block;width:1px;height:1px;border:0">')
