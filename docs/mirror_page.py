"""The page "Where the backends differ": ``transformer_mirror.mirror``'s report, side by side.

Per file and per pair of backends (JAX against torch, the NumPy forward against torch),
every statement that still differs once framework tokens are normalised, the two sides'
code next to each other, and the reason the line points at, from
``transformer_mirror.differences.REASONS``; then the reasons, the normalisation table and
NumPy's backward, which is not compared. A pure function of the source files and
``docs/mirror_baseline.json``, as every page of the site.
"""

from __future__ import annotations

import html

from transformer_mirror.differences import NUMPY_BACKWARD, REASONS
from transformer_mirror.mirror import PACKAGES, PAIRS, Difference, Report, normalisation_table

from .pages import SOURCE_LINK, highlight_python, inline

TITLE = "Where the backends differ"
SUMMARY = "Every statement that is not a translation, with its reason; the count the redesign halves."


def _reason_links(difference: Difference) -> str:
    if not difference.reasons:
        return '<td class="reason none">no reason</td>'
    links = "<br>".join(f'<a href="#reason-{r}"><code>{html.escape(r)}</code></a>' for r in difference.reasons)
    return f'<td class="reason">{links}</td>'


def _code(backend: str, path: str, statements) -> str:
    if not statements:
        return f'<td class="code"><div class="cell col-{backend} missing"><p class="note">nothing here</p></div></td>'
    first, last = statements[0].line, statements[-1].end
    where = f'<div class="where"><a href="{SOURCE_LINK}{path}">{html.escape(path)}</a>:{first}–{last}</div>'
    code = "".join(highlight_python(s.source + "\n", s.line) for s in statements)
    return f'<td class="code"><div class="cell col-{backend}">{where}{code}</div></td>'


def _pair_table(report: Report, pair: str, file: str) -> str:
    differences = report.of(pair, file)
    if not differences:
        return ""
    left, right = PAIRS[pair]
    rows = [
        f'<tr><td colspan="3" class="function"><code>{html.escape(d.function)}</code> · '
        f"{d.size} statement{'s' if d.size > 1 else ''}</td></tr>"
        f"<tr>{_code(left, d.left_path, d.left)}{_code(right, d.right_path, d.right)}{_reason_links(d)}</tr>"
        for d in differences
    ]
    head = (
        f'<thead><tr><th class="b-{left}">{PACKAGES[left]}</th><th class="b-{right}">{PACKAGES[right]}</th>'
        "<th>reason</th></tr></thead>"
    )
    count, unexplained = report.count(pair, file), report.count(pair, file, explained=False)
    flag = f", <b>{unexplained} without a reason</b>" if unexplained else ""
    return (
        f"<h3>{html.escape(pair)}: {count} differing statement{'s' if count != 1 else ''}{flag}</h3>\n"
        f'<table class="mirror">{head}<tbody>{"".join(rows)}</tbody></table>'
    )


def _summary(report: Report, baseline: dict | None) -> str:
    heads = "".join(f"<th>{pair}</th>" for pair in PAIRS)
    rows = []
    for file in report.files:
        if not any(report.count(pair, file) for pair in PAIRS):
            continue
        cells = "".join(
            f"<td>{report.count(pair, file) or '—'}"
            + (f" ({n} without a reason)" if (n := report.count(pair, file, explained=False)) else "")
            + "</td>"
            for pair in PAIRS
        )
        rows.append(f'<tr><td><a href="#{file}"><code>{file}</code></a></td>{cells}</tr>')
    totals = "".join(f"<th>{report.count(pair)}</th>" for pair in PAIRS)
    rows.append(f"<tr><th>all files</th>{totals}</tr>")
    if baseline:
        before = "".join(f"<td>{baseline['pairs'][pair]['total']}</td>" for pair in PAIRS)
        target = "".join(f"<td>≤ {baseline['pairs'][pair]['total'] // 2}</td>" for pair in PAIRS)
        rows.append(f"<tr><td>before the redesign (<code>{html.escape(baseline['commit'])}</code>)</td>{before}</tr>")
        rows.append(f"<tr><td>the target: half of that</td>{target}</tr>")
    head = f"<thead><tr><th>file</th>{heads}</tr></thead>"
    return f'<table class="kv mirror-summary">{head}<tbody>{"".join(rows)}</tbody></table>'


def _reasons(report: Report) -> str:
    items = []
    for reason, text in REASONS.items():
        if reason == NUMPY_BACKWARD:
            count = sum(len(names) for names in report.numpy_backward.values())
            used = f"{count} functions, not compared"
        else:
            used = f"{sum(d.size for d in report.differences if reason in d.reasons)} differing statements"
        items.append(f'<dt id="reason-{reason}"><code>{reason}</code> · {used}</dt><dd>{inline(text)}</dd>')
    return f'<dl class="reasons">{"".join(items)}</dl>'


def mirror_page(report: Report, baseline: dict | None = None) -> str:
    """The page's HTML body."""
    files = [f for f in report.files if any(report.of(pair, f) for pair in PAIRS)]
    sections = []
    for file in files:
        tables = "\n".join(_pair_table(report, pair, file) for pair in PAIRS)
        sections.append(f'<section class="mirror-file" id="{file}"><h2><code>{file}</code></h2>\n{tables}</section>')
    backward = "".join(
        f"<li><code>{file}</code>: {', '.join(f'<code>{html.escape(n)}</code>' for n in names)}</li>"
        for file, names in report.numpy_backward.items()
    )
    rules = "".join(
        f"<tr><td><code>{html.escape(a)}</code></td><td>{inline(b)}</td></tr>" for a, b in normalisation_table()
    )
    command = "transformer-ref mirror"
    return (
        f"<h1>{TITLE}</h1>\n"
        "<p>The three backends are meant to read as one text in three frameworks. This page is the diff "
        "that is left: for every module file in <code>numpy_impl/</code>, <code>jax_impl/</code> and "
        "<code>torch_impl/</code>, functions and methods are paired by name (a NumPy or JAX "
        "<code>__call__</code> with a torch <code>forward</code>), framework tokens are normalised "
        "(<code>np.</code>/<code>jnp.</code>/<code>torch.</code>, <code>axis</code>/<code>dim</code>, "
        '<a href="#normalisation">the table below</a>) and the statements compared, comments and docstrings '
        "aside. What still differs is listed with its reason: the line carries "
        "<code># differs: &lt;reason-id&gt;</code>, and the reason is written once, in "
        '<code>transformer_mirror/differences.py</code> (<a href="#reasons">the list</a>). A difference counts '
        "as many statements as its longer side.</p>\n"
        f"<p>The same report in a terminal: <code>{command}</code> (exit status 1 when a difference has no "
        "reason; <code>shared_tests/repository/test_mirror.py</code> fails then too). The counts before the redesign "
        "were measured with the command in <code>docs/mirror_baseline.json</code>.</p>\n"
        f"{_summary(report, baseline)}\n"
        + "\n".join(sections)
        + f'\n<h2 id="reasons">The reasons</h2>\n{_reasons(report)}\n'
        f'<h2 id="numpy-backward">Not compared: NumPy\'s backward</h2>\n<p>{inline(REASONS[NUMPY_BACKWARD])} '
        "Functions and methods named <code>backward</code> or <code>*_backward</code>:</p>\n"
        f'<ul class="pages">{backward}</ul>\n'
        f'<h2 id="normalisation">What is normalised</h2>\n<p>Rewritten to one spelling before the comparison '
        "(<code>transformer_mirror/mirror.py</code>), so that a true translation compares equal:</p>\n"
        f'<table class="kv">{rules}</table>'
    )
