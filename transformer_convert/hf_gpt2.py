"""Hugging Face GPT-2 (``GPT2LMHeadModel``) <-> our decoder-only model (framework-free).

GPT-2 is our ``TransformerLM`` as the tutorials build it (the preset "tiny-lm" is close):

- pre-norm layers, ``x + sublayer(LayerNorm(x))``, then a final LayerNorm after the last
  layer: ``ln_1`` / ``ln_2`` are our ``self_attn_norm`` / ``ffn_norm``, ``ln_f`` is our
  ``decoder.norm``; LayerNorm eps ``layer_norm_epsilon`` (1e-5), biases everywhere;
- learned positions added to unscaled token embeddings: ``wte`` / ``wpe`` are our
  ``tgt_embed.token`` / ``tgt_embed.position`` (``n_positions`` rows: our ``max_len``);
- the paper's feed-forward with the tanh approximation of GELU (``gelu_new``, our
  "gelu_tanh"): ``mlp.c_fc`` / ``mlp.c_proj`` are our ``ffn.w_1`` / ``ffn.w_2``, d_ff =
  ``n_inner`` or 4 * n_embd;
- attention ``attn.c_attn`` computes q, k and v in one matrix, ``[q | k | v]`` side by side
  (split into our ``w_q``, ``w_k``, ``w_v``; fused back on export), ``attn.c_proj`` is our ``w_o``;
- the output projection is the token table, transposed (``lm_head`` tied to ``wte``: our
  ``tie_output``).

GPT-2's ``Conv1D`` is a Linear that stores its weight [in, out], as ours does: nothing is
transposed. Checkpoints of ``GPT2LMHeadModel`` prefix the body's keys with ``transformer.``;
OpenAI's converted ones (and ``GPT2Model``'s) do not: both load. Exports carry the prefix and
every key of ``GPT2LMHeadModel.state_dict()``, the tied ``lm_head.weight`` included.

Not weights: older checkpoints hold each layer's ``attn.bias`` (the causal mask, a lower
triangle of ones, (1, 1, n_positions, n_positions)) and ``attn.masked_bias`` (the fill value,
a scalar): the mask is checked to be causal, both are skipped.

An untied GPT-2 (``tie_word_embeddings=False``) has an ``lm_head`` without a bias, while our
untied generator has one whenever ``bias`` is on: it loads as zeros, and an export refuses a
generator bias that is not zero rather than drop it.

Refused, with the field named: cross-attention (``add_cross_attention``), unscaled or
layer-scaled attention scores (``scale_attn_weights=False``, ``scale_attn_by_inverse_layer_idx``),
an activation we lack. ``reorder_and_upcast_attn`` computes the same scores in float32 (a
mixed-precision setting) and is accepted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_spec.checks import WeightsError, check_params
from transformer_spec.config import Config
from transformer_spec.schema import Schema, param_schema

from .hf_common import activation, as_is, check_buffer, check_state_dict, check_tied_copy, field, refuse, resolve_pad_id

MODEL = "GPT-2"
PREFIX = "transformer."
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                "silu": "silu", "swish": "silu"}  # fmt: skip


def gpt2_config(hf: Mapping[str, Any], pad_id: int | None = None) -> Config:
    """Our Config from a Hugging Face GPT-2 ``config.json`` (as a dict; ``model.config.to_dict()``).

    ``pad_id``: the id our model hides as padding, when the config has no ``pad_token_id``
    (GPT-2's has none: ``<|endoftext|>``, id 50256, is the usual choice)."""
    if hf.get("model_type", "gpt2") != "gpt2":
        raise refuse(MODEL, "model_type", hf["model_type"], "this converter reads GPT-2 checkpoints")
    for name, supported in (("add_cross_attention", False), ("scale_attn_weights", True),
                            ("scale_attn_by_inverse_layer_idx", False)):  # fmt: skip
        if bool(hf.get(name, supported)) != supported:
            raise refuse(MODEL, name, hf[name], f"our attention is GPT-2's with {name}={supported}")
    d_model, vocab = int(field(hf, "n_embd", model=MODEL)), int(field(hf, "vocab_size", model=MODEL))
    return Config(
        kind="decoder_only", d_model=d_model, num_heads=int(field(hf, "n_head", model=MODEL)),
        d_ff=int(hf.get("n_inner") or 4 * d_model), num_encoder_layers=0,
        num_decoder_layers=int(field(hf, "n_layer", model=MODEL)), tgt_vocab_size=vocab,
        max_len=int(hf.get("n_positions", 1024)), norm_first=True,
        activation=activation(MODEL, "activation_function", hf.get("activation_function", "gelu_new"), _ACTIVATIONS),
        positional="learned", layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)), bias=True,
        tie_output=bool(hf.get("tie_word_embeddings", True)), scale_embeddings=False,
        pad_id=resolve_pad_id(MODEL, hf, vocab, pad_id), dropout=0.0,
    )  # fmt: skip


