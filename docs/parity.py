"""The parity numbers under each page, from ``docs/parity.json``.

That file is written by the test suite itself (``pytest ... --parity-json docs/parity.json``,
see ``shared_tests/conftest.py``): per test, check and dtype, the worst
``max |got - reference| / max |reference|`` its comparisons measured, how many comparisons,
and the tolerance they were held to. Here each page's tests (patterns over the test ids) are
summarised into one small table: check x backend rows, float64 / float32 columns.
"""

from __future__ import annotations

import fnmatch
import html
import json
import pathlib

from transformer_backends.names import BACKENDS

CHECKS = {  # check -> (order, how to read it)
    "output": (0, "output vs the NumPy float64 reference"),
    "loss": (1, "loss vs NumPy's (float64)"),
    "gradients": (2, "every parameter's gradient vs NumPy's hand-written backward"),
    "finite differences": (3, "NumPy's backward vs central finite differences"),
    "loss curve": (4, "float64 loss curve over 200 Adam steps vs NumPy's"),
}
BACKEND_ORDER = {name: order for order, name in enumerate(BACKENDS)}
DTYPES = ("float64", "float32")


def load(path: pathlib.Path) -> dict | None:
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def matching(report: dict | None, patterns: tuple[str, ...]) -> list[dict]:
    if not report:
        return []
    return [t for t in report["tests"] if any(fnmatch.fnmatchcase(t["test"], p) for p in patterns)]


def _function(test_id: str) -> str:
    """``shared_tests/<subject>/test_x.py::test_y[params]`` -> ``test_x.py::test_y``."""
    return test_id.split("/")[-1].split("[")[0]


def summary(entries: list[dict]) -> list[dict]:
    """Rows of (check, backend, reference) with, per dtype, the worst error, its tolerance and
    the number of tests."""
    rows: dict[tuple, dict] = {}
    for entry in entries:
        backend = "numpy" if entry["backend"] == "-" else entry["backend"]  # tests of the reference alone
        key = (CHECKS.get(entry["check"], (9, ""))[0], entry["check"], BACKEND_ORDER.get(backend, 9), backend)
        row = rows.setdefault(key, {"check": entry["check"], "backend": backend, "reference": set(), "dtypes": {}})
        row["reference"].add(entry["reference"])
        cell = row["dtypes"].setdefault(entry["dtype"], {"worst": 0.0, "tolerance": 0.0, "tests": set()})
        cell["worst"] = max(cell["worst"], entry["worst"])
        cell["tolerance"] = max(cell["tolerance"], entry["tolerance"])
        cell["tests"].add(entry["test"])
    return [rows[key] for key in sorted(rows)]


def table(report: dict | None, patterns: tuple[str, ...], note: str = "") -> str:
    """The HTML of one page's parity section."""
    parts = ['<section class="parity" id="parity"><h2>Parity measured by the test suite</h2>']
    if note:
        parts.append(f"<p>{html.escape(note)}</p>")
    if not patterns:
        parts.append("</section>")
        return "\n".join(parts)
    entries = matching(report, patterns)
    if not entries:
        parts.append("<p>No measurements in <code>docs/parity.json</code> yet: run <code>nox -s docs</code>.</p>")
        parts.append("</section>")
        return "\n".join(parts)
    parts.append(_table_html(summary(entries)))
    counts: dict[str, int] = {}
    for entry in entries:
        counts[_function(entry["test"])] = counts.get(_function(entry["test"]), 0) + 1
    tests = ", ".join(f"<code>{html.escape(name)}</code> ({n})" for name, n in sorted(counts.items()))
    parts.append(
        '<p class="how">Each number is the worst <code>max |got − reference| / max |reference|</code> over every '
        "tensor the tests compared (the suite's one tolerance table: <code>shared_tests/tolerances.py</code>); "
        f"<q>n tests</q> counts parametrized test cases. Tests: {tests}.</p>"
    )
    parts.append(_provenance(report))
    parts.append("</section>")
    return "\n".join(parts)


def _table_html(rows: list[dict]) -> str:
    head = "".join(f"<th>{d}</th>" for d in DTYPES)
    lines = [f'<table class="parity-table"><thead><tr><th>check</th><th>backend</th>{head}</tr></thead><tbody>']
    for row in rows:
        cells = []
        for dtype in DTYPES:
            cell = row["dtypes"].get(dtype)
            if cell is None:
                cells.append('<td class="none">—</td>')
                continue
            status = "ok" if cell["worst"] <= cell["tolerance"] else "fail"
            n = len(cell["tests"])
            error, tolerance = f"{cell['worst']:.1e}", f"tolerance {cell['tolerance']:.0e}"
            if row["backend"] == "numpy" and row["check"] != "finite differences" and cell["worst"] == 0.0:
                error, tolerance = "0", "the reference itself"
            cells.append(
                f'<td class="{status}"><span class="err">{error}</span> <span class="tol">({tolerance})</span> '
                f'<span class="n">{n} test{"s" if n != 1 else ""}</span></td>'
            )
        label = CHECKS.get(row["check"], (9, row["check"]))[1]
        references = sorted(row["reference"] - {"numpy float64"})
        if references and row["check"] == "output":
            label = f"output vs {', '.join(references)}"
        lines.append(
            f'<tr><td>{html.escape(label)}</td><td class="backend b-{row["backend"]}">{row["backend"]}</td>'
            f"{''.join(cells)}</tr>"
        )
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _provenance(report: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in sorted(report.get("versions", {}).items()))
    return (
        f'<p class="how">Measured by <code>{html.escape(report.get("command", "?"))}</code> ({html.escape(versions)}), '
        "as run by <code>nox -s docs</code>; read from the committed <code>docs/parity.json</code>.</p>"
    )


def overall(report: dict | None) -> str:
    """The index page's table: every measured test, per check and backend."""
    if not report:
        return "<p>No measurements yet: run <code>nox -s docs</code>.</p>"
    return _table_html(summary(report["tests"])) + "\n" + _provenance(report)
