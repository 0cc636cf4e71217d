"""One comparison: warm every candidate, check they agree, time them interleaved, make the rows."""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .implementations import Workload, to_numpy, torch_fast_path_ops
from .timing import Budget, Candidate, Ratio, interleaved, matmul_candidate, matmul_fraction


class JaxCompileClock:
    """Seconds JAX spends tracing, lowering and compiling (its own monitoring events), so a
    first call's compile time is read directly instead of as "first call minus a later one"."""

    EVENTS = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )
    _totals: collections.defaultdict[str, float] | None = None

    @classmethod
    def snapshot(cls) -> dict[str, float]:
        """Seconds spent so far in this process, per event (short names)."""
        if cls._totals is None:
            import jax

            cls._totals = collections.defaultdict(float)
            jax.monitoring.register_event_duration_secs_listener(cls._record)
        return {name.rsplit("/", 1)[-1]: cls._totals[name] for name in cls.EVENTS}

    @classmethod
    def total(cls) -> float:
        return sum(cls.snapshot().values())

    @classmethod
    def _record(cls, name: str, seconds: float, **_: Any) -> None:
        cls._totals[name] += seconds


def warm_up(candidate: Candidate) -> dict[str, Any]:
    """Call once (JAX compiles here; JAX gets a second call, its first run of the program);
    return the output, the first call's time and costs, and (torch) the fast-path ops it ran."""
    compile_before = JaxCompileClock.total() if candidate.framework == "jax" else 0.0
    start = time.perf_counter()
    if candidate.framework == "torch":
        output, ops = torch_fast_path_ops(candidate)
    else:
        output, ops = candidate.run(), []
    first = time.perf_counter() - start
    info = {"first_call_s": first, "output": to_numpy(candidate.framework, output), "fast_path_ops": ops}
    if candidate.framework == "jax":
        info["compile_s"] = JaxCompileClock.total() - compile_before
        candidate.run()
    return info


def max_difference(a: np.ndarray, b: np.ndarray, valid: np.ndarray) -> float:
    """max |a - b| over the real tokens (the references' padded query rows differ from each other)."""
    return float(np.abs(a[valid] - b[valid]).max())


def compare(
    section: str,
    comparison: str,
    size: str,
    work: Workload,
    ours: Candidate,
    theirs: Sequence[Candidate],
    flops: float,
    budget: Budget,
) -> list[dict[str, Any]]:
    """Time ``ours`` against each of ``theirs`` (and ours' framework's large matmul) in the same rounds.

    Returns one row per entry of ``theirs``: the median of the per-round ratios ours/theirs,
    ours' achieved GFLOP/s and its fraction of the matmul rate of the same rounds.
    """
    warm = {c.label: warm_up(c) for c in (ours, *theirs)}
    matmul = matmul_candidate(ours.framework)
    times = interleaved([ours, *theirs, matmul], budget)
    rows = []
    for other in theirs:
        ratio = Ratio.of(times[ours.label], times[other.label])
        rows.append(
            {
                "section": section,
                "comparison": comparison,
                "size": size,
                "shape": f"{work.batch}x{work.seq_len}",
                "ours": ours.label,
                "theirs": other.label,
                "ours_ms": 1e3 * float(np.median(times[ours.label])),
                "theirs_ms": 1e3 * float(np.median(times[other.label])),
                "ratio": ratio.to_dict(),
                "gflops": float(np.median(flops / times[ours.label])) / 1e9,
                "theirs_gflops": float(np.median(flops / times[other.label])) / 1e9,
                "matmul_gflops": float(np.median(2 * 1024**3 / times[matmul.label])) / 1e9,
                "matmul_fraction": matmul_fraction(flops, times[ours.label], times[matmul.label]),
                "theirs_matmul_fraction": matmul_fraction(flops, times[other.label], times[matmul.label])
                if other.framework == ours.framework
                else None,
                "max_abs_diff": max_difference(warm[ours.label]["output"], warm[other.label]["output"], work.valid),
                "ours_compile_s": warm[ours.label].get("compile_s"),
                "theirs_compile_s": warm[other.label].get("compile_s"),
                "notes": _fast_path_note(warm[other.label]["fast_path_ops"]),
            }
        )
    return rows


def _fast_path_note(ops: list[str]) -> str:
    return ("torch fast path ran: " + ", ".join(ops)) if ops else ""
