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
# # 10. The three models: encoder-decoder, BERT-style encoder, decoder-only LM
#
# Every part is built: embeddings (chapter 3), the encoder (chapter 8), the decoder (chapter
# 9). A model puts them in a row, builds the masks from the token ids, and, when it predicts
# tokens, ends with the **output projection** (the *generator*), from $d_{\text{model}}$ to one
# score, a *logit*, per word of the vocabulary. Three arrangements cover the course:
#
# - **`Transformer`**, the paper's encoder-decoder (translation): the source ids go through
#   the encoder into the memory $m$; the target ids (shifted right) through the decoder, which
#   reads $m$; then the projection:
#   $$ m = \mathrm{Encoder}\big(\mathrm{Embed}_{\text{src}}(x)\big), \qquad
#      h = \mathrm{Decoder}\big(\mathrm{Embed}_{\text{tgt}}(y),\, m\big), \qquad
#      \mathrm{logits} = h\, W_{\text{out}} + b_{\text{out}} \in \mathbb{R}^{B \times T_{\text{tgt}} \times V}. $$
# - **`TransformerEncoderModel`**, BERT-style: the encoder alone, returning a vector per
#   position (and, for BERT, a *pooled* vector of the first token); a task puts its own head on
#   top.
# - **`TransformerLM`**, decoder-only (GPT, Llama): the decoder without cross-attention, under
#   the causal mask, predicting token $t + 1$ from tokens $0..t$:
#   $\mathrm{logits} = \mathrm{Decoder}(\mathrm{Embed}(x))\, W_{\text{out}} + b_{\text{out}}$.
#
# **Tied output** (section 3.4 of the paper, and GPT-2, SmolLM2): the projection reuses the
# target embedding table $E \in \mathbb{R}^{V \times d_{\text{model}}}$, transposed,
# $W_{\text{out}} = E^\top$: logit $v$ is the dot product of the final vector with token $v$'s
# own embedding, and the model saves $V \cdot d_{\text{model}}$ weights.
#
# One `Config` describes all three; its `kind` picks the class, and `build_model` loads the
# canonical weights into it:

# %%
import jax
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx
from IPython.display import display

import numpy_impl
from transformer_course import agreement, check, each, show
from transformer_spec import Config, init_params, param_schema

show("model.py", "MODEL_CLASSES")

# %%
show("params.py", "build_model")

# %% [markdown]
# The encoder-decoder's forward: its inputs checked (and converted to the backend's arrays) in
# its first line, the masks built from the ids where none is given (source padding for the
# encoder and for cross-attention, the target mask of chapter 9 for the decoder), then the
# two stacks and the generator. Every output goes back in one `ModelOutput`, whose field
# names are Hugging Face's.

# %%
show("model.py", "Transformer.__call__")

# %%
show("model.py", "Transformer.encode")

# %%
show("model.py", "Transformer.decode")

# %% [markdown]
# The generator: a `Linear` layer, or, tied, the embedding table that the model passes in on
# each call (a model handed to `jax.jit` is flattened into its arrays, where one table held in
# two places would become two arrays):

# %%
show("model.py", "Generator.__call__")

# %% [markdown]
# The other two models are shorter: the encoder alone (plus BERT's pooler), and the decoder
# alone with the causal-and-padding mask of chapter 1.

# %%
show("model.py", "TransformerEncoderModel.__call__")

# %%
show("model.py", "TransformerLM.__call__")

# %% [markdown]
# ## Three models from one Config, three backends, the same weights
#
# The `tiny` preset ($d_{\text{model}} = 36$, 3 heads, $d_{ff} = 37$, 2 + 2 layers, vocabularies
# of 53 and 47), with only `kind` changed. Each model's weights come from `init_params(config,
# seed=0)`, the seeded initialisation every backend shares (random biases and norms, so a
# forgotten one shows), and every backend builds each model from them:

# %%
base = Config.preset("tiny")
configs = {kind: base.replace(kind=kind) for kind in ("encoder_decoder", "encoder_only", "decoder_only")}
weights = {kind: init_params(config, seed=0, dtype="float64", nonzero_biases=True) for kind, config in configs.items()}

PAD = base.pad_id
src_ids = np.array([[4, 9, 7, 5, 3, PAD], [8, 2, 6, 3, 5, 9]])  # (B, T_src)
tgt_ids = np.array([[1, 12, 30, 7, PAD], [1, 44, 5, 18, 26]])  # (B, T_tgt): 1 = the start token
inputs = {"encoder_decoder": (src_ids, tgt_ids), "encoder_only": (src_ids,), "decoder_only": (tgt_ids,)}


