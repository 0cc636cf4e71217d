"""Build the static reference site into ``docs/site/``: ``python -m docs.build [--out DIR] [--check] [--screenshot]``.

Every page is a pure function of the source files (cut out with ``ast``, highlighted with
pygments), ``docs/components.py`` (the page list) and three committed measurements:
``docs/parity.json`` (the test suite's numbers), ``docs/walkthrough.json`` and
``docs/pitfalls.json``. So a build is byte-for-byte reproducible, and
``shared_tests/test_docs.py`` can fail when the committed site is stale. ``nox -s docs``
re-measures the three JSON files first, then runs this with ``--screenshot``.

- ``--check``: build in memory, compare with ``docs/site/``, list the stale pages (exit 1).
- ``--screenshot``: also save ``docs/screenshots/attention.png`` (headless Chromium, 1600x1000).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from pygments.formatters import HtmlFormatter

from transformer_spec.mirror import mirror_report

from . import chromium, mirror_page, pages, parity, source
from .components import PAGES

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SITE = DOCS / "site"
SCREENSHOT = DOCS / "screenshots" / "attention.png"
SCREENSHOT_PAGE = "attention.html"
GENERATED = (".html", ".css")  # what a build owns in its output folder


def _load(path: pathlib.Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def stylesheet() -> str:
    ours = (DOCS / "site.css").read_text(encoding="utf-8")
    theirs = HtmlFormatter(style="default").get_style_defs(".highlight")
    return f"{ours}\n/* pygments, style 'default' (generated) */\n{theirs}\n"


def render_site(root: pathlib.Path = ROOT) -> dict[str, str]:
    """file name -> content of every file of the site."""
    source.clear_cache()
    docs = root / "docs"
    report = parity.load(docs / "parity.json")
    walkthrough = _load(docs / "walkthrough.json")
    pitfalls = _load(docs / "pitfalls.json")
    mirror = mirror_report(root)  # read from the source files, as the component pages are
    extra = []
    if walkthrough:
        extra.append(("walkthrough", "Walkthrough", f"“{walkthrough['text']}” through BERT-base, every shape."))
    if pitfalls:
        extra.append(("pitfalls", "Pitfalls", "Where the frameworks disagree, run and measured."))
    extra.append(("mirror", mirror_page.TITLE, mirror_page.SUMMARY))
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
    body = mirror_page.mirror_page(mirror, _load(docs / "mirror_baseline.json"))
    files["mirror.html"] = pages.layout(mirror_page.TITLE, "mirror", body, nav)
    return dict(sorted(files.items()))


def write(files: dict[str, str], out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for old in sorted(out.iterdir()):
        if old.is_file() and old.suffix in GENERATED and old.name not in files:
            old.unlink()  # a page that no longer exists
    for name, content in files.items():
        (out / name).write_bytes(content.encode("utf-8"))


def stale(files: dict[str, str], site: pathlib.Path = SITE) -> list[str]:
    """Names of the files that differ from ``site``'s, are missing there, or should not be there."""
    on_disk = {p.name for p in site.iterdir() if p.is_file() and p.suffix in GENERATED} if site.exists() else set()
    differ = [
        name for name, content in files.items() if name not in on_disk or (site / name).read_bytes() != content.encode()
    ]
    return sorted(differ + [f"{name} (no longer generated)" for name in on_disk - set(files)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=SITE, help="output folder (default: docs/site)")
    parser.add_argument("--check", action="store_true", help="compare with --out instead of writing; exit 1 if stale")
    parser.add_argument("--screenshot", action="store_true", help=f"also save {SCREENSHOT.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    files = render_site()
    if args.check:
        differ = stale(files, args.out)
        if differ:
            print(f"{args.out} is stale: run `nox -s docs`\n  " + "\n  ".join(differ))
            return 1
        print(f"{args.out} is up to date ({len(files)} files)")
        return 0
    write(files, args.out)
    size = sum(len(c.encode()) for c in files.values())
    print(f"wrote {len(files)} files ({size / 1024:.0f} KiB) to {args.out}")
    if args.screenshot:
        chromium.screenshot(args.out / SCREENSHOT_PAGE, SCREENSHOT)
        print(f"wrote {SCREENSHOT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
