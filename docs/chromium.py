"""Headless Chromium (Debian's ``chromium`` package): a screenshot of a page, or its DOM after
layout. Used by ``python -m docs.build --screenshot`` and by ``shared_tests/repository/test_docs.py``."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tempfile

CHROMIUM = "/usr/bin/chromium"
WINDOW = (1600, 1000)


def find() -> str | None:
    """The chromium binary, or None when it is not installed."""
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    return shutil.which("chromium")


def _run(page: pathlib.Path, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess:
    binary = find()
    if binary is None:
        raise FileNotFoundError("chromium is not installed (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:  # a fresh profile: no state shared with other runs
        command = [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--allow-file-access-from-files",  # docs/layout.py's harness page measures the pages it frames
            f"--user-data-dir={profile}",
            *flags,
            page.resolve().as_uri(),
        ]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=True)


def screenshot(page: pathlib.Path, png: pathlib.Path, window: tuple[int, int] = WINDOW) -> pathlib.Path:
    png.parent.mkdir(parents=True, exist_ok=True)
    _run(page, f"--screenshot={png.resolve()}", f"--window-size={window[0]},{window[1]}")
    return png


def dump_dom(page: pathlib.Path, window: tuple[int, int] = WINDOW) -> str:
    return _run(page, "--dump-dom", f"--window-size={window[0]},{window[1]}").stdout
