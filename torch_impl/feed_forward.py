"""Position-wise feed-forward network: two linear maps with a non-linearity between."""

from __future__ import annotations

import math

import torch
from torch import Tensor as Array
from torch import sigmoid
from torch.nn import Module
from torch.special import erf

from transformer_spec import Config
from transformer_spec.checks import check_features
from transformer_spec.trace import record

from .checks import check_float_inputs
from .kernels import fusable
from .layers import Dropout, Linear


def relu(x: Array) -> Array:
    # where, not maximum(x, 0.0): JAX splits the gradient of a tie evenly (0.5 at exactly 0);
    # torch and jax.nn.relu define it as 0 there, as this where does
    return torch.where(x > 0, x, 0.0)  # (...,)


@fusable("gelu")  # speed: a fused kernel may run instead (kernels.py)
def gelu(x: Array) -> Array:
    """Exact GELU, x * Phi(x) (torch ``nn.GELU()``, BERT's "gelu"). Not ``jax.nn.gelu(x)``:
    its default is ``approximate=True``, the tanh formula below."""
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))  # (...,)


def gelu_tanh(x: Array) -> Array:
    """The tanh approximation (GPT-2; ``jax.nn.gelu``'s default): up to ~5e-4 off the exact
    one."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))  # (...,)


def silu(x: Array) -> Array:
    """SiLU (swish), x * sigmoid(x): the gate of Llama's SwiGLU (torch ``F.silu``,
    ``jax.nn.silu``)."""
    return x * sigmoid(x)  # (...,): sigmoid(x) = 1 / (1 + exp(-x)), without overflow for large -x


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu}


class PositionwiseFeedForward(Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, the same two matrices at every position."""

    schema = "feed_forward"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.config = config
        self.w_1 = Linear(config.d_model, config.d_ff, config.ffn_bias, dtype)
        self.w_2 = Linear(config.d_ff, config.d_model, config.ffn_bias, dtype)
        self.activation = ACTIVATIONS[config.activation]  # a plain function (NNX: static)
        self.dropout = Dropout(config.dropout)  # on the hidden layer

    def check_inputs(self, x: Array) -> None:
        """x (..., d_model) in the weights' dtype; checked here, before a fused kernel may take
        the call."""
        check_features("x", x.shape, self.config.d_model)
        check_float_inputs(("x",), (x,), self)

    @fusable("feed_forward")  # speed: a fused kernel may run instead (kernels.py)
    def forward(self, x: Array) -> Array:
        self.check_inputs(x)  # shapes and dtypes: refused with a message
        pre_activation = self.w_1(x)  # (B, T, d_model) -> (B, T, d_ff)
        hidden = self.activation(pre_activation)  # (B, T, d_ff)
        record(self, hidden=hidden)
        output = self.w_2(self.dropout(hidden))  # (B, T, d_ff) -> (B, T, d_model)
        record(self, output=output)
        return output


class GatedFeedForward(Module):
    """FFN(x) = (act(x W_gate) * (x W_up)) W_down (Shazeer, 2020, "GLU Variants Improve
    Transformer").

    Two projections up to d_ff instead of one: the activated "gate" multiplies the plain "up"
    projection feature by feature, then W_down returns to d_model. SwiGLU (Llama, SmolLM2)
    with ``activation="silu"``, GeGLU with "gelu". Llama's d_ff is about 8/3 d_model, so the
    three matrices cost what the paper's two of 4 d_model would.
    """

    schema = "gated_feed_forward"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.config = config
        self.w_gate = Linear(config.d_model, config.d_ff, config.ffn_bias, dtype)
        self.w_up = Linear(config.d_model, config.d_ff, config.ffn_bias, dtype)
        self.w_down = Linear(config.d_ff, config.d_model, config.ffn_bias, dtype)
        self.activation = ACTIVATIONS[config.activation]  # a plain function (NNX: static)
        self.dropout = Dropout(config.dropout)  # on the hidden layer

    def check_inputs(self, x: Array) -> None:
        """x (..., d_model) in the weights' dtype; checked here, before a fused kernel may take
        the call."""
        check_features("x", x.shape, self.config.d_model)
        check_float_inputs(("x",), (x,), self)

    @fusable("gated_feed_forward")  # speed: a fused kernel may run instead (kernels.py)
    def forward(self, x: Array) -> Array:
        self.check_inputs(x)  # shapes and dtypes: refused with a message
        gate = self.w_gate(x)  # (B, T, d_model) -> (B, T, d_ff)
        up = self.w_up(x)  # (B, T, d_model) -> (B, T, d_ff)
        hidden = self.activation(gate) * up  # (B, T, d_ff)
        record(self, hidden=hidden)
        output = self.w_down(self.dropout(hidden))  # (B, T, d_ff) -> (B, T, d_model)
        record(self, output=output)
        return output


def make_feed_forward(
    config: Config, dtype: str = "float32"
) -> PositionwiseFeedForward | GatedFeedForward:
    """The feed-forward network ``config.gated_ffn`` names: gated (SwiGLU, GeGLU) or the paper's."""
    if config.gated_ffn:
        return GatedFeedForward(config, dtype)
    return PositionwiseFeedForward(config, dtype)
