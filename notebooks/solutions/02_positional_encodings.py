"""Solutions to chapter 2's exercises (positional encodings): one function per exercise, named as the exercise."""

import numpy as np


def sinusoidal_table(max_len, d_model):
    positions = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    exponents = np.arange(0, d_model, 2) / d_model  # 2i / d for i = 0 .. ceil(d/2) - 1
    angles = positions / 10000.0**exponents  # (max_len, ceil(d/2)): one frequency per pair of columns
    table = np.zeros((max_len, d_model))
    table[:, 0::2] = np.sin(angles)  # the even columns: ceil(d/2) of them
    table[:, 1::2] = np.cos(angles[:, : d_model // 2])  # the odd columns: one fewer when d is odd
    return table


def shift_sinusoids(pe, offset):
    d = pe.shape[-1]
    omega = 10000.0 ** (-np.arange(0, d, 2) / d)  # (d/2,): each pair's frequency
    c, s = np.cos(offset * omega), np.sin(offset * omega)  # the angle each pair turns by
    sines, cosines = pe[..., 0::2], pe[..., 1::2]  # (..., d/2) each: sin a and cos a
    shifted = np.empty_like(pe)
    shifted[..., 0::2] = sines * c + cosines * s  # sin(a + b) = sin a cos b + cos a sin b
    shifted[..., 1::2] = cosines * c - sines * s  # cos(a + b) = cos a cos b - sin a sin b
    return shifted
