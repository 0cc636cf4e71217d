"""The reference site, built from the source as CI builds it (``python -m docs.build --out DIR``)
and checked for what a reader needs, never compared byte for byte with a committed copy: every
page, every definition the pages name in every backend, every link, real code in three
columns. Then, in headless Chromium, every page measured at 1000, 1400 and 1900 px wide and the
attention page screenshot at each: equations never clipped, three columns side by side, no line of
code wrapped that its column holds (a 100-character line from 2200 px)."""

from __future__ import annotations

import pathlib
import re
import shutil

import numpy as np
import pytest

from docs import build, check, chromium, layout, prose, source
from docs.components import NOT_SHOWN, PAGES
from docs.mathml import tex_to_mathml
from docs.pages import BACKENDS, highlight_python, parse_code
from docs.tutorials import BY_SLUG, TUTORIALS

ROOT = pathlib.Path(__file__).resolve().parents[2]
COLUMN_COLOURS = {"numpy": (0x1F, 0x5F, 0xAE), "jax": (0x7B, 0x3F, 0xB5), "torch": (0xD9, 0x48, 0x0F)}  # site.css
needs_chromium = pytest.mark.skipif(
    chromium.find() is None, reason="chromium is not installed (Debian: apt-get install chromium)"
)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    """The site, built from the source into a temporary folder by the command CI would run."""
    out = tmp_path_factory.mktemp("site")
    assert build.main(["--out", str(out)]) == 0
    return out


def test_every_definition_a_page_names_is_in_every_backend():
    missing = check.missing_definitions(ROOT)
    assert not missing, "\n".join(missing)


def test_every_page_builds_with_working_links_and_three_columns_of_real_code(site):
    problems = check.site_problems(ROOT, site)
    assert not problems, "\n".join(problems)


def test_every_markdown_page_of_docs_is_a_page_of_the_site_with_the_same_headings(site):
    """docs/*.md (the pages the README links) are rendered into the site, each heading with the id
    GitHub gives it, so that a link to page.md#heading reaches the same heading in both places."""
    assert {page.file for page in prose.PAGES} == {path.name for path in (ROOT / "docs").glob("*.md")}
    for page in prose.PAGES:
        built = (site / f"{page.slug}.html").read_text(encoding="utf-8")
        text = (ROOT / "docs" / page.file).read_text(encoding="utf-8")
        for heading in re.findall(r"^#{1,3} (.+)$", _outside_code(text), re.M):
            assert f'id="{prose.heading_id(heading)}"' in built, f"{page.file}: no id for the heading {heading!r}"
        assert f'href="{page.slug}.html"' in (site / "index.html").read_text(encoding="utf-8"), "not on the index"


