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
# # 2. Positional encodings: where each token stands
#
# Attention (chapter 4) compares every query with every key and averages the values: nothing
# in it knows which token came first. Shuffle the tokens of a sentence and each output is the
# same, only shuffled: "dog bites man" and "man bites dog" look alike. The model has to be
# told the positions, and the paper does it by **adding** to each token's embedding a vector
# that depends on its position alone:
#
# $$ \mathrm{PE}_{(pos,\, 2i)} = \sin\left(\frac{pos}{10000^{2i / d_{\text{model}}}}\right), \qquad
#    \mathrm{PE}_{(pos,\, 2i+1)} = \cos\left(\frac{pos}{10000^{2i / d_{\text{model}}}}\right). $$
#
# Each pair of columns $(2i, 2i+1)$ holds the sine and the cosine of one angle, which grows
# with the position at its own rate $\theta_i = 10000^{-2i / d_{\text{model}}}$: one radian per
# position for the first pair, slower and slower after it. The wavelengths run from $2\pi$ to
# $10000 \cdot 2\pi$ positions, a geometric progression, so that the fast pairs tell close
# positions apart and the slow ones far positions.
#
# The table is computed once, before any training, and has no parameters. Here it is in each
# backend, read from the files as this cell runs:

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

import numpy_impl
from transformer_course import agreement, check, each, show
from transformer_spec import Config, init_params

show("positional.py", "sinusoidal_table")

# %% [markdown]
# Three details. The angles are computed in float64 and only then cast: computed in float32,
# the entries of position 512 would be off by about $3 \cdot 10^{-5}$. An odd $d_{\text{model}}$
# has one sine column more than cosine columns. And `layout="halves"` is the same numbers in
# another order, every sine and then every cosine, as fairseq and Marian store them: a model
# trained with one layout, handed the other, sees vectors it has never seen, so the config says
# which (`sinusoid_layout`).
#
# ## The same table in all three backends
#
# The `tiny` preset: $d_{\text{model}} = 36$, 64 positions, in float64.

# %%
config = Config.preset("tiny")
tables = each(lambda b: b.call(b.impl.sinusoidal_table, config.max_len, config.d_model, "float64"))
agreement(tables)

# %% [markdown]
# A picture says more than the numbers. On the left, a larger table (100 positions,
# $d_{\text{model}} = 64$), one row per position; on the right, four of its columns as curves.
# Each column is a wave along the positions; column 0 turns fastest. From column 40 on, the
# angle moves less than a third of a radian over these 100 positions: those sine columns stay
# below 0.31, the cosine columns above 0.95.

