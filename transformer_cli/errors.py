"""User errors of ``transformer-ref``: one line on stderr naming the option, the value and what
was expected, then exit status 2 (argparse's own status for a bad command line), no traceback.

Every subcommand reports the same way: ``transformer-ref <command>: error: <message>``.
Options are checked where argparse reads them (the ``type=`` functions below, and the
parser's ``error``, which prints one line instead of argparse's usage block); what only the
model can tell (a layer number, a vocabulary size) raises ``UsageError`` inside the command,
and ``main`` turns it into that same line.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

from transformer_backends.names import BACKENDS

SEED_LIMIT = 2**32  # every framework takes seeds below it (JAX's keys are 32-bit words)


class UsageError(Exception):
    """A mistake in what the user asked for; ``main`` prints it as one line and exits with 2."""


class UsageExit(SystemExit):
    """``SystemExit(2)`` that still reads as its message (``str(error)``, pytest's ``match=``)."""

    def __init__(self, line: str):
        super().__init__(2)
        self.line = line

    def __str__(self) -> str:
        return self.line


def usage_error(command: str, message: str) -> SystemExit:
    """Print ``transformer-ref <command>: error: <message>`` on one line of stderr; the SystemExit
    (status 2) to raise. A message spanning lines is joined into one."""
    message = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    line = f"transformer-ref {command}: error: {message}" if command else f"transformer-ref: error: {message}"
    print(line, file=sys.stderr, flush=True)
    return UsageExit(line)


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block) pointing at ``--help``; its subcommand
    parsers are of this class too."""

    def error(self, message: str):
        command = self.prog.removeprefix("transformer-ref").strip()
        raise usage_error(command, f"{message} (see {self.prog} --help)")


def missing_extra(what: str, error: ImportError, extra: str) -> UsageError:
    """The error for an optional dependency that is not installed, naming the pip command."""
    return UsageError(f"{what} needs {error.name or 'a package'}, which is not installed: pip install -e '.[{extra}]'")


def get_installed_backend(name: str, option: str = "--backend"):
    """The backend adapter, or a ``UsageError`` naming the install command."""
    from transformer_backends import get_backend

    try:
        return get_backend(name)
    except ImportError as error:
        raise missing_extra(f"{option} {name}", error, name) from None


# ------------------------------------------------------------------ argparse types
def _integer(text: str, expected: str, ok: Callable[[int], bool]) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _integer(text, "a positive integer", lambda n: n > 0)


def non_negative_int(text: str) -> int:
    return _integer(text, "a non-negative integer", lambda n: n >= 0)


def seed(text: str) -> int:
    return _integer(text, f"an integer seed in [0, {SEED_LIMIT - 1}]", lambda n: 0 <= n < SEED_LIMIT)


def _number(text: str, expected: str, ok: Callable[[float], bool]) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}") from None
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
    return value


def probability(text: str) -> float:
    """A probability in [0, 1] (label smoothing)."""
    return _number(text, "a number in [0, 1]", lambda p: 0.0 <= p <= 1.0)


def dropout_rate(text: str) -> float:
    """A dropout rate in [0, 1) (a rate of 1 would drop everything)."""
    return _number(text, "a dropout rate in [0, 1)", lambda p: 0.0 <= p < 1.0)


def backend_list(text: str) -> list[str]:
    """``"numpy,torch"`` -> ["numpy", "torch"]: at least one, each a backend, none twice."""
    names = [name.strip() for name in text.split(",")]
    expected = f"comma-separated backends among {', '.join(BACKENDS)}"
    if not text.strip() or any(not name for name in names):
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r}")
    unknown = [name for name in names if name not in BACKENDS]
    if unknown:
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text!r} (unknown: {', '.join(unknown)})")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"must name each backend once, got {text!r}")
    return names