def _check_gpt2_config(config: Config) -> None:
    """Only GPT-2-shaped Configs map onto GPT2LMHeadModel."""
    want = {"kind": "decoder_only", "norm_first": True, "norm": "layer_norm", "gated_ffn": False,
            "positional": "learned", "bias": True, "attention_bias": True, "ffn_bias": True,
            "scale_embeddings": False, "decoder_final_norm": True, "final_logits_bias": False,
            "embedding_norm": False, "type_vocab_size": 0, "num_kv_heads": config.num_heads}  # fmt: skip
    for name, value in want.items():
        if getattr(config, name) != value:
            raise ValueError(f"a GPT-2 has {name}={value!r}, but the config has {getattr(config, name)!r}")


def _pairs(config: Config) -> dict[str, str]:
    """canonical name -> Hugging Face name (without ``transformer.``), for everything but q, k, v
    (which share ``attn.c_attn``) and the untied head (an ``nn.Linear``, [out, in], without a bias).
    Conv1D is [in, out] like ours: every tensor here is copied as it is."""
    pairs = {"tgt_embed.token.weight": "wte.weight", "tgt_embed.position.weight": "wpe.weight",
             "decoder.norm.weight": "ln_f.weight", "decoder.norm.bias": "ln_f.bias"}  # fmt: skip
    layer = {"self_attn_norm": "ln_1", "self_attn.w_o": "attn.c_proj", "ffn_norm": "ln_2", "ffn.w_1": "mlp.c_fc",
             "ffn.w_2": "mlp.c_proj"}  # fmt: skip
    for i in range(config.num_decoder_layers):
        for ours, theirs in layer.items():
            for leaf in ("weight", "bias"):
                pairs[f"decoder.layers.{i}.{ours}.{leaf}"] = f"h.{i}.{theirs}.{leaf}"
    return pairs


def gpt2_schema(config: Config) -> Schema:
    """The weights of ``GPT2LMHeadModel`` for ``config``, without the ``transformer.`` prefix:
    Hugging Face name -> shape (``c_attn``: [d_model, 3 d_model], q|k|v side by side)."""
    _check_gpt2_config(config)
    ours = param_schema(config)
    schema = {theirs: ours[name] for name, theirs in _pairs(config).items()}
    if not config.tie_output:
        schema["lm_head.weight"] = (config.tgt_vocab_size, config.d_model)
    for i in range(config.num_decoder_layers):
        schema[f"h.{i}.attn.c_attn.weight"] = (config.d_model, 3 * config.d_model)
        schema[f"h.{i}.attn.c_attn.bias"] = (3 * config.d_model,)
    return schema


