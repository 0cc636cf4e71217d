"""Every fused kernel computes what the written-out (teaching) code computes.

Each backend's ``kernels.py`` registers its kernels in ``KERNELS``; a teaching function or
forward marked ``@fusable(name)`` runs ``KERNELS[name]`` while fused kernels are enabled
(the default) and no trace is recording. Here every registered kernel is run both ways
through the public switch, ``kernels.fused_kernels(True)`` and ``(False)``, on inputs
it applies to (and on some it declines), and held to the written-out code: float64 to
1e-12, float32 to the suite's 1e-5. A query row with no allowed key gives 0, never NaN, on
every path, forward and backward. A registered kernel that no case here runs fails
``test_every_registered_kernel_is_held_by_a_case_that_runs_it``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from transformer_cli.main import main
from transformer_cli.trace import TRACED_PATH
from transformer_run.batches import decoder_only_batch, encoder_decoder_batch
from transformer_spec import init_params
from transformer_spec.kernels import TILED_FROM_KEYS

from ..cases import DTYPES, SHAPES, TINY, VARIANTS, as_kind, hidden, model_inputs, token_ids
from ..tolerances import assert_close, assert_loss_and_gradients_match

ORACLE = "the written-out path"  # what the summary at the end of a run says these were compared with


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


def both_ways(backend, run: Callable[[], Any]) -> tuple[Any, Any]:
    """-> (run() with fused kernels, run() with the written-out code), through the public switch."""
    with backend.impl.kernels.fused_kernels(True):
        fused = run()
    with backend.impl.kernels.fused_kernels(False):
        written_out = run()
    return fused, written_out


@contextmanager
def counting_calls(backend, name: str):
    """Counts the calls in which ``KERNELS[name]`` ran (returned a result, not NotImplemented)."""
    kernels = backend.impl.kernels.KERNELS
    kernel, ran = kernels[name], []

    def counted(*args, **kwargs):
        result = kernel(*args, **kwargs)
        if result is not NotImplemented:
            ran.append(name)
        return result

    kernels[name] = counted
    try:
        yield ran
    finally:
        kernels[name] = kernel


# ---------------------------------------------------------------- one case per kernel and input
# name -> (the kernel it holds, a function of (backend, dtype) -> (run, check)): ``run()``
# computes NumPy outputs through the teaching function or module, ``check(outputs)`` adds the
# case's own assertions (0 where no key was allowed) to both paths' outputs.


def _gelu(backend, dtype):
    x = np.concatenate([np.linspace(-8, 8, 4001), hidden(3, 7, 37).ravel() * 3]).astype(dtype)
    return lambda: backend.call(backend.impl.gelu, x), None


def _layer_norm(config):
    def case(backend, dtype):
        params = init_params(config, seed=5, dtype=dtype, component="layer_norm", nonzero_biases=True)
        norm = backend.build("LayerNorm", config, params)
        x = (hidden(3, 7, config.d_model) * 3 + 5).astype(dtype)  # a mean far from 0
        return lambda: backend.call(norm, x), None

    return case


def _attention(inputs: str, mask_name: str, config=TINY, keys: int = 11):
    """``inputs``: "self" (query is key is value), "cross" (key is value, ``keys`` long), "separate"."""

    def case(backend, dtype):
        params = init_params(config, seed=5, dtype=dtype, component="attention", nonzero_biases=True)
        attention = backend.build("MultiHeadAttention", config, params)
        t_k = 7 if inputs == "self" else keys
        query = backend.asarray(hidden(3, 7, config.d_model).astype(dtype))
        key = query if inputs == "self" else backend.asarray(hidden(3, t_k, config.d_model, seed=2).astype(dtype))
        value = key if inputs != "separate" else backend.asarray(hidden(3, t_k, config.d_model, seed=3).astype(dtype))
        mask = attention_masks(7, t_k)[mask_name]
        empty = empty_rows(mask, 3, 7)

        def check(outputs):
            output, weights = outputs
            assert weights is None
            if empty.any():  # a query with no allowed key gets context 0: its output is w_o's bias alone
                bias = params["w_o.bias"] if config.bias else np.zeros(config.d_model, dtype)
                assert_close(output[empty], np.broadcast_to(bias, output[empty].shape), dtype, "output, no key")

        return lambda: backend.call(attention, query, key, value, mask), check

    return case


def _feed_forward(config, train: bool = False):
    def case(backend, dtype):
        params = init_params(config, seed=3, dtype=dtype, component="feed_forward", nonzero_biases=True)
        ffn = backend.build("PositionwiseFeedForward", config, params)
        ffn.train() if train else ffn.eval()
        x = hidden(3, 11, config.d_model).astype(dtype)
        if train:  # dropout draws from a seeded stream: the same masks both ways
            return lambda: (backend.impl.seed_dropout(ffn, 0), backend.call(ffn, x))[1], None
        return lambda: backend.call(ffn, x), None

    return case


MODERN = TINY.replace(
    d_model=54, num_heads=9, num_kv_heads=3, norm="rms_norm", activation="silu", gated_ffn=True, positional="rotary"
)  # the modern decoder's parts (test_modern.py): GQA 9 / 3, rotary, SwiGLU, RMSNorm


def _rms_norm(backend, dtype):
    params = init_params(MODERN, seed=5, dtype=dtype, component="rms_norm", nonzero_biases=True)
    norm = backend.build("RMSNorm", MODERN, params)
    x = (hidden(3, 7, MODERN.d_model) * 3 + 5).astype(dtype)
    return lambda: backend.call(norm, x), None


def packed_for_decoding(backend, module):
    """``module`` with the weights that read one input packed into one matrix, as a cached stepper
    packs its model's (``kernels.decoding_layout``; JAX has none: nothing to pack)."""
    layout = getattr(backend.impl.kernels, "decoding_layout", None)
    if layout is not None:
        layout(module)
    return module


