"""Chapter 8, the encoder: one encoder layer from its parts, and the stack of layers with its final norm."""

from __future__ import annotations

import numpy as np

from transformer_spec import Config, init_params

from ..check import Exercise, Mistake
from .parts import Part, weights_under

PAD = 0


def _config(norm_first: bool, num_layers: int = 2) -> Config:
    # odd sizes: B = 2, T = 5, H = 3, d_k = 4, d_model = 12, d_ff = 10; no two alike
    return Config.preset("tiny").replace(d_model=12, num_heads=3, d_ff=10, norm_first=norm_first,
                                         num_encoder_layers=num_layers)  # fmt: skip


def _mask(ids: np.ndarray) -> np.ndarray:
    return (ids != PAD)[:, None, None, :]  # (B, 1, 1, T): True = may attend


def _hidden(rng: np.random.Generator, ids: np.ndarray, d_model: int) -> np.ndarray:
    return rng.standard_normal((*ids.shape, d_model))  # (B, T, d_model): stands in for the embeddings


# ------------------------------------------------------------------ encoder_layer
LAYER_PARTS = {"self_attn": "MultiHeadAttention", "self_attn_norm": "LayerNorm", "ffn": "PositionwiseFeedForward",
               "ffn_norm": "LayerNorm"}  # fmt: skip


def _layer_parts(config: Config, seed: int) -> dict[str, Part]:
    params = init_params(config, seed=seed, dtype="float64", component="encoder_layer", nonzero_biases=True)
    return {name: Part(class_name, config, weights_under(params, name)) for name, class_name in LAYER_PARTS.items()}


def _encoder_layer_cases():
    rng = np.random.default_rng(80)
    right = np.array([[5, 7, 9, PAD, PAD], [3, 4, 8, 6, 2]])  # right padding, none
    left = np.array([[PAD, PAD, 1, 2, 3], [4, 9, 7, 5, PAD]])  # left padding, right padding
    single = np.array([[6], [8]])

    def case(ids, norm_first, seed):
        config = _config(norm_first)
        return {"x": _hidden(rng, ids, config.d_model), "mask": _mask(ids), "parts": _layer_parts(config, seed),
                "norm_first": norm_first}  # fmt: skip

    return [
        ("post-norm (the paper), sentence 1 padded on the right", case(right, False, 1)),
        ("pre-norm (GPT-2, BERT's successors), left and right padding", case(left, True, 2)),
        ("one position, no padding, post-norm", case(single, False, 3)),
    ]


def _joined(parts: dict[str, Part]) -> dict[str, np.ndarray]:
    """Every part's weights under the part's name: the layer's canonical weights."""
    return {f"{name}.{leaf}": value for name, part in parts.items() for leaf, value in part.params.items()}


def _encoder_layer_expected(b, x):
    config = x["parts"]["ffn"].config.replace(norm_first=x["norm_first"])
    layer = b.build("EncoderLayer", config, _joined(x["parts"]), "float64")
    return b.call(layer, x["x"], x["mask"])[0]  # (B, T, d_model)


def _connection(x, sublayer, norm, norm_first, residual_after_norm=False):
    if norm_first:
        return x + sublayer(norm(x))
    return x + norm(sublayer(x)) if residual_after_norm else norm(x + sublayer(x))


def _encoder_layer(x, mask, parts, norm_first, *, attention_mask="given", residual_after_norm=False,
                   ffn_reads_input=False):  # fmt: skip
    """The encoder layer with one classic mistake switched on: the wrong answers below."""
    if attention_mask == "none":
        mask = None
    elif attention_mask == "inverted":
        mask = ~mask
    h = _connection(x, lambda y: parts["self_attn"](y, y, y, mask), parts["self_attn_norm"], norm_first,
                    residual_after_norm)  # fmt: skip
    if not ffn_reads_input:
        return _connection(h, parts["ffn"], parts["ffn_norm"], norm_first, residual_after_norm)
    if norm_first:
        return h + parts["ffn"](parts["ffn_norm"](x))
    return parts["ffn_norm"](h + parts["ffn"](x))


def _layer_with(**mistake):
    def encoder_layer(x, mask, parts, norm_first):
        return _encoder_layer(x, mask, parts, norm_first, **mistake)

    return encoder_layer


# ------------------------------------------------------------------ encoder_stack
def _encoder_stack_cases():
    rng = np.random.default_rng(81)
    ids = np.array([[5, 7, 9, 4, PAD], [PAD, PAD, 3, 8, 6]])
    other = np.array([[2, 6, PAD, PAD, PAD], [4, 4, 1, 9, 3], [7, PAD, PAD, PAD, PAD]])  # heavier padding, B = 3

    def case(norm_first, num_layers, seed, ids=ids):
        config = _config(norm_first, num_layers)
        # the weights of a pre-norm stack: its layers' and its final norm's
        params = init_params(config.replace(norm_first=True), seed=seed, dtype="float64", component="encoder",
                             nonzero_biases=True)  # fmt: skip
        layers = [Part("EncoderLayer", config, weights_under(params, f"layers.{i}")) for i in range(num_layers)]
        final_norm = Part("LayerNorm", config, weights_under(params, "norm"))
        return {"x": _hidden(rng, ids, config.d_model), "mask": _mask(ids), "layers": layers,
                "final_norm": final_norm, "norm_first": norm_first}  # fmt: skip

    return [
        ("post-norm (the paper), 2 layers", case(False, 2, 4)),
        ("pre-norm, 3 layers, 3 sequences padded differently", case(True, 3, 5, other)),
        ("pre-norm, 1 layer", case(True, 1, 6)),
    ]


