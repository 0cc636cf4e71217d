"""The README is a newcomer's page: short, in a fixed order, its example runs as written and shows
what it says (one file, three backends, equal logits); its shell commands, and those of
CONTRIBUTING.md and the docs pages, run on a fresh machine as written; every link reaches a file."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MARKER = "<!-- readme-example: shared_tests/repository/test_readme.py runs this block -->"
README_MAX_LINES, README_MAX_BYTES = 200, 16_000  # a page a newcomer reads to the end; the rest is in docs/
# The two commands for a fresh machine, exactly: CI (.ci/run) runs the second one's nox sessions.
INSTALL_AND_COMPARE = 'python3 -m venv .venv && .venv/bin/pip install -e ".[all]" && .venv/bin/transformer-ref compare'
# The course from a fresh clone: two commands, the second opens it in JupyterLab
# (shared_tests/notebooks/test_jupyterlab.py opens a chapter so built, in headless Chromium).
COURSE_COMMANDS = (
    'python3 -m venv .venv && .venv/bin/pip install -e ".[notebooks]" && '
    ".venv/bin/python -m transformer_course.build --no-execute",
    ".venv/bin/jupyter lab notebooks/",
)
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install nox && .venv/bin/nox -s lint suite"


def markdown_pages() -> dict[str, str]:
    """README.md, CONTRIBUTING.md and the docs pages (docs/*.md) -> their text."""
    paths = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8") for path in paths}


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
    """In the README, CONTRIBUTING.md and every docs page; a page may rely on the README's setup command."""
    pages = markdown_pages()
    readme = pages["README.md"]
    assert shell_examples(readme)[:2] == [INSTALL_AND_COMPARE, TEST_COMMAND], "the README's two commands"
    assert len([line for text in pages.values() for line in shell_examples(text)]) >= 10, "shell blocks not found"
    for name, text in pages.items():
        bad = bare_commands(text)
        assert not bad, f"{name}: bare commands that are not on PATH after the setup command (use .venv/bin/...):\n" + (
            "\n".join(bad)
        )
        missing = venv_commands_not_installed(readme + "\n" + text)
        assert not missing, f"{name} runs .venv/bin/{missing} but neither it nor the README installs them"


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


# ---------------------------------------------------------------- the README: a newcomer's page
def sections(text: str) -> list[str]:
    return re.findall(r"^## (.+)$", text, re.M)


def test_the_readme_is_at_most_200_lines_and_16_kb():
    data = (ROOT / "README.md").read_bytes()
    lines = data.decode("utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail to docs/"
    assert len(data) <= README_MAX_BYTES, f"README.md has {len(data)} bytes (at most {README_MAX_BYTES}): move detail to docs/"


def test_the_readme_holds_its_parts_in_order():
    """What the project is; the reading order; the example; the two commands; the layout; the
    agreement table; the links to the docs pages and CONTRIBUTING.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert text.startswith("# The Transformer, three ways\n\n"), "the title, then one paragraph"
    assert sections(text) == ["How to read it", "Two commands for a fresh machine", "Learn it in notebooks", "Layout", "Measured agreement", "More"]
    order = ["## How to read it", "1. `masks.py`", "11. `gradients.py`", MARKER, INSTALL_AND_COMPARE, TEST_COMMAND,
             "## Layout", "<!-- numbers: agreement -->", "## More", "- [CONTRIBUTING.md](CONTRIBUTING.md)"]  # fmt: skip
    where = [text.find(part) for part in order]
    assert -1 not in where, [part for part, at in zip(order, where, strict=True) if at == -1]
    assert where == sorted(where), "the README's parts are out of order"


def test_the_reading_order_names_files_every_backend_has():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    reading = text[text.index("## How to read it") : text.index(MARKER)]
    files = re.findall(r"(?:^|, )\d+\. `(\w+\.py)`", reading, re.M)
    assert len(files) == 11, files
    for package in ("numpy_impl", "jax_impl", "torch_impl"):
        assert not [f for f in files if not (ROOT / package / f).is_file()], f"{package} lacks a file of the reading order"


def test_the_readme_opens_the_course_in_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Learn it in notebooks") : text.index("## Layout")]
    assert re.findall(r"```bash\n(.*?)```", section, re.S) == ["\n".join(COURSE_COMMANDS) + "\n"]


def test_ci_runs_the_readmes_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    sessions = TEST_COMMAND.rsplit("/nox ", 1)[1]  # -s lint suite
    assert re.search(rf"^\S*nox {re.escape(sessions)}$", ci, re.M), f"CI does not run nox {sessions}"


def layout_table(text: str) -> list[tuple[str, str]]:
    section = text[text.index("## Layout") : text.index("## Measured agreement")]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    return [tuple(cell.strip() for cell in row.strip("|").split(" | ")) for row in rows[1:]]


def test_the_layout_table_names_every_top_level_folder_in_one_short_line_each():
    rows = layout_table((ROOT / "README.md").read_text(encoding="utf-8"))
    named = {folder for path, _ in rows for folder in re.findall(r"`(\w+)/`", path)}
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}  # every top-level folder is a package
    assert packages <= named, f"the README's layout table lacks {sorted(packages - named)}"
    assert not [f for f in named if not (ROOT / f).is_dir()], f"the layout table names folders that do not exist: {named}"
    long = [path for path, what in rows if len(path) + len(what) > 120]
    assert not long, f"layout rows too long for one line (the whole story goes in docs/files.md): {long}"


def test_every_code_block_of_the_markdown_pages_is_closed():
    """An unclosed fence swallows the rest of its page, and hides its commands from the checks above."""
    unclosed = [name for name, text in markdown_pages().items() if len(re.findall(r"^```", text, re.M)) % 2]
    assert not unclosed, f"a code block without its closing ``` in {unclosed}"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(text: str) -> set[str]:
    """The ids GitHub gives a markdown file's headings (fenced code left out)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    headings = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.replace("`", "").strip().lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_of_the_markdown_pages_reaches_a_file_and_its_heading():
    broken = []
    for name, text in markdown_pages().items():
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (ROOT / name).parent / file if file else ROOT / name
            if not path.exists():
                broken.append(f"{name}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text(encoding="utf-8")):
                broken.append(f"{name}: {target} (no such heading)")
    assert not broken, broken


def test_the_readme_links_every_docs_page_and_contributing():
    links = set(LINK.findall((ROOT / "README.md").read_text(encoding="utf-8")))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} | {"CONTRIBUTING.md"}
    assert pages <= {link.split("#")[0] for link in links}, f"not linked from the README: {pages - links}"
