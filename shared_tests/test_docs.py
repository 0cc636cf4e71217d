"""The reference site (docs/site/): never stale against the source, and three readable columns in a real browser."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from docs import build, chromium, source
from docs.components import NOT_SHOWN, PAGES
from docs.mathml import tex_to_mathml
from docs.pages import BACKENDS, parse_code

ROOT = pathlib.Path(__file__).resolve().parent.parent
COLUMN_COLOURS = {"numpy": (0x1F, 0x5F, 0xAE), "jax": (0x7B, 0x3F, 0xB5), "torch": (0xD9, 0x48, 0x0F)}  # site.css


def test_site_is_up_to_date(tmp_path):
    """docs/site/ is what a build makes now, byte for byte (parity, walkthrough and pitfalls are
    read from the committed JSON files, not re-measured)."""
    build.write(build.render_site(), tmp_path)
    fresh = {p.name: p.read_bytes() for p in sorted(tmp_path.iterdir())}
    committed = {p.name: p.read_bytes() for p in sorted(build.SITE.glob("*")) if p.suffix in build.GENERATED}
    stale = sorted(name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name))
    assert not stale, (
        "docs/site/ is stale against the source: run `nox -s docs` (or `python -m docs.build` to re-render "
        "from the committed measurements). Stale pages: " + ", ".join(stale)
    )


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


@pytest.mark.skipif(chromium.find() is None, reason="chromium is not installed (Debian: apt-get install chromium)")
def test_screenshot_shows_three_columns(tmp_path):
    from PIL import Image

    build.write(build.render_site(), tmp_path / "site")
    page = tmp_path / "site" / build.SCREENSHOT_PAGE
    dom = chromium.dump_dom(page)
    counts = {
        b: dom.count(f'class="cell col-{b}"') + dom.count(f'class="cell col-{b} missing"') for b in COLUMN_COLOURS
    }
    assert len(set(counts.values())) == 1 and counts["numpy"] >= 4, f"cells per column: {counts}"
    for b in COLUMN_COLOURS:
        assert f'class="colhead col-{b}"' in dom

    png = chromium.screenshot(page, tmp_path / "attention.png")
    assert png.exists() and png.stat().st_size > 20_000
    pixels = np.asarray(Image.open(png).convert("RGB")).astype(int)  # (H, W, 3)
    height, width, _ = pixels.shape
    assert (width, height) == chromium.WINDOW
    assert pixels.std() > 20 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 100, "the screenshot is blank"
    # each column's colour fills a band (its header, the top rule of its cells) in its own third of the width
    for i, (backend, colour) in enumerate(COLUMN_COLOURS.items()):
        matches = np.abs(pixels - np.array(colour)).max(axis=-1) <= 6  # (H, W)
        bands = matches.sum(axis=1) > 0.8 * width / 3  # rows where the colour runs across a column
        assert bands.sum() >= 10, f"no {backend} column in the screenshot"
        xs = np.nonzero(matches[bands].any(axis=0))[0]
        third = (i * width // 3, (i + 1) * width // 3)
        assert third[0] <= xs.min() and xs.max() < third[1], f"{backend} column spans x {xs.min()}..{xs.max()}"
