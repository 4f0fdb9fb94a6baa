"""The drain's shortcuts answer exactly what the general code answers: an envelope address
quoted without parsing, and a reply classified from the table's rows for its code."""

from __future__ import annotations

import smtplib

from hypothesis import given, settings
from hypothesis import strategies as st

from workers.delivery import classify
from workers.delivery.smtp import quoteaddr

ADDRESSES = ["a@b.c", "bounce+123-abc=x@mail.example.com", "a..b@x.org", ".a@x", "a.@x",
             "x@[1.2.3.4]", '"q u"@x.org', "A B <a@b.c>", "a@b@c", "", "o'brien@x.ie",
             "a@-x.com", "a@x.", "é@x.org", "<a@b.c>", " a@b.c", "a@b.c ", "a(b)@c.d"]


def test_quoted_as_smtplib_quotes_them() -> None:
    for address in ADDRESSES:
        assert quoteaddr(address) == smtplib.quoteaddr(address), address


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from("aZ09.-_+=@'\"<> ()[],;:é!#%"), max_size=24))
def test_any_address_quoted_as_smtplib_quotes_it(address: str) -> None:
    assert quoteaddr(address) == smtplib.quoteaddr(address)


@settings(max_examples=400, deadline=None)
@given(code=st.one_of(st.none(), st.integers(min_value=100, max_value=999),
                      st.sampled_from([250, 251, 421, 450, 451, 452, 550, 552, 553, 554])),
       text=st.sampled_from(["2.0.0 Ok: queued as 4Xq1", "5.1.1 user unknown",
                             "4.7.1 try again later", "5.7.1 relaying denied",
                             "mailbox full", "5.2.2 over quota", "", "too many connections",
                             "4.2.0 greylisted, see https://example.org", "5.7.26 DMARC"]),
       stage=st.sampled_from(sorted(classify.STAGES)))
def test_a_reply_meets_the_row_the_whole_table_gives(code: int | None, text: str,
                                                     stage: str) -> None:
    enhanced = classify.parse_enhanced(text) if code is not None else None
    whole = next((rule for rule in classify.RULES
                  if rule.matches(code, enhanced, text, stage)), classify._FALLBACK)
    assert classify.find_rule(code, text, stage) is whole
