"""Compilation, applied to a model from outside it: ``compiled(model)``, the same entry point in
every backend, so that one caller serves all three (jax_impl's applies ``jax.jit``)."""

from __future__ import annotations


def compiled(model):
    """The callable that runs ``model`` fast in this backend, with the model's arguments.

    torch runs eagerly here: the model as it is (jax_impl's ``compiled`` applies
    ``jax.jit`` from outside the model; this is the same entry point, so that one caller
    serves every backend). ``torch.compile(model)`` is the user's choice, not made here."""
    return model
