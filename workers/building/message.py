"""Campaign templates (sandboxed Jinja) and fast RFC 5322 / MIME message building.

Templates are compiled once per campaign (``compile_campaign``) so a syntax
error is reported when the campaign is composed (P9), then rendered per
recipient. ``build_mime`` writes the message bytes directly -- no
``email.mime`` objects on the hot path -- and its output is checked against
the standard library parser in the tests.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import functools
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime
from html import escape as html_escape
from types import TracebackType
from typing import Any

from jinja2 import ChainableUndefined, Template, TemplateSyntaxError, nodes, pass_context
from jinja2.runtime import Context
from jinja2.sandbox import SandboxedEnvironment, SecurityError

from workers.core.addresses import domain_of
from workers.core.i18n import N_, Text, message_of

CRLF = "\r\n"
MAX_REPEAT = 100_000  # longest string/list a template may build with `*`
MAX_EXPONENT = 64  # largest exponent a template may use with `**`
# Template limits (P10). At save: the source's size and its node count (a
# 250 KB template of `{{ name }}` takes 3.4 s to compile, so both are checked before the
# compiler runs). At render, per message (subject, text and HTML together): operations
# (calls, filters, attribute reads, loop steps, output pieces; one more per KiB a step
# produces), the text produced, and a wall-clock limit.
MAX_TEMPLATE_CHARS = 200_000
MAX_TEMPLATE_NODES = 5_000
MAX_OPERATIONS = 100_000
MAX_OUTPUT_CHARS = 1_000_000
MAX_INT_BITS = 100_000  # ~30,000 digits: a bigger integer is an amplifier, not a number
SEND_SECONDS = 5.0  # wall clock per message in the workers
PREVIEW_SECONDS = 2.0  # wall clock per preview in the web app
_MANAGED_HEADERS = frozenset(
    {
        "from",
        "to",
        "subject",
        "date",
        "message-id",
        "mime-version",
        "content-type",
        "content-transfer-encoding",
    }
)
_HEADER_NAME = re.compile(r"[!-9;-~]+")
_ADDRESS_WITH_NAME = re.compile(r"\s*(.*?)\s*<([^<>]*)>\s*")
_SPECIALS = re.compile(r'[()<>@,;:\\".\[\]]')
_RISKY_LINE_START = re.compile(rb"\n(?:\.|From )")
_WHITESPACE = re.compile(r"\s+")
_ENCODED_WORD_BYTES = 42  # 56 base64 chars: "Subject: =?utf-8?b?...?=" stays within 78
MAX_LINE = 998  # RFC 5322 2.1.1: no line longer than this, CRLF excluded
MAX_SUBJECT = 900  # characters; a longer subject is refused (at compose when it is literal)
_LONG_WORD = 72  # an ASCII word longer than this cannot be folded in place: encode it
_LIST_PHRASE_UNSAFE = re.compile(r"[^A-Za-z0-9 _.,!?&'()-]+")


class TemplateError(Exception):
    """A campaign template that cannot be compiled or rendered.

    ``field`` is "subject", "text" or "html"; ``line`` the 1-based template
    line when known; ``message`` a short explanation for the marketer.
    """

    def __init__(self, field: str, line: int | None, message: str) -> None:
        self.field = field
        self.line = line
        self.message = message  # a workers.core.i18n.Text when written here (shown translated)
        where = f"{field}, line {line}" if line is not None else field
        super().__init__(f"{where}: {message}")


# The limits by the name the API reports (``limit``), and as the UI says them.
LIMIT_NAMES = {"template size": N_("template size"), "template nodes": N_("template nodes"),
               "operations": N_("operations"), "output size": N_("output size"),
               "time": N_("time"), "nesting": N_("nesting")}


class TemplateLimit(TemplateError):
    """A template over one of the limits; ``limit`` names it ("template size", "template
    nodes", "operations", "output size", "time", "nesting")."""

    def __init__(self, field: str, limit: str, message: str) -> None:
        self.limit = limit
        super().__init__(field, None, N_("%(message)s (limit: %(limit)s)", message=message,
                                         limit=LIMIT_NAMES.get(limit, limit)))


class _OverLimit(Exception):
    """Raised inside template code when the render budget is spent; never caught there
    (templates have no try), turned into :class:`TemplateLimit` by the renderer."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.message = message


def _big_int() -> Text:
    return N_("an integer of more than %(max)s bits", max=MAX_INT_BITS)


def _too_deep() -> Text:
    return N_("the template nests blocks or parentheses too deeply")


def _long_subject(length: int) -> Text:
    return N_("the subject is %(length)s characters long; at most %(max)s fit in a mail "
              "header", length=length, max=MAX_SUBJECT)



class _Budget:
    """What one message's render may still spend; one per render, per thread."""

    __slots__ = ("clock_at", "deadline", "operations", "output", "seconds")

    def __init__(self, seconds: float) -> None:
        self.operations = 0
        self.output = 0
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.clock_at = 64  # the clock is read every 64 operations (and on big steps)

    def spend(self, size: int = 0) -> None:
        self.operations += 1 + (size >> 10)
        if self.operations < self.clock_at:
            return
        self.clock_at = self.operations + 64
        if self.operations > MAX_OPERATIONS:
            raise _OverLimit("operations", N_(
                "the template needs more than %(max)s operations (loops, calls, filters) "
                "for one message", max=MAX_OPERATIONS))
        if time.monotonic() > self.deadline:
            raise _OverLimit("time", N_("the template took longer than %(seconds)s s to "
                                        "render one message", seconds=f"{self.seconds:g}"))

    def produce(self, size: int) -> None:
        self.output += size
        if self.output > MAX_OUTPUT_CHARS:
            raise _OverLimit("output size", N_(
                "the template produces more than %(max)s characters for one message",
                max=MAX_OUTPUT_CHARS))
        self.spend(size)


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "senddock_template_budget", default=None)


