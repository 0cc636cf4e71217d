"""``--threads N``: how many CPU threads torch computes with, in every command that can run torch.

torch starts with one thread per core and splits each op across them. For this project's toy
models (d_model 36, a few thousand numbers per op) splitting costs more than it saves, and on
a busy machine the threads wait on each other: ``transformer-ref train --task copy --backend
torch`` took 4.7-5.8 s with 1 thread and 35-49 s with 2 on a 2-core machine shared with other
work (NumPy: 2.3-3.5 s). So the default is 1 thread for a small model (under
``SMALL_MODEL_PARAMETERS``), and torch's own (the usable cores) for a large one.

The thread count changes no result of the written-out code (bit for bit, float32 too); it
does change the last bits of the gradients of LayerNorm's weight and bias through torch's
fused ``F.layer_norm`` backward, which sums them over the rows in one partial sum per thread
(shared_tests/inputs/test_threads.py). NumPy and JAX are not affected by this option.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable

from .errors import positive_int

SMALL_MODEL_PARAMETERS = 1_000_000  # below this, one thread is faster than several (measured above)


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="CPU threads for torch (default: 1 for a small model such as the toy ones, where more threads only "
        "wait on each other; torch's default, one per usable core, for a large one). NumPy and JAX ignore it",
    )


def usable_cores() -> int:
    """The cores this process may run on (a container or taskset may allow fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads(parameters: int) -> int:
    return 1 if parameters < SMALL_MODEL_PARAMETERS else usable_cores()


def use_threads(threads: int | None, backends: Iterable[str], parameters: int) -> int | None:
    """Set torch's thread count when torch is among ``backends``: ``threads``, or the default for a
    model of ``parameters`` numbers. -> the count set, or None when torch does not run."""
    if "torch" not in backends:
        return None
    import torch

    count = threads or default_threads(parameters)
    torch.set_num_threads(count)
    return count
