"""Flax's own ``nnx.MultiHeadAttention``, given our weights, against our JAX multi-head attention.

Flax keeps q/k/v kernels as [in, heads, head_dim] and the output kernel as
[heads, head_dim, out]: our [in, out] matrices, reshaped. Its softmax runs in float32
(``nnx.dot_product_attention``), so the comparison is made in float32.
"""

from __future__ import annotations

import numpy as np
import pytest

from transformer_spec import init_params

from ..cases import TINY, hidden, token_ids
from ..tolerances import assert_close

ORACLE = "flax nnx.MultiHeadAttention"
jax = pytest.importorskip("jax", reason="the [jax] extra is not installed")
nnx = pytest.importorskip("flax.nnx")
jax_impl = pytest.importorskip("jax_impl")


@pytest.fixture(autouse=True)
def _label():
    from .. import tolerances

    tolerances.current_backend["name"] = "jax"


@pytest.mark.parametrize("t_q, t_k", [(11, 11), (7, 11)])
def test_flax_multi_head_attention_agrees_with_ours_in_float32(t_q, t_k):
    config, jnp = TINY, jax.numpy
    params = init_params(config, seed=6, dtype="float32", component="attention", nonzero_biases=True)
    ours = jax_impl.from_params(jax_impl.MultiHeadAttention, config, params)
    d, h, d_k = config.d_model, config.num_heads, config.d_k
    flax_mha = nnx.MultiHeadAttention(
        num_heads=h, in_features=d, qkv_features=d, out_features=d, decode=False, dtype=jnp.float32,
        param_dtype=jnp.float32, precision=jax.lax.Precision.HIGHEST, rngs=nnx.Rngs(0),
    )  # fmt: skip
    for ours_name, theirs in (("w_q", flax_mha.query), ("w_k", flax_mha.key), ("w_v", flax_mha.value)):
        theirs.kernel[...] = jnp.asarray(params[f"{ours_name}.weight"].reshape(d, h, d_k))  # [in, H, d_k]
        theirs.bias[...] = jnp.asarray(params[f"{ours_name}.bias"].reshape(h, d_k))
    flax_mha.out.kernel[...] = jnp.asarray(params["w_o.weight"].reshape(h, d_k, d))  # [H, d_k, out]
    flax_mha.out.bias[...] = jnp.asarray(params["w_o.bias"])
    query, memory = hidden(3, t_q, d, seed=1).astype("float32"), hidden(3, t_k, d, seed=2).astype("float32")
    mask = (token_ids(53, 3, t_k, pad=True) != 0)[:, None, None, :]  # every row keeps a key
    want = flax_mha(jnp.asarray(query), jnp.asarray(memory), jnp.asarray(memory), mask=jnp.asarray(mask))
    got, _ = ours(jnp.asarray(query), jnp.asarray(memory), jnp.asarray(memory), jnp.asarray(mask))
    assert_close(np.asarray(got), np.asarray(want), "float32", "nnx.MultiHeadAttention output")
