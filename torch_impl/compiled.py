"""Compilation, applied to a model from outside it.

A model's ``forward`` is the plain forward pass, the same text as NumPy's ``__call__`` and
JAX's ``__call__``; called directly it runs eagerly, op by op, and that stays the default:
for reading, for stepping through in a debugger, for ``trace``. Compilation is applied from
outside, as in JAX: ``compiled(model)`` returns a callable with the same arguments that
(1) checks the inputs eagerly, on the concrete tensors the caller passed, then (2) runs the
forward pass compiled by ``torch.compile``.

What ``torch.compile`` does: TorchDynamo reads the Python bytecode of ``forward`` as it runs
and captures the tensor operations into one graph (FX), guarded by what it assumed (the
model's structure, the fused-kernel switch, the inputs' dtypes and shapes); TorchInductor
then fuses that graph's elementwise and reduction operations into loops and writes them as
code: C++ with OpenMP on a CPU, built by the machine's own C++ compiler (gcc), Triton on a
GPU; matmuls stay library calls. The first call for each guard set compiles (tens of
seconds on a small CPU; ``TORCHINDUCTOR_CACHE_DIR`` keeps the built code for the next
process), later calls check the guards and run the built code. Gradients work through it:
AOTAutograd traces the backward pass too, and compiles it with the forward.

When it recompiles: the shapes are left to torch.compile's default (no dimension is marked
dynamic by hand). The first call specialises on its shapes; a call whose batch or length
differs fails a guard and compiles once more with the dimensions that changed made symbolic,
and that graph then serves every later length (measured by ``python -m bench.compiled``: two
compilations over five lengths, where ``jax.jit`` compiles five). Other dtypes (float64
beside float32) compile separately; Inductor supports float64 on CPU, and a float64 model
compiles as a float32 one does (equal to eager to 1e-15).

Why the checks run outside the compiled graph: "is every id in [0, vocab)" reads the ids'
values, and a value read inside a captured graph breaks it in two (Dynamo's graph break),
so the checks and conversions run first, eagerly, and the compiled forward runs under
``inputs_checked()``, where the checks that read values return at once (the shape checks
that remain are read off the shapes, inside the graph, at no cost once compiled). A
recording ``trace`` in progress runs the model eagerly instead: a compiled graph has no
intermediates to record.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from transformer_run.batches import split_batch
from transformer_spec import ModelOutput
from transformer_spec.checks import inputs_checked
from transformer_spec.trace import is_recording

from .checks import token_ids
from .loss import cross_entropy
from .optim import Adam

_FLAGS = ("return_attentions", "return_hidden_states")


def compiled(model: torch.nn.Module) -> Callable[..., ModelOutput]:
    """``model`` compiled by ``torch.compile``: a callable with the model's arguments that checks
    them eagerly (``model.check_inputs``, which also converts lists and other frameworks'
    arrays), then runs the compiled forward pass on what it returned."""
    signature = inspect.signature(model.forward)  # read once, not on every call
    forward = torch.compile(model)  # compiles on first use; shares the model's parameters

    def call(*args, **kwargs) -> ModelOutput:
        if is_recording():  # a trace reads every intermediate: only the eager model has them
            return model(*args, **kwargs)
        inputs = signature.bind(*args, **kwargs).arguments  # by name
        flags = tuple(bool(inputs.pop(name, False)) for name in _FLAGS)
        arrays = model.check_inputs(**inputs)  # the tensors, in the forward's order
        with inputs_checked():
            return forward(*arrays, *flags)

    return call


# ------------------------------------------------------------------ the training step, compiled
def _loss(model: torch.nn.Module, inputs: tuple, targets: torch.Tensor, label_smoothing: float):
    """The forward pass and the loss of ``train_step``, the part ``torch.compile`` compiles."""
    logits = model(*inputs).logits  # (B, T, V)
    return cross_entropy(logits, targets, model.config.pad_id, label_smoothing)  # ()


@functools.cache
def _compiled_loss() -> Callable:
    """``_loss`` compiled, one per process (its graphs are guarded by the model's structure);
    made on first use, since ``torch.compile`` imports TorchDynamo (seconds), which a process
    that never compiles should not wait for."""
    return torch.compile(_loss)


def compiled_train_step(
    model,
    optimizer: Adam,
    batch: Mapping[str, Any],
    label_smoothing: float = 0.0,
    compute_dtype: str | None = None,
) -> float:
    """``train_step`` with its forward pass and loss compiled by ``torch.compile`` (and so their
    backward pass: AOTAutograd compiles it with them); Adam's update runs as it is. The inputs and
    targets are checked eagerly first, as ``compiled(model)`` checks, since their values cannot be
    read inside the compiled graph. Mixed precision is not compiled here (``train`` runs a bf16
    step eagerly). Dropout under inductor draws its masks from inductor's own random numbers,
    not from torch's global generator: a compiled run with dropout repeats itself, but not mask
    for mask the eager one."""
    if compute_dtype is not None:
        raise ValueError("compiled_train_step computes in the weights' dtype: bf16 runs eagerly")
    inputs, targets = split_batch(model.config, batch)
    inputs = model.check_inputs(*inputs)  # checked and converted, eagerly
    targets = token_ids("targets", targets, model.config.tgt_vocab_size, None, model)  # (B, T)
    with torch.enable_grad(), inputs_checked():  # callers may hold a no_grad context
        loss = _compiled_loss()(model, inputs, targets, label_smoothing)  # ()
        loss.backward()  # the compiled backward fills every parameter's .grad
    optimizer.step()
    return float(loss.detach())


def compile_layers(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with the modules a cached decoding step calls (the decoder stack and the output
    projection) compiled in place (``nn.Module.compile``), for ``greedy``, ``beam`` and
    ``sample``: their step runs those modules under ``inputs_checked()``, having checked the
    step's tokens and position. The key/value cache grows by one position a step, so the second
    step compiles again with that length symbolic, and the later steps reuse it."""
    model.decoder.compile()
    model.generator.compile()
    return model
