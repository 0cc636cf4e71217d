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
# # 17. Porting a checkpoint
#
# A checkpoint is a dictionary of named arrays. Moving one from another codebase into ours (a
# Hugging Face Llama, a GGUF file, a torch `nn.Transformer`) asks three questions, and every
# converter in `transformer_convert` answers them for one family of models:
#
# - **which name is which**: Hugging Face's `model.layers.0.self_attn.q_proj.weight` is our
#   `decoder.layers.0.self_attn.w_q.weight`;
# - **which layout**: torch's `nn.Linear` stores its weight $W_{\text{torch}}$ as `[out, in]`
#   and computes $y = x W_{\text{torch}}^\top + b$; ours is `[in, out]` and computes $y = x W + b$
#   (the paper's equations), so
#   $$ W = W_{\text{torch}}^\top; $$
#   and the rotary embedding pairs the features of q and k one way or the other (chapter 15),
#   so q and k may need their rows permuted;
# - **what is not a weight**: a tied output projection stored twice, rotary frequencies kept as
#   a buffer. The converters check such entries against the config, then leave them out.
#
# Then the port is checked the only way that counts: the same input through both models. When
# the outputs differ, the model's recorded intermediates (its *trace*) say where they part.
#
# This chapter ports a small Llama built by the `transformers` library from a config (random
# weights, nothing downloaded) into our model, runs it in all three backends, writes it to a
# safetensors file, reads it back in each backend, exports it to Hugging Face again, and then
# breaks it on purpose.

# %%
import os
import tempfile
import warnings

import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

from transformer_backends import get_backend
from transformer_cli.trace import compare_traces
from transformer_convert.hf_common import linear
from transformer_convert.hf_llama import _pairs, llama_config, params_from_llama, params_to_llama
from transformer_convert.rope import convert_rope_layout, halves_to_interleaved
from transformer_course import agreement, check, each, relative_difference, show, show_shared
from transformer_spec import Config, init_params, param_schema, save_params

warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm's, as transformers imports it
try:
    import torch
    import transformers
except ImportError:  # the [oracles] extra brings both
    transformers = None


# %% [markdown]
# ## A Hugging Face Llama, from a config
#
# `LlamaForCausalLM` with 2 layers, $d_{\text{model}} = 32$, 4 query heads sharing 2 key/value
# heads ($d_k = 8$), a SwiGLU feed-forward of 48, a vocabulary of 64; its weights drawn by
# `transformers`' own initialiser (with a spread of 0.1, so that the logits are far from
# uniform). Without `transformers` installed, the cell says so and the chapter goes on with a
# Llama-shaped state dict written by our own exporter, porting between the backends only.

# %%
if transformers is not None:
    torch.manual_seed(0)
    hf_config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, initializer_range=0.1,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    hf_model = transformers.LlamaForCausalLM(hf_config).eval()
    hf_state = {name: tensor.detach().numpy() for name, tensor in hf_model.state_dict().items()}
    config = llama_config(hf_config.to_dict())
    print(f"transformers {transformers.__version__}: a LlamaForCausalLM of {len(hf_state)} tensors")
else:
    print("transformers is not installed (pip install -e '.[oracles]'): no Hugging Face model to port; "
          "the chapter ports a Llama-shaped state dict, written by params_to_llama, between the backends only")
    config = Config.preset("tiny-llama")
    hf_state = params_to_llama(init_params(config, seed=0, dtype="float32"), config)
print(config)

# %% [markdown]
# `llama_config` read Hugging Face's `config.json` (as a dict) into our `Config`: pre-norm
# RMSNorm, SwiGLU, rotary positions in the "halves" layout, grouped kv heads, no biases. It
# refuses, naming the field, any setting our model cannot compute (rope scaling, a `head_dim`
# other than hidden / heads, an unknown activation) rather than computing something else.
#
# ## The names and the layout
#
# The map from our names to theirs, with how each tensor moves: `linear` transposes,
# `as_is` copies. For the first layer:

# %%
print(f"{'ours':42} {'shape':>10}   {'Hugging Face':46} {'shape':>10}  conversion")
schema = param_schema(config)
for ours, (theirs, how) in _pairs(config).items():
    if ".layers.1." not in ours:
        print(f"{ours:42} {str(schema[ours]):>10}   {theirs:46} {str(hf_state[theirs].shape):>10}  {how.__name__}")

# %%
show_shared(linear)

# %% [markdown]
# The transpose is no formality: torch's `nn.Linear` and our `x @ W` agree only with it. A
# square weight, such as a query projection of $d_{\text{model}} \times d_{\text{model}}$, also
# runs *without* it, and is then wrong:

# %%
q_torch = hf_state["model.layers.0.self_attn.q_proj.weight"]  # [out, in], square: d_model x d_model
x = np.random.default_rng(0).standard_normal((3, config.d_model)).astype(np.float32)
want = x @ q_torch.T  # what nn.Linear computes (F.linear(x, weight) = x @ weight.T)
print(f"x @ linear(weight): off by {relative_difference(x @ linear(q_torch), want):.0e}")
print(f"x @ weight:         off by {relative_difference(x @ q_torch, want):.2f}  (runs, as the matrix is square)")

