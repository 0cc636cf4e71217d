# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 12. Gradients: NumPy's backward by hand, torch's autograd, jax.grad
#
# Training moves every weight $\theta$ a little against the gradient of the loss,
# $\partial L / \partial \theta$. torch and JAX derive that gradient from the forward pass
# themselves: torch's **autograd** records each operation as it runs and replays the records
# backwards; **`jax.grad`** traces the function and builds its derivative. NumPy has neither, so
# numpy_impl writes every module's **backward pass by hand**, in the same class, right after its
# forward.
#
# The rule is the chain rule, applied module by module in reverse. A module $y = f(x; \theta)$
# receives $g = \partial L / \partial y$, the gradient of the loss with respect to its output,
# and returns two things: the gradient with respect to its input, which the module before it
# receives as its $g$, and the gradients of its own weights,
#
# $$ \frac{\partial L}{\partial x} = \Big(\frac{\partial y}{\partial x}\Big)^{\!\top} g, \qquad
#    \frac{\partial L}{\partial \theta} = \Big(\frac{\partial y}{\partial \theta}\Big)^{\!\top} g. $$
#
# A backward needs values from its forward (a linear layer needs its input $x$). Inside
# `with enable_grad():` each NumPy forward keeps them, by name, with `self.keep(...)`; outside, in
# inference, it keeps nothing (as torch records nothing under `no_grad`):

# %%
import matplotlib.pyplot as plt
import numpy as np

from transformer_course import agreement, backends, check, each, relative_difference, show
from transformer_run.batches import decoder_only_batch
from transformer_spec import Config, init_params

show("module.py", "Module.keep", backends=("numpy",))

# %% [markdown]
# ## A linear layer
#
# $y = xW + b$ with $W$ stored `[in, out]`, applied at every position $t$. The same $W$ serves
# every position, so its gradient is a sum over all of them:
#
# $$ \frac{\partial L}{\partial x_t} = g_t W^{\top}, \qquad
#    \frac{\partial L}{\partial W} = \sum_t x_t^{\top} g_t = X^{\top} G, \qquad
#    \frac{\partial L}{\partial b} = \sum_t g_t, $$
#
# with $X$ `(N, d_in)` and $G$ `(N, d_out)` the positions as rows. NumPy's `Linear` is a class
# with that backward; torch and JAX take the framework's own layer (`nn.Linear`, `nnx.Linear`)
# and need none:

# %%
show("layers.py", "Linear")

# %% [markdown]
# ## The loss
#
# The chain starts at the loss of chapter 11. With $p = \mathrm{softmax}(z)$ and the smoothed
# target $q$, $\ell_t = -\sum_v q_v \log p_v$, and since $\sum_v q_v = 1$ its gradient is
# remarkably simple:
#
# $$ \frac{\partial \ell_t}{\partial z_t} = p_t - q_t, \qquad
#    \frac{\partial L}{\partial z_t} = \frac{p_t - q_t}{N} \text{ at the } N \text{ counted positions, 0 at padding.} $$

# %%
show("loss.py", "cross_entropy_backward", backends=("numpy",))

# %% [markdown]
# ## The softmax of attention
#
# Each attention weight depends on every score of its row, so the softmax's Jacobian is a full
# matrix, not a diagonal: with $s = \mathrm{softmax}(z)$,
#
# $$ \frac{\partial s_j}{\partial z_i} = s_j\,([i = j] - s_i), \qquad
#    \frac{\partial L}{\partial z_j} = \sum_i g_i \frac{\partial s_i}{\partial z_j}
#    = s_j \Big(g_j - \sum_i g_i s_i\Big). $$
#
# The diagonal alone, $s_j (1 - s_j)$, is the derivative of an elementwise sigmoid, and a classic
# wrong answer here. Masked keys have $s_j = 0$ exactly, so they get no gradient, and a row with
# no allowed key (all $s = 0$) gets zeros, never NaN:

# %%
show("attention.py", "masked_softmax_backward", backends=("numpy",))