def run(b, kind, **options):
    model = b.impl.build_model(configs[kind], weights[kind])
    return b.call(model, *inputs[kind], **options)


def run_everywhere(kind):
    return each(lambda b: run(b, kind))


for kind in configs:
    field = "last_hidden_state" if kind == "encoder_only" else "logits"
    print(f"{numpy_impl.MODEL_CLASSES[kind].__name__} (kind {kind!r}): {field}")
    display(agreement({name: getattr(out, field) for name, out in run_everywhere(kind).items()}))

# %% [markdown]
# Each model in each backend gives the NumPy reference's numbers to float64's last bits: the
# logits `(B, T_tgt, 47)` of the encoder-decoder, the vectors `(B, T_src, 36)` of the
# encoder, the logits `(B, T, 47)` of the language model. What else each returns, when asked
# for the attentions and the hidden states (the NumPy backend's, by field):

# %%
reference = each(lambda b: b)["numpy"]  # the NumPy backend's adapter
for kind in configs:
    full = run(reference, kind, return_attentions=True, return_hidden_states=True)
    fields = {name: value for name, value in vars(full).items() if value is not None and not (
        isinstance(value, tuple) and len(value) == 0)}  # fmt: skip
    described = [f"{name} {value.shape}" if hasattr(value, "shape") else f"{name} ({len(value)})"
                 for name, value in fields.items()]  # fmt: skip
    print(f"{kind}:\n    " + ", ".join(described))

# %% [markdown]
# ## How many weights
#
# A model's weights, by name and shape, follow from its config: `param_schema(config)`. Each
# framework has its own way to count what a model holds, so the count is a check on each
# backend's module tree: torch's `parameters()` and Flax's `nnx.Param` state (both leave out
# the sinusoidal table, a torch buffer and a Flax `Buffer`: computed, not trained), and for
# NumPy, which has no notion of a parameter, its weights read back under their canonical names.

# %%
def framework_count(b, model):
    if b.name == "torch":
        return sum(p.numel() for p in model.parameters())
    if b.name == "jax":
        return sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
    return sum(value.size for value in b.impl.to_params(model).values())


def by_part(config):
    """The schema's sizes, summed by the first part of each name (src_embed, encoder, ...)."""
    parts = {}
    for name, shape in param_schema(config).items():
        parts[name.split(".")[0]] = parts.get(name.split(".")[0], 0) + int(np.prod(shape))
    return parts


def counts_of(config):
    return each(lambda b: framework_count(b, b.impl.build_model(config)))


for kind, config in configs.items():
    counts = counts_of(config)
    parts = by_part(config)
    print(f"{kind:16} schema {sum(parts.values()):6d}   " + "   ".join(f"{n} {c}" for n, c in counts.items()))
    print(f"{'':16} " + ", ".join(f"{name} {count}" for name, count in parts.items()))

# %% [markdown]
# The schema and the three frameworks agree on every model. At these tiny sizes the embeddings
# and the generator are a modest share (about 11% of the encoder-decoder, 17% of the language
# model); at real sizes, with vocabularies of tens of thousands, they weigh far more (more
# than half of the paper's base model, as below). The same count at the sizes of real models
# (from the schema alone: no weights are made): the paper's base model, BERT-base and
# SmolLM2-135M, whose config is the same class with its own fields:

# %%
real = {
    "base (paper sizes)": Config.preset("base"),
    "base, output tied": Config.preset("base", tie_output=True),
    "bert-base": Config.preset("bert-base"),
    "smollm2-135m": Config.preset("smollm2-135m"),
}
colours = {"src_embed": "tab:blue", "encoder": "tab:orange", "pooler": "tab:purple", "tgt_embed": "tab:cyan",
           "decoder": "tab:red", "generator": "tab:gray"}  # fmt: skip
fig, axis = plt.subplots(figsize=(9, 3.2))
for row, (label, config) in enumerate(real.items()):
    left = 0.0
    for part, count in by_part(config).items():
        first = part not in axis.get_legend_handles_labels()[1]
        axis.barh(row, count / 1e6, left=left, color=colours[part], label=part if first else None)
        left += count / 1e6
    axis.text(left + 1, row, f"{left:.1f} M", va="center", fontsize=9)
    shares = ", ".join(f"{part} {count / 1e6:.1f} M" for part, count in by_part(config).items())
    print(f"{label:18} {sum(by_part(config).values()):12,d} weights: {shares}")
