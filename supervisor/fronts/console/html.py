"""The console's HTML: small functions over html.escape, no template engine. No inline
script or style anywhere (the Content-Security-Policy is `default-src 'self'`): behaviour
lives in static/console.js, looks in static/console.css."""

from __future__ import annotations

import html
import re
import time
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from urllib.parse import urlencode

from stockade.supervisor.fronts.console.sessions import Session
from stockade.supervisor.text import printable

NAV = (
    ("/overview", "Overview", True),
    ("/sandboxes", "Sandboxes", False),
    ("/quarantines", "Quarantine", False),
    ("/approvals", "Approvals", False),
    ("/audit", "Audit", False),
)


def e(value: object) -> str:
    """Text for HTML, attribute-safe (quotes escaped)."""
    return html.escape(str(value), quote=True)


_NOT_ASCII = re.compile(r"[^\x20-\x7e]")
SHORT = 64
"""Characters of a key, tenant or name shown in a table cell; the whole text on hover."""
TITLE_CHARS = 4096
"""The most of a text a hover shows."""


def _control(match: re.Match[str]) -> str:
    c = match.group()
    if c.isprintable():
        return c
    name = unicodedata.name(c, "") or f"U+{ord(c):04X}"
    return f'<span class="ctl" title="{e(name)}">{e(ascii(c)[1:-1])}</span>'


def visible(value: object, *, lines: bool = False) -> str:
    """Text as HTML with every character that is not printable (controls, bidi overrides
    and isolates, zero-width marks) shown as its escape in a marked span: what the page
    says is what the text holds (`invoice-\u202egpj.exe` cannot read "invoice-exe.jpg")."""
    shown = _NOT_ASCII.sub(_control, e(value))
    return shown.replace(">\\n</span>", ">\\n</span>\n") if lines else shown


def short(value: object, limit: int = SHORT) -> str:
    """A value for a table cell: visible, at most `limit` characters with the whole
    (printable, up to TITLE_CHARS) on hover."""
    text = str(value)
    if len(text) <= limit and text.isprintable():
        return e(text)
    whole = printable(text)
    if len(whole) > TITLE_CHARS:
        whole = whole[:TITLE_CHARS] + f"… ({len(text):,} characters)"
    cut = text if len(text) <= limit else text[: limit - 1]
    more = "" if cut is text else '<span class="more">…</span>'
    return f'<span class="val" title="{e(whole)}">{visible(cut)}{more}</span>'


FOLD_HEAD = 400
FOLD_TAIL = 200


def size_of(text: str) -> str:
    n = len(text.encode("utf-8", "surrogatepass"))
    lines = text.count("\n") + 1
    amount = f"{n} B" if n < 1024 else f"{n / 1024:,.1f} KiB"
    return f"{amount}, {lines:,} line{'s' if lines != 1 else ''}"


Span = tuple[int, int]


def marked(text: str, spans: Sequence[Span] = (), offset: int = 0) -> str:
    """`text` as `visible` shows it, the parts within `spans` (positions in the whole of
    which `text` starts at `offset`) in <mark class="hit">: what the guard or a rule matched."""
    cuts, at = [], 0
    for start, end in sorted(spans):
        start, end = max(start - offset, at), min(end - offset, len(text))
        if start >= end:
            continue
        cuts.append(visible(text[at:start], lines=True))
        cuts.append(f'<mark class="hit">{visible(text[start:end], lines=True)}</mark>')
        at = end
    cuts.append(visible(text[at:], lines=True))
    return "".join(cuts)


def folded(
    text: str, head: int = FOLD_HEAD, tail: int = FOLD_TAIL, spans: Sequence[Span] = ()
) -> str:
    """A command for a table: its size, then its start and end with the middle folded, so
    a 250 KB command is a few lines beside its buttons (every character visible; `spans`
    marked, and said when they lie in the folded middle)."""
    size = f'<span class="size">{e(size_of(text))}</span>'
    if len(text) <= head + tail + 80:
        return f'{size}<code class="cmd">{marked(text, spans)}</code>'
    middle = len(text) - head - tail
    hidden = sum(1 for a, b in spans if a >= head and b <= len(text) - tail)
    note = f", {hidden} match{'es' if hidden != 1 else ''} among them" if hidden else ""
    return (
        f'{size}<code class="cmd">{marked(text[:head], spans)}</code>'
        f'<span class="fold">… {middle:,} characters folded{note} …</span>'
        f'<code class="cmd">{marked(text[-tail:], spans, len(text) - tail)}</code>'
    )


