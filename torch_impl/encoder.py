"""Encoder layer and stack (paper, section 3.1, left half of figure 1)."""

from __future__ import annotations

from torch import Tensor as Array
from torch import nn
from torch.nn import Module

from transformer_spec import Config
from transformer_spec.checks import check_hidden
from transformer_spec.trace import record

from .attention import MultiHeadAttention
from .checks import check_float_inputs
from .feed_forward import make_feed_forward
from .layer_norm import make_norm
from .layers import Dropout
from .sublayer import sublayer_connection


class EncoderLayer(Module):
    """Self-attention, then feed-forward, each wrapped in a residual connection."""

    schema = "encoder_layer"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.config = config
        self.self_attn = MultiHeadAttention(config, dtype)
        self.self_attn_norm = make_norm(config, dtype)
        self.ffn = make_feed_forward(config, dtype)
        self.ffn_norm = make_norm(config, dtype)
        self.self_attn_dropout = Dropout(config.dropout)  # on each sub-layer's output
        self.ffn_dropout = Dropout(config.dropout)

    def forward(
        self, x: Array, mask: Array | None = None, need_weights: bool = False
    ) -> tuple[Array, Array | None]:
        """x (B, T, d_model), mask (B|1, 1, T|1, T) -> (B, T, d_model), weights (B, H, T, T)."""
        check_hidden("x", x.shape, self.config.d_model)
        check_float_inputs(("x",), (x,), self)
        norm_first = self.config.norm_first
        x, weights = sublayer_connection(
            x,
            lambda h: self.self_attn(h, h, h, mask, need_weights),
            self.self_attn_norm,
            norm_first,
            self.self_attn_dropout,
        )  # (B, T, d_model), (B, H, T, T) or None
        record(self, after_self_attn=x)
        x, _ = sublayer_connection(
            x, lambda h: (self.ffn(h), None), self.ffn_norm, norm_first, self.ffn_dropout
        )  # (B, T, d_model)
        record(self, output=x)
        return x, weights


class Encoder(Module):
    """N identical layers (each with its own weights), then an optional final LayerNorm."""

    schema = "encoder"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.config = config
        layers = [EncoderLayer(config, dtype) for _ in range(config.num_encoder_layers)]
        self.layers = nn.ModuleList(layers)
        self.norm = make_norm(config, dtype) if config.encoder_final_norm else None

    def forward(
        self,
        x: Array,
        mask: Array | None = None,
        need_weights: bool = False,
        need_hidden_states: bool = False,
    ) -> tuple[Array, tuple[Array, ...], tuple[Array, ...]]:
        """-> (output (B, T, d_model), hidden states (input + each layer's output),
        weights per layer)."""
        hidden_states, attentions = [x], []
        for layer in self.layers:
            x, weights = layer(x, mask, need_weights)  # (B, T, d_model), (B, H, T, T) or None
            if need_hidden_states:  # else each output is freed once the next layer has used it
                hidden_states.append(x)
            attentions.append(weights)
        if self.norm is not None:
            x = self.norm(x)  # (B, T, d_model)
        hidden_states = tuple(hidden_states) if need_hidden_states else ()
        return x, hidden_states, (tuple(attentions) if need_weights else ())
