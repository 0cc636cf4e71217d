"""Why the backends differ where they must: the one list of reasons.

The three backends are one text in three frameworks: a statement of one that is not a
translation of the other's (once ``transformer_mirror.mirror`` has normalised the framework
tokens) carries a short comment pointing here, ``# differs: <reason-id>``, on its line or
on a comment line directly above it. The reason is written once, below. A marker on the
``def`` line of a function that exists in one backend only explains the whole function.

``transformer-ref mirror`` and the docs page "Where the backends differ" list every
difference with its reason; ``shared_tests/repository/test_mirror.py`` fails on a difference without
one, on a marker naming no reason here, and on a reason here that no difference uses.
To add one: a short id (``<framework>-<what>``), and one paragraph that says why.
"""

from __future__ import annotations

# NumPy's hand-written backward (``backward``, ``*_backward``) is listed under this reason
# by the mirror report itself, not by markers: it is not compared with torch at all.
NUMPY_BACKWARD = "numpy-backward"

# Files that are each backend's own by design: listed by the report with their reason,
# not compared statement by statement.
PER_BACKEND_FILES: dict[str, str] = {
    "kernels.py": "fused-kernels",
    "data_parallel.py": "replica-processes",
    "mixed_precision.py": "mixed-precision",
    "sharding.py": "sharded-engines",
    "sharded_checkpoint.py": "checkpoint-formats",
    "compiled.py": "compilers",
}
# Files one backend has and the others do not, because their framework brings what they hold (or
# needs what they do not).
ONE_BACKEND_FILES: dict[str, str] = {
    "numpy_impl/module.py": "numpy-framework",
    "jax_impl/distributed.py": "jax-processes",
}

