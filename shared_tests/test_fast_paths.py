"""Each fast path computes what the written-out (teaching) path computes.

torch runs ``F.gelu`` for the exact GELU, and ``F.scaled_dot_product_attention``
(``torch_impl.attention._fused_attention``) for the attention when no weights are wanted;
NumPy takes a rational approximation of erf in float32 and runs every Linear as one 2-D
matmul. Each is held to the written-out version: float64 to 1e-12, float32 to the suite's
1e-5, and a query row with no allowed key gives 0, never NaN, on every path.
"""

from __future__ import annotations

import numpy as np
import pytest

from transformer_spec import init_params

from . import tolerances
from .cases import DTYPES, TINY, hidden
from .tolerances import assert_close

ORACLE = "the written-out path"  # what the summary at the end of a run says these were compared with


@pytest.fixture
def torch_impl(request):
    """torch's own fast paths (private helpers): skipped when torch is missing or not selected."""
    selected = request.config.getoption("--backend")
    if selected and "torch" not in selected:
        pytest.skip("torch not selected with --backend")
    pytest.importorskip("torch", reason="the [torch] extra is not installed")
    tolerances.current_backend["name"] = "torch"
    import torch_impl

    return torch_impl


def attention_masks(t_q: int, t_k: int) -> dict[str, np.ndarray | None]:
    """Masks of every shape ours take (True = may attend), each with query rows that may
    attend to nothing: a whole sequence of padding, or single rows."""
    rng = np.random.default_rng(7)
    padding = np.ones((3, 1, 1, t_k), bool)
    padding[1, ..., 6:] = False
    padding[2] = False  # a batch entry that is all padding: every one of its rows is empty
    per_query = rng.random((3, 1, t_q, t_k)) < 0.6
    per_query[:, :, :, 0] = True
    per_query[0, :, 3] = False
    per_query[2, :, 0] = False
    shared = np.tril(np.ones((1, 1, t_q, t_k), bool), k=-1)  # row 0 has no key
    return {"none": None, "padding": padding, "per-query": per_query, "shared": shared}


def empty_rows(mask: np.ndarray | None, batch: int, t_q: int) -> np.ndarray:
    """(B, T_q) bool: the query rows that may attend to no key."""
    if mask is None:
        return np.zeros((batch, t_q), bool)
    return np.broadcast_to(~mask.any(axis=-1)[:, 0], (batch, t_q))


MASKS = ["none", "padding", "per-query", "shared"]


# ---------------------------------------------------------------- every backend


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_name", MASKS)
def test_attention_output_is_the_same_whether_or_not_the_weights_are_returned(backend, dtype, mask_name):
    """need_weights=False is torch's fused path, need_weights=True the written-out one (the
    other backends have one path: this holds for them trivially)."""
    params = init_params(TINY, seed=5, dtype=dtype, component="attention", nonzero_biases=True)
    attention = backend.build("MultiHeadAttention", TINY, params)
    query, memory = hidden(3, 7, TINY.d_model).astype(dtype), hidden(3, 11, TINY.d_model, seed=2).astype(dtype)
    mask = attention_masks(7, 11)[mask_name]
    fast, none = backend.call(attention, query, memory, memory, mask)
    written_out, weights = backend.call(attention, query, memory, memory, mask, need_weights=True)
    assert none is None and weights.shape == (3, TINY.num_heads, 7, 11)
    assert_close(fast, written_out, dtype, "attention output, without vs with weights")
    # a query with no allowed key gets context 0, so its output is w_o's bias alone
    empty = empty_rows(mask, 3, 7)
    assert np.isfinite(fast).all() and np.isfinite(written_out).all()
    if empty.any():
        bias = np.broadcast_to(params["w_o.bias"], fast[empty].shape)
        assert_close(fast[empty], bias, dtype, "output of a query with no allowed key")
        assert_close(written_out[empty], bias, dtype, "output of a query with no allowed key")
        assert (weights.transpose(0, 2, 1, 3)[empty] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_encoder_output_is_the_same_whether_or_not_weights_and_hidden_states_are_kept(backend, dtype):
    """The stack without weights (torch: fused attention) and without hidden states (kept
    only when asked for) against the stack with both, a sequence of all padding included."""
    config = TINY.replace(activation="gelu")
    params = init_params(config, seed=3, dtype=dtype, component="encoder", nonzero_biases=True)
    encoder = backend.build("Encoder", config, params)
    x = hidden(3, 11, config.d_model).astype(dtype)
    mask = attention_masks(11, 11)["padding"]
    plain, no_hidden, no_weights = backend.call(encoder, x, mask)
    full, hidden_states, weights = backend.call(encoder, x, mask, True, True)
    assert no_hidden == () and no_weights == ()
    assert len(hidden_states) == config.num_encoder_layers + 1 and len(weights) == config.num_encoder_layers
    assert np.isfinite(plain).all()
    assert_close(plain, full, dtype, "encoder output, without vs with weights and hidden states")


# ---------------------------------------------------------------- torch


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_name", MASKS)
def test_fused_attention_equals_the_written_out_attention(torch_impl, dtype, mask_name):
    import torch

    from torch_impl.attention import _fused_attention

    rng = np.random.default_rng(0)
    q, k, v = (torch.from_numpy(rng.standard_normal((3, 2, t, 5)).astype(dtype)) for t in (7, 11, 11))
    mask = attention_masks(7, 11)[mask_name]
    mask = None if mask is None else torch.from_numpy(mask)
    want, _ = torch_impl.scaled_dot_product_attention(q, k, v, mask)
    got = _fused_attention(q, k, v, mask)
    assert_close(got.numpy(), want.numpy(), dtype, "fused vs written-out attention")
    empty = empty_rows(None if mask is None else mask.numpy(), 3, 7)
    assert (got.numpy().transpose(0, 2, 1, 3)[empty] == 0).all()  # exactly 0, not NaN, not the mean of v


@pytest.mark.parametrize("mask_name", MASKS)
def test_fused_attention_has_the_written_out_gradients(torch_impl, mask_name):
    """Training with dropout 0 takes the fused path too: its gradients must be the same,
    and finite where a query row had no allowed key."""
    import torch

    from torch_impl.attention import _fused_attention

    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((3, 2, t, 5)) for t in (7, 11, 11)]
    mask = attention_masks(7, 11)[mask_name]
    mask = None if mask is None else torch.from_numpy(mask)
    upstream = torch.from_numpy(rng.standard_normal((3, 2, 7, 5)))

    def gradients(attend) -> list[np.ndarray]:
        q, k, v = (torch.tensor(x, requires_grad=True) for x in inputs)
        (attend(q, k, v) * upstream).sum().backward()
        return [t.grad.numpy() for t in (q, k, v)]

    written_out = gradients(lambda q, k, v: torch_impl.scaled_dot_product_attention(q, k, v, mask)[0])
    fused = gradients(lambda q, k, v: _fused_attention(q, k, v, mask))
    for name, got, want in zip("qkv", fused, written_out, strict=True):
        assert np.isfinite(got).all()
        assert_close(got, want, "float64", f"gradient of {name}, fused vs written-out")


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_gelu_equals_the_written_out_gelu(torch_impl, dtype):
    import torch

    from torch_impl.feed_forward import _FUSED_ACTIVATIONS

    x = torch.from_numpy(np.concatenate([np.linspace(-8, 8, 4001), hidden(3, 7, 37).ravel() * 3]).astype(dtype))
    assert_close(_FUSED_ACTIVATIONS["gelu"](x).numpy(), torch_impl.gelu(x).numpy(), dtype, "F.gelu vs gelu")


