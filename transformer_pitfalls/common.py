"""What the demonstrations share: the input's config and dtype, each framework's few differently
named functions (``Ops``), the backend adapters, and the formatting of a result.

Layout of each pitfall (one module per pitfall, named after it): module-level ``wrong_*``
functions (the mistake, as the tutorials write it, and nothing else changed), ``ours_*``
functions that call the project's real code, and a registered ``run(backend)``. The page shows
``inspect.getsource`` of the functions that ran. Where NumPy, JAX and torch spell an operation
the same way (``@``, slicing, ``.swapaxes``, ``.reshape``, comparisons) the wrong code is written
once; the few functions they name differently come from ``ops`` (see ``Ops``). Everything is
float64, seeded, and small: the tiny preset's odd sizes (d_model 36, 3 heads of d_k 12).

Frameworks are imported inside functions only: ``import transformer_pitfalls`` needs NumPy alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from transformer_spec import Config

CONFIG = Config.preset("tiny")  # d_model 36, num_heads 3, d_k 12, src vocab 53
DTYPE = "float64"  # so that "the same" means 1e-16, and any real difference stands out


class Ops(NamedTuple):
    """The framework functions the backend-neutral wrong code needs, under one name each.

    numpy: ``np.where``, ``scipy.special.softmax(s, axis=-1)``, ``np.arange``;
    jax: ``jnp.where``, ``jax.nn.softmax(s, axis=-1)``, ``jnp.arange``;
    torch: ``torch.where``, ``torch.softmax(s, dim=-1)``, ``torch.arange``.
    Each softmax is the framework's own (max-subtracted), not ours: what the tutorials call.
    """

    where: Callable
    softmax: Callable  # over the last axis
    arange: Callable


def _ops(backend: str) -> Ops:
    if backend == "numpy":
        import scipy.special

        return Ops(np.where, lambda s: scipy.special.softmax(s, axis=-1), np.arange)
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        return Ops(jnp.where, lambda s: jax.nn.softmax(s, axis=-1), jnp.arange)
    import torch

    return Ops(torch.where, lambda s: torch.softmax(s, dim=-1), torch.arange)


def _backend(name: str):
    """The adapter (NumPy in, NumPy out) that the CLI and the test suite use; raises
    ModuleNotFoundError when the framework is not installed."""
    from transformer_backends import get_backend

    return get_backend(name)


def _error(call: Callable[[], Any]) -> tuple[str, str]:
    """Run ``call``, which should raise; -> (exception type, message), or ("", "") if it did not."""
    try:
        call()
    except Exception as error:  # each framework raises its own type: report whichever it is
        return type(error).__name__, str(error).splitlines()[0]
    return "", ""


def _g(x: float) -> str:
    return f"{x:.3g}"
