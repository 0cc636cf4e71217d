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
# # 4. Attention: scaled dot-product and the masked softmax
#
# Attention lets every position read from every other one. Each query $q_i$ is compared with
# every key $k_j$ by a dot product; a softmax over the keys turns the scores into weights that
# sum to 1; the answer is the weighted average of the values $v_j$:
#
# $$ \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V,
#    \qquad Q \in \mathbb{R}^{T_q \times d_k},\; K \in \mathbb{R}^{T_k \times d_k},\;
#    V \in \mathbb{R}^{T_k \times d_v}. $$
#
# With a batch and heads in front, the shapes are `q (B, H, T_q, d_k)`, `k (B, H, T_k, d_k)`,
# `v (B, H, T_k, d_v)`, the scores and weights `(B, H, T_q, T_k)` and the result
# `(B, H, T_q, d_v)`: one row of weights per query, one column per key.
#
# The mask of chapter 1 (True = may attend) enters through the softmax: a masked key gets the
# score $-\infty$, so its weight is $e^{-\infty} = 0$ exactly, and the other keys share the
# whole weight:
#
# $$ w_{ij} = \frac{m_{ij}\, e^{s_{ij} - c_i}}{\sum_{l} m_{il}\, e^{s_{il} - c_i}}, \qquad
#    c_i = \max_{l:\, m_{il}} s_{il}. $$
#
# Subtracting the row's largest allowed score $c_i$ changes nothing mathematically (it cancels)
# and keeps every exponent $\le 0$, so `exp` cannot overflow. And a row with **no** allowed key
# (a padding query, see chapter 1) would be $0/0$: every backend of this project defines its
# weights as zeros instead. Here is the softmax, read from each backend's file as this cell runs:

# %%
import math
import tracemalloc

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import display

import jax_impl
import numpy_impl
import torch_impl
from transformer_course import agreement, check, each, show

show("attention.py", "masked_softmax")

# %% [markdown]
# The attention itself is four lines: the scores, the masked softmax, (dropout, which is off
# outside training), and the weighted average of the values. It returns the weights too, for
# the pictures below.

# %%
show("attention.py", "scaled_dot_product_attention")

# %% [markdown]
# ## Why divide by $\sqrt{d_k}$
#
# If the entries of $q$ and $k$ are independent with mean 0 and variance 1, their dot product
# $q \cdot k = \sum_{i=1}^{d_k} q_i k_i$ is a sum of $d_k$ terms of variance 1: its variance is
# $d_k$, its spread $\sqrt{d_k}$. Large scores push the softmax towards a one-hot vector, whose
# gradient is almost zero; dividing by $\sqrt{d_k}$ brings the spread back to 1 whatever the
# head size. Note it is $d_k$, **the size of one head**, not $d_{\text{model}}$: a model of width 512
# with 8 heads divides by $\sqrt{64} = 8$, not by $\sqrt{512}$.

# %%
rng = np.random.default_rng(0)
head_sizes = [4, 16, 64, 256, 1024]
largest = {"q k / sqrt(d_k)": [], "q k, not scaled": []}
for d_k in head_sizes:
    q, k = rng.standard_normal((500, 1, d_k)), rng.standard_normal((500, 16, d_k))  # 500 queries, 16 keys each
    scores = (q * k).sum(-1)  # (500, 16)
    print(f"d_k = {d_k:4}: std of q.k = {scores.std():6.2f}, of q.k / sqrt(d_k) = {scores.std() / math.sqrt(d_k):.2f}")
    everything = np.ones(scores.shape, dtype=bool)
    largest["q k / sqrt(d_k)"].append(numpy_impl.masked_softmax(scores / math.sqrt(d_k), everything).max(-1).mean())
    largest["q k, not scaled"].append(numpy_impl.masked_softmax(scores, everything).max(-1).mean())

fig, axis = plt.subplots(figsize=(5.5, 3))
for label, values in largest.items():
    axis.plot(head_sizes, values, marker="o", label=label)
