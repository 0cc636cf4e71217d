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
# # 11. The loss: cross-entropy over the real tokens, with label smoothing
#
# A model that predicts tokens ends in **logits** $z \in \mathbb{R}^{V}$ at every position: one
# score per word of the vocabulary. The softmax turns them into probabilities, and training
# makes the probability of the right next token, the **target** $y$, large. The loss of one
# position is the negative log-probability of its target,
#
# $$ \ell_t = -\log p_{y_t}, \qquad \log p_v = \log \mathrm{softmax}(z)_v
#    = z_v - \log \sum_{u=1}^{V} e^{z_u}, $$
#
# and the loss of a batch is the **mean over the positions whose target is not padding**:
#
# $$ L = \frac{1}{N} \sum_{t\,:\,y_t \ne \text{pad}} \ell_t, \qquad N = \#\{t : y_t \ne \text{pad}\}. $$
#
# A padded position predicts nothing; it is left out of the sum *and* of the count. A batch
# with no real target at all has loss 0 here, not $0/0$.
#
# **Label smoothing** (the paper's section 5.4, with $\epsilon = 0.1$) trains against a
# softened target: instead of all the probability on $y$, the target distribution is
#
# $$ q = (1 - \epsilon)\, \mathrm{onehot}(y) + \frac{\epsilon}{V}, \qquad
#    \ell_t = -\sum_v q_v \log p_v = (1 - \epsilon)\,(-\log p_{y_t}) + \epsilon \cdot
#    \frac{1}{V} \sum_v (-\log p_v). $$
#
# The $\epsilon / V$ covers **every** class, the target and the padding id included; that is
# how `torch.nn.functional.cross_entropy(label_smoothing=eps)` and `optax.smooth_labels`
# define it, and so does this project. (Some code spreads $\epsilon$ over the $V - 1$ other
# classes, or the $V - 2$ that are neither target nor padding: close, not equal.)
#
# Finally, the log-softmax must not be computed as `log(softmax(z))`: $e^{z}$ overflows
# float64 for $z > 709$. Since $\log \mathrm{softmax}$ does not change when every logit is
# shifted by the same amount, each backend shifts by the row's maximum $m$ first:
#
# $$ \log p_v = (z_v - m) - \log \sum_u e^{z_u - m}, \qquad m = \max_u z_u, $$
#
# where every exponent is $\le 0$. Here is the loss of each backend, read from its file as this
# cell runs:

# %%
import matplotlib.pyplot as plt
import numpy as np
import optax
import torch
import torch.nn.functional as F
from IPython.display import display

from transformer_course import agreement, check, each, show

show("loss.py", "cross_entropy")

# %% [markdown]
# The three are the same lines, except that the frameworks hold the shift by the row max
# constant (`.detach()`, `stop_gradient`). That is optional: the log-softmax does not change
# when a whole row is shifted, so the gradient through $m$ cancels exactly, and holding $m$
# constant only saves autograd that work (chapter 12 writes NumPy's gradient by hand).
#
# ## The same loss in all three backends
#
# One batch of three sequences of 7 positions over a vocabulary of 11, with 7, 5 and 2 real
# targets (pad id 0), with and without label smoothing:

# %%
PAD = 0
rng = np.random.default_rng(0)
logits = 3.0 * rng.standard_normal((3, 7, 11))  # (B, T, V)
targets = rng.integers(1, 11, size=(3, 7))  # (B, T)
targets[1, 5:] = PAD
targets[2, 2:] = PAD
print(targets)
for eps in (0.0, 0.1):
    losses = each(lambda b, eps=eps: b.call(b.impl.cross_entropy, logits, targets, PAD, eps))
    print(f"label_smoothing = {eps}: " + ", ".join(f"{name} {float(loss):.15f}" for name, loss in losses.items()))
    display(agreement(losses))

# %% [markdown]
# ## The frameworks' own losses
#
# It is the standard definition: torch's `F.cross_entropy` with `ignore_index=pad` and
# `label_smoothing=eps` gives the same number, and so does optax's softmax cross-entropy
# against `optax.smooth_labels`, averaged over the real positions.

# %%
eps = 0.1
ours = float(each(lambda b: b.call(b.impl.cross_entropy, logits, targets, PAD, eps))["numpy"])
theirs_torch = F.cross_entropy(
    torch.from_numpy(logits.reshape(-1, 11)), torch.from_numpy(targets.reshape(-1)),
    ignore_index=PAD, label_smoothing=eps,
).item()  # fmt: skip
smoothed = optax.smooth_labels(np.eye(11)[targets], eps)  # (B, T, V): (1 - eps) onehot + eps / V
per_token = np.asarray(optax.softmax_cross_entropy(logits, smoothed))  # (B, T)
theirs_optax = per_token[targets != PAD].mean()
print(f"ours                      {ours:.15f}")
print(f"torch F.cross_entropy     {theirs_torch:.15f}")
print(f"optax + smooth_labels     {theirs_optax:.15f}")

# %% [markdown]
# Two edge cases where a careless loss breaks. A batch of **padding only** (it happens at the
# end of a bucketed data set): torch's `F.cross_entropy(ignore_index=...)` returns $0/0 =$ NaN,
# and one NaN loss turns every weight into NaN at the next update. Ours counts at least one
# position, so it returns 0, with zero gradients. And **large logits**: the naive
# `log(softmax(z))` of logits around 1000 is NaN, the shifted one is fine.

# %%
all_pad = np.zeros((2, 3), dtype=np.int64)
nan = F.cross_entropy(torch.from_numpy(logits[:2, :3].reshape(-1, 11)), torch.from_numpy(all_pad.reshape(-1)),
                      ignore_index=PAD).item()  # fmt: skip
