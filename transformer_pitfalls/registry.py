"""The registry of pitfalls, the result of running one, and the plain data the docs page is made from.

Backend-neutral and framework-free: a demonstration imports its framework only when it
runs, so ``import transformer_pitfalls`` (and listing what is registered) needs nothing but
``transformer_spec`` (NumPy and safetensors).
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

from transformer_backends.names import BACKENDS  # the order every listing uses


@dataclasses.dataclass(frozen=True)
class Demonstration:
    """One pitfall run in one backend: the wrong code's result next to ours.

    ``wrong`` and ``ours`` are one-line summaries for people; ``numbers`` holds the raw
    values behind them (max differences, NaN counts, shapes, error messages) for tests.
    ``wrong_code`` and ``ours_code`` are the source of the functions that actually ran.
    """

    pitfall: str
    backend: str
    wrong_code: str
    ours_code: str
    wrong: str
    ours: str
    numbers: dict[str, Any]
    # Raw inputs and outputs (NumPy) for tests that check against their own reference; not on the page.
    arrays: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "wrong_code": self.wrong_code,
            "ours_code": self.ours_code,
            "wrong": self.wrong,
            "ours": self.ours,
            "numbers": {key: _plain(value) for key, value in self.numbers.items()},
        }


@dataclasses.dataclass(frozen=True)
class Pitfall:
    name: str  # a slug: the CLI argument and the page anchor
    title: str
    explanation: str  # why it is wrong, where it comes from
    tutorials: tuple[str, ...]  # the tutorials that make this mistake (``docs.tutorials`` slugs)
    backends: tuple[str, ...]  # where the mistake can happen at all
    function: Callable[[str], Demonstration]

    def run(self, backend: str) -> Demonstration:
        if backend not in self.backends:
            raise ValueError(
                f"pitfall {self.name!r} cannot happen in {backend!r}; it is demonstrated in {list(self.backends)}"
            )
        return self.function(backend)


REGISTRY: dict[str, Pitfall] = {}


def register(name: str, title: str, backends: Iterable[str], tutorials: Iterable[str] = ()):
    """Decorator: register ``run(backend) -> Demonstration``; its docstring is the explanation."""

    def decorate(function: Callable[[str], Demonstration]) -> Callable[[str], Demonstration]:
        if name in REGISTRY:
            raise ValueError(f"pitfall {name!r} is registered twice")
        unknown = set(backends) - set(BACKENDS)
        if unknown:
            raise ValueError(f"pitfall {name!r}: unknown backends {sorted(unknown)}")
        REGISTRY[name] = Pitfall(
            name=name,
            title=title,
            explanation=" ".join((function.__doc__ or "").split()),  # one paragraph: the page wraps it
            tutorials=tuple(tutorials),
            backends=tuple(b for b in BACKENDS if b in set(backends)),
            function=function,
        )
        return function

    return decorate


def get(name: str) -> Pitfall:
    if name not in REGISTRY:
        raise KeyError(f"unknown pitfall {name!r}; expected one of {list(REGISTRY)}")
    return REGISTRY[name]


def source(*functions: Callable) -> str:
    """The code of ``functions`` as it is in this package: what the page shows is what ran."""
    return "\n\n".join(inspect.getsource(f).rstrip() for f in functions)


def run_all(backends: Iterable[str] | None = None, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Every pitfall (or those ``names``), run in each of ``backends`` (default: all three) where it
    can happen, as plain data for the docs page:

    ``[{"name", "title", "explanation", "tutorials", "backends", "results": [Demonstration.to_dict()],
    "skipped": [{"backend", "reason"}]}]``. A backend whose framework is not installed is
    listed under ``skipped`` with the reason, not raised.
    """
    wanted = list(BACKENDS) if backends is None else list(backends)
    unknown = [b for b in wanted if b not in BACKENDS]
    if unknown:
        raise ValueError(f"unknown backends {unknown}; expected some of {list(BACKENDS)}")
    pitfalls = list(REGISTRY.values()) if names is None else [get(n) for n in names]
    pages = []
    for pitfall in pitfalls:
        results, skipped = [], []
        for backend in (b for b in wanted if b in pitfall.backends):
            try:
                results.append(pitfall.run(backend).to_dict())
            except ModuleNotFoundError as error:
                skipped.append({"backend": backend, "reason": f"{error.name} is not installed"})
        pages.append(
            {
                "name": pitfall.name,
                "title": pitfall.title,
                "explanation": pitfall.explanation,
                "tutorials": list(pitfall.tutorials),
                "backends": list(pitfall.backends),
                "results": results,
                "skipped": skipped,
            }
        )
    return pages


def render_html(pages: list[dict[str, Any]]) -> str:
    """``run_all``'s data as an HTML fragment: one <section> per pitfall, one table row per backend."""
    esc = html.escape
    parts = []
    for page in pages:
        tutorials = f" (tutorials: {', '.join(page['tutorials'])})" if page["tutorials"] else ""
        parts.append(f'<section class="pitfall" id="{esc(page["name"])}">')
        parts.append(f"<h2>{esc(page['title'])}</h2>")
        parts.append(f"<p>{esc(page['explanation'])}{esc(tutorials)}</p>")
        parts.append(f"<p>Can happen in: {esc(', '.join(page['backends']))}</p>")
        for result in page["results"]:
            parts.append(f'<h3>{esc(result["backend"])}</h3><div class="side-by-side">')
            parts.append(f'<pre class="wrong"><code>{esc(result["wrong_code"])}</code></pre>')
            parts.append(f'<pre class="ours"><code>{esc(result["ours_code"])}</code></pre></div>')
            parts.append(
                f"<table><tr><th>wrong</th><td>{esc(result['wrong'])}</td></tr>"
                f"<tr><th>ours</th><td>{esc(result['ours'])}</td></tr></table>"
            )
        for skip in page["skipped"]:
            parts.append(f"<p>{esc(skip['backend'])}: not run ({esc(skip['reason'])})</p>")
        parts.append("</section>")
    return "\n".join(parts)


def _plain(value: Any) -> Any:
    """NumPy scalars and arrays, tuples -> Python numbers and lists (JSON-ready, NaN spelled out)."""
    if hasattr(value, "tolist"):  # a NumPy scalar or array
        value = value.tolist()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "nan", "inf": JSON has no such numbers
    return value
