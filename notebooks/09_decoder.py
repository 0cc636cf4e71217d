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
# # 9. The decoder: masked self-attention, cross-attention, feed-forward
#
# The decoder writes the output sentence one token at a time: at each position it predicts
# the next target token from the target tokens so far and from the whole source sentence. Its
# layer has three sub-layers, each in the residual connection of chapter 7. With $y$ the
# decoder's stream $(B, T_{\text{tgt}}, d_{\text{model}})$ and $m$ the encoder's output, the
# **memory** $(B, T_{\text{src}}, d_{\text{model}})$, in the paper's post-norm order:
#
# $$ a = \mathrm{LN}_1\big(y + \mathrm{MultiHead}(y, y, y;\, M_{\text{tgt}})\big), \qquad
#    c = \mathrm{LN}_2\big(a + \mathrm{MultiHead}(a, m, m;\, M_{\text{mem}})\big), \qquad
#    z = \mathrm{LN}_3\big(c + \mathrm{FFN}(c)\big). $$
#
# - **Masked self-attention**: the target attends to itself, with the causal AND padding mask
#   $M_{\text{tgt}}$, `(B, 1, T_tgt, T_tgt)`: position $i$ sees target positions $\le i$ only.
#   In training the whole target goes in at once, shifted right by a start token, and the mask
#   keeps position $i$ from reading token $i + 1$, the one it must predict.
# - **Cross-attention** (encoder-decoder attention): the queries come from the decoder, the
#   keys and values from the memory. Its scores $QK^\top$ are `(B, H, T_tgt, T_src)`: each
#   target position weighs every source position. Its mask $M_{\text{mem}}$ hides the
#   *source* padding, `(B, 1, 1, T_src)`, one row that every target position shares.
# - The **feed-forward network**, as in the encoder.
#
# The stack is the encoder's: $N$ layers, each fed the one before, every layer reading the same
# memory, and a final norm for pre-norm. A decoder-only language model (GPT, chapter 10's
# `TransformerLM`) has no encoder and no memory: its layer is the same minus cross-attention.
#
# The layer's parts, and its forward. Decoding a token at a time reuses the keys and values of
# earlier positions (`cache`, `position`: chapter 14); here `cache` is None and the whole
# target goes in at once.

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

import numpy_impl
from transformer_course import agreement, check, each, show
from transformer_spec import Config, init_params, param_schema

show("decoder.py", "DecoderLayer.__init__")

# %%
show("decoder.py", "DecoderLayer.__call__")

# %% [markdown]
# The stack passes the same memory and masks to every layer and collects two lists of
# attention weights, the self-attention's and the cross-attention's:

# %%
show("decoder.py", "Decoder.__call__")

# %% [markdown]
# ## The two masks
#
# The decoder's self-attention mask is chapter 1's decoder mask, with one exception: the
# encoder-decoder's target starts with a start token, and some models spell it with their pad
# id (Marian and T5 start decoding from their pad token). A mask that hides every key equal
# to `pad_id` would hide that start token too. `make_target_mask` keeps position 0 always:

# %%
show("masks.py", "make_target_mask")

# %% [markdown]
# A target that starts with its pad token (pad id 0, as Marian's start), then two words and
# two pads. Chapter 1's decoder mask hides the start token, so the first query has nothing to
# attend to; the target mask keeps it:

# %%
PAD = 0
marian_like = np.array([[PAD, 5, 6, PAD, PAD]])
for name in ("make_decoder_mask", "make_target_mask"):
    rows = getattr(numpy_impl, name)(marian_like, PAD)[0, 0].astype(int)  # (T, T)
    print(f"{name}, ids {marian_like[0].tolist()} (query rows, key columns):\n{rows}\n")

# %% [markdown]
# Cross-attention's mask is the source's padding mask. Its last axis is the *source* length,
# the keys; it broadcasts over the target positions, the queries:

# %%
show("masks.py", "make_cross_attention_mask")

# %% [markdown]
# ## One decoder, three backends, the same weights
#
# The `tiny` preset's decoder ($d_{\text{model}} = 36$, 3 heads, 2 layers, post-norm), one set of
# seeded weights with random biases and norms, three target sentences of 5 positions and three
# source sentences of 7, both padded, and random vectors standing in for the target embeddings
# and the memory (chapter 10 connects the real ones). Each backend builds its `Decoder` and
# returns the output and both kinds of attention weights:

