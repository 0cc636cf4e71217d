"""Chapter 10, the models: the parameter count from a Config, and the tied output projection."""

from __future__ import annotations

import math

import numpy as np

from transformer_spec import Config, param_schema

from ..check import Exercise, Mistake


# ------------------------------------------------------------------ count_parameters
def framework_count(b, model) -> int:
    """How many trained numbers ``model`` holds, counted the way its framework counts them: torch's
    ``parameters()``, Flax's ``nnx.Param`` state; NumPy has no such notion, so its weights under their
    canonical names (``to_params``)."""
    if b.name == "torch":
        return sum(p.numel() for p in model.parameters())
    if b.name == "jax":
        import jax
        from flax import nnx

        return sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return sum(value.size for value in b.impl.to_params(model).values())


def _count_parameters_cases():
    return [
        ("the paper's model at tiny sizes: encoder-decoder, post-norm, sinusoids, output not tied",
         {"config": Config.preset("tiny")}),
        ("a GPT-2-style language model: decoder-only, pre-norm, learned positions, tied output",
         {"config": Config.preset("tiny-lm").replace(positional="learned", tie_output=True)}),
        ("an encoder without biases (bias=False), pre-norm, sinusoids",
         {"config": Config.preset("tiny").replace(kind="encoder_only", norm_first=True, bias=False)}),
    ]  # fmt: skip


def _count_parameters_expected(b, x):
    return np.asarray(framework_count(b, b.impl.build_model(x["config"])))


def _role(name: str) -> str:
    """Which kind of weight a canonical name is, in words: the parts a parameter count is made of."""
    kind = "biases" if name.endswith(".bias") else "weights"
    if ".token." in name:
        return {"src_embed": "the source token table", "tgt_embed": "the target token table"}.get(
            name.split(".")[0], "the token table"
        )
    if ".position." in name:
        return "the learned position tables"
    if name.startswith("generator."):
        return f"the output projection's {'bias' if kind == 'biases' else 'weight'}"
    if ".layers." not in name:
        return "the final norms"
    sub = name.split(".")[3]  # encoder.layers.0.<sub>.<...>
    if sub.endswith("_norm"):
        return f"the layers' norms' {'biases' if kind == 'biases' else 'gains'}"
    what = {"self_attn": "self-attention", "cross_attn": "cross-attention", "ffn": "feed-forward"}.get(sub, sub)
    return f"the {what} {kind}"


def _count_parts(x) -> dict[str, float]:
    """The expected count, by kind of weight (from the weight schema), for a wrong count to be traced to."""
    parts: dict[str, float] = {}
    for name, shape in param_schema(x["config"]).items():
        parts[_role(name)] = parts.get(_role(name), 0) + math.prod(shape)
    return parts


def _count(config, *, tied_twice=False, no_bias=False, sinusoids=False, no_final_norm=False, cross_in_lm=False):
    """The parameter count with one classic mistake switched on: the wrong answers below."""
    d = config.d_model

    def linear(d_in, d_out):
        return d_in * d_out + (d_out if config.bias and not no_bias else 0)

    norm = d + (d if config.bias else 0)
    attention, ffn = 4 * linear(d, d), linear(d, config.d_ff) + linear(config.d_ff, d)
    positions = config.max_len * d if config.positional == "learned" or sinusoids else 0
    total = 0
    if config.uses_encoder:
        total += config.src_vocab_size * d + positions
        total += config.num_encoder_layers * (attention + ffn + 2 * norm)
        total += norm if config.encoder_final_norm and not no_final_norm else 0
    if config.uses_decoder:
        cross = attention + norm if config.decoder_has_cross_attention or cross_in_lm else 0
        total += config.tgt_vocab_size * d + positions
        total += config.num_decoder_layers * (attention + cross + ffn + 2 * norm)
        total += norm if config.decoder_final_norm and not no_final_norm else 0
        total += linear(d, config.tgt_vocab_size) if not config.tie_output or tied_twice else 0
    return total


