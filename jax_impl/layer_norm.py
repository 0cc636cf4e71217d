"""Layer normalisation (Ba et al., 2016) over the last (feature) axis."""

from __future__ import annotations

import jax.numpy as jnp
from flax.nnx import Module
from jax import Array

from transformer_spec import Config
from transformer_spec.checks import check_features
from transformer_spec.trace import record

from .checks import check_float_inputs
from .kernels import fusable
from .layers import parameter


class LayerNorm(Module):
    """``(x - mean) / sqrt(var + eps) * weight + bias``.

    The variance is the *biased* one (divide by d, not d - 1) and eps sits inside the
    square root: that is what torch, Flax and BERT compute. (A common hand-written
    version uses ``x.std()`` -- unbiased -- and adds eps to the std: close, not equal.)
    torch's default eps is 1e-5, Flax's 1e-6, BERT's 1e-12: ours comes from the config.

    Not Flax's ``nnx.LayerNorm``: its default ``use_fast_variance=True`` computes
    var = E[x^2] - E[x]^2, which cancels catastrophically when the mean is large
    compared with the spread, and it calls its parameters ``scale``/``bias``; ours keep
    the canonical names.
    """

    schema = "layer_norm"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.config = config
        self.eps = float(config.layer_norm_eps)  # a Python float: it does not change x's dtype
        self.weight = parameter((config.d_model,), dtype, value=1.0)
        self.bias = parameter((config.d_model,), dtype) if config.bias else None

    def check_inputs(self, x: Array) -> None:
        """x (..., d_model) in the weights' dtype; checked here, before a fused kernel may take
        the call."""
        check_features("x", x.shape, self.config.d_model)
        check_float_inputs(("x",), (x,), self)

    @fusable("layer_norm")  # speed: a fused kernel may run instead (kernels.py)
    def __call__(self, x: Array) -> Array:
        self.check_inputs(x)  # shapes and dtypes: refused with a message
        mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
        var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # (..., 1), biased
        std = jnp.sqrt(var + self.eps)  # (..., 1)
        x_hat = (x - mean) / std  # (..., d_model)
        y = x_hat * self.weight  # (..., d_model)
        if self.bias is not None:
            y = y + self.bias  # (..., d_model)
        record(self, output=y)
        return y


class RMSNorm(Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` (Zhang & Sennrich, 2019; Llama, SmolLM2).

    LayerNorm without the mean: the vector is rescaled to unit root-mean-square, not
    centred, and there is no bias. Cheaper, and as good in practice. eps sits inside the
    square root, as in LayerNorm (and HF's ``LlamaRMSNorm``, which computes it in float32).
    Not Flax's ``nnx.RMSNorm``: its epsilon defaults to 1e-6 and its parameter is called
    ``scale``.
    """

    schema = "rms_norm"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.config = config
        self.eps = float(config.layer_norm_eps)  # a Python float: it does not change x's dtype
        self.weight = parameter((config.d_model,), dtype, value=1.0)

    def check_inputs(self, x: Array) -> None:
        """x (..., d_model) in the weights' dtype; checked here, before a fused kernel may take
        the call."""
        check_features("x", x.shape, self.config.d_model)
        check_float_inputs(("x",), (x,), self)

    @fusable("rms_norm")  # speed: a fused kernel may run instead (kernels.py)
    def __call__(self, x: Array) -> Array:
        self.check_inputs(x)  # shapes and dtypes: refused with a message
        rms = jnp.sqrt((x * x).mean(axis=-1, keepdims=True) + self.eps)  # (..., 1)
        x_hat = x / rms  # (..., d_model)
        y = x_hat * self.weight  # (..., d_model)
        record(self, output=y)
        return y


def make_norm(config: Config, dtype: str = "float32") -> LayerNorm | RMSNorm:
    """The normalisation ``config.norm`` names: LayerNorm (the paper, BERT, GPT-2) or RMSNorm
    (Llama)."""
    return RMSNorm(config, dtype) if config.norm == "rms_norm" else LayerNorm(config, dtype)
