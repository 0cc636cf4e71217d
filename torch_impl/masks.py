"""Masks: boolean, True = may attend, shaped to broadcast against (B, H, T_q, T_k).

Careful: ``torch.nn.MultiheadAttention`` and ``nn.Transformer`` read True as *masked*;
``F.scaled_dot_product_attention``, Flax and these backends read True as *may attend*.
"""

from __future__ import annotations

import torch
from torch import Tensor as Array


def make_padding_mask(ids: Array, pad_id: int) -> Array:
    """(B, T) ids -> (B, 1, 1, T): every query may look at every non-pad key."""
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, T)


# differs: torch-device
def make_causal_mask(seq_len: int, device: torch.device | None = None) -> Array:
    """(1, 1, T, T), lower triangular: position i may look at positions 0..i only."""
    mask = torch.tril(torch.ones((seq_len, seq_len), dtype=bool, device=device))  # (T, T)
    return mask[None, None, :, :]  # (1, 1, T, T)


def make_decoder_mask(ids: Array, pad_id: int) -> Array:
    """Decoder self-attention: causal AND key not padding -> (B, 1, T, T)."""
    causal = make_causal_mask(ids.shape[1], ids.device)  # (1, 1, T, T); differs: torch-device
    return make_padding_mask(ids, pad_id) & causal  # (B, 1, T, T)


def make_target_mask(tgt_ids: Array, pad_id: int) -> Array:
    """The encoder-decoder's decoder self-attention -> (B, 1, T, T): ``make_decoder_mask``, except
    that position 0, the decoder's start token, is never hidden, even where a model spells it
    ``pad_id`` (Marian and T5 start decoding from their pad token)."""
    seq_len = tgt_ids.shape[1]
    is_start = torch.arange(seq_len, device=tgt_ids.device) == 0  # (T,); differs: torch-device
    keep = (tgt_ids != pad_id) | is_start  # (B, T)
    causal = make_causal_mask(seq_len, tgt_ids.device)  # (1, 1, T, T); differs: torch-device
    return keep[:, None, None, :] & causal  # (B, 1, T, T)


def make_cross_attention_mask(src_ids: Array, pad_id: int) -> Array:
    """Decoder queries over encoder keys: hide the *source* padding -> (B, 1, 1, T_src).

    It broadcasts over the T_tgt query rows; its last axis is the source length, not
    the target length (the mismatch one of the PyTorch tutorials' decoders stopped on).
    """
    return make_padding_mask(src_ids, pad_id)  # (B, 1, 1, T_src)