axis.set_xscale("log", base=2)
axis.set_xlabel("d_k")
axis.set_ylabel("largest weight of a row (mean)")
axis.set_title("16 keys: unscaled scores make the softmax nearly one-hot", fontsize=10)
axis.legend()
fig.tight_layout()

# %% [markdown]
# Scaled, the largest of 16 weights stays near 0.25 at every head size: a query spreads its
# attention over several keys. Unscaled, it climbs towards 1: at $d_k = 64$ one key already
# takes more than 80% of the weight, on average.
#
# ## The same attention in all three backends
#
# Two sentences of six tokens, the first padded on the right, the second on the left; two
# heads of $d_k = 4$; the decoder mask of chapter 1 (causal AND not padding). `each` runs
# every backend's `scaled_dot_product_attention` on the same NumPy arrays.

# %%
PAD = 0
ids = np.array([[5, 7, 9, 4, PAD, PAD], [PAD, PAD, 1, 2, 3, 8]])
mask = numpy_impl.make_decoder_mask(ids, PAD)  # (2, 1, 6, 6)
rng = np.random.default_rng(1)
q, k, v = (rng.standard_normal((2, 2, 6, 4)) for _ in range(3))  # (B, H, T, d_k)
results = each(lambda b: b.call(b.impl.scaled_dot_product_attention, q, k, v, mask))
display(agreement({name: context for name, (context, _) in results.items()}))
agreement({name: weights for name, (_, weights) in results.items()})

# %% [markdown]
# The first table compares the contexts `(B, H, T_q, d_v)`, the second the weights
# `(B, H, T_q, T_k)`: equal to the last bits of float64. The weights are what a person looks
# at: one panel per sentence and head, queries down, keys across.

# %%
weights = results["numpy"][1]
fig, axes = plt.subplots(2, 2, figsize=(7, 6.2))
for sentence in range(2):
    for head in range(2):
        axis = axes[sentence, head]
        image = axis.imshow(weights[sentence, head], cmap="viridis", vmin=0, vmax=1)
        axis.set_title(f"ids {ids[sentence].tolist()}, head {head}", fontsize=9)
        axis.set_xlabel("key")
        axis.set_ylabel("query")
fig.colorbar(image, ax=axes, shrink=0.7, label="weight")
print("sentence 2, head 0, the first three rows:\n", weights[1, 0, :3].round(3))

# %% [markdown]
# Every row of the first sentence sums to 1 over the keys at or before the query (and not
# padding). In the second, the first two queries are pads at the start: every key they may
# see is a pad too, so their rows are empty and their weights are exactly 0.
#
# ## A query with no key: zeros, never NaN
#
# That empty row is where hand-written attention goes wrong, and so are large scores. Two rows
# of scores: the first has no allowed key; the second allows three keys whose scores are
# around 1000, past the point where `exp` overflows (710 in float64, 89 in float32). Five ways
# to take their softmax:

# %%
scores = np.array([[2.0, 1.0, 0.5, -1.0], [1000.0, 1002.0, 999.0, 998.0]])  # (2 queries, 4 keys)
allowed = np.array([[False, False, False, False], [True, True, True, False]])  # the first row: no key at all


def exp_over_sum(s, m):  # the softmax as written on paper, no max subtracted
    e = np.exp(np.where(m, s, -np.inf))
    return e / e.sum(-1, keepdims=True)


def fill_minus_1e9(s, m):  # a finite fill, then a careful softmax
    s = np.where(m, s, -1e9)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


with np.errstate(over="ignore", invalid="ignore"):
    ways = {
        "exp / sum": exp_over_sum(scores, allowed),
        "a -1e9 fill": fill_minus_1e9(scores, allowed),
        "torch.softmax, -inf fill": torch.softmax(torch.from_numpy(scores).masked_fill(
            ~torch.from_numpy(allowed), -math.inf), dim=-1).numpy(),
        "jax.nn.softmax, -inf fill": np.asarray(jax.nn.softmax(jnp.where(allowed, scores, -jnp.inf), axis=-1)),
    }
