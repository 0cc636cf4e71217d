"""``--help`` text from the subcommands' module docstrings: plain text, not reStructuredText.

The docstrings are written for the docs (``code`` between double backticks); a terminal
shows those backticks literally, so ``--help`` drops them, and the one-line summary in
``transformer-ref --help`` is the docstring's whole first sentence without the command's name.
"""

from __future__ import annotations

import re

_CODE = re.compile(r"``(.+?)``", re.S)


def plain(doc: str) -> str:
    """A docstring as ``--help`` text: ``code`` -> code (line breaks kept)."""
    return _CODE.sub(r"\1", doc)


def summary(doc: str) -> str:
    """The docstring's first paragraph on one line, without its leading ``transformer-ref <command>``: ."""
    first = " ".join(line.strip() for line in doc.strip().split("\n\n")[0].splitlines())
    return plain(re.sub(r"^``transformer-ref [a-z-]+``:\s*", "", first))