def _encoder_stack_expected(b, x):
    layers = x["layers"]
    config = layers[0].config.replace(norm_first=x["norm_first"], num_encoder_layers=len(layers))
    params = {f"layers.{i}.{leaf}": value for i, layer in enumerate(layers) for leaf, value in layer.params.items()}
    if config.encoder_final_norm:  # follows norm_first: a pre-norm stack has one
        params |= {f"norm.{leaf}": value for leaf, value in x["final_norm"].params.items()}
    encoder = b.build("Encoder", config, params, "float64")
    return b.call(encoder, x["x"], x["mask"])[0]  # (B, T, d_model)


def _encoder_stack(x, mask, layers, final_norm, norm_first, *, final="needed", feed_input=False):
    """The stack with one classic mistake switched on: the wrong answers below."""
    output = x
    for layer in layers:
        output = layer(x if feed_input else output, mask)
        if final == "every layer" and norm_first:
            output = final_norm(output)
    if final == "always" or (final == "needed" and norm_first):
        output = final_norm(output)
    return output


def _stack_with(**mistake):
    def encoder_stack(x, mask, layers, final_norm, norm_first):
        return _encoder_stack(x, mask, layers, final_norm, norm_first, **mistake)

    return encoder_stack


EXERCISES = [
    Exercise(
        name="encoder_layer",
        chapter="08_encoder",
        task="encoder_layer(x, mask, parts, norm_first) -> (B, T, d_model): self-attention, then the feed-forward "
        "network, each in a residual connection (post-norm, or pre-norm when norm_first). parts['self_attn'](query, "
        "key, value, mask), parts['ffn'](h), parts['self_attn_norm'](h) and parts['ffn_norm'](h) each give one "
        "(B, T, d_model) array.",
        cases=_encoder_layer_cases,
        expected=_encoder_layer_expected,
        mistakes=(
            Mistake(
                "the mask not passed",
                "without the mask every query also attends to the padded keys, and a sentence's vectors depend on "
                "how much padding its batch gave it. Pass the mask to the self-attention: "
                "parts['self_attn'](h, h, h, mask).",
                _layer_with(attention_mask="none"),
            ),
            Mistake(
                "the mask's polarity",
                "True means *may attend* here (as in F.scaled_dot_product_attention and Flax): pass the mask as it "
                "is. ~mask is torch.nn's src_key_padding_mask convention (True = padding); here it lets every "
                "query attend to the padded keys only, and to nothing at all in a sentence without padding.",
                _layer_with(attention_mask="inverted"),
            ),
            Mistake(
                "the residual added after the norm",
                "post-norm normalises the sum: norm(x + sublayer(x)). x + norm(sublayer(x)) adds the residual after "
                "the norm, and the stream between layers is never normalised (neither post- nor pre-norm).",
                _layer_with(residual_after_norm=True),
            ),
            Mistake(
                "the feed-forward fed the layer's input",
                "the two sub-layers run one after the other: the feed-forward network reads h, the attention "
                "sub-layer's output (its residual included), not the layer's input x. (GPT-J and PaLM run the two "
                "side by side on the same input, but that is another model.)",
                _layer_with(ffn_reads_input=True),
            ),
        ),
    ),
    Exercise(
        name="encoder_stack",
        chapter="08_encoder",
        task="encoder_stack(x, mask, layers, final_norm, norm_first) -> (B, T, d_model): each layer(x, mask) in "
        "turn, then final_norm(x) where the stack needs it: pre-norm (norm_first True) only.",
        cases=_encoder_stack_cases,
        expected=_encoder_stack_expected,
        mistakes=(
            Mistake(
                "the final norm missing",
                "a pre-norm layer adds to the residual stream and never normalises it: without one more norm after "
                "the last layer, the stack's output keeps whatever scale the stream grew to. Apply final_norm when "
                "norm_first.",
                _stack_with(final="never"),
            ),
            Mistake(
                "a final norm on the post-norm stack too",
                "a post-norm layer already ends with a norm (norm(h + ffn(h))): the paper's stack has no final norm, "
                "and a second one, with its own weights, changes the output. Apply final_norm only when norm_first.",
                _stack_with(final="always"),
            ),
            Mistake(
                "the final norm after every layer",
                "the final norm comes once, after the last layer. Normalising the stream between layers turns the "
                "pre-norm stack back into something like post-norm, and the layers (trained without it) see "
                "other inputs.",
                _stack_with(final="every layer"),
            ),
            Mistake(
                "each layer fed the stack's input",
                "layer l reads layer l - 1's output: x = layer(x, mask) in the loop. Calling every layer on the "
                "stack's input keeps only the last layer's work.",
                _stack_with(feed_input=True),
            ),
        ),
    ),
]
