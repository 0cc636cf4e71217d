"""Position-wise feed-forward network: two linear maps with a non-linearity between."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.scipy.special import erf

from transformer_spec import Config
from transformer_spec.trace import record

from .kernels import fusable
from .layers import Dropout, Linear


def relu(x: jax.Array) -> jax.Array:
    # Not ``jnp.maximum(x, 0.0)``: JAX splits the gradient of a tie evenly, 0.5 at
    # exactly 0, where ``jax.nn.relu`` and torch define it as 0 (as this ``where`` does).
    return jnp.where(x > 0, x, 0.0)  # (...)


@fusable("gelu")  # speed: a fused kernel may run instead (kernels.py)
def gelu(x: jax.Array) -> jax.Array:
    """Exact GELU, x * Phi(x) (torch ``nn.GELU()``, BERT's "gelu").

    Not ``jax.nn.gelu(x)``: its default is ``approximate=True``, the tanh formula below.
    """
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))  # (...)


def gelu_tanh(x: jax.Array) -> jax.Array:
    """The tanh approximation (GPT-2; ``jax.nn.gelu``'s default): up to ~5e-4 off the exact one."""
    return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))  # (...)


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}


class PositionwiseFeedForward(nnx.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, the same two matrices at every position."""

    schema = "feed_forward"

    def __init__(self, config: Config, dtype: str = "float32"):
        self.config = config
        self.w_1 = Linear(config.d_model, config.d_ff, config.bias, dtype)
        self.w_2 = Linear(config.d_ff, config.d_model, config.bias, dtype)
        self.activation = ACTIVATIONS[config.activation]  # a plain function: a static attribute to NNX
        self.dropout = Dropout(config.dropout)  # on the hidden layer

    @fusable("feed_forward")  # speed: a fused kernel may run instead (kernels.py)
    def __call__(self, x: jax.Array) -> jax.Array:
        pre_activation = self.w_1(x)  # (B, T, d_model) -> (B, T, d_ff)
        hidden = self.activation(pre_activation)  # (B, T, d_ff)
        record(self, "hidden", hidden)
        output = self.w_2(self.dropout(hidden))  # (B, T, d_ff) -> (B, T, d_model)
        record(self, "output", output)
        return output
