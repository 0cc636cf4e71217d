"""Encoder layer and stack (paper, section 3.1, left half of figure 1)."""

from __future__ import annotations

import numpy as np

from transformer_spec import Config
from transformer_spec.checks import check_hidden
from transformer_spec.trace import record

from .attention import MultiHeadAttention
from .feed_forward import PositionwiseFeedForward
from .layer_norm import LayerNorm
from .layers import Dropout, Module, with_prefix
from .sublayer import sublayer_connection_backward, sublayer_connection_for_backward, without_extra


class EncoderLayer(Module):
    """Self-attention, then feed-forward, each wrapped in a residual connection."""

    schema = "encoder_layer"

    def __init__(self, config: Config, dtype: str = "float32"):
        self.config = config
        self.self_attn = MultiHeadAttention(config, dtype)
        self.self_attn_norm = LayerNorm(config, dtype)
        self.ffn = PositionwiseFeedForward(config, dtype)
        self.ffn_norm = LayerNorm(config, dtype)
        self.self_attn_dropout = Dropout(config.dropout)  # on each sub-layer's output
        self.ffn_dropout = Dropout(config.dropout)

    def __call__(
        self, x: np.ndarray, mask: np.ndarray | None = None, need_weights: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """x (B, T, d_model), mask (B|1, 1, T|1, T) -> (B, T, d_model), weights (B, H, T, T)."""
        return self.forward_for_backward(x, mask, need_weights)[0]

    def forward_for_backward(
        self, x: np.ndarray, mask: np.ndarray | None = None, need_weights: bool = False
    ) -> tuple[tuple[np.ndarray, np.ndarray | None], tuple]:
        check_hidden("x", x.shape, self.config.d_model)
        norm_first = self.config.norm_first
        (x, weights), self_attn_saved = sublayer_connection_for_backward(
            x,
            lambda h: self.self_attn.forward_for_backward(h, h, h, mask, need_weights),
            self.self_attn_norm,
            norm_first,
            self.self_attn_dropout,
        )  # (B, T, d_model)
        record(self, "after_self_attn", x)
        (x, _), ffn_saved = sublayer_connection_for_backward(
            x, without_extra(self.ffn.forward_for_backward), self.ffn_norm, norm_first, self.ffn_dropout
        )  # (B, T, d_model)
        record(self, "output", x)
        return (x, weights), (self_attn_saved, ffn_saved)

    def backward(self, saved: tuple, grad_output: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """grad_output (B, T, d_model) -> grad_x (B, T, d_model), grads; the sub-layers in reverse order."""
        self_attn_saved, ffn_saved = saved
        norm_first = self.config.norm_first
        grad_x, ffn_norm_grads, ffn_grads = sublayer_connection_backward(
            ffn_saved, grad_output, self.ffn.backward, self.ffn_norm, norm_first, self.ffn_dropout
        )  # (B, T, d_model)
        grad_x, self_attn_norm_grads, self_attn_grads = sublayer_connection_backward(
            self_attn_saved,
            grad_x,
            self.self_attn.self_attention_backward,
            self.self_attn_norm,
            norm_first,
            self.self_attn_dropout,
        )  # (B, T, d_model)
        grads = (
            with_prefix("self_attn", self_attn_grads)
            | with_prefix("self_attn_norm", self_attn_norm_grads)
            | with_prefix("ffn", ffn_grads)
            | with_prefix("ffn_norm", ffn_norm_grads)
        )
        return grad_x, grads


class Encoder(Module):
    """N identical layers (each with its own weights), then an optional final LayerNorm."""

    schema = "encoder"

    def __init__(self, config: Config, dtype: str = "float32"):
        self.config = config
        self.layers = [EncoderLayer(config, dtype) for _ in range(config.num_encoder_layers)]
        self.norm = LayerNorm(config, dtype) if config.use_encoder_final_norm else None

    def __call__(
        self,
        x: np.ndarray,
        mask: np.ndarray | None = None,
        need_weights: bool = False,
        need_hidden_states: bool = False,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        """-> (output (B, T, d_model), hidden states (input + each layer's output), weights per layer)."""
        return self.forward_for_backward(x, mask, need_weights, need_hidden_states, save=False)[0]

    def forward_for_backward(
        self,
        x: np.ndarray,
        mask: np.ndarray | None = None,
        need_weights: bool = False,
        need_hidden_states: bool = False,
        save: bool = True,
    ) -> tuple[tuple[np.ndarray, tuple[np.ndarray, ...], tuple[np.ndarray, ...]], tuple]:
        """``save=False`` (inference) lets each layer's saved activations go as soon as the
        layer returns, instead of keeping every layer's until the backward pass."""
        hidden_states, attentions, layers_saved = [x], [], []
        for layer in self.layers:
            (x, weights), layer_saved = layer.forward_for_backward(x, mask, need_weights)  # (B, T, d_model)
            if need_hidden_states:  # else each layer's output is freed once the next layer has used it
                hidden_states.append(x)
            attentions.append(weights)
            if save:
                layers_saved.append(layer_saved)
            del layer_saved  # not kept (save=False): freed now, not while the next layer runs
        norm_saved = None
        if self.norm is not None:
            x, norm_saved = self.norm.forward_for_backward(x)  # (B, T, d_model)
        result = x, (tuple(hidden_states) if need_hidden_states else ()), (tuple(attentions) if need_weights else ())
        return result, (layers_saved, norm_saved)

    def backward(self, saved: tuple, grad_output: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """grad_output (B, T, d_model) -> grad_x (B, T, d_model), grads of every layer and the final norm."""
        layers_saved, norm_saved = saved
        grads = {}
        if self.norm is not None:
            grad_output, norm_grads = self.norm.backward(norm_saved, grad_output)  # (B, T, d_model)
            grads |= with_prefix("norm", norm_grads)
        for i in reversed(range(len(self.layers))):  # last layer first
            grad_output, layer_grads = self.layers[i].backward(layers_saved[i], grad_output)  # (B, T, d_model)
            grads |= with_prefix(f"layers.{i}", layer_grads)
        return grad_output, grads
