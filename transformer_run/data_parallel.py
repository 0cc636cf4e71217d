"""Data-parallel training, the backend-neutral part: how a global batch is split, what each
shard's loss weighs, and which dropout masks a replica draws.

N replicas of the model (torch processes, JAX devices, NumPy shards) each take ``B / N`` rows
of the global batch (rank r: rows ``r * B / N .. (r + 1) * B / N``), compute gradients on
them, and the gradients are added up. The loss they add up to must be the single-device
loss of the whole batch, the sum over every non-pad target of the global batch divided by
their GLOBAL count:

    loss = sum_r  (count_r / count) * loss_r        loss_r: shard r's mean over its count_r tokens

so each shard's mean is weighted by its share of the global count (torch all-reduces the
counts to know it). The mean of the per-shard means, ``sum_r loss_r / N``, is another loss
whenever the shards hold different numbers of pad tokens: ``shard_weights`` is why not.

Dropout: every replica draws the one device's masks, of the whole global batch, from the one
device's streams (seeded ``seed``, where the one device's stand) and keeps its rows (each
backend's ``sharding.WholeMaskDropout``), so with dropout too N replicas' run is the
single-device run with the same seed, whatever N, and a checkpoint's streams are one device's.
Seeding each rank from (seed, rank), DDP's habit, would give every N its own masks and a run
equal to none. The price: each replica draws N times the random numbers its rows need.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from transformer_spec.config import Config

from .batches import BATCH_KEYS


def check_data_parallel(batch_size: int, data_parallel: int) -> None:
    """Raise ValueError unless ``data_parallel`` replicas can share a batch of ``batch_size`` rows
    evenly (at least one row each)."""
    if isinstance(data_parallel, bool) or not isinstance(data_parallel, (int, np.integer)) or data_parallel < 1:
        raise ValueError(f"data_parallel must be a positive number of replicas, got {data_parallel!r}")
    if data_parallel > batch_size:
        raise ValueError(
            f"data_parallel {data_parallel} is more replicas than the batch has rows ({batch_size}): each needs one"
        )
    if batch_size % data_parallel:
        raise ValueError(
            f"a batch of {batch_size} rows does not split evenly over data_parallel {data_parallel} replicas"
        )


def batch_size(config: Config, batch: Mapping[str, Any]) -> int:
    """The number of rows of ``batch`` (its targets' first dimension)."""
    return int(batch[BATCH_KEYS[config.kind][-1]].shape[0])


def shard(config: Config, batch: Mapping[str, Any], rank: int, data_parallel: int) -> dict[str, Any]:
    """Rank ``rank``'s rows of the global ``batch``: a contiguous block of ``B / data_parallel``."""
    size = batch_size(config, batch)
    check_data_parallel(size, data_parallel)
    rows = size // data_parallel
    return {key: batch[key][rank * rows : (rank + 1) * rows] for key in BATCH_KEYS[config.kind]}


def token_count(config: Config, batch: Mapping[str, Any]) -> int:
    """The number of targets of ``batch`` that count in the loss (not ``config.pad_id``)."""
    return int((np.asarray(batch[BATCH_KEYS[config.kind][-1]]) != config.pad_id).sum())


def shard_weights(config: Config, batch: Mapping[str, Any], data_parallel: int) -> list[float]:
    """Each shard's share of the global count of non-pad targets, ``count_r / count`` (they add up
    to 1; all padding: zeros, as the loss of such a batch is 0)."""
    counts = [token_count(config, shard(config, batch, r, data_parallel)) for r in range(data_parallel)]
    return [c / max(sum(counts), 1) for c in counts]


def rate_table(schedule, steps: int) -> tuple[float, ...]:
    """``schedule(1) .. schedule(steps + 1)``: the rates a run uses, as data that can travel to
    another process (a schedule is a closure, which ``pickle`` cannot send)."""
    return tuple(float(schedule(t)) for t in range(1, steps + 2))


def table_schedule(rates: tuple[float, ...], step: int) -> float:
    """The rate of ``step`` (1-based) from ``rate_table``; bind it with ``functools.partial``."""
    return rates[min(max(int(step), 1), len(rates)) - 1]
