"""Solutions to chapter 16's exercises (data parallel and bf16 mixed precision): one function per exercise,
named as the exercise."""

import numpy as np


def average_gradients(grads, counts):
    weights = np.asarray(counts, dtype=np.float64) / max(int(np.sum(counts)), 1)  # (N,): each replica's token share
    return weights @ grads  # (P,): sum_r weight_r * grads[r]


def to_bfloat16(x):
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    last_kept = (bits >> np.uint32(16)) & np.uint32(1)  # the lowest bit a bf16 keeps: 1 if odd
    rounded = bits + np.uint32(0x7FFF) + last_kept  # a tie (low half 0x8000) carries only when odd: ties to even
    # a NaN's payload may sit in the low half only: rounding would carry it into the sign (0x7FFFFFFF -> -0.0) or
    # drop it (0x7F800001 -> inf); keep its top half with the quiet bit set, a NaN whatever it held
    quiet_nan = (bits & np.uint32(0xFFFF0000)) | np.uint32(0x00400000)
    kept = np.where(np.isnan(x), quiet_nan, rounded)
    return (kept & np.uint32(0xFFFF0000)).view(np.float32)  # keep the top 16 bits