def url(path: str, /, **params: object) -> str:
    """A link with its query string (empty values left out)."""
    query = urlencode({k: str(v) for k, v in params.items() if v not in ("", None)})
    return f"{path}?{query}" if query else path


def page(
    title: str, body: str, session: Session | None = None, *, data: Mapping[str, str] = {}
) -> str:
    """The whole document. `data`: data-* attributes of <body> that console.js reads (the
    CSRF token, the live endpoints)."""
    nav = ""
    if session is not None:
        links = "".join(
            f'<a href="{href}">{e(label)}</a>'
            for href, label, operators_only in NAV
            if session.operator or not operators_only
        )
        role = "operator" if session.operator else "tenant"
        nav = (
            f'<nav>{links}<span class="who">{e(session.tenant)} ({role})</span>'
            f'<form method="post" action="/logout">{csrf_field(session)}'
            '<button type="submit">Sign out</button></form></nav>'
        )
        data = {"csrf": session.csrf, **data}
    attrs = "".join(f' data-{e(k)}="{e(v)}"' for k, v in data.items())
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(printable(title))} · Stockade</title>"
        '<link rel="stylesheet" href="/static/console.css">'
        '<script src="/static/console.js" defer></script></head>'
        f"<body{attrs}>{nav}<main><h1>{visible(title)}</h1>{body}</main></body></html>"
    )


def csrf_field(session: Session) -> str:
    return f'<input type="hidden" name="csrf" value="{e(session.csrf)}">'


def table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], *, id: str = "", empty: str = "None."
) -> str:
    """A table of already-escaped cells."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr class="empty"><td colspan="{len(headers)}">{e(empty)}</td></tr>'
    ident = f' id="{e(id)}"' if id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def when(moment: datetime | float | None) -> str:
    if moment is None:
        return "-"
    stamp = moment.timestamp() if isinstance(moment, datetime) else moment
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(stamp)) + "Z"


def moment(stamp: float | None) -> str:
    """A time for a table: UTC in the page (`2026-11-26 06:00:00Z`, one line), turned into
    the viewer's own zone by console.js, the UTC time on hover."""
    if stamp is None:
        return "-"
    utc = when(stamp)
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))
    return f'<time datetime="{iso}" title="{e(utc)} UTC">{e(utc)}</time>'


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _ident(id: str) -> str:
    return f' id="{e(id)}"' if id else ""


def bars(title: str, values: Mapping[str, float], *, id: str = "", unit: str = "") -> str:
    """A horizontal bar chart as inline SVG (no script, no style attribute: CSP-clean)."""
    items = sorted(values.items(), key=lambda kv: -kv[1])[:12]
    top = max((v for _, v in items), default=0) or 1
    height = 22 * max(len(items), 1) + 8
    parts = [
        f'<figure class="chart"{_ident(id)}><figcaption>{e(title)}'
        f'</figcaption><svg viewBox="0 0 420 {height}" width="420" height="{height}" '
        f'role="img" aria-label="{e(title)}">'
    ]
    if not items:
        parts.append('<text x="4" y="18" class="muted">nothing yet</text>')
    for i, (label, value) in enumerate(items):
        y = 4 + 22 * i
        width = max(1, int(240 * value / top))
        shown = f"{value:g}{unit}"
        parts.append(
            f'<text x="0" y="{y + 14}" class="label">{e(label[:22])}</text>'
            f'<rect x="150" y="{y}" width="{width}" height="16" class="bar"></rect>'
            f'<text x="{154 + width}" y="{y + 13}" class="value">{e(shown)}</text>'
        )
    parts.append("</svg></figure>")
    return "".join(parts)


