"""The weight schema: every parameter's canonical flat name and shape, from a Config.

Paper notation throughout: a linear layer computes ``x @ weight + bias`` with
``weight`` stored as [in, out]; q, k, v and o projections are kept separate. The
names follow the module tree of every backend (``encoder.layers.0.self_attn.w_q``),
so a backend maps its own leaf names (torch ``weight`` [out, in], Flax ``kernel``)
onto these and nothing else.

Each component has a schema function of its own; the model's schema is their
composition, and the shared tests build single components from the same functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .config import Config

Schema = dict[str, tuple[int, ...]]


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def linear_schema(prefix: str, d_in: int, d_out: int, bias: bool) -> Schema:
    schema = {_join(prefix, "weight"): (d_in, d_out)}
    if bias:
        schema[_join(prefix, "bias")] = (d_out,)
    return schema


def layer_norm_schema(config: Config, prefix: str = "") -> Schema:
    schema = {_join(prefix, "weight"): (config.d_model,)}
    if config.bias:
        schema[_join(prefix, "bias")] = (config.d_model,)
    return schema


def rms_norm_schema(config: Config, prefix: str = "") -> Schema:
    return {_join(prefix, "weight"): (config.d_model,)}  # a scale only: no mean, no bias


def norm_schema(config: Config, prefix: str = "") -> Schema:
    """The normalisation ``config.norm`` names, wherever a layer has one."""
    return rms_norm_schema(config, prefix) if config.norm == "rms_norm" else layer_norm_schema(config, prefix)


def attention_schema(config: Config, prefix: str = "") -> Schema:
    """q and o have num_heads heads of d_k; k and v have num_kv_heads (grouped-query attention)."""
    d_q, d_kv, bias = config.num_heads * config.d_k, config.num_kv_heads * config.d_k, config.attention_bias
    return (
        linear_schema(_join(prefix, "w_q"), config.d_model, d_q, bias)
        | linear_schema(_join(prefix, "w_k"), config.d_model, d_kv, bias)
        | linear_schema(_join(prefix, "w_v"), config.d_model, d_kv, bias)
        | linear_schema(_join(prefix, "w_o"), d_q, config.d_model, bias)
    )


def attention_heads_schema(config: Config, prefix: str = "") -> Schema:
    """The tutorials' layout: one ``AttentionHead`` per head, each with its own
    Linear(d_model, d_k) for q, k and v, then one output projection."""
    schema: Schema = {}
    for h in range(config.num_heads):
        for name in ("w_q", "w_k", "w_v"):
            schema |= linear_schema(_join(prefix, f"heads.{h}.{name}"), config.d_model, config.d_k, config.bias)
    return schema | linear_schema(_join(prefix, "w_o"), config.d_model, config.d_model, config.bias)


def attention_to_heads(params: Mapping[str, np.ndarray], config: Config) -> dict[str, np.ndarray]:
    """Fused multi-head attention weights -> the tutorials' list of ``AttentionHead``s
    (``attention_heads_schema``'s names).

    Head h of the fused layer owns columns [h*d_k, (h+1)*d_k) of w_q, w_k and w_v:
    that is exactly what ``split_heads`` (reshape to (B, T, H, d_k)) assumes.
    """
    d_k = config.d_k
    heads: dict[str, np.ndarray] = {}
    for h in range(config.num_heads):
        columns = slice(h * d_k, (h + 1) * d_k)
        for name in ("w_q", "w_k", "w_v"):
            heads[f"heads.{h}.{name}.weight"] = params[f"{name}.weight"][:, columns].copy()
            if f"{name}.bias" in params:
                heads[f"heads.{h}.{name}.bias"] = params[f"{name}.bias"][columns].copy()
    heads["w_o.weight"] = params["w_o.weight"].copy()
    if "w_o.bias" in params:
        heads["w_o.bias"] = params["w_o.bias"].copy()
    return heads


def feed_forward_schema(config: Config, prefix: str = "") -> Schema:
    return linear_schema(_join(prefix, "w_1"), config.d_model, config.d_ff, config.ffn_bias) | linear_schema(
        _join(prefix, "w_2"), config.d_ff, config.d_model, config.ffn_bias
    )


def gated_feed_forward_schema(config: Config, prefix: str = "") -> Schema:
    bias = config.ffn_bias
    return (
        linear_schema(_join(prefix, "w_gate"), config.d_model, config.d_ff, bias)
        | linear_schema(_join(prefix, "w_up"), config.d_model, config.d_ff, bias)
        | linear_schema(_join(prefix, "w_down"), config.d_ff, config.d_model, bias)
    )


def ffn_schema(config: Config, prefix: str = "") -> Schema:
    """The feed-forward network a layer has: gated (SwiGLU, GeGLU) or the paper's."""
    return gated_feed_forward_schema(config, prefix) if config.gated_ffn else feed_forward_schema(config, prefix)


def embeddings_schema(config: Config, prefix: str = "", vocab_size: int | None = None) -> Schema:
    vocab = vocab_size if vocab_size is not None else _embedding_vocab(config, prefix)
    schema: Schema = {_join(prefix, "token.weight"): (vocab, config.d_model)}
    if config.positional == "learned":
        schema[_join(prefix, "position.weight")] = (config.max_len, config.d_model)
    if config.type_vocab_size > 0:
        schema[_join(prefix, "token_type.weight")] = (config.type_vocab_size, config.d_model)
    if config.embedding_norm:
        schema |= norm_schema(config, _join(prefix, "norm"))
    return schema


def _embedding_vocab(config: Config, prefix: str) -> int:
    return config.tgt_vocab_size if prefix.endswith("tgt_embed") or not config.uses_encoder else config.src_vocab_size


def encoder_layer_schema(config: Config, prefix: str = "") -> Schema:
    return (
        attention_schema(config, _join(prefix, "self_attn"))
        | norm_schema(config, _join(prefix, "self_attn_norm"))
        | ffn_schema(config, _join(prefix, "ffn"))
        | norm_schema(config, _join(prefix, "ffn_norm"))
    )


def decoder_layer_schema(config: Config, prefix: str = "") -> Schema:
    schema = attention_schema(config, _join(prefix, "self_attn")) | norm_schema(config, _join(prefix, "self_attn_norm"))
    if config.decoder_has_cross_attention:
        schema |= attention_schema(config, _join(prefix, "cross_attn"))
        schema |= norm_schema(config, _join(prefix, "cross_attn_norm"))
    return schema | ffn_schema(config, _join(prefix, "ffn")) | norm_schema(config, _join(prefix, "ffn_norm"))


def encoder_schema(config: Config, prefix: str = "") -> Schema:
    schema: Schema = {}
    for i in range(config.num_encoder_layers):
        schema |= encoder_layer_schema(config, _join(prefix, f"layers.{i}"))
    if config.encoder_final_norm:
        schema |= norm_schema(config, _join(prefix, "norm"))
    return schema


def decoder_schema(config: Config, prefix: str = "") -> Schema:
    schema: Schema = {}
    for i in range(config.num_decoder_layers):
        schema |= decoder_layer_schema(config, _join(prefix, f"layers.{i}"))
    if config.decoder_final_norm:
        schema |= norm_schema(config, _join(prefix, "norm"))
    return schema


def model_schema(config: Config, prefix: str = "") -> Schema:
    """All parameters of the model that ``config.kind`` names."""
    schema: Schema = {}
    if config.uses_encoder:
        src_embed = embeddings_schema(config, _join(prefix, "src_embed"), config.src_vocab_size)
        if config.share_embeddings:  # the encoder reads tgt_embed.token.weight: one matrix, named once
            del src_embed[_join(prefix, "src_embed.token.weight")]
        schema |= src_embed
        schema |= encoder_schema(config, _join(prefix, "encoder"))
        if config.pooler:
            schema |= linear_schema(_join(prefix, "pooler.proj"), config.d_model, config.d_model, config.bias)
    if config.uses_decoder:
        schema |= embeddings_schema(config, _join(prefix, "tgt_embed"), config.tgt_vocab_size)
        schema |= decoder_schema(config, _join(prefix, "decoder"))
        if not config.tie_output:
            schema |= linear_schema(_join(prefix, "generator.proj"), config.d_model, config.tgt_vocab_size, config.bias)
        if config.final_logits_bias:
            schema[_join(prefix, "generator.logits_bias")] = (config.tgt_vocab_size,)
    return schema


# The parts of a model a parameter count is given by: the first component of each name.
PARTS = {"src_embed": "embeddings", "tgt_embed": "embeddings", "encoder": "encoder", "decoder": "decoder",
         "generator": "output projection", "pooler": "pooler"}  # fmt: skip


def param_counts(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Parameters per part, from a model's schema (or the shapes of the weights a file holds):
    "embeddings" (each token table once, so a table that ``share_embeddings`` gives both stacks
    once; positions, token types and their norm), "encoder", "decoder" (their layers and final
    norms), "output projection" (none when ``tie_output``: it is the target table, counted in
    the embeddings; the logits bias), "pooler", and "total". Biases and norms are counted."""
    counts = dict.fromkeys((*dict.fromkeys(PARTS.values()), "total"), 0)
    for name, shape in shapes.items():
        part = PARTS.get(name.split(".")[0])
        if part is None:
            raise ValueError(f"{name!r} is in no part of a model; expected a name starting with one of {sorted(PARTS)}")
        counts[part] += math.prod(shape)
        counts["total"] += math.prod(shape)
    return counts


COMPONENTS: dict[str, Callable[..., Schema]] = {
    "layer_norm": layer_norm_schema,
    "rms_norm": rms_norm_schema,
    "attention": attention_schema,
    "attention_heads": attention_heads_schema,
    "feed_forward": feed_forward_schema,
    "gated_feed_forward": gated_feed_forward_schema,
    "embeddings": embeddings_schema,
    "encoder_layer": encoder_layer_schema,
    "decoder_layer": decoder_layer_schema,
    "encoder": encoder_schema,
    "decoder": decoder_schema,
    "model": model_schema,
}


def param_schema(config: Config, component: str = "model", prefix: str = "") -> Schema:
    """Canonical ``name -> shape`` for ``component`` ("model" by default), in a fixed order."""
    if component not in COMPONENTS:
        raise ValueError(f"unknown component {component!r}; expected one of {sorted(COMPONENTS)}")
    return COMPONENTS[component](config, prefix)


def parent_of(module: Any, name: str) -> tuple[Any, str]:
    """'encoder.layers.0.ffn.w_1.weight' -> (the w_1 Linear, 'weight'): a canonical name is the
    parameter's attribute path in every backend's module tree (a digit indexes a list of layers).

    The leaf is the canonical one; a backend renames or transposes it where its framework
    differs (Flax's ``kernel``, torch's [out, in]), in its ``params.py``."""
    *path, leaf = name.split(".")
    for part in path:
        module = module[int(part)] if part.isdigit() else getattr(module, part)
    if module is None:  # e.g. the tied generator's missing projection
        raise AttributeError(name)
    return module, leaf
