"""The suite's own speed settings stay true to the suite: every test conftest.py's SLOW names exists
(a renamed test would silently leave the slow set, and lose its place at the front under xdist)."""

from __future__ import annotations

import pathlib
import re

from ..conftest import SLOW

SUITE = pathlib.Path(__file__).resolve().parents[1]  # shared_tests/: SLOW's paths are under it


def test_every_slow_test_named_in_conftest_exists():
    missing = [
        f"{file}::{name}"
        for file, names in SLOW.items()
        for name in sorted(names)
        if not re.search(rf"^def {name}\(", (SUITE / file).read_text(encoding="utf-8"), re.M)
    ]
    assert not missing, f"conftest.py's SLOW names tests that do not exist: {missing}"
