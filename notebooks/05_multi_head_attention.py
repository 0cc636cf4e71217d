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
# # 5. Multi-head attention: project, split into heads, attend, merge
#
# One attention (chapter 4) gives each query one weighted average. **Multi-head attention**
# runs $H$ of them side by side, each on its own learned projection of the input, so that one
# head can follow the previous word while another looks for the subject of the sentence:
#
# $$ \mathrm{head}_h = \mathrm{Attention}(X_q W^Q_h,\; X_k W^K_h,\; X_v W^V_h), \qquad
#    \mathrm{MultiHead} = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_H)\, W^O, $$
#
# with $W^Q_h, W^K_h, W^V_h \in \mathbb{R}^{d_{\text{model}} \times d_k}$, $d_k = d_{\text{model}} / H$
# and $W^O \in \mathbb{R}^{H d_k \times d_{\text{model}}}$. Nobody runs $H$ small products: the
# $H$ matrices $W^Q_h$ sit side by side in one $W^Q \in \mathbb{R}^{d_{\text{model}} \times H d_k}$
# (head $h$ owns columns $h d_k, \dots, (h+1) d_k - 1$), so one product projects every head
# at once, and a reshape cuts the result into heads:
#
# | step | shape |
# | --- | --- |
# | input $X$ | `(B, T, d_model)` |
# | $X W^Q + b^Q$ | `(B, T, H·d_k)` |
# | `split_heads`: reshape, then swap $T$ and $H$ | `(B, T, H, d_k)` → `(B, H, T, d_k)` |
# | attention, every head at once (chapter 4) | `(B, H, T_q, d_k)` |
# | `merge_heads`: swap back, then reshape | `(B, T_q, H, d_k)` → `(B, T_q, H·d_k)` |
# | $\cdot\, W^O + b^O$ | `(B, T_q, d_model)` |
#
# All weights here are stored `[in, out]`, as the paper writes $x W$ (torch's `nn.Linear`
# stores the transpose; the backends convert on the way in). Here are the two reshapes:

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

import numpy_impl
from transformer_course import agreement, check, each, show
from transformer_spec import Config, attention_to_heads, init_params

show("attention.py", "MultiHeadAttention.split_heads")

# %%
show("attention.py", "MultiHeadAttention.merge_heads")

# %% [markdown]
# ## Why the transpose
#
# A reshape never moves a number: it only re-reads the same memory with other axes. After the
# projection, memory holds position 0's features (all heads), then position 1's, and so on.
# Reshaping that straight to `(B, H, T, d_k)` cuts it into $H$ pieces in memory order; the
# right way reshapes to `(B, T, H, d_k)`, which is what memory holds, and *then* swaps the
# axes. With 3 positions and 2 heads of 2 features, the numbers naming where they came from:

# %%
T, H, d_k = 3, 2, 2
x = np.arange(T * H * d_k).reshape(1, T, H * d_k)  # (B, T, H * d_k): position t holds 4t .. 4t + 3
print("x[0], one row per position (head 0's features first, then head 1's):\n", x[0])
right = x.reshape(1, T, H, d_k).transpose(0, 2, 1, 3)  # (B, H, T, d_k)
wrong = x.reshape(1, H, T, d_k)
print("\nhead 0, reshape then transpose (its two features at every position):\n", right[0, 0])
print("\nhead 0, reshape alone (position 0's both heads, then half of position 1):\n", wrong[0, 0])

# %% [markdown]
# The wrong one has the right shape and runs; its "head 0" mixes two heads and two positions.
# Nothing fails: the model is just a different, worse function. `merge_heads` is the inverse,
# and the same mistake is possible in reverse.
#
# The layer's forward uses both, with the projections and the attention of chapter 4 between.
# (`show` takes one name for the three backends; torch calls a module's forward `forward`, the
# other two `__call__`, and `show(file, "Class.__call__")` reads torch's `forward` itself.)

# %%
show("attention.py", "MultiHeadAttention.__call__")  # torch's is its forward

# %% [markdown]
# `key_value` projects and splits the keys and values (while decoding it also joins them to a
# cache, a later chapter); `repeat_kv` is the identity here (one key/value head per query
# head) and comes back below.

# %%
show("attention.py", "MultiHeadAttention.key_value")

# %% [markdown]
# ## The same layer in all three backends
#
# The `tiny` preset: $d_{\text{model}} = 36$, $H = 3$ heads of $d_k = 12$. One set of weights
# (`init_params`, with random biases so that a forgotten bias shows), two sentences of six
# positions with the decoder mask of chapter 1, and each backend's `MultiHeadAttention` built
# from those weights.

# %%
config = Config.preset("tiny")
params = init_params(config, seed=0, dtype="float64", component="attention", nonzero_biases=True)
print({name: array.shape for name, array in params.items()})