def _gated_feed_forward(config, packed: bool = False):
    def case(backend, dtype):
        params = init_params(config, seed=3, dtype=dtype, component="gated_feed_forward", nonzero_biases=True)
        ffn = backend.build("GatedFeedForward", config, params)
        if packed:
            packed_for_decoding(backend, ffn)
        x = hidden(3, 11, config.d_model).astype(dtype)
        return lambda: backend.call(ffn, x), None

    return case


def _attend(config, mask_name: str, new: int = 4, joins: bool = False, packed: bool = False):
    """A decoding step: ``new`` queries at positions 7 .. 7 + new - 1 over a key/value cache (new=1:
    one token per sequence, as generation steps run). ``joins=False``: the cache holds 11 (rotated)
    keys and values and the step brings none (cross-attention reads the memory's so); True: it
    holds 7 and the step's own join them (self-attention), 7 + new in all."""

    def case(backend, dtype):
        params = init_params(config, seed=5, dtype=dtype, component="attention", nonzero_biases=True)
        attention = backend.build("MultiHeadAttention", config, params)
        if packed:  # q, k and v one matrix: the kernel's one product for all three
            packed_for_decoding(backend, attention)
        memory = backend.asarray(hidden(3, 11, config.d_model, seed=2).astype(dtype))
        query = backend.asarray(hidden(3, new, config.d_model).astype(dtype))
        keys = 7 + new if joins else 11
        mask = np.ones((3, 1, 1, keys), bool) if mask_name == "every-key" else attention_masks(4, keys)[mask_name]
        mask = None if mask is None else backend.asarray(mask[:, :, :new])
        cached = memory[:, :7] if joins else memory  # (3, 7 or 11, d_model): positions 0 ..

        def run():  # a new cache each run: a step writes into it
            cache = backend.impl.attention.KeyValueCache(*attention.key_value(cached, cached))  # (B, H_kv, T, d_k)
            new_keys = query if joins else None  # (3, new, d_model), or none: the cache holds them all
            output, _ = attention(query, new_keys, new_keys, mask, cache=cache, position=7)  # (3, new, d_model)
            return backend.to_numpy(output)

        return run, None

    return case