REASONS: dict[str, str] = {
    "checkpoint-formats": "A sharded checkpoint is written in each framework's own format, by its own "
    "engine: torch.distributed.checkpoint (each rank its DTensor shards, resharded on load from their "
    "recorded offsets), Orbax (each process its devices' shards of jax.Arrays, restored into the "
    "shardings asked for), and NumPy's reference writing a file per simulated device and joining and "
    "cutting the pieces itself. The folder, its commit and its training.json are one shared text "
    "(transformer_run/sharded_checkpoint.py); the suite holds every framework to the same resharding matrix.",
    "fused-kernels": "Speed lives in one file per backend, kernels.py: the fused kernels a backend has "
    "(torch's F.scaled_dot_product_attention, F.layer_norm, F.gelu and its in-place activation GEMM; "
    "NumPy's blocked float32 erf and its per-batch-entry in-place attention, tiled for long sequences; in JAX, "
    "whose XLA fuses the written-out math itself, only the tiled attention of a long sequence as one lax.scan) "
    "are that framework's own and have no translation. The component files "
    "carry the same '@fusable(name)' line in every backend, and shared_tests/components/test_fast_paths.py holds "
    "each kernel equal to the code it replaces.",
    NUMPY_BACKWARD: "NumPy has no autograd: each module's hand-written backward (llm.c style, checked "
    "against finite differences and against torch.autograd) has no counterpart in torch or JAX, which "
    "derive the backward pass from the forward one.",
    "numpy-autograd": "NumPy has no autograd: when gradients are asked for, the forward keeps, by name, the "
    "values its hand-written backward reads (self.keep); torch's autograd and jax.grad record them unasked.",
    "numpy-framework": "NumPy is not a deep-learning framework: numpy_impl/module.py writes the little of "
    "nn.Module and torch.autograd that the NumPy modules need (a base class with train()/eval(), a walker "
    "over submodules, and enable_grad(), under which a forward keeps by name what its backward reads). "
    "torch and JAX import these from their framework; they have no text of their own to compare.",
    "framework-layers": "Each framework brings its own linear layer and dropout: torch's nn.Linear (weight "
    "[out, in]) and F.dropout (from the global generator), Flax's nnx.Linear (kernel [in, out], an "
    "nnx.Param) and a Dropout drawing from its own RngStream; NumPy writes both (Linear as the rows of one "
    "matrix, one BLAS call). layers.py builds them under our names; params.py maps the layouts.",
    "framework-autograd": "How each framework gets gradients: torch records a graph while grad is enabled "
    "(torch.autograd.grad, .detach(), no_grad); JAX differentiates a function (nnx.value_and_grad) of the "
    "model's Params; NumPy chains its hand-written backward passes.",
    "framework-module-tree": "Each framework walks its own module tree: torch's named_modules(), NNX's "
    "iter_graph (paths as tuples), NumPy's attribute walker (module.py).",
    "host-scalars": "NumPy keeps a count a Python int, so that float32 stays float32 (NEP 50 would promote "
    "a NumPy int64 scalar); torch and JAX keep it a 0-d array where the data is, with no copy to the host.",
    "jax-pytree": "JAX maps a function over nested tuples of arrays in one call (jax.tree.map over the "
    "pytree); torch and NumPy walk the tuples by hand.",
    "framework-optimizer": "Each backend's Adam is its framework's own: torch.optim.Adam with a LambdaLR "
    "schedule, optax.adam inside nnx.Optimizer (the rate injected as a hyperparameter), and in NumPy the "
    "update written out (m, v, bias corrections). They take the same schedule and give the same steps.",
    "framework-params": "Each framework stores parameters its own way: torch's nn.Linear weight is "
    "[out, in] (transposed on the way in and out) and is written under no_grad with copy_; Flax calls it "
    "kernel and writes into the nnx.Param with [...]; NumPy sets the attribute. params.py does that mapping "
    "and nothing else.",
    "jax-x64": "JAX computes in float32 unless 64-bit mode was switched on at start-up, and silently "
    "truncates a float64 request otherwise: loading float64 weights checks the mode and says how to switch "
    "it on.",
    "dropout-streams": "NumPy and JAX keep a random stream in each Dropout module (a NumPy Generator, an NNX "
    "RngStream), so a model seeds them all when it is built (seed_dropout(self, 0)); torch draws every "
    "dropout mask from its one global generator, which a constructor must not reseed behind the user's back.",
    "jax-jit": "JAX compiles, from outside the model as Flax's own examples do: compiled(model) checks the "
    "inputs eagerly (inside jit their values are unknown) and runs the forward pass as one jax.jit program "
    "(nnx.jit while dropout advances its random streams). NumPy has no compiler: its compiled(model) is the "
    "model itself; torch's applies torch.compile (see torch-compile).",
    "compilers": "Each framework compiles its own way, applied from outside the model: JAX's compiled(model) "
    "is jax.jit (how JAX runs), torch's is torch.compile (on request: torch runs eagerly by default), and "
    "NumPy has no compiler (its compiled(model) is the model). Both compilers check the inputs eagerly first, "
    "since a compiled graph cannot read their values.",
    "torch-compile": "torch runs eagerly by default and compiles on request: compiled(model) checks the inputs "
    "eagerly, then runs the forward pass through torch.compile (Dynamo captures the graph, Inductor writes and "
    "builds the code); compiled_step=True does the same for a training step's forward, loss and backward. "
    "Inside a compiled graph a tensor's value cannot decide a branch without cutting the graph in two, so the "
    "attention kernel skips its host-side shortcuts there.",
    "decoding-layout": "NumPy's and torch's cached steppers lay the model's matrices out for decoding once "
    "(kernels.decoding_layout): each stored as the library's one-row product reads it fastest, and the ones a "
    "step multiplies by the same rows (q, k and v; gate and up) made column blocks of one matrix, as views, so "
    "that one product computes them all. JAX's arrays cannot be views of one another: its stepper hands the "
    "compiled step packed copies (kernels.decoding_weights), and XLA chooses the layouts itself.",
    "torch-device": "torch allocates on a device: a tensor made from nothing (torch.ones, torch.arange, "
    "torch.zeros) is told where, usually the device of an input, or it lands on the CPU next to a GPU "
    "model. NumPy has one device, and JAX puts new arrays on its default device.",
    "torch-index-dtype": "torch's embedding lookup takes int64 or int32 indices only, and torch cannot even "
    "compare uint16/32/64 tensors; NumPy and JAX index with every integer dtype. A model takes ids of every "
    "integer dtype in every backend (checked on a host copy, as NumPy reads them), and torch's checks.py "
    "turns the checked ids into int64.",
    "jit-static-shapes": "jax.jit compiles once per shape, so a decoding step keeps one shape: the cache is a "
    "fixed-size buffer written, and the positional table read, at a position that is a traced value "
    "(jax.lax.dynamic_update_slice, dynamic_slice), where NumPy and torch grow arrays by concatenation "
    "and slice them with Python ints.",
    "jax-host-float64": "JAX has float64 only in 64-bit mode: a constant table (the sinusoids) is computed on "
    "the host with NumPy in float64, as the other backends compute it, and handed to JAX in the model's "
    "dtype afterwards; computed in JAX's float32 its angles would be off by up to 3e-5 at position 512.",
    "jax-eager-compile": "JAX compiles even what runs eagerly: a jnp call on a shape it has not seen "
    "(jnp.full, jnp.array's cast) is an XLA program compiled on first use, ~15 ms each. A model's "
    "placeholder weights, and the weights loaded into it, are made and cast by NumPy on the host and "
    "put on the device (jax.device_put), which compiles nothing; torch and NumPy make them directly.",
    "jax-index-fill": "JAX never raises on an out-of-range index (weight[ids] clamps a bad id to the last "
    "row), and inside jit the ids' values are unknown: the embedding lookup fills an id outside the "
    "table with a row of NaN, loud rather than silently wrong. NumPy and torch raise.",
    "replica-processes": "Data parallel lives in one file per backend, data_parallel.py, with the same public "
    "functions (data_parallel_loss_and_grads, data_parallel_train) and each backend's own body, since how "
    "replicas are made is each framework's own. torch runs one process "
    "per replica (DistributedDataParallel in a gloo or nccl process group, started by "
    "torch.multiprocessing.spawn or torchrun) and all-reduces the non-pad token count itself; JAX places the "
    "batch on a device mesh (rows over the 'data' axis, the state replicated) and GSPMD partitions the one "
    "jitted step, whose loss already sums over the global batch; NumPy, the reference, runs the shards one "
    "after another on one model and adds their gradients, each weighted by its share of the global count. "
    "All three reuse their train.py's step pieces and transformer_run.train's loop, and "
    "shared_tests/training/test_data_parallel.py holds each equal to the single-device step.",
    "jax-processes": "JAX across processes (jax.distributed: one mesh over the devices of several processes, "
    "as multi-host JAX runs) has a file of its own, jax_impl/distributed.py: starting and joining the "
    "processes, and the global arrays a process holds only its shards of, placed from each process's own "
    "copy and made whole to be read. torch's sharded runs are processes already (one per device, "
    "torch.multiprocessing.spawn or torchrun, in data_parallel.py and sharding.py); NumPy's devices are "
    "simulated in one process.",
    "sharded-engines": "FSDP and tensor parallelism live in one file per backend, sharding.py, with the same "
    "entry points (sharded_train, step_collectives) and each backend's own body, since the engines are each "
    "framework's own. torch runs one process per device on a 2-D DeviceMesh: fully_shard on each layer and on "
    "the model, parallelize_module with ColwiseParallel and RowwiseParallel; JAX gives each weight a "
    "NamedSharding on a ('data', 'model') mesh and lets GSPMD put the collectives into the jitted step (and "
    "writes one block with shard_map, where they are explicit); NumPy, the reference, simulates every device "
    "in one process and writes each all-gather, reduce-scatter and all-reduce out as a function over the list "
    "of the devices' arrays. All three take the plan (which weight is split how, and the checks) from "
    "transformer_run.sharding, and shared_tests/sharding holds each equal to the single-device step.",
    "mixed-precision": "bf16 mixed precision is each framework's own: torch wraps the forward in torch.autocast "
    "(matmuls and linear layers in bf16, everything else in the dtype its inputs promote to: float32 embeddings, "
    "norms and residual stream); JAX runs Flax's compute dtype (a copy of the model inside the jitted step, its "
    "parameters and buffers cast to bf16 and its nnx.Linear layers told to compute in bf16: the whole forward in "
    "bf16); NumPy has neither and emulates both with ml_dtypes (an array class whose ops compute in float32 and "
    "round as torch and JAX do). So mixed_precision.py is one file per backend with the same public functions "
    "(compute_in_bf16 / in_compute_dtype, mixed_precision_logits, mixed_precision_loss_and_grads), and "
    "each training.loss_and_grads takes compute_dtype and turns to it; the loss is float32 in all three "
    "(transformer_run.mixed_precision has the policies, the budgets and where they differ).",
}