def _spend(size: int = 0) -> None:
    budget = _BUDGET.get()
    if budget is not None:
        budget.spend(size)


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | bytearray | list | tuple | dict |
                                    set | frozenset) else 0


def _check_size(value: Any) -> Any:
    """``value`` unless it is a string or collection bigger than the output limit."""
    size = _size(value)
    if size > MAX_OUTPUT_CHARS:
        raise _OverLimit("output size", N_(
            "a value of %(size)s characters or items is more than %(max)s", size=size,
            max=MAX_OUTPUT_CHARS))
    _spend(size)
    return value


def _check_int(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise _OverLimit("output size", _big_int())
    return value


_BIG_NUMBER = re.compile(r"\d{7,}")  # a width or precision of a million or more
_NESTED_FIELD = re.compile(r"{[^{}]*{")
_STAR_WIDTH = re.compile(r"%[-#0 +]*\*|%[-#0 +]*\d*\.\*")


def _big_ints(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return any(isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_OUTPUT_CHARS
               for v in (*args, *kwargs.values()))


def _refuse_amplifier(name: str, owner: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> None:
    """Refuse, before it runs, a call that would build a huge value from small input:
    padding to a huge width (center, ljust, rjust, zfill, indent, expandtabs, format
    specs), ``int.to_bytes`` of a huge length, a replace that multiplies its input."""
    too_big = _OverLimit("output size", N_(
        "%(call)s() would build more than %(max)s characters", call=name,
        max=MAX_OUTPUT_CHARS))
    if name in ("center", "ljust", "rjust", "zfill", "to_bytes", "indent", "wordwrap") \
            and _big_ints(args, kwargs):
        raise too_big
    if name == "expandtabs" and isinstance(owner, str | bytes):
        tab = next(iter((*args, *kwargs.values())), 8)
        tabs = owner.count("\t") if isinstance(owner, str) else owner.count(b"\t")
        if isinstance(tab, int) and tabs * tab + len(owner) > MAX_OUTPUT_CHARS:
            raise too_big
    if name in ("format", "format_map") and isinstance(owner, str):
        if _BIG_NUMBER.search(owner) or (_NESTED_FIELD.search(owner) and
                                         _big_ints(args, kwargs)):
            raise too_big
    if name == "indent" and owner is not None:
        width = args[0] if args else kwargs.get("width", 4)
        lines = str(owner).count("\n") + 1
        if len(str(owner)) + lines * (width if isinstance(width, int) else _size(width)) \
                > MAX_OUTPUT_CHARS:
            raise too_big
    if name == "replace" and isinstance(owner, str) and len(args) >= 2 and \
            isinstance(args[0], str) and isinstance(args[1], str):
        count = owner.count(args[0]) if args[0] else len(owner) + 1
        if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
            count = min(count, args[2])
        if len(owner) + count * (len(args[1]) - len(args[0])) > MAX_OUTPUT_CHARS:
            raise too_big


def _refuse_printf(fmt: Any, values: Any) -> None:
    """Refuse ``fmt % values`` (or ``|format``) with a huge width or precision."""
    if isinstance(fmt, str) and (_BIG_NUMBER.search(fmt) or (
            _STAR_WIDTH.search(fmt) and _big_ints(
                values if isinstance(values, tuple) else (values,), {}))):
        raise _OverLimit("output size", N_("a format would build more than %(max)s "
                                           "characters", max=MAX_OUTPUT_CHARS))


def _metered_filter(name: str, func: Any) -> Any:
    """``func`` (a Jinja filter) with the amplifier checks before and the size check after;
    keeps Jinja's pass_context/pass_environment marker."""

    @functools.wraps(func)
    def metered(*args: Any, **kwargs: Any) -> Any:
        passed = getattr(func, "jinja_pass_arg", None)
        value_index = 1 if passed is not None else 0
        value = args[value_index] if len(args) > value_index else None
        rest = args[value_index + 1:]
        if name == "format":
            _refuse_printf(value, rest)
        elif name in ("center", "indent", "replace", "wordwrap"):
            _refuse_amplifier(name, value, rest, kwargs)
        _spend(_size(value))
        return _check_size(func(*args, **kwargs))

    return metered


@pass_context
def _meter_output(context: Context, value: Any, literal: int = 0) -> Any:
    """Every piece of output, wherever it goes (the message, a ``set`` block, a macro):
    ``value`` plus ``literal`` characters of template text output next to it."""
    budget = _BUDGET.get()
    if budget is not None:
        budget.produce(literal + (len(value) if isinstance(value, str) else 16))
    return value


@pass_context
def _meter_loop(context: Context, iterable: Any) -> Any:
    """A ``for`` loop's iterable, one operation per step."""
    budget = _BUDGET.get()
    if budget is None:
        return iterable

    def steps() -> Any:
        for item in iterable:
            budget.spend()
            yield item

    return steps()


@pass_context
def _meter_value(context: Context, value: Any) -> Any:
    return _check_size(value)


_OUTPUT_FILTER, _LOOP_FILTER, _VALUE_FILTER = "_sd_output", "_sd_loop", "_sd_value"


def _filter(node: nodes.Expr, name: str) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


def _instrument(tree: nodes.Template) -> None:
    """Route every loop step, every piece of output and every ``~`` through the meters
    (as filters: Jinja calls those directly, and pass_context keeps it from evaluating
    them at compile time)."""
    every = list(tree.find_all(nodes.Node))  # before any node is added
    for loop in tree.find_all(nodes.For):
        if isinstance(loop.iter, nodes.Expr):
            loop.iter = _filter(loop.iter, _LOOP_FILTER)
    for output in tree.find_all(nodes.Output):
        # Template text stays a constant (Jinja folds it); one meter call counts it all.
        literal = sum(len(c.data) for c in output.nodes if isinstance(c, nodes.TemplateData))
        metered: list[nodes.Expr] = [nodes.Filter(
            nodes.Const(""), _OUTPUT_FILTER, [nodes.Const(literal)], [], None, None,
            lineno=output.lineno)] if literal else []
        metered += [c if isinstance(c, nodes.TemplateData) else _filter(c, _OUTPUT_FILTER)
                    for c in output.nodes]
        output.nodes = metered
    for parent in every:
        for field in parent.fields:
            child = getattr(parent, field, None)
            if isinstance(child, nodes.Concat):
                setattr(parent, field, _filter(child, _VALUE_FILTER))
            elif isinstance(child, list):
                setattr(parent, field, [_filter(c, _VALUE_FILTER)
                                        if isinstance(c, nodes.Concat) else c for c in child])


class _CampaignEnvironment(SandboxedEnvironment):
    """The sandbox, made strict where leniency would hide an attack or a DoS, and metered:
    every call, attribute read and operator spends from the render's budget."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters = {name: _metered_filter(name, func)
                        for name, func in self.filters.items()}
        self.filters.update({_OUTPUT_FILTER: _meter_output, _LOOP_FILTER: _meter_loop,
                             _VALUE_FILTER: _meter_value})

    def call(__self, __context: Context, __obj: Any, *args: Any,
             **kwargs: Any) -> Any:
        target = getattr(__obj, "__wrapped__", __obj)  # str.format comes wrapped
        _refuse_amplifier(getattr(target, "__name__", ""), getattr(target, "__self__", None),
                          args, kwargs)
        _spend()
        return _check_int(_check_size(super().call(__context, __obj, *args, **kwargs)))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _spend()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _spend()
        return super().getitem(obj, argument)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        # Fail loudly: a marketer probing internals gets a clear error at
        # compose time instead of a silently empty string.
        raise SecurityError(N_("access to attribute %(attribute)s of %(type)s object is not "
                               "allowed", attribute=repr(attribute),
                               type=repr(type(obj).__name__)))

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(count, int):
                    if len(seq) * count > MAX_REPEAT:
                        raise SecurityError(N_("result longer than %(max)s items",
                                               max=MAX_REPEAT))
            if isinstance(left, int) and isinstance(right, int) and \
                    left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise _OverLimit("output size", _big_int())
        elif operator == "**" and isinstance(right, int):
            if abs(right) > MAX_EXPONENT:
                raise SecurityError(N_("exponent larger than %(max)s", max=MAX_EXPONENT))
            if isinstance(left, int) and left.bit_length() * abs(right) > MAX_INT_BITS:
                raise _OverLimit("output size", _big_int())
        elif operator == "+" and _size(left) + _size(right) > MAX_OUTPUT_CHARS:
            raise _OverLimit("output size", N_("a value of more than %(max)s characters or "
                                               "items", max=MAX_OUTPUT_CHARS))
        elif operator == "%":
            _refuse_printf(left, right)
        _spend(_size(left) + _size(right))
        return _check_size(super().call_binop(context, operator, left, right))


@functools.cache
def template_env(html: bool) -> SandboxedEnvironment:
    """The shared sandboxed Jinja environment for HTML (autoescaped) or text/subject.

    Guarantees: templates cannot reach Python internals (unsafe attribute
    access raises SecurityError); missing variables and attributes render as
    empty strings; ``lipsum`` (an output amplifier) is not available.
    """
    env = _CampaignEnvironment(
        autoescape=html,
        undefined=ChainableUndefined,
        keep_trailing_newline=True,
        auto_reload=False,
    )
    env.globals.pop("lipsum", None)
    return env


@dataclass(frozen=True)
class RenderedMessage:
    """One recipient's rendered subject and bodies (None where the campaign has none)."""

    subject: str
    text: str | None
    html: str | None


def _template_line(tb: TracebackType | None) -> int | None:
    """The innermost template line in a traceback Jinja rewrote, if any."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


_OTHER_TEMPLATES = (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)


def _accessed_name(node: nodes.Node) -> str | None:
    """The attribute or key a node reads when it is spelled out in the template."""
    if isinstance(node, nodes.Getattr):
        return node.attr
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        return node.arg.value if isinstance(node.arg.value, str) else None
    if isinstance(node, nodes.Filter) and node.name == "attr" and node.args and \
            isinstance(node.args[0], nodes.Const) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def _refuse_internals(field: str, tree: nodes.Template) -> None:
    """Refuse when composing what the sandbox would only refuse mid-send (P9): other
    templates (there is no loader) and attributes or keys starting with an underscore (the
    way to Python internals). Computed names are still refused by the sandbox at render."""
    for statement in tree.find_all(_OTHER_TEMPLATES):
        raise TemplateError(field, statement.lineno,
                            N_("a campaign template cannot include, import or extend "
                               "templates"))
    for node in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Filter)):
        name = _accessed_name(node)
        if name is not None and name.startswith("_"):
            raise TemplateError(field, node.lineno, N_("access to %(name)s is not allowed",
                                                       name=repr(name)))


def check_template_size(field: str, source: str) -> None:
    """Refuse (:class:`TemplateLimit`) a source over the size limit, or with more tags than
    the node limit allows, before anything parses it."""
    if len(source) > MAX_TEMPLATE_CHARS:
        raise TemplateLimit(field, "template size", N_(
            "the template is %(size)s characters long; at most %(max)s are allowed",
            size=len(source), max=MAX_TEMPLATE_CHARS))
    tags = source.count("{{") + source.count("{%")
    if tags > MAX_TEMPLATE_NODES:
        raise TemplateLimit(field, "template nodes", N_(
            "the template has %(tags)s tags; at most %(max)s template nodes are allowed",
            tags=tags, max=MAX_TEMPLATE_NODES))


def _parse(field: str, source: str) -> nodes.Template:
    """The template's tree, within the size, node and nesting limits."""
    check_template_size(field, source)
    env = template_env(field == "html")
    try:
        tree = env.parse(source)
    except TemplateSyntaxError as exc:
        raise TemplateError(field, exc.lineno, exc.message or "syntax error") from None
    except RecursionError:
        raise TemplateLimit(field, "nesting", _too_deep()) from None
    count = sum(1 for _ in tree.find_all(nodes.Node))
    if count > MAX_TEMPLATE_NODES:
        raise TemplateLimit(field, "template nodes", N_(
            "the template has %(count)s nodes; at most %(max)s are allowed", count=count,
            max=MAX_TEMPLATE_NODES))
    return tree


def _compile(field: str, source: str | None) -> Template | None:
    if source is None:
        return None
    env = template_env(field == "html")
    tree = _parse(field, source)
    try:
        _refuse_internals(field, tree)
        _instrument(tree)
        return env.from_string(tree)
    except TemplateSyntaxError as exc:
        raise TemplateError(field, exc.lineno, exc.message or "syntax error") from None
    except SecurityError as exc:
        raise TemplateError(field, None, message_of(exc)) from None
    except (RecursionError, MemoryError, SyntaxError):
        # The compiler (Jinja's, then Python's) gave up on the nesting.
        raise TemplateLimit(field, "nesting", _too_deep()) from None


def _render(field: str, template: Template, context: dict[str, Any]) -> str:
    try:
        return template.render(context)
    except TemplateError:
        raise
    except _OverLimit as exc:
        raise TemplateLimit(field, exc.limit, exc.message) from None
    except RecursionError:
        raise TemplateLimit(field, "nesting", N_("the template calls itself too deeply "
                                                 "(macros or recursive loops)")) from None
    except Exception as exc:  # any error raised by template code is the template's fault
        raise TemplateError(field, _template_line(exc.__traceback__), message_of(exc)) from None


@dataclass(frozen=True)
class CampaignTemplate:
    """A campaign's compiled subject, text and HTML templates."""

    subject: Template
    text: Template | None
    html: Template | None

    def render(self, context: dict[str, Any], *, seconds: float = SEND_SECONDS
               ) -> RenderedMessage:
        """Render for one recipient.

        Guarantees: the subject is one line (whitespace runs, including line
        breaks, collapsed to a space); any error raised while rendering is a
        TemplateError naming the field (and line when known); the three fields together
        stay within MAX_OPERATIONS, MAX_OUTPUT_CHARS and ``seconds`` of wall clock, else
        a TemplateLimit naming the limit (no render can hold a thread or the memory).
        """
        token = _BUDGET.set(_Budget(seconds))
        try:
            return self._render_all(context)
        finally:
            _BUDGET.reset(token)

    def _render_all(self, context: dict[str, Any]) -> RenderedMessage:
        subject = _WHITESPACE.sub(" ", _render("subject", self.subject, context)).strip()
        if len(subject) > MAX_SUBJECT:
            raise TemplateError("subject", None, _long_subject(len(subject)))
        text = _render("text", self.text, context) if self.text is not None else None
        html = _render("html", self.html, context) if self.html is not None else None
        return RenderedMessage(subject=subject, text=text, html=html)


# Layouts: reusable HTML around a campaign's body.
CONTENT_PLACEHOLDER = re.compile(r"\{\{\s*content\s*\}\}")
UNSUBSCRIBE_PLACEHOLDER = re.compile(r"\{\{\s*unsubscribe_url\s*\}\}")
POSTAL_PLACEHOLDER = re.compile(r"\{\{\s*postal_address\s*\}\}")


@dataclass(frozen=True)
class Layout:
    """A layout as the campaign's HTML sees it: its template (with ``{{ content }}`` where
    the body goes) and the postal address its ``{{ postal_address }}`` shows."""

    html: str
    postal_address: str = ""


def apply_layout(layout: Layout, body_html: str) -> str:
    """The campaign's HTML template inside ``layout``: the first ``{{ content }}`` becomes
    the body's source, every ``{{ postal_address }}`` the address as escaped text (line
    breaks kept, braces escaped, so an address can never be template code). The result is
    compiled as the campaign's HTML, so the footer's ``{{ unsubscribe_url }}`` is each
    recipient's own link."""
    address = (html_escape(layout.postal_address.strip()).replace("{", "&#123;")
               .replace("}", "&#125;").replace("\r\n", "\n").replace("\n", "<br>\n"))
    framed = POSTAL_PLACEHOLDER.sub(lambda _: address, layout.html)
    return CONTENT_PLACEHOLDER.sub(lambda _: body_html, framed, count=1)


def compile_campaign(subject: str, text: str | None, html: str | None,
                     layout: Layout | None = None) -> CampaignTemplate:
    """Compile a campaign's three templates once (its HTML inside ``layout`` if given).

    Guarantees: returns only if every given template parses; otherwise raises
    TemplateError naming the first bad field ("subject", "text", "html") and
    line.
    """
    if layout is not None and html:
        html = apply_layout(layout, html)
    literal = _WHITESPACE.sub(" ", re.sub(r"{[{%#].*?[}%#]}", "", subject)).strip()
    if len(literal) > MAX_SUBJECT:
        raise TemplateError("subject", None, _long_subject(len(literal)))
    subject_template = _compile("subject", subject)
    assert subject_template is not None
    return CampaignTemplate(
        subject=subject_template, text=_compile("text", text), html=_compile("html", html)
    )


def list_id(list_name: str, list_number: int, from_addr: str) -> str:
    """A ``List-Id`` value (RFC 2919) for a campaign to one list: ``"Name" <list-7.domain>``
    on the From address's domain; the phrase keeps only characters that need no encoding."""
    domain = domain_of(from_addr) or "senddock.local"
    phrase = _WHITESPACE.sub(" ", _LIST_PHRASE_UNSAFE.sub(" ", list_name)).strip()[:60]
    ident = f"<list-{list_number}.{domain}>"
    return f'"{phrase}" {ident}' if phrase else ident


# -- headers -----------------------------------------------------------------


def _encoded_words(value: str) -> list[str]:
    """RFC 2047 base64 encoded words, each short enough for a 78-column line."""
    words: list[str] = []
    chunk = bytearray()
    for char in value:
        encoded = char.encode("utf-8")
        if len(chunk) + len(encoded) > _ENCODED_WORD_BYTES:
            words.append(f"=?utf-8?b?{base64.b64encode(chunk).decode('ascii')}?=")
            chunk.clear()
        chunk += encoded
    if chunk or not words:
        words.append(f"=?utf-8?b?{base64.b64encode(chunk).decode('ascii')}?=")
    return words


def _needs_encoding(value: str) -> bool:
    return not value.isascii() or "=?" in value


def _fold(name: str, words: list[str], separator: str = " ") -> str:
    """``Name: value`` folded between words so lines stay near 78 columns."""
    lines: list[str] = []
    current = f"{name}:"
    for word in words:
        if len(current) + 1 + len(word) > 78 and current != f"{name}:":
            lines.append(current)
            current = ""
        current = f"{current}{separator if current else ' '}{word}"
    lines.append(current)
    return (CRLF).join(lines) + CRLF


def _unstructured(name: str, value: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError(f"header {name} contains a line break")
    if _needs_encoding(value):
        return _fold(name, _encoded_words(value))
    if len(name) + 2 + len(value) <= 78:
        return f"{name}: {value}{CRLF}"
    words = value.split(" ")
    if name.lower() == "subject" and any(len(w) > _LONG_WORD for w in words):
        # A word no fold can break (RFC 5322 folds only at whitespace): as encoded words
        # it can be split anywhere, so every line stays short.
        return _fold(name, _encoded_words(value))
    return _fold(name, words)


def _split_address(value: str) -> tuple[str, str]:
    match = _ADDRESS_WITH_NAME.fullmatch(value)
    if match is None:
        return "", value.strip()
    name = match[1]
    if len(name) >= 2 and name[0] == name[-1] == '"':
        name = name[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return name, match[2].strip()


def _address(name: str, value: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError(f"header {name} contains a line break")
    display, addr = _split_address(value)
    if not addr:
        raise ValueError(f"header {name} has no address")
    if not display:
        return f"{name}: {addr}{CRLF}"
    if _needs_encoding(display):
        return _fold(name, [*_encoded_words(display), f"<{addr}>"])
    if _SPECIALS.search(display):
        escaped = display.replace("\\", "\\\\").replace('"', '\\"')
        display = f'"{escaped}"'
    return _fold(name, [*display.split(" "), f"<{addr}>"])


def _extra_header(name: str, value: str) -> str:
    if not _HEADER_NAME.fullmatch(name):
        raise ValueError(f"invalid header name {name!r}")
    if name.lower() in _MANAGED_HEADERS:
        raise ValueError(f"header {name} is set by build_mime itself")
    return _unstructured(name, value)


# -- bodies ------------------------------------------------------------------


def _protect_qp_line(line: bytes) -> bytes:
    """Encode a leading '.' or 'F' of 'From ' so no relay or mbox can alter the line."""
    if not (line[:1] == b"." or line.startswith(b"From ")):
        return line
    escaped = b"=%02X" % line[0]
    if len(line) + 2 <= 76:
        return escaped + line[1:]
    # Too long to grow by two: put the escaped character on its own soft-broken line.
    return escaped + b"=\r\n" + _protect_qp_line(line[1:])


def _quoted_printable(text: str) -> bytes:
    """UTF-8 quoted-printable body with CRLF line ends, ending in CRLF."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    encoded = binascii.b2a_qp(text.encode("utf-8"), quotetabs=False, istext=True)
    needs_fix = encoded.startswith((b".", b"From ")) or _RISKY_LINE_START.search(encoded)
    encoded = encoded.replace(b"\n", b"\r\n")
    if needs_fix:
        encoded = b"\r\n".join(_protect_qp_line(line) for line in encoded.split(b"\r\n"))
    if not encoded.endswith(b"\r\n"):
        encoded += b"\r\n"
    return encoded


def _part(subtype: str, body: str) -> bytes:
    return (
        f'Content-Type: text/{subtype}; charset="utf-8"{CRLF}'
        f"Content-Transfer-Encoding: quoted-printable{CRLF}{CRLF}"
    ).encode("ascii") + _quoted_printable(body)


def _body(text: str | None, html: str | None) -> bytes:
    if text is not None and html is not None:
        # "=_" never occurs in quoted-printable output, so this cannot collide.
        boundary = f"=_sd{secrets.token_hex(12)}"
        delimiter = f"--{boundary}{CRLF}".encode("ascii")
        return b"".join(
            (
                f'Content-Type: multipart/alternative; boundary="{boundary}"{CRLF}{CRLF}'.encode(
                    "ascii"
                ),
                delimiter,
                _part("plain", text),
                # The CRLF before a delimiter belongs to the delimiter (RFC 2046),
                # so each body keeps its own final line break.
                CRLF.encode("ascii"),
                delimiter,
                _part("html", html),
                f"{CRLF}--{boundary}--{CRLF}".encode("ascii"),
            )
        )
    if html is not None:
        return _part("html", html)
    return _part("plain", text or "")


@functools.lru_cache(maxsize=4)
def _rfc5322_date(second: int) -> str:
    return format_datetime(datetime.fromtimestamp(second, UTC))


def _now_rfc5322() -> str:
    """The current time as an RFC 5322 date (formatted once per second)."""
    return _rfc5322_date(int(time.time()))


def build_mime(
    *,
    from_addr: str,
    to_addr: str,
    subject: str,
    text: str | None,
    html: str | None,
    message_id: str,
    headers: dict[str, str],
    date: str | None = None,
) -> bytes:
    """Build one RFC 5322 message as bytes ready for SMTP DATA.

    Guarantees: 7-bit output (except a non-ASCII addr-spec, sent as UTF-8)
    with CRLF line ends; multipart/alternative (text then HTML) when both
    bodies are given, a single part otherwise; bodies UTF-8 quoted-printable
    with no line starting with '.' or 'From '; non-ASCII Subject, display
    names and extra header values RFC 2047-encoded; line breaks in the
    subject collapsed; every header line under 998 octets (RFC 5322), a subject
    word too long to fold sent as encoded words; ``Date`` as ``+0000``. Raises
    ValueError for a line break in any other header value, an invalid header
    name, an extra header that would override one this function writes, or a
    header line that cannot be kept under 998 octets.
    """
    head = [
        _address("From", from_addr),
        _address("To", to_addr),
        _unstructured("Subject", _WHITESPACE.sub(" ", subject).strip()),
        f"Date: {date or _now_rfc5322()}{CRLF}",
        _unstructured("Message-ID", message_id if message_id[:1] == "<" else f"<{message_id}>"),
        f"MIME-Version: 1.0{CRLF}",
    ]
    head.extend(_extra_header(name, value) for name, value in headers.items())
    header_block = "".join(head)
    for line in header_block.split(CRLF):
        if len(line.encode("utf-8")) > MAX_LINE:
            raise ValueError(f"header line longer than {MAX_LINE} octets: {line[:40]}...")
    return header_block.encode("utf-8") + _body(text, html)