ways |= {f"ours, {name}": w for name, w in each(lambda b: b.call(b.impl.masked_softmax, scores, allowed)).items()}
for name, w in ways.items():
    print(f"{name:26} no key: {np.array2string(w[0], precision=3):28} large: {np.array2string(w[1], precision=3)}")

# %% [markdown]
# - **exp / sum** overflows: $e^{1000} = \infty$ in float64 (and $e^{89}$ already in float32),
#   and $\infty/\infty$ is NaN. The empty row is $0/0$, NaN too.
# - **a -1e9 fill** is finite, so an empty row is four equal scores: its softmax is the
#   *uniform average* over the padding, $1/4$ each. No error, just a wrong number, and the
#   context of that row becomes the mean of the padded values.
# - **torch's and JAX's softmax** subtract the max themselves (the large row is right), but
#   an all $-\infty$ row gives $-\infty - (-\infty) = $ NaN.
# - **ours** replaces the empty row's max, $-\infty$, by 0 (so each $e^{-\infty - 0} = 0$) and
#   divides by 1 where the row's sum is 0: zeros, in every backend.
#
# Such a row belongs to a pad and is never read, so why care? Because NaN is contagious. A
# loss that ignores padding multiplies that row by 0, and $0 \cdot \mathrm{NaN} = \mathrm{NaN}$;
# in the backward pass, the gradient of $V$ is $W^\top G$, a sum over *every* query row, the
# empty one included. One NaN there and every weight of the model is NaN after the next step.
# Below, `v` holds 4 values of size 3, the empty row's context is never read (its upstream
# gradient is 0), and we ask each framework's autograd (NumPy: by hand) for the loss and the
# gradient of `v`:

# %%
rng = np.random.default_rng(2)
values = rng.standard_normal((4, 3))  # (T_k, d_v)
upstream = rng.standard_normal((2, 3))  # (T_q, d_v): d loss / d context
upstream[0] = 0.0  # the query with no key is a pad: nothing reads its context


def torch_loss_and_grad(softmax):
    v = torch.tensor(values, requires_grad=True)
    loss = ((softmax(torch.from_numpy(scores)) @ v) * torch.from_numpy(upstream)).sum()
    loss.backward()
    return loss.item(), v.grad.numpy()


def jax_loss_and_grad(softmax):
    loss = lambda v: ((softmax(jnp.asarray(scores)) @ v) * upstream).sum()
    return float(loss(values)), np.asarray(jax.grad(loss)(values))


torch_mask = torch.from_numpy(allowed)
ours = numpy_impl.masked_softmax(scores, allowed)  # (T_q, T_k)
gradients = {
    "torch.softmax, -inf fill": torch_loss_and_grad(
        lambda s: torch.softmax(s.masked_fill(~torch_mask, -math.inf), -1)),
    "jax.nn.softmax, -inf fill": jax_loss_and_grad(lambda s: jax.nn.softmax(jnp.where(allowed, s, -jnp.inf), -1)),
    "ours, numpy (by hand)": (((ours @ values) * upstream).sum(), ours.T @ upstream),
    "ours, jax": jax_loss_and_grad(lambda s: jax_impl.masked_softmax(s, allowed)),
    "ours, torch": torch_loss_and_grad(lambda s: torch_impl.masked_softmax(s, torch_mask)),
}
for name, (loss, grad_v) in gradients.items():
    nan = f"{np.isnan(grad_v).sum()} of {grad_v.size} NaN"
    print(f"{name:26} loss {loss:7.4f}   d loss / d v: {nan}, first row {np.array2string(grad_v[0], precision=4)}")

# %% [markdown]
# With the frameworks' softmax the loss and the whole gradient are NaN, although the NaN row
# was multiplied by zero; with ours they are finite, and equal in the three backends. The
# order of operations in `masked_softmax` keeps its *own* gradient finite as well: `where`
# picks a branch (the branch not taken passes back 0), and $e^{-\infty} = 0$ has derivative 0.
#
# ## Long sequences: a block of keys at a time
#
# The weights are `(B, H, T_q, T_k)`: at 8 heads and 8192 positions that is 2 GiB in float32,
# and the scores and their exponentials are as large. FlashAttention (Dao et al. 2022) never
# makes them. It reads the keys and values in blocks and keeps, for each query row, the largest
# score so far $m$ and the sum $\ell$ of $e^{s_j - m}$ so far. When a block brings a larger
# score, what was summed so far is multiplied by $e^{m_\text{old} - m_\text{new}} \le 1$, so
# that every term is relative to the same max; at the end the output divided by $\ell$ is the
# softmax's average, exactly as above up to rounding. A row with no allowed key keeps
# $m = -\infty$ and $\ell = 0$, and gives 0, as before. Its own file, the same in every backend:

