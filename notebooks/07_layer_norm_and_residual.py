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
# # 7. Layer normalisation and the residual connection
#
# Every sub-layer of a Transformer (attention, the feed-forward network) sits inside the same
# wrapper: a **residual connection**, which adds the sub-layer's output to its input, and a
# **normalisation**, which brings each position's vector back to a fixed scale. This chapter is
# that wrapper.
#
# **LayerNorm** (Ba et al., 2016) normalises each position's vector $x \in \mathbb{R}^d$ over
# its own $d$ features (not over the batch, as BatchNorm does), then scales and shifts it by
# learned $\gamma, \beta \in \mathbb{R}^d$:
#
# $$ \mathrm{LayerNorm}(x) = \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} \odot \gamma + \beta, \qquad
#    \mu = \frac{1}{d} \sum_{i=1}^{d} x_i, \quad \sigma^2 = \frac{1}{d} \sum_{i=1}^{d} (x_i - \mu)^2. $$
#
# Two details decide whether a hand-written LayerNorm equals torch's, Flax's and BERT's: the
# variance is the **biased** one (divide by $d$, not $d - 1$), and $\epsilon$ sits **inside** the
# square root. (torch's default $\epsilon$ is $10^{-5}$, BERT's $10^{-12}$; ours comes from the
# config.)
#
# **RMSNorm** (Zhang & Sennrich, 2019; Llama, SmolLM2) drops the centring and the bias: it
# divides by the root mean square of the features,
#
# $$ \mathrm{RMSNorm}(x) = \frac{x}{\sqrt{\frac{1}{d} \sum_{i=1}^{d} x_i^2 + \epsilon}} \odot \gamma. $$
#
# Here are both forwards, read from each backend's file as this cell runs. (`show` takes one
# name for the three backends; torch calls a module's forward `forward`, the other two
# `__call__`, and `show(file, "Class.__call__")` reads torch's `forward` itself.)

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import display

from transformer_course import agreement, backends, check, each, show
from transformer_spec import Config, init_params

show("layer_norm.py", "LayerNorm.__call__")  # torch's is its forward

# %%
show("layer_norm.py", "RMSNorm.__call__")

# %% [markdown]
# ## The same norms in all three backends
#
# The `tiny` preset ($d_{\text{model}} = 36$, $\epsilon = 10^{-5}$), random $\gamma$ and $\beta$
# (`nonzero_biases=True`: with $\gamma = 1, \beta = 0$ a forgotten weight would not show), and
# inputs with a large mean, 100, and a spread of 4: a formula that computes the variance as
# $E[x^2] - E[x]^2$ subtracts two numbers near $10^4$ to get 16, and loses about three
# significant digits here (three of float64's 16, but nearly half of float32's 7).

# %%
config = Config.preset("tiny")
x = 100.0 + 4.0 * np.random.default_rng(0).standard_normal((2, 5, config.d_model))  # (B, T, d_model)
ln_params = init_params(config, seed=1, dtype="float64", component="layer_norm", nonzero_biases=True)
rms_params = init_params(config, seed=2, dtype="float64", component="rms_norm", nonzero_biases=True)
layer_norms = each(lambda b: b.call(b.build("LayerNorm", config, ln_params, "float64"), x))
rms_norms = each(lambda b: b.call(b.build("RMSNorm", config, rms_params, "float64"), x))
display(agreement(layer_norms))
agreement(rms_norms)

# %% [markdown]
# LayerNorm (first table) and RMSNorm (second) agree to float64's last bits. What each does
# to a vector is easiest to see with $\gamma = 1$ and $\beta = 0$: LayerNorm gives every
# position mean 0 and standard deviation 1; RMSNorm gives root mean square 1 and keeps the
# mean's share of it. On the same three positions:

# %%
plain = {"weight": np.ones(config.d_model), "bias": np.zeros(config.d_model)}
reference = backends()[0]  # the NumPy adapter
normalised = {
    "x": x[0, :3],
    "LayerNorm(x)": reference.call(reference.build("LayerNorm", config, plain, "float64"), x[0, :3]),
    "RMSNorm(x)": reference.call(reference.build("RMSNorm", config, {"weight": plain["weight"]}, "float64"), x[0, :3]),
}
print(f"{'':13} {'mean':>8} {'std':>8} {'rms':>8}")
for name, rows in normalised.items():
    for row in rows:
        print(f"{name:13} {row.mean():8.3f} {row.std():8.3f} {np.sqrt((row**2).mean()):8.3f}")

