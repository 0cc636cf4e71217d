"""Hugging Face Llama (``LlamaForCausalLM``) <-> our decoder-only model (framework-free).

A Llama is our ``TransformerLM`` with the modern decoder's parts switched in (the preset
"tiny-llama" is one):

- pre-norm layers, ``x + sublayer(RMSNorm(x))``, and a final RMSNorm after the last layer:
  ``input_layernorm`` / ``post_attention_layernorm`` are our ``self_attn_norm`` / ``ffn_norm``,
  ``model.norm`` is our ``decoder.norm``; RMSNorm has a scale and no bias (eps ``rms_norm_eps``);
- the gated feed-forward SwiGLU, ``down(silu(gate(x)) * up(x))``: ``mlp.gate_proj`` /
  ``up_proj`` / ``down_proj`` are our ``ffn.w_gate`` / ``w_up`` / ``w_down``;
- rotary positions, nothing added to the embeddings: HF's ``rotate_half`` pairs feature i
  with feature i + d_k/2, our canonical ``rope_layout="halves"``, so q and k are copied as they
  are (the GGUF files of the same model need a permutation: ``transformer_convert.rope``);
- grouped-query attention: ``num_key_value_heads`` is our ``num_kv_heads``; query head h reads
  key/value head h // (num_heads / num_kv_heads) (HF's ``repeat_kv``);
- no biases, unless ``attention_bias`` (q, k, v and o) or ``mlp_bias`` (the three of the
  feed-forward): our ``attention_bias`` / ``ffn_bias``; unscaled token embeddings;
- the output projection ``lm_head`` is our ``generator.proj``; with ``tie_word_embeddings`` it
  is the token table itself (our ``tie_output``).

Every ``nn.Linear`` stores its weight [out, in]; ours are [in, out], so each is transposed.

Not weights: checkpoints of older transformers versions hold each layer's
``self_attn.rotary_emb.inv_freq`` (theta^(-2i/d_k), recomputed from ``rope_theta``): checked
against the config, then skipped. A tied model's ``state_dict()`` lists ``lm_head.weight`` too,
the same tensor as ``model.embed_tokens.weight``: accepted when equal to it, and written by
``params_to_llama`` so that ``load_state_dict(strict=True)`` accepts the export.

Refused, with the field named: rope scaling of any kind (``rope_scaling``, a
``rope_parameters.rope_type`` other than "default", a partial rotary factor), a ``head_dim``
other than hidden_size / num_attention_heads, an activation we lack, another ``model_type``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_spec.checks import check_params
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

MODEL = "Llama"
_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_new": "gelu_tanh",
                "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}  # fmt: skip


def _rope_theta(hf: Mapping[str, Any]) -> float:
    """transformers 5 keeps rotary settings in ``rope_parameters``; older configs in ``rope_theta``
    and ``rope_scaling``. Anything but plain rotary (scaled, partial) is refused."""
    if hf.get("rope_scaling") is not None:
        raise refuse(MODEL, "rope_scaling", hf["rope_scaling"], "our rotary embedding has no scaling")
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise refuse(MODEL, "rope_parameters.rope_type", rope["rope_type"], "only plain rotary ('default')")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise refuse(MODEL, "rope_parameters.partial_rotary_factor", rope["partial_rotary_factor"], "we rotate all")
    unknown = sorted(set(rope) - {"rope_type", "rope_theta", "partial_rotary_factor"})
    if unknown:
        raise refuse(MODEL, f"rope_parameters.{unknown[0]}", rope[unknown[0]], "plain rotary has no such setting")
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def llama_config(hf: Mapping[str, Any], pad_id: int | None = None) -> Config:
    """Our Config from a Hugging Face Llama ``config.json`` (as a dict; ``model.config.to_dict()``).

    ``pad_id``: the id our model hides as padding, when the config has no ``pad_token_id``."""
    if hf.get("model_type", "llama") != "llama":
        raise refuse(MODEL, "model_type", hf["model_type"], "this converter reads Llama checkpoints")
    d_model, heads = int(field(hf, "hidden_size", model=MODEL)), int(field(hf, "num_attention_heads", model=MODEL))
    head_dim = hf.get("head_dim")
    if head_dim is not None and heads * int(head_dim) != d_model:
        raise refuse(MODEL, "head_dim", head_dim, f"ours is hidden_size / num_attention_heads = {d_model / heads:g}")
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    vocab = int(field(hf, "vocab_size", model=MODEL))
    return Config(
        kind="decoder_only", d_model=d_model, num_heads=heads, num_kv_heads=None if kv_heads == heads else kv_heads,
        d_ff=int(field(hf, "intermediate_size", model=MODEL)), num_encoder_layers=0,
        num_decoder_layers=int(field(hf, "num_hidden_layers", model=MODEL)), tgt_vocab_size=vocab,
        max_len=int(hf.get("max_position_embeddings", 2048)), norm_first=True, norm="rms_norm",
        activation=activation(MODEL, "hidden_act", hf.get("hidden_act", "silu"), _ACTIVATIONS), gated_ffn=True,
        positional="rotary", rope_theta=_rope_theta(hf), rope_layout="halves",
        layer_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), bias=False,
        attention_bias=bool(hf.get("attention_bias", False)), ffn_bias=bool(hf.get("mlp_bias", False)),
        tie_output=bool(hf.get("tie_word_embeddings", False)), scale_embeddings=False,
        pad_id=resolve_pad_id(MODEL, hf, vocab, pad_id), dropout=0.0,
    )  # fmt: skip


def _check_llama_config(config: Config) -> None:
    """Only Llama-shaped Configs map onto LlamaForCausalLM (e.g. not a LayerNorm or post-norm one)."""
    want = {"kind": "decoder_only", "norm_first": True, "norm": "rms_norm", "gated_ffn": True,
            "positional": "rotary", "rope_layout": "halves", "bias": False, "scale_embeddings": False,
            "decoder_final_norm": True, "final_logits_bias": False, "embedding_norm": False,
            "type_vocab_size": 0}  # fmt: skip
    for name, value in want.items():
        if getattr(config, name) != value:
            raise ValueError(f"a Llama has {name}={value!r}, but the config has {getattr(config, name)!r}")


def _pairs(config: Config) -> dict[str, tuple[str, Any]]:
    """canonical name -> (Hugging Face name, the conversion: ``linear`` transposes, ``as_is`` copies)."""
    pairs = {"tgt_embed.token.weight": ("model.embed_tokens.weight", as_is),
             "decoder.norm.weight": ("model.norm.weight", as_is)}  # fmt: skip
    if not config.tie_output:
        pairs["generator.proj.weight"] = ("lm_head.weight", linear)
    layer = {
        "self_attn.w_q": "self_attn.q_proj",
        "self_attn.w_k": "self_attn.k_proj",
        "self_attn.w_v": "self_attn.v_proj",
        "self_attn.w_o": "self_attn.o_proj",
        "ffn.w_gate": "mlp.gate_proj",
        "ffn.w_up": "mlp.up_proj",
        "ffn.w_down": "mlp.down_proj",
    }
    schema = param_schema(config)
    for i in range(config.num_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"model.layers.{i}"
        pairs[f"{ours}.self_attn_norm.weight"] = (f"{theirs}.input_layernorm.weight", as_is)
        pairs[f"{ours}.ffn_norm.weight"] = (f"{theirs}.post_attention_layernorm.weight", as_is)
        for our_linear, their_linear in layer.items():
            pairs[f"{ours}.{our_linear}.weight"] = (f"{theirs}.{their_linear}.weight", linear)
            if f"{ours}.{our_linear}.bias" in schema:
                pairs[f"{ours}.{our_linear}.bias"] = (f"{theirs}.{their_linear}.bias", as_is)
    return pairs


def llama_schema(config: Config) -> Schema:
    """The weights of ``LlamaForCausalLM`` for ``config``: Hugging Face name -> shape ([out, in] Linears)."""
    _check_llama_config(config)
    return hf_shapes(_pairs(config), param_schema(config))


def _inv_freq(config: Config) -> np.ndarray:
    """theta^(-2i/d_k), i = 0 .. d_k/2 - 1: what old checkpoints kept as ``rotary_emb.inv_freq``."""
    return 1.0 / config.rope_theta ** (np.arange(0, config.d_k, 2, dtype=np.float64) / config.d_k)


def params_from_llama(state_dict: Mapping[str, Any], config: Config) -> dict[str, np.ndarray]:
    """A ``LlamaForCausalLM`` state dict (NumPy arrays, or anything ``np.asarray`` reads) -> canonical weights.

    Raises ``WeightsError`` naming every missing, unexpected or mis-shaped key."""
    required = llama_schema(config)
    optional = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": (config.d_k // 2,)
                for i in range(config.num_decoder_layers)}  # fmt: skip
    if config.tie_output:
        optional["lm_head.weight"] = (config.tgt_vocab_size, config.d_model)
    arrays = check_state_dict(state_dict, required, optional, what="a LlamaForCausalLM of this config")
    if config.tie_output:
        check_tied_copy(arrays, "lm_head.weight", "model.embed_tokens.weight", "tie_word_embeddings is set")
    for name in optional:
        if name.endswith("inv_freq"):
            check_buffer(arrays, name, lambda: _inv_freq(config), f"theta^(-2i/d_k) for rope_theta={config.rope_theta}")
    params = {ours: how(arrays[theirs]) for ours, (theirs, how) in _pairs(config).items()}
    check_params({k: v.shape for k, v in params.items()}, param_schema(config), what="the Llama config")
    return params


def params_to_llama(params: Mapping[str, Any], config: Config) -> dict[str, np.ndarray]:
    """Canonical weights -> a ``LlamaForCausalLM`` state dict, every key of its ``state_dict()``:
    a tied model's ``lm_head.weight`` is written too (a copy of the token table)."""
    _check_llama_config(config)
    check_params({k: np.shape(v) for k, v in params.items()}, param_schema(config), what="the Llama config")
    state = {theirs: how(params[ours]) for ours, (theirs, how) in _pairs(config).items()}
    if config.tie_output:
        state["lm_head.weight"] = as_is(params["tgt_embed.token.weight"]).copy()
    return state
