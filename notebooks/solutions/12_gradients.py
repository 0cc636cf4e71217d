"""Solutions to chapter 12's exercises (gradients): one function per exercise, named as the exercise."""

import numpy as np


def layer_norm_backward(x, weight, eps, grad_output):
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    std = np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)  # (..., 1): biased variance
    x_hat = (x - mean) / std  # (..., d)
    g = grad_output * weight  # (..., d): the gradient that reaches x_hat
    # through x_hat directly, through the mean, and through the variance
    return (g - g.mean(axis=-1, keepdims=True) - x_hat * (g * x_hat).mean(axis=-1, keepdims=True)) / std


def softmax_backward(scores, mask, grad_weights):
    scores = np.where(mask, scores, -np.inf)  # masked keys: weight exp(-inf) = 0
    top = scores.max(axis=-1, keepdims=True)
    exp = np.exp(scores - np.where(np.isfinite(top), top, 0.0))  # a row with no key subtracts 0
    total = exp.sum(axis=-1, keepdims=True)
    s = exp / np.where(total > 0, total, 1.0)  # (..., T_q, T_k): the weights, all 0 in an empty row
    # d s_j / d z_i = s_j ([i = j] - s_i): the diagonal and the rest of the row's Jacobian
    return s * (grad_weights - (grad_weights * s).sum(axis=-1, keepdims=True))


def linear_weight_grad(x, grad_output):
    rows_x = x.reshape(-1, x.shape[-1])  # (N, d_in): every position of every sequence
    rows_g = grad_output.reshape(-1, grad_output.shape[-1])  # (N, d_out)
    return rows_x.T @ rows_g  # (d_in, d_out): the sum over the N positions of x_t^T g_t
