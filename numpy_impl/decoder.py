"""Decoder layer and stack (paper, section 3.1, right half of figure 1)."""

from __future__ import annotations

from typing import NamedTuple

from numpy import ndarray as Array

from transformer_spec import Config
from transformer_spec.checks import check_hidden, check_same_batch
from transformer_spec.trace import record

from .attention import KeyValueCache, MultiHeadAttention
from .checks import check_float_inputs
from .feed_forward import make_feed_forward
from .layer_norm import make_norm
from .layers import Dropout
from .module import Module, with_prefix
from .positional import Position
from .sublayer import sublayer_connection, sublayer_connection_backward


class LayerCache(NamedTuple):
    """What one decoder layer keeps between decoding steps."""

    # keys/values of every target token fed so far: (B, H, T_cache, d_k)
    self_attn: KeyValueCache
    # of the memory, computed once: (B, H, T_src, d_k); None when decoder-only
    cross_attn: KeyValueCache | None


class DecoderLayer(Module):
    """Masked self-attention, cross-attention over the encoder's memory, feed-forward.

    A decoder-only model (``kind="decoder_only"``) has no memory and no cross-attention.
    """

    schema = "decoder_layer"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.config = config
        self.self_attn = MultiHeadAttention(config, dtype)
        self.self_attn_norm = make_norm(config, dtype)
        self.self_attn_dropout = Dropout(config.dropout)  # on each sub-layer's output
        if config.decoder_has_cross_attention:
            # rotary=False: positions count only within a sequence
            self.cross_attn = MultiHeadAttention(config, dtype, rotary=False)
            self.cross_attn_norm = make_norm(config, dtype)
            self.cross_attn_dropout = Dropout(config.dropout)
        self.ffn = make_feed_forward(config, dtype)
        self.ffn_norm = make_norm(config, dtype)
        self.ffn_dropout = Dropout(config.dropout)

    def __call__(
        self,
        x: Array,
        memory: Array | None = None,
        tgt_mask: Array | None = None,
        memory_mask: Array | None = None,
        need_weights: bool = False,
        cache: LayerCache | None = None,
        position: Position = 0,
    ) -> tuple[Array, Array | None, Array | None]:
        """x (B, T_tgt, d_model), memory (B, T_src, d_model), tgt_mask (B|1, 1, T_tgt, T_tgt),
        memory_mask (B|1, 1, T_tgt|1, T_src) -> (B, T_tgt, d_model), self weights, cross
        weights.

        Decoding passes this layer's ``cache`` (``empty_cache``) and the ``position`` of x's first
        token: x's keys and values join the cache, tgt_mask spans every cached position
        (B|1, 1, T_tgt, T_cache), and memory is None (the cache holds its keys and values)."""
        check_hidden("x", x.shape, self.config.d_model)
        check_float_inputs(("x",), (x,), self)
        norm_first = self.config.norm_first
        self_cache, cross_cache = (None, None) if cache is None else cache
        x, self_weights = sublayer_connection(
            x,
            lambda h: self.self_attn(h, h, h, tgt_mask, need_weights, self_cache, position),
            self.self_attn_norm,
            norm_first,
            self.self_attn_dropout,
        )  # (B, T_tgt, d_model), (B, H, T_tgt, T_tgt) or None
        record(self, after_self_attn=x)
        cross_weights = None
        if self.config.decoder_has_cross_attention:
            if cross_cache is None:
                _check_memory(memory, x, self.config.d_model)
            # queries from the decoder, keys and values from the encoder: (B, T_tgt, T_src) scores
            x, cross_weights = sublayer_connection(
                x,
                lambda h: self.cross_attn(
                    h, memory, memory, memory_mask, need_weights, cross_cache
                ),
                self.cross_attn_norm,
                norm_first,
                self.cross_attn_dropout,
            )  # (B, T_tgt, d_model), (B, H, T_tgt, T_src) or None
            record(self, after_cross_attn=x)
        x, _ = sublayer_connection(
            x, lambda h: (self.ffn(h), None), self.ffn_norm, norm_first, self.ffn_dropout
        )  # (B, T_tgt, d_model)
        record(self, output=x)
        return x, self_weights, cross_weights

    def backward(
        self, grad_output: Array
    ) -> tuple[tuple[Array, Array | None], dict[str, Array]]:
        """grad_output (B, T_tgt, d_model) -> (grad_x (B, T_tgt, d_model), grad_memory
        (B, T_src, d_model) or None without cross-attention), grads; the sub-layers in reverse
        order."""
        norm_first = self.config.norm_first
        grad_x, ffn_norm_grads, ffn_grads = sublayer_connection_backward(
            grad_output, self.ffn.backward, self.ffn_norm, norm_first, self.ffn_dropout
        )  # (B, T_tgt, d_model)
        grads = with_prefix("ffn", ffn_grads) | with_prefix("ffn_norm", ffn_norm_grads)
        grad_memory = None
        if self.config.decoder_has_cross_attention:
            grad_x, cross_attn_norm_grads, (cross_attn_grads, grad_memory) = (
                sublayer_connection_backward(
                    grad_x,
                    self._cross_attention_backward,
                    self.cross_attn_norm,
                    norm_first,
                    self.cross_attn_dropout,
                )
            )  # (B, T_tgt, d_model)
            grads |= with_prefix("cross_attn", cross_attn_grads)
            grads |= with_prefix("cross_attn_norm", cross_attn_norm_grads)
        grad_x, self_attn_norm_grads, self_attn_grads = sublayer_connection_backward(
            grad_x,
            self.self_attn.self_attention_backward,
            self.self_attn_norm,
            norm_first,
            self.self_attn_dropout,
        )  # (B, T_tgt, d_model)
        grads |= with_prefix("self_attn", self_attn_grads)
        grads |= with_prefix("self_attn_norm", self_attn_norm_grads)
        return (grad_x, grad_memory), grads

    def empty_cache(self, batch: int, memory: Array | None = None) -> LayerCache:
        """Before the first step: no target token yet; the memory's (B, T_src, d_model) keys and
        values projected once here, not again at every step."""
        cross_cache = None
        if self.config.decoder_has_cross_attention:
            if memory is None:
                raise ValueError(
                    "this decoder has cross-attention and needs memory (the encoder output), "
                    "got None"
                )
            # (B, H_kv, T_src, d_k) each
            cross_cache = KeyValueCache(*self.cross_attn.key_value(memory, memory))
        # (B, H_kv, 0, d_k) each (JAX: (B, H_kv, max_len, d_k), a fixed-size buffer)
        self_cache = self.self_attn.empty_cache(batch)
        return LayerCache(self_cache, cross_cache)

    def _cross_attention_backward(self, grad_output: Array) -> tuple[Array, tuple]:
        """-> grad_h (B, T_tgt, d_model), (grads, grad_memory (B, T_src, d_model))."""
        # the memory was both the key and the value: its gradient is the sum of theirs
        # (B, T_tgt, d_model), (B, T_src, d_model)
        (grad_query, grad_memory), grads = self.cross_attn.cross_attention_backward(grad_output)
        return grad_query, (grads, grad_memory)


