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
# # 3. Embeddings: from token ids to vectors
#
# A tokenizer turns text into integers, the **token ids**, one per word or piece of a word.
# The model's first layer turns each id into a vector of $d_{\text{model}}$ numbers: it looks up
# row $\mathrm{id}$ of a learned table $E \in \mathbb{R}^{V \times d_{\text{model}}}$ ($V$ the
# vocabulary size). A lookup is the same as multiplying a one-hot vector by $E$, only without
# the $V - 1$ multiplications by zero. The paper then multiplies the row by
# $\sqrt{d_{\text{model}}}$ and adds the positional encoding of chapter 2:
#
# $$ x_t = E_{\mathrm{id}_t} \cdot \sqrt{d_{\text{model}}} + \mathrm{PE}_t. $$
#
# BERT adds a third lookup, the **token type** (segment) of each position, sentence A or
# sentence B, and normalises the sum; Llama adds nothing at all (its positions are rotations
# inside attention). Here is the lookup in each backend, read from the files as this cell runs
# (NumPy's also has its hand-written backward):

# %%
import math

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

import numpy_impl
from transformer_course import agreement, check, each, show
from transformer_spec import Config, init_params

show("embeddings.py", "TokenEmbedding")

# %% [markdown]
# `weight[ids]` does the whole lookup: an integer array of shape `(B, T)` indexing the first
# axis of a `(V, d_model)` table gives `(B, T, d_model)`. The table is called `weight` in every
# backend (torch's `nn.Embedding` also calls it so; Flax's `nnx.Embed` calls it `embedding`
# and looks up with `jnp.take`, whose default mode `"fill"` gives a row of NaN for an id
# $\geq V$ and wraps a negative id, -1 to the last row; only plain `weight[ids]` indexing in
# JAX clamps an id past the end to the last row. The backends do not use `nnx.Embed`).
#
# ## The same lookup in all three backends
#
# The lookup lives inside the embedding block (below), which can be switched down to the
# lookup alone: no positions, no token types, no norm. The `tiny` preset
# ($V = 53$, $d_{\text{model}} = 36$, scaled), its table drawn as the paper's models draw it,
# with standard deviation $d_{\text{model}}^{-1/2}$:

# %%
config = Config.preset("tiny")
lookup_only = config.replace(positional="none")
params = init_params(lookup_only, seed=0, dtype="float64", component="embeddings")
print({name: array.shape for name, array in params.items()})
ids = np.array([[5, 7, 9, 4, 6], [3, 3, 8, 1, 52]])  # (B, T): two sentences of five tokens
looked_up = each(lambda b: b.call(b.build("Embeddings", lookup_only, params, "float64"), ids))
agreement(looked_up)

# %% [markdown]
# The three agree exactly (a lookup and one multiplication). The same numbers as a one-hot
# matrix product, the way the lookup is written on paper:

# %%
one_hot = np.eye(53)[ids]  # (B, T, V): a single 1 per position, in the column of its id
product = one_hot @ params["token.weight"] * math.sqrt(config.d_model)  # (B, T, d_model)
print("one-hot @ E * sqrt(d_model) equals the lookup:", np.allclose(product, looked_up["numpy"], rtol=0, atol=1e-15))

# %% [markdown]
# An id outside the vocabulary is refused with the same message in every backend (indexing
# would fail in NumPy and torch with another message, and in JAX would silently return the
# last row):

# %%
def out_of_vocabulary(b):
    try:
        b.build("Embeddings", lookup_only, params, "float64")(b.asarray(np.array([[3, 53]])))
    except ValueError as error:
        return f"ValueError: {error}"


for name, message in each(out_of_vocabulary).items():
    print(f"{name:6} {message}")

# %% [markdown]
# ## Why $\sqrt{d_{\text{model}}}$
#
# The paper's models draw $E$ with standard deviation $d_{\text{model}}^{-1/2}$ (so its rows
# have length about 1, which suits the output projection when the two share the matrix:
# `tie_output`). A positional encoding's entries are sines and cosines, of root mean square
# $1/\sqrt{2} \approx 0.71$ whatever $d_{\text{model}}$ is. Added as they are, at the paper's
# $d_{\text{model}} = 512$, the token's entries would be about 16 times smaller than the
# position's, and the sum would say mostly *where* a token is, not *which* it is. Multiplied
# by $\sqrt{d_{\text{model}}}$, they have standard deviation 1, the positions' size. Below, the
# entries of 100 token rows of the `base` preset (the paper's sizes, a vocabulary cut to 100)
# and of its first 100 positions:

# %%
base = Config.preset("base").replace(src_vocab_size=100, tgt_vocab_size=100)
table = init_params(base, seed=0, dtype="float64", component="embeddings")["token.weight"]  # (100, 512)
positions = numpy_impl.sinusoidal_table(100, base.d_model, "float64")  # (100, 512)
entries = {
    "token row (std 512^-1/2)": table.ravel(),
    "token row * sqrt(512)": table.ravel() * math.sqrt(base.d_model),
    "positional encoding": positions.ravel(),
}
fig, axis = plt.subplots(figsize=(7, 3.2))
for label, values in entries.items():
    axis.hist(values, bins=np.linspace(-3.5, 3.5, 141), histtype="step", density=True, label=label)
    print(f"{label:26} root mean square {np.sqrt(np.mean(values**2)):.3f}")
