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
# # 18. Sharding: FSDP and tensor parallelism
#
# Data parallel (chapter 16) gives every device the whole model. Once the weights, their
# gradients and Adam's two moments no longer fit on one device, they must be split. Two ways,
# which combine on a (data, model) mesh of devices:
#
# - **FSDP** (fully sharded data parallel): each of the $N$ data devices keeps $1/N$ of every
#   weight, gradient and moment. Before a layer runs, the devices **all-gather** its weights
#   (each sends its slice, each gets the whole); after it, the whole weights are dropped. In the
#   backward the layer is gathered again, and its gradient is **reduce-scattered**: summed over
#   the devices, each keeping only the slice of the sum that belongs to its own slice of the
#   weight. Adam then updates each slice where it lives.
# - **Tensor parallel** (Megatron): the $K$ model devices split each block's matrices. The first
#   matmul of a block is split by **columns** (`w_q`, `w_k`, `w_v`; `w_1`, or `w_gate` and `w_up`):
#   each device computes its own heads, or its own $d_{ff}/K$ hidden features, from the whole
#   input. The second is split by **rows** (`w_o`; `w_2` or `w_down`): each device multiplies its
#   part of the hidden features by its rows, giving a partial output, and **one all-reduce** adds
#   the partial outputs. With grouped-query attention, each device holds $H/K$ query heads and
#   the $H_{kv}/K$ key/value heads *those* query heads read.
#
# The three collectives, over $N$ devices holding $g_0, \dots, g_{N-1}$:
#
# $$ \text{all-gather}: a_r \mapsto a_0 \Vert \dots \Vert a_{N-1}, \qquad
#    \text{reduce-scatter}: g_r \mapsto \Big(\sum_{s} g_s\Big)_{[r]}, \qquad
#    \text{all-reduce}: g_r \mapsto \sum_{s} g_s, $$
#
# where $(\cdot)_{[r]}$ is the $r$-th of $N$ equal slices. An all-reduce is a reduce-scatter
# followed by an all-gather, which is why FSDP communicates about as much as data parallel
# (gathering the weights once more for the backward is its extra cost). Tensor parallelism's
# matmul, with $x$ whole on every device, $W_1 = [W_1^{(1)} \cdots W_1^{(K)}]$ split by columns
# and $W_2$ by the matching rows:
#
# $$ f(x W_1) W_2 = \sum_{t=1}^{K} f\big(x W_1^{(t)}\big)\, W_2^{(t)}: $$
#
# the activation $f$ works element by element, so each device applies it to its own columns;
# only the sum needs the others. In attention the heads are independent in the same way.
#
# JAX is told before it is first imported that this CPU is to be seen as 4 devices (on a machine
# with 4 accelerators nothing needs to be set).

# %%
import importlib
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from transformer_course import agreement, check, each, relative_difference, show, show_shared  # noqa: E402
from transformer_run.sharding import Plan, placement  # noqa: E402
from transformer_spec import Config, init_params, param_schema  # noqa: E402

try:
    import torch

    torch.set_num_threads(1)  # models this small train faster on one thread than on two busy ones
except ImportError:  # the course runs in whichever backends are installed
    pass

# %% [markdown]
# ## Where each weight lives
#
# One placement for the three backends: which dimension tensor parallelism splits over the
# `model` axis (the columns of a column-split weight `(in, out)`, the rows of a row-split one),
# and which FSDP splits over the `data` axis (the first one the model axis leaves whole).

# %%
show_shared(placement)

# %% [markdown]
# A small modern decoder (grouped-query attention with 6 query heads and 2 kv heads, SwiGLU), on
# a mesh of 2 data devices by 2 model devices:

# %%
config = Config.preset("tiny-llama").replace(d_model=72, num_heads=6, num_kv_heads=2, d_ff=36, tgt_vocab_size=64,
                                             num_decoder_layers=2)  # fmt: skip
params = init_params(config, seed=0, dtype="float64")
plan = Plan(fsdp=2, tensor_parallel=2)
print(f"{'weight':38} {'shape':>9} {'tensor parallel':>15} {'model dim':>9} {'fsdp dim':>8}")
for name, shape in param_schema(config).items():
    if name.startswith("decoder.layers.0") or "layers" not in name:
        where = placement(name, shape, plan)
        print(f"{name:38} {str(shape):>9} {str(where.tensor_parallel):>15} {str(where.model_dim):>9} "
              f"{str(where.fsdp_dim):>8}")  # fmt: skip

# %% [markdown]
# ## The reference: every collective written out
#
# The NumPy backend simulates every device of a plan in one process and writes each collective
# as a function over the list of the devices' arrays:

# %%
show("sharding.py", "all_gather", backends=("numpy",))

# %%
show("sharding.py", "reduce_scatter", backends=("numpy",))

# %%
show("sharding.py", "all_reduce", backends=("numpy",))

# %% [markdown]
# FSDP's gather of a unit (a layer) before it runs, and the reduce-scatter of its gradients:

# %%
show("sharding.py", "Replica.gather", backends=("numpy",))

