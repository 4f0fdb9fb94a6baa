"""Templates (sandboxed Jinja) and MIME building, checked with the stdlib parser."""

from __future__ import annotations

import email
import email.policy
import re
from email.message import EmailMessage

import pytest

from workers.building.message import (
    TemplateError,
    build_mime,
    compile_campaign,
    list_id,
    template_env,
)

_WS = re.compile(r"\s+")

CONTEXT = {
    "subscriber": {"email": "zoe@example.com", "name": "Zoë", "attributes": {"plan": "pro"}},
    "email": "zoe@example.com",
    "name": "Zoë",
    "attributes": {"plan": "pro"},
    "unsubscribe_url": "https://send.example.com/u/abc?x=1&y=2",
    "verify_url": "https://app.example.com/verify?t=1&u=2",
    "campaign": {"name": "Spring", "subject": "Hello"},
}


def parse(raw: bytes) -> EmailMessage:
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    assert not message.defects, message.defects
    return message


def build(**overrides: object) -> bytes:
    args: dict[str, object] = {
        "from_addr": "News <news@example.com>",
        "to_addr": "zoe@example.com",
        "subject": "Hello",
        "text": "Hi there\n",
        "html": None,
        "message_id": "<1.abc@example.com>",
        "headers": {},
    }
    args.update(overrides)
    return build_mime(**args)  # type: ignore[arg-type]


# -- templates ---------------------------------------------------------------


def test_render_all_fields() -> None:
    template = compile_campaign(
        "Hi {{ name }}",
        "Hello {{ subscriber.name }} ({{ attributes.plan }})\nUnsubscribe: {{ unsubscribe_url }}",
        '<p>Hello {{ name }}</p><a href="{{ unsubscribe_url }}">unsubscribe</a>',
    )
    rendered = template.render(CONTEXT)
    assert rendered.subject == "Hi Zoë"
    assert rendered.text == "Hello Zoë (pro)\nUnsubscribe: https://send.example.com/u/abc?x=1&y=2"
    assert rendered.html == (
        '<p>Hello Zoë</p><a href="https://send.example.com/u/abc?x=1&amp;y=2">unsubscribe</a>'
    )


def test_html_is_autoescaped_text_and_subject_are_not() -> None:
    template = compile_campaign("{{ name }}", "{{ name }}", "{{ name }}")
    rendered = template.render({"name": "<b>&</b>"})
    assert rendered.subject == "<b>&</b>"
    assert rendered.text == "<b>&</b>"
    assert rendered.html == "&lt;b&gt;&amp;&lt;/b&gt;"


def test_missing_attributes_render_empty() -> None:
    template = compile_campaign(
        "{{ nope }}x", "{{ subscriber.attributes.company.name }}|{{ attributes.zip }}", None
    )
    rendered = template.render(CONTEXT)
    assert rendered.subject == "x"
    assert rendered.text == "|"
    assert rendered.html is None


def test_subject_is_one_line() -> None:
    template = compile_campaign("Hi\n{{ name }}\r\n  there", None, None)
    assert template.render({"name": "a\nb"}).subject == "Hi a b there"


@pytest.mark.parametrize(
    ("subject", "text", "html", "field", "line"),
    [
        ("{{ name ", None, None, "subject", 1),
        ("ok", "line one\n{% if x %}\nno endif", None, "text", 2),  # the unclosed block
        ("ok", "fine", "<p>\n\n{{ 1 + }}</p>", "html", 3),
        ("ok", "{% for x in %}{% endfor %}", None, "text", 1),
    ],
)
def test_syntax_errors_name_field_and_line(
    subject: str, text: str | None, html: str | None, field: str, line: int
) -> None:
    with pytest.raises(TemplateError) as caught:
        compile_campaign(subject, text, html)
    assert caught.value.field == field
    assert caught.value.line == line
    assert caught.value.message
    assert field in str(caught.value)


def test_render_errors_become_template_errors() -> None:
    template = compile_campaign("ok", "a\nb\n{{ 1 / 0 }}", None)
    with pytest.raises(TemplateError) as caught:
        template.render(CONTEXT)
    assert caught.value.field == "text"
    assert caught.value.line == 3


def test_type_error_at_render_is_a_template_error() -> None:
    template = compile_campaign("{{ name + 1 }}", None, None)
    with pytest.raises(TemplateError) as caught:
        template.render({"name": "x"})
    assert caught.value.field == "subject"