# %%
show("tiled_attention.py", "tiled_attention")

# %% [markdown]
# On the two sentences above, in blocks of 4 keys (a block of 4, then one of 2), against the
# plain attention's context (NumPy):

# %%
tiled = each(lambda b: b.call(b.impl.tiled_attention, q, k, v, mask, 4))
plain = {"plain (numpy)": results["numpy"][0]}
agreement(plain | {f"tiled, {name}": context for name, (context, _) in tiled.items()}, reference="plain (numpy)")

# %% [markdown]
# What it saves is memory. `tracemalloc` sees NumPy's arrays: the peak of one attention over
# 2048 positions, 4 heads, in float32, written out and tiled (blocks of 128 keys):

# %%
def peak_mib(run):
    tracemalloc.start()
    run()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


rng = np.random.default_rng(3)
long_q, long_k, long_v = (rng.standard_normal((1, 4, 2048, 64), dtype=np.float32) for _ in range(3))
for name, run in {
    "plain": lambda: numpy_impl.scaled_dot_product_attention(long_q, long_k, long_v),
    "tiled": lambda: numpy_impl.tiled_attention(long_q, long_k, long_v, None, 128),
}.items():
    print(f"{name}: peak {peak_mib(run):6.1f} MiB")

# %% [markdown]
# The plain attention holds several `(1, 4, 2048, 2048)` arrays at once, 64 MiB each; the tiled
# one a few `(1, 4, 2048, 128)` blocks. In NumPy it is slower (more, smaller products, and the
# running output rescaled once per block): the model's attention kernel takes this path only
# from 4096 keys on, and `python -m bench.tiled` measures both at 8192. NumPy's backward
# (`tiled_attention_backward`) keeps only the output and each row's $\log \ell + m$, and
# recomputes a block's weights from them when the gradient is asked for.
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs and says what differs, and which classic mistake your
# answer matches when it matches one. The solutions are in `solutions/04_attention.py`.
#
# ### Exercise 4.1: the masked softmax
# `masked_softmax(scores, mask)` → weights, the shape of `scores` `(..., T_q, T_k)`: the softmax
# over the last axis, over the allowed keys only (`mask` is bool, True = may attend, and
# broadcasts against `scores`). A masked key gets weight 0; a row with no allowed key gets all
# zeros. The cases include a row with no key and scores around 1000.

# %%
def masked_softmax(scores, mask):
    raise NotImplementedError("your code here")


check(masked_softmax)

# %% [markdown]
# ### Exercise 4.2: scaled dot-product attention
# `attention(q, k, v, mask, d_model)` → the context `(B, H, T_q, d_v)`
# $= \mathrm{softmax}(q k^\top / \sqrt{d_k})\, v$, for `q (B, H, T_q, d_k)`, `k (B, H, T_k, d_k)`,
# `v (B, H, T_k, d_v)` and a bool `mask` broadcastable to `(B, H, T_q, T_k)`. `d_model` $= H d_k$
# is the width of the model the heads were cut from (the layer that calls this function has it
# at hand). Use your `masked_softmax`.

# %%
def attention(q, k, v, mask, d_model):
    raise NotImplementedError("your code here")


check(attention)

# %% [markdown]
# What a wrong answer looks like: a softmax with a -1e9 fill (correct wherever a row has an
# allowed key, so it passes the first case).

# %%
def masked_softmax(scores, mask):
    scores = np.where(mask, scores, -1e9)  # a finite fill: wrong on a row with no allowed key
    exp = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


check(masked_softmax)
