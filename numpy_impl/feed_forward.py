"""Position-wise feed-forward network: two linear maps with a non-linearity between."""

from __future__ import annotations

import math

import numpy as np
from numpy import ndarray as Array
from scipy.special import erf
from scipy.special import expit as sigmoid

from transformer_spec import Config
from transformer_spec.checks import check_features
from transformer_spec.trace import record

from .checks import check_float_inputs
from .kernels import fusable
from .layers import Dropout, Linear
from .module import Module, with_prefix


def relu(x: Array) -> Array:
    # where, not maximum(x, 0.0): JAX splits the gradient of a tie evenly (0.5 at exactly 0);
    # torch and jax.nn.relu define it as 0 there, as this where does
    return np.where(x > 0, x, 0.0)  # (...,)


def relu_backward(x: Array, grad_output: Array) -> Array:
    """d relu / dx = 1 where x > 0, else 0 (also at exactly 0, as torch)."""
    return np.where(x > 0, grad_output, 0.0)  # (...,)


@fusable("gelu")  # speed: a fused kernel may run instead (kernels.py)
def gelu(x: Array) -> Array:
    """Exact GELU, x * Phi(x) (torch ``nn.GELU()``, BERT's "gelu"). Not ``jax.nn.gelu(x)``:
    its default is ``approximate=True``, the tanh formula below."""
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))  # (...,)


def gelu_backward(x: Array, grad_output: Array) -> Array:
    """d/dx [x Phi(x)] = Phi(x) + x phi(x), with phi the standard normal density."""
    cdf = 0.5 * (1.0 + erf(x / math.sqrt(2.0)))  # (...,) Phi(x)
    pdf = np.exp(-0.5 * x**2) / math.sqrt(2.0 * math.pi)  # (...,) phi(x)
    return grad_output * (cdf + x * pdf)  # (...,)


def gelu_tanh(x: Array) -> Array:
    """The tanh approximation (GPT-2; ``jax.nn.gelu``'s default): up to ~5e-4 off the exact
    one."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))  # (...,)


def gelu_tanh_backward(x: Array, grad_output: Array) -> Array:
    """With u = sqrt(2/pi) (x + 0.044715 x^3): d/dx [x (1 + tanh u) / 2]
    = (1 + tanh u) / 2 + x (1 - tanh^2 u) / 2 * sqrt(2/pi) (1 + 3 * 0.044715 x^2)."""
    tanh_u = np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))  # (...,)
    du_dx = math.sqrt(2.0 / math.pi) * (1.0 + 3.0 * 0.044715 * x**2)  # (...,)
    return grad_output * (0.5 * (1.0 + tanh_u) + 0.5 * x * (1.0 - tanh_u**2) * du_dx)  # (...,)


def silu(x: Array) -> Array:
    """SiLU (swish), x * sigmoid(x): the gate of Llama's SwiGLU (torch ``F.silu``,
    ``jax.nn.silu``)."""
    return x * sigmoid(x)  # (...,): sigmoid(x) = 1 / (1 + exp(-x)), without overflow for large -x


def silu_backward(x: Array, grad_output: Array) -> Array:
    """d/dx [x s(x)] = s(x) + x s(x) (1 - s(x)), with s the sigmoid."""
    s = sigmoid(x)  # (...,)
    return grad_output * s * (1.0 + x * (1.0 - s))  # (...,)


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu}
ACTIVATION_BACKWARDS = {
    "relu": relu_backward,
    "gelu": gelu_backward,
    "gelu_tanh": gelu_tanh_backward,
    "silu": silu_backward,
}


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
    def __call__(self, x: Array) -> Array:
        self.check_inputs(x)  # shapes and dtypes: refused with a message
        pre_activation = self.w_1(x)  # (B, T, d_model) -> (B, T, d_ff)
        hidden = self.activation(pre_activation)  # (B, T, d_ff)
        self.keep(pre_activation=pre_activation)  # differs: numpy-autograd
        record(self, hidden=hidden)
        output = self.w_2(self.dropout(hidden))  # (B, T, d_ff) -> (B, T, d_model)
        record(self, output=output)
        return output

    def backward(self, grad_output: Array) -> tuple[Array, dict[str, Array]]:
        """grad_output (B, T, d_model) -> grad_x (B, T, d_model), grads of w_1 and w_2."""
        pre_activation = self.saved.pre_activation  # (B, T, d_ff)
        grad_hidden, w_2_grads = self.w_2.backward(grad_output)  # (B, T, d_ff)
        grad_hidden, _ = self.dropout.backward(grad_hidden)  # (B, T, d_ff)
        activation_backward = ACTIVATION_BACKWARDS[self.config.activation]
        grad_pre_activation = activation_backward(pre_activation, grad_hidden)  # (B, T, d_ff)
        grad_x, w_1_grads = self.w_1.backward(grad_pre_activation)  # (B, T, d_model)
        return grad_x, with_prefix("w_1", w_1_grads) | with_prefix("w_2", w_2_grads)


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
    def __call__(self, x: Array) -> Array:
        self.check_inputs(x)  # shapes and dtypes: refused with a message
        gate = self.w_gate(x)  # (B, T, d_model) -> (B, T, d_ff)
        up = self.w_up(x)  # (B, T, d_model) -> (B, T, d_ff)
        hidden = self.activation(gate) * up  # (B, T, d_ff)
        self.keep(gate=gate, up=up)  # differs: numpy-autograd
        record(self, hidden=hidden)
        output = self.w_down(self.dropout(hidden))  # (B, T, d_ff) -> (B, T, d_model)
        record(self, output=output)
        return output

    def backward(self, grad_output: Array) -> tuple[Array, dict[str, Array]]:
        """grad_output (B, T, d_model) -> grad_x (B, T, d_model), grads of w_gate, w_up and
        w_down."""
        gate, up = self.saved.gate, self.saved.up  # (B, T, d_ff) each
        grad_hidden, w_down_grads = self.w_down.backward(grad_output)  # (B, T, d_ff)
        grad_hidden, _ = self.dropout.backward(grad_hidden)  # (B, T, d_ff)
        # hidden = act(gate) * up: each factor's gradient is the other factor times grad_hidden
        grad_up = grad_hidden * self.activation(gate)  # (B, T, d_ff)
        activation_backward = ACTIVATION_BACKWARDS[self.config.activation]
        grad_gate = activation_backward(gate, grad_hidden * up)  # (B, T, d_ff)
        grad_x_gate, w_gate_grads = self.w_gate.backward(grad_gate)  # (B, T, d_model)
        grad_x_up, w_up_grads = self.w_up.backward(grad_up)  # (B, T, d_model)
        grads = with_prefix("w_gate", w_gate_grads) | with_prefix("w_up", w_up_grads)
        grads |= with_prefix("w_down", w_down_grads)
        return grad_x_gate + grad_x_up, grads  # (B, T, d_model): x fed both


def make_feed_forward(
    config: Config, dtype: str = "float32"
) -> PositionwiseFeedForward | GatedFeedForward:
    """The feed-forward network ``config.gated_ffn`` names: gated (SwiGLU, GeGLU) or the paper's."""
    if config.gated_ffn:
        return GatedFeedForward(config, dtype)
    return PositionwiseFeedForward(config, dtype)
