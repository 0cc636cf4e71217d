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
# # 6. The feed-forward network
#
# Attention moves information between positions; it computes only weighted averages of the
# values, linear in them. The second sub-layer of every Transformer layer does the opposite:
# it works on each position **alone**, the same small two-layer network at every position, with
# a non-linearity between the layers:
#
# $$ \mathrm{FFN}(x) = \max(0,\, x W_1 + b_1)\, W_2 + b_2, \qquad
#    W_1 \in \mathbb{R}^{d_{\text{model}} \times d_{ff}}, \quad W_2 \in \mathbb{R}^{d_{ff} \times d_{\text{model}}}. $$
#
# The hidden layer is wider than the model: $d_{ff} = 2048$ for $d_{\text{model}} = 512$ in the
# paper, four times. With $2 \cdot 4 d_{\text{model}}^2$ weights against attention's
# $4 d_{\text{model}}^2$, it holds two thirds of an encoder layer's weights. "Position-wise" means the
# same $W_1, W_2$ for every position, as a convolution of width 1 would apply them.
#
# The weights are stored `[in, out]`, as the paper writes $x W$ (torch's `nn.Linear` stores the
# transpose; the backends convert on the way in and out). Here is the forward in each backend,
# read from the files as this cell runs:

# %%
import jax
import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import display

import numpy_impl
from transformer_course import agreement, check, each, show
from transformer_spec import Config, init_params

show("feed_forward.py", "PositionwiseFeedForward.__call__")

# %% [markdown]
# ## The same network in all three backends
#
# The `tiny` preset (ReLU, $d_{\text{model}} = 36$, $d_{ff} = 37$: no two sizes equal, so a
# transposed weight cannot run), with random biases so that a forgotten one shows:

# %%
config = Config.preset("tiny")
params = init_params(config, seed=0, dtype="float64", component="feed_forward", nonzero_biases=True)
print({name: array.shape for name, array in params.items()})
x = np.random.default_rng(1).standard_normal((2, 5, config.d_model))  # (B, T, d_model)
outputs = each(lambda b: b.call(b.build("PositionwiseFeedForward", config, params, "float64"), x))
agreement(outputs)

# %% [markdown]
# **Position-wise**, checked: each position run through the network on its own gives the same
# row, and shuffling the positions only shuffles the output. Nothing passes from one position
# to another here; that is attention's job.

# %%
ffn = numpy_impl.from_params(numpy_impl.PositionwiseFeedForward, config, params, "float64")
one_at_a_time = np.concatenate([ffn(x[:, t : t + 1]) for t in range(x.shape[1])], axis=1)  # (B, T, d_model)
order = np.array([3, 0, 4, 1, 2])
print("one position at a time equals all at once:", np.allclose(one_at_a_time, outputs["numpy"], rtol=0, atol=1e-14))
print("shuffled input gives shuffled output:     ", np.allclose(ffn(x[:, order]), outputs["numpy"][:, order],
                                                                rtol=0, atol=1e-14))  # fmt: skip

# %% [markdown]
# ## The activations: ReLU, GELU, SiLU
#
# The paper uses ReLU, $\max(0, z)$. BERT and GPT-2 use **GELU**, $z \Phi(z)$ with $\Phi$ the
# standard normal distribution function: a ReLU whose corner is rounded, slightly negative
# just below 0. Its exact form needs $\mathrm{erf}$; GPT-2 used an approximation with $\tanh$,
# and the two differ by up to $5 \cdot 10^{-4}$: enough to change the last digits of a model
# trained with the other one. Llama's gate uses **SiLU** (swish), $z \cdot \sigma(z)$, of the same
# shape. The backends have all four:

# %%
show("feed_forward.py", "gelu")

# %%
show("feed_forward.py", "gelu_tanh")

# %%
show("feed_forward.py", "silu")

# %% [markdown]
# Each backend's exact and approximate GELU on the same points, and the two curves side by
# side with their difference (right, in units of $10^{-4}$):

# %%
z = np.linspace(-4, 4, 401)
exact = each(lambda b: b.call(b.impl.gelu, z))
display(agreement(exact))
display(agreement(each(lambda b: b.call(b.impl.gelu_tanh, z))))

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
for name in ("relu", "gelu", "gelu_tanh", "silu"):
    left.plot(z, numpy_impl.ACTIVATIONS[name](z), label=name, linestyle="--" if name == "gelu_tanh" else "-")
left.set_xlabel("z")
left.legend(fontsize=8)
left.set_ylim(-0.6, 4)
right.plot(z, 1e4 * (numpy_impl.gelu_tanh(z) - numpy_impl.gelu(z)))
right.set_xlabel("z")
right.set_ylabel("(gelu_tanh - gelu) x 1e4")
fig.tight_layout()

# %% [markdown]
# The frameworks disagree about which one "gelu" means: `torch.nn.functional.gelu` (and
# `nn.GELU()`) is the exact one unless told `approximate="tanh"`; `jax.nn.gelu` is the tanh
# approximation unless told `approximate=False`. Ported from one framework to the other
# with the defaults, a model changes its activation:

# %%
framework_gelus = {
    "torch.nn.functional.gelu(z)": torch.nn.functional.gelu(torch.from_numpy(z)).numpy(),
    "jax.nn.gelu(z)": np.asarray(jax.nn.gelu(z)),
    "jax.nn.gelu(z, approximate=False)": np.asarray(jax.nn.gelu(z, approximate=False)),
}
for call, values in framework_gelus.items():
    print(f"{call:34} largest difference from the exact GELU: {np.abs(values - numpy_impl.gelu(z)).max():.1e}")

# %% [markdown]
# (The config names the two `"gelu"` and `"gelu_tanh"`, and every backend computes each one
# with its own formula, not with the framework's function of that name.)
#
# ## The gated feed-forward network: SwiGLU
#
# Llama and SmolLM2 replace the first linear map by two, of the same shape: one, the **gate**,
# goes through the activation, and multiplies the other, the **up** projection, feature by
# feature (Shazeer, 2020):
#
# $$ \mathrm{FFN}_{\mathrm{SwiGLU}}(x) = \left(\mathrm{SiLU}(x W_{\mathrm{gate}}) \odot x W_{\mathrm{up}}\right)
#    W_{\mathrm{down}}. $$
#
# Where the gate is far below 0, SiLU is near 0 and the feature is shut; far above 0, it
# passes the up value times the gate. No biases. With GELU in place of SiLU it is GeGLU. The
# config switches it on with `gated_ffn=True`:

# %%
show("feed_forward.py", "GatedFeedForward.__call__")

# %% [markdown]
# The `tiny-llama` preset ($d_{\text{model}} = 54$, $d_{ff} = 37$, SiLU, no biases), in every
# backend:

# %%
llama = Config.preset("tiny-llama")
gated_params = init_params(llama, seed=2, dtype="float64", component="gated_feed_forward")
print({name: array.shape for name, array in gated_params.items()})
h = np.random.default_rng(3).standard_normal((2, 4, llama.d_model))  # (B, T, d_model)
agreement(each(lambda b: b.call(b.build("GatedFeedForward", llama, gated_params, "float64"), h)))

# %% [markdown]
# Three matrices instead of two: to keep the count of weights, Llama takes $d_{ff}$ near
# $\frac{8}{3} d_{\text{model}}$ instead of $4 d_{\text{model}}$, since
# $3 \cdot \frac{8}{3} d_{\text{model}}^2 = 2 \cdot 4 d_{\text{model}}^2$. SmolLM2-135M has
# $d_{\text{model}} = 576$ and $d_{ff} = 1536 = \frac{8}{3} \cdot 576$:

# %%
smol = Config.preset("smollm2-135m")
paper_like = 2 * smol.d_model * (4 * smol.d_model)  # W_1 and W_2 with d_ff = 4 d_model
gated = 3 * smol.d_model * smol.d_ff  # W_gate, W_up and W_down
print(f"d_model {smol.d_model}, d_ff {smol.d_ff} = {smol.d_ff / smol.d_model:.3f} d_model")
print(f"paper's FFN with d_ff = 4 d_model: {paper_like:,} weights;  SwiGLU with d_ff = {smol.d_ff}: {gated:,}")

# %% [markdown]
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs and says what differs, and which classic mistake your
# answer matches when it matches one. The solutions are in `solutions/06_feed_forward.py`.
#
# ### Exercise 6.1: the position-wise feed-forward network
# `feed_forward(x, w_1, b_1, w_2, b_2)` → `(..., d_model)`: $\max(0, x W_1 + b_1) W_2 + b_2$,
# with `x` `(..., d_model)`, `w_1` `(d_model, d_ff)`, `b_1` `(d_ff,)`, `w_2` `(d_ff, d_model)`,
# `b_2` `(d_model,)`, the weights stored `[in, out]`. The first case has square weights.

# %%
def feed_forward(x, w_1, b_1, w_2, b_2):
    raise NotImplementedError("your code here")


check(feed_forward)

# %% [markdown]
# ### Exercise 6.2: SwiGLU
# `swiglu(x, w_gate, w_up, w_down)` → `(..., d_model)`:
# $(\mathrm{SiLU}(x W_{\mathrm{gate}}) \odot x W_{\mathrm{up}}) W_{\mathrm{down}}$ with
# $\mathrm{SiLU}(z) = z \cdot \sigma(z)$; `w_gate` and `w_up` `(d_model, d_ff)`, `w_down`
# `(d_ff, d_model)`, no biases.

# %%
def swiglu(x, w_gate, w_up, w_down):
    raise NotImplementedError("your code here")


check(swiglu)

# %% [markdown]
# ### Exercise 6.3: the exact GELU
# `exact_gelu(x)` → the shape of `x`: $x \Phi(x) = \frac{x}{2} \left(1 + \mathrm{erf}(x / \sqrt{2})\right)$,
# as BERT and `torch.nn.GELU()` compute it. `erf` is imported for you.

# %%
from scipy.special import erf  # noqa: E402, F401


def exact_gelu(x):
    raise NotImplementedError("your code here")


check(exact_gelu)

# %% [markdown]
# What a wrong answer looks like: a line ported from torch, where `nn.Linear` stores its
# weight `[out, in]` and computes `x @ w.T`. On square weights it runs, and computes
# something else:

# %%
def feed_forward(x, w_1, b_1, w_2, b_2):
    hidden = np.maximum(x @ w_1.T + b_1, 0.0)  # torch's layout: wrong for weights stored [in, out]
    return hidden @ w_2.T + b_2


check(feed_forward)