padded_losses = each(lambda b: b.call(b.impl.cross_entropy, logits[:2, :3], all_pad, PAD))
print(f"padding only: F.cross_entropy {nan}, ours", {name: float(v) for name, v in padded_losses.items()})

large = 1000.0 + logits  # (B, T, V): exp(1000) = inf in float64
with np.errstate(over="ignore", invalid="ignore"):
    naive = np.log(np.exp(large) / np.exp(large).sum(axis=-1, keepdims=True))  # inf / inf
print("naive log(softmax) of logits near 1000: NaN in", int(np.isnan(naive).sum()), "of", naive.size, "entries")
large_losses = each(lambda b: b.call(b.impl.cross_entropy, large, targets, PAD, 0.1))
print("ours:", {name: round(float(v), 12) for name, v in large_losses.items()}, "(the same as without the +1000)")

# %% [markdown]
# ## What smoothing asks of the model
#
# On the left, the target distribution $q$ for $V = 11$, target 3 (a log scale): all of it on
# the target without smoothing; with $\epsilon = 0.1$, $\epsilon/V \approx 0.009$ on every class and
# $1 - \epsilon + \epsilon/V$ on the target.
#
# On the right, one position's loss as a function of the probability the model gives the
# target, the rest spread evenly over the others, computed by every backend's `cross_entropy`.
# Without smoothing, the loss keeps falling towards $p_y = 1$: the model is rewarded for ever
# larger logits. With smoothing, it has a minimum at $p_y = 1 - \epsilon + \epsilon / V$, and
# over-confidence costs. The paper: smoothing "hurts perplexity, as the model learns to be more
# unsure, but improves accuracy and BLEU score".

# %%
V, y = 11, 3
p_target = np.linspace(0.02, 0.999, 300)  # the target's probability; the rest shared by the V - 1 others
curve_logits = np.log(np.repeat(((1 - p_target) / (V - 1))[:, None], V, axis=1))  # (300, V)
curve_logits[:, y] = np.log(p_target)
curve_targets = np.full((1, 1), y)


def loss_curve(b, eps):
    """The loss of each row of curve_logits as one position of its own."""
    return np.array([b.call(b.impl.cross_entropy, row[None, None], curve_targets, PAD, eps) for row in curve_logits])


curves = {eps: each(lambda b, eps=eps: loss_curve(b, eps)) for eps in (0.0, 0.1, 0.3)}
display(agreement(curves[0.1]))

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
classes = np.arange(V)
for offset, eps in ((-0.2, 0.0), (0.2, 0.1)):
    q = (1 - eps) * (classes == y) + eps / V
    left.bar(classes + offset, q, width=0.4, label=f"eps = {eps}")
left.set_yscale("log")  # eps / V is small next to the target's share
left.set_ylim(1e-3, 1.5)
left.set_xticks(classes)
left.set_xlabel("class (target 3, padding 0)")
left.set_ylabel("q (log scale)")
left.set_title("the smoothed target")
left.legend()
for eps, results in curves.items():
    line = right.plot(p_target, results["numpy"], label=f"eps = {eps}")[0]
    if eps > 0:
        best = 1 - eps + eps / V
        right.axvline(best, color=line.get_color(), linestyle=":", linewidth=1)
right.set_ylim(0, 3)
right.set_xlabel("p(target)")
right.set_ylabel("loss of one position")
right.set_title("minimum at 1 - eps + eps/V")
right.legend()
fig.tight_layout()

# %% [markdown]
# The minimum of the smoothed loss is not 0: it is the entropy of $q$ (about 0.5 for
# $\epsilon = 0.1$, $V = 11$; larger with a real vocabulary). A label-smoothed loss is
# therefore never compared with an unsmoothed one; perplexity is computed with $\epsilon = 0$.
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code (`cross_entropy`) on the same inputs and says what differs, and which
# classic mistake your answer matches when it matches one. The cases include a batch whose
# logits are around 1000, a batch of padding only, and a batch padded with id 3 where id 0 is
# an ordinary word (use the `pad_id` you are given). The solutions are in `solutions/11_loss.py`.
#
# ### Exercise 11.1: cross-entropy over the real tokens
# `cross_entropy_loss(logits, targets, pad_id)` → a 0-d array: `logits` `(B, T, V)`, `targets`
# `(B, T)` ids; the mean of $-\log p_{y_t}$ over the positions whose target is not `pad_id`
# (0 when there are none), with the log-softmax computed from shifted logits.

# %%
def cross_entropy_loss(logits, targets, pad_id):
    raise NotImplementedError("your code here")


check(cross_entropy_loss)

# %% [markdown]
# ### Exercise 11.2: label smoothing
# `label_smoothed_loss(logits, targets, pad_id, label_smoothing)` → a 0-d array: per position
# $(1 - \epsilon)(-\log p_{y_t}) + \epsilon \cdot \mathrm{mean}_v(-\log p_v)$, i.e. $\epsilon/V$
# on every class, the target included; the mean over the non-pad targets.

# %%
def label_smoothed_loss(logits, targets, pad_id, label_smoothing):
    raise NotImplementedError("your code here")


check(label_smoothed_loss)

# %% [markdown]
# What a wrong answer looks like: the smoothing mass spread over the $V - 1$ classes that are
# not the target.

# %%
def label_smoothed_loss(logits, targets, pad_id, label_smoothing):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # (B, T, V)
    nll = -np.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]  # (B, T)
    others = (-log_p.sum(axis=-1) - nll) / (log_p.shape[-1] - 1)  # eps / (V - 1) on every other class
    per_token = (1 - label_smoothing) * nll + label_smoothing * others
    real = targets != pad_id
    return np.where(real, per_token, 0.0).sum() / max(real.sum(), 1)


check(label_smoothed_loss)
