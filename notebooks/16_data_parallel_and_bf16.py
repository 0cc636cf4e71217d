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
# # 16. Data parallel and bf16 mixed precision
#
# Two ways to train faster or bigger that must not change what is learned:
#
# - **data parallel**: $N$ copies of the model (*replicas*: processes, devices) each take $1/N$
#   of every batch, compute gradients on their rows, and add the gradients up. Done right, the
#   step is *exactly* the one-device step on the whole batch, up to the order of float sums;
# - **bf16 mixed precision**: the weights, gradients and Adam's moments stay float32, while the
#   forward and backward passes run in bfloat16, a 16-bit float with float32's range and two to
#   three significant decimal digits (8 significant bits). This one does change the numbers, a
#   little, and is held to an error budget rather than a tolerance.
#
# ## Data parallel: what the replicas must add up to
#
# The loss of a batch is the mean over its $C$ real (non-pad) targets. Split the rows over $N$
# replicas; replica $r$ holds $c_r$ of the targets and computes the mean over its own,
# $\mathcal{L}_r$. Then
#
# $$ \mathcal{L} = \frac{1}{C} \sum_{t\ \text{real}} \ell_t = \sum_{r=1}^{N} \frac{c_r}{C}\,\mathcal{L}_r,
#    \qquad \nabla \mathcal{L} = \sum_{r=1}^{N} \frac{c_r}{C}\, \nabla \mathcal{L}_r, \qquad C = \sum_r c_r: $$
#
# each replica's mean weighs its **share of the tokens**. The mean of the means,
# $\frac{1}{N}\sum_r \mathcal{L}_r$, is the same number only when every replica holds as many
# real targets, which a padded batch rarely gives.
#
# JAX must be told before it is first imported that this CPU is to be seen as 4 devices; the
# first lines below do that (on a machine with 4 accelerators nothing needs to be set).

# %%
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from IPython.display import display  # noqa: E402

from transformer_course import agreement, check, each, relative_difference, show, show_shared  # noqa: E402
from transformer_run.data_parallel import shard, shard_weights, token_count  # noqa: E402
from transformer_spec import Config, init_params, param_schema  # noqa: E402

try:
    import torch

    torch.set_num_threads(1)  # models this small train faster on one thread than on two busy ones
except ImportError:  # the course runs in whichever backends are installed
    pass


show_shared(shard_weights)

# %% [markdown]
# A batch of 8 rows of 8 targets, right-padded to lengths 8, 8, 7, 5, 3, 2, 2, 1, split over 4
# replicas of 2 rows each (`shard`: contiguous blocks, rank $r$ gets rows $2r, 2r+1$). The
# replicas hold 16, 12, 5 and 3 of the 36 real targets:

# %%
config = Config.preset("tiny-lm", num_decoder_layers=1)  # one layer: JAX compiles it in half the time
params = init_params(config, seed=0, dtype="float64")
lengths = [8, 8, 7, 5, 3, 2, 2, 1]  # real targets per row
tokens = np.random.default_rng(0).integers(4, config.tgt_vocab_size, (8, 9))
for row, length in enumerate(lengths):
    tokens[row, length + 1 :] = config.pad_id  # a row of n targets reads n + 1 tokens
