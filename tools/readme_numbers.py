"""Every measured table of the markdown pages, generated from the measurements' own JSON outputs.

    python -m tools.readme_numbers             # rewrite every generated block from the files below
    python -m tools.readme_numbers --check     # exit 1 (and say which file and block) if one disagrees
    python -m tools.readme_numbers --measure   # first re-measure: the suite, the oracles, compare; then rewrite

A generated block sits between ``<!-- numbers: NAME -->`` and ``<!-- /numbers: NAME -->``, in
whichever markdown file holds it (``markdown_files()``: README.md, CONTRIBUTING.md and the pages
of docs/; each block in one file, once); nothing inside it is typed by hand. Moving a block to
another page needs no change here. The sources, each written by the command that measures it:

* ``docs/parity.json``: ``pytest SUITE_TESTS --parity-json docs/parity.json`` (also what the
  docs site shows under each page): per test, check and dtype, the worst
  ``max |got - reference| / max |reference|`` and its tolerance.
* ``docs/oracles.json``: ``pytest ORACLE_TESTS --parity-json docs/oracles.json`` (the same
  records, each naming its oracle: torch.nn, transformers, sentence-transformers, Flax).
* ``docs/compare.txt``: what ``transformer-ref compare`` printed (``--measure`` runs it).
* ``bench/results/latest.json`` (``python -m bench.run``) and ``bench/results/smollm2/latest.json``
  (``python -m bench.run --sections smollm2 --out bench/results/smollm2``): the targets table
  of each (``bench.targets``). ``--measure`` does not run the benchmark (half an hour, and it
  wants a quiet machine): run those two commands first.
* ``bench/results/compiled/latest.json`` (``python -m bench.compiled``): torch.compile and jax.jit
  beside eager (the ``compiled`` table and the README's ``compiledline``).
* ``bench/results/tiled/latest.json`` (``python -m bench.tiled``): one long attention in NumPy,
  tiled against plain (the ``tiled`` table).
* ``bench/results/decode_profile/latest.json`` (``python -m bench.decode_profile``): one batch-1
  decoding step of SmolLM2-135M taken apart, per backend (the ``decodeprofile`` table).
* ``docs/test-time.json`` (``python -m tools.suite_time --measure``): the README's two commands timed on
  fresh clones, the test command's sessions, installs and tests (the ``test*`` blocks).

``shared_tests/repository/test_readme_numbers.py`` fails when a block of any of those files differs from
what these sources give, and when ``docs/compare.txt`` differs from a fresh ``compare`` run
(timings aside).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from . import suite_time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
CONTRIBUTING = os.path.join(ROOT, "CONTRIBUTING.md")
DOCS = os.path.join(ROOT, "docs")  # its *.md pages (the docs site renders them too)
PARITY = os.path.join(ROOT, "docs", "parity.json")
ORACLES = os.path.join(ROOT, "docs", "oracles.json")
COMPARE = os.path.join(ROOT, "docs", "compare.txt")
BENCH = [os.path.join(ROOT, "bench", "results", "latest.json"),
         os.path.join(ROOT, "bench", "results", "smollm2", "latest.json")]  # fmt: skip
TRAINING = os.path.join(ROOT, "bench", "results", "training", "latest.json")  # python -m bench.lm_training
TILED = os.path.join(ROOT, "bench", "results", "tiled", "latest.json")  # python -m bench.tiled
DECODE_PROFILE = os.path.join(ROOT, "bench", "results", "decode_profile", "latest.json")  # bench.decode_profile
COMPILED = os.path.join(ROOT, "bench", "results", "compiled", "latest.json")  # python -m bench.compiled
TEST_TIME = os.path.join(ROOT, "docs", "test-time.json")  # python -m tools.suite_time --measure

# The tests behind docs/parity.json: every component, model, gradient, decoding and training check.
SUITE_TESTS = ["shared_tests/components/test_components.py", "shared_tests/models/test_models.py",
               "shared_tests/training/test_gradients.py", "shared_tests/decoding/test_decoding.py",
               "shared_tests/training/test_dropout.py", "shared_tests/components/test_fast_paths.py",
               "shared_tests/models/test_trace.py", "shared_tests/components/test_modern.py",
               "shared_tests/training/test_training.py",
               "shared_tests/components/test_tiled_attention.py"]  # fmt: skip
ORACLE_TESTS = ["shared_tests/oracles/test_oracle_torch_modules.py", "shared_tests/oracles/test_oracle_bert.py",
                "shared_tests/oracles/test_oracle_flax.py", "shared_tests/oracles/test_oracle_smollm2_model.py",
                "shared_tests/oracles/test_oracle_hf_models.py"]  # fmt: skip
COMPARE_COMMAND = ["compare"]  # transformer-ref compare, the README's main command, as the README shows it
BACKENDS = ("numpy", "jax", "torch")
REFERENCE = "numpy float64"


# ------------------------------------------------------------------------------ reading
def load(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def worst(tests: list[dict], **where: str) -> tuple[float, float, int] | None:
    """(worst error, its tolerance, number of tests) over the records matching ``where``; None if none."""
    rows = [t for t in tests if all(t[k] == v for k, v in where.items())]
    if not rows:
        return None
    top = max(rows, key=lambda t: t["worst"])
    return top["worst"], max(t["tolerance"] for t in rows), len({t["test"] for t in rows})


def _e(value: tuple[float, float, int] | None) -> str:
    return "—" if value is None else f"{value[0]:.1e}"


def _source(path: str) -> str:
    return os.path.relpath(path, ROOT)


# ----------------------------------------------------------------------------- the blocks
def agreement(parity: dict[str, Any]) -> str:
    tests = parity["tests"]
    lines = ["| backend | float64 worst | float32 worst | tolerance (float64 / float32) | tests |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for backend in BACKENDS:
        cells = [worst(tests, backend=backend, check="output", reference=REFERENCE, dtype=d)
                 for d in ("float64", "float32")]  # fmt: skip
        if cells == [None, None]:
            continue
        label = "numpy (float32 vs its own float64)" if backend == "numpy" else backend
        n = len({t["test"] for t in tests if t["backend"] == backend and t["check"] == "output"})
        tol = " / ".join("—" if c is None else f"{c[1]:.0e}" for c in cells)
        lines.append(f"| {label} | {_e(cells[0])} | {_e(cells[1])} | {tol} | {n} |")
    fused = [worst(tests, backend=b, check="output", reference="the written-out path") for b in BACKENDS]
    fused_text = ", ".join(f"{b} {_e(w)}" for b, w in zip(BACKENDS, fused, strict=True) if w is not None)
    lines += ["", "Each backend's fused kernels against its own written-out code (`test_fast_paths.py`): "
              f"{fused_text}.",
              "", f"Generated from `{_source(PARITY)}` (`{parity['command']}`), versions "
              f"{', '.join(f'{k} {v}' for k, v in sorted(parity['versions'].items()))}."]  # fmt: skip
    return "\n".join(lines)


def gradients(parity: dict[str, Any]) -> str:
    tests = parity["tests"]
    rows = [("NumPy's hand-written backward vs central finite differences (float64), per component and model",
             worst(tests, check="finite differences"))]  # fmt: skip
    for backend, how in (("torch", "torch.autograd"), ("jax", "jax.grad")):
        rows.append((f"every parameter's gradient, {how} vs NumPy's backward (float64, per tensor)",
                     worst(tests, backend=backend, check="gradients", dtype="float64")))  # fmt: skip
    for backend in ("torch", "jax"):
        rows.append((f"float64 loss curves over 200 Adam steps, {backend} vs NumPy (every run of test_training.py)",
                     worst(tests, backend=backend, check="loss curve")))  # fmt: skip
    lines = ["| check | worst measured | tolerance | tests |", "| --- | --- | --- | --- |"]
    lines += [f"| {what} | {_e(w)} | {'—' if w is None else f'{w[1]:.0e}'} | {'—' if w is None else w[2]} |"
              for what, w in rows]  # fmt: skip
    lines += ["", f"Generated from `{_source(PARITY)}`."]
    return "\n".join(lines)


def oracles(report: dict[str, Any]) -> str:
    tests = [t for t in report["tests"] if t["reference"] not in (REFERENCE, "the written-out path")]
    references = sorted({t["reference"] for t in tests})
    lines = [
        "| oracle | dtype | numpy | jax | torch | tolerance | tests |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for reference in references:
        for dtype in ("float64", "float32"):
            cells = [worst(tests, reference=reference, backend=b, dtype=dtype) for b in BACKENDS]
            present = [c for c in cells if c is not None]
            if not present:
                continue
            n = len({t["test"] for t in tests if t["reference"] == reference and t["dtype"] == dtype})
            tol = max(c[1] for c in present)
            lines.append(f"| {reference} | {dtype} | {' | '.join(_e(c) for c in cells)} | {tol:.0e} | {n} |")
    lines += ["", f"Generated from `{_source(ORACLES)}` (`{report['command']}`)."]
    return "\n".join(lines)


def compare(text: str) -> str:
    return "```\n" + text.rstrip("\n") + "\n```"


def performance(results: list[dict[str, Any]]) -> str:
    from bench.targets import evaluate

    lines = ["| target | measured | met? | what limits it |", "| --- | --- | --- | --- |"]
    sources = []
    for path, result in results:
        for target in result.get("targets") or evaluate(result):
            limits = target.get("limits", "") if not target["met"] else ""
            lines.append(f"| {target['target']} | {target['measured']} | {'yes' if target['met'] else '**no**'} | "
                         f"{limits.replace('|', '/')} |")  # fmt: skip
        meta = result["meta"]
        sources.append(f"`{_source(path)}` ({meta['date']}, {meta['cpu']}, {meta['cores']} cores, load "
                       f"{meta.get('load_start', '?')} at the start, {meta.get('load_end', '?')} at the end; "
                       f"{meta['shapes']})")  # fmt: skip
    lines += ["", "Generated from " + "; ".join(sources) + "."]
    return "\n".join(lines)


def training(results: dict[str, Any]) -> str:
    from bench.lm_training import markdown

    body = markdown(results).split("\n", 2)[2]  # without its title
    return body.rstrip("\n") + f"\n\nGenerated from `{_source(TRAINING)}`."


def bf16(results: dict[str, Any]) -> str:
    from bench.lm_training import bf16_markdown

    return bf16_markdown(results) + f"\n\nGenerated from `{_source(TRAINING)}` ({results['date']})."


def compiled(results: dict[str, Any]) -> str:
    from bench.compiled import markdown

    return markdown(results)


def compiled_line(results: dict[str, Any]) -> str:
    from bench.compiled import line

    return line(results)


def tiled(results: dict[str, Any]) -> str:
    from bench.tiled import markdown

    return markdown(results)


def decode_profile(results: dict[str, Any]) -> str:
    from bench.decode_profile import markdown

    return markdown(results)


def policies() -> str:
    from transformer_run.mixed_precision import OPS

    lines = ["| op | torch.autocast | Flax compute dtype (JAX) |", "| --- | --- | --- |"]
    return "\n".join(lines + [f"| {op} | {autocast} | {compute} |" for op, autocast, compute in OPS])


def parameters() -> str:
    """Table 3's two models (the paper's rounded counts) beside ours, part by part, counted by
    ``transformer-ref params`` (``transformer_cli.params.count_rows``)."""
    from transformer_cli.params import count_rows
    from transformer_spec import Config, param_schema

    lines = ["| model | Table 3 | ours | embeddings (one shared table) | encoder | decoder | output projection |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for preset, paper in (("paper-base", "65M"), ("paper-big", "213M")):
        config = Config.preset(preset)
        rows = {part: count for part, count, _ in count_rows(config, param_schema(config))}
        cells = [rows[part] for part in ("total", "embeddings", "encoder", "decoder", "output projection")]
        lines.append(f"| `{preset}` | {paper} | " + " | ".join(f"{n:,}" for n in cells) + " |")
    return "\n".join(lines) + "\n\nGenerated by `transformer-ref params --preset paper-base` (and `paper-big`)."


def blocks() -> dict[str, Callable[[], str | None]]:
    """name -> renderer; a renderer returns None when its source file is missing."""
    parity, oracle = load(PARITY), load(ORACLES)
    bench = [(path, r) for path in BENCH if (r := load(path)) is not None]
    compare_text = open(COMPARE, encoding="utf-8").read() if os.path.exists(COMPARE) else None
    trained, compiled_runs, tiled_runs = load(TRAINING), load(COMPILED), load(TILED)
    profiled = load(DECODE_PROFILE)
    timed = load(TEST_TIME)
    # The test command's times exist once a fresh clone was measured (its suite runs this module's
    # test, so the first measurement of a new checkout is made before the blocks that show it).
    test_time = {
        "testtime": lambda: suite_time.commands_line(timed),
        "testsessions": lambda: suite_time.sessions_table(timed),
        "testslowest": lambda: suite_time.slowest_table(timed),
        "testrepeated": lambda: suite_time.repeated_table(timed),
        **({"testquick": lambda: suite_time.quick_line(timed)} if timed and "quick" in timed else {}),
    }
    return {
        **(test_time if timed else {}),
        "agreement": lambda: parity and agreement(parity),
        "gradients": lambda: parity and gradients(parity),
        "oracles": lambda: oracle and oracles(oracle),
        "compare": lambda: compare_text and compare(compare_text),
        "performance": lambda: bench and performance(bench),
        "policies": policies,
        "parameters": parameters,
        "training": lambda: trained and training(trained),
        "precision": lambda: trained and "bf16" in trained and bf16(trained),
        "tiled": lambda: tiled_runs and tiled(tiled_runs),
        "decodeprofile": lambda: profiled and decode_profile(profiled),
        "compiled": lambda: compiled_runs and compiled(compiled_runs),
        "compiledline": lambda: compiled_runs and compiled_line(compiled_runs),
    }


# ------------------------------------------------------------------- the markdown files
BLOCK = re.compile(r"(<!-- numbers: (?P<name>[a-z]+) -->\n)(?P<body>.*?)(\n<!-- /numbers: (?P=name) -->)", re.S)


def markdown_files() -> list[str]:
    """The files that may hold generated blocks: README.md, CONTRIBUTING.md, docs/*.md."""
    pages = sorted(os.path.join(DOCS, name) for name in os.listdir(DOCS) if name.endswith(".md"))
    return [path for path in (README, CONTRIBUTING, *pages) if os.path.exists(path)]


def block_names(text: str) -> list[str]:
    """The names of the generated blocks in ``text``, in order."""
    return [m.group("name") for m in BLOCK.finditer(text)]


def render(readme: str, name: str = "README.md") -> tuple[str, list[str]]:
    """-> the markdown ``readme`` (the file ``name``) with every generated block re-rendered, and the
    names of blocks that changed."""
    renderers, changed = blocks(), []
    unknown = sorted(set(block_names(readme)) - set(renderers))
    if unknown:
        raise SystemExit(f"{name} has generated blocks nobody renders: {unknown} (known: {sorted(renderers)})")

    def one(match: re.Match) -> str:
        body = renderers[match.group("name")]()
        if body is None:
            raise SystemExit(f"{name}, block {match.group('name')!r}: its source file is missing (see --help)")
        if body != match.group("body"):
            changed.append(match.group("name"))
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(one, readme), changed


def measure() -> None:
    """Re-run what writes the sources (not the benchmark)."""
    python = sys.executable
    for tests, out in ((SUITE_TESTS, PARITY), (ORACLE_TESTS, ORACLES)):
        # two xdist workers (the controller gathers their records), one file per worker for the oracles
        parallel = ["-n", "2"] + (["--dist=loadfile"] if tests is ORACLE_TESTS else [])
        command = [python, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider", *parallel, "--parity-json",
                   os.path.relpath(out, ROOT)]  # fmt: skip
        print("$", " ".join(command[2:]), flush=True)
        subprocess.run(command, cwd=ROOT, check=True)
    print("$ transformer-ref", " ".join(COMPARE_COMMAND), flush=True)
    run = f"import sys; from transformer_cli.main import main; sys.exit(main({COMPARE_COMMAND!r}))"
    text = subprocess.run([python, "-c", run], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    with open(COMPARE, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.readme_numbers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 if a file disagrees")
    parser.add_argument("--measure", action="store_true", help="re-measure the suite, the oracles and compare first")
    args = parser.parse_args(argv)
    if args.measure:
        measure()
    status = 0
    for path in markdown_files():
        name = os.path.relpath(path, ROOT)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if not block_names(text):
            continue
        new, changed = render(text, name)
        if args.check:
            if changed:
                print(f"{name} disagrees with the generated values in: {', '.join(changed)} "
                      "(python -m tools.readme_numbers rewrites them)")  # fmt: skip
                status = 1
            else:
                print(f"{name}: every generated block is up to date")
            continue
        if changed:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
        print(f"{name}: rewrote {', '.join(changed) if changed else 'nothing (up to date)'}")
    return status


if __name__ == "__main__":
    sys.exit(main())
