"""``python -m docs.pitfalls_data``: run every pitfall in every backend into ``docs/pitfalls.json``.

``transformer_pitfalls.run_all`` returns plain data (title, explanation, the wrong code and ours, what each
gave, per backend); the site renders its page from the file (``docs.pages.pitfalls_page``), so
building the site needs no framework. Run by ``nox -s docs``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import platform
import sys

OUT = pathlib.Path(__file__).resolve().parent / "pitfalls.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.pitfalls_data", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args(argv)
    if importlib.util.find_spec("transformer_pitfalls") is None:
        print(f"no pitfalls package: {args.out} not written, and the site has no pitfalls page")
        return 0
    import transformer_pitfalls as pitfalls

    data = pitfalls.run_all(pitfalls.BACKENDS)
    versions = {"python": platform.python_version()}
    for module in ("numpy", "jax", "flax", "torch"):
        if module in sys.modules:
            versions[module] = sys.modules[module].__version__
    report = {"command": "python -m docs.pitfalls_data", "versions": versions, "pitfalls": data}
    args.out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {len(data)} pitfalls to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
