"""Interleaved timing: run the implementations in turn, round after round, and compare within a round.

This machine's throughput drifts by ~3x over minutes (other tenants), so two
implementations timed one after the other, minutes apart, can differ by 3x for no
reason of their own. Timed in the same round, seconds apart, both see the same
machine: the ratio of their times in one round is what we keep, and we report the
median of those per-round ratios (and their spread), never a ratio of two medians.

The order changes every round, so that no implementation always runs first, nor always
right after the same other one. A plain rotation is not enough beyond two: rotating
(A B C M) keeps every successor fixed, so A would always run right after M -- and when M
is the 1024^3 matmul yardstick, which flushes the caches and leaves the thread pools
busy, that alone made our tiny torch encoder read 1.24x nn.TransformerEncoder where it
is 0.95-1.0x. So the rounds follow a Williams design (``round_orders``): over n rounds
(2n for an odd n) each implementation runs first once and right after each other one
equally often.

One more trap: after a NumPy call, OpenBLAS's worker threads keep spinning on both
cores for ~0.1-0.3 s, waiting for more work. Measured here: a 1024^3 torch matmul ran
~2x slower right after a NumPy one than after a 0.3 s pause. So after every NumPy
call that another framework follows, the timer waits ``SETTLE_AFTER_NUMPY_S``
(outside the timed region).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

SETTLE_AFTER_NUMPY_S = 0.3
MATMUL_N = 1024  # the large-matmul reference: (1024 x 1024) @ (1024 x 1024) in float32
MATMUL_FLOPS = 2 * MATMUL_N**3


@dataclasses.dataclass
class Candidate:
    """One thing to time: ``run()`` does the work and returns only when it is finished."""

    label: str
    framework: str  # "numpy" | "jax" | "torch"
    run: Callable[[], Any]
    self_timed: bool = False  # run() returns the seconds it measured itself (a worker process: bench.baseline)
    settle_s: float = 0.0  # pause after a call when another candidate follows (outside the timed region)


@dataclasses.dataclass
class Budget:
    """How many rounds: at least ``min_rounds``, then more until ``seconds`` are spent or ``max_rounds``."""

    min_rounds: int = 5
    max_rounds: int = 25
    seconds: float = 8.0


def time_call(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleaved(candidates: Sequence[Candidate], budget: Budget) -> dict[str, np.ndarray]:
    """Seconds per call of every candidate, one entry per round: ``times[label][i]`` ran in round i.

    The candidates must already be warm (compiled, caches filled): every call counts.
    """
    times: dict[str, list[float]] = {c.label: [] for c in candidates}
    orders = round_orders(len(candidates))
    start = time.perf_counter()
    rounds = 0
    while rounds < budget.min_rounds or (rounds < budget.max_rounds and time.perf_counter() - start < budget.seconds):
        order = [candidates[i] for i in orders[rounds % len(orders)]]
        for i, candidate in enumerate(order):
            times[candidate.label].append(candidate.run() if candidate.self_timed else time_call(candidate.run))
            following = order[(i + 1) % len(order)]
            if candidate.framework == "numpy" and following.framework != "numpy":
                time.sleep(SETTLE_AFTER_NUMPY_S)  # let OpenBLAS's spinning threads go to sleep
            elif candidate.settle_s and following is not candidate:
                time.sleep(candidate.settle_s)
        rounds += 1
    return {label: np.asarray(values) for label, values in times.items()}


def round_orders(n: int) -> list[list[int]]:
    """A Williams design: orders of range(n) in which each i comes first once, and right after
    each other j equally often (once in n orders for an even n, twice in 2n for an odd n).
    n = 2: [0, 1], [1, 0]."""
    first = [0]
    low, high = 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    orders = [[(i + shift) % n for i in first] for shift in range(n)]
    return orders if n % 2 == 0 or n == 1 else orders + [order[::-1] for order in orders]


@dataclasses.dataclass
class Ratio:
    """The per-round ratios a / b: their median and the spread of the middle half."""

    median: float
    p25: float
    p75: float
    rounds: int

    @classmethod
    def of(cls, a: np.ndarray, b: np.ndarray) -> Ratio:
        r = np.asarray(a) / np.asarray(b)
        return cls(float(np.median(r)), float(np.percentile(r, 25)), float(np.percentile(r, 75)), len(r))

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def matmul_candidate(framework: str) -> Candidate:
    """The framework's own large float32 matmul, as a yardstick of what this machine gives it right now."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((MATMUL_N, MATMUL_N)).astype(np.float32)
    b = rng.standard_normal((MATMUL_N, MATMUL_N)).astype(np.float32)
    if framework == "numpy":
        run = lambda: a @ b
    elif framework == "torch":
        import torch

        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        run = lambda: ta @ tb
    else:
        import jax
        import jax.numpy as jnp

        ja, jb = jnp.asarray(a), jnp.asarray(b)
        matmul = jax.jit(lambda x, y: jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST))
        run = lambda: matmul(ja, jb).block_until_ready()
    for _ in range(2):
        run()  # warm: compile (JAX), spin up thread pools
    return Candidate(f"{framework} {MATMUL_N}^3 matmul", framework, run)


def matmul_fraction(flops: float, seconds: np.ndarray, matmul_seconds: np.ndarray) -> float:
    """Median over rounds of (achieved FLOP/s) / (the matmul's FLOP/s in that same round)."""
    return float(np.median((flops / np.asarray(seconds)) / (MATMUL_FLOPS / np.asarray(matmul_seconds))))
