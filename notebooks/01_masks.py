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
# # 1. Masks: which key each query may attend to
#
# Attention compares every query with every key. A **mask** says which of those pairs count:
# a boolean array that broadcasts against the attention scores, of shape
# `(B, H, T_q, T_k)` (batch, heads, queries, keys). In this project **True means *may attend***,
# as in `torch.nn.functional.scaled_dot_product_attention` and Flax; `torch.nn.Transformer` and
# `nn.MultiheadAttention` read it the other way round (True = *hidden*), the most common way to
# get a mask wrong when porting code.
#
# Three masks cover every model of the course:
#
# - **padding**: a batch holds sentences of different lengths, filled up with a pad token; no
#   query may look at a padded key. Shape `(B, 1, 1, T)`: one row that every head and every
#   query shares.
# - **causal**: a language model predicts token $t+1$ from tokens $0..t$, so position $i$ may
#   look at positions $j \le i$ only:
#   $$ M_{ij} = [\, j \le i \,], \qquad \text{shape } (1, 1, T, T). $$
# - **decoder**: both at once, causal AND not padding, `(B, 1, T, T)`.
#
# Each backend writes them in one or two lines; here they are, read from the files as this
# cell runs (change a file, re-run the cell, and you see your change).

# %%
import matplotlib.pyplot as plt
import numpy as np

from transformer_course import agreement, check, each, show

show("masks.py", "make_causal_mask")

# %%
show("masks.py", "make_padding_mask")

# %%
show("masks.py", "make_decoder_mask")

# %% [markdown]
# ## The same masks from all three backends
#
# A batch of three sentences with pad id 0: the first padded on the right, the second not at
# all, the third on the left (as decoding a batch of prompts pads them). `each` runs the same
# call in every installed backend, NumPy in and NumPy out.

# %%
PAD = 0
ids = np.array([[5, 7, 9, PAD, PAD], [3, 4, 8, 6, 2], [PAD, PAD, 1, 2, 3]])
masks = each(lambda b: b.call(b.impl.make_decoder_mask, ids, PAD))
for name, mask in masks.items():
    print(f"{name:6} shape {mask.shape} dtype {mask.dtype}")
agreement({name: mask.astype(float) for name, mask in masks.items()})

# %% [markdown]
# The three are equal element for element. A picture says more than the booleans: each panel
# is one sentence's `(T, T)` mask, queries down, keys across; white = may attend.

# %%
fig, axes = plt.subplots(1, 3, figsize=(9, 3))
for row, axis in enumerate(axes):
    axis.imshow(masks["numpy"][row, 0], cmap="gray", vmin=0, vmax=1)
    axis.set_title(f"ids {ids[row].tolist()}", fontsize=9)
    axis.set_xlabel("key")
    axis.set_ylabel("query")
fig.tight_layout()

# %% [markdown]
# The third sentence starts with two pads: its first two queries may attend to nothing at all.
# Their softmax would be 0/0; chapter 4 shows how each backend turns that row into zeros
# instead of NaN. Such a row is never read (it belongs to a pad), but a NaN in it would
# still spread through the next matrix product.
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs and says what differs, and which classic mistake your
# answer matches when it matches one. The solutions are in `solutions/01_masks.py`.
#
# ### Exercise 1.1: the causal mask
# `causal_mask(seq_len)` → shape `(1, 1, T, T)`, bool, True where the query may attend to the key.

# %%
def causal_mask(seq_len):
    raise NotImplementedError("your code here")


check(causal_mask)

# %% [markdown]
# ### Exercise 1.2: the padding mask
# `padding_mask(ids, pad_id)` → shape `(B, 1, 1, T)`, bool: True for every key that is not padding.
# Padding is whatever `pad_id` says: the cases pad with 0 and with 1 (where 0 is a word).

# %%
def padding_mask(ids, pad_id):
    raise NotImplementedError("your code here")


check(padding_mask)

# %% [markdown]
# ### Exercise 1.3: the decoder mask
# `decoder_mask(ids, pad_id)` → shape `(B, 1, T, T)`, bool: causal AND the key is not padding.

# %%
def decoder_mask(ids, pad_id):
    raise NotImplementedError("your code here")


check(decoder_mask)

# %% [markdown]
# What a wrong answer looks like: the polarity of `torch.nn.Transformer`'s masks.

# %%
def causal_mask(seq_len):
    return np.triu(np.ones((seq_len, seq_len), dtype=bool), k=1)[None, None]  # True = hidden: wrong here


check(causal_mask)
