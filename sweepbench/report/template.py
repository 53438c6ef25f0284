"""The Jinja2 templates of the report and comparison pages, kept in Python so that they ship with
the package as they are (no package data to forget). The pages are self-contained: inline CSS,
figures inlined as SVG, no script, no link to anything outside the file."""

from __future__ import annotations

from typing import Any

import jinja2

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em 2em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.25em; border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 1.6em; }
h3 { font-size: 1.05em; margin-top: 1.2em; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0; }
th, td { border: 1px solid #ddd; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ok { color: #11772b; font-weight: 600; } .failed, .timeout, .slower { color: #b3261e; font-weight: 600; }
.skipped, .unstable, .tilde { color: #8a6d00; font-weight: 600; } .faster { color: #1f5fbf; font-weight: 600; }
.error { font-family: ui-monospace, monospace; font-size: .9em; white-space: pre-wrap; max-width: 60em; }
figure { display: inline-block; margin: .5em 1em .5em 0; vertical-align: top; }
figure svg { max-width: 100%; height: auto; }
figcaption { font-size: .85em; color: #555; max-width: 40em; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: .15em 1em; font-size: .9em; }
dl.meta dt { font-weight: 600; } dl.meta dd { margin: 0; font-family: ui-monospace, monospace; }
.scroll { overflow-x: auto; max-width: 100%; }
.note { color: #555; font-size: .9em; }
section.fastest { background: #f6f9ff; border: 1px solid #cdd9f0; padding: .2em 1em .6em; margin: .8em 0; }
td.winner { font-weight: 600; } td.gap-slower { color: #11772b; font-weight: 600; }
td.gap-maybe, td.gap-unstable { color: #8a6d00; } td.gap-unchanged { color: #555; }
"""

_BASE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<link rel="icon" href="data:,">
<style>{{ style }}</style></head>
<body>
<h1>{{ title }}</h1>
{% block body %}{% endblock %}
<p class="note">Written by sweepbench {{ generated }}.</p>
</body></html>
"""

_FIGURE = """{% macro figure(f) -%}
<figure class="plot" data-title="{{ f.title }}">{{ f.svg | safe }}
<figcaption><b>{{ f.title }}</b>{% if f.caption %}: {{ f.caption }}{% endif %}</figcaption></figure>
{%- endmacro %}
{% macro table(columns, rows) -%}
<table><thead><tr>{% for c in columns %}<th>{{ c }}</th>{% endfor %}</tr></thead><tbody>
{% for row in rows %}<tr>{% for cell in row %}<td class="{{ cell.cls }}">{{ cell.text }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>
{%- endmacro %}
"""

_REPORT = """{% extends "base.html" %}{% from "macros.html" import figure, table %}
{% block body %}
{% for s in sweeps %}
<section class="sweep">
<h2>Sweep {{ s.name }}</h2>
<section class="fastest"><h3>Fastest</h3>
<p class="note">Per benchmark, and per value of the scales the sweep varied: the configurations ranked by median
per-iteration time (the slowest rank's), the runner-up's time over the winner's, and whether the gap is real by
compare's rule (the ratio beyond the noise threshold and Mann-Whitney U p below its level).</p>
{% for a in s.answers %}<div class="answer" data-benchmark="{{ a.name }}">
<h4>{{ a.name }} <span class="note">(varied: {{ a.varied }})</span></h4>
{% if a.rows %}<div class="scroll">{{ table(a.columns, a.rows) }}</div>{% endif %}
{% if a.note %}<p class="note">{{ a.note }}</p>{% endif %}
{% if a.failed %}<p>Failed ({{ a.failed | length }}):</p><ul class="answer-failed">{% for j in a.failed %}
<li><b>{{ j.config or j.tag }}</b> <span class="{{ j.status }}">{{ j.status }}</span>: {{ j.error }} <span class="note">({{ j.tag }})</span></li>
{% endfor %}</ul>{% endif %}
</div>{% endfor %}
</section>
<dl class="meta">{% for k, v in s.meta %}<dt>{{ k }}</dt><dd>{{ v }}</dd>{% endfor %}</dl>
<h3>Results ({{ s.num_ok }} of {{ s.num_jobs }} jobs ok)</h3>
<div class="scroll">{{ table(s.columns, s.rows) }}</div>
{% if s.failed %}<h3>Failed jobs</h3><ul class="failed-jobs">
{% for j in s.failed %}<li><b>{{ j.tag }}</b> <span class="{{ j.status }}">{{ j.status }}</span>:
<div class="error">{{ j.error }}</div></li>{% endfor %}</ul>{% endif %}
{% for b in s.benchmarks %}
<h3>{{ b.name }}</h3>
{% for note in b.notes %}<p class="note">{{ note }}</p>{% endfor %}
{% for f in b.figures %}{{ figure(f) }}{% endfor %}
{% if b.distributions %}<p class="note">Per-iteration times: each iteration's time (the slowest rank's) as a dot,
the median as a black tick, every job on one common axis.</p>
{% for f in b.distributions %}{{ figure(f) }}{% endfor %}{% endif %}
{% endfor %}
</section>
{% endfor %}
{% endblock %}
"""

_COMPARE = """{% extends "base.html" %}{% from "macros.html" import figure, table %}
{% block body %}
<dl class="meta">{% for k, v in meta %}<dt>{{ k }}</dt><dd>{{ v }}</dd>{% endfor %}</dl>
<p>{% for v, n in counts %}<span class="{{ v | verdict_class }}">{{ v }}</span>: {{ n }}{% if not loop.last %}, {% endif %}{% endfor %}</p>
<p class="note">{{ rule }}</p>
{% for f in figures %}{{ figure(f) }}{% endfor %}
<h2>Per job and case</h2>
<div class="scroll">{{ table(columns, rows) }}</div>
{% if unjudged %}<h2>Not judged</h2><p class="note">What <code>--fail-on-regression</code> could not judge (it exits 3):</p>
<ul class="unjudged">{% for u in unjudged %}<li>{{ u }}</li>{% endfor %}</ul>{% endif %}
{% if unmatched %}<h2>Jobs without a twin</h2><ul>{% for u in unmatched %}<li>{{ u }}</li>{% endfor %}</ul>{% endif %}
{% endblock %}
"""


def verdict_class(verdict: str) -> str:
    """The CSS class of a verdict: ``~`` -> ``tilde``, ``not compared`` -> ``not-compared``."""
    return "tilde" if verdict == "~" else verdict.replace(" ", "-")


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.DictLoader(
            {"base.html": _BASE, "macros.html": _FIGURE, "report.html": _REPORT, "compare.html": _COMPARE}
        ),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=False,
    )
    env.filters["verdict_class"] = verdict_class
    return env


def render(name: str, **context: Any) -> str:
    """Render ``report.html`` or ``compare.html`` with the page's CSS."""
    return _env().get_template(name).render(style=_STYLE, **context)