ESCAPES = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ joiner.__init__.__globals__.os }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ self.__init__.__globals__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ config }}",
    "{{ config.items() }}",
    "{{ request }}",
    "{{ request.application.__globals__ }}",
    "{{ lipsum.__globals__ }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ range.__class__ }}",
    "{{ subscriber.__class__ }}",
    "{{ subscriber|attr('__class__') }}",
    "{{ ''|attr('__class__')|attr('__mro__') }}",
    "{{ 'a'.format.__globals__ }}",
    "{{ '{0.__class__}'.format('') }}",
    "{% set x = ''.__class__ %}{{ x }}",
    "{{ name.__len__() }}",
    "{{ 'a' * 1000000000 }}",
    "{{ [1] * 1000000000 }}",
    "{{ 9 ** 9 ** 9 }}",
]
INTERNALS = re.compile(r"class|module|function|builtin|globals|object at|uid=", re.IGNORECASE)


@pytest.mark.parametrize("source", ESCAPES)
@pytest.mark.parametrize("field", ["subject", "text", "html"])
def test_sandbox_escapes_are_refused(source: str, field: str) -> None:
    sources = {"subject": "ok", "text": None, "html": None, field: source}
    try:
        template = compile_campaign(sources["subject"] or "", sources["text"], sources["html"])
        rendered = template.render(CONTEXT)
    except TemplateError as exc:
        assert exc.field == field
        return
    output = getattr(rendered, field)
    assert output is not None
    assert not INTERNALS.search(output), output
    assert len(output) < 1000


def test_security_error_message_is_clear() -> None:
    # Spelled out: refused when composing (P9). Computed: refused by the sandbox at render.
    with pytest.raises(TemplateError, match="not allowed") as refused:
        compile_campaign("{{ ''.__class__ }}", None, None)
    assert refused.value.field == "subject" and refused.value.line == 1
    template = compile_campaign("{{ ''[('_' * 2) ~ 'class' ~ ('_' * 2)] }}", None, None)
    with pytest.raises(TemplateError, match="not allowed"):
        template.render({})


@pytest.mark.parametrize("source", [
    "{{ x.__class__ }}", "{{ x['__class__'] }}", "{{ x|attr('__class__') }}",
    "{{ x._private }}", "{% include 'a' %}", "{% import 'a' as b %}", "{% extends 'a' %}",
    "{% from 'a' import b %}"])
def test_internals_and_other_templates_are_refused_when_compiling(source: str) -> None:
    with pytest.raises(TemplateError) as refused:
        compile_campaign("Hi", f"line one\n{source}", None)
    assert refused.value.field == "text" and refused.value.line == 2


def test_template_env_is_shared_and_sandboxed() -> None:
    assert template_env(True) is template_env(True)
    assert template_env(True).autoescape is True
    assert template_env(False).autoescape is False
    assert "lipsum" not in template_env(False).globals


# -- MIME --------------------------------------------------------------------


def test_every_header_line_stays_under_998_octets() -> None:
    for subject in ("x" * 900, " ".join(["word"] * 300), "é" * 400, "a " + "b" * 899):
        raw = build(subject=subject[:900])
        head = raw.split(b"\r\n\r\n", 1)[0]
        assert max(len(line) for line in head.split(b"\r\n")) <= 78, subject[:20]
        parsed = email.message_from_bytes(raw, policy=email.policy.default)
        assert str(parsed["Subject"]) == _WS.sub(" ", subject[:900]).strip()


def test_a_subject_too_long_is_refused_at_compose() -> None:
    with pytest.raises(TemplateError) as refused:
        compile_campaign("x" * 901, "body", None)
    assert refused.value.field == "subject" and "at most 900" in refused.value.message
    long_when_rendered = compile_campaign("{{ name * 1000 }}", "body", None)
    with pytest.raises(TemplateError, match="at most 900"):
        long_when_rendered.render({"name": "ab"})


def test_list_id_and_date() -> None:
    assert list_id("Newsletter (FR) ünïcode", 7, "news@Example.com") == (
        '"Newsletter (FR) n code" <list-7.example.com>')
    raw = build()
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert str(parsed["Date"]).endswith("+0000") or "+0000" in raw.decode()


def test_text_only_message() -> None:
    raw = build(date="Tue, 01 Jan 2030 00:00:00 +0000")
    message = parse(raw)
    assert message["From"] == "News <news@example.com>"
    assert message["To"] == "zoe@example.com"
    assert message["Subject"] == "Hello"
    assert message["Message-ID"] == "<1.abc@example.com>"
    assert message["Date"] == "Tue, 01 Jan 2030 00:00:00 +0000"
    assert message["MIME-Version"] == "1.0"
    assert message.get_content_type() == "text/plain"
    assert message.get_content_charset() == "utf-8"
    assert message["Content-Transfer-Encoding"] == "quoted-printable"
    assert message.get_content() == "Hi there\r\n"


def test_crlf_only_and_seven_bit() -> None:
    raw = build(subject="Ünïcødé ✓", text="a\nb\r\nc\rd ✓\n", html="<p>✓</p>")
    assert b"\n" not in raw.replace(b"\r\n", b"")
    assert b"\r" not in raw.replace(b"\r\n", b"")
    assert raw.isascii()
    assert max(len(line) for line in raw.split(b"\r\n")) <= 78