def _check_memory(memory: Array | None, x: Array, d_model: int) -> None:
    if memory is None:
        raise ValueError(
            "this decoder has cross-attention and needs memory (the encoder output), got None"
        )
    check_hidden("memory", memory.shape, d_model)
    check_float_inputs(("x", "memory"), (x, memory))
    check_same_batch(("memory", "x"), (memory.shape, x.shape))


class Decoder(Module):
    """N decoder layers, then an optional final LayerNorm."""

    schema = "decoder"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.config = config
        layers = [DecoderLayer(config, dtype) for _ in range(config.num_decoder_layers)]
        self.layers = layers
        self.norm = make_norm(config, dtype) if config.decoder_final_norm else None

    def __call__(
        self,
        x: Array,
        memory: Array | None = None,
        tgt_mask: Array | None = None,
        memory_mask: Array | None = None,
        need_weights: bool = False,
        need_hidden_states: bool = False,
        cache: tuple[LayerCache, ...] | None = None,
        position: Position = 0,
    ) -> tuple[Array, tuple, tuple, tuple]:
        """-> (output, hidden states, self-attention weights per layer, cross-attention weights per
        layer). Decoding passes one ``LayerCache`` per layer (``empty_cache``), filled in place."""
        hidden_states, self_attentions, cross_attentions = [x], [], []
        caches = (None,) * len(self.layers) if cache is None else cache
        for layer, layer_cache in zip(self.layers, caches, strict=True):
            x, self_weights, cross_weights = layer(
                x, memory, tgt_mask, memory_mask, need_weights, layer_cache, position
            )  # (B, T_tgt, d_model), weights or None
            if need_hidden_states:  # else each output is freed once the next layer has used it
                hidden_states.append(x)
            self_attentions.append(self_weights)
            cross_attentions.append(cross_weights)
        if self.norm is not None:
            x = self.norm(x)  # (B, T_tgt, d_model)
        if not need_weights:
            self_attentions, cross_attentions = [], []
        elif not self.config.decoder_has_cross_attention:
            cross_attentions = []
        hidden_states = tuple(hidden_states) if need_hidden_states else ()
        return x, hidden_states, tuple(self_attentions), tuple(cross_attentions)

    def backward(
        self, grad_output: Array
    ) -> tuple[tuple[Array, Array | None], dict[str, Array]]:
        """grad_output (B, T_tgt, d_model) -> (grad_x (B, T_tgt, d_model), grad_memory
        (B, T_src, d_model) or None), grads of every layer and the final norm."""
        grads = {}
        if self.norm is not None:
            grad_output, norm_grads = self.norm.backward(grad_output)  # (B, T_tgt, d_model)
            grads |= with_prefix("norm", norm_grads)
        grad_memory = None
        for i in reversed(range(len(self.layers))):  # last layer first
            # (B, T_tgt, d_model), (B, T_src, d_model)
            (grad_output, layer_grad_memory), layer_grads = self.layers[i].backward(grad_output)
            grads |= with_prefix(f"layers.{i}", layer_grads)
            # every layer read the same memory: the gradients add up
            if layer_grad_memory is not None:
                # (B, T_src, d_model), or 0 at the last layer
                earlier = 0.0 if grad_memory is None else grad_memory
                grad_memory = layer_grad_memory + earlier  # (B, T_src, d_model)
        return (grad_output, grad_memory), grads

    def empty_cache(self, batch: int, memory: Array | None = None) -> tuple[LayerCache, ...]:
        """One ``LayerCache`` per layer, before the first decoding step (see
        ``DecoderLayer.empty_cache``)."""
        return tuple(layer.empty_cache(batch, memory) for layer in self.layers)
