"""Converters between ``torch.nn.Transformer`` (and its parts) and our canonical weights.

Framework-free: a state_dict is passed as NumPy arrays (``{k: v.numpy() for k, v in
module.state_dict().items()}``) and comes back the same way (``torch.from_numpy``).

What differs in PyTorch's layout:
- ``nn.MultiheadAttention`` packs q, k and v into one ``in_proj_weight`` [3E, E] (rows in
  that order) and ``in_proj_bias`` [3E]; its output projection is ``out_proj``.
- Every ``nn.Linear`` stores [out, in]; ours is the paper's [in, out].
- Layer norms are numbered: encoder ``norm1`` (self-attention), ``norm2`` (feed-forward);
  decoder ``norm1`` (self), ``norm2`` (cross), ``norm3`` (feed-forward). The
  feed-forward layers are ``linear1``/``linear2``; cross-attention is ``multihead_attn``.
- ``nn.Transformer`` always builds a final LayerNorm after each stack, post-norm too;
  ``nn.TransformerEncoder`` has one only when given ``norm=``. It has no embeddings and no
  output projection: those stay ours.
- Masks: True means *masked* there (``src_key_padding_mask``, bool ``tgt_mask``), the
  opposite of ours.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from transformer_spec.checks import check_params
from transformer_spec.config import Config
from transformer_spec.schema import Schema, param_schema

from .hf_common import check_state_dict

# (our sub-layer name, torch's) inside one layer
_ENCODER_LAYER = {
    "self_attn": "self_attn",
    "self_attn_norm": "norm1",
    "ffn.w_1": "linear1",
    "ffn.w_2": "linear2",
    "ffn_norm": "norm2",
}
_DECODER_LAYER = {
    "self_attn": "self_attn",
    "self_attn_norm": "norm1",
    "cross_attn": "multihead_attn",
    "cross_attn_norm": "norm2",
    "ffn.w_1": "linear1",
    "ffn.w_2": "linear2",
    "ffn_norm": "norm3",
}
# the torch modules a state_dict may come from (see from_torch_transformer)
MODULES = ("attention", "encoder_layer", "decoder_layer", "encoder", "decoder", "transformer")


def torch_transformer_config(
    d_model: int = 512,
    nhead: int = 8,
    num_encoder_layers: int = 6,
    num_decoder_layers: int = 6,
    dim_feedforward: int = 2048,
    activation: str = "relu",
    layer_norm_eps: float = 1e-5,
    norm_first: bool = False,
    bias: bool = True,
    **model: object,
) -> Config:
    """Our Config for an ``nn.Transformer`` built with these arguments (its names), with the
    final norms it always has. ``model`` sets what nn.Transformer lacks (vocabularies, ...)."""
    return Config(
        d_model=d_model, num_heads=nhead, d_ff=dim_feedforward, num_encoder_layers=num_encoder_layers,
        num_decoder_layers=num_decoder_layers, activation=activation, layer_norm_eps=layer_norm_eps,
        norm_first=norm_first, bias=bias, encoder_final_norm=True, decoder_final_norm=True, **model,
    )  # fmt: skip


def _key_map(config: Config, module: str) -> dict[str, str]:
    """canonical name -> torch name, for every weight of ``module`` (our component)."""
    if module not in MODULES:
        raise ValueError(f"unknown module {module!r}; expected one of {list(MODULES)}")
    pairs: dict[str, str] = {}

    def linear(ours: str, theirs: str) -> None:
        pairs[f"{ours}.weight"] = f"{theirs}.weight"
        if config.bias:
            pairs[f"{ours}.bias"] = f"{theirs}.bias"

    def attention(ours: str, theirs: str) -> None:
        for name in ("w_q", "w_k", "w_v"):  # rows of the packed projection; split in convert
            pairs[f"{ours}{name}.weight"] = f"{theirs}in_proj_weight"
            if config.bias:
                pairs[f"{ours}{name}.bias"] = f"{theirs}in_proj_bias"
        linear(f"{ours}w_o", f"{theirs}out_proj")

    def layer(ours: str, theirs: str, table: dict[str, str]) -> None:
        for our_name, their_name in table.items():
            if "attn" in our_name and "norm" not in our_name:
                attention(f"{ours}{our_name}.", f"{theirs}{their_name}.")
            else:
                linear(f"{ours}{our_name}", f"{theirs}{their_name}")

    def stack(ours: str, theirs: str, count: int, table: dict[str, str]) -> None:
        for i in range(count):
            layer(f"{ours}layers.{i}.", f"{theirs}layers.{i}.", table)
        if config.encoder_final_norm if table is _ENCODER_LAYER else config.decoder_final_norm:
            linear(f"{ours}norm", f"{theirs}norm")

    if module == "attention":
        attention("", "")
    elif module == "encoder_layer":
        layer("", "", _ENCODER_LAYER)
    elif module == "decoder_layer":
        layer("", "", _DECODER_LAYER)
    elif module == "encoder":
        stack("", "", config.num_encoder_layers, _ENCODER_LAYER)
    elif module == "decoder":
        stack("", "", config.num_decoder_layers, _DECODER_LAYER)
    else:
        stack("encoder.", "encoder.", config.num_encoder_layers, _ENCODER_LAYER)
        stack("decoder.", "decoder.", config.num_decoder_layers, _DECODER_LAYER)
    return pairs


def from_torch_transformer(
    state_dict: Mapping[str, np.ndarray], config: Config, module: str = "transformer"
) -> dict[str, np.ndarray]:
    """A state_dict of ``nn.Transformer`` (module="transformer": our model's ``encoder.*`` and
    ``decoder.*`` weights; embeddings and generator are not in it), ``nn.TransformerEncoder``
    ("encoder"), ``nn.TransformerDecoder`` ("decoder"), one of their layers
    ("encoder_layer", "decoder_layer") or ``nn.MultiheadAttention`` ("attention")
    -> canonical weights of the matching component.

    Every key and shape of the state_dict is checked against the module this config builds
    before anything is converted (``WeightsError`` naming each missing, unexpected or
    mis-shaped key): an extra layer, or a packed ``in_proj_weight`` with rows to spare, is
    refused rather than dropped."""
    pairs = _key_map(config, module)
    arrays = check_state_dict(state_dict, torch_schema(config, module), {}, what=f"a torch {module} of this config")
    d = config.d_model
    params: dict[str, np.ndarray] = {}
    for ours, theirs in pairs.items():
        value = arrays[theirs]
        if theirs.endswith(("in_proj_weight", "in_proj_bias")):
            row = ("w_q", "w_k", "w_v").index(ours.split(".")[-2])
            value = value[row * d : (row + 1) * d]  # q, k, v stacked along the output axis
        if ours.endswith(".weight") and value.ndim == 2:
            value = value.T  # torch [out, in] -> ours [in, out]
        params[ours] = np.ascontiguousarray(value)
    check_params({k: v.shape for k, v in params.items()}, _schema(config, module), what=f"the {module} schema")
    return params


def to_torch_transformer(
    params: Mapping[str, np.ndarray], config: Config, module: str = "transformer"
) -> dict[str, np.ndarray]:
    """The inverse: canonical weights -> a state_dict for ``module.load_state_dict``. For
    module="transformer", the model's other weights (embeddings, generator) may be given too
    and are left out; every other key, and every shape, must fit (``WeightsError``)."""
    _check_torch_config(config)
    pairs = _key_map(config, module)
    schema = _schema(config, module)
    others = param_schema(config) if module == "transformer" else {}
    optional = {name: shape for name, shape in others.items() if name not in schema}
    arrays = check_state_dict(params, schema, optional, what=f"the {module} schema")
    state: dict[str, np.ndarray] = {}
    packed: dict[str, list[np.ndarray]] = {}
    for ours, theirs in pairs.items():
        value = arrays[ours]
        if ours.endswith(".weight") and value.ndim == 2:
            value = value.T
        if theirs.endswith(("in_proj_weight", "in_proj_bias")):
            packed.setdefault(theirs, []).append(value)  # w_q, w_k, w_v arrive in that order
        else:
            state[theirs] = np.ascontiguousarray(value)
    for theirs, parts in packed.items():
        state[theirs] = np.ascontiguousarray(np.concatenate(parts, axis=0))
    return state


def torch_schema(config: Config, module: str = "transformer") -> Schema:
    """The state_dict of the torch ``module`` this config builds: torch's name -> shape
    (``in_proj_weight`` [3 d_model, d_model], every Linear [out, in])."""
    _check_torch_config(config)
    pairs = _key_map(config, module)
    schema = _schema(config, module)
    shapes: Schema = {}
    for ours, theirs in pairs.items():
        shape = schema[ours][::-1] if ours.endswith(".weight") and len(schema[ours]) == 2 else schema[ours]
        if theirs.endswith(("in_proj_weight", "in_proj_bias")):
            shape = (3 * shape[0], *shape[1:])  # q, k and v stacked along the output axis
        shapes[theirs] = shape
    return shapes


def _check_torch_config(config: Config) -> None:
    """nn.Transformer's layers have the paper's parts only (its activation and norm placement
    leave no trace in the weights): refuse a config whose weights it cannot hold."""
    want = {"norm": "layer_norm", "gated_ffn": False, "num_kv_heads": config.num_heads,
            "attention_bias": config.bias, "ffn_bias": config.bias}  # fmt: skip
    for name, value in want.items():
        if getattr(config, name) != value:
            raise ValueError(f"torch's nn.Transformer has {name}={value!r}, the config {getattr(config, name)!r}")


def _schema(config: Config, module: str) -> dict[str, tuple[int, ...]]:
    if module == "transformer":  # our model's stacks; nn.Transformer has no embeddings or generator
        return param_schema(config, "encoder", "encoder") | param_schema(config, "decoder", "decoder")
    return param_schema(config, module)
