"""The switch between fused kernels and the written-out math, written once for every backend.

Each backend's ``kernels.py`` holds its own kernels in a registry (``KERNELS``, a name ->
kernel dict) and marks the teaching code they may replace with ``@fusable(name)``, the
decorator ``fusable_in(KERNELS)`` makes. While fused kernels are enabled (the default) and
no trace is recording in the calling thread, a marked call goes to the kernel registered
under its name; a kernel returns ``NotImplemented`` where it does not apply, and the
written-out code runs. A name with no kernel in a backend runs the written-out code there.

Two switches, both for every backend at once. ``use_fused_kernels(False)`` is process-wide,
as torch's and JAX's own global settings: every thread. ``with fused_kernels(False):`` is
per thread, as ``torch.no_grad()`` is: the block's setting holds in the thread that entered
it, over the process-wide one, and other threads keep theirs, so a comparison (or a trace)
in one thread never switches off another thread's fast path, and two threads' blocks cannot
restore each other's settings out of order.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from .trace import is_recording

__all__ = [
    "TILED_FROM_KEYS",
    "TILE_KEYS",
    "fusable_in",
    "fused_kernels",
    "fused_kernels_enabled",
    "use_fused_kernels",
]

# NumPy's and JAX's attention kernels read the keys and values a block at a time (FlashAttention's
# online softmax, each backend's tiled_attention.py) from this many keys on: one batch entry's
# (H, T_q, T_k) scores are then 512 MiB in float32 at 8 heads, and the memory of a long sequence.
# Below it the whole scores fit, and NumPy's plain kernel is faster.
TILED_FROM_KEYS = 4096
TILE_KEYS = 512  # keys per block in those kernels

_enabled = [True]  # process-wide, as torch's and JAX's own global switches
_local = threading.local()  # per thread: ``enabled``, the innermost ``fused_kernels`` block's setting


def use_fused_kernels(enabled: bool) -> None:
    """Switch every fused kernel on (the default) or off (the written-out math everywhere), in every
    thread (except inside a ``fused_kernels`` block, whose setting holds until it ends)."""
    _enabled[0] = bool(enabled)


def fused_kernels_enabled() -> bool:
    """In the calling thread: the innermost ``fused_kernels`` block's setting, else the process-wide one."""
    local = getattr(_local, "enabled", None)
    return _enabled[0] if local is None else local


@contextmanager
def fused_kernels(enabled: bool) -> Iterator[None]:
    """Fused kernels on or off inside the block, in this thread only; the previous setting after it."""
    previous = getattr(_local, "enabled", None)
    _local.enabled = bool(enabled)
    try:
        yield
    finally:
        _local.enabled = previous


def fusable_in(kernels: Mapping[str, Callable]) -> Callable[[str], Callable[[Callable], Callable]]:
    """-> ``fusable(name)``: the decorator that marks a teaching function (or a module's forward)
    which the kernel ``kernels[name]`` may replace; the kernel gets the same arguments and
    returns the same result, or NotImplemented."""

    def fusable(name: str) -> Callable[[Callable], Callable]:
        def decorate(teaching: Callable) -> Callable:
            @functools.wraps(teaching)
            def dispatch(*args, **kwargs):
                kernel = kernels.get(name)
                if kernel is not None and fused_kernels_enabled() and not is_recording():
                    result = kernel(*args, **kwargs)
                    if result is not NotImplemented:
                        return result
                return teaching(*args, **kwargs)

            return dispatch

        return decorate

    return fusable
