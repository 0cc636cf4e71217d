"""The pitfall "jax-clamped-token-ids": Out-of-range token ids silently clamped in JAX."""

from __future__ import annotations

from typing import Any

import numpy as np

from transformer_spec import init_params

from .common import CONFIG, DTYPE, _backend, _error
from .registry import Demonstration, register, source


def wrong_embedding_lookup(table, ids):
    return table[ids]  # (B, T, d_model): JAX clamps an id past the end to the last row; NumPy and JAX wrap -1


def ours_embedding_lookup(embeddings, ids):
    return embeddings(ids)  # checks every id against [0, vocab_size) first (transformer_spec.checks)


def _rows_read(table: np.ndarray, rows: np.ndarray) -> list[int]:
    """Which row of ``table`` each of ``rows`` is (-1: none, e.g. a NaN row)."""
    found = []
    for row in rows:
        match = np.flatnonzero((table == row).all(-1))
        found.append(int(match[0]) if match.size else -1)
    return found


@register(
    "jax-clamped-token-ids",
    "Out-of-range token ids silently clamped in JAX",
    ("numpy", "jax"),
)
def jax_clamped_token_ids(backend: str) -> Demonstration:
    """JAX never raises on an out-of-range index: table[ids] clamps an id past the end to the last
    row, and a negative id wraps around (nnx.Embed's jnp.take returns a NaN row past the end, but
    still wraps -1). A tokenizer bug or a vocabulary mismatch then yields plausible numbers. NumPy
    raises IndexError past the end but wraps negative ids just as silently (-1, -100: common pad
    and ignore labels). torch's nn.Embedding raises for both. Ours checks every id eagerly, in
    every backend, with one message; inside a user's jax.jit, where values are unknown, our
    lookup gives NaN rows instead of a clamped one."""
    b = _backend(backend)
    config = CONFIG
    params = init_params(config, seed=10, dtype=DTYPE, component="embeddings")
    table = params["token.weight"]  # (src_vocab_size = 53, d_model)
    vocab = config.src_vocab_size
    ids = np.array([[3, vocab, -1]])  # (1, 3): one id past the end, one negative
    embeddings = b.build("Embeddings", config, params)
    numbers: dict[str, Any] = {"vocab_size": vocab, "ids": ids[0].tolist()}
    if backend == "numpy":
        numbers["wrong_error_type"], numbers["wrong_error"] = _error(lambda: wrong_embedding_lookup(table, ids))
        silent_ids = np.array([[3, -1]])  # without the id past the end, NumPy says nothing
    else:
        silent_ids = ids
    looked_up = b.to_numpy(wrong_embedding_lookup(b.asarray(table), b.asarray(silent_ids)))[0]  # (T, d_model)
    numbers["wrong_silent_ids"] = silent_ids[0].tolist()
    numbers["wrong_rows_read"] = _rows_read(table, looked_up)
    numbers["ours_error_type"], numbers["ours_error"] = _error(
        lambda: ours_embedding_lookup(embeddings, b.asarray(ids))
    )
    if backend == "jax":
        import jax

        traced = np.asarray(jax.jit(lambda i: ours_embedding_lookup(embeddings, i))(b.asarray(ids)))[0]  # (T, d_model)
        numbers["ours_jit_nan_rows"] = [bool(np.isnan(row).all()) for row in traced]
    silent = ", ".join(
        f"id {i} -> row {r}" for i, r in zip(silent_ids[0], numbers["wrong_rows_read"], strict=True) if i != 3
    )
    extra = f"; id {vocab} raises {numbers['wrong_error_type']}" if backend == "numpy" else ""
    under_jit = f"; under jax.jit: NaN rows {numbers['ours_jit_nan_rows']}" if backend == "jax" else ""
    return Demonstration(
        pitfall="jax-clamped-token-ids",
        backend=backend,
        wrong_code=source(wrong_embedding_lookup),
        ours_code=source(ours_embedding_lookup),
        wrong=f"silently reads {silent}{extra}",
        ours=f"raises {numbers['ours_error_type']}: {numbers['ours_error']}{under_jit}",
        numbers=numbers,
    )
