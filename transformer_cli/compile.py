"""``--compile``, the same switch in ``compare``, ``generate`` and ``train``.

torch runs eagerly unless asked: ``--compile`` runs it through ``torch.compile`` (compiling
takes tens of seconds per model and input shape on a CPU, counted in the first call). JAX
always runs jit-compiled, with the switch or without it: that is how JAX runs a model (op by
op, each operation would be dispatched on its own). NumPy has no compiler: it runs as it is,
and a note says so (a note, not an error, so that ``--compile`` serves a run of every backend).
"""

from __future__ import annotations

import argparse
from typing import Any

HELP = (
    "torch: run through torch.compile (tens of seconds of compiling per model and input shape on a CPU, "
    "in the first call); JAX always runs jit-compiled, with or without it; NumPy has no compiler "
    "(a note says so)"
)


def add_compile_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--compile", action="store_true", help=HELP)


def note(names: list[str], compile_: bool) -> str | None:
    """The line printed where ``--compile`` changes nothing in a chosen backend, else None."""
    if not compile_:
        return None
    unchanged = [f"{name} {WITHOUT_COMPILER[name]}" for name in names if name in WITHOUT_COMPILER]
    return f"--compile: {'; '.join(unchanged)}" if unchanged else None


WITHOUT_COMPILER = {
    "numpy": "has no compiler: it runs as it is",
    "jax": "always runs jit-compiled: unchanged",
}


def model_runner(backend: Any, model: Any, compile_: bool) -> Any:
    """What runs a whole model: the backend's default (``backend.runner``: JAX jit-compiled, torch
    eager, NumPy as it is), or with ``--compile`` its ``compiled(model)`` (torch.compile)."""
    return backend.impl.compiled(model) if compile_ else backend.runner(model)