# %% [markdown]
# ## LayerNorm
#
# $\hat x = (x - \mu) / \sigma$ with $\sigma = \sqrt{\mathrm{var} + \epsilon}$, and $y = \hat x
# \odot \gamma + \beta$. The mean and the variance are functions of *every* $x_i$ of the row, so
# each $x_i$ reaches the output three ways: directly, through $\mu$ and through $\sigma$. With
# $\hat g = g \odot \gamma$ (the gradient that reaches $\hat x$) and means over the row's $d$
# features:
#
# $$ \frac{\partial L}{\partial x} = \frac{1}{\sigma}\Big(\hat g - \mathrm{mean}(\hat g)
#    - \hat x \odot \mathrm{mean}(\hat g \odot \hat x)\Big), \qquad
#    \frac{\partial L}{\partial \gamma} = \sum_t g_t \odot \hat x_t, \qquad
#    \frac{\partial L}{\partial \beta} = \sum_t g_t. $$
#
# Treating $\mu$ and $\sigma$ as constants gives $\hat g / \sigma$ alone: the classic wrong
# answer.

# %%
show("layer_norm.py", "LayerNorm.backward", backends=("numpy",))

# %% [markdown]
# ## A whole model, backwards
#
# A model's backward calls its parts' backwards in the reverse order of its forward, and adds up
# the gradients of a weight used twice (a tied embedding table is used by the lookup *and* by
# the output projection). The decoder-only language model:

# %%
show("model.py", "TransformerLM.backward", backends=("numpy",))

# %% [markdown]
# Every backend offers the same `loss_and_grads(model, batch, label_smoothing)`: the loss and a
# gradient for every weight, under its canonical name and in the `[in, out]` layout. NumPy runs
# the forward inside `enable_grad()`, then `cross_entropy_backward`, then `model.backward`;
# torch calls `torch.autograd.grad`; JAX calls `nnx.value_and_grad`:

# %%
show("gradients.py", "loss_and_grads")

# %% [markdown]
# ## Three gradients of the same weights
#
# The `tiny-lm` preset (two pre-norm decoder layers, $d_{\text{model}} = 36$, a vocabulary of
# 53), random weights with non-zero biases, a batch of three sequences with 11, 8 and 5 real
# targets, label smoothing 0.1, in float64:

# %%
config = Config.preset("tiny-lm")
params = init_params(config, seed=11, dtype="float64", nonzero_biases=True)
PAD = config.pad_id
ids = np.random.default_rng(0).integers(1, config.tgt_vocab_size, size=(3, 12))
ids[1, 9:] = PAD
ids[2, 6:] = PAD
batch = decoder_only_batch(ids)  # {"ids": (3, 11), "targets": (3, 11)}: the next token at each position
results = each(lambda b: b.impl.loss_and_grads(b.impl.build_model(config, params), batch, 0.1))
for name, (loss, grads) in results.items():
    print(f"{name:6} loss {loss:.15f}, {len(grads)} gradients, {sum(g.size for g in grads.values())} numbers")
names = list(results["numpy"][1])
agreement({backend: np.concatenate([grads[n].ravel() for n in names]) for backend, (_, grads) in results.items()})

# %% [markdown]
# Taken together, all 20,359 numbers agree to float64's rounding. Per weight, the left panel
# shows each gradient's largest difference from NumPy's, relative to its own largest entry; the
# right panel, how large each gradient is.

# %%
reference = results["numpy"][1]
relative = {b: [relative_difference(grads[n], reference[n]) for n in names] for b, (_, grads) in results.items()}
size = [float(np.abs(reference[n]).max()) for n in names]

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 8), sharey=True)
rows = np.arange(len(names))
for offset, backend in ((-0.2, "jax"), (0.2, "torch")):
    if backend in relative:
        left.barh(rows + offset, relative[backend], height=0.4, label=f"{backend} vs numpy")
left.set_xscale("log")
left.set_yticks(rows)
left.set_yticklabels(names, fontsize=7)
left.invert_yaxis()
left.set_xlabel("max |g - g_numpy| / max |g_numpy|, per weight")
left.legend(loc="lower right")
left.set_title("the gradients' differences")
right.barh(rows, size, color="gray")
right.set_xscale("log")
right.set_xlabel("max |g_numpy|")
right.set_title("the gradients' size")
fig.tight_layout()

# %% [markdown]
# Every weight agrees to about $10^{-15}$ but two: the biases of the **keys**, `w_k.bias`, whose
# relative difference is of order 1. The right panel says why: their gradients are about $10^{-18}$,
# nothing but rounding. In exact arithmetic they are zero. A key bias $b_k$ adds $q \cdot b_k$ to
# every score of query $q$, the same amount for every key of its row, and the softmax does not
# change when a whole row is shifted. So the loss does not depend on $b_k$ at all, and each
# backend returns its own rounding noise, which differs from the next. (That is why the test
# suite measures each gradient's difference against the largest gradient of the model too, and
# why some models leave the key bias out.)

