"""Solutions to chapter 6's exercises (the feed-forward network): one function per exercise, named as the
exercise."""

import math

import numpy as np
from scipy.special import erf, expit


def feed_forward(x, w_1, b_1, w_2, b_2):
    hidden = np.maximum(x @ w_1 + b_1, 0.0)  # (..., d_ff): the ReLU between the two maps
    return hidden @ w_2 + b_2  # (..., d_model)


def swiglu(x, w_gate, w_up, w_down):
    gate = x @ w_gate  # (..., d_ff)
    silu = gate * expit(gate)  # expit is the sigmoid, 1 / (1 + exp(-z)), without overflow
    return (silu * (x @ w_up)) @ w_down  # the activated gate scales the up projection, feature by feature


def exact_gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))  # x * Phi(x), Phi the standard normal's distribution
