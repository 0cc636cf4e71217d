"""Solutions to chapter 17's exercises (porting a checkpoint): one function per exercise, named as the exercise."""

import numpy as np


def hf_linear_to_ours(weight):
    return np.ascontiguousarray(weight.T)  # torch [out, in] -> ours [in, out]: a transpose, never a reshape


def permute_qk_for_rope(weight, num_heads):
    d_k = weight.shape[0] // num_heads
    # interleaved pair i is features (2i, 2i + 1); halves pair i is (i, i + d_k/2): the firsts, then the seconds
    order = np.concatenate([np.arange(0, d_k, 2), np.arange(1, d_k, 2)])
    heads = weight.reshape(num_heads, d_k, -1)  # (H, d_k, in): each head's rows
    return heads[:, order, :].reshape(weight.shape)