PAD = 0
ids = np.array([[5, 7, 9, 4, 6, 2], [8, 3, 4, 1, PAD, PAD]])
mask = numpy_impl.make_decoder_mask(ids, PAD)  # (2, 1, 6, 6)
x = np.random.default_rng(1).standard_normal((2, 6, config.d_model))  # (B, T, d_model)


def self_attention(b, config, params):
    layer = b.build("MultiHeadAttention", config, params, "float64")
    return b.call(layer, x, x, x, mask, need_weights=True)  # (output (B, T, d_model), weights (B, H, T, T))


results = each(lambda b: self_attention(b, config, params))
display(agreement({name: output for name, (output, _) in results.items()}))
agreement({name: weights for name, (_, weights) in results.items()})

# %% [markdown]
# The outputs (first table) and the per-head weights (second) agree to float64's last bits.
# Each head has its own pattern over the same sentence (random weights: no head has learned
# anything yet, but each already looks somewhere else):

# %%
weights = results["numpy"][1]
fig, axes = plt.subplots(1, 3, figsize=(9.5, 3.2))
for head, axis in enumerate(axes):
    image = axis.imshow(weights[1, head], cmap="viridis", vmin=0, vmax=1)
    axis.set_title(f"ids {ids[1].tolist()}\nhead {head}", fontsize=9)
    axis.set_xlabel("key")
axes[0].set_ylabel("query")
fig.colorbar(image, ax=axes, shrink=0.8, label="weight")
plt.show()

# %% [markdown]
# ## The PyTorch tutorials' way: a list of heads
#
# The PyTorch tutorials write multi-head attention as the equation reads: a Python list of $H$
# heads, each with its own `Linear(d_model, d_k)` for q, k and v, their outputs concatenated,
# then $W^O$. That is the same function: head $h$'s matrices are columns $h d_k .. (h+1) d_k - 1$
# of the fused ones (`attention_to_heads` slices them). Each backend has both forms
# (`MultiHeadAttentionLoop` is the list); from the same weights they agree:

# %%
head_params = attention_to_heads(params, config)  # heads.0.w_q.weight (36, 12), ..., w_o.weight (36, 36)


def loop_minus_fused(b):
    loop = b.build("MultiHeadAttentionLoop", config, head_params, "float64")
    output, _ = b.call(loop, x, x, x, mask)
    fused = results[b.name][0]
    return np.abs(output - fused).max() / np.abs(fused).max()


for name, difference in each(loop_minus_fused).items():
    print(f"{name:6} list of {config.num_heads} heads vs one fused layer: max relative difference {difference:.1e}")

# %% [markdown]
# The fused layer does the projections in one large matrix product instead of $3H$ small ones:
# the same numbers, computed the way hardware likes them.
#
# ## Grouped-query attention: fewer key/value heads
#
# While generating text a model keeps every past position's keys and values (the cache of a
# later chapter); with many heads that cache is most of the memory. **Grouped-query
# attention** (Llama 2 70B and later, SmolLM2) gives keys and values only $H_{kv} < H$ heads,
# each shared by a *group* of $H / H_{kv}$ query heads: $W^K, W^V$ shrink to
# $d_{\text{model}} \times H_{kv} d_k$. Before the attention, each key/value head is repeated
# for its group. `repeat_kv` does it:

# %%
show("attention.py", "repeat_kv")

# %% [markdown]
# Query head $h$ reads key/value head $h \,//\, \text{groups}$: the copies of one head sit next
# to each other. `np.tile` would put them in the order $0, 1, 0, 1, \dots$ instead ($h \bmod H_{kv}$).
# Both have the right shape; only one is the model that was trained:

# %%
num_heads, num_kv_heads = 6, 2
groups = num_heads // num_kv_heads
kv_heads = np.arange(num_kv_heads)[None, :, None, None]  # (1, H_kv, 1, 1): each kv head holds its own number
orders = {
    "np.repeat (right)": numpy_impl.repeat_kv(kv_heads, groups),  # (1, H, 1, 1)
    "np.tile (wrong)": np.tile(kv_heads, (1, groups, 1, 1)),  # (1, H, 1, 1)
}
fig, axes = plt.subplots(1, 2, figsize=(7, 1.8))
for axis, (title, order) in zip(axes, orders.items(), strict=True):
    order = order[0, :, 0, 0]  # (H,): the kv head that each query head reads
    axis.imshow(order[None, :], cmap="Set2", vmin=0, vmax=7)
    for h, kv in enumerate(order):
        axis.text(h, 0, f"kv {kv}", ha="center", va="center", fontsize=9)
    axis.set_xticks(range(num_heads))
    axis.set_yticks([])
    axis.set_xlabel("query head")
    axis.set_title(title, fontsize=10)
fig.tight_layout()

# %% [markdown]
# Grouped-query attention is multi-head attention whose key/value heads come in identical
# groups. So a grouped layer must equal a plain multi-head layer whose $W^K$ and $W^V$ hold
# each key/value head's block of columns repeated $H / H_{kv}$ times, in the order above; the
# tiled order makes another model. Both checked in every backend:

