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
# # 8. The encoder: self-attention and feed-forward, layer after layer
#
# The encoder reads a whole sentence at once and turns each position's vector into one that
# depends on every other position: $(B, T, d_{\text{model}})$ in, the same shape out. It is a
# stack of $N$ identical **encoder layers** (identical in shape; each has its own weights). A
# layer is the parts of the last three chapters in a fixed order: **self-attention** (every
# position's query against every position's key, chapter 5), then the **feed-forward network**
# (each position alone, chapter 6), each inside the residual connection of chapter 7. In the
# paper's post-norm order, with $M$ the padding mask of chapter 1:
#
# $$ h = \mathrm{LayerNorm}_1\big(x + \mathrm{MultiHead}(x, x, x;\, M)\big), \qquad
#    y = \mathrm{LayerNorm}_2\big(h + \mathrm{FFN}(h)\big), $$
#
# and in pre-norm order (GPT-2, and most models since):
#
# $$ h = x + \mathrm{MultiHead}\big(\bar x, \bar x, \bar x;\, M\big),\ \bar x = \mathrm{LayerNorm}_1(x), \qquad
#    y = h + \mathrm{FFN}\big(\mathrm{LayerNorm}_2(h)\big). $$
#
# The stack feeds each layer the one before: $x^{(0)}$ is the embeddings (chapter 3),
# $x^{(l)} = \mathrm{Layer}_l(x^{(l-1)})$ for $l = 1, \dots, N$, and the output is $x^{(N)}$, or
# $\mathrm{LayerNorm}_f(x^{(N)})$ for a pre-norm stack (chapter 7 showed why it needs one). The
# mask is the padding mask, `(B, 1, 1, T)`: no causal mask, so every position sees the whole
# sentence, left and right (what BERT calls *bidirectional*).
#
# A layer's parts, and their names (the names of its weights, `self_attn.w_q.weight`, ...):

# %%
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

from transformer_course import agreement, check, each, relative_difference, show
from transformer_spec import Config, init_params

show("encoder.py", "EncoderLayer.__init__")

# %% [markdown]
# Its forward: the two sub-layers through `sublayer_connection` (chapter 7), the attention
# weights passed out when asked for (`need_weights`). `record` marks intermediates for the
# trace below; it does nothing otherwise.

# %%
show("encoder.py", "EncoderLayer.__call__")

# %% [markdown]
# The stack: a list of layers (an `nn.ModuleList` in torch and an `nnx.List` in Flax, so that
# the framework finds their weights) and the final norm where the config asks for one
# (`encoder_final_norm`, which follows `norm_first` unless set):

# %%
show("encoder.py", "Encoder.__init__")

# %%
show("encoder.py", "Encoder.__call__")

# %% [markdown]
# ## One encoder, three backends, the same weights
#
# The `tiny` preset: $d_{\text{model}} = 36$, $H = 3$ heads, $d_{ff} = 37$, $N = 2$ layers,
# post-norm. One set of weights (`init_params` for the component `"encoder"`, random biases
# and norms so that a forgotten one shows), three sentences with their padding mask, and
# random vectors standing in for the embeddings (chapter 10 puts the real ones in front).
# Each backend builds its own `Encoder` from the same weights and returns the output, the
# hidden states (the input and each layer's output) and each layer's attention weights:

# %%
config = Config.preset("tiny")
params = init_params(config, seed=0, dtype="float64", component="encoder", nonzero_biases=True)
print(f"{len(params)} weights, e.g. {list(params)[:3]} ...")

PAD = config.pad_id
ids = np.array([[5, 7, 9, 4, 6, PAD, PAD], [3, 8, 2, 6, 1, 9, 4], [PAD, PAD, PAD, 8, 5, 2, 7]])
x = np.random.default_rng(1).standard_normal((*ids.shape, config.d_model))  # (B, T, d_model)


def run_encoder(b, x):
    encoder = b.build("Encoder", config, params, "float64")
    mask = b.call(b.impl.make_padding_mask, ids, PAD)  # (B, 1, 1, T)
    return b.call(encoder, x, mask, need_weights=True, need_hidden_states=True)


