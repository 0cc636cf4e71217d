"""Solutions to chapter 13's exercises (training): one function per exercise, named as the exercise."""

import numpy as np


def warmup_schedule(steps, d_model, warmup_steps):
    steps = np.maximum(np.asarray(steps, dtype=np.float64), 1.0)  # counted from 1; step 0 gets step 1's rate
    return d_model**-0.5 * np.minimum(steps**-0.5, steps * warmup_steps**-1.5)  # warm-up, then 1 / sqrt(step)


def adam_step(param, grad, m, v, t, lr, beta1, beta2, eps):
    m = beta1 * m + (1 - beta1) * grad  # the first moment: a running mean of the gradient
    v = beta2 * v + (1 - beta2) * grad * grad  # the second: of its square
    m_hat = m / (1 - beta1**t)  # both start at 0: the bias correction, t counted from 1
    v_hat = v / (1 - beta2**t)
    return param - lr * m_hat / (np.sqrt(v_hat) + eps), m, v  # eps outside the square root
