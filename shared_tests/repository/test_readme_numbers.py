"""The measured tables of the README and the docs pages are generated (``tools/readme_numbers.py``):
they must equal what the measurements' JSON outputs give, wherever they are, and the ``compare``
excerpt must be what ``compare`` prints."""

from __future__ import annotations

import contextlib
import io
import os
import re

import pytest

from tools import readme_numbers

NUMBER = re.compile(r"-?\d+\.\d+(?:e[-+]\d+)?")
TIME = re.compile(r"\d+\.\d+ ms")


def _markdown() -> dict[str, str]:
    """Every markdown file that may hold generated blocks -> its text."""
    texts = {}
    for path in readme_numbers.markdown_files():
        with open(path, encoding="utf-8") as f:
            texts[os.path.relpath(path, readme_numbers.ROOT)] = f.read()
    return texts


def test_every_generated_block_of_every_markdown_file_equals_what_its_source_gives():
    texts = _markdown()
    assert "README.md" in texts and any(name.startswith("docs/") for name in texts), sorted(texts)
    names = [name for text in texts.values() for name in readme_numbers.block_names(text)]
    assert sorted(names) == sorted(readme_numbers.blocks()), "every renderer has its block in one file, once"
    for file, text in texts.items():
        opened = re.findall(r"<!-- numbers: ([a-z]+) -->", text)
        assert opened == readme_numbers.block_names(text), f"{file}: a generated block without its closing line"
        _, changed = readme_numbers.render(text, file)
        assert not changed, f"{file}: blocks {changed} differ from their sources: run python -m tools.readme_numbers"


def test_the_readme_holds_the_agreement_table_and_the_docs_pages_the_others():
    """The README: the agreement table, one line of the compiled-vs-eager comparison, and one of the
    time its two commands take."""
    texts = _markdown()
    assert readme_numbers.block_names(texts["README.md"]) == ["compiledline", "testtime", "agreement"]
    elsewhere = [name for file, text in texts.items() if file != "README.md" for name in readme_numbers.block_names(text)]
    assert sorted(elsewhere) == sorted(set(readme_numbers.blocks()) - {"agreement", "compiledline", "testtime"})


def test_a_block_typed_by_hand_is_caught():
    with open(readme_numbers.README, encoding="utf-8") as f:
        readme = f.read()
    match = next(m for m in readme_numbers.BLOCK.finditer(readme) if m.group("name") == "agreement")
    edited = readme[: match.start("body")] + match.group("body").replace("e-", "e-1", 1) + readme[match.end("body") :]
    assert readme_numbers.render(edited)[1] == ["agreement"]


def _same_except_timings(printed: str, stored: str) -> list[str]:
    """Lines that differ beyond what another run or CPU changes: times are ignored; a difference
    printed in e-notation must keep its order of magnitude; a fixed-point value its 5th decimal."""
    problems = []
    printed_lines, stored_lines = printed.rstrip("\n").split("\n"), stored.rstrip("\n").split("\n")
    if len(printed_lines) != len(stored_lines):
        return [f"{len(printed_lines)} lines printed, {len(stored_lines)} stored"]
    for new, old in zip(printed_lines, stored_lines, strict=True):
        new, old = TIME.sub("T ms", new), TIME.sub("T ms", old)
        if NUMBER.sub("#", new).split() != NUMBER.sub("#", old).split():
            problems.append(f"{old!r} -> {new!r}")
            continue
        for text_a, text_b in zip(NUMBER.findall(new), NUMBER.findall(old), strict=True):
            a, b = float(text_a), float(text_b)
            if "e" in text_a:  # a difference: zero stays zero, otherwise the same order of magnitude
                close = (a == 0) == (b == 0) and (a == 0 or 0.01 <= abs(a / b) <= 100)
            else:  # a value: to the printed precision, give or take float32 rounding on another CPU
                close = abs(a - b) <= 2e-5 * max(1.0, abs(b))
            if not close:
                problems.append(f"{old!r} -> {new!r}")
                break
    return problems


def test_the_compare_excerpt_is_what_compare_prints_now():
    pytest.importorskip("jax")
    pytest.importorskip("torch")
    from transformer_cli.main import main

    if not os.path.exists(readme_numbers.COMPARE):
        pytest.fail(f"{readme_numbers.COMPARE} is missing: python -m tools.readme_numbers --measure writes it")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(readme_numbers.COMPARE_COMMAND) in (0, None)
    with open(readme_numbers.COMPARE, encoding="utf-8") as f:
        stored = f.read()
    problems = _same_except_timings(out.getvalue(), stored)
    assert not problems, "docs/compare.txt is stale (python -m tools.readme_numbers --measure):\n" + "\n".join(
        problems[:10]
    )


def test_nox_docs_measures_the_tests_the_readme_reads():
    """``nox -s docs`` rewrites docs/parity.json: with fewer tests the README's tables would lose rows."""
    import ast

    with open(os.path.join(os.path.dirname(readme_numbers.README), "noxfile.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    lists = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in ("DOCS_PARITY_TESTS", "ORACLE_TESTS")
    }
    assert lists["DOCS_PARITY_TESTS"] == readme_numbers.SUITE_TESTS
    assert all(path.startswith(lists["ORACLE_TESTS"] + "/") for path in readme_numbers.ORACLE_TESTS)