# %% [markdown]
# ## Ours, in the three backends
#
# `params_from_llama` checks every key and shape against the config (a missing, extra or
# mis-shaped tensor is an error naming it) and returns our canonical weights; each backend
# builds its model from them. The same two sentences of 8 tokens through Hugging Face's model
# and ours:

# %%
params = params_from_llama(hf_state, config)  # our names, [in, out] Linears
ids = np.random.default_rng(1).integers(3, config.tgt_vocab_size, (2, 8))  # no padding
logits = each(lambda b: b.call(b.impl.build_model(config, params, "float32"), ids).logits)
if transformers is not None:
    with torch.no_grad():
        logits["transformers"] = hf_model(torch.from_numpy(ids)).logits.numpy()
    display(agreement(logits, reference="transformers"))
else:
    display(agreement(logits))

# %% [markdown]
# float32 agreement, about $10^{-7}$ of the logits' scale: the port is right (a wrong weight
# gives differences of order 0.1, as below).
#
# ## Through a file, into every backend and out again
#
# `save_params` writes our weights and the config to one safetensors file; each backend's
# `load_model` reads it. Inside, the layouts differ: NumPy keeps `[in, out]`, Flax's
# `nnx.Linear` keeps the same matrix under the name `kernel`, torch's `nn.Linear` keeps its
# transpose. Each backend's `to_params` gives the canonical weights back:

# %%
show("params.py", "_to_torch_layout", backends=("torch",))

# %%
show("params.py", "_to_flax_name", backends=("jax",))

# %%
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "ported-llama.safetensors")
    save_params(path, params, config)
    back = each(lambda b: b.impl.to_params(b.impl.load_model(path)))
for name, weights in back.items():
    same = all(np.array_equal(weights[key], params[key]) for key in params)
    print(f"{name:6} load_model -> to_params: {len(weights)} tensors, bit for bit the same: {same}")

# %% [markdown]
# And back to Hugging Face: `params_to_llama` writes every key of `LlamaForCausalLM`'s
# `state_dict()`, transposing each Linear again. The weights that went through torch's model
# (transposed into it, transposed out) load into a fresh `LlamaForCausalLM` with
# `strict=True`, which refuses any missing or unexpected key:

# %%
exported = params_to_llama(back["torch"], config)
print("every tensor bit for bit the original:", all(np.array_equal(exported[k], hf_state[k]) for k in hf_state))
if transformers is not None:
    fresh = transformers.LlamaForCausalLM(hf_config).eval()
    missing, unexpected = fresh.load_state_dict({k: torch.from_numpy(v) for k, v in exported.items()}, strict=True)
    print("strict load:", "no missing or unexpected keys" if not missing and not unexpected else (missing, unexpected))
    with torch.no_grad():
        again = fresh(torch.from_numpy(ids)).logits.numpy()
    print("its logits equal the original model's:", np.array_equal(again, logits["transformers"]))

# %% [markdown]
# ## When something is off: the first differing sub-layer
#
# Now a port with one mistake in it: layer 0's query weight copied without the transpose. It
# loads (the shape fits) and it runs:

# %%
broken = dict(params)
broken["decoder.layers.0.self_attn.w_q.weight"] = hf_state["model.layers.0.self_attn.q_proj.weight"]  # no .T
numpy_backend = get_backend("numpy")
wrong = numpy_backend.call(numpy_backend.impl.build_model(config, broken, "float32"), ids).logits
print(f"logits off by {relative_difference(wrong, logits['numpy']):.2f}: wrong, but where?")

# %% [markdown]
# The logits say only *that* something is wrong. Every module of every backend records its
# intermediates by name, `record(self, q=q, k=k, v=v)`: a no-op in a normal forward pass, and
# inside `trace_model` each value is kept under its module's path, the same path as the
# weights' names. Compared in the order the forward pass made them, the first intermediate that
# differs is the first sub-layer whose computation is wrong, and its name says which weights to
# look at. (`transformer-ref trace` does this between the backends, against NumPy float64, for
# any preset or checkpoint; here the same comparison, `compare_traces`, holds the broken port to
# the right one.)

# %%
show("trace.py", "trace_model")

# %%
float64 = {k: v.astype(np.float64) for k, v in params.items()}  # float64: what is equal is equal to the last bit
reference = numpy_backend.impl.trace_model(numpy_backend.impl.build_model(config, float64), ids)


def first_divergence(b, weights, run_config=config):
    model = b.impl.build_model(run_config, {k: v.astype(np.float64) for k, v in weights.items()})
    trace = b.impl.trace_model(model, b.asarray(ids))
    # -> (a row per intermediate, with its difference; the first row beyond float64's tolerance)
    return compare_traces(reference, {RUN: trace}, layers=config.num_decoder_layers)


