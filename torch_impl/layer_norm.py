"""Layer normalisation (Ba et al., 2016) over the last (feature) axis."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer_spec import Config
from transformer_spec.trace import record

from .layers import _torch_dtype


class LayerNorm(nn.Module):
    """``(x - mean) / sqrt(var + eps) * weight + bias``.

    The variance is the *biased* one (divide by d, not d - 1) and eps sits inside the
    square root: exactly what ``F.layer_norm`` computes (fused into one kernel here; the
    formula is written out in numpy_impl and jax_impl). torch's default eps is 1e-5,
    Flax's 1e-6, BERT's 1e-12: ours comes from the config.
    """

    schema = "layer_norm"

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.config = config
        self.eps = float(config.layer_norm_eps)
        self.weight = nn.Parameter(torch.ones(config.d_model, dtype=_torch_dtype(dtype)))
        self.bias = nn.Parameter(torch.zeros(config.d_model, dtype=_torch_dtype(dtype))) if config.bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)  # (..., d_model)
        record(self, "output", y)
        return y
