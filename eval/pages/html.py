"""The dashboard's HTML pages: one template in which every text that comes from data, a model or
a user is escaped, and a Content-Security-Policy under which only the page's own scripts run.

Corpus text carries markup all the time (web crawls), generations echo it, and run folders are
named by users, so the pages treat all of it as text:

* the page itself is a Jinja2 template with autoescape: a value is escaped unless it is
  :class:`markupsafe.Markup` that this module made (a chart, or Markdown rendered without raw HTML);
* texts inside charts go through :func:`plotly_text`: plotly.js draws trace names, axis labels and
  table cells from a small HTML-like language (``<b>``, ``<a href>``, entities), so markup there
  would be dropped or shown as formatting instead of read as text;
* Markdown (the filter report) is rendered by markdown-it with raw HTML off, so a document's
  ``<img onerror=...>`` becomes ``&lt;img ...`` (markdown-it's ``commonmark`` preset passes raw
  HTML through by default);
* the policy allows exactly the inline scripts plotly wrote (its library and one call per chart,
  each by its sha256), no other script, no inline event handler, nothing fetched: a text that
  slipped through unescaped still cannot run, and a page opened from ``file://`` reaches nothing.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup

# plotly writes <script type="text/javascript"> blocks; its JSON escapes "<" (as \u003c), so no
# text of the figure can open or close a script inside them
_SCRIPT = re.compile(r"<script\b[^>]*>(.*?)</script>", re.S)

_TEMPLATE = """<!doctype html>
<html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{ policy }}">
<title>bloomline: {{ title }}</title>
<style>body{font-family:sans-serif;margin:2em;max-width:1400px}h2{margin-top:2em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}</style>
</head><body>
{% if heading %}<h1>{{ heading }}</h1>{% endif %}
<p>{% for part in intro %}{% if part.href %}<a href="{{ part.href }}">{{ part.text }}</a>{% else %}{{ part.text }}{% endif %}{% endfor %}</p>
{% for s in sections %}{% if s.title %}<h2>{{ s.title }}</h2>{% endif %}{{ s.html }}
{% endfor %}</body></html>
"""


@dataclass(frozen=True)
class Section:
    """A titled part of a page. Make one with :func:`chart` or :func:`markdown`, which produce
    its markup; ``title`` is plain text (escaped)."""

    title: str
    html: Markup
    scripts: tuple[str, ...] = ()  # CSP sources ('sha256-…') of the inline scripts it carries


@dataclass(frozen=True)
class Link:
    """A piece of a page's intro line: plain text, a link when ``href`` is given (one of the
    dashboard's own pages: a fixed name, never a text from data)."""

    text: str
    href: str | None = None


def plotly_text(value: Any) -> str:
    """``value`` as text that plotly.js shows as written (its labels and cells read ``<…>`` as
    tags and ``&…;`` as entities)."""
    return html.escape(str(value), quote=False)


def language_line(rows: list[dict[str, Any]], lang: str, x: str, y: str, **style: Any) -> Any:
    """One language's line, ``y`` against ``x`` over its ``rows`` (each with ``lang`` and
    ``step``), its name escaped; against anything but the step, each point's step shows on hover.
    None when the language has no row."""
    import plotly.graph_objects as go

    pts = sorted((r[x], r[y], r["step"]) for r in rows if r["lang"] == lang)
    if not pts:
        return None
    hover = {} if x == "step" else {"text": [f"step {p[2]}" for p in pts]}
    return go.Scatter(
        x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=plotly_text(lang), **hover, **style
    )


def lines_per_language(rows: list[dict[str, Any]], value: str, langs: list[str], y_title: str, height: int) -> Any:
    """A plotly figure of ``value`` over steps, one line per language of ``langs`` (rows with
    ``step``, ``lang`` and ``value``), its names escaped; a click on a legend entry hides it."""
    import plotly.graph_objects as go

    f = go.Figure()
    for lang in langs:
        f.add_trace(language_line(rows, lang, "step", value))
    f.update_layout(
        xaxis_title="step", yaxis_title=y_title, height=height, legend_title="click: hide · double click: isolate"
    )
    return f


def language_by_step(rows: list[dict[str, Any]], value: str, langs: list[str], steps: list[int], label: str) -> Any:
    """A plotly heatmap of ``value`` (its colour bar named ``label``), a row per language of
    ``langs`` and a column per step of ``steps`` (a cell without a row stays empty), its names escaped."""
    import plotly.graph_objects as go

    grid = {(r["lang"], r["step"]): r[value] for r in rows}
    f = go.Figure(
        go.Heatmap(
            z=[[grid.get((l, s)) for s in steps] for l in langs],
            x=[str(s) for s in steps],
            y=[plotly_text(l) for l in langs],
            colorscale="Viridis",
            colorbar_title=label,
        )
    )
    f.update_layout(xaxis_title="checkpoint step", height=max(400, 16 * len(langs)))
    return f


def _source(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode() + "'"


def chart(title: str, fig: Any, div_id: str, with_library: bool) -> Section:
    """A plotly figure as a section (plotly.js inlined when ``with_library``: the first chart of
    a page), with the hashes of the scripts plotly wrote for it."""
    import plotly.io as pio

    markup = pio.to_html(
        fig, full_html=False, include_plotlyjs=with_library, div_id=div_id, config={"displaylogo": False}
    )
    scripts = _SCRIPT.findall(markup)
    if markup.count("<script") != len(scripts):  # a script we could not delimit would not run, or run unlisted
        raise RuntimeError(f"chart {div_id}: plotly's output has a script this page cannot account for")
    return Section(title, Markup(markup), tuple(_source(s) for s in scripts))


def markdown(title: str, text: str) -> Section:
    """Markdown (tables on) as a section, raw HTML in it shown as text."""
    from markdown_it import MarkdownIt

    return Section(title, Markup(MarkdownIt("commonmark", {"html": False}).enable("table").render(text)))


def policy(sections: list[Section]) -> str:
    """The page's Content-Security-Policy: its own inline scripts by hash, inline styles (plotly
    sets them as it draws), data: images and fonts; nothing else, from anywhere."""
    scripts = sorted({s for sec in sections for s in sec.scripts})
    return "; ".join(
        [
            "default-src 'none'",
            "script-src " + (" ".join(scripts) if scripts else "'none'"),
            "style-src 'unsafe-inline'",
            "img-src data:",
            "font-src data:",
            "base-uri 'none'",
            "form-action 'none'",
        ]
    )


def render(title: str, sections: list[Section], heading: str | None = None, intro: list[Link] = ()) -> str:
    """A whole page: ``title``, ``heading`` and ``intro`` are plain text, escaped."""
    from jinja2 import Environment

    template = Environment(autoescape=True).from_string(_TEMPLATE)
    return template.render(title=title, heading=heading, intro=list(intro), sections=sections, policy=policy(sections))