# %%
show("sharding.py", "Replica.reduce_gradients", backends=("numpy",))

# %% [markdown]
# One training step of each plan, on a batch of 4 rows of 8 tokens: the collectives device 0
# runs (count, and bytes of the whole buffers), and the bytes each device holds at its peak
# (its pieces of the weights, gradients and Adam's moments, plus whatever whole layer it has
# gathered for a while), against one device holding everything.

# %%
import numpy_impl  # noqa: E402
from numpy_impl.sharding import ShardedRun  # noqa: E402

ids = np.random.default_rng(0).integers(4, config.tgt_vocab_size, (4, 9))
batch = {"ids": ids[:, :-1], "targets": ids[:, 1:]}
PLANS = {"one device": Plan(), "fsdp 4": Plan(fsdp=4), "tensor parallel 2": Plan(tensor_parallel=2),
         "fsdp 2 x tp 2": Plan(fsdp=2, tensor_parallel=2)}  # fmt: skip
peaks, logs = {}, {}
for label, p in PLANS.items():
    run = ShardedRun(numpy_impl.build_model(config, params), p)
    run.step(batch)
    peaks[label], logs[label] = max(run.peak_bytes()), run.log.summary()
print(f"{'plan':18} {'all-gather':>20} {'reduce-scatter':>20} {'all-reduce':>20} {'peak bytes':>11}")
for label, summary in logs.items():
    cells = [f"{summary[k]['count']:3d} x, {summary[k]['bytes']:9,d} B" if k in summary else "-"
             for k in ("all-gather", "reduce-scatter", "all-reduce")]  # fmt: skip
    print(f"{label:18} {cells[0]:>20} {cells[1]:>20} {cells[2]:>20} {peaks[label]:11,d}")

fig, axis = plt.subplots(figsize=(7, 3))
axis.bar(list(peaks), [v / 1e6 for v in peaks.values()], color=["tab:gray", "tab:blue", "tab:orange", "tab:green"])
axis.set_ylabel("peak MB held per device")
axis.set_title("weights + gradients + Adam moments (float64), and what is gathered", fontsize=10)
fig.tight_layout()

# %% [markdown]
# FSDP over 4 devices does not divide the peak by 4: a device holds its quarter of everything
# *plus* the whole layer it has gathered and that layer's whole gradient before the
# reduce-scatter, and in this toy model the embedding table and output projection (gathered as
# one unit for the whole step) are a large share of the weights. The 16 bytes of all-reduce are
# the two scalars of the step: the global count of non-pad targets and the loss. Tensor
# parallelism's 8 all-reduces are 2 blocks x 2 layers, forward and backward; each carries a
# whole activation (B, T, d_model), not weights.
#
# ## Each backend's sharded step
#
# - **torch**: `fully_shard` (FSDP2) on each layer and then the whole model, and Megatron's
#   `ColwiseParallel` / `RowwiseParallel` through `parallelize_module`, one process per device
#   (gloo on a CPU); `BlockInput` makes a block's input one DTensor that q, k and v all read, so
#   the backward adds their parts of its gradient before the one all-reduce;
# - **JAX**: each weight is placed on the mesh with a `NamedSharding` of the placement's
#   `PartitionSpec`, the batch's rows over `data`. FSDP's step is written out as NumPy's is: in
#   `shard_map` each device runs the model on its rows and its pieces, each layer's pieces
#   travel in one flat buffer (`gather_unit`: one all-gather, and JAX derives its transpose, one
#   reduce-scatter), and `jax.checkpoint` has the backward gather them again rather than keep
#   them. Data parallelism is the same step with whole weights: each unit's gradient is one
#   all-reduce.

# %%
show("sharding.py", "shard_model", backends=("torch", "jax"))

# %%
show("sharding.py", "weight_spec", backends=("jax",))

# %% [markdown]
# Tensor parallelism JAX writes out: `shard_map` runs the block's own code on each device's
# shards, Megatron's two communications written where they happen: `pcast` at the entrance
# (identity forward; its backward is the one all-reduce of the input's gradient) and `psum` at
# the exit (the one all-reduce of the forward). Left to XLA's partitioner, the backward
# all-reduced q's, k's and v's parts of the gradient one by one.

# %%
show("sharding.py", "TensorParallelBlock", backends=("jax",))

# %% [markdown]
# FSDP's gather JAX writes out too, beside NumPy's `Replica.gather` above: the device's pieces
# flattened into one buffer, `all_gather` over `data`, each weight joined from the N pieces.
# Nothing is written for the backward: the transpose of an all-gather is a reduce-scatter.

# %%
show("sharding.py", "gather_unit", backends=("jax",))

# %% [markdown]
# Now each backend's sharded gradient against its own one-device gradient on the same batch,
# float64: NumPy and JAX on the 2 x 2 mesh (JAX on 4 simulated CPU devices), torch with FSDP over
# 2 processes (each starts its own interpreter and imports torch: a few seconds).

# %%
SHARDED = {"numpy": Plan(fsdp=2, tensor_parallel=2), "jax": Plan(fsdp=2, tensor_parallel=2), "torch": Plan(fsdp=2)}


