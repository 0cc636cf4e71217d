"""The encoder stack assembled from Flax's own NNX layers: the JAX side's "framework module".

Flax has no ready-made Transformer encoder, so this is the encoder a Flax user would
write from ``nnx.MultiHeadAttention``, ``nnx.Linear`` and ``nnx.LayerNorm`` -- the same
post-norm (or pre-norm) layer as ours, loaded with the same canonical weights:

* ``nnx.MultiHeadAttention`` keeps its q/k/v kernels as [in, heads, d_k] and its output
  kernel as [heads, d_k, out]: our [in, out] matrices, reshaped (no transpose).
* ``nnx.LayerNorm`` calls its weight ``scale``; ``use_fast_variance=False`` and the
  config's epsilon make it compute what ours does (the fast variance, Flax's default, loses
  precision on inputs with a large mean; Flax's default epsilon is 1e-6, not the config's).
* ``decode=False``: without it the attention expects a decoding cache.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from transformer_spec import Config

HIGHEST = jax.lax.Precision.HIGHEST  # ours pins it too (it matters on GPU/TPU, not on CPU)


class FlaxEncoderLayer(nnx.Module):
    def __init__(self, config: Config, rngs: nnx.Rngs):
        d, f32 = config.d_model, jnp.float32
        self.norm_first = config.norm_first
        self.activation = config.activation
        self.self_attn = nnx.MultiHeadAttention(
            num_heads=config.num_heads, in_features=d, qkv_features=d, out_features=d, decode=False,
            dtype=f32, param_dtype=f32, precision=HIGHEST, use_bias=config.bias, rngs=rngs,
        )  # fmt: skip
        self.linear1 = nnx.Linear(d, config.d_ff, use_bias=config.bias, precision=HIGHEST, rngs=rngs)
        self.linear2 = nnx.Linear(config.d_ff, d, use_bias=config.bias, precision=HIGHEST, rngs=rngs)
        norm = dict(epsilon=config.layer_norm_eps, use_fast_variance=False, use_bias=config.bias, rngs=rngs)
        self.norm1 = nnx.LayerNorm(d, **norm)
        self.norm2 = nnx.LayerNorm(d, **norm)

    def feed_forward(self, x: jax.Array) -> jax.Array:
        h = self.linear1(x)  # (B, T, d_ff)
        h = nnx.relu(h) if self.activation == "relu" else nnx.gelu(h, approximate=self.activation == "gelu_tanh")
        return self.linear2(h)  # (B, T, d_model)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        if self.norm_first:
            h = self.norm1(x)
            x = x + self.self_attn(h, h, h, mask=mask)
            return x + self.feed_forward(self.norm2(x))
        x = self.norm1(x + self.self_attn(x, x, x, mask=mask))  # (B, T, d_model)
        return self.norm2(x + self.feed_forward(x))


class FlaxEncoder(nnx.Module):
    """N ``FlaxEncoderLayer`` s, then a final LayerNorm when the config has one."""

    def __init__(self, config: Config):
        rngs = nnx.Rngs(0)  # every weight is overwritten by load_canonical
        self.layers = nnx.List([FlaxEncoderLayer(config, rngs) for _ in range(config.num_encoder_layers)])
        self.norm = (
            nnx.LayerNorm(config.d_model, epsilon=config.layer_norm_eps, use_fast_variance=False, rngs=rngs)
            if config.encoder_final_norm
            else None
        )

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x, mask)  # (B, T, d_model)
        return self.norm(x) if self.norm is not None else x


def _set_norm(norm: nnx.LayerNorm, params: dict, prefix: str) -> None:
    norm.scale[...] = jnp.asarray(params[f"{prefix}.weight"])
    if norm.bias is not None:
        norm.bias[...] = jnp.asarray(params[f"{prefix}.bias"])


def _set_linear(linear: nnx.Linear, params: dict, prefix: str, kernel_shape: tuple[int, ...], bias_shape) -> None:
    linear.kernel[...] = jnp.asarray(params[f"{prefix}.weight"].reshape(kernel_shape))
    if linear.bias is not None:
        linear.bias[...] = jnp.asarray(params[f"{prefix}.bias"].reshape(bias_shape))


def flax_encoder_from_params(config: Config, params: dict) -> FlaxEncoder:
    """A ``FlaxEncoder`` holding the canonical encoder ``params`` (``init_params(..., component="encoder")``)."""
    encoder = FlaxEncoder(config)
    d, h, d_k = config.d_model, config.num_heads, config.d_k
    for i, layer in enumerate(encoder.layers):
        p = f"layers.{i}"
        attention = layer.self_attn
        for ours, theirs in (("w_q", attention.query), ("w_k", attention.key), ("w_v", attention.value)):
            _set_linear(theirs, params, f"{p}.self_attn.{ours}", (d, h, d_k), (h, d_k))  # [in, H, d_k]
        _set_linear(attention.out, params, f"{p}.self_attn.w_o", (h, d_k, d), (d,))  # [H, d_k, out]
        _set_linear(layer.linear1, params, f"{p}.ffn.w_1", (d, config.d_ff), (config.d_ff,))
        _set_linear(layer.linear2, params, f"{p}.ffn.w_2", (config.d_ff, d), (d,))
        _set_norm(layer.norm1, params, f"{p}.self_attn_norm")
        _set_norm(layer.norm2, params, f"{p}.ffn_norm")
    if encoder.norm is not None:
        _set_norm(encoder.norm, params, "norm")
    return encoder