def columns(title: str, counts: Sequence[tuple[str, int, int]], *, id: str = "") -> str:
    """A time histogram: (label, calls, refusals) per bucket, as inline SVG columns."""
    top = max((c for _, c, _ in counts), default=0) or 1
    width = max(len(counts), 1) * 14 + 40
    parts = [
        f'<figure class="chart"{_ident(id)}><figcaption>{e(title)}'
        f'</figcaption><svg viewBox="0 0 {width} 130" width="{width}" height="130" role="img" '
        f'aria-label="{e(title)}">'
    ]
    for i, (label, calls, refused) in enumerate(counts):
        x = 30 + 14 * i
        h_calls, h_refused = int(100 * calls / top), int(100 * refused / top)
        parts.append(
            f'<rect x="{x}" y="{110 - h_calls}" width="10" height="{h_calls}" class="bar">'
            f"<title>{e(label)}: {calls} calls, {refused} refused</title></rect>"
            f'<rect x="{x}" y="{110 - h_refused}" width="10" height="{h_refused}" '
            'class="bar refused"></rect>'
        )
    if counts:
        parts.append(f'<text x="30" y="126" class="label">{e(counts[0][0])}</text>')
        parts.append(f'<text x="0" y="12" class="label">{top}</text>')
    parts.append("</svg></figure>")
    return "".join(parts)


def lines(
    title: str,
    series: Mapping[str, Sequence[float | None]],
    ends: tuple[str, str],
    *,
    id: str = "",
) -> str:
    """A small line chart as inline SVG: one polyline per series (class `line N`), a gap
    where a point has no value (a lone point a dot), the top value, the legend and the
    end (`ends[1]`) labelled."""
    width, height, left, top_pad = 420, 120, 36, 8
    length = max((len(v) for v in series.values()), default=0)
    top = max((x for v in series.values() for x in v if x is not None), default=0) or 1
    step = (width - left - 4) / max(length - 1, 1)

    def y(value: float) -> float:
        return round(top_pad + (height - top_pad - 20) * (1 - value / top), 1)

    parts = [
        f'<figure class="chart"{_ident(id)}><figcaption>{e(title)}</figcaption>'
        f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{e(title)}">'
        f'<text x="0" y="{top_pad + 6}" class="label">{e(f"{top:g}")}</text>'
        f'<text x="0" y="{height - 20}" class="label">0</text>'
    ]
    for n, values in enumerate(series.values()):
        runs: list[list[str]] = [[]]
        for i, value in enumerate(values):
            if value is None:
                runs.append([])
                continue
            runs[-1].append(f"{round(left + i * step, 1)},{y(value)}")
        for run in runs:
            if len(run) == 1:
                x, at = run[0].split(",")
                parts.append(f'<circle cx="{x}" cy="{at}" r="2" class="dot line{n}"></circle>')
            elif run:
                parts.append(f'<polyline points="{" ".join(run)}" class="line line{n}"></polyline>')
    for n, name in enumerate(series):
        parts.append(
            f'<text x="{left + 90 * n}" y="{height - 4}" class="legend line{n}">{e(name)}</text>'
        )
    parts.append(
        f'<text x="{width - 4}" y="{height - 4}" class="label end">{e(ends[1])}</text>'
        "</svg></figure>"
    )
    return "".join(parts)


def message(text: str, kind: str = "note") -> str:
    return f'<p class="{e(kind)}" role="status">{e(text)}</p>'


DIFF_OPEN_LINES = 40
"""A diff of at most this many lines is shown open; a longer one folded (click to open)."""


def diff_block(text: str, title: str = "What it changes") -> str:
    """A unified diff: its size, folded when long, each line marked added, removed or a
    hunk's head (every character visible, as for a command)."""
    if not text:
        return ""
    kinds = {"+": "add", "-": "del", "@": "hunk"}
    rows = []
    for line in text.splitlines():
        kind = "head" if line.startswith(("+++ ", "--- ")) else kinds.get(line[:1], "ctx")
        rows.append(f'<span class="{kind}">{visible(line)}</span>')
    shown = " open" if text.count("\n") <= DIFF_OPEN_LINES else ""
    return (
        f'<details class="diff"{shown}><summary>{e(title)} '
        f'<span class="size">{e(size_of(text))}</span></summary>'
        f'<pre class="diff">{"".join(rows)}</pre></details>'
    )
