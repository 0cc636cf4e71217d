"""The paper's base model at full size (Table 3, 63,082,496 weights) takes an Adam step in every
backend. Not an oracle: it sits here because it is slow (about 20 to 50 s a backend on a busy
2-core machine, most of it JAX compiling the step and Adam moving 63 million weights), and the
oracles session is the one that runs the slow, full-size checks; the parity session runs the
same code on the tiny shared-table model (shared_tests/training/test_gradients.py)."""

from __future__ import annotations

import functools
import importlib

import numpy as np

from transformer_run.batches import encoder_decoder_batch
from transformer_run.schedules import warmup_schedule
from transformer_spec import Config, init_params
from transformer_spec.config import PAPER_TRAINING


@functools.cache
def paper_base_weights() -> dict[str, np.ndarray]:
    """paper-base's seeded float32 weights, drawn once for every backend (63,082,496 numbers)."""
    return init_params(Config.preset("paper-base"), seed=0, dtype="float32")


def test_one_adam_step_of_paper_base_runs_with_one_shared_table(backend):
    """The paper's base model at full size (one 37,000-token table for the source, the target and
    the output, dropout 0.1, label smoothing 0.1, Adam with the warm-up schedule) takes one step on
    a short batch (B=2, T=8): the loss at the start is near log(37,000), Adam keeps one pair of
    moments for the shared table, and every weight moves by at most the learning rate (Adam's first step), the shared
    table's rows of source-only tokens too (their gradient comes through the encoder and the output)."""
    config = Config.preset("paper-base")
    rng = np.random.default_rng(0)
    src, tgt = rng.integers(1, 1000, (2, 8)), rng.integers(1000, 2000, (2, 9))  # tgt: T + 1, shifted
    batch = encoder_decoder_batch(src, tgt)
    params = paper_base_weights()
    model = backend.impl.build_model(config, params)
    model.train()
    schedule = warmup_schedule(config.d_model, PAPER_TRAINING["warmup_steps"])
    optimizer = backend.impl.Adam(model, schedule, PAPER_TRAINING["betas"], PAPER_TRAINING["eps"])
    loss = backend.impl.train_step(model, optimizer, batch, PAPER_TRAINING["label_smoothing"])
    assert abs(loss - np.log(37000)) < 1.0, loss
    state = importlib.import_module(f"{backend.impl.__name__}.train").training_state(model, optimizer, [loss])
    assert state.step == 1
    assert "m.tgt_embed.token.weight" in state.moments and "m.src_embed.token.weight" not in state.moments
    after = backend.impl.to_params(model)
    assert list(after) == list(params)
    lr = schedule(1)
    for name, before in params.items():
        rounding = 2 * np.spacing(np.abs(before).max())  # float32: a weight of 0.07 is 7e-9 from the next one
        assert np.abs(after[name] - before).max() <= lr * 1.001 + rounding, name
    moved = np.abs(after["tgt_embed.token.weight"] - params["tgt_embed.token.weight"])  # (37000, 512)
    source_only = np.setdiff1d(src, tgt)
    assert moved[source_only].max() > 0.5 * lr