axis.set_xlabel("entry")
axis.set_ylabel("density")
axis.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# Unscaled, the token rows are the narrow spike at 0; scaled, they spread as widely as the
# positions (whose entries pile up near $-1$ and $1$, where a sine or cosine turns, and at 0
# and 1, the slow columns of chapter 2).
# BERT, GPT-2 and Llama do not scale (`scale_embeddings=False`): they draw their tables with a
# standard deviation of 0.02 and learn their positions, or add none, so there is nothing to
# balance.
#
# ## The embedding block: token, position, token type, norm
#
# The block that every model starts with adds what its config asks for, then applies dropout
# (the identity outside training):

# %%
show("embeddings.py", "Embeddings.__call__")

# %% [markdown]
# Three models, three blocks: the paper's (`tiny`: scaled lookup plus sinusoids), BERT's
# (`tiny-bert`: lookup, learned positions and token types, then LayerNorm with
# $\epsilon = 10^{-12}$) and Llama's (`tiny-llama`: the lookup alone). Each built in every
# backend from the same weights (random norm parameters, so that a forgotten one shows), and
# run on the same ids:

# %%
presets = {"tiny": np.array([[5, 7, 9, 4, 6]]), "tiny-bert": np.array([[2, 17, 9, 3, 30, 4, 3]]),
           "tiny-llama": np.array([[5, 60, 9]])}  # fmt: skip
token_types = np.array([[0, 0, 0, 0, 1, 1, 1]])  # BERT: sentence A is 4 tokens long, sentence B 3


def embed(b, preset, weights, preset_ids):
    block = b.build("Embeddings", preset, weights, "float64")
    return b.call(block, preset_ids, token_types) if preset.type_vocab_size else b.call(block, preset_ids)


for name, preset_ids in presets.items():
    preset = Config.preset(name)
    weights = init_params(preset, seed=1, dtype="float64", component="embeddings", nonzero_biases=True)
    print(f"{name}: positional={preset.positional!r}, scale_embeddings={preset.scale_embeddings}, "
          f"weights {sorted(weights)}")  # fmt: skip
    display(agreement(each(lambda b, preset=preset, weights=weights, ids=preset_ids: embed(b, preset, weights, ids))))

# %% [markdown]
# Each block records what it adds up (the trace that `transformer-ref trace` prints), so the
# parts of BERT's sum can be looked at one by one. For the sentence pair above, one row per
# position:

# %%
bert = Config.preset("tiny-bert")
bert_weights = init_params(bert, seed=1, dtype="float64", component="embeddings", nonzero_biases=True)
block = numpy_impl.from_params(numpy_impl.Embeddings, bert, bert_weights, "float64")
parts = numpy_impl.trace_model(block, presets["tiny-bert"], token_types)
print({name: value.shape for name, value in parts.items()})

panels = {"token": parts["token"][0], "position": parts["position"], "token type": parts["token_type"][0],
          "LayerNorm(sum)": parts["output"][0]}  # fmt: skip
fig, axes = plt.subplots(1, 4, figsize=(12, 2.6))
for axis, (title, values) in zip(axes, panels.items(), strict=True):
    limit = np.abs(values).max()
    axis.imshow(values, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
    axis.set_title(f"{title} (|max| {limit:.2f})", fontsize=9)
    axis.set_xlabel("feature")
axes[0].set_ylabel("position")
fig.tight_layout()

# %% [markdown]
# The token-type panel has two distinct rows: one for the four positions of sentence A, the
# other for the three of sentence B. In the token panel, positions 3 and 6 hold the same id, 3,
# and so the same row; the position panel tells them apart. The three tables are drawn with standard deviation 0.02;
# the LayerNorm brings the sum to mean 0 and standard deviation 1 per position (then scales
# and shifts it by its own weights), so its output is some 50 times larger than each part.
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs and says what differs, and which classic mistake your
# answer matches when it matches one. The solutions are in `solutions/03_embeddings.py`.
#
# ### Exercise 3.1: the token lookup
# `embed_tokens(ids, weight, config)` → `(B, T, d_model)`: the rows of `weight` `(V, d_model)`
# that `ids` `(B, T)` name, multiplied by $\sqrt{d_{\text{model}}}$ where
# `config.scale_embeddings` is True (the paper), as they are where it is False (BERT). `config`
# is a `Config`: `config.d_model`, `config.num_heads`, `config.d_k`, `config.scale_embeddings`.

# %%
def embed_tokens(ids, weight, config):
    raise NotImplementedError("your code here")


check(embed_tokens)

# %% [markdown]
# ### Exercise 3.2: BERT's embeddings
# `bert_embeddings(ids, token_type_ids, params, eps)` → `(B, T, d_model)`: the sum of three
# lookups, `params["token.weight"][ids]`, the rows of positions $0 .. T-1$ of
# `params["position.weight"]`, and `params["token_type.weight"][token_type_ids]`, then a
# LayerNorm over the last axis with `params["norm.weight"]` ($\gamma$) and
# `params["norm.bias"]` ($\beta$):
# $(x - \mu) / \sqrt{\sigma^2 + \epsilon} \cdot \gamma + \beta$, with $\mu$ and $\sigma^2$ the
# mean and the (biased) variance of the $d_{\text{model}}$ features of each position (chapter 7
# treats it in full).

# %%
def bert_embeddings(ids, token_type_ids, params, eps):
    raise NotImplementedError("your code here")


check(bert_embeddings)

# %% [markdown]
# What a wrong answer looks like: the scale of the attention scores, $\sqrt{d_k}$, used for
# the embedding.

# %%
def embed_tokens(ids, weight, config):
    scale = math.sqrt(config.d_k) if config.scale_embeddings else 1.0  # d_k = d_model / H: the wrong width
    return weight[ids] * scale


check(embed_tokens)