def _outside_code(text: str) -> str:
    """A markdown page without its fenced code blocks (a '# comment' in one is no heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def test_a_markdown_page_links_pages_as_pages_files_as_source_and_images_into_the_site(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "contracts.md").write_text(
        "# Title `x`\n\n## What `compare` prints (bf16)\n\n[a](measurements.md#what-compare-prints) "
        "[b](../README.md#more) [c](https://example.org/) [d](#title-x)\n\n![plot](images/loss.png)\n\n"
        "| a | b |\n| --- | --- |\n| `x\\|y` | 2 |\n",
        encoding="utf-8",
    )
    title, body, images = prose.render(tmp_path, prose.BY_FILE["contracts.md"])
    assert title == "Title x"
    assert '<h2 id="what-compare-prints-bf16">' in body and '<h1 id="title-x">' in body
    assert 'href="measurements.html#what-compare-prints"' in body
    assert 'href="../../README.md#more"' in body and 'href="https://example.org/"' in body and 'href="#title-x"' in body
    assert '<img src="loss.png" alt="plot"' in body and images == {"loss.png": tmp_path / "docs" / "images" / "loss.png"}
    assert "<td><code>x|y</code></td>" in body, "tables are rendered"


def test_each_tutorials_pitfalls_are_among_its_fixes(site):
    """docs/tutorials.py lists, per tutorial, the bugs fixed here; a pitfall that names a tutorial
    (``tutorials=`` in its transformer_pitfalls module) is one of them, with a link to where it runs."""
    import transformer_pitfalls as pitfalls

    made = {(slug, p.name) for p in pitfalls.REGISTRY.values() for slug in p.tutorials}
    assert {slug for slug, _ in made} <= set(BY_SLUG), "a pitfall names a tutorial docs/tutorials.py does not have"
    listed = {(t.slug, fix.pitfall) for t in TUTORIALS for fix in t.fixes if fix.pitfall}
    assert listed == made, f"only in docs/tutorials.py: {listed - made}; only in the pitfalls: {made - listed}"
    page = (site / "tutorials.html").read_text(encoding="utf-8")
    for slug, name in made:
        section = page.split(f'id="{slug}"')[1].split("</section>")[0]
        assert f'href="pitfalls.html#{name}"' in section, f"{slug}: no link to the pitfall {name}"
    assert page.count('<section class="tutorial"') == len(TUTORIALS) == 5


def _copy_source(root: pathlib.Path) -> None:
    """What a build reads: the backends, the backend-neutral packages whose code the pages show, and
    docs/ (pages and measurements)."""
    ignore = shutil.ignore_patterns("__pycache__", "site", "screenshots")
    neutral = ["transformer_spec", "transformer_run", "transformer_convert"]
    for package in [package for _, _, package, _ in BACKENDS] + neutral + ["docs"]:
        shutil.copytree(ROOT / package, root / package, ignore=ignore)


def _problems(root: pathlib.Path, site: pathlib.Path) -> list[str]:
    build.write(build.render_site(root), site)
    return check.missing_definitions(root) + check.site_problems(root, site)


def test_a_comment_or_blank_line_in_a_backend_fails_nothing_but_a_rename_fails_by_name(tmp_path):
    root, site = tmp_path / "repo", tmp_path / "site"
    _copy_source(root)
    before = _problems(root, site)
    # a definition every backend has, and the torch file that holds it
    page, file, name = next(
        (page, file, name)
        for page in PAGES
        for file, names in map(parse_code, page.code)
        if "/" not in file
        for name in names
        if all(source.find(root, f"{package}/{file}", name) for _, _, package, _ in BACKENDS)
    )
    path = root / "torch_impl" / file
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    start = source.find(root, f"torch_impl/{file}", name).start
    lines[start:start] = ["    # a new comment inside the definition\n", "\n"]
    lines[start - 1 : start - 1] = ["# a new comment above it, and a blank line\n", "\n"]
    path.write_text("".join(lines), encoding="utf-8")
    assert _problems(root, site) == before
    assert "# a new comment inside the definition" in (site / f"{page.slug}.html").read_text(encoding="utf-8")

    text = path.read_text(encoding="utf-8")
    path.write_text(re.sub(rf"^(def|class) {name}\b", rf"\1 {name}_renamed", text, flags=re.M), encoding="utf-8")
    new = [problem for problem in check.missing_definitions(root) if problem not in before]
    assert new == [
        f"docs/components.py, page {page.slug!r}: torch_impl/{file} has no top-level `{name}` (renamed or "
        "removed? update the page's `code`, or say in its `notes` why this backend has none)"
    ]


def test_every_backend_definition_is_on_a_page():
    shown = {(parse_code(spec)[0], name) for page in PAGES for spec in page.code for name in parse_code(spec)[1]}
    missing = []
    for _, _, package, _ in BACKENDS:
        for path in sorted((ROOT / package).glob("*.py")):
            for name in source.top_level_names(ROOT, f"{package}/{path.name}"):
                if (path.name, name) not in shown and name not in NOT_SHOWN.get(path.name, ()):
                    missing.append(f"{package}/{path.name}: {name}")
    assert not missing, f"not on any page of docs/components.py (add them, or to NOT_SHOWN): {missing}"


def test_source_is_cut_from_the_files_with_its_decorators_and_line_numbers(tmp_path):
    lines = ["import functools", "", "", "@functools.cache", "@staticmethod", "def f(x):", "    return x  # (B, T)", ""]
    (tmp_path / "m.py").write_text("\n".join(lines) + "class C:\n    pass\n")
    snippet = source.find(tmp_path, "m.py", "f")
    assert (snippet.start, snippet.end) == (4, 7)
    assert snippet.text == "\n".join(lines[3:7]) + "\n"
    assert source.find(tmp_path, "m.py", "C").text == "class C:\n    pass\n"
    assert source.find(tmp_path, "m.py", "g") is None and source.find(tmp_path, "other.py", "f") is None


def test_equations_become_mathml_and_unknown_tex_is_an_error():
    got = tex_to_mathml(r"\frac{Q K^\top}{\sqrt{d_k}}")
    assert got.startswith('<math display="block"')
    assert "<mfrac><mrow><mi>Q</mi><msup><mi>K</mi><mo>⊤</mo></msup></mrow><mrow><msqrt>" in got
    with pytest.raises(ValueError, match=r"unsupported command \\frobnicate"):
        tex_to_mathml(r"\frobnicate{x}")
    for page in PAGES:
        for equation in page.equations:
            tex_to_mathml(equation)


@needs_chromium
def test_every_page_fits_at_1000_1400_and_1900_px(site):
    """Measured in the browser, every page at every width: no equation wider than its box (clipped
    or scrolled), nothing cut off, nothing past the window's right edge, code inside its column;
    from 1400 px up, the three columns side by side and no line of code wrapped that is no longer
    than a column holds (``layout.CODE_FITS``: 63 characters at 1400 px, 88 at 1900 px)."""
    measured = layout.measure(site)
    assert {page for page, _ in measured} == {p.name for p in site.glob("*.html")}
    assert {width for _, width in measured} == set(layout.WIDTHS)
    problems = layout.problems(measured)
    assert not problems, "\n".join(problems)


@needs_chromium
def test_a_100_character_line_of_code_fits_its_column_from_2200_px(site):
    """Three columns of 100 characters (the backends' limit) and line numbers need 2200 px at 11px
    (docs/site.css); from there the code font grows, up to 13px, as long as such a line fits."""
    widths = tuple(width for width in layout.CODE_FITS if layout.code_fits(width) >= 100)
    assert widths == (2200,)
    problems = layout.problems(layout.measure(site, widths))
    assert not problems, "\n".join(problems)


def test_a_wrapped_line_of_code_is_a_problem_where_its_column_holds_it():
    short = {"backend": "jax", "line": 12, "chars": 60, "text": "return x", "rows": 2}
    long = {"backend": "torch", "line": 40, "chars": 95, "text": "y = f(", "rows": 2}
    widths = (1000, 1400, 1900, 2200)
    measured = {("a.html", w): {"problems": [], "columns": [], "wrapped": [short, long]} for w in widths}
    assert layout.problems(measured) == [
        "a.html at 1400 px: jax line 12 wraps (60 characters): 'return x', and a column holds 63",
        "a.html at 1900 px: jax line 12 wraps (60 characters): 'return x', and a column holds 88",
        "a.html at 2200 px: jax line 12 wraps (60 characters): 'return x', and a column holds 100",
        "a.html at 2200 px: torch line 40 wraps (95 characters): 'y = f(', and a column holds 100",
    ]
    assert [layout.code_fits(w) for w in (1000, 1399, 1400, 1899, 1900, 2200, 3000)] == [0, 0, 63, 63, 88, 100, 100]


@needs_chromium
def test_the_layout_check_finds_the_lines_of_code_that_wrap_in_a_narrow_column(site, tmp_path):
    """The site's stylesheet and code, in three columns squeezed into 600 px: the 41-character line
    wraps (about 24 characters fit) and is a problem, the shorter lines do not wrap."""
    shutil.copy(site / "style.css", tmp_path / "style.css")
    text = "def f(x):\n    y = x + 1\n    return [x, y, x * y, x - y, x / y, 0]\n"
    code = highlight_python(text, 98)
    cells = "".join(f'<div class="cell col-{b}">{code}</div>' for b, _, _, _ in BACKENDS)
    heads = "".join(f'<div class="colhead col-{b}">{title}</div>' for b, title, _, _ in BACKENDS)
    (tmp_path / "page.html").write_text(
        '<!DOCTYPE html><html><head><link rel="stylesheet" href="style.css"></head><body>'
        f'<section class="columns" style="width:600px">{heads}{cells}</section></body></html>',
        encoding="utf-8",
    )
    measured = layout.measure(tmp_path, (1400,))
    assert measured[("page.html", 1400)]["wrapped"] == [
        {"backend": b, "line": 100, "chars": 41, "text": "return [x, y, x * y, x - y, x / y, 0]", "rows": 2}
        for b, _, _, _ in BACKENDS
    ]
    problems = layout.problems(measured)
    assert problems[-1] == (
        "page.html at 1400 px: torch line 100 wraps (41 characters): 'return [x, y, x * y, x - y, x / y, 0]', "
        "and a column holds 63"
    )


@needs_chromium
def test_the_layout_check_sees_a_clipped_equation_and_stacked_columns(tmp_path):
    (tmp_path / "page.html").write_text(
        '<!DOCTYPE html><html><body><div class="equations" style="width:120px;overflow:hidden">'
        '<math display="block" alttext="wide"><mi>abcdefghijklmnopqrstuvwxyz</mi></math></div>'
        '<section class="columns"><div class="colhead col-numpy">NumPy</div><div class="colhead col-jax">JAX</div>'
        '<div class="colhead col-torch">PyTorch</div></section></body></html>',
        encoding="utf-8",
    )
    problems = "\n".join(layout.problems(layout.measure(tmp_path, (1400,))))
    assert "page.html at 1400 px: equation 1 (wide) is" in problems
    assert "div.equations cuts its content off" in problems
    assert "page.html at 1400 px: the three columns are not side by side" in problems


@needs_chromium
@pytest.mark.parametrize("width", layout.WIDTHS)
def test_screenshot_shows_three_columns(site, tmp_path, width):
    from PIL import Image

    png = chromium.screenshot(site / build.SCREENSHOT_PAGE, tmp_path / f"attention-{width}.png", (width, 1000))
    assert png.exists() and png.stat().st_size > 20_000
    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int)  # (H, W, 3)
    assert pixels.shape == (1000, width, 3)
    assert pixels.std() > 20 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 100, "the screenshot is blank"
    # each column's colour fills a band (its header, the top rule of its cells) in its own third of the width
    for i, (backend, colour) in enumerate(COLUMN_COLOURS.items()):
        matches = np.abs(pixels - np.array(colour)).max(axis=-1) <= 6  # (H, W)
        bands = matches.sum(axis=1) > 0.8 * width / 3  # rows where the colour runs across a column
        assert bands.sum() >= 10, f"no {backend} column in the screenshot at {width} px"
        if width >= layout.THREE_COLUMNS_FROM:  # narrower, the columns could stack
            xs = np.nonzero(matches[bands].any(axis=0))[0]
            third = (i * width // 3, (i + 1) * width // 3)
            assert third[0] <= xs.min() and xs.max() < third[1], f"{backend} column spans x {xs.min()}..{xs.max()}"
