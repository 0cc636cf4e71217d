"""The linear layer: PyTorch's own ``nn.Linear``.

It computes ``x @ weight.T + bias`` with ``weight`` stored [out, in], the transpose of
our canonical [in, out] (``params.py`` transposes on the way in and out).
"""

from __future__ import annotations

import torch
from torch import Tensor as Array
from torch import nn
from torch.nn import functional as F


def Linear(d_in: int, d_out: int, bias: bool = True, dtype: str = "float32") -> nn.Linear:  # noqa: N802  differs: framework-layers
    # differs: framework-layers
    return nn.Linear(d_in, d_out, bias=bias, dtype=_torch_dtype(dtype))


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:  # differs: framework-layers
    return dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype))


class Dropout(nn.Module):
    """In training mode, zero each element with probability ``rate`` and scale the rest by
    1 / (1 - rate) ("inverted dropout"); in inference mode (``model.eval()``): the identity.

    ``F.dropout`` draws from torch's global generator, so torch seeds dropout globally:
    ``seed_dropout`` calls ``torch.manual_seed``.
    """

    def __init__(self, rate: float):
        super().__init__()
        self.rate = rate

    def forward(self, x: Array) -> Array:
        # differs: framework-layers
        if not self.training or self.rate == 0:
            return x
        # differs: framework-layers
        return F.dropout(x, self.rate)  # (...,) like x


def seed_dropout(model: nn.Module, seed: int) -> None:
    """Make the next dropout masks reproducible: torch draws them all from one global generator."""
    # differs: dropout-streams
    torch.manual_seed(seed)
