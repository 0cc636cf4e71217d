"""The markdown pages of ``docs/`` (the ones the README links), rendered into the site.

Each page is one markdown file, read as it is on GitHub and rendered here into a page of the
site with the same text: a link to another page becomes a link to its ``.html``, an image is
copied into the site, a link to any other file of the repository points at the file (as the
component pages' source links do), and every heading gets the id GitHub gives it, so that
``measurements.md#what-compare-prints`` reaches the same heading in both places. The generated
tables in them (``tools/readme_numbers.py``) are rendered like any other table.
"""

from __future__ import annotations

import dataclasses
import html
import pathlib
import posixpath
import re

from markdown_it import MarkdownIt

from .pages import SOURCE_LINK


@dataclasses.dataclass(frozen=True)
class Prose:
    file: str  # docs/<file>
    label: str  # in the site's navigation
    summary: str  # one line, for the index

    @property
    def slug(self) -> str:
        return self.file.removesuffix(".md")


PAGES = (
    Prose("contracts.md", "Contracts", "What every backend promises: weights, masks, inputs, errors, files, threads."),
    Prose("command-line.md", "Command line", "`transformer-ref`: compare, trace, attention maps, pitfalls."),
    Prose("measurements.md", "Measurements", "How agreement is measured; what `compare` prints; the oracles."),
    Prose("modern-decoder.md", "Modern decoder", "RMSNorm, SwiGLU, rotary, grouped-query; the real SmolLM2-135M."),
    Prose(
        "gradients-and-training.md",
        "Gradients and training",
        "NumPy's backward, training, checkpoints, dropout, Shakespeare, data parallel, bf16.",
    ),
    Prose("performance.md", "Performance", "Against each framework's own modules; training speed and memory."),
    Prose("test-time.md", "Test time", "Where the test command's time goes, and how the suite stays cheap."),
    Prose("files.md", "Files", "Where things are: every folder, file by file."),
)
BY_FILE = {page.file: page for page in PAGES}

_MARKDOWN = MarkdownIt("commonmark", {"html": True}).enable("table")


def heading_id(text: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _target(reference: str, images: dict[str, pathlib.Path], root: pathlib.Path, image: bool = False) -> str:
    """A link or image source of a page in docs/ -> where it points from the site."""
    if re.match(r"[a-z]+:", reference) or reference.startswith("#"):
        return reference  # another site, or this page
    path, hash_, anchor = reference.partition("#")
    relative = posixpath.normpath(posixpath.join("docs", path))  # from the repository root
    if relative.startswith("docs/") and relative[len("docs/") :] in BY_FILE:
        return BY_FILE[relative[len("docs/") :]].slug + ".html" + hash_ + anchor
    if image:
        name = posixpath.basename(relative)
        images[name] = root / relative
        return name
    return SOURCE_LINK + relative + hash_ + anchor


def render(root: pathlib.Path, page: Prose) -> tuple[str, str, dict[str, pathlib.Path]]:
    """-> (the page's title, its HTML body, the images it shows: file name in the site -> file)."""
    text = (root / "docs" / page.file).read_text(encoding="utf-8")
    tokens = _MARKDOWN.parse(text)
    images: dict[str, pathlib.Path] = {}
    title = page.label
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            content = tokens[i + 1].content
            token.attrSet("id", heading_id(content))
            if token.tag == "h1":
                title = content.replace("`", "")
        for child in token.children or ():
            if child.type == "link_open":
                child.attrSet("href", _target(str(child.attrGet("href")), images, root))
            elif child.type == "image":
                child.attrSet("src", _target(str(child.attrGet("src")), images, root, image=True))
    body = _MARKDOWN.renderer.render(tokens, _MARKDOWN.options, {})
    source = f'<a href="{SOURCE_LINK}docs/{page.file}">docs/{html.escape(page.file)}</a>'
    return title, f'<article class="prose">\n{body}<p class="how">Rendered from {source}.</p>\n</article>', images