# ------------------------------------------------------------------ tied_logits
def _tied_logits_cases():
    rng = np.random.default_rng(100)
    return [
        ("B = 2, T = 3, d_model = 6, a vocabulary of 7", {"hidden": rng.standard_normal((2, 3, 6)),
                                                          "embedding": 0.4 * rng.standard_normal((7, 6))}),
        ("one position (a decoding step), d_model = 4, a vocabulary of 9",
         {"hidden": rng.standard_normal((1, 1, 4)), "embedding": 0.5 * rng.standard_normal((9, 4))}),
        ("a square table: d_model = vocabulary = 5", {"hidden": rng.standard_normal((2, 2, 5)),
                                                      "embedding": 0.4 * rng.standard_normal((5, 5))}),
    ]  # fmt: skip


def _tied_logits_expected(b, x):
    vocab, d_model = x["embedding"].shape
    config = Config.preset("tiny-lm").replace(d_model=d_model, num_heads=1, tgt_vocab_size=vocab, tie_output=True)
    generator = b.impl.Generator(config, "float64")  # tied: no weights of its own
    return b.call(generator, x["hidden"], x["embedding"])  # (B, T, V)


def _log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


EXERCISES = [
    Exercise(
        name="count_parameters",
        chapter="10_models",
        task="count_parameters(config) -> int: how many trained numbers the model of config.kind holds, from the "
        "config's fields alone (LayerNorm, the paper's feed-forward network, num_kv_heads = num_heads, no token "
        "types, no pooler).",
        cases=_count_parameters_cases,
        expected=_count_parameters_expected,
        parts=_count_parts,
        mistakes=(
            Mistake(
                "the tied output counted twice",
                "with tie_output the output projection *is* the target embedding table, transposed: one array, "
                "used twice, counted once. Add the d_model x vocabulary projection (and its bias) only when the "
                "output is not tied.",
                lambda config: _count(config, tied_twice=True),
            ),
            Mistake(
                "biases forgotten",
                "each Linear has a bias of its output size when config.bias (x W + b): four per attention, two per "
                "feed-forward network, one for the output projection.",
                lambda config: _count(config, no_bias=True),
            ),
            Mistake(
                "the sinusoidal table counted",
                "the paper's sinusoids are computed, not trained: a buffer, not a parameter (not saved in the "
                "weights either). Only positional='learned' adds a max_len x d_model table.",
                lambda config: _count(config, sinusoids=True),
            ),
            Mistake(
                "the final norm forgotten",
                "a pre-norm stack ends with one more LayerNorm (encoder_final_norm, decoder_final_norm: they follow "
                "norm_first): d_model weights, and d_model biases when config.bias.",
                lambda config: _count(config, no_final_norm=True),
            ),
            Mistake(
                "cross-attention counted in a decoder-only model",
                "a decoder-only model has no encoder, so its layers have no cross-attention (nor its norm): "
                "self-attention, the feed-forward network and their two norms.",
                lambda config: _count(config, cross_in_lm=True),
            ),
        ),
    ),
    Exercise(
        name="tied_logits",
        chapter="10_models",
        task="tied_logits(hidden, embedding) -> (B, T, V): the logits of a tied output projection, for hidden "
        "(B, T, d_model) and the target embedding table embedding (V, d_model).",
        cases=_tied_logits_cases,
        expected=_tied_logits_expected,
        mistakes=(
            Mistake(
                "reshape instead of transpose",
                "embedding.reshape(d_model, V) has the right shape and the wrong numbers (it cuts the rows in "
                "memory order). The projection is hidden @ embedding.T: logit v is the dot product of the hidden "
                "vector with token v's row.",
                lambda hidden, embedding: hidden @ embedding.reshape(embedding.shape[1], embedding.shape[0]),
            ),
            Mistake(
                "scaled by sqrt(d_model)",
                "the embedding lookup multiplies by sqrt(d_model) on the way in (section 3.4); the output "
                "projection does not: hidden @ embedding.T as it is.",
                lambda hidden, embedding: hidden @ embedding.T * math.sqrt(embedding.shape[1]),
            ),
            Mistake(
                "log-softmax applied",
                "the model returns logits, and the loss takes logits (chapter 11). Some implementations (The "
                "Annotated Transformer's Generator) return log_softmax(proj(x)) for a loss that takes "
                "log-probabilities; here the softmax belongs to the loss and to decoding.",
                lambda hidden, embedding: _log_softmax(hidden @ embedding.T),
            ),
        ),
    ),
]
