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
# # 13. Training: Adam, the warm-up schedule, and three equal loss curves
#
# One training step is everything the last two chapters built, then an update: the forward
# pass, the loss (chapter 11), the gradient of every weight (chapter 12), and a small move of
# every weight against its gradient. The paper (section 5.3) moves them with **Adam**, with
# $\beta_1 = 0.9$, $\beta_2 = 0.98$, $\epsilon = 10^{-9}$, and a learning rate that first grows and
# then decays:
#
# $$ \mathrm{lrate}(t) = d_{\text{model}}^{-0.5} \cdot
#    \min\big(t^{-0.5},\; t \cdot \mathrm{warmup}^{-1.5}\big), \qquad t = 1, 2, \dots $$
#
# For the first `warmup` steps the second term is the smaller one: the rate grows linearly
# from almost 0. After, it decays with the inverse square root of the step; the two meet at
# $t = \mathrm{warmup}$ (4000 in the paper). The warm-up matters for a post-norm Transformer:
# at the start, Adam's estimates of the gradients' size are poor and the layers' outputs are
# not yet balanced, and a full-size step then can throw the model somewhere it does not recover
# from.
#
# The schedule is a plain function of the step, written once in `transformer_run` (no
# framework in it) and read by all three backends' optimizers. It counts steps from 1; step 0,
# where the formula would divide by zero, gets step 1's rate:

# %%

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import display

from transformer_course import agreement, backends, check, each, show, show_shared
from transformer_run import schedules
from transformer_run import train as run_train
from transformer_run.data import copy_task
from transformer_spec import Config, init_params

torch.set_num_threads(1)  # a model this small trains faster on one thread than on several


show_shared(schedules.warmup_schedule)

# %% [markdown]
# On the left, the paper's schedule ($d_{\text{model}} = 512$) with three warm-ups; on the
# right, the one this chapter trains with: `tiny`'s $d_{\text{model}} = 36$, a warm-up of 60
# steps and a factor of 0.5, over its 80 steps.

# %%
STEPS, WARMUP, FACTOR = 80, 60, 0.5
config = Config.preset("tiny", src_vocab_size=12, tgt_vocab_size=12, max_len=16)  # d_model 36, 2 + 2 layers
schedule = schedules.warmup_schedule(config.d_model, WARMUP, FACTOR)

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.2))
paper_steps = np.arange(1, 20001)
for warmup in (1000, 4000, 8000):
    rate = schedules.warmup_schedule(512, warmup)
    left.plot(paper_steps, [rate(t) for t in paper_steps], label=f"warmup {warmup}")
left.set_xlabel("step")
left.set_ylabel("learning rate")
left.set_title("the paper: d_model = 512")
left.legend()
tiny_steps = np.arange(1, STEPS + 1)
right.plot(tiny_steps, [schedule(t) for t in tiny_steps], color="black")
right.axvline(WARMUP, color="gray", linestyle=":")
right.set_xlabel("step")
right.set_title(f"this chapter: d_model = {config.d_model}, warmup {WARMUP}, factor {FACTOR}")
fig.tight_layout()

# %% [markdown]
# ## Adam
#
# Adam keeps two running averages per weight, of the gradient $g$ and of its square, and moves
# each weight by their ratio: a step of about the learning rate's size whatever the gradient's
# scale, smaller where the gradient keeps changing sign.
#
# $$ m \leftarrow \beta_1 m + (1 - \beta_1)\, g, \qquad v \leftarrow \beta_2 v + (1 - \beta_2)\, g^2, $$
# $$ \hat m = \frac{m}{1 - \beta_1^t}, \qquad \hat v = \frac{v}{1 - \beta_2^t}, \qquad
#    \theta \leftarrow \theta - \mathrm{lrate}(t)\, \frac{\hat m}{\sqrt{\hat v} + \epsilon}. $$
#
# $m$ and $v$ start at 0, so their first values are too small by the factors $1 - \beta^t$:
# the **bias correction** divides that back out. NumPy writes the update out; torch takes
# `torch.optim.Adam` and sets its rate from the schedule with `LambdaLR` (which asks for the
# rate of "step 0" before the first update: hence its `t + 1`); JAX takes optax's `adam`
# inside `nnx.Optimizer`, with the rate injected as a hyperparameter:

# %%
show("optim.py", "Adam")

# %% [markdown]
# One step in each backend: NumPy's hand-written backward then its Adam; torch's
# `loss.backward()` then `optimizer.step()`; JAX's loss, gradient and update compiled together
# into one XLA program by `nnx.jit`:

# %%
show("train.py", "train_step")

# %% [markdown]
# The loop around the steps is written once, in `transformer_run`, for all three: the order of
# the batches, training mode (for dropout), the callback and the checkpoints cannot differ
# between backends. Each backend's `train` hands it its own optimizer and `train_step`.

# %%
show_shared(run_train.train_loop)

# %% [markdown]
# ## The same run in three backends
#
# The copy task, the classic first test of a sequence-to-sequence model: a source of 5 random
# symbols (ids 4 to 11), and the target is the same sequence, between `<bos>` and `<eos>`.
# Four batches of 8 sequences, cycled; the `tiny` encoder-decoder in float64, built from the
# same initial weights in every backend; 80 steps at the schedule above, no label smoothing.