# %% [markdown]
# RMSNorm of a vector of mean 100 and spread 4 is almost a constant vector: it scales, it does
# not centre. Inside a model that is fine (the residual stream of a pre-norm model is centred
# well enough, and the learned weights adapt); it is just another function.
#
# ## The hand-written LayerNorm of the PyTorch tutorials
#
# A LayerNorm that many tutorials, the PyTorch tutorials among them, write by hand:
#
# ```python
# def forward(self, x):
#     mean = x.mean(-1, keepdim=True)
#     std = x.std(-1, keepdim=True)
#     return self.a_2 * (x - mean) / (std + self.eps) + self.b_2
# ```
#
# It differs from `nn.LayerNorm` twice. `torch.std` (and `torch.var`) divide by $d - 1$ by
# default, the *unbiased* estimate, while `np.std` and `jnp.std` divide by $d$: the same line
# means two things in two frameworks.

# %%
row = x[0, 0]  # one position's 36 features
print(f"np.std  {np.std(row):.6f}   (divides by d = {row.size})")
print(f"torch   {torch.from_numpy(row).std().item():.6f}   (divides by d - 1: unbiased)")
print(f"torch   {torch.from_numpy(row).std(correction=0).item():.6f}   (correction=0: biased, as LayerNorm)")
print(f"ratio   {np.sqrt((row.size - 1) / row.size):.6f} = sqrt((d - 1) / d)")

# %% [markdown]
# And $\epsilon$ added to the standard deviation instead of the variance: harmless where a row
# varies (std $\gg \sqrt{\epsilon}$), far off where it barely does, such as a row whose spread
# is $10^{-3}$, close to $\sqrt{10^{-5}} \approx 3 \cdot 10^{-3}$:

# %%
eps = config.layer_norm_eps
flat = 1.0 + 1e-3 * np.random.default_rng(3).standard_normal(config.d_model)  # spread 1e-3
for name, divisor in {
    "sqrt(var + eps) (ours)": np.sqrt(flat.var() + eps),
    "std + eps": flat.std() + eps,
    "torch std + eps": torch.from_numpy(flat).std().item() + eps,
}.items():
    print(f"{name:24} divisor {divisor:.2e}: largest output {np.abs(flat - flat.mean()).max() / divisor:.3f}")

# %% [markdown]
# Here the hand-written version's output is three times too large. Padding positions and
# nearly constant embeddings are such rows; on ordinary rows the two mistakes together leave
# every normalised value about $1 - \sqrt{35/36} \approx 1.4\%$ too small ($d = 36$).
#
# ## The residual connection: post-norm and pre-norm
#
# The paper puts the norm *after* the sum (**post-norm**); GPT-2, the PyTorch tutorials'
# language model and Llama put it *before* the sub-layer (**pre-norm**):
#
# $$ \text{post-norm: } x + \mathrm{Sublayer}(x) \;\to\; \mathrm{Norm}(\cdot), \qquad
#    \text{pre-norm: } x + \mathrm{Sublayer}(\mathrm{Norm}(x)). $$
#
# One function serves every layer of every model, with `norm_first` from the config (dropout
# is the identity outside training):

# %%
show("sublayer.py", "sublayer_connection")

# %% [markdown]
# `sublayer` returns a pair (its output, and the attention weights or None), so attention
# and the feed-forward network go through the same wrapper. Both orders, in every backend,
# with the `tiny` preset's feed-forward network as the sub-layer:

# %%
ffn_params = init_params(config, seed=4, dtype="float64", component="feed_forward", nonzero_biases=True)
h = np.random.default_rng(5).standard_normal((2, 5, config.d_model))  # (B, T, d_model)


def connection(b, norm_first):
    norm = b.build("LayerNorm", config, ln_params, "float64")
    ffn = b.build("PositionwiseFeedForward", config, ffn_params, "float64")
    wrapped = lambda y: b.impl.sublayer_connection(y, lambda z: (ffn(z), None), norm, norm_first)[0]
    return b.call(wrapped, h)


display(agreement(each(lambda b: connection(b, norm_first=False))))
agreement(each(lambda b: connection(b, norm_first=True)))