# %%
for n in names:
    if n.endswith("w_k.bias"):
        print(f"{n:34}", ", ".join(f"{b} {np.abs(grads[n]).max():.1e}" for b, (_, grads) in results.items()))

# %% [markdown]
# ## A check that trusts none of them: finite differences
#
# Three backends that agree could still share a mistake. The definition of the derivative does
# not: nudge one weight by $\pm h$ and watch the loss,
#
# $$ \frac{\partial L}{\partial \theta_i} \approx \frac{L(\theta_i + h) - L(\theta_i - h)}{2h}, $$
#
# which is accurate to $O(h^2)$. Here for one entry of five weights (the test suite does it
# for every component and model):

# %%
reference_backend = backends()[0]  # the NumPy adapter


def loss_at(name, index, shift):
    shifted = {k: v.copy() for k, v in params.items()}
    shifted[name][index] += shift
    return reference_backend.impl.loss_and_grads(reference_backend.impl.build_model(config, shifted), batch, 0.1)[0]


h = 1e-5
print(f"{'weight':46} {'finite difference':>18} " + " ".join(f"{b:>18}" for b in results))
for name in ["tgt_embed.token.weight", "decoder.layers.0.self_attn.w_q.weight", "decoder.layers.0.self_attn_norm.bias",
             "decoder.layers.1.ffn.w_1.weight", "generator.proj.bias"]:  # fmt: skip
    index = tuple(int(i) for i in np.unravel_index(np.argmax(np.abs(reference[name])), reference[name].shape))
    numeric = (loss_at(name, index, h) - loss_at(name, index, -h)) / (2 * h)
    print(f"{name + str(list(index)):46} {numeric:18.10e} "
          + " ".join(f"{grads[name][index]:18.10e}" for _, grads in results.values()))  # fmt: skip

# %% [markdown]
# The finite differences agree with all three to 8 digits or more, which is what the $O(h^2)$
# error and the rounding of $L$ divided by $2h$ allow.
#
# ## Exercises
#
# Write each backward in NumPy and run `check` on it. Here the answer has three sources: NumPy's
# hand-written backward, and torch's autograd and `jax.vjp` run through each backend's own
# forward (`nn.Linear`, `LayerNorm`, `masked_softmax`). `check` says what differs, and which
# classic mistake your answer matches when it matches one. The solutions are in
# `solutions/12_gradients.py`.
#
# ### Exercise 12.1: a linear layer's weight gradient
# `linear_weight_grad(x, grad_output)` → `(d_in, d_out)`: $\partial L / \partial W$ for
# $y = xW + b$, with `x` `(..., d_in)` and `grad_output` $= \partial L / \partial y$ `(..., d_out)`.

# %%
def linear_weight_grad(x, grad_output):
    raise NotImplementedError("your code here")


check(linear_weight_grad)

# %% [markdown]
# ### Exercise 12.2: the softmax's backward
# `softmax_backward(scores, mask, grad_weights)` → the shape of `scores` `(..., T_q, T_k)`: the
# gradient with respect to the scores of the masked softmax of chapter 4 (over the last axis;
# mask True = may attend; a row with no allowed key has all-zero weights), given
# `grad_weights` $= \partial L / \partial w$, the gradient with respect to the softmax's
# output $w$ = `masked_softmax(scores, mask)` (the weights), not with respect to the scores.

# %%
def softmax_backward(scores, mask, grad_weights):
    raise NotImplementedError("your code here")


check(softmax_backward)

# %% [markdown]
# ### Exercise 12.3: LayerNorm's backward
# `layer_norm_backward(x, weight, eps, grad_output)` → the shape of `x` `(..., d)`:
# $\partial L / \partial x$ for $y = (x - \mu)/\sqrt{\mathrm{var} + \epsilon} \odot \gamma$ (biased
# variance, over the last axis), given `grad_output` $= \partial L / \partial y$.

# %%
def layer_norm_backward(x, weight, eps, grad_output):
    raise NotImplementedError("your code here")


check(layer_norm_backward)

# %% [markdown]
# What a wrong answer looks like: LayerNorm's backward with the mean and the variance held
# constant.

# %%
def layer_norm_backward(x, weight, eps, grad_output):
    std = np.sqrt(x.var(axis=-1, keepdims=True) + eps)
    return grad_output * weight / std  # only the direct path through x_hat


check(layer_norm_backward)