# %%
config = Config.preset("tiny")
params = init_params(config, seed=0, dtype="float64", component="decoder", nonzero_biases=True)
tgt_ids = np.array([[1, 5, 6, 2, PAD], [1, 8, 3, 9, 4], [1, 7, PAD, PAD, PAD]])  # (B, T_tgt): 1 = start
src_ids = np.array([[4, 9, 7, 5, 3, PAD, PAD], [8, 2, 6, 3, 5, 9, 4], [6, 3, 8, PAD, PAD, PAD, PAD]])  # (B, T_src)
rng = np.random.default_rng(1)
x = rng.standard_normal((*tgt_ids.shape, config.d_model))  # (B, T_tgt, d_model)
memory = rng.standard_normal((*src_ids.shape, config.d_model))  # (B, T_src, d_model)


def run_decoder(b, x, memory):
    decoder = b.build("Decoder", config, params, "float64")
    tgt_mask = b.call(b.impl.make_target_mask, tgt_ids, PAD)  # (B, 1, T_tgt, T_tgt)
    memory_mask = b.call(b.impl.make_cross_attention_mask, src_ids, PAD)  # (B, 1, 1, T_src)
    return b.call(decoder, x, memory, tgt_mask, memory_mask, need_weights=True)


results = each(lambda b: run_decoder(b, x, memory))
output, _, self_weights, cross_weights = results["numpy"]
print(f"output {output.shape}, self-attention {self_weights[0].shape}, cross-attention {cross_weights[0].shape}")
display(agreement({name: out for name, (out, _, _, _) in results.items()}))
display(agreement({name: np.stack(weights) for name, (_, _, weights, _) in results.items()}))
agreement({name: np.stack(weights) for name, (_, _, _, weights) in results.items()})

# %% [markdown]
# The output, the self-attention weights and the cross-attention weights (the three tables)
# agree to float64's last bits in every backend. The cross-attention weights are rectangular:
# 5 target queries by 7 source keys.
#
# ## Where the decoder looks
#
# The first sentence (one pad at the end of the target, two at the end of the source), layer
# 0, every head: on top the self-attention over the target, below the cross-attention from
# the target to the source.

# %%
row = 0
fig, axes = plt.subplots(2, 3, figsize=(10, 6.2))
for head in range(config.num_heads):
    top, bottom = axes[0, head], axes[1, head]
    image = top.imshow(self_weights[0][row, head], cmap="viridis", vmin=0, vmax=1)
    top.set_title(f"self-attention, head {head}", fontsize=9)
    top.set_xticks(range(tgt_ids.shape[1]), tgt_ids[row], fontsize=8)
    top.set_yticks(range(tgt_ids.shape[1]), tgt_ids[row], fontsize=8)
    top.set_xlabel("target key", fontsize=8)
    bottom.imshow(cross_weights[0][row, head], cmap="viridis", vmin=0, vmax=1)
    bottom.set_title(f"cross-attention, head {head}", fontsize=9)
    bottom.set_xticks(range(src_ids.shape[1]), src_ids[row], fontsize=8)
    bottom.set_yticks(range(tgt_ids.shape[1]), tgt_ids[row], fontsize=8)
    bottom.set_xlabel("source key (the memory)", fontsize=8)
axes[0, 0].set_ylabel("target query (token id)")
axes[1, 0].set_ylabel("target query (token id)")
fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
plt.show()

# %% [markdown]
# On top, the causal triangle: the start token attends to itself alone (weight 1), the second
# position to two keys, and so on; the padded last key gets weight 0 even in its own row.
# Below, every target position may look at every real source position, before or after: the
# source sentence is there in full. The two padded source keys get weight 0 in every row.
#
# Both masks hold in every backend, and a test of each is a change that must change nothing.
# Change the target's last position: no earlier position may see it. Change the memory at
# the padded source positions: no position may see them.

# %%
later = x.copy()
later[:, -1] = 10.0 * rng.standard_normal((x.shape[0], config.d_model))  # a different last target token
padded_source = src_ids == PAD
noisy_memory = memory.copy()
noisy_memory[padded_source] = 100.0 * rng.standard_normal((int(padded_source.sum()), config.d_model))
for name, b in each(lambda b: b).items():
    before = results[name][0]
    after_later = run_decoder(b, later, memory)[0]
    after_noise = run_decoder(b, x, noisy_memory)[0]
    print(f"{name:6} a new last target token changes the earlier positions by "
          f"{np.abs(after_later[:, :-1] - before[:, :-1]).max():.1e} (the last one by "
          f"{np.abs(after_later[:, -1] - before[:, -1]).max():.1e}); "
          f"noise in the padded memory changes the output by {np.abs(after_noise - before).max():.1e}")  # fmt: skip