results = each(lambda b: run_encoder(b, x))
output, hidden_states, attentions = results["numpy"]
print(f"output {output.shape}, {len(hidden_states)} hidden states, {len(attentions)} attention maps "
      f"{attentions[0].shape}")  # fmt: skip
display(agreement({name: out for name, (out, _, _) in results.items()}))
agreement({name: np.stack(weights) for name, (_, _, weights) in results.items()})

# %% [markdown]
# The outputs (first table) and both layers' attention weights (second) agree to float64's
# last bits. Not only the ends: `trace_model` runs a module's forward once and keeps every
# intermediate that the modules `record`, under its path in the module tree (the same path as
# its weights). Each backend's trace, against NumPy's:

# %%
def trace(b):
    encoder = b.build("Encoder", config, params, "float64")
    mask = b.asarray(ids != PAD)[:, None, None, :]  # (B, 1, 1, T)
    return b.impl.trace_model(encoder, b.asarray(x), mask)


traces = each(trace)
print(f"{'intermediate':32} {'shape':16} {'jax':>8} {'torch':>8}   (max |x - numpy| / max |numpy|)")
for name, value in traces["numpy"].items():
    gaps = [relative_difference(traces[b][name], value) for b in ("jax", "torch")]
    print(f"{name:32} {str(value.shape):16} {gaps[0]:8.1e} {gaps[1]:8.1e}")

# %% [markdown]
# Read down the list and you read the layer: $q, k, v$ split into heads, the scores, the
# weights, the context, the projected output, the norm of the sum (post-norm: the norm comes
# after the sub-layer), then the same for the feed-forward network. Every intermediate agrees;
# when a port goes wrong, this list says where (chapter 17 uses it so).
#
# ## Where each layer looks
#
# Each layer has its own attention, and each head its own pattern. The third sentence, which
# starts with three pads, in both layers and all heads (queries down, keys across):

# %%
row = 2
fig, axes = plt.subplots(2, 3, figsize=(9, 6))
for layer, layer_axes in enumerate(axes):
    for head, axis in enumerate(layer_axes):
        image = axis.imshow(attentions[layer][row, head], cmap="viridis", vmin=0, vmax=1)
        axis.set_title(f"layer {layer}, head {head}", fontsize=9)
        axis.set_xticks(range(ids.shape[1]), ids[row], fontsize=8)
        axis.set_yticks(range(ids.shape[1]), ids[row], fontsize=8)
    layer_axes[0].set_ylabel("query (token id)")
for axis in axes[1]:
    axis.set_xlabel("key (token id)")
fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
plt.show()

# %% [markdown]
# The first three columns are dark (weight 0) in every panel: no query attends to a padded key. The
# first three *rows*, the padded queries, still attend to the real keys: nothing stops a pad
# from looking, and its output is computed like any other, but nothing ever reads it (the
# loss skips padding, and no real query attends to it). The weights are random, so the
# patterns mean nothing yet; a trained encoder's heads look at the previous word, the next
# one, the end of the sentence.
#
# Since no real query reads a pad, what the padded positions hold cannot change the real
# positions' outputs. Put large random vectors there instead, in every backend:

# %%
real = ids != PAD  # (B, T)
noisy = x.copy()
noisy[~real] = 100.0 * np.random.default_rng(2).standard_normal((int((~real).sum()), config.d_model))
for name, (before, _, _) in results.items():
    after = run_encoder(each(lambda b: b)[name], noisy)[0]
    change = np.abs(after - before)
    print(f"{name:6} largest change: at the real positions {change[real].max():.1e}, "
          f"at the padded ones {change[~real].max():.1e}")  # fmt: skip

# %% [markdown]
# Exactly zero at the real positions: the masked keys get weight 0, not a small weight, so
# their values never enter the sum.
#
# ## The stream through the stack, and the final norm
#
# The hidden states are the residual stream between layers. Post-norm normalises it at the
# end of every layer; pre-norm only adds to it, so it grows with depth, and the stack's last
# step is its final norm (chapter 7 showed the same with feed-forward sub-layers alone). The
# root mean square of the real positions' vectors, layer after layer, for six-layer stacks of
# both kinds (weights as `init_params` makes them: norms of weight 1 and bias 0):