# %%
params = init_params(config, seed=0, dtype="float64")
batches = [copy_task(8, 5, 12, seed=s) for s in range(4)]
print("source ", batches[0]["src_ids"][0], "\ntgt_in ", batches[0]["tgt_in"][0], "\ntgt_out", batches[0]["tgt_out"][0])
models = each(lambda b: b.impl.build_model(config, params))
curves = each(lambda b: np.array(b.impl.train(models[b.name], batches, STEPS, schedule)))
print(f"loss at step 1: {curves['numpy'][0]:.4f}, at step {STEPS}: {curves['numpy'][-1]:.4f}")
agreement(curves)

# %% [markdown]
# Three optimizers (one written out, torch's, optax's), three ways to the gradients, three
# forward passes: the loss curves agree at every step to $10^{-12}$ or better. On the left the
# three curves, on top of each other; on the right, how far each is from NumPy's, step by step.

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
styles = {"numpy": dict(linewidth=4, alpha=0.4), "jax": dict(linestyle="--"), "torch": dict(linestyle=":")}
for name, curve in curves.items():
    left.plot(tiny_steps, curve, label=name, **styles[name])
left.set_xlabel("step")
left.set_ylabel("loss")
left.set_title("the copy task: three loss curves")
left.legend()
for name, curve in curves.items():
    if name != "numpy":
        right.semilogy(tiny_steps, np.abs(curve - curves["numpy"]) / curves["numpy"] + 1e-18, label=f"{name}")
right.set_xlabel("step")
right.set_ylabel("|loss - numpy's| / numpy's")
right.set_title("the differences (1e-18 where equal)")
right.legend()
fig.tight_layout()

# %% [markdown]
# The differences start at float64's last bit and grow slowly: each step's rounding differences
# move the weights a little differently, and the next step starts from there. In a
# well-conditioned run they stay far below anything that matters.
#
# What did 80 steps teach? The trained models' predictions of each next target symbol, given
# the correct ones before it (teacher forcing), on the first batch: the same in every backend.

# %%
batch = batches[0]


def predictions(b):
    return b.call(models[b.name], batch["src_ids"], batch["tgt_in"]).logits.argmax(axis=-1)


predicted = each(predictions)
real = batch["tgt_out"] != config.pad_id
for name, guess in predicted.items():
    print(f"{name:6} {np.mean(guess[real] == batch['tgt_out'][real]):.0%} of the targets right")
display(agreement({name: guess.astype(float) for name, guess in predicted.items()}))

# %% [markdown]
# ## When the curves part ways
#
# The curves agree this closely because this run is well conditioned: each step changes the
# weights smoothly, so the rounding differences between the backends (different orders of
# summation in a matrix product) stay small. With a peak rate three and a half times higher (a
# warm-up of 20 steps at factor 1), the loss stops falling smoothly, and training becomes
# **chaotic**: two correct implementations drift apart exponentially from their $10^{-16}$
# differences. Two backends are enough to see it:

# %%
fast = schedules.warmup_schedule(config.d_model, 20, 1.0)
two = [b for b in backends() if b.name in ("numpy", "torch")]
chaotic = {b.name: np.array(b.impl.train(b.impl.build_model(config, params), batches, 60, fast)) for b in two}
gap = np.abs(chaotic["torch"] - chaotic["numpy"]) / chaotic["numpy"]
for t in (10, 20, 30, 40, 50, 60):
    print(f"step {t:2}: numpy {chaotic['numpy'][t - 1]:.4f}, torch {chaotic['torch'][t - 1]:.4f}, gap {gap[t - 1]:.0e}")

# %% [markdown]
# Neither is wrong: a tiny change of the weights, or of the order of a sum, would do the same to
# either one. That is why the test suite holds the backends' loss curves equal on
# well-conditioned runs (and measures float32 runs, whose rounding is $10^{-7}$, by what they
# learn instead).
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs and says what differs, and which classic mistake your
# answer matches when it matches one. The solutions are in `solutions/13_training.py`.
#
# ### Exercise 13.1: the warm-up schedule
# `warmup_schedule(steps, d_model, warmup_steps)` → `(N,)` float64: the rate at each of the
# integer `steps`, $d_{\text{model}}^{-0.5} \min(t^{-0.5}, t \cdot \mathrm{warmup}^{-1.5})$, with
# step 0 given step 1's rate. (The schedule lives in `transformer_run`, so every backend's answer
# is that function's.)

# %%
def warmup_schedule(steps, d_model, warmup_steps):
    raise NotImplementedError("your code here")


check(warmup_schedule)

# %% [markdown]
# ### Exercise 13.2: one Adam update
# `adam_step(param, grad, m, v, t, lr, beta1, beta2, eps)` → `(param, m, v)` after update `t`
# ($t = 1$ for the first), with `m` and `v` as they stand after update $t - 1$. `check` puts
# each backend's own Adam (NumPy's, `torch.optim.Adam`, optax's `adam`) in that state and steps
# it once. The cases include gradients of $10^{-7}$, where $\epsilon$ matters, and betas and
# $\epsilon$ other than the paper's (torch's and optax's defaults among them).

# %%
def adam_step(param, grad, m, v, t, lr, beta1, beta2, eps):
    raise NotImplementedError("your code here")


check(adam_step)

# %% [markdown]
# What a wrong answer looks like: Adam without the bias correction.

# %%
def adam_step(param, grad, m, v, t, lr, beta1, beta2, eps):
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad**2
    return param - lr * m / (np.sqrt(v) + eps), m, v  # m and v used as they are


check(adam_step)
