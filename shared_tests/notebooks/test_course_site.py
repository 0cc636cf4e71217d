"""The docs site has the course: a page listing every chapter with its exercises, and each chapter
built with its outputs rendered as a page (its equations as MathML, its code columns, its pictures)."""

from __future__ import annotations

import re
import shutil

import pytest

pytest.importorskip("nbconvert", reason="the course's tools are not installed: pip install -e '.[notebooks]'")
pytest.importorskip("nbclient", reason="the course's tools are not installed: pip install -e '.[notebooks]'")

from docs import course_page  # noqa: E402
from transformer_course.build import NOTEBOOKS, build, chapters, selected  # noqa: E402


def test_every_chapter_is_listed_and_a_chapter_built_with_outputs_is_a_page(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for source in chapters()[:2]:
        shutil.copy(source, folder / source.name)
    first, second = sorted(folder.glob("*.py"))
    build(first)  # run, with its outputs; the second chapter stays unbuilt
    pages = course_page.course_pages(tmp_path)
    assert set(pages) == {"course", f"course-{first.stem}"}
    listing = pages["course"]
    assert f'href="course-{first.stem}.html"' in listing
    assert f"python -m transformer_course.build {second.stem[:2]}" in listing
    # how to build them all, and one: the intro says both
    assert "<code>python -m transformer_course.build</code> builds and runs every chapter" in listing
    (word,) = re.findall(r"<code>python -m transformer_course\.build (\w+)</code> one", listing)
    assert [p.stem for p in selected([word])] == [word]
    assert "<code>causal_mask</code>" in listing  # the exercises, by name
    chapter = pages[f"course-{first.stem}"]
    assert "This is a classic mistake: the mask's polarity." in chapter  # the checker's verdict, as rendered
    assert "<math" in chapter and "$$" not in chapter
    assert "numpy_impl/masks.py" in chapter and "data:image/png;base64" in chapter


def test_the_site_lists_the_repositorys_chapters():
    stems = [stem for stem, _ in course_page.chapters(NOTEBOOKS)]
    assert stems == [p.stem for p in chapters()]
    assert all(title[0].isdigit() for _, title in course_page.chapters(NOTEBOOKS))
