"""``transformer-ref params``: how many parameters a model has, part by part.

For a preset (its sizes: nothing is drawn) or a weights file (``--weights``: the arrays it
holds), prints the parameters of the embeddings, the encoder, the decoder, the output
projection and the total, biases and LayerNorms included. A token table counts once: with
``share_embeddings`` the source and the target read one table, and with ``tie_output`` the
output projection is the target table, transposed; the table is then shown once and said
to be shared.

The paper's Table 3 rounds its two models to 65M and 213M; here, with one 37,000-token
vocabulary shared three ways (section 3.4), they count 63,082,496 and 214,245,376.

Examples:
  transformer-ref params --preset paper-base
  transformer-ref params --preset paper-big
  transformer-ref params --weights translate.safetensors     # a checkpoint of transformer-ref train
"""

from __future__ import annotations

import argparse

from transformer_spec import PRESETS, Config, WeightsError, WeightsFileError, load_params, param_schema
from transformer_spec.schema import param_counts

from .errors import UsageError
from .help import plain, summary


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "params",
        help=summary(__doc__),
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--preset",
        default="paper-base",
        choices=sorted(PRESETS),
        help="the model's sizes, a preset of transformer_spec.Config (default: %(default)s)",
    )
    parser.add_argument(
        "--weights", metavar="FILE", help="a safetensors weights file: count its arrays; overrides --preset"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.weights:
        try:
            params, config = load_params(args.weights)
        except (WeightsFileError, WeightsError) as error:
            raise UsageError(f"--weights {args.weights}: {error}") from None
        shapes, label = {name: value.shape for name, value in params.items()}, args.weights
    else:
        config = Config.preset(args.preset)
        shapes, label = param_schema(config), f"preset {args.preset}"
    print(f"{label}: {describe(config)}")
    for part, count, note in count_rows(config, shapes):
        print(f"{part:<18}{count:>14,}" + (f"  {note}" if note else ""))
    return 0


def describe(config: Config) -> str:
    """The sizes that decide the count, in one line."""
    encoder, decoder = config.num_encoder_layers, config.num_decoder_layers
    layers = {"encoder_decoder": f"{encoder} + {decoder} layers", "encoder_only": f"{encoder} layers",
              "decoder_only": f"{decoder} layers"}  # fmt: skip
    vocab = config.tgt_vocab_size if config.uses_decoder else config.src_vocab_size
    if config.kind == "encoder_decoder" and config.src_vocab_size != config.tgt_vocab_size:
        vocab = f"{config.src_vocab_size:,} source, {config.tgt_vocab_size:,} target"
    else:
        vocab = f"{vocab:,}"
    return (
        f"{config.kind}, {layers[config.kind]}, d_model {config.d_model}, {config.num_heads} heads, "
        f"d_ff {config.d_ff}, vocabulary {vocab}"
    )


def count_rows(config: Config, shapes) -> list[tuple[str, int, str]]:
    """(part, parameters, a note) for the parts ``config``'s model has, then the total."""
    counts = param_counts(shapes)
    table = f"{config.tgt_vocab_size:,} x {config.d_model}"
    notes = {"embeddings": "", "output projection": ""}
    if config.share_embeddings and config.tie_output:
        notes["embeddings"] = f"one shared {table} table: source and target embeddings, output projection"
    elif config.share_embeddings:
        notes["embeddings"] = f"one shared {table} table: source and target embeddings"
    elif config.tie_output:
        notes["embeddings"] = f"the target's {table} table is the output projection too"
    if config.tie_output:
        tied = "tied to the target embedding table (tie_output)"
        notes["output projection"] = tied + (": the logits bias only" if config.final_logits_bias else "")
    parts = ["embeddings"]
    parts += ["encoder"] if config.uses_encoder else []
    parts += ["decoder", "output projection"] if config.uses_decoder else []
    parts += ["pooler"] if config.pooler else []
    return [(part, counts[part], notes.get(part, "")) for part in parts] + [("total", counts["total"], "")]