# %% [markdown]
# ## What the order does to a deep stack
#
# The two orders compute different functions, and they behave differently with depth. In
# post-norm, every layer's output is normalised: the vectors that flow from layer to layer (the
# **residual stream**) always have the scale the norm gives them. In pre-norm, the stream is
# never normalised: each layer *adds* its sub-layer's output to it, and it grows. Below, 24
# residual connections, each around its own random feed-forward network, in every backend, and
# the root mean square of the stream after each:

# %%
depth = 24
stack = [init_params(config, seed=10 + i, dtype="float64", component="feed_forward") for i in range(depth)]
norm_params = init_params(config, dtype="float64", component="layer_norm")  # weight 1, bias 0


def as_sublayer(module):
    return lambda y: (module(y), None)


def residual_stream(b, norm_first):
    """The stream after each of the depth connections, as NumPy arrays."""
    ffns = [b.build("PositionwiseFeedForward", config, p, "float64") for p in stack]
    norm = b.build("LayerNorm", config, norm_params, "float64")

    def run(y):
        states = [y]
        for ffn in ffns:
            y, _ = b.impl.sublayer_connection(y, as_sublayer(ffn), norm, norm_first)
            states.append(y)
        return states

    return b.call(run, h)


def streams_of(norm_first):
    return each(lambda b: residual_stream(b, norm_first))


fig, axis = plt.subplots(figsize=(6, 3.2))
for norm_first, label in [(False, "post-norm (the paper)"), (True, "pre-norm (GPT-2, Llama)")]:
    streams = streams_of(norm_first)
    print(label, "- the stream after the last layer:")
    display(agreement({name: states[-1] for name, states in streams.items()}))
    rms = [np.sqrt((state**2).mean()) for state in streams["numpy"]]
    axis.plot(range(depth + 1), rms, marker=".", label=label)
axis.set_xlabel("layer")
axis.set_ylabel("rms of the residual stream")
axis.legend()
fig.tight_layout()

# %% [markdown]
# Post-norm holds the stream at the norm's scale; in pre-norm it grows layer after layer, so a
# pre-norm stack needs **one more norm after its last layer** before the output projection
# (`encoder_final_norm` / `decoder_final_norm` in the config follow `norm_first`). In return,
# pre-norm keeps a path from the output back to the input that is a plain sum, never
# normalised: the gradient reaches the first layers undiminished, and deep pre-norm stacks
# train without the learning-rate warm-up that post-norm needs (Xiong et al., 2020). Later
# layers, though, add less and less relative to what the stream already holds.
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs and says what differs, and which classic mistake your
# answer matches when it matches one. The solutions are in `solutions/07_layer_norm_and_residual.py`.
#
# ### Exercise 7.1: LayerNorm
# `layer_norm(x, weight, bias, eps)` → the shape of `x` `(..., d)`:
# $(x - \mu) / \sqrt{\sigma^2 + \epsilon} \cdot \gamma + \beta$ over the last axis, with the
# biased variance. The cases include rows that barely vary and BERT's $\epsilon = 10^{-12}$.

# %%
def layer_norm(x, weight, bias, eps):
    raise NotImplementedError("your code here")


check(layer_norm)

# %% [markdown]
# ### Exercise 7.2: RMSNorm
# `rms_norm(x, weight, eps)` → the shape of `x` `(..., d)`:
# $x / \sqrt{\mathrm{mean}(x^2) + \epsilon} \cdot \gamma$ over the last axis; no mean subtracted,
# no bias.

# %%
def rms_norm(x, weight, eps):
    raise NotImplementedError("your code here")


check(rms_norm)

# %% [markdown]
# ### Exercise 7.3: the residual connection
# `residual_connection(x, sublayer, norm, norm_first)` → `(B, T, d_model)`: post-norm
# (`norm_first=False`, the paper) or pre-norm (`norm_first=True`). `sublayer` and `norm` are
# functions of one `(B, T, d_model)` array (here a feed-forward network, and a LayerNorm or an
# RMSNorm), returning one array of the same shape.

# %%
def residual_connection(x, sublayer, norm, norm_first):
    raise NotImplementedError("your code here")


check(residual_connection)

# %% [markdown]
# What a wrong answer looks like: the hand-written LayerNorm above, in NumPy (`ddof=1` is what
# `torch.std` does by default).

# %%
def layer_norm(x, weight, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    std = x.std(axis=-1, ddof=1, keepdims=True)  # unbiased, as torch.std
    return weight * (x - mean) / (std + eps) + bias  # eps added to the std


check(layer_norm)