def test_multipart_alternative_text_then_html() -> None:
    raw = build(text="Plain ✓\n", html="<p>Rich ✓</p>\n")
    message = parse(raw)
    assert message.get_content_type() == "multipart/alternative"
    parts = list(message.iter_parts())
    assert [part.get_content_type() for part in parts] == ["text/plain", "text/html"]
    assert parts[0].get_content() == "Plain ✓\r\n"
    assert parts[1].get_content() == "<p>Rich ✓</p>\r\n"
    assert all(part["Content-Transfer-Encoding"] == "quoted-printable" for part in parts)


def test_html_only_message() -> None:
    message = parse(build(text=None, html="<h1>Hi</h1>"))
    assert message.get_content_type() == "text/html"
    assert message.get_content() == "<h1>Hi</h1>\r\n"


def test_non_ascii_headers_are_encoded() -> None:
    raw = build(
        from_addr="Zoë Müller <zoe@example.com>",
        to_addr="Ελένη <eleni@example.com>",
        subject="Grüße — a very long subject line " * 4 + "日本語",
        headers={"X-Note": "naïve"},
    )
    message = parse(raw)
    assert message["From"].addresses[0].display_name == "Zoë Müller"
    assert message["From"].addresses[0].addr_spec == "zoe@example.com"
    assert message["To"].addresses[0].display_name == "Ελένη"
    assert message["Subject"] == "Grüße — a very long subject line " * 4 + "日本語"
    assert message["X-Note"] == "naïve"
    assert b"=?utf-8?b?" in raw


def test_display_names_with_specials_are_quoted() -> None:
    message = parse(build(from_addr='"Doe, John" <john@example.com>'))
    address = message["From"].addresses[0]
    assert (address.display_name, address.addr_spec) == ("Doe, John", "john@example.com")


def test_long_ascii_subject_is_folded_and_round_trips() -> None:
    subject = " ".join(f"word{i}" for i in range(60))
    raw = build(subject=subject)
    assert max(len(line) for line in raw.split(b"\r\n")) <= 78
    assert parse(raw)["Subject"] == subject


def test_body_edge_cases_round_trip() -> None:
    text = (
        ".\n"
        ".leading dot\n"
        "..two dots\n"
        "From the start of a line\n"
        "trailing space \n"
        "tab\there\t\n"
        "equals = sign =3D\n"
        + "x" * 300
        + "\n"
        + "." * 200
        + "\n"
        + "From " * 40
        + "\n"
        + "ünïcödé " * 30
        + "\nno final newline"
    )
    raw = build(text=text, html=text)
    for line in raw.split(b"\r\n"):
        assert not line.startswith(b"."), line
        assert not line.startswith(b"From "), line
    body_lines = raw.split(b"\r\n\r\n", 1)[1].split(b"\r\n")
    assert max(len(line) for line in body_lines) <= 76
    expected = text.replace("\n", "\r\n") + "\r\n"
    for part in parse(raw).iter_parts():
        assert part.get_content() == expected


def test_extra_headers_are_written() -> None:
    headers = {
        "List-Unsubscribe": "<https://send.example.com/u/abc>",
        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
        "X-SendDock-Correlation-ID": "c0ffee",
    }
    message = parse(build(headers=headers))
    for name, value in headers.items():
        assert message[name] == value


def test_message_id_without_brackets_gets_them() -> None:
    assert parse(build(message_id="1.abc@example.com"))["Message-ID"] == "<1.abc@example.com>"


@pytest.mark.parametrize(
    "overrides",
    [
        {"headers": {"X-Evil": "a\r\nBcc: victim@example.com"}},
        {"headers": {"Bad Name": "x"}},
        {"headers": {"Subject": "override"}},
        {"headers": {"content-type": "text/html"}},
        {"to_addr": "zoe@example.com\r\nBcc: victim@example.com"},
        {"from_addr": "Name <>"},
    ],
)
def test_header_injection_and_overrides_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        build(**overrides)


def test_subject_line_breaks_are_collapsed() -> None:
    raw = build(subject="Hi\r\nBcc: victim@example.com")
    assert parse(raw)["Subject"] == "Hi Bcc: victim@example.com"
    assert b"\r\nBcc:" not in raw


def test_boundary_is_not_in_bodies() -> None:
    raw = build(text="--=_sd fake boundary\n", html="=_sd")
    message = parse(raw)
    boundary = message.get_boundary()
    assert boundary is not None
    assert [p.get_content() for p in message.iter_parts()] == [
        "--=_sd fake boundary\r\n",
        "=_sd\r\n",
    ]
