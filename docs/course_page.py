"""The course on the docs site: one page listing every chapter of ``notebooks/`` (its title, its
source, its exercises and their solutions), and each chapter's executed notebook rendered as a
page of its own wherever it has been built with its outputs (``python -m transformer_course.build``;
rendering needs nbconvert, which the ``[notebooks]`` extra installs). A chapter not built yet is
linked as its source, with the command that builds it.
"""

from __future__ import annotations

import html
import importlib.util
import json
import pathlib
import re

from .mathml import tex_to_mathml
from .pages import SOURCE_LINK

TITLE = "Course"
SUMMARY = "The course: one notebook per chapter, run in all three backends, with exercises and their checkers."


def chapters(notebooks: pathlib.Path) -> list[tuple[str, str]]:
    """(stem, title) of every chapter source, in reading order; the title is its first heading."""
    found = []
    for path in sorted(notebooks.glob("[0-9][0-9]_*.py")):
        match = re.search(r"^# # (.+)$", path.read_text(encoding="utf-8"), re.M)
        found.append((path.stem, match.group(1) if match else path.stem))
    return found


def _executed(notebook: pathlib.Path) -> bool:
    if not notebook.exists():
        return False
    cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    return any(cell.get("outputs") for cell in cells if cell.get("cell_type") == "code")


def _math(match: re.Match) -> str:
    display = match.group(1) is not None
    tex = match.group(1) if display else match.group(2)
    try:
        return tex_to_mathml(tex.strip(), display=display)
    except (ValueError, KeyError):  # TeX the site's converter does not know: shown as written
        return match.group(0)


MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$([^$\n]+?)\$", re.S)


def rendered_chapter(notebook: pathlib.Path) -> str:
    """The executed notebook's cells and outputs as HTML (nbconvert's basic template: no page around
    it), its equations as MathML, as on the other pages (a static page runs no MathJax)."""
    import nbformat
    from nbconvert import HTMLExporter

    book = nbformat.read(notebook, as_version=4)
    for cell in book.cells:
        if cell.cell_type == "markdown":
            cell.source = MATH.sub(_math, cell.source)
    body, _ = HTMLExporter(template_name="basic").from_notebook_node(book)
    return f'<div class="course-notebook">{body}</div>'


def course_pages(root: pathlib.Path) -> dict[str, str]:
    """slug -> body: "course" (the list), and "course-<stem>" for each chapter built with its outputs."""
    from transformer_course.exercises import chapter

    notebooks = root / "notebooks"
    can_render = importlib.util.find_spec("nbconvert") is not None
    bodies, sections = {}, []
    for stem, title in chapters(notebooks):
        built = notebooks / f"{stem}.ipynb"
        links = [f'<a href="{SOURCE_LINK}notebooks/{stem}.py">the source, notebooks/{stem}.py</a>']
        if can_render and _executed(built):
            bodies[f"course-{stem}"] = rendered_chapter(built)  # its first cell is its title
            links.insert(0, f'<a href="course-{stem}.html">the notebook, run</a>')
        else:
            links.append(f"built and run by <code>python -m transformer_course.build {stem[:2]}</code>")
        exercises = "".join(
            f"<li><code>{html.escape(e.name)}</code>: {html.escape(e.task)} "
            f"<span class=\"how\">({len(e.mistakes)} known mistakes named)</span></li>"
            for e in chapter(stem)
        )
        solutions = notebooks / "solutions" / f"{stem}.py"
        if solutions.exists():
            links.append(f'<a href="{SOURCE_LINK}notebooks/solutions/{stem}.py">the solutions</a>')
        sections.append(
            f'<section id="{stem}"><h2>{html.escape(title)}</h2>\n<p>{" · ".join(links)}</p>\n'
            + (f"<ul>{exercises}</ul>" if exercises else "")
            + "</section>"
        )
    bodies["course"] = (
        "<h1>The course</h1>\n<p>One notebook per chapter, in the reading order of the backends' files, and "
        "four beyond it. Each shows the idea and its equation, every backend's code read from its file as the "
        "cell runs, the three run on the same weights and compared, and exercises whose checker runs your "
        "function against every backend's own code and names the classic mistake an answer makes. Open them "
        "with <code>jupyter lab notebooks/</code> after <code>python -m transformer_course.build "
        "--no-execute</code>; <code>python -m transformer_course.build</code> builds and runs every chapter, "
        "<code>python -m transformer_course.build 04_attention</code> one (any part of its file name picks "
        "it).</p>\n" + "\n".join(sections)
    )
    return bodies
