"""Pitfalls, demonstrated: one runnable demonstration per classic Transformer mistake.

Each registered pitfall runs the wrong code (as the tutorials write it) next to the
project's own code, on the same small seeded input, in every backend where the mistake
can happen, and reports both results::

    import pitfalls
    pitfalls.get("neg-inf-mask-nan").run("torch").wrong   # "NaN at 2 of 10 positions ..."
    pitfalls.run_all(["numpy"])                           # plain data for the docs page

``transformer-ref pitfalls`` prints them; ``shared_tests/test_pitfalls.py`` holds each
wrong result to being wrong in the stated way, and ours to being right.
"""

from . import demos
from .registry import BACKENDS, REGISTRY, Demonstration, Pitfall, get, register, render_html, run_all

__all__ = [
    "BACKENDS",
    "REGISTRY",
    "Demonstration",
    "Pitfall",
    "demos",
    "get",
    "register",
    "render_html",
    "run_all",
]