def _without_prefix(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for key, value in state_dict.items():
        name = key.removeprefix(PREFIX)
        if name in state:
            raise WeightsError(f"{name!r} is given twice, with and without the {PREFIX!r} prefix")
        state[name] = value
    return state


def params_from_gpt2(state_dict: Mapping[str, Any], config: Config) -> dict[str, np.ndarray]:
    """A ``GPT2LMHeadModel`` (or ``GPT2Model``) state dict, keys with or without ``transformer.``
    -> canonical weights. Raises ``WeightsError`` naming every missing, unexpected or mis-shaped key
    (reported without the prefix)."""
    n, d = config.max_len, config.d_model
    optional = {}
    for i in range(config.num_decoder_layers):
        optional[f"h.{i}.attn.bias"] = (1, 1, n, n)  # the causal mask, not a weight
        optional[f"h.{i}.attn.masked_bias"] = ()  # the mask's fill value, not a weight
    if config.tie_output:
        optional["lm_head.weight"] = (config.tgt_vocab_size, d)
    state = _without_prefix(state_dict)
    arrays = check_state_dict(state, gpt2_schema(config), optional, what="a GPT2LMHeadModel of this config")
    if config.tie_output:
        check_tied_copy(arrays, "lm_head.weight", "wte.weight", "tie_word_embeddings is set")
    causal = np.tril(np.ones((n, n)))[None, None]  # (1, 1, n_positions, n_positions)
    for i in range(config.num_decoder_layers):
        check_buffer(arrays, f"h.{i}.attn.bias", lambda: causal, "GPT-2's causal mask (a lower triangle of ones)")
    params = {ours: as_is(arrays[theirs]) for ours, theirs in _pairs(config).items()}
    for i in range(config.num_decoder_layers):
        weight, bias = arrays[f"h.{i}.attn.c_attn.weight"], arrays[f"h.{i}.attn.c_attn.bias"]  # (d, 3d), (3d,)
        for j, name in enumerate(("w_q", "w_k", "w_v")):
            params[f"decoder.layers.{i}.self_attn.{name}.weight"] = as_is(weight[:, j * d : (j + 1) * d])  # (d, d)
            params[f"decoder.layers.{i}.self_attn.{name}.bias"] = as_is(bias[j * d : (j + 1) * d])  # (d,)
    if not config.tie_output:
        params["generator.proj.weight"] = as_is(arrays["lm_head.weight"].T)  # nn.Linear [V, d] -> ours [d, V]
        params["generator.proj.bias"] = np.zeros(config.tgt_vocab_size, arrays["lm_head.weight"].dtype)  # GPT-2: none
    check_params({k: v.shape for k, v in params.items()}, param_schema(config), what="the GPT-2 config")
    return params


def params_to_gpt2(params: Mapping[str, Any], config: Config) -> dict[str, np.ndarray]:
    """Canonical weights -> a ``GPT2LMHeadModel`` state dict (keys with ``transformer.``), every key of
    its ``state_dict()``: q, k, v fused into ``c_attn``; a tied model's ``lm_head.weight`` written too."""
    _check_gpt2_config(config)
    check_params({k: np.shape(v) for k, v in params.items()}, param_schema(config), what="the GPT-2 config")
    state = {theirs: as_is(params[ours]) for ours, theirs in _pairs(config).items()}
    for i in range(config.num_decoder_layers):
        attention = f"decoder.layers.{i}.self_attn"
        state[f"h.{i}.attn.c_attn.weight"] = np.concatenate(
            [np.asarray(params[f"{attention}.{name}.weight"]) for name in ("w_q", "w_k", "w_v")], axis=1
        )  # 3 x (d, d) -> (d, 3d)
        state[f"h.{i}.attn.c_attn.bias"] = np.concatenate(
            [np.asarray(params[f"{attention}.{name}.bias"]) for name in ("w_q", "w_k", "w_v")]
        )  # 3 x (d,) -> (3d,)
    if config.tie_output:
        state["lm_head.weight"] = as_is(params["tgt_embed.token.weight"]).copy()
    else:
        if np.any(np.asarray(params["generator.proj.bias"]) != 0):
            raise WeightsError("generator.proj.bias is not zero, but GPT-2's untied lm_head has no bias to hold it")
        state["lm_head.weight"] = as_is(np.asarray(params["generator.proj.weight"]).T)  # ours [d, V] -> [V, d]
    return {("" if name == "lm_head.weight" else PREFIX) + name: value for name, value in state.items()}