RUN = "this port float64"  # compare_traces reads the tolerance off the label's last word
found = each(lambda b: first_divergence(b, broken))
for name, (_, first) in found.items():
    print(f"{name:6} first differing intermediate: {first.name} {first.shape}, off by {first.errors[RUN]:.2f}")

# %% [markdown]
# All three backends point at the same place: `decoder.layers.0.self_attn.q`, the queries of
# layer 0's attention, computed with `decoder.layers.0.self_attn.w_q.weight`. Everything before
# it (the embeddings, the norm) is equal to the last bit; everything after it differs, because
# it is computed from it.
#
# Two more ports, traced the same way: q and k **left in the interleaved rotary layout** (as a
# GGUF file stores them, chapter 15's other pairing) while the model rotates in halves; and the
# same weights run **as interleaved** (`convert_rope_layout` and `rope_layout="interleaved"`),
# which is a correct port too. Each intermediate's difference from the right port, in the order
# the forward pass makes them:

# %%
gguf_order = dict(params)
for i in range(config.num_decoder_layers):
    for name, heads in (("w_q", config.num_heads), ("w_k", config.num_kv_heads)):
        key = f"decoder.layers.{i}.self_attn.{name}.weight"
        gguf_order[key] = halves_to_interleaved(params[key], heads)  # the rows a GGUF file holds
as_interleaved = convert_rope_layout(params, config, "interleaved")
assert all(np.array_equal(as_interleaved[k], gguf_order[k]) for k in params)  # the same weights
runs = {
    "q not transposed": first_divergence(numpy_backend, broken),
    "q, k interleaved, run as halves": first_divergence(numpy_backend, gguf_order),
    "q, k interleaved, run as interleaved": first_divergence(
        numpy_backend, as_interleaved, config.replace(rope_layout="interleaved")),
}  # fmt: skip
names = [row.name.removeprefix("decoder.") for row in runs["q not transposed"][0]]
fig, axis = plt.subplots(figsize=(11, 4))
for (label, (rows, first)), marker in zip(runs.items(), "osx", strict=True):
    errors = np.array([max(row.errors[RUN], 1e-17) for row in rows])
    axis.semilogy(range(len(rows)), errors, marker=marker, ms=4, lw=1, label=label)
    print(f"{label:38} first differs at {first.name.removeprefix('decoder.'):24} logits off by "
          f"{rows[-1].errors[RUN]:.0e}")  # fmt: skip
axis.axhline(1e-12, color="gray", ls=":", lw=1)
axis.text(len(names) - 0.5, 2e-12, "float64 tolerance", ha="right", fontsize=8, color="gray")
axis.set_xticks(range(len(names)), names, rotation=80, fontsize=7)
axis.set_ylabel("max |diff| / max |right port|\n(0 drawn at 1e-17)")
axis.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# - **q not transposed**: zero up to layer 0's `q`; `k` and `v`, made from other weights, stay
#   equal; from the scores on, everything differs.
# - **q and k in the wrong rotary layout**: the first difference is again at `q` (recorded after
#   the rotation), and `k` too; nothing tells you which layout was meant, which is why GGUF's
#   converter in this project (`load_gguf`) undoes llama.cpp's permutation explicitly.
# - **the same weights, run as interleaved**: `q` and `k` differ (their features are the same
#   numbers in another order), but the **scores** $q \cdot k$ are equal to the last bits, and so
#   is everything after them: the permutation acts on q and k alike, and a dot product does not
#   care about the order of its terms. A trace tells these two cases apart at a glance.
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it. The solutions are in
# `solutions/17_porting_a_checkpoint.py`.
#
# ### Exercise 17.1: a torch Linear's weight, in our layout
# `hf_linear_to_ours(weight)`: `weight` a torch / Hugging Face `nn.Linear` weight `[out, in]`
# → `[in, out]`, the $W$ with $x W = x\,W_{\text{torch}}^\top$.

# %%
def hf_linear_to_ours(weight):
    raise NotImplementedError("your code here")


check(hf_linear_to_ours)

# %% [markdown]
# ### Exercise 17.2: q and k from the interleaved rotary layout to halves
# `permute_qk_for_rope(weight, num_heads)`: `weight` the `[num_heads * d_k, in]` rows of a q
# or k projection (torch layout) for the interleaved layout (GGUF, Meta's original Llama code:
# features $2i$ and $2i+1$ rotate together) → the same shape, for the halves layout (Hugging
# Face's `rotate_half`: features $i$ and $i + d_k/2$), head by head; for k, `num_heads` is the
# number of key/value heads. The checker derives the answer from each backend's own
# `rotate_pairs`: which feature plays which part of which pair in each layout.

# %%
def permute_qk_for_rope(weight, num_heads):
    raise NotImplementedError("your code here")


check(permute_qk_for_rope)

# %% [markdown]
# What a wrong answer looks like: the weight copied as it is stored.

# %%
def hf_linear_to_ours(weight):
    return weight  # torch's [out, in] as if it were ours: wrong


check(hf_linear_to_ours)
