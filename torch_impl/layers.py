"""The linear layer: PyTorch's own ``nn.Linear``.

It computes ``x @ weight.T + bias`` with ``weight`` stored [out, in], the transpose of
our canonical [in, out] (``params.py`` transposes on the way in and out).
"""

from __future__ import annotations

import torch
from torch import nn


def Linear(d_in: int, d_out: int, bias: bool = True, dtype: str = "float32") -> nn.Linear:  # noqa: N802
    return nn.Linear(d_in, d_out, bias=bias, dtype=_torch_dtype(dtype))


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    return dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype))