paper = Config.preset("paper-base")  # share_embeddings and tie_output: one table, three uses
print(f"paper-base, one table of 37,000 for source, target and output: {sum(by_part(paper).values()):,} weights")
axis.set_yticks(range(len(real)), list(real))
axis.invert_yaxis()
axis.set_xlabel("millions of weights")
handles, labels = axis.get_legend_handles_labels()
axis.legend(handles, labels, loc="upper right", fontsize=8, ncol=2)
axis.set_xlim(0, 165)
fig.tight_layout()

# %% [markdown]
# BERT-base's 109,482,240 and SmolLM2-135M's 134,515,008 are the counts their published
# checkpoints hold. The paper gives its base model 65 million: it shares *one* table of a
# 37,000-token vocabulary between the source, the target and the output projection (63
# million by the same count: the last line printed, the `paper-base` preset, whose
# `share_embeddings=True` gives the encoder the decoder's table). With two tables of 32,000 and an untied
# projection, the `base` preset has 93 million, more than half of them in the three tables.
# SmolLM2 ties its output (no generator: the grey part is missing), and still a fifth of it
# is its embedding table of 49,152 tokens.
#
# ## The tied projection
#
# The language model with `tie_output=True`: the schema loses `generator.proj` (a
# $d_{\text{model}} \times V$ weight and its bias), and the logits are the final vectors times
# the embedding table, transposed. In every backend:

# %%
tied = configs["decoder_only"].replace(tie_output=True)
tied_weights = init_params(tied, seed=0, dtype="float64", nonzero_biases=True)
print("untied:", sum(by_part(configs["decoder_only"]).values()), "weights; tied:", sum(by_part(tied).values()),
      f"(V d_model + V = {tied.tgt_vocab_size} x {tied.d_model} + {tied.tgt_vocab_size} fewer)")  # fmt: skip
table = tied_weights["tgt_embed.token.weight"]  # (V, d_model)


def tied_run(b):
    output = b.call(b.impl.build_model(tied, tied_weights), tgt_ids)
    return output.logits, output.last_hidden_state @ table.T  # the model's logits, and h E^T by hand


for name, (logits, by_hand) in each(tied_run).items():
    print(f"{name:6} logits {logits.shape}: max |logits - h E^T| = {np.abs(logits - by_hand).max():.1e}")

# %% [markdown]
# One array serves twice: as the lookup table on the way in (scaled by
# $\sqrt{d_{\text{model}}}$, chapter 3) and as the projection on the way out (not scaled).
# In training its gradient is the sum of the two uses' gradients (chapter 12).
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs and says what differs, and which classic mistake your
# answer matches when it matches one. The solutions are in `solutions/10_models.py`.
#
# ### Exercise 10.1: count the weights
# `count_parameters(config)` → int: how many trained numbers the model of `config.kind` holds,
# from the config's fields alone (without `param_schema`). The cases use LayerNorm, the
# paper's feed-forward network and `num_kv_heads = num_heads`, no token types and no pooler;
# they vary `kind`, `norm_first` (and with it `encoder_final_norm` and `decoder_final_norm`),
# `bias` (every Linear and every LayerNorm has one, or none has), `tie_output` and
# `positional` (`"sinusoidal"` or `"learned"`). The encoder's token table has
# `src_vocab_size` rows; the decoder's table and the output projection use `tgt_vocab_size`
# (a decoder-only config still carries the default `src_vocab_size`, which nothing uses). A
# tied output keeps no bias of its own here (no `generator.logits_bias`: the cases leave
# `final_logits_bias` off); an untied projection has a bias when `bias` is on. The check counts
# each backend's model the way its framework does (`framework_count` above).

# %%
def count_parameters(config):
    raise NotImplementedError("your code here")


check(count_parameters)

# %% [markdown]
# ### Exercise 10.2: the tied output projection
# `tied_logits(hidden, embedding)` → `(B, T, V)`: the logits of a tied output projection,
# for the final vectors `hidden (B, T, d_model)` and the target embedding table
# `embedding (V, d_model)`.

# %%
def tied_logits(hidden, embedding):
    raise NotImplementedError("your code here")


check(tied_logits)

# %% [markdown]
# What a wrong answer looks like: the embedding's $\sqrt{d_{\text{model}}}$ carried over to
# the output.

# %%
def tied_logits(hidden, embedding):
    return hidden @ embedding.T * np.sqrt(embedding.shape[1])  # the lookup's scale, wrongly reused


check(tied_logits)
