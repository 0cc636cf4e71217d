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


# ---------------------------------------------------------------- the shell examples, runnable as written
# Nothing is activated on a fresh machine: after `python3 -m venv .venv && .venv/bin/pip install ...` the
# project's commands live in .venv/bin/, not on PATH. A command the virtualenv installs must be called
# by that path (or after `. .venv/bin/activate &&` in the same command line).
IN_THE_VENV = {"transformer-ref", "python", "pytest", "nox", "pip", "ruff"}
# .venv/bin/NAME -> what the README must install for it to be there (python and pip come with the venv).
INSTALLED_BY = {
    "transformer-ref": r"pip install -e",
    "nox": r"pip install nox",
    "pytest": r"pip install -e \S*\[[\w,]*\btest\b",
}
ACTIVATE = re.compile(r"^(source|\.)\s+\.venv/bin/activate$")


def shell_examples(text: str) -> list[str]:
    """Every command line of the README's ```bash / ```sh / ```shell blocks, continuations joined."""
    lines = []
    for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text, re.S | re.M):
        lines += [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    return lines


def commands(line: str) -> list[str]:
    """The commands of one line, split at &&, ||, ; and |, comments dropped (no quoted # or && here)."""
    line = re.sub(r"(^|\s)#.*", "", line)
    return [part.strip() for part in re.split(r"&&|\|\||;|\|", line) if part.strip()]


def bare_commands(text: str) -> list[str]:
    """The README lines that call a virtualenv's command by its bare name, outside an activated line."""
    bad = []
    for line in shell_examples(text):
        active = False
        for command in commands(line):
            if ACTIVATE.match(command):
                active = True
                continue
            name = command.split()[0]
            if name in IN_THE_VENV and not active:
                bad.append(line)
                break
    return bad


def venv_commands_not_installed(text: str) -> list[str]:
    """.venv/bin/NAME used in an example, where no example installs NAME."""
    examples = shell_examples(text)
    installs = " ".join(c for line in examples for c in commands(line) if " install " in f" {c} ")
    used = {m for line in examples for m in re.findall(r"\.venv/bin/([\w.-]+)", line)}
    return sorted(name for name in used if name in INSTALLED_BY and not re.search(INSTALLED_BY[name], installs))


def test_every_shell_example_runs_without_activating_anything():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(shell_examples(text)) >= 10, "the README's shell blocks were not found"
    bad = bare_commands(text)
    assert not bad, "bare commands that are not on PATH after the setup command (use .venv/bin/...):\n" + "\n".join(bad)
    missing = venv_commands_not_installed(text)
    assert not missing, f"the README runs .venv/bin/{missing} but never installs them"


def test_the_shell_example_check_sees_bare_commands():
    text = (
        "```bash\npython3 -m venv .venv && .venv/bin/pip install -e .\ntransformer-ref compare\n"
        ".venv/bin/python -m docs.build && python -m docs.build\n"
        "echo hi | pytest -q   # a comment naming nox\n"
        ". .venv/bin/activate && pytest shared_tests && nox -s lint\n"
        ".venv/bin/transformer-ref trace \\\n    --filter x   # transformer-ref here is a comment\n```\n"
        "```\ntransformer-ref output, not a command\n```\n"
    )
    assert bare_commands(text) == [
        "transformer-ref compare",
        ".venv/bin/python -m docs.build && python -m docs.build",
        "echo hi | pytest -q   # a comment naming nox",
    ]
    assert venv_commands_not_installed(text) == []
    assert venv_commands_not_installed("```bash\n.venv/bin/nox -s lint\n```\n") == ["nox"]
    assert venv_commands_not_installed('```bash\n.venv/bin/pip install -e ".[all]"\n.venv/bin/pytest\n```\n') == [
        "pytest"
    ]
    assert venv_commands_not_installed('```bash\n.venv/bin/pip install -e ".[all,test]"\n.venv/bin/pytest\n```\n') == []
