"""The switch between fused kernels and the written-out math, written once for every backend.

Each backend's ``kernels.py`` holds its own kernels in a registry (``KERNELS``, a name ->
kernel dict) and marks the teaching code they may replace with ``@fusable(name)``, the
decorator ``fusable_in(KERNELS)`` makes. While fused kernels are enabled (the default;
``use_fused_kernels(False)`` or ``with fused_kernels(False):`` switches them off, in every
backend at once) and no trace is recording, a marked call goes to the kernel registered
under its name; a kernel returns ``NotImplemented`` where it does not apply, and the
written-out code runs. A name with no kernel in a backend runs the written-out code there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from .trace import is_recording

__all__ = ["fusable_in", "fused_kernels", "fused_kernels_enabled", "use_fused_kernels"]

_enabled = [True]  # process-wide, as torch's and JAX's own global switches


def use_fused_kernels(enabled: bool) -> None:
    """Switch every fused kernel on (the default) or off (the written-out math everywhere)."""
    _enabled[0] = bool(enabled)


def fused_kernels_enabled() -> bool:
    return _enabled[0]


@contextmanager
def fused_kernels(enabled: bool) -> Iterator[None]:
    """``use_fused_kernels(enabled)`` inside the block, the previous setting after it."""
    previous = _enabled[0]
    use_fused_kernels(enabled)
    try:
        yield
    finally:
        _enabled[0] = previous


def fusable_in(kernels: Mapping[str, Callable]) -> Callable[[str], Callable[[Callable], Callable]]:
    """-> ``fusable(name)``: the decorator that marks a teaching function (or a module's forward)
    which the kernel ``kernels[name]`` may replace; the kernel gets the same arguments and
    returns the same result, or NotImplemented."""

    def fusable(name: str) -> Callable[[Callable], Callable]:
        def decorate(teaching: Callable) -> Callable:
            @functools.wraps(teaching)
            def dispatch(*args, **kwargs):
                kernel = kernels.get(name)
                if kernel is not None and _enabled[0] and not is_recording():
                    result = kernel(*args, **kwargs)
                    if result is not NotImplemented:
                        return result
                return teaching(*args, **kwargs)

            return dispatch

        return decorate

    return fusable