def flat(grads):
    """Every parameter's gradient, in the schema's order, as one vector."""
    return np.concatenate([np.ravel(grads[name]) for name in param_schema(config)])


def one_device_and_sharded(b):
    loss, grads = b.impl.loss_and_grads(b.impl.build_model(config, params), batch)
    sharding = importlib.import_module(f"{b.impl.__name__}.sharding")  # each backend's sharding.py
    sharded = sharding.sharded_loss_and_grads(b.impl.build_model(config, params), batch, SHARDED[b.name])
    return loss, flat(grads), sharded[0], flat(sharded[1])


runs = each(one_device_and_sharded)
print(f"{'backend':8} {'plan':32} {'loss, one device':>18} {'sharded':>18} {'gradients differ by':>20}")
for name, (loss, grads, sh_loss, sh_grads) in runs.items():
    p = SHARDED[name]
    what = f"fsdp {p.fsdp} x tensor parallel {p.tensor_parallel}"
    print(f"{name:8} {what:32} {loss:18.15f} {sh_loss:18.15f} {relative_difference(sh_grads, grads):20.1e}")
agreement({name: run[3] for name, run in runs.items()})

# %% [markdown]
# Sharding changes where the numbers are computed, not what they are: each sharded gradient is
# its backend's one-device gradient to float64's last digits (the order of the sums differs),
# and the three agree with each other.
#
# ### What XLA put into JAX's step
#
# The collectives of the compiled training step (loss, gradients, Adam) on the 2 x 2 mesh, read
# from the program's text after XLA's passes, next to the NumPy reference's for the same plan.
# FSDP's gathers and reduce-scatters carry NumPy's bytes, and Megatron's all-reduces are
# NumPy's, count and bytes; but with tensor parallel a layer's pieces travel in two buffers
# (those split over `model`, and those whole along it: the norms, the closing biases), where
# NumPy's devices send one: in `shard_map` an array is the same on every device of an axis or
# not, and one buffer would make each device's norm weights its own as far as JAX knows.

# %%
if "jax" in runs:
    import jax_impl  # noqa: E402
    from jax_impl.sharding import step_collectives  # noqa: E402

    compiled = step_collectives(jax_impl.build_model(config, params), batch, SHARDED["jax"])
    reference = logs["fsdp 2 x tp 2"]
    print(f"{'collective':15} {'JAX count':>10} {'JAX bytes':>10} {'NumPy count':>12} {'NumPy bytes':>12}")
    for kind in ("all-gather", "reduce-scatter", "all-reduce"):
        jx, ref = compiled.get(kind, {"count": 0, "bytes": 0}), reference.get(kind, {"count": 0, "bytes": 0})
        print(f"{kind:15} {jx['count']:10d} {jx['bytes']:10,d} {ref['count']:12d} {ref['bytes']:12,d}")

# %% [markdown]
# The same runs from the command line, on real devices (simulated on the CPU when there are
# fewer), each backend in its own way:
# `transformer-ref train --task next-word --heads 4 --d-ff 48 --fsdp 2 --tensor-parallel 2`
# (4 devices; add `--backend torch` or `--backend jax`).
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it. The solutions are in
# `solutions/18_sharding.py`.
#
# ### Exercise 18.1: reduce-scatter
# `reduce_scatter(buffers)`: `buffers` `(N, N n)`, row $r$ rank $r$'s whole gradient buffer →
# `(N, n)`: row $r$ what rank $r$ keeps, its slice $r$ of the sum of the $N$ buffers. The
# checker compares with NumPy's written-out collective, JAX's `psum_scatter`, and the definition
# in torch (whose collective runs only between processes).

# %%
def reduce_scatter(buffers):
    raise NotImplementedError("your code here")


check(reduce_scatter)

# %% [markdown]
# ### Exercise 18.2: the kv heads of a model rank
# `tensor_parallel_kv(w_k, d_k, tensor_parallel, num_heads)`: `w_k` `(d_model, H_kv d_k)`, the
# key projection of grouped-query attention → `(K, d_model, H_kv/K d_k)`: piece $t$ is model rank
# $t$'s columns, the kv heads its query heads read. The checker compares with each backend's own
# plan: the pieces the NumPy run gives its devices, JAX's `PartitionSpec`, torch's
# `ColwiseParallel`.

# %%
def tensor_parallel_kv(w_k, d_k, tensor_parallel, num_heads):
    raise NotImplementedError("your code here")


check(tensor_parallel_kv)

# %% [markdown]
# What a wrong answer looks like: dealing the kv heads out in turn (rank 0 heads 0 and 2).

# %%
def tensor_parallel_kv(w_k, d_k, tensor_parallel, num_heads):
    heads = w_k.reshape(w_k.shape[0], -1, d_k)  # (d_model, H_kv, d_k)
    return np.stack([heads[:, t::tensor_parallel].reshape(w_k.shape[0], -1)
                     for t in range(tensor_parallel)])  # tiled: wrong  # fmt: skip


check(tensor_parallel_kv)
