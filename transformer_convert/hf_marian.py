"""Hugging Face Marian (``MarianMTModel``, the OPUS-MT translators) <-> our encoder-decoder
(framework-free).

Marian is the paper's translation model, our ``Transformer``, with three knobs turned:

- post-norm layers with biases everywhere, ``LayerNorm(x + sublayer(x))``, LayerNorm eps 1e-5
  (torch's default), and no final encoder or decoder norm (our ``encoder_final_norm=False,
  decoder_final_norm=False``);
- fixed sinusoidal positions, but laid out in halves: all the sines, then all the cosines
  (our ``sinusoid_layout="halves"``; the paper interleaves them). Column j of the sines has the
  paper's frequency 10000^(-2j/d_model), j = 0 .. ceil(d/2) - 1, and column j of the cosines the
  same frequency, j = 0 .. floor(d/2) - 1: for an odd d_model there is one sine more than there
  are cosines (HF's ``MarianSinusoidalPositionalEmbedding``, ``sentinel = ceil(d/2)``);
- token embeddings scaled by sqrt(d_model) when ``scale_embedding`` (our ``scale_embeddings``;
  OPUS-MT models have it on);
- one token table shared by the source, the target and the output projection
  (``model.shared``: our ``share_embeddings`` and ``tie_output``, the one table
  ``tgt_embed.token.weight``), plus a bias added to the logits, ``final_logits_bias`` (our
  ``final_logits_bias=True``, ``generator.logits_bias``);
- the activation of the feed-forward from ``activation_function`` ("swish" is our "silu");
- decoding starts from the pad token (``decoder_start_token_id == pad_token_id``).

Names: in every layer ``self_attn`` is ours, with ``q_proj`` / ``k_proj`` / ``v_proj`` /
``out_proj`` our ``w_q`` / ``w_k`` / ``w_v`` / ``w_o``; ``self_attn_layer_norm`` is our
``self_attn_norm``; the decoder's ``encoder_attn`` / ``encoder_attn_layer_norm`` are our
``cross_attn`` / ``cross_attn_norm``; ``fc1`` / ``fc2`` our ``ffn.w_1`` / ``ffn.w_2``; and
``final_layer_norm``, the norm after the feed-forward (not a final norm of the stack), our
``ffn_norm``. Every ``nn.Linear`` stores [out, in]; ours are [in, out], so each is transposed.

Two things the weights do not say:

- Whether the checkpoint shares its embeddings (``share_encoder_decoder_embeddings``, default
  True): pass it as ``shared_embeddings`` (``marian_config`` reads it into ``share_embeddings``).
  Shared, the state dict holds ``model.shared.weight`` (and, in ``state_dict()``, its tied copies
  ``model.encoder.embed_tokens.weight``, ``model.decoder.embed_tokens.weight`` and
  ``lm_head.weight``, each checked equal to it). Not shared, the encoder and decoder tables are
  separate (``vocab_size`` and ``decoder_vocab_size`` rows) and the head is tied to the decoder's.
  Our config and the checkpoint may say different things: a config with ``share_embeddings``
  loads separate tables only when they are equal (else a ``WeightsError`` names both) and exports
  its one table as both; a config without it holds two copies of a shared table, and an export
  to a shared checkpoint refuses two copies that differ.
- Padding: our model hides every token equal to ``config.pad_id`` as a key, and Marian's
  decoder starts from that very token. Run our decoder on Marian's targets with an explicit
  ``tgt_mask`` that lets the start token be seen (the tests do), or every first query would
  see no key at all.

Not weights: ``model.encoder.embed_positions.weight`` and ``model.decoder.embed_positions.weight``
are the sinusoid table (``max_position_embeddings`` rows), stored in float32; when present they
are checked against it and skipped; exports write them (``state_dict()`` lists them).

Untied (``tie_word_embeddings=False``, with ``share_encoder_decoder_embeddings=False``):
``lm_head`` is a Linear without a bias and ``final_logits_bias`` is its bias: our untied
``generator.proj`` (weight and bias), with ``final_logits_bias=False``. transformers 5 reads
``tie_word_embeddings=False`` as "tie nothing", shared tables included: with shared embeddings
``model.shared`` then goes unused beside separate encoder and decoder tables, so that pair of
settings is refused.

Refused, with the field named: different encoder and decoder sizes (heads, feed-forward
widths: our Config has one of each), an activation we lack, the BART-era switches that the
current Marian ignores when they say something else than Marian computes (``normalize_before``,
``normalize_embedding``, ``add_final_layer_norm``, ``static_position_embeddings``,
``add_bias_logits``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_spec.checks import WeightsError, check_params
from transformer_spec.config import Config
from transformer_spec.schema import Schema, param_schema

from .hf_common import (
    activation,
    as_is,
    check_buffer,
    check_state_dict,
    check_tied_copy,
    field,
    hf_shapes,
    linear,
    refuse,
    resolve_pad_id,
)

MODEL = "Marian"
_ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh"}  # fmt: skip
# Switches of the BART-era configs (OPUS-MT's config.json files still carry them) and the value
# that says what MarianMTModel computes; it ignores them, so any other value is a different model.
_FIXED = {"normalize_before": False, "normalize_embedding": False, "add_final_layer_norm": False,
          "static_position_embeddings": True, "add_bias_logits": False}  # fmt: skip


def marian_config(hf: Mapping[str, Any]) -> Config:
    """Our Config from a Hugging Face Marian ``config.json`` (as a dict; ``model.config.to_dict()``)."""
    if hf.get("model_type", "marian") != "marian":
        raise refuse(MODEL, "model_type", hf["model_type"], "this converter reads Marian checkpoints")
    for name, value in _FIXED.items():
        if name in hf and hf[name] is not None and bool(hf[name]) != value:
            raise refuse(MODEL, name, hf[name], f"Marian computes {name}={value}")
    sizes = {}
    for encoder, decoder in (("encoder_attention_heads", "decoder_attention_heads"),
                             ("encoder_ffn_dim", "decoder_ffn_dim")):  # fmt: skip
        sizes[encoder] = int(field(hf, encoder, model=MODEL))
        if int(field(hf, decoder, model=MODEL)) != sizes[encoder]:
            raise refuse(MODEL, decoder, hf[decoder], f"our Config has one for both stacks; {encoder}={hf[encoder]}")
    vocab = int(field(hf, "vocab_size", model=MODEL))
    decoder_vocab = int(hf.get("decoder_vocab_size") or vocab)
    shared = bool(hf.get("share_encoder_decoder_embeddings", True))
    if shared and decoder_vocab != vocab:
        raise refuse(MODEL, "decoder_vocab_size", decoder_vocab, f"shared embeddings need vocab_size={vocab} rows")
    tied = bool(hf.get("tie_word_embeddings", True))
    if shared and not tied:
        why = "with shared embeddings transformers 5 then ties nothing, and model.shared goes unused"
        raise refuse(MODEL, "tie_word_embeddings", hf["tie_word_embeddings"], why)
    return Config(
        kind="encoder_decoder", d_model=int(field(hf, "d_model", model=MODEL)),
        num_heads=sizes["encoder_attention_heads"], d_ff=sizes["encoder_ffn_dim"],
        num_encoder_layers=int(field(hf, "encoder_layers", model=MODEL)),
        num_decoder_layers=int(field(hf, "decoder_layers", model=MODEL)), src_vocab_size=vocab,
        tgt_vocab_size=decoder_vocab, max_len=int(hf.get("max_position_embeddings", 1024)), norm_first=False,
        activation=activation(MODEL, "activation_function", hf.get("activation_function", "gelu"), _ACTIVATIONS),
        positional="sinusoidal", sinusoid_layout="halves", layer_norm_eps=1e-5, bias=True,
        encoder_final_norm=False, decoder_final_norm=False, tie_output=tied, share_embeddings=shared,
        scale_embeddings=bool(hf.get("scale_embedding", False)), final_logits_bias=tied,
        pad_id=resolve_pad_id(MODEL, hf, min(vocab, decoder_vocab), None), dropout=0.0,
    )  # fmt: skip


def _check_marian_config(config: Config, shared_embeddings: bool) -> None:
    """Only Marian-shaped Configs map onto MarianMTModel."""
    want = {"kind": "encoder_decoder", "norm_first": False, "norm": "layer_norm", "gated_ffn": False,
            "positional": "sinusoidal", "sinusoid_layout": "halves", "bias": True, "attention_bias": True,
            "ffn_bias": True, "encoder_final_norm": False, "decoder_final_norm": False,
            "final_logits_bias": config.tie_output, "embedding_norm": False, "type_vocab_size": 0,
            "layer_norm_eps": 1e-5, "num_kv_heads": config.num_heads}  # fmt: skip
    for name, value in want.items():
        if getattr(config, name) != value:
            raise ValueError(f"a Marian model has {name}={value!r}, but the config has {getattr(config, name)!r}")
    if shared_embeddings and config.src_vocab_size != config.tgt_vocab_size:
        raise ValueError(
            f"shared embeddings need src_vocab_size == tgt_vocab_size, got {config.src_vocab_size} and "
            f"{config.tgt_vocab_size}"
        )


def marian_sinusoids(num_positions: int, d_model: int) -> np.ndarray:
    """HF's ``MarianSinusoidalPositionalEmbedding.create_weight`` in float64 (it rounds to float32):
    (num_positions, d_model), the ceil(d/2) sines, then the floor(d/2) cosines."""
    position_enc = np.array(
        [[pos / np.power(10000, 2 * (j // 2) / d_model) for j in range(d_model)] for pos in range(num_positions)]
    )  # (num_positions, d_model): column j holds the angle of frequency j // 2 (HF's expression, bit for bit)
    sentinel = (d_model + 1) // 2  # ceil(d/2) sines
    table = np.empty((num_positions, d_model))
    table[:, :sentinel] = np.sin(position_enc[:, 0::2])  # (num_positions, ceil(d/2))
    table[:, sentinel:] = np.cos(position_enc[:, 1::2])  # (num_positions, floor(d/2))
    return table


def _pairs(config: Config) -> dict[str, tuple[str, Any]]:
    """canonical name -> (Hugging Face name, ``linear`` (transposed) or ``as_is``), for the layers
    and the untied head; the token tables and ``final_logits_bias`` are handled by the callers."""
    attention = {"w_q": "q_proj", "w_k": "k_proj", "w_v": "v_proj", "w_o": "out_proj"}
    sublayers = {"encoder": {"self_attn": "self_attn", "self_attn_norm": "self_attn_layer_norm", "ffn.w_1": "fc1",
                             "ffn.w_2": "fc2", "ffn_norm": "final_layer_norm"},
                 "decoder": {"self_attn": "self_attn", "self_attn_norm": "self_attn_layer_norm",
                             "cross_attn": "encoder_attn", "cross_attn_norm": "encoder_attn_layer_norm",
                             "ffn.w_1": "fc1", "ffn.w_2": "fc2", "ffn_norm": "final_layer_norm"}}  # fmt: skip
    pairs = {}
    for stack, layers in (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers)):
        for i in range(layers):
            for ours, theirs in sublayers[stack].items():
                ours, theirs = f"{stack}.layers.{i}.{ours}", f"model.{stack}.layers.{i}.{theirs}"
                if ours.endswith("attn"):
                    for our_linear, their_linear in attention.items():
                        pairs[f"{ours}.{our_linear}.weight"] = (f"{theirs}.{their_linear}.weight", linear)
                        pairs[f"{ours}.{our_linear}.bias"] = (f"{theirs}.{their_linear}.bias", as_is)
                else:
                    pairs[f"{ours}.weight"] = (f"{theirs}.weight", linear if ".w_" in ours else as_is)
                    pairs[f"{ours}.bias"] = (f"{theirs}.bias", as_is)
    if not config.tie_output:
        pairs["generator.proj.weight"] = ("lm_head.weight", linear)
    return pairs


def _tables(config: Config, shared_embeddings: bool) -> list[tuple[str, str]]:
    """(our token table, the Hugging Face table it is read from and written to), the source's then
    the target's; with ``share_embeddings`` our one table, tgt_embed's, stands for both."""
    source = "tgt_embed.token.weight" if config.share_embeddings else "src_embed.token.weight"
    if shared_embeddings:
        return [(source, "model.shared.weight"), ("tgt_embed.token.weight", "model.shared.weight")]
    return [(source, "model.encoder.embed_tokens.weight"),
            ("tgt_embed.token.weight", "model.decoder.embed_tokens.weight")]  # fmt: skip


def marian_schema(config: Config, shared_embeddings: bool = True) -> Schema:
    """The weights of ``MarianMTModel`` for ``config``: Hugging Face name -> shape ([out, in] Linears),
    without the tied copies and the sinusoid tables."""
    _check_marian_config(config, shared_embeddings)
    ours = param_schema(config)
    schema = {theirs: ours[name] for name, theirs in _tables(config, shared_embeddings)}
    schema |= hf_shapes(_pairs(config), ours)
    schema["final_logits_bias"] = (1, config.tgt_vocab_size)  # a buffer in torch, a weight for us
    return schema


def _tied_copies(config: Config, shared_embeddings: bool) -> dict[str, str]:
    """Tied copy -> its source: the keys ``state_dict()`` lists for one tensor under several names."""
    decoder_table = "model.shared.weight" if shared_embeddings else "model.decoder.embed_tokens.weight"
    copies = {"lm_head.weight": decoder_table} if config.tie_output else {}
    if shared_embeddings:
        copies["model.encoder.embed_tokens.weight"] = "model.shared.weight"
        copies["model.decoder.embed_tokens.weight"] = "model.shared.weight"
    return copies


def _positions(config: Config) -> list[str]:
    return [f"model.{stack}.embed_positions.weight" for stack in ("encoder", "decoder")]


def params_from_marian(
    state_dict: Mapping[str, Any], config: Config, shared_embeddings: bool = True
) -> dict[str, np.ndarray]:
    """A ``MarianMTModel`` state dict (NumPy arrays, or anything ``np.asarray`` reads) -> canonical weights.

    ``shared_embeddings``: the checkpoint's ``share_encoder_decoder_embeddings``. Raises
    ``WeightsError`` naming every missing, unexpected or mis-shaped key."""
    required = marian_schema(config, shared_embeddings)
    copies = _tied_copies(config, shared_embeddings)
    optional = {copy: required[source] for copy, source in copies.items()}
    optional |= {name: (config.max_len, config.d_model) for name in _positions(config)}
    arrays = check_state_dict(state_dict, required, optional, what="a MarianMTModel of this config")
    for copy, source in copies.items():
        check_tied_copy(arrays, copy, source, "the config shares or ties this table")
    for name in _positions(config):
        table = lambda: marian_sinusoids(config.max_len, config.d_model)  # noqa: E731
        check_buffer(arrays, name, table, "Marian's [sin | cos] sinusoid table")
    if config.share_embeddings and not shared_embeddings:  # two tables into our one
        source, target = "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"
        if not np.array_equal(arrays[source], arrays[target]):
            raise WeightsError(
                f"{source} differs from {target}, but the config shares one table between the source and the "
                "target (share_embeddings=True): load the checkpoint into a config with share_embeddings=False"
            )
    params = {ours: as_is(arrays[theirs]) for ours, theirs in _tables(config, shared_embeddings)}
    params |= {ours: how(arrays[theirs]) for ours, (theirs, how) in _pairs(config).items()}
    bias = as_is(arrays["final_logits_bias"][0])  # (1, V) -> (V,)
    params["generator.logits_bias" if config.tie_output else "generator.proj.bias"] = bias
    check_params({k: v.shape for k, v in params.items()}, param_schema(config), what="the Marian config")
    return params


def params_to_marian(
    params: Mapping[str, Any], config: Config, shared_embeddings: bool = True
) -> dict[str, np.ndarray]:
    """Canonical weights -> a ``MarianMTModel`` state dict, every key of its ``state_dict()``: the tied
    copies and the sinusoid tables (in the weights' dtype) too. Shared embeddings must be equal."""
    _check_marian_config(config, shared_embeddings)
    check_params({k: np.shape(v) for k, v in params.items()}, param_schema(config), what="the Marian config")
    tables = _tables(config, shared_embeddings)
    source, target = (np.asarray(params[ours]) for ours, _ in tables)  # one array with share_embeddings
    if shared_embeddings and not np.array_equal(source, target):
        raise WeightsError(
            "src_embed.token.weight differs from tgt_embed.token.weight, but a Marian model with shared "
            "embeddings has one table: export with shared_embeddings=False"
        )
    state = {theirs: as_is(params[ours]) for ours, theirs in tables}
    state |= {theirs: how(params[ours]) for ours, (theirs, how) in _pairs(config).items()}
    bias = params["generator.logits_bias" if config.tie_output else "generator.proj.bias"]
    state["final_logits_bias"] = as_is(np.asarray(bias)[None, :])  # (V,) -> (1, V)
    for copy, source_name in _tied_copies(config, shared_embeddings).items():
        state[copy] = state[source_name].copy()
    table = marian_sinusoids(config.max_len, config.d_model).astype(target.dtype)
    for name in _positions(config):
        state[name] = table.copy()
    return state
