"""Reads shapes, dtypes and id ranges off JAX arrays for transformer_spec.checks.

Shapes and dtypes are static in JAX: they are known while ``jax.jit`` traces a
function, so those checks run (and raise) at trace time exactly as in NumPy. The
*values* of a traced array are not known until it runs, so the id-range check can
only run on concrete arrays; the models therefore check their ids eagerly, before
they call their jit-compiled forward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from transformer_spec import checks


def check_token_ids(
    name: str, ids: jax.Array, vocab_size: int, max_len: int | None, offset: int | jax.Array = 0
) -> None:
    if checks.caller_checked():  # a model checked them at its entry
        return
    if isinstance(offset, jax.core.Tracer):
        # A traced position (a jit-compiled decoding step, generate.py): unknown until it runs.
        # Its range was checked eagerly, before the call; here only the shape can be.
        offset = 0
    checks.check_token_ids(
        name, ids.shape, str(ids.dtype), jnp.issubdtype(ids.dtype, jnp.integer), vocab_size, max_len, offset
    )
    if isinstance(ids, jax.core.Tracer):
        # Inside jit/grad/vmap the values are abstract: nothing to look at. (The token
        # lookup fills out-of-range ids with NaN, so a bad id that gets this far is loud.)
        return
    # JAX never raises on an out-of-range index: it clamps or fills. We look at the
    # values on the host (np.asarray copies a device array back), as NumPy does.
    ids = np.asarray(ids)  # (B, T)
    bad = np.unique(ids[(ids < 0) | (ids >= vocab_size)])
    checks.check_token_id_range(name, bad.tolist(), vocab_size)


def check_mask(name: str, mask: jax.Array | None, expected: tuple[int, ...]) -> None:
    if mask is not None:
        checks.check_mask(name, mask.shape, str(mask.dtype), mask.dtype == jnp.bool_, expected)