# %% [markdown]
# ## The cross-attention mask's shape
#
# A mask built from the *target* ids, the natural slip when a decoder has both at hand, has
# the target length on its last axis. Where the two lengths differ, every backend refuses it
# with the same message, naming the shape it expected:

# %%
first_layer = {name.removeprefix("layers.0."): value for name, value in params.items() if name.startswith("layers.0.")}


def wrong_memory_mask(b):
    layer = b.build("DecoderLayer", config, first_layer, "float64")
    tgt_mask = b.call(b.impl.make_target_mask, tgt_ids, PAD)
    from_the_target = b.call(b.impl.make_cross_attention_mask, tgt_ids, PAD)  # (B, 1, 1, T_tgt): wrong
    try:
        b.call(layer, x, memory, tgt_mask, from_the_target)
    except ValueError as error:
        return f"ValueError: {error}"
    return "accepted"


for name, message in each(wrong_memory_mask).items():
    print(f"{name:6} {message}")

# %% [markdown]
# Where the two lengths happen to be equal, the wrong mask has the right shape and nothing
# can refuse it: the model then hides the source positions where the *target* is padded, a
# quiet mistake (exercise 9.2 has that case).
#
# ## Without an encoder
#
# A decoder-only model's layer is the same class, built from a config whose `kind` is
# `"decoder_only"`: no cross-attention, no memory. Its weights are the encoder-decoder layer's
# minus the cross-attention's:

# %%
lm_config = config.replace(kind="decoder_only")
full, lm = param_schema(config, "decoder_layer"), param_schema(lm_config, "decoder_layer")
print(f"encoder-decoder layer: {len(full)} weights, {sum(np.prod(s) for s in full.values())} numbers")
print(f"decoder-only layer:    {len(lm)} weights, {sum(np.prod(s) for s in lm.values())} numbers")
print("only in the encoder-decoder's:", sorted(set(full) - set(lm)))

# %% [markdown]
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs and says what differs, and which classic mistake your
# answer matches when it matches one. The solutions are in `solutions/09_decoder.py`.
#
# ### Exercise 9.1: the target mask
# `target_mask(tgt_ids, pad_id)` → `(B, 1, T, T)`, bool: causal AND the key is not padding,
# except that position 0, the start token, is never hidden, even where it equals `pad_id`.

# %%
def target_mask(tgt_ids, pad_id):
    raise NotImplementedError("your code here")


check(target_mask)

# %% [markdown]
# ### Exercise 9.2: the cross-attention mask
# `cross_attention_mask(src_ids, tgt_ids, pad_id)` → `(B, 1, 1, T_src)`, bool: the decoder's
# queries (the target positions) may attend to every source position that is not padding.

# %%
def cross_attention_mask(src_ids, tgt_ids, pad_id):
    raise NotImplementedError("your code here")


check(cross_attention_mask)

# %% [markdown]
# ### Exercise 9.3: one decoder layer
# `decoder_layer(x, memory, tgt_mask, memory_mask, parts, norm_first)` → `(B, T_tgt, d_model)`,
# for `x (B, T_tgt, d_model)`, `memory (B, T_src, d_model)`, `tgt_mask (B, 1, T_tgt, T_tgt)` and
# `memory_mask (B, 1, 1, T_src)`: masked self-attention, cross-attention, feed-forward, each in
# a residual connection, post-norm (`norm_first=False`) or pre-norm. `parts["self_attn"]` and
# `parts["cross_attn"]` are called `(query, key, value, mask)`; `parts["ffn"]`,
# `parts["self_attn_norm"]`, `parts["cross_attn_norm"]` and `parts["ffn_norm"]` are called on
# one array; each returns one array.

# %%
def decoder_layer(x, memory, tgt_mask, memory_mask, parts, norm_first):
    raise NotImplementedError("your code here")


check(decoder_layer)

# %% [markdown]
# What a wrong answer looks like: the target mask built as chapter 1's decoder mask. Right
# when the start token is not the pad token (the first case), wrong for Marian's:

# %%
def target_mask(tgt_ids, pad_id):
    causal = np.tril(np.ones((tgt_ids.shape[1],) * 2, dtype=bool))
    return (tgt_ids != pad_id)[:, None, None, :] & causal  # hides a start token equal to pad_id


check(target_mask)
