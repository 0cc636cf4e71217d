"""Positional information: the paper's fixed sinusoids, or a learned table."""

from __future__ import annotations

import math

import torch
from torch import nn

from transformer_spec import Config

from .layers import _torch_dtype


def sinusoidal_table(max_len: int, d_model: int, dtype: str = "float32") -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).

    Written so that an odd d_model works: there are ceil(d/2) sine columns but only
    floor(d/2) cosine columns (``pe[:, 1::2] = cos`` with ceil(d/2) frequencies fails).
    """
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d/2),)
    angle = position * torch.exp(-math.log(10000.0) * two_i / d_model)  # (max_len, ceil(d/2))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)  # (max_len, d_model)
    pe[:, 0::2] = torch.sin(angle)  # (max_len, ceil(d/2))
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # (max_len, floor(d/2))
    return pe.to(_torch_dtype(dtype))  # (max_len, d_model)


class SinusoidalPositionalEncoding(nn.Module):
    """A fixed table, not a parameter: a non-persistent buffer, so it moves with
    ``.to(device)`` but is not saved in the state_dict."""

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.register_buffer("pe", sinusoidal_table(config.max_len, config.d_model, dtype), persistent=False)

    def forward(self, seq_len: int, offset: int = 0) -> torch.Tensor:
        return self.pe[offset : offset + seq_len]  # (T, d_model)


class LearnedPositionalEmbedding(nn.Module):
    """One trained vector per position (BERT, GPT)."""

    def __init__(self, config: Config, dtype: str = "float32"):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(config.max_len, config.d_model, dtype=_torch_dtype(dtype)))

    def forward(self, seq_len: int, offset: int = 0) -> torch.Tensor:
        return self.weight[offset : offset + seq_len]  # (T, d_model)