def test_multi_head_attention_takes_the_fused_path_only_when_no_weights_are_wanted(torch_impl, monkeypatch):
    """Not when the weights are returned, traced, or dropped out (training with dropout > 0)."""
    import torch

    from torch_impl import attention as attention_module

    calls = []
    fused = attention_module._fused_attention
    monkeypatch.setattr(attention_module, "_fused_attention", lambda *args: calls.append(1) or fused(*args))

    def runs_fused(config, train: bool = False, **kwargs) -> bool:
        params = init_params(config, seed=5, dtype="float64", component="attention", nonzero_biases=True)
        attention = torch_impl.from_params(torch_impl.MultiHeadAttention, config, params).train(train)
        x = torch.from_numpy(hidden(3, 7, config.d_model))
        calls.clear()
        with torch.no_grad():
            attention(x, x, x, **kwargs)
        return bool(calls)

    assert runs_fused(TINY)
    assert runs_fused(TINY, train=True)  # dropout 0: training computes the same function
    assert not runs_fused(TINY, need_weights=True)
    assert not runs_fused(TINY.replace(dropout=0.1), train=True)
    assert runs_fused(TINY.replace(dropout=0.1), train=False)
    # a trace records the scores and weights, which only the written-out path has
    params = init_params(TINY, seed=5, dtype="float64", component="attention")
    attention = torch_impl.from_params(torch_impl.MultiHeadAttention, TINY, params)
    x = torch.from_numpy(hidden(3, 7, TINY.d_model))
    calls.clear()
    trace = torch_impl.trace_model(attention, x, x, x)
    assert not calls and "scores" in trace and "weights" in trace


# ---------------------------------------------------------------- NumPy


def test_float32_erf_is_within_5e_7_of_the_exact_one_and_float64_is_scipys(reference):
    from scipy import special

    from numpy_impl.feed_forward import _erf

    x = np.concatenate([np.linspace(-10, 10, 200001), [0.0, -0.0, 3.99, 4.0, 4.01, np.inf, -np.inf]])
    got = _erf(x.astype("float32"))
    assert got.dtype == np.float32
    assert np.abs(got - special.erf(x)).max() <= 5e-7  # scipy's own float32 erf: 3e-8
    assert np.array_equal(_erf(x), special.erf(x))  # float64: exactly scipy's, for the parity tests


LINEAR_INPUTS = {
    "3x7 positions": lambda rng: rng.standard_normal((3, 7, 6)),
    "one vector": lambda rng: rng.standard_normal(6),
    "no positions": lambda rng: rng.standard_normal((0, 4, 6)),
    "4-d": lambda rng: rng.standard_normal((2, 3, 5, 6)),
    "not contiguous": lambda rng: np.swapaxes(rng.standard_normal((3, 5, 6)), 0, 1),  # reshape copies it
}


@pytest.mark.parametrize("inputs", LINEAR_INPUTS)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_as_one_2d_matmul_equals_the_product_at_every_position(reference, inputs, bias):
    rng = np.random.default_rng(0)
    linear = reference.impl.Linear(6, 4, bias, "float64")
    linear.weight = rng.standard_normal((6, 4))
    if bias:
        linear.bias = rng.standard_normal(4)
    x = LINEAR_INPUTS[inputs](rng)
    want = np.einsum("...i,io->...o", x, linear.weight) + (linear.bias if bias else 0.0)
    got = linear(x)
    assert got.shape == (*x.shape[:-1], 4)
    if got.size:
        assert_close(got, want, "float64", "Linear")
