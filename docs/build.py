"""Build the static reference site into ``docs/site/``: ``python -m docs.build [--out DIR] [--check] [--screenshot]``.

Every page is a pure function of the source files (cut out with ``ast``, highlighted with
pygments), ``docs/components.py`` (the page list) and four committed measurements:
``docs/parity.json`` (the test suite's numbers), ``docs/walkthrough.json``,
``docs/pitfalls.json`` and ``docs/smollm2.json`` (with the attention maps it names, in
``docs/images/``, copied into the site), and the markdown pages of ``docs/`` that the README
links (``docs/prose.py``: the same text as on GitHub). The site itself is not committed: it is
built from the source (here, by ``nox -s docs``, and by ``shared_tests/repository/test_docs.py`` into a
temporary folder) and checked for what a reader needs, never compared byte for byte, so a
comment or a blank line in a backend, or another pygments version, changes nothing that is checked.

- ``--check``: then check the site built (``docs.check``: every page, every definition that
  ``docs/components.py`` names in every backend, every link, real code in all three
  columns); exit 1 on a problem.
- ``--screenshot``: then save ``docs/screenshots/attention-<width>.png`` at each width of
  ``docs.layout.WIDTHS`` and measure every page at those widths (headless Chromium:
  equations clipped or scrolled, content cut off, columns not side by side); exit 1 on a problem.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from pygments.formatters import HtmlFormatter

from transformer_mirror.mirror import mirror_report

from . import check, chromium, course_page, layout, mirror_page, pages, parity, prose, source
from .components import PAGES

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SITE = DOCS / "site"
SCREENSHOTS = DOCS / "screenshots"  # attention-<width>.png
SCREENSHOT_PAGE = "attention.html"
GENERATED = (".html", ".css", ".png")  # what a build owns in its output folder


def _load(path: pathlib.Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def stylesheet() -> str:
    ours = (DOCS / "site.css").read_text(encoding="utf-8")
    theirs = HtmlFormatter(style="default").get_style_defs(".highlight")
    return f"{ours}\n/* pygments, style 'default' (generated) */\n{theirs}\n"


def render_site(root: pathlib.Path = ROOT) -> dict[str, str | bytes]:
    """file name -> content of every file of the site (text, or the bytes of an image)."""
    source.clear_cache()
    docs = root / "docs"
    report = parity.load(docs / "parity.json")
    walkthrough = _load(docs / "walkthrough.json")
    pitfalls = _load(docs / "pitfalls.json")
    smollm2 = _load(docs / "smollm2.json")
    mirror = mirror_report(root)  # read from the source files, as the component pages are
    extra = []
    if walkthrough:
        extra.append(("walkthrough", "Walkthrough", f"“{walkthrough['text']}” through BERT-base, every shape."))
    if pitfalls:
        extra.append(("pitfalls", "Pitfalls", "Where the frameworks disagree, run and measured."))
    if smollm2:
        extra.append(
            ("smollm2", "SmolLM2", f"“{smollm2['text']}” through the real SmolLM2-135M: trace, attention, RoPE.")
        )
    extra.append(("tutorials", "Tutorials", "The five tutorials this reference grew from, and their bugs fixed here."))
    extra.append(("mirror", mirror_page.TITLE, mirror_page.SUMMARY))
    extra.append(("course", course_page.TITLE, course_page.SUMMARY))
    course = course_page.course_pages(root)
    extra += [(page.slug, page.label, page.summary) for page in prose.PAGES]
    nav = [("index", "Index"), *((p.slug, p.title.split(":")[0]) for p in PAGES), *((s, t) for s, t, _ in extra)]
    files = {"style.css": stylesheet()}
    files["index.html"] = pages.layout("Index", "index", pages.index_page(report, extra), nav)
    for page in PAGES:
        body = pages.component_page(root, page, report)
        files[f"{page.slug}.html"] = pages.layout(page.title, page.slug, body, nav)
    if walkthrough:
        files["walkthrough.html"] = pages.layout("Walkthrough", "walkthrough", pages.walkthrough_page(walkthrough), nav)
    if pitfalls:
        files["pitfalls.html"] = pages.layout("Pitfalls", "pitfalls", pages.pitfalls_page(pitfalls), nav)
    if smollm2:
        files["smollm2.html"] = pages.layout("SmolLM2", "smollm2", pages.smollm2_page(smollm2), nav)
        for image in smollm2["images"]:  # made with the data by python -m docs.smollm2_data
            files[pathlib.PurePosixPath(image["file"]).name] = (docs / image["file"]).read_bytes()
    files["tutorials.html"] = pages.layout("Tutorials", "tutorials", pages.tutorials_page(pitfalls), nav)
    body = mirror_page.mirror_page(mirror, _load(docs / "mirror_baseline.json"))
    files["mirror.html"] = pages.layout(mirror_page.TITLE, "mirror", body, nav)
    for slug, body in course.items():  # the course page, and each chapter built with its outputs
        files[f"{slug}.html"] = pages.layout(course_page.TITLE, "course", body, nav)
    for page in prose.PAGES:  # the markdown pages the README links
        title, body, images = prose.render(root, page)
        files[f"{page.slug}.html"] = pages.layout(title, page.slug, body, nav)
        files.update((name, path.read_bytes()) for name, path in images.items())
    return dict(sorted(files.items()))


def write(files: dict[str, str | bytes], out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in sorted(out.iterdir()):
        if old.is_file() and old.suffix in GENERATED and old.name not in files:
            old.unlink()  # a page that no longer exists
    for name, content in files.items():
        (out / name).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=SITE, help="output folder (default: docs/site)")
    parser.add_argument("--check", action="store_true", help="then check the site built (pages, definitions, links)")
    parser.add_argument(
        "--screenshot", action="store_true", help=f"then screenshot it and measure every page at {layout.WIDTHS} px"
    )
    args = parser.parse_args(argv)
    files = render_site()
    write(files, args.out)
    size = sum(len(c if isinstance(c, bytes) else c.encode()) for c in files.values())
    print(f"wrote {len(files)} files ({size / 1024:.0f} KiB) to {args.out}")
    problems = []
    if args.check:
        problems += check.missing_definitions(ROOT) + check.site_problems(ROOT, args.out)
    if args.screenshot:
        for width in layout.WIDTHS:
            png = chromium.screenshot(args.out / SCREENSHOT_PAGE, SCREENSHOTS / f"attention-{width}.png", (width, 1000))
            print(f"wrote {png.relative_to(ROOT)}")
        problems += layout.problems(layout.measure(args.out))
    if problems:
        print(f"{len(problems)} problems:\n  " + "\n  ".join(problems))
        return 1
    if args.check or args.screenshot:
        print("checked: no problems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
