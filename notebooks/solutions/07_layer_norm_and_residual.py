"""Solutions to chapter 7's exercises (layer normalisation and the residual connection): one function per
exercise, named as the exercise."""

import numpy as np


def layer_norm(x, weight, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # (..., 1): biased, divided by d (np.var's default)
    return (x - mean) / np.sqrt(var + eps) * weight + bias  # eps inside the square root


def rms_norm(x, weight, eps):
    rms = np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)  # (..., 1): no mean subtracted
    return x / rms * weight


def residual_connection(x, sublayer, norm, norm_first):
    if norm_first:
        return x + sublayer(norm(x))  # pre-norm: the residual path is never normalised
    return norm(x + sublayer(x))  # post-norm (the paper): the sum is normalised
