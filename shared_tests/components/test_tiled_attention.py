"""The tiled attention (FlashAttention's online softmax, ``tiled_attention.py``) is the plain
attention computed a block of keys at a time: in every backend and dtype its output and its
gradients (NumPy's hand-written backward, torch's autograd, ``jax.vjp``) equal the plain
attention's in the NumPy float64 reference, on the same (rounded) inputs, for block sizes that
do and do not divide the keys, and under every mask the plain attention takes."""

from __future__ import annotations

import numpy as np
import pytest

from numpy_impl.attention import scaled_dot_product_attention, scaled_dot_product_attention_backward
from numpy_impl.module import enable_grad
from transformer_spec import init_params
from transformer_spec.kernels import TILED_FROM_KEYS

from ..cases import DTYPES, TINY
from ..tolerances import assert_close

BATCH, HEADS, T_Q, T_K, D_K, D_V = 3, 2, 5, 11, 4, 6  # T_q != T_k, d_k != d_v: no transposes hide


def attention_inputs(dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q (B, H, T_q, d_k), k (B, H, T_k, d_k), v (B, H, T_k, d_v) and the gradient of the context
    (B, H, T_q, d_v), rounded to ``dtype``."""
    rng = np.random.default_rng(seed)
    shapes = [(BATCH, HEADS, T_Q, D_K), (BATCH, HEADS, T_K, D_K), (BATCH, HEADS, T_K, D_V), (BATCH, HEADS, T_Q, D_V)]
    return tuple(rng.standard_normal(shape).astype(dtype) for shape in shapes)


def masks() -> dict[str, np.ndarray | None]:
    """Every mask shape the plain attention takes (True = may attend)."""
    rng = np.random.default_rng(3)
    padding = np.ones((BATCH, 1, 1, T_K), bool)
    padding[1, ..., 7:] = False
    per_query = rng.random((BATCH, 1, T_Q, T_K)) < 0.6
    per_query[..., 0] = True
    key_column = np.ones((BATCH, 1, T_Q, 1), bool)  # size 1 along the keys: the same for every block
    return {
        "none": None,
        "causal": np.tril(np.ones((1, 1, T_Q, T_K), bool), k=T_K - T_Q),  # the last query sees every key
        "padding": padding,
        "per-query": per_query,
        "key-column": key_column,
    }


def plain_reference(q, k, v, mask, grad_context) -> tuple[np.ndarray, ...]:
    """The plain attention's context and gradients with respect to q, k and v, in NumPy float64."""
    q, k, v, grad_context = (x.astype("float64") for x in (q, k, v, grad_context))
    context, weights = scaled_dot_product_attention(q, k, v, mask)
    return (context, *scaled_dot_product_attention_backward(q, k, v, weights, grad_context))


def tiled_context_and_gradients(backend, block_size: int, q, k, v, mask, grad_context) -> tuple[np.ndarray, ...]:
    """The backend's ``TiledAttention(block_size)``: its context, and the gradients of
    sum(context * grad_context) with respect to q, k and v, each backend's own way."""
    attention = backend.impl.TiledAttention(block_size)
    if backend.name == "numpy":  # the hand-written backward, from what the forward kept by name
        with enable_grad():
            context = attention(q, k, v, mask)
        (grad_q, grad_k, grad_v), grads = attention.backward(grad_context)
        assert grads == {}  # no parameters
        return context, grad_q, grad_k, grad_v
    mask_array = None if mask is None else backend.asarray(mask)
    if backend.name == "torch":
        import torch

        inputs = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
        context = attention(*inputs, mask_array)
        grads = torch.autograd.grad(context, inputs, torch.from_numpy(grad_context))
        return tuple(backend.to_numpy(x) for x in (context, *grads))
    import jax

    def context_and_vjp(q, k, v, grad_context):  # compiled once: op by op, JAX compiles every op
        context, vjp = jax.vjp(lambda *inputs: attention(*inputs, mask_array), q, k, v)
        return (context, *vjp(grad_context))

    outputs = jax.jit(context_and_vjp)(*map(backend.asarray, (q, k, v, grad_context)))
    return tuple(backend.to_numpy(x) for x in outputs)


CASES = {  # name -> (mask, block size)
    "no-mask-blocks-of-4": ("none", 4),  # 11 keys: 4 + 4 + 3
    "causal-blocks-of-3": ("causal", 3),
    "padding-blocks-of-5": ("padding", 5),
    "per-query-blocks-of-2": ("per-query", 2),
    "key-column-one-block": ("key-column", 64),  # more than T_k: one short block
    "key-column-blocks-of-3": ("key-column", 3),  # a key mask of size 1 broadcast to every block, not sliced
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_tiled_attention_equals_the_plain_attention_in_output_and_gradients(backend, dtype, case):
    mask_name, block_size = CASES[case]
    mask = masks()[mask_name]
    q, k, v, grad_context = attention_inputs(dtype)
    got = tiled_context_and_gradients(backend, block_size, q, k, v, mask, grad_context)
    want = plain_reference(q, k, v, mask, grad_context)
    for name, g, w in zip(("context", "grad_q", "grad_k", "grad_v"), got, want, strict=True):
        assert g.dtype == dtype and g.shape == w.shape, name
        assert_close(g, w, dtype, f"tiled attention, {case}: {name}")


def test_the_function_returns_the_softmax_denominators_log(backend):
    """``tiled_attention`` -> (context, logsumexp): logsumexp is log sum_j exp(q.k_j / sqrt(d_k)) over
    the allowed keys of each row, what the backward recomputes the weights from."""
    q, k, v, _ = attention_inputs("float64")
    mask = masks()["per-query"]
    context, logsumexp = backend.call(backend.impl.tiled_attention, q, k, v, mask, 6)
    scores = np.where(mask, q @ k.swapaxes(-1, -2) / np.sqrt(D_K), -np.inf)  # (B, H, T_q, T_k)
    assert logsumexp.shape == (BATCH, HEADS, T_Q, 1)
    assert_close(logsumexp, np.log(np.exp(scores).sum(-1, keepdims=True)), "float64", "logsumexp")
    assert_close(context, plain_reference(q, k, v, mask, np.zeros_like(context))[0], "float64", "context")


def test_a_query_with_no_allowed_key_gets_zero_output_and_zero_finite_gradients(backend):
    """As the plain attention: 0, never NaN, and no gradient flows through such a row."""
    q, k, v, grad_context = attention_inputs("float64", seed=1)
    mask = masks()["per-query"].copy()
    mask[0, :, 2] = False  # one query of the first sequence may look at nothing
    mask[2] = False  # the whole third sequence is padding
    context, grad_q, grad_k, grad_v = tiled_context_and_gradients(backend, 4, q, k, v, mask, grad_context)
    assert all(np.isfinite(x).all() for x in (context, grad_q, grad_k, grad_v))
    assert np.all(context[0, :, 2] == 0.0) and np.all(context[2] == 0.0)
    assert np.all(grad_q[0, :, 2] == 0.0) and np.all(grad_q[2] == 0.0)
    assert np.all(grad_k[2] == 0.0) and np.all(grad_v[2] == 0.0)
    want = plain_reference(q, k, v, mask, grad_context)
    got = (context, grad_q, grad_k, grad_v)
    for name, g, w in zip(("context", "grad_q", "grad_k", "grad_v"), got, want, strict=True):
        assert_close(g, w, "float64", f"tiled attention, empty rows: {name}")
    _, logsumexp = backend.call(backend.impl.tiled_attention, q, k, v, mask, 4)  # (B, H, T_q, 1)
    assert np.all(logsumexp[0, :, 2] == 0.0) and np.all(logsumexp[2] == 0.0), "an empty row's logsumexp is 0"
    assert np.isfinite(logsumexp).all()


def test_a_one_column_key_mask_with_an_empty_row_gives_numpys_tiled_results_in_every_backend(backend, reference):
    """NumPy's tiled attention, hand-written backward included, is the reference the others are held
    to, on what only tiling can get wrong: a key mask of size 1 over several blocks (broadcast to
    each, not sliced) and a query that may look at nothing (logsumexp 0, not -inf, or the backward's
    weights are NaN). Context, logsumexp and gradients, finite and equal to float64 precision. The
    tests above call NumPy's tiled attention only with --backend=numpy; this one in every run
    (numpy-tiled-attention-slices-a-one-column-key-mask, numpy-tiled-attention-empty-row-logsumexp)."""
    q, k, v, grad_context = attention_inputs("float64", seed=2)
    mask = masks()["key-column"].copy()  # (B, 1, T_q, 1)
    mask[0, :, 2] = False  # one query of the first sequence may look at nothing
    results = {}
    for side in (backend, reference):
        outputs = tiled_context_and_gradients(side, 3, q, k, v, mask, grad_context)
        _, logsumexp = side.call(side.impl.tiled_attention, q, k, v, mask, 3)  # (B, H, T_q, 1)
        results[side.name] = (*outputs, logsumexp)
    names = ("context", "grad_q", "grad_k", "grad_v", "logsumexp")
    for name, got, want in zip(names, results[backend.name], results["numpy"], strict=True):
        assert np.isfinite(want).all(), f"NumPy's {name}"
        assert_close(got, want, "float64", f"tiled attention vs NumPy's, one-column key mask: {name}")


@pytest.mark.parametrize(
    ("block_size", "error"), [(0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError), ("4", TypeError)]
)
def test_a_block_size_that_is_not_a_positive_int_is_refused(backend, block_size, error):
    q, k, v, _ = attention_inputs("float64")
    message = "block_size must be a positive int (keys per block), got "
    with pytest.raises(error) as raised:
        backend.call(backend.impl.tiled_attention, q, k, v, None, block_size)
    assert str(raised.value) == message + (str(block_size) if error is ValueError else repr(block_size))
    with pytest.raises(error, match=r"block_size must be a positive int"):
        backend.impl.TiledAttention(block_size)


def attention_input_gradients(backend, attention, query, memory, mask, upstream) -> tuple[np.ndarray, ...]:
    """``attention(query, memory, memory, mask)``'s output, and the gradients of sum(output * upstream)
    with respect to the query and the memory (its keys and values), each backend's own way."""
    if backend.name == "numpy":
        with enable_grad():
            output, _ = attention(query, memory, memory, mask)
        (grad_query, grad_key, grad_value), _ = attention.backward(upstream)
        return output, grad_query, grad_key + grad_value
    if backend.name == "torch":
        import torch

        inputs = [torch.from_numpy(x).requires_grad_() for x in (query, memory)]
        output, _ = attention(inputs[0], inputs[1], inputs[1], torch.from_numpy(mask))
        grads = torch.autograd.grad(output, inputs, torch.from_numpy(upstream))
        return tuple(backend.to_numpy(x) for x in (output, *grads))
    import jax

    def run(q, m):
        return attention(q, m, m, backend.asarray(mask))[0]

    output, vjp = jax.vjp(run, backend.asarray(query), backend.asarray(memory))
    return tuple(backend.to_numpy(x) for x in (output, *vjp(backend.asarray(upstream))))


def test_gradients_through_the_tiled_kernel_of_a_long_memory_equal_the_written_out_ones(backend):
    """Over TILED_FROM_KEYS + 37 keys (float64, a query row with no allowed key), with fused kernels
    and without: JAX's kernel (the tiled attention as a checkpointed lax.scan) and torch's
    F.scaled_dot_product_attention are differentiated; NumPy's kernel steps aside while
    gradients are kept."""
    params = init_params(TINY, seed=5, dtype="float64", component="attention", nonzero_biases=True)
    attention = backend.build("MultiHeadAttention", TINY, params)
    rng = np.random.default_rng(4)
    keys = TILED_FROM_KEYS + 37
    query, memory = rng.standard_normal((2, 5, TINY.d_model)), rng.standard_normal((2, keys, TINY.d_model))
    upstream = rng.standard_normal((2, 5, TINY.d_model))
    mask = rng.random((2, 1, 5, keys)) < 0.5
    mask[1, :, 2] = False  # one query may look at nothing
    results = {}
    for fused in (True, False):
        with backend.impl.kernels.fused_kernels(fused):
            results[fused] = attention_input_gradients(backend, attention, query, memory, mask, upstream)
    for name, got, want in zip(("output", "grad_query", "grad_memory"), results[True], results[False], strict=True):
        assert np.isfinite(got).all(), name
        assert_close(got, want, "float64", f"long memory, fused vs written-out: {name}")