batch = {"ids": tokens[:, :-1], "targets": tokens[:, 1:]}  # (8, 8) each
N = 4
counts = [token_count(config, shard(config, batch, rank, N)) for rank in range(N)]
weights = shard_weights(config, batch, N)
print("targets per replica:", counts, " weights c_r / C:", [f"{w:.3f}" for w in weights])

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"width_ratios": [1.2, 1]})
real = batch["targets"] != config.pad_id
owner = np.repeat(np.arange(N), 8 // N)[:, None] * np.ones((1, 8))  # each row's replica
left.imshow(np.where(real, owner, np.nan), cmap="tab10", vmin=0, vmax=9)
for rank in range(1, N):
    left.axhline(rank * 8 // N - 0.5, color="black", lw=1.5)
for rank in range(N):
    left.text(8.0, rank * 8 // N + 0.5, f"replica {rank}: {counts[rank]} targets", va="center", fontsize=9)
left.set_xlim(-0.5, 12.5)
left.set_xlabel("target position (white: padding)")
left.set_ylabel("row of the global batch")
left.set_title("the global batch, 2 rows per replica", fontsize=10)
left.set_xticks(range(8))
left.spines[["top", "right"]].set_visible(False)
x = np.arange(N)
right.bar(x - 0.2, weights, 0.4, label="token share $c_r / C$: correct", color="tab:blue")
right.bar(x + 0.2, [1 / N] * N, 0.4, label="$1/N$: the mean of the means", color="tab:gray")
right.set_xticks(x, [f"replica {r}" for r in x])
right.set_ylabel("weight of the replica's gradient")
right.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## Each backend's data-parallel step
#
# Each backend exposes the same `data_parallel_loss_and_grads(model, batch, data_parallel)`,
# built on the engine its users already run:
#
# - **NumPy**, the reference: the shards one after the other on the one model, each shard's
#   gradient weighted by its token share and added up (`_replica_sum`);
# - **torch**: `DistributedDataParallel`, one process per replica (spawned here, over gloo on a
#   CPU). Each process all-reduces its token count to learn $C$, weighs its mean by $c_r / C$,
#   and multiplies by $N$, because DDP *averages* the gradients where the loss needs their sum;
# - **JAX**: nothing written for $N$ devices. The batch is placed on a mesh with its rows split
#   over a `data` axis (`NamedSharding(mesh, P("data"))`), the weights replicated on every device,
#   and the same jitted step runs: XLA's partitioner splits the work and inserts the all-reduce.
#   The loss is the one cross-entropy of the global batch, already divided by the global $C$.

# %%
show("data_parallel.py", "data_parallel_loss_and_grads")

# %%
show("data_parallel.py", "_replica_sum", backends=("numpy",))

# %%
show("data_parallel.py", "_loss_and_grads_replica", backends=("torch",))

# %%
show("data_parallel.py", "shard_batch", backends=("jax",))

# %% [markdown]
# Now the three, each against its own one-device step on the same batch: NumPy with 4 shards,
# JAX on 4 (simulated) devices, torch with 2 DDP processes (each process starts its own
# interpreter and imports torch: a few seconds). Float64 throughout, so that any difference
# beyond rounding would show.

# %%
REPLICAS = {"numpy": 4, "jax": 4, "torch": 2}


def flat(grads):
    """Every parameter's gradient, in the schema's order, as one vector."""
    return np.concatenate([np.ravel(grads[name]) for name in param_schema(config)])


def one_device_and_data_parallel(b):
    model = b.impl.build_model(config, params)
    loss, grads = b.impl.loss_and_grads(model, batch)
    dp_loss, dp_grads = b.impl.data_parallel_loss_and_grads(model, batch, REPLICAS[b.name])
    return loss, flat(grads), dp_loss, flat(dp_grads)


runs = each(one_device_and_data_parallel)
print(f"{'backend':8} {'replicas':>8} {'loss, one device':>18} {'data parallel':>18} {'gradients differ by':>20}")
for name, (loss, grads, dp_loss, dp_grads) in runs.items():
    difference = relative_difference(dp_grads, grads)
    print(f"{name:8} {REPLICAS[name]:8d} {loss:18.15f} {dp_loss:18.15f} {difference:20.1e}")
agreement({name: run[3] for name, run in runs.items()})

# %% [markdown]
# Each data-parallel gradient is its backend's one-device gradient to float64's last digits
# (the differences are the order of the sums), and the three backends' data-parallel
# gradients agree with each other (the table: the whole gradient, every parameter's).
#
# In JAX the split is visible on the arrays themselves: each device holds its own rows.

# %%
if "jax" in runs:
    from jax_impl.data_parallel import data_parallel_mesh, shard_batch

    ids_on_mesh = shard_batch(batch, data_parallel_mesh(4))["ids"]
    for piece in ids_on_mesh.addressable_shards:
        print(f"{piece.device}: rows {piece.index[0].start}..{piece.index[0].stop - 1}, shape {piece.data.shape}")

# %% [markdown]
# ### The mean of the means
#
# The classic mistake, measured: each replica's own gradient (its rows, its mean), then their
# plain average, against the one-device gradient.

# %%
import numpy_impl  # noqa: E402

model = numpy_impl.build_model(config, params)
per_replica = [numpy_impl.loss_and_grads(model, shard(config, batch, rank, N)) for rank in range(N)]
one_loss, one_grads = runs["numpy"][0], runs["numpy"][1]
mean_of_means = np.mean([flat(grads) for _, grads in per_replica], axis=0)
weighted = np.sum([w * flat(grads) for w, (_, grads) in zip(weights, per_replica, strict=True)], axis=0)
print(f"mean of the means: loss {np.mean([loss for loss, _ in per_replica]):.6f}, "
      f"gradient off by {relative_difference(mean_of_means, one_grads):.2f} (relative)")  # fmt: skip
print(f"token-weighted:    loss {sum(w * loss for w, (loss, _) in zip(weights, per_replica, strict=True)):.6f}, "
      f"gradient off by {relative_difference(weighted, one_grads):.0e}")  # fmt: skip
print(f"one device:        loss {one_loss:.6f}")

# %% [markdown]
# Off by about as much as the gradient's largest element: the replica with 3 targets got the
# same say as the one with 16. Dropout, the other thing replicas must get right: each replica
# draws the one device's mask of the whole batch and keeps its rows (`WholeMaskDropout` in each
# backend's `sharding.py`), so the run is the single device's from the same seed. Seeding each
# replica from its rank would give another run for every $N$.
#
# ## bf16: float32's range, two to three digits
#
# A float is a sign, an exponent and a mantissa. The three formats that matter here:
#
# | format | exponent bits | mantissa bits | largest | smallest normal | relative rounding error |
# | --- | --- | --- | --- | --- | --- |
# | float32 | 8 | 23 | $3.4 \cdot 10^{38}$ | $1.2 \cdot 10^{-38}$ | $2^{-24} \approx 6 \cdot 10^{-8}$ |
# | bfloat16 | 8 | 7 | $3.4 \cdot 10^{38}$ | $1.2 \cdot 10^{-38}$ | $2^{-8} \approx 3.9 \cdot 10^{-3}$ |
# | float16 | 5 | 10 | $65504$ | $6.1 \cdot 10^{-5}$ | $2^{-11} \approx 4.9 \cdot 10^{-4}$ |
#
# bfloat16 is the top half of a float32: the same sign and exponent bits, the mantissa cut from
# 23 bits to 7. So every float32 has a bf16 neighbour within $2^{-8}$ of it, relatively, with
# no overflow and no underflow to fear; float16 is more precise but overflows above 65504 and
# loses its digits below $6 \cdot 10^{-5}$, which is why float16 training needs loss scaling
# and bf16 training does not. Rounding every value of a wide range (the NumPy backend's bf16
# type is `ml_dtypes.bfloat16`):

# %%
from numpy_impl.mixed_precision import BF16  # noqa: E402

values = np.logspace(-12, 12, 4001).astype(np.float32)
with np.errstate(over="ignore"):
    rounded = {"bfloat16": values.astype(BF16).astype(np.float32),
               "float16": values.astype(np.float16).astype(np.float32)}  # fmt: skip
fig, axis = plt.subplots(figsize=(8, 3.2))
for name, result in rounded.items():
    error = np.abs(result.astype(np.float64) - values) / values
    axis.loglog(values, np.clip(np.nan_to_num(error, posinf=1.0), 1e-9, 1.0), label=name, lw=1)
axis.axhline(2.0**-8, color="tab:blue", ls=":", lw=1, label="$2^{-8}$: bfloat16's bound")
axis.axhline(2.0**-11, color="tab:orange", ls=":", lw=1, label="$2^{-11}$: float16's, in its range")
axis.set_xlabel("value")
axis.set_ylabel("|rounded - value| / value")
axis.set_title("float16: precise in its range, nothing outside it (1 = overflow to inf, or flushed to 0)",
               fontsize=10)  # fmt: skip
axis.legend(fontsize=8, loc="lower left")
fig.tight_layout()

# %% [markdown]
# ## The policy: which operations run in bf16
#
# "The passes in bf16" leaves a choice for every operation, and the two frameworks choose
# differently. torch's `torch.autocast` casts the inputs of each matmul and linear layer to bf16
# and leaves everything else in the dtype its inputs promote to: the embeddings, the norms and
# the residual stream stay float32. Flax has no autocast: its modules take a compute `dtype`
# apart from the `param_dtype` they store, and with `dtype=bfloat16` the whole forward runs in
# bf16. In both, the loss is computed in float32 from logits cast to float32, and the
# gradients reach Adam as float32. (`transformer_run.mixed_precision.OPS`:)

# %%
from transformer_run.mixed_precision import BUDGET, OPS, gradients_error  # noqa: E402

table = ["| op | torch.autocast | Flax compute dtype (JAX) |", "| --- | --- | --- |"]
table = "\n".join(table + [f"| {op} | {autocast} | {compute} |" for op, autocast, compute in OPS])
display({"text/markdown": table, "text/plain": table}, raw=True)  # the same table where Markdown is not rendered

# %% [markdown]
# torch's and NumPy's mixed precision is a context around the forward pass; JAX's is a copy of
# the model, made inside the jitted step, whose weights are the float32 ones cast to bf16
# (`jax.grad` differentiates through the cast, so the gradient arrives float32, for the float32
# weights). NumPy emulates either policy: inside the block, each weight is swapped for a view of
# `Bf16Compute`, an array whose every operation computes in float32 and rounds its result to the
# dtype torch or JAX would give it, so the same forward and hand-written backward run unchanged.

# %%
show("mixed_precision.py", "compute_in_bf16", backends=("numpy", "torch"))

# %%
show("mixed_precision.py", "in_compute_dtype", backends=("jax",))

# %% [markdown]
# ## bf16 against float32, in every backend
#
# The modern decoder `tiny-llama` (RMSNorm, SwiGLU, rotary positions, grouped kv heads) at its
# seeded float32 initialisation, on a padded batch; each backend's bf16 pass against its own
# float32 one: the loss, and the whole gradient measured norm-wise, $\lVert \text{bf16} -
# \text{float32} \rVert / \lVert \text{float32} \rVert$ over every parameter's gradient at once
# (bf16's error is noise on every element: the largest element's error alone says little).

# %%
llama = Config.preset("tiny-llama")
llama_params = init_params(llama, seed=0, dtype="float32")
llama_tokens = np.random.default_rng(1).integers(4, llama.tgt_vocab_size, (8, 9))
for row, padded in enumerate([0, 1, 3, 5] * 2):
    llama_tokens[row, 9 - padded :] = llama.pad_id
llama_batch = {"ids": llama_tokens[:, :-1], "targets": llama_tokens[:, 1:]}
POLICIES = {"numpy": ["autocast", "compute_dtype"], "torch": ["autocast"], "jax": ["compute_dtype"]}


def bf16_against_float32(b):
    model = b.impl.build_model(llama, llama_params, "float32")
    loss32, grads32 = b.impl.loss_and_grads(model, llama_batch)
    rows = []
    for policy in POLICIES[b.name]:
        loss, grads = b.impl.mixed_precision.mixed_precision_loss_and_grads(model, llama_batch, policy=policy)
        dtypes = {str(g.dtype) for g in grads.values()}
        rows.append((policy, abs(loss - loss32) / loss32, gradients_error(grads, grads32), dtypes))
    return rows


print(f"{'backend':8} {'policy':14} {'loss':>8} {'gradient':>9}  the gradient's dtype")
for name, rows in each(bf16_against_float32).items():
    for policy, loss_error, grads_error, dtypes in rows:
        print(f"{name:8} {policy:14} {loss_error:8.1e} {grads_error:9.1e}  {', '.join(dtypes)}")
print(f"the test suite's budget for the gradient: {BUDGET['gradients']:.0e}")

# %% [markdown]
# Under a thousandth on the loss, 1 to 3% on the gradient, and the gradient float32, for the
# float32 weights: bf16's two to three significant digits, as promised (the logits are about
# 1% off). The compute-dtype policy (JAX's, and NumPy's emulation of it) is a little further
# off than autocast, because its residual stream is bf16 too. The two implementations of one
# policy do not agree bit for bit (XLA fuses operations and rounds fewer intermediates; oneDNN sums in
# blocks), so bf16 is held to these budgets, never to float32's tolerances.
#
# What counts is whether training still works. 40 Adam steps on a copy task (each row is 5
# tokens and then the same 5 again: the second half is learnable), from the same weights, in
# float32 and in bf16, in every backend:

# %%
from transformer_run.schedules import warmup_schedule  # noqa: E402

copy_batches = []
for seed in range(4):
    half = np.random.default_rng(seed).integers(4, llama.tgt_vocab_size, (16, 5))
    rows = np.concatenate([half, half], axis=1)
    copy_batches.append({"ids": rows[:, :-1], "targets": rows[:, 1:]})
STEPS = 40
schedule = warmup_schedule(llama.d_model, warmup_steps=100, factor=1.0)


def curves(b):
    return {dtype: np.array(b.impl.train(b.impl.build_model(llama, llama_params, "float32"), copy_batches, STEPS,
                                         schedule, compute_dtype=compute))  # fmt: skip
            for dtype, compute in (("float32", None), ("bf16", "bfloat16"))}


losses = each(curves)
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4))
steps = np.arange(1, STEPS + 1)
for colour, (name, run) in zip(["tab:blue", "tab:orange", "tab:green"], losses.items(), strict=False):
    left.plot(steps, run["float32"], color=colour, lw=1, label=f"{name} float32")
    left.plot(steps, run["bf16"], color=colour, lw=1, ls="--", label=f"{name} bf16")
    right.semilogy(steps, np.abs(run["bf16"] - run["float32"]) / run["float32"], color=colour, label=name)
right.axhline(BUDGET["loss_curve"], color="gray", ls=":", label="the budget")
left.set_xlabel("step")
left.set_ylabel("loss")
left.legend(fontsize=8, ncol=2)
right.set_xlabel("step")
right.set_ylabel("|bf16 - float32| / float32")
right.legend(fontsize=8, loc="lower right")
fig.tight_layout()

# %% [markdown]
# The bf16 curves follow the float32 ones within about 2% at every step, inside the budget the
# test suite holds them to over these 40 steps. The gap grows as the runs go on: two trainings
# that round differently drift apart slowly (float32 runs of two frameworks do too, from much
# smaller differences), and as the loss falls the same gap is a larger share of it. The three
# float32 curves lie on top of each other.
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it. The solutions are in
# `solutions/16_data_parallel_and_bf16.py`.
#
# ### Exercise 16.1: the replicas' gradients, averaged
# `average_gradients(grads, counts)`: `grads` `(N, P)`, row $r$ the gradient replica $r$
# computed of its own loss (the mean over its `counts[r]` non-pad targets); `counts` `(N,)`.
# → `(P,)`: the gradient of the global batch's loss. The checker compares it with every
# backend's one-device gradient of the whole batch (the 5 cases: uneven replicas, a replica of
# padding only, one row per replica, a single replica, a batch of padding only).

# %%
def average_gradients(grads, counts):
    raise NotImplementedError("your code here")


check(average_gradients)

# %% [markdown]
# ### Exercise 16.2: rounding to bfloat16
# `to_bfloat16(x)`: `x` a float32 array → the same shape, float32: each value rounded to the
# nearest bfloat16, ties to the even one (the neighbour whose last kept bit is 0), as every
# framework's cast does. Work on the bits: `x.view(np.uint32)` gives each float's 32 bits; a
# bf16 keeps the top 16. A NaN stays a NaN (its mantissa may be non-zero in the low half only:
# rounded like a number, it can turn into an infinity or carry into the sign), and what rounds
# past the largest bf16 becomes an infinity. The checker compares with ml_dtypes', torch's and
# JAX's casts, exactly.

# %%
def to_bfloat16(x):
    raise NotImplementedError("your code here")


check(to_bfloat16)

# %% [markdown]
# What a wrong answer looks like: cutting the low 16 bits off (rounding toward zero).

# %%
def to_bfloat16(x):
    return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)  # truncation: wrong


check(to_bfloat16)
