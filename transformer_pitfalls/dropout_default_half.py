"""The pitfall "dropout-default-half": nn.Dropout() left at its default p = 0.5."""

from __future__ import annotations

import numpy as np

from transformer_spec import init_params

from .common import CONFIG, DTYPE, _backend, _g
from .registry import Demonstration, register, source


def wrong_embeddings_with_default_dropout(embeddings, ids):
    from torch import nn

    dropout = nn.Dropout()  # encoder-notebook, from-scratch: p defaults to 0.5; the paper's P_drop is 0.1
    return dropout(embeddings(ids))  # a new module is in training mode: zeroes half, multiplies the rest by 2


def ours_embeddings(embeddings, ids):
    embeddings.eval()  # inference: dropout is the identity (build_model and load_model return this mode)
    return embeddings(ids)  # (B, T, d_model); the rate is the config's, stated (0.1 here, the paper's)


@register(
    "dropout-default-half",
    "nn.Dropout() left at its default p = 0.5",
    ("torch",),
    tutorials=("encoder-notebook", "from-scratch"),
)
def dropout_default_half(backend: str) -> Demonstration:
    """Two tutorials' Embeddings create nn.Dropout() with no argument: p = 0.5, five times the paper's
    P_drop = 0.1. And a torch module starts in training mode, so unless model.eval() is called
    every forward pass, inference included, zeroes a random half of the features and doubles
    the rest: two calls on the same sentence give different embeddings. Only torch has this
    default: Flax's nnx.Dropout has no default rate, and NumPy has no dropout to call."""
    import torch

    b = _backend(backend)
    config = CONFIG.replace(dropout=0.1)
    embeddings = b.build("Embeddings", config, init_params(config, seed=6, dtype=DTYPE, component="embeddings"))
    ids = b.asarray(np.random.default_rng(7).integers(1, config.src_vocab_size, size=(2, 7)))  # (B, T)
    with torch.no_grad(), torch.random.fork_rng():  # seeded, without moving the caller's torch RNG
        torch.manual_seed(0)
        wrong_1 = b.to_numpy(wrong_embeddings_with_default_dropout(embeddings, ids))
        wrong_2 = b.to_numpy(wrong_embeddings_with_default_dropout(embeddings, ids))
        ours_1 = b.to_numpy(ours_embeddings(embeddings, ids))
        ours_2 = b.to_numpy(ours_embeddings(embeddings, ids))
        embeddings.train()  # and in training mode, ours drops its stated 10%
        ours_training = b.to_numpy(embeddings(ids))
    kept = wrong_1 != 0
    numbers = {
        "default_p": torch.nn.Dropout().p,
        "paper_p": 0.1,
        "wrong_zero_fraction": float(1.0 - kept.mean()),
        "wrong_kept_scale": float((wrong_1[kept] / ours_1[kept]).mean()),
        "wrong_repeat_max_difference": float(np.abs(wrong_1 - wrong_2).max()),
        "ours_zero_fraction": float((ours_1 == 0).mean()),
        "ours_repeat_max_difference": float(np.abs(ours_1 - ours_2).max()),
        "ours_training_zero_fraction": float((ours_training == 0).mean()),
    }
    return Demonstration(
        pitfall="dropout-default-half",
        backend=backend,
        wrong_code=source(wrong_embeddings_with_default_dropout),
        ours_code=source(ours_embeddings),
        wrong=(
            f"p = {numbers['default_p']}: {numbers['wrong_zero_fraction']:.0%} of the features zeroed, the rest "
            f"x{_g(numbers['wrong_kept_scale'])}; two calls differ by {_g(numbers['wrong_repeat_max_difference'])}"
        ),
        ours=(
            f"dropout 0.1, stated; in inference mode {numbers['ours_zero_fraction']:.0%} zeroed and two calls "
            f"differ by {_g(numbers['ours_repeat_max_difference'])}; in training mode "
            f"{numbers['ours_training_zero_fraction']:.0%} zeroed"
        ),
        numbers=numbers,
    )