# %%
gqa_config = config.replace(num_heads=num_heads, num_kv_heads=num_kv_heads)  # 6 query heads of d_k = 6, 2 kv heads
gqa_params = init_params(gqa_config, seed=2, dtype="float64", component="attention", nonzero_biases=True)
print("w_q", gqa_params["w_q.weight"].shape, " w_k", gqa_params["w_k.weight"].shape)
mha_config = gqa_config.replace(num_kv_heads=num_heads)


def widened(order):
    """The grouped layer's weights as a plain multi-head layer's: kv head blocks in ``order``."""
    d_model, d_k = gqa_config.d_model, gqa_config.d_k
    wide = dict(gqa_params)
    for name in ("w_k", "w_v"):
        blocks = gqa_params[f"{name}.weight"].reshape(d_model, num_kv_heads, d_k)  # (d_model, H_kv, d_k)
        wide[f"{name}.weight"] = blocks[:, order].reshape(d_model, num_heads * d_k)  # (d_model, H * d_k)
        wide[f"{name}.bias"] = gqa_params[f"{name}.bias"].reshape(num_kv_heads, d_k)[order].reshape(-1)
    return wide


def multi_head(order):
    return each(lambda b: self_attention(b, mha_config, widened(order))[0])


grouped = each(lambda b: self_attention(b, gqa_config, gqa_params)[0])
display(agreement(grouped))
for order_name, order in {"repeat": np.repeat(np.arange(2), groups), "tile": np.tile(np.arange(2), groups)}.items():
    wide = multi_head(order)
    gaps = ", ".join(f"{n} {np.abs(wide[n] - grouped[n]).max() / np.abs(grouped[n]).max():.1e}" for n in wide)
    print(f"kv heads in {order_name} order {order}: max |multi-head - grouped| / max |grouped|: {gaps}")

# %% [markdown]
# The agreement table is the grouped layer in the three backends. Below it, the multi-head
# layer with the kv blocks in `repeat` order gives the grouped layer's output to rounding; in
# `tile` order it is another function altogether. (Real grouped models, loaded from
# Hugging Face or GGUF files, are trained in the `repeat` order.)
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs and says what differs, and which classic mistake your
# answer matches when it matches one. The solutions are in `solutions/05_multi_head_attention.py`.
#
# ### Exercise 5.1: split into heads
# `split_heads(x, num_heads)` → `(B, H, T, d_k)`, for `x (B, T, H·d_k)`; head $h$ owns the
# features $h d_k, \dots, (h+1) d_k - 1$ of every position.

# %%
def split_heads(x, num_heads):
    raise NotImplementedError("your code here")


check(split_heads)

# %% [markdown]
# ### Exercise 5.2: merge the heads
# `merge_heads(x)` → `(B, T, H·d_k)`, for `x (B, H, T, d_k)`: the inverse of `split_heads`,
# the heads side by side along the features.

# %%
def merge_heads(x):
    raise NotImplementedError("your code here")


check(merge_heads)

# %% [markdown]
# ### Exercise 5.3: repeat the key/value heads
# `repeat_kv(x, groups)` → `(B, H_kv·groups, T, d_k)`, for `x (B, H_kv, T, d_k)`: each
# key/value head repeated for the `groups` query heads that share it (query head $h$ reads
# key/value head $h \,//\, \text{groups}$).

# %%
def repeat_kv(x, groups):
    raise NotImplementedError("your code here")


check(repeat_kv)

# %% [markdown]
# ### Exercise 5.4: the whole layer from its weights
# `multi_head_attention(query, key, value, mask, params, num_heads)` → `(B, T_q, d_model)`, for
# `query (B, T_q, d_model)`, `key` and `value (B, T_k, d_model)`, a bool `mask` broadcastable to
# `(B, H, T_q, T_k)` and `params` with the canonical names: `"w_q.weight"` `(d_model, H·d_k)`,
# `"w_k.weight"` and `"w_v.weight"` `(d_model, H_kv·d_k)`, `"w_o.weight"` `(H·d_k, d_model)`, and
# a `".bias"` for each; every weight stored `[in, out]` ($x W + b$). $d_k = d_{\text{model}} / H$,
# and $H_{kv}$ = `params["w_k.weight"].shape[1] // d_k` (fewer than $H$ in one of the cases).
# Use your three functions above, and for the attention your `attention` of chapter 4 or
# `numpy_impl.scaled_dot_product_attention(q, k, v, mask)[0]`.

# %%
def multi_head_attention(query, key, value, mask, params, num_heads):
    raise NotImplementedError("your code here")


check(multi_head_attention)

# %% [markdown]
# What a wrong answer looks like: a split by reshape alone.

# %%
def split_heads(x, num_heads):
    batch, seq_len, d_model = x.shape
    return x.reshape(batch, num_heads, seq_len, d_model // num_heads)  # the right shape, the wrong numbers


check(split_heads)
