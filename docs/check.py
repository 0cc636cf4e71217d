"""Checks of a built site that a comment or a blank line in a backend cannot fail.

The site is not compared with a committed copy: it is built from the source and then
checked for what matters to a reader (``python -m docs.build --check``,
``shared_tests/repository/test_docs.py``):

- ``missing_definitions``: every function or class that ``docs/components.py`` names exists
  in each backend's file, unless the page says why that backend has none (its ``notes``,
  or a backward pass where the framework has autograd). A renamed or removed definition is
  reported by file and name.
- ``site_problems``: every page was built (the markdown pages of ``docs/prose.py`` too); every
  link between pages reaches a page and an anchor on it, every link to a source file reaches a
  file; every component page has its three columns, each showing real code: the lines shown
  are the file's lines at the numbers shown.
"""

from __future__ import annotations

import html.parser
import pathlib
import re

from . import prose, source
from .components import PAGES, declared_absent
from .pages import BACKENDS, SOURCE_LINK, parse_code


def missing_definitions(root: pathlib.Path) -> list[str]:
    """One sentence per definition named in ``docs/components.py`` that a backend lacks without a reason."""
    source.clear_cache()  # the files as they are now
    found = []
    for page in PAGES:
        for spec in page.code:
            file, names = parse_code(spec)
            for name in names:
                paths = [file] if "/" in file else [f"{package}/{file}" for _, _, package, _ in BACKENDS]
                backends = ["shared"] if "/" in file else [backend for backend, _, _, _ in BACKENDS]
                absent = [path for path in paths if source.find(root, path, name) is None]
                if len(absent) == len(paths) > 1:
                    found.append(
                        f"docs/components.py, page {page.slug!r}: no backend has a top-level `{name}` in {file} "
                        "(renamed or removed? update the page's `code`)"
                    )
                    continue
                for backend, path in zip(backends, paths, strict=True):
                    if path in absent and not declared_absent(page, name, backend):
                        found.append(
                            f"docs/components.py, page {page.slug!r}: {path} has no top-level `{name}` "
                            "(renamed or removed? update the page's `code`, or say in its `notes` why this "
                            "backend has none)"
                        )
    return found


class Node:
    """An element of a parsed page: enough of a DOM to find cells, links and ids."""

    def __init__(self, tag: str, attrs: dict[str, str], parent: Node | None):
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []

    @property
    def classes(self) -> list[str]:
        return self.attrs.get("class", "").split()

    def walk(self):
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.walk()

    def text(self, skip: str = "") -> str:
        """The text inside, leaving out elements of class ``skip``."""
        parts = []
        for child in self.children:
            if isinstance(child, str):
                parts.append(child)
            elif not (skip and skip in child.classes):
                parts.append(child.text(skip))
        return "".join(parts)


VOID = {"meta", "link", "br", "img", "hr", "input", "col", "wbr"}


class _Parser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {}, None)
        self.current = self.root

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs}, self.current)
        self.current.children.append(node)
        if tag not in VOID:
            self.current = node

    def handle_endtag(self, tag):
        node = self.current
        while node is not self.root and node.tag != tag:
            node = node.parent
        if node is not self.root:
            self.current = node.parent

    def handle_data(self, data):
        self.current.children.append(data)


def parse(text: str) -> Node:
    parser = _Parser()
    parser.feed(text)
    parser.close()
    return parser.root


def _code_cell_problems(root: pathlib.Path, page: str, cell: Node) -> list[str]:
    """A cell with code: its lines are the file's lines at the numbers it shows."""
    where = next((n for n in cell.walk() if "where" in n.classes), None)
    lines = [n for n in cell.walk() if "line" in n.classes]
    if where is None or not lines:
        return [f"{page}: a code cell without its file or its code"]
    path = where.text(skip="lines").strip()
    span = re.fullmatch(r":(\d+)–(\d+)", where.text().strip()[len(path) :].strip())
    if span is None:
        return [f"{page}: the cell for {path} shows no line numbers"]
    start, end = int(span.group(1)), int(span.group(2))
    file = root / path
    if not file.exists():
        return [f"{page}: the cell shows {path}, which does not exist"]
    expected = file.read_text(encoding="utf-8").splitlines()[start - 1 : end]
    shown = [n.text(skip="linenos") for n in lines]
    numbers = [n.text() for n in lines for n in n.walk() if "linenos" in n.classes]
    if shown != expected or numbers != [str(i) for i in range(start, end + 1)]:
        return [f"{page}: the code shown for {path}:{start}-{end} is not the file's lines {start}-{end}"]
    return []


def site_problems(root: pathlib.Path, site: pathlib.Path) -> list[str]:
    """What is wrong with the site built in ``site`` from the source in ``root`` (nothing: [])."""
    pages = {p.name: parse(p.read_text(encoding="utf-8")) for p in sorted(site.glob("*.html"))}
    expected = ["index.html", "tutorials.html", *(f"{page.slug}.html" for page in (*PAGES, *prose.PAGES))]
    found = [f"{name} was not built" for name in expected if name not in pages]
    if not (site / "style.css").exists():
        found.append("style.css was not built")
    ids = {name: {n.attrs["id"] for n in doc.walk() if "id" in n.attrs} for name, doc in pages.items()}
    for name, doc in pages.items():
        for node in doc.walk():
            href = node.attrs.get("href", "") if node.tag in ("a", "link") else ""
            if not href or re.match(r"[a-z]+:", href):
                continue  # none, or another site (http:, mailto:)
            if href.startswith(SOURCE_LINK):
                target = href[len(SOURCE_LINK) :].split("#")[0]
                if not (root / target).exists():
                    found.append(f"{name}: link to {target}, which does not exist")
                continue
            target, _, anchor = href.partition("#")
            target = target or name
            if target.endswith(".css"):
                continue
            if target not in pages:
                found.append(f"{name}: link to {href}, a page that was not built")
            elif anchor and anchor not in ids[target]:
                found.append(f"{name}: link to {href}, but {target} has no #{anchor}")
    for page in PAGES:
        doc = pages.get(f"{page.slug}.html")
        if doc is not None:
            found += _columns_problems(root, f"{page.slug}.html", doc)
    return list(dict.fromkeys(found))  # a broken link once per page, however often it is there


def _columns_problems(root: pathlib.Path, name: str, doc: Node) -> list[str]:
    section = next((n for n in doc.walk() if "columns" in n.classes), None)
    if section is None:
        return [f"{name}: no three-column section"]
    heads = [n for n in section.children if isinstance(n, Node) and "colhead" in n.classes]
    backends = [backend for backend, _, _, _ in BACKENDS]
    if [h.classes[-1] for h in heads] != [f"col-{b}" for b in backends]:
        return [f"{name}: column heads {[h.classes for h in heads]}, expected one per backend, in order"]
    found, with_code = [], dict.fromkeys(backends, 0)
    for cell in (n for n in section.walk() if "cell" in n.classes):
        backend = next(c[len("col-") :] for c in cell.classes if c.startswith("col-"))
        if "missing" in cell.classes:
            continue
        problems = _code_cell_problems(root, name, cell)
        found += problems
        if backend in with_code and not problems:
            with_code[backend] += 1
    found += [f"{name}: the {b} column shows no code" for b, count in with_code.items() if count == 0]
    return found
