"""The README's example runs as written and shows what it says: one file, three backends, equal logits."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = "<!-- readme-example: shared_tests/test_readme.py runs this block -->"


def readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert MARKER in text, "the README's example block lost its marker"
    match = re.search(r"```python\n(.*?)```", text[text.index(MARKER) :], re.S)
    assert match, "no python block after the marker"
    return match.group(1)


def test_readme_example_is_at_most_a_dozen_lines():
    lines = [line for line in readme_example().splitlines() if line.strip()]
    assert len(lines) <= 12, f"the example grew to {len(lines)} lines"


def test_readme_example_runs_and_the_three_backends_agree(tmp_path):
    pytest.importorskip("torch", reason="the example needs the [torch] extra")
    pytest.importorskip("jax", reason="the example needs the [jax] extra")
    result = subprocess.run(
        [sys.executable, "-c", readme_example()], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    differences = {line.split()[0]: float(line.rsplit(" ", 1)[1]) for line in result.stdout.splitlines()}
    assert set(differences) == {"numpy", "jax"}, result.stdout
    assert all(d < 1e-5 for d in differences.values()), differences  # float32 weights: the suite's tolerance