# %%
def run_deep(b, deep, deep_params):
    encoder = b.build("Encoder", deep, deep_params, "float64")
    mask = b.call(b.impl.make_padding_mask, ids, PAD)
    return b.call(encoder, x, mask, need_hidden_states=True)


fig, axis = plt.subplots(figsize=(6.5, 3.2))
for norm_first, label in [(False, "post-norm (the paper)"), (True, "pre-norm")]:
    deep = config.replace(num_encoder_layers=6, norm_first=norm_first)
    deep_params = init_params(deep, seed=3, dtype="float64", component="encoder")
    deep_results = each(lambda b: run_deep(b, deep, deep_params))  # noqa: B023 - called at once, in this pass
    print(f"{label}, final norm: {deep.encoder_final_norm}; the output in every backend:")
    display(agreement({name: out for name, (out, _, _) in deep_results.items()}))
    deep_output, deep_hidden, _ = deep_results["numpy"]
    rms = [np.sqrt((h[real] ** 2).mean()) for h in deep_hidden]
    line = axis.plot(range(len(rms)), rms, marker="o", label=label)[0]
    final = np.sqrt((deep_output[real] ** 2).mean())  # the stack's output: after the final norm, if any
    axis.plot([len(rms) - 1, len(rms)], [rms[-1], final], linestyle="--", color=line.get_color())
    axis.plot(len(rms), final, marker="*" if norm_first else "D", markersize=13 if norm_first else 9,
              markerfacecolor="none" if not norm_first else line.get_color(), color=line.get_color())  # fmt: skip
axis.set_xticks(range(8), ["input", *range(1, 7), "output"])
axis.set_xlabel("after layer")
axis.set_ylabel("rms of the real positions")
axis.legend()
fig.tight_layout()

# %% [markdown]
# The post-norm stream stays at the norm's scale from the first layer on, and its output is
# its last layer's (the flat dashed line: no final norm). The pre-norm stream grows layer
# after layer, and only the final norm (the dashed drop to the star) brings it back to the
# scale the next part of the model expects. Forget that norm and nothing fails; the model is
# just another, badly scaled, function.
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs and says what differs, and which classic mistake your
# answer matches when it matches one. The solutions are in `solutions/08_encoder.py`.
#
# ### Exercise 8.1: one encoder layer
# `encoder_layer(x, mask, parts, norm_first)` → `(B, T, d_model)`, for `x (B, T, d_model)` and
# a bool padding `mask (B, 1, 1, T)` (True = may attend): self-attention, then the
# feed-forward network, each in a residual connection, post-norm (`norm_first=False`) or
# pre-norm. `parts` holds the layer's four parts as functions, built from its weights:
# `parts["self_attn"](query, key, value, mask)`, `parts["ffn"](h)`, `parts["self_attn_norm"](h)`
# and `parts["ffn_norm"](h)`, each returning one `(B, T, d_model)` array.

# %%
def encoder_layer(x, mask, parts, norm_first):
    raise NotImplementedError("your code here")


check(encoder_layer)

# %% [markdown]
# ### Exercise 8.2: the stack
# `encoder_stack(x, mask, layers, final_norm, norm_first)` → `(B, T, d_model)`: each of the
# functions `layers[l](x, mask)` (one encoder layer each, returning `(B, T, d_model)`) in turn,
# then `final_norm(x)`, a LayerNorm, where the stack needs one: when `norm_first` (pre-norm).

# %%
def encoder_stack(x, mask, layers, final_norm, norm_first):
    raise NotImplementedError("your code here")


check(encoder_stack)

# %% [markdown]
# What a wrong answer looks like: a stack that never applies its final norm. It is right for
# the paper's post-norm stack (the first case) and wrong for the pre-norm one:

# %%
def encoder_stack(x, mask, layers, final_norm, norm_first):
    for layer in layers:
        x = layer(x, mask)
    return x  # no final norm, even for pre-norm


check(encoder_stack)