def _decode(config, batch: int = 3, padded: bool = True):
    """Cached decoding of a decoder-only model: a prompt (padded rows, or one unpadded row) and
    three steps, through the backend's cached stepper (which packs the weights when fused kernels
    are on): the logits of every step."""

    def case(backend, dtype):
        params = init_params(as_kind(config, "decoder_only"), seed=4, dtype=dtype, nonzero_biases=True)
        model = backend.impl.build_model(as_kind(config, "decoder_only"), params)
        prompt = token_ids(config.tgt_vocab_size, batch, 6, pad=padded, pad_id=config.pad_id, seed=3)

        def run():
            stepper = backend.impl.make_stepper(model)
            state, tokens, steps = stepper.start(prompt[:, :-1], 3), prompt[:, -1], []
            for position in range(3):
                logits, state = stepper.step(state, tokens, position)  # (B, V)
                steps.append(logits)
                tokens = logits.argmax(axis=-1)
            return np.stack(steps)  # (3, B, V)

        return run, None

    return case


LONG = TILED_FROM_KEYS + 37  # keys: the attention kernels' tiled path, a last block of 37

CASES: dict[str, tuple[str, Callable]] = {
    "decode_step-modern-padded": ("decode_step", _decode(MODERN.replace(attention_bias=True, ffn_bias=True))),
    "decode_step-modern-batch-1": ("decode_step", _decode(MODERN, batch=1, padded=False)),
    "decode_step-pre-gelu-learned": ("decode_step", _decode(VARIANTS["pre-gelu-learned"])),
    "decode_step-pre-tied-nofinal": ("decode_step", _decode(VARIANTS["pre-relu-none-tied-nofinal"])),
    "decode_step-post-norm": ("decode_step", _decode(TINY)),  # declined: post-norm is written out
    "rms_norm": ("rms_norm", _rms_norm),
    "gated_feed_forward-silu": ("gated_feed_forward", _gated_feed_forward(MODERN)),
    "gated_feed_forward-gelu": ("gated_feed_forward", _gated_feed_forward(MODERN.replace(activation="gelu"))),
    "gated_feed_forward-packed-silu": ("gated_feed_forward", _gated_feed_forward(MODERN, packed=True)),
    "gated_feed_forward-packed-gelu": (
        "gated_feed_forward",
        _gated_feed_forward(MODERN.replace(activation="gelu", ffn_bias=True), packed=True),
    ),
    **{
        f"multi_head_attention-gqa-rotary-{inputs}-{mask}": ("multi_head_attention", _attention(inputs, mask, MODERN))
        for inputs in ("self", "cross")
        for mask in ("none", "per-query")
    },
    "multi_head_attention-mqa": ("multi_head_attention", _attention("self", "padding", MODERN.replace(num_kv_heads=1))),
    **{f"cached-{mask}": ("multi_head_attention", _attend(MODERN, mask)) for mask in MASKS},
    **{f"cached-joining-{mask}": ("multi_head_attention", _attend(MODERN, mask, joins=True)) for mask in MASKS},
    **{f"cached-packed-{mask}": ("multi_head_attention", _attend(MODERN, mask, joins=True, packed=True))
       for mask in MASKS},  # fmt: skip
    "cached-packed-mha": ("multi_head_attention", _attend(TINY, "padding", joins=True, packed=True)),
    "cached-packed-one-query": ("multi_head_attention", _attend(MODERN, "every-key", new=1, joins=True, packed=True)),
    "cached-mha": ("multi_head_attention", _attend(TINY, "padding")),
    "cached-one-query": ("multi_head_attention", _attend(MODERN, "per-query", new=1)),
    "cached-one-query-joining": ("multi_head_attention", _attend(MODERN, "per-query", new=1, joins=True)),
    # a mask that hides nothing
    "cached-one-query-every-key": ("multi_head_attention", _attend(MODERN, "every-key", new=1)),
    "gelu": ("gelu", _gelu),
    "layer_norm": ("layer_norm", _layer_norm(TINY)),
    "layer_norm-no-bias": ("layer_norm", _layer_norm(TINY.replace(bias=False))),
    **{
        f"multi_head_attention-{inputs}-{mask}": ("multi_head_attention", _attention(inputs, mask))
        for inputs in ("self", "cross", "separate")
        for mask in MASKS
    },
    # a long memory: NumPy's and JAX's kernels tile its keys (not a whole number of blocks)
    **{
        f"multi_head_attention-long-cross-{mask}": ("multi_head_attention", _attention("cross", mask, keys=LONG))
        for mask in MASKS
    },
    "multi_head_attention-long-gqa-rotary-cross": (
        "multi_head_attention",
        _attention("cross", "per-query", MODERN.replace(max_len=LONG), keys=LONG),
    ),
    "multi_head_attention-self-no-bias": (
        "multi_head_attention",
        _attention("self", "padding", TINY.replace(bias=False)),
    ),
    "feed_forward-relu": ("feed_forward", _feed_forward(TINY)),
    "feed_forward-gelu": ("feed_forward", _feed_forward(TINY.replace(activation="gelu"))),
    # what torch's kernel declines, run written out (with the other kernels)
    "feed_forward-gelu_tanh": ("feed_forward", _feed_forward(TINY.replace(activation="gelu_tanh"))),
    "feed_forward-no-bias": ("feed_forward", _feed_forward(TINY.replace(bias=False))),
    "feed_forward-dropout": ("feed_forward", _feed_forward(TINY.replace(dropout=0.3), train=True)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_fused_kernel_equals_the_written_out_code(backend, dtype, case):
    kernel, make = CASES[case]
    if kernel not in backend.impl.kernels.KERNELS:
        pytest.skip(f"{backend.name} registers no {kernel!r} kernel: the written-out code is its only path")
    if not _runs_in(backend, case):
        pytest.skip(f"{backend.name}'s key/value cache is a fixed-size buffer, not the growing one this case builds")
    run, check = make(backend, dtype)
    fused, written_out = both_ways(backend, run)
    for outputs in (fused, written_out):
        assert all(np.isfinite(a).all() for a in _arrays(outputs))
        if check is not None:
            check(outputs)
    for got, want in zip(_arrays(fused), _arrays(written_out), strict=True):
        assert_close(got, want, dtype, f"{case}: fused vs written-out")


def _runs_in(backend, case: str) -> bool:
    """The cached cases build the key/value cache NumPy and torch grow by concatenation; JAX's is a
    fixed-size buffer written at a traced position (jit-static-shapes), and its one kernel declines
    a decoding step: they run in NumPy and torch."""
    return not (backend.name == "jax" and case.startswith("cached"))


def _arrays(outputs) -> list[np.ndarray]:
    """An output, or a tuple of outputs without its Nones (attention's weights when not asked for)."""
    return [o for o in (outputs if isinstance(outputs, tuple) else (outputs,)) if o is not None]


def test_every_registered_kernel_is_held_by_a_case_that_runs_it(backend):
    """No kernel escapes the comparison above: each has a case, and on some case (float32) it
    runs rather than declining, so the comparison is not the written-out code against itself."""
    for name in backend.impl.kernels.KERNELS:
        cases = [case for case, (kernel, _) in CASES.items() if kernel == name and _runs_in(backend, case)]
        assert cases, f"{backend.name}'s kernel {name!r} has no case in test_fast_paths.CASES"
        if backend.name == "jax":  # a kernel runs when a function is traced: no compiled program kept
            import jax

            jax.clear_caches()
        with counting_calls(backend, name) as ran, backend.impl.kernels.fused_kernels(True):
            for case in cases:
                CASES[case][1](backend, "float32")[0]()
        assert ran, f"{backend.name}'s kernel {name!r} declined every one of its cases"


# ---------------------------------------------------------------- whole models, forward and backward


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only", "encoder_only"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_whole_models_are_the_same_with_and_without_fused_kernels(backend, dtype, kind, variant):
    """Every kernel in its place at once; the source's second sequence is all padding (its
    encoder rows and the decoder's cross-attention rows have no key at all)."""
    config = as_kind(VARIANTS[variant], kind)
    params = init_params(config, seed=11, dtype=dtype, nonzero_biases=True)
    model = backend.impl.build_model(config, params)
    inputs = model_inputs(config, SHAPES["padded-3x11x7"])
    if kind != "decoder_only":
        inputs[0][1] = config.pad_id
    fused, written_out = both_ways(backend, lambda: backend.call(model, *inputs))
    field = "logits" if config.uses_decoder else "last_hidden_state"
    got, want = getattr(fused, field), getattr(written_out, field)
    assert np.isfinite(got).all() and np.isfinite(want).all()
    assert_close(got, want, dtype, f"{kind} {variant}: fused vs written-out")


@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only"])
def test_gradients_are_the_same_with_and_without_fused_kernels(backend, kind):
    """float64 ``loss_and_grads`` both ways, finite where a query row had no allowed key
    (source row 1 is all padding; target row 2 starts with a pad, so its first query has none)."""
    config = as_kind(VARIANTS["pre-gelu-learned"], kind)
    if kind == "decoder_only":
        ids = token_ids(config.tgt_vocab_size, 3, 9, pad=True, seed=1)
        ids[2, 0] = config.pad_id
        batch = decoder_only_batch(ids)
    else:
        src = token_ids(config.src_vocab_size, 3, 11, pad=True, seed=2)
        src[1] = config.pad_id
        tgt = token_ids(config.tgt_vocab_size, 3, 8, pad=True, seed=1)
        tgt[2, 0] = config.pad_id
        batch = encoder_decoder_batch(src, tgt)
    params = init_params(config, seed=11, dtype="float64", nonzero_biases=True)
    fused, written_out = both_ways(
        backend, lambda: backend.impl.loss_and_grads(backend.impl.build_model(config, params), batch, 0.1)
    )
    assert_loss_and_gradients_match(fused, written_out, f"{kind}: fused vs written-out")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mask_name", MASKS)
def test_attention_output_is_the_same_whether_or_not_the_weights_are_returned(backend, dtype, mask_name):
    """need_weights=True always runs the written-out attention (a fused kernel has no weights)."""
    params = init_params(TINY, seed=5, dtype=dtype, component="attention", nonzero_biases=True)
    attention = backend.build("MultiHeadAttention", TINY, params)
    query, memory = hidden(3, 7, TINY.d_model).astype(dtype), hidden(3, 11, TINY.d_model, seed=2).astype(dtype)
    mask = attention_masks(7, 11)[mask_name]
    fast, none = backend.call(attention, query, memory, memory, mask)
    written_out, weights = backend.call(attention, query, memory, memory, mask, need_weights=True)
    assert none is None and weights.shape == (3, TINY.num_heads, 7, 11)
    assert_close(fast, written_out, dtype, "attention output, without vs with weights")
    empty = empty_rows(mask, 3, 7)
    assert np.isfinite(fast).all() and np.isfinite(written_out).all()
    if empty.any():
        assert (weights.transpose(0, 2, 1, 3)[empty] == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_encoder_output_is_the_same_whether_or_not_weights_and_hidden_states_are_kept(backend, dtype):
    """The stack without weights (fused kernels where a backend has them) and without hidden
    states (kept only when asked for) against the stack with both, a sequence of all padding included."""
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


# ---------------------------------------------------------------- when a kernel runs


def test_the_switch_is_process_wide_and_restored_after_the_block(backend):
    impl = backend.impl.kernels
    assert impl.fused_kernels_enabled()  # the default
    with impl.fused_kernels(False):
        assert not impl.fused_kernels_enabled()
        with impl.fused_kernels(True):
            assert impl.fused_kernels_enabled()
        assert not impl.fused_kernels_enabled()
    assert impl.fused_kernels_enabled()
    impl.use_fused_kernels(False)
    try:
        assert not impl.fused_kernels_enabled()
    finally:
        impl.use_fused_kernels(True)


def test_attention_kernels_step_aside_when_weights_are_wanted_dropped_out_or_traced(backend):
    """Not when the weights are returned, traced, or dropped out (training with dropout > 0). The
    queries attend over a long memory, where every backend's attention kernel applies (JAX's
    only there)."""
    if "multi_head_attention" not in backend.impl.kernels.KERNELS:
        pytest.skip(f"{backend.name} registers no multi_head_attention kernel")
    x = backend.asarray(hidden(3, 7, TINY.d_model))
    memory = backend.asarray(hidden(3, LONG, TINY.d_model, seed=2))

    def runs_fused(config, train: bool = False, **kwargs) -> bool:
        params = init_params(config, seed=5, dtype="float64", component="attention", nonzero_biases=True)
        attention = backend.build("MultiHeadAttention", config, params)
        attention.train() if train else attention.eval()
        with counting_calls(backend, "multi_head_attention") as ran:
            backend.call(attention, x, memory, memory, **kwargs)
        return bool(ran)

    assert runs_fused(TINY)
    assert runs_fused(TINY, train=True)  # dropout 0: training computes the same function
    assert not runs_fused(TINY, need_weights=True)
    assert not runs_fused(TINY.replace(dropout=0.1), train=True)
    assert runs_fused(TINY.replace(dropout=0.1), train=False)
    # a trace records the scores and weights, which only the written-out path has
    attention = backend.build(
        "MultiHeadAttention", TINY, init_params(TINY, seed=5, dtype="float64", component="attention")
    )
    with counting_calls(backend, "multi_head_attention") as ran:
        trace = backend.impl.trace_model(attention, x, memory, memory)
    assert not ran and "scores" in trace and "weights" in trace


def test_no_kernel_runs_while_a_trace_records(backend):
    """A trace records the written-out path's intermediates: every kernel steps aside."""
    config = as_kind(TINY.replace(activation="gelu"), "encoder_only")
    model = backend.impl.build_model(config, init_params(config, seed=1, dtype="float64"))
    ids = backend.asarray(token_ids(config.src_vocab_size, 3, 11, pad=True))
    ran = []
    with _counting_all(backend, ran):
        trace = backend.impl.trace_model(model, ids)
        assert not ran, f"kernels ran while a trace recorded: {sorted(set(ran))}"
        backend.call(model, ids)
    assert any(name.endswith(".weights") for name in trace)
    # outside a trace they do run, where a backend has kernels for these inputs (JAX's attention
    # kernel takes only sequences of TILED_FROM_KEYS keys or more: test_fused_kernel_... holds it;
    # decode_step runs in a cached stepper only)
    long_only = {"multi_head_attention", "decode_step"} if backend.name == "jax" else set()
    assert bool(ran) == bool(set(backend.impl.kernels.KERNELS) - long_only)


@contextmanager
def _counting_all(backend, ran: list):
    kernels = backend.impl.kernels.KERNELS
    saved = dict(kernels)
    for name, kernel in saved.items():

        def counted(*args, _kernel=kernel, _name=name, **kwargs):
            result = _kernel(*args, **kwargs)
            if result is not NotImplemented:
                ran.append(_name)
            return result

        kernels[name] = counted
    try:
        yield
    finally:
        kernels.update(saved)


# ---------------------------------------------------------------- NumPy


def test_numpy_float32_gelu_kernel_is_within_5e_7_of_the_exact_one_and_float64_is_the_written_out(reference):
    """NumPy's gelu kernel takes erf from a rational approximation in float32 (within 5e-7 of
    the exact erf); in float64 it declines, so float64 is scipy's exact erf, bit for bit."""
    from scipy import special

    impl = reference.impl
    if "gelu" not in impl.kernels.KERNELS:
        pytest.skip("numpy registers no gelu kernel")
    x = np.concatenate([np.linspace(-10, 10, 200001), [0.0, -0.0, 3.99, 4.0, 4.01, 50.0, -50.0]])
    exact = 0.5 * x * (1.0 + special.erf(x / np.sqrt(2.0)))
    fused, written_out = both_ways(reference, lambda: impl.gelu(x.astype("float32")))
    assert fused.dtype == np.float32
    # 0.5 x (1 + erf): an erf error e becomes 0.5 |x| e, plus float32 rounding of the result
    assert (np.abs(fused - exact) <= 0.5 * np.abs(x) * 5e-7 + 1.2e-7 * np.abs(exact) + 1e-30).all()
    fused, written_out = both_ways(reference, lambda: impl.gelu(x))
    assert np.array_equal(fused, written_out)


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


# ---------------------------------------------------------------- what the commands say


def test_trace_says_it_traced_the_written_out_path(capsys):
    assert main(["trace", "--backends", "numpy", "--dtype", "float64"]) == 0
    assert TRACED_PATH in capsys.readouterr().out


def test_compare_runs_the_fused_and_the_written_out_path_side_by_side(capsys):
    assert main(["compare", "--backends", "numpy", "--dtype", "float64", "--repeat", "1", "--kernels", "both"]) == 0
    out = capsys.readouterr().out
    assert "numpy float64 fused " in out and "numpy float64 written-out " in out


# ------------------------------------------------- torch's weights laid out for decoding


@pytest.mark.parametrize("fused", [True, False])
def test_torch_decoding_layout_changes_only_strides_and_only_with_fused_kernels(fused):
    torch = pytest.importorskip("torch")
    from transformer_backends import get_backend

    impl = get_backend("torch").impl
    config = as_kind(TINY.replace(tie_output=True), "decoder_only")
    model = impl.build_model(config, init_params(config, seed=0), dtype="float64")
    (ids,) = model_inputs(config, (2, 7, 0, True))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    logits = model(ids).logits.detach()
    with impl.kernels.fused_kernels(fused):
        impl.kernels.decoding_layout(model)
    tied = model.tgt_embed.token.weight
    matrices = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)] + [tied]
    for weight in matrices:  # with fused kernels (out, in) stored column by column (alone, or a column
        # block of a packed [in, q + k + v] or [in, gate + up] matrix), or rows where out < in; untouched without
        if fused and weight.shape[0] >= weight.shape[1]:
            assert weight.stride()[0] == 1 and weight.stride()[1] >= weight.shape[0]
        else:
            assert weight.stride() == (weight.shape[1], 1)
    for name, p in model.named_parameters():
        assert p.shape == before[name].shape and bool((p == before[name]).all()), name
    assert_close(model(ids).logits.detach().numpy(), logits.numpy(), "float64", "logits after decoding_layout")


# ------------------------------------------------- weights packed for decoding, in every backend


def _own_storage(backend, linear) -> None:
    """Give one packed weight storage of its own, as an optimizer or a load may (its values kept)."""
    if backend.name == "torch":
        linear.weight.data = linear.weight.data.clone()
    elif backend.name == "numpy":
        linear.weight = linear.weight.copy()


@pytest.mark.parametrize("dtype", DTYPES)
def test_cached_decoding_with_packed_weights_gives_the_written_out_logits(backend, dtype):
    """The cached stepper packs each self-attention's q, k and v and each gated feed-forward's gate
    and up into one matrix (``kernels.decoding_layout``) and multiplies each group once a step. Its
    logits at every step of a padded prompt equal those of a stepper made with fused kernels off
    (the weights unpacked, the written-out code), biases and all; and still do when a weight was
    given storage of its own after packing (its group is then multiplied apart, never stale)."""
    config = as_kind(MODERN.replace(attention_bias=True, ffn_bias=True), "decoder_only")
    params = init_params(config, seed=4, dtype=dtype, nonzero_biases=True)
    prompt = token_ids(config.tgt_vocab_size, 3, 5, pad=True, pad_id=config.pad_id, seed=3)

    def logits(fused: bool, moved: bool = False) -> np.ndarray:
        model = backend.impl.build_model(config, params)
        with backend.impl.kernels.fused_kernels(fused):
            stepper = backend.impl.make_stepper(model)
            if moved:
                _own_storage(backend, model.decoder.layers[0].self_attn.w_k)
                _own_storage(backend, model.decoder.layers[1].ffn.w_up)
            state, tokens, steps = stepper.start(prompt, 4), prompt[:, -1], []
            for position in range(4):
                step, state = stepper.step(state, tokens, position)  # (3, V)
                steps.append(step)
                tokens = step.argmax(axis=-1)
        return np.stack(steps)

    want = logits(fused=False)
    assert_close(logits(fused=True), want, dtype, "packed decoding vs written-out")
    assert_close(logits(fused=True, moved=True), want, dtype, "a weight moved after packing vs written-out")


def test_packing_keeps_every_weight_s_values_shape_and_name(backend):
    """decoding_layout changes where the weights live, not what they are: the canonical weights
    read back from the model are the ones it was built with, exactly."""
    layout = getattr(backend.impl.kernels, "decoding_layout", None)
    if layout is None:
        pytest.skip(f"{backend.name} packs nothing")
    config = as_kind(MODERN.replace(attention_bias=True, ffn_bias=True), "decoder_only")
    params = init_params(config, seed=4, dtype="float64", nonzero_biases=True)
    model = backend.impl.build_model(config, params)
    layout(model)
    attention = model.decoder.layers[0].self_attn
    assert backend.impl.kernels.packed_columns((attention.w_q, attention.w_k, attention.w_v)) is not None
    back = backend.impl.to_params(model)
    assert sorted(back) == sorted(params)
    for name, array in params.items():
        assert back[name].shape == array.shape and np.array_equal(back[name], array), name