# %%
big = numpy_impl.sinusoidal_table(100, 64, "float64")  # (positions, features)
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.1, 1]})
image = left.imshow(big, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
left.set_xlabel("feature (even: sin, odd: cos)")
left.set_ylabel("position")
fig.colorbar(image, ax=left)
for column in (0, 1, 10, 20, 40):
    kind = "sin" if column % 2 == 0 else "cos"
    right.plot(big[:, column], label=f"column {column} ({kind})")
right.set_xlabel("position")
right.legend(fontsize=8, loc="lower left")
fig.tight_layout()

# %% [markdown]
# ## Why sines and cosines: a shift is a rotation
#
# Read one pair of columns as a point $(\sin a, \cos a)$ on the unit circle, with
# $a = pos \cdot \theta_i$. Moving $k$ positions on adds $k \theta_i$ to the angle, and by the
# addition formulas
#
# $$ \sin(a + k\theta_i) = \sin a \cos k\theta_i + \cos a \sin k\theta_i, \qquad
#    \cos(a + k\theta_i) = \cos a \cos k\theta_i - \sin a \sin k\theta_i: $$
#
# the same $2 \times 2$ rotation, whatever the position. That is the paper's reason for the
# choice: $\mathrm{PE}_{pos+k}$ is a linear function of $\mathrm{PE}_{pos}$, so a layer can learn
# to look "three tokens back" once, for every position. A consequence is easy to see: the dot
# product of two positions' encodings depends only on how far apart they are,
#
# $$ \mathrm{PE}_{p} \cdot \mathrm{PE}_{q} = \sum_{i} \left(\sin p\theta_i \sin q\theta_i +
#    \cos p\theta_i \cos q\theta_i\right) = \sum_{i} \cos\left((p - q)\, \theta_i\right). $$
#
# On the left, every dot product of the `tiny` table: constant along each diagonal. On the
# right, its first row: largest at offset 0 ($d_{\text{model}} / 2 = 18$, the squared length
# of every row) and lower, though not steadily, further away (and the same for $q - p$ as for
# $p - q$: cosine is even).

# %%
table = tables["numpy"]  # (64, 36)
dots = table @ table.T  # (64, 64): PE_p . PE_q
offsets = np.subtract.outer(np.arange(64), np.arange(64))  # p - q
spread = max(np.ptp(dots[offsets == j]) for j in range(-63, 64))
print(f"the largest spread of PE_p . PE_q among pairs with the same p - q: {spread:.1e}")

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
image = left.imshow(dots, cmap="viridis")
left.set_xlabel("position q")
left.set_ylabel("position p")
fig.colorbar(image, ax=left, label="PE_p . PE_q")
right.plot(dots[0], marker=".")
right.set_xlabel("q (p = 0)")
right.set_ylabel("PE_0 . PE_q")
fig.tight_layout()

# %% [markdown]
# ## The module: rows from an offset
#
# The model holds the table as a constant (torch: a buffer that is not saved with the
# weights) and reads rows `offset .. offset + T - 1` of it. The offset is 0 for a whole
# sentence; while a model writes one token at a time, it is the number of tokens already
# written.

# %%
show("positional.py", "SinusoidalPositionalEncoding")

# %% [markdown]
# Four positions from offset 10, in every backend (no weights needed: the table is a function
# of the config), equal to rows 10 to 13 of the table above; and the answer each backend
# gives for positions past the table's end, where a NumPy or torch slice would silently return
# fewer rows, and so would a JAX slice with a fixed offset; with a traced offset (inside a
# compiled decoding step) JAX's `dynamic_slice` would silently return other rows (it moves the
# start back so that the slice fits):

# %%
rows = each(lambda b: b.call(b.impl.SinusoidalPositionalEncoding(config, "float64"), 4, 10))
display(agreement(rows))
print("equal to table[10:14]:", np.array_equal(rows["numpy"], table[10:14]))


def past_the_end(b):
    try:
        b.impl.SinusoidalPositionalEncoding(config, "float64")(4, 62)
    except ValueError as error:
        return f"ValueError: {error}"


for name, message in each(past_the_end).items():
    print(f"{name:6} {message}")

# %% [markdown]
# ## The learned table
#
# BERT and GPT-2 learn the table instead: one parameter vector per position, trained with
# the rest of the model (`positional="learned"`). The forward is the same slice of a table;
# only the table's origin differs:

# %%
show("positional.py", "LearnedPositionalEmbedding.__call__")

# %% [markdown]
# Learned rows can become whatever helps the model, but a position the training never
# reached has a row that nothing trained, and the table has no row at all past `max_len`; the
# sinusoids can be computed for any position. The BERT-like `tiny-bert` preset, its position
# rows built from the same random weights in every backend (they belong to the embedding
# block, chapter 3):

# %%
bert = Config.preset("tiny-bert")
bert_params = init_params(bert, seed=0, dtype="float64", component="embeddings")
learned = each(lambda b: b.call(b.build("Embeddings", bert, bert_params, "float64").position, 5, 2))
display(agreement(learned))
print("equal to rows 2..6 of the weight:", np.array_equal(learned["numpy"], bert_params["position.weight"][2:7]))

# %% [markdown]
# ## Rotary positions, in brief
#
# Llama and SmolLM2 add nothing to the embeddings (`positional="rotary"`). They take the
# rotation above and apply it where positions matter, to each head's queries and keys: the
# query at position $m$ is turned, pair of features by pair, by the angles $m \theta_i$, and the
# key at position $n$ by $n \theta_i$. With $R_m$ the rotation by $m$, the score is
# $(R_m q) \cdot (R_n k) = q \cdot (R_{n-m} k)$: it depends on the positions only through
# $m - n$, and attention sees relative positions. (The config's `rope_theta` is the base, 10000
# here, that the $\theta_i$ are powers of.) Chapter 15 treats it in full; here, one query and
# one key vector placed at every position $m, n$ from 0 to 63, in every backend, pairing the
# features as Llama does (`"halves"`, feature $i$ with feature $i + d_k / 2$):

# %%
d_k = 8
rng = np.random.default_rng(0)
q, k = rng.standard_normal(d_k), rng.standard_normal(d_k)


def rotary_scores(b):
    cos, sin = b.impl.rotary_tables(64, d_k, 10000.0, "float64")  # (64, d_k / 2) each
    q_at = b.impl.rotate_pairs(b.asarray(np.tile(q, (64, 1))), cos, sin, "halves")  # q at positions 0..63
    k_at = b.impl.rotate_pairs(b.asarray(np.tile(k, (64, 1))), cos, sin, "halves")
    return b.to_numpy(q_at @ k_at.T)  # (64, 64): q_m . k_n


scores = each(rotary_scores)
display(agreement(scores))
spread = max(np.ptp(scores["numpy"][offsets == j]) for j in range(-63, 64))
print(f"q_m . k_n: the largest spread among pairs with the same m - n: {spread:.1e}")
print(f"q_7 . k_3 = {scores['numpy'][7, 3]:.6f},  q_57 . k_53 = {scores['numpy'][57, 53]:.6f},  "
      f"q_3 . k_7 = {scores['numpy'][3, 7]:.6f}")  # fmt: skip

# %% [markdown]
# Four positions apart gives the same score at 7 and 3 as at 57 and 53; the other order,
# $m - n = -4$, another one.
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs and says what differs, and which classic mistake your
# answer matches when it matches one. The solutions are in `solutions/02_positional_encodings.py`.
#
# ### Exercise 2.1: the sinusoidal table
# `sinusoidal_table(max_len, d_model)` → `(max_len, d_model)`, float64:
# $\mathrm{PE}_{(pos, 2i)} = \sin(pos \cdot \theta_i)$, $\mathrm{PE}_{(pos, 2i+1)} = \cos(pos \cdot \theta_i)$,
# $\theta_i = 10000^{-2i / d_{\text{model}}}$, the paper's interleaved layout. One case has an odd
# $d_{\text{model}}$ (a sine column without its cosine).

# %%
def sinusoidal_table(max_len, d_model):
    raise NotImplementedError("your code here")


check(sinusoidal_table)

# %% [markdown]
# ### Exercise 2.2: moving the encodings along
# `shift_sinusoids(pe, offset)` → the shape of `pe` `(..., d)`, $d$ even: the encodings
# `offset` positions later, computed from `pe` alone by turning each pair of columns
# $(2i, 2i+1)$, read as $(\sin a, \cos a)$, by the angle $\mathrm{offset} \cdot \theta_i$ (the
# addition formulas above). No table: the map is linear, and the last case feeds it vectors
# that are not rows of any table. (The checker's answer is each backend's own rotary
# rotation, `rotate_pairs`, with the paper's frequencies.)

# %%
def shift_sinusoids(pe, offset):
    raise NotImplementedError("your code here")


check(shift_sinusoids)

# %% [markdown]
# What a wrong answer looks like: a table written with `np.concatenate`, all the sines and
# then all the cosines.

# %%
def sinusoidal_table(max_len, d_model):
    angles = np.arange(max_len)[:, None] / 10000.0 ** (np.arange(0, d_model, 2) / d_model)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)  # halves, not interleaved


check(sinusoidal_table)
