"""Decoding: the steppers that ``transformer_run.decoding``'s greedy and beam search drive.

The search itself is written once, in NumPy, in ``transformer_run.decoding``; a backend
only supplies a *stepper* (start / step / reorder, see ``decoding.Stepper``) that turns the
newest tokens into next-token logits. Two of them, which must give the same logits:

* ``cached=False``: every step runs the whole prefix through the model's ordinary forward
  pass and keeps the last position's logits. Obviously right, and step t redoes the work of
  every earlier step: t tokens through every layer, attention over t^2 pairs.
* ``cached=True`` (a key/value cache): the encoder runs once per source, the memory's keys and
  values are projected once, and each step feeds only the newest token: its key and value join
  each layer's cache, and its query attends over everything cached (which is the causal mask:
  no later position is in the cache yet).

JAX differences. The cache is a buffer of fixed size, written at the step's position
(``attention.append_to_cache``): room for the prompt and the steps asked for, rounded up to a
multiple of ``CACHE_BLOCK`` positions (at most ``config.max_len``), so that calls of similar
lengths share one compiled step. ``initial_cache`` and ``decode_step`` are compiled with
``jax.jit``: once per (model structure, number of running sequences, source or prompt shape,
cache size), not once per step, since the position is a traced value. The cost: every step
attends over all the buffer's slots (those not written yet are masked out). The ids and
positions are checked eagerly before each compiled call, as the models' ``__call__`` does. The
uncached stepper calls the model's jit-compiled ``__call__`` on a prefix one token longer at
every step: a new shape, so one compilation per length (JAX keeps them for later calls of that
shape).

What ``src_ids`` and ``bos`` mean:

* ``Transformer`` (encoder-decoder): ``src_ids`` (B, T_src) is the source, padded with
  ``config.pad_id``; the decoder reads ``bos`` at position 0, then what it generated.
* ``TransformerLM`` (decoder-only): ``src_ids`` (B, P) is the *prompt*, and the model reads
  ``prompt + [bos] + generated``: ``start`` runs the prompt through the decoder once, filling
  the cache; ``bos`` is the first token after it, fed at position P by the first step, and the
  first token generated is the model's prediction after ``bos``. So ``bos`` is the token that
  opens the generated part: an LM trained on "<bos> w_1 .. w_n" starts from an empty prompt
  (shape (B, 0)) and its <bos>; one trained on "question <sep> answer" gets the question as
  the prompt and <sep> as ``bos``. Prompt padding (``pad_id``) is hidden from attention as in
  the model's forward pass, but still occupies positions: rows of unequal length decode as
  the model reads them padded, not as each would alone.

As in the model's forward pass, a fed ``pad_id`` token (a finished row keeps being fed padding
by greedy search) is hidden from every later query.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from transformer_run.decoding import (
    BeamResult,
    beam_search,
    check_decoding,
    check_position,
    greedy_decode,
    sample_decode,
)
from transformer_spec.checks import inputs_checked

from . import kernels
from .attention import KeyValueCache, append_to_cache
from .checks import check_token_ids
from .decoder import LayerCache
from .masks import make_cross_attention_mask


class DecodingState(NamedTuple):
    """The cached stepper's state, N running sequences."""

    cache: tuple[LayerCache, ...]  # per decoder layer: keys/values (N, H, T_cache, d_k)
    keep: Array  # (N, T_cache): True where the token fed at that position is not padding
    memory_mask: Array | None  # (N, 1, 1, T_src) source padding; None when decoder-only
    offset: int  # the prompt's length: a step's ``position`` counts from after the prompt


class PrefixState(NamedTuple):
    """The uncached stepper's state: everything needed to re-run the model from scratch."""

    src_ids: Array  # (N, T_src): the source, or the decoder-only model's prompt (N, P)
    tgt_ids: Array  # (N, T): the tokens fed so far, from <bos>


def make_step_mask(keep: Array, position: int | Array, num_new: int) -> Array:
    """keep (N, T_cache) -> tgt_mask (N, 1, T_new, T_cache) for new tokens at positions
    position .. position + num_new - 1: each sees the cached positions up to its own, minus padding.

    For a single new token this is ``keep`` alone (everything cached is in its past); a block
    of new tokens (a prompt) also needs the causal triangle among themselves. JAX: the causal
    part also hides the buffer's slots not written yet (they all lie after the query)."""
    key_positions = jnp.arange(keep.shape[1])  # (T_cache,) = (max_len,)
    query_positions = position + jnp.arange(num_new)  # (T_new,)
    causal = key_positions[None, :] <= query_positions[:, None]  # (T_new, T_cache)
    # (N, 1, 1, T_cache) & (1, 1, T_new, T_cache) -> (N, 1, T_new, T_cache)
    return keep[:, None, None, :] & causal[None, None]


CACHE_BLOCK = 128  # cache sizes are multiples of this: one compiled step serves many lengths


def initial_cache(  # differs: jit-static-shapes
    model: Any, src_ids: Array, length: int
) -> tuple[tuple[LayerCache, ...], Array, Array | None]:
    """Before the first step -> (cache, keep, memory_mask): the encoder-decoder encodes its source
    and projects the memory's keys and values, once per layer; no target token is cached yet.
    JAX: buffers of ``length`` positions (a static argument: a shape)."""
    batch = src_ids.shape[0]
    keep = jnp.zeros((batch, length), bool)  # (N, length): a fixed-size buffer, like the cache
    memory, memory_mask = None, None
    if model.config.decoder_has_cross_attention:
        memory, _, _ = model.encode(src_ids)  # (N, T_src, d_model)
        memory_mask = make_cross_attention_mask(src_ids, model.config.pad_id)  # (N, 1, 1, T_src)
    # self-attention buffers of config.max_len positions
    cache = model.decoder.empty_cache(batch, memory)
    # the first ``length`` of them: under jit, XLA allocates only these zeros
    cache = tuple(
        layer._replace(
            self_attn=KeyValueCache(
                layer.self_attn.k[:, :, :length], layer.self_attn.v[:, :, :length]
            )
        )
        for layer in cache
    )  # (N, H_kv, length, d_k) each
    return cache, keep, memory_mask


def cache_length(  # differs: jit-static-shapes
    config: Any, prompt_length: int, max_new: int | None
) -> int:
    """Positions the cache needs for the prompt and ``max_new`` steps, rounded up to a multiple
    of CACHE_BLOCK, at most config.max_len (None: config.max_len)."""
    if max_new is None:
        return config.max_len
    needed = prompt_length + max_new
    return min(config.max_len, -(-needed // CACHE_BLOCK) * CACHE_BLOCK)


@kernels.fusable("decode_step")  # speed: a fused kernel may run instead (kernels.py)
def decode_step(
    model: Any,
    tokens: Array,
    cache: tuple[LayerCache, ...],
    keep: Array,
    memory_mask: Array | None,
    position: int | Array,
    project: bool = True,
) -> tuple[Array | None, tuple[LayerCache, ...], Array]:
    """tokens (N, T_new) at absolute positions position .. position + T_new - 1, the cache and
    ``keep`` (N, position) of every earlier one -> logits (N, T_new, V), both extended.
    ``project=False`` (a prompt filling the cache): no logits (None), the output projection
    to the vocabulary skipped."""
    fed = tokens != model.config.pad_id  # (N, T_new): padding is hidden from later queries
    # but never the decoder's start token (as make_target_mask)
    if model.config.decoder_has_cross_attention:
        fed = fed | (position + jnp.arange(tokens.shape[1]) == 0)  # (N, T_new)
    keep = append_to_cache(keep, fed, position, axis=1)  # (N, T_cache)
    tgt_mask = make_step_mask(keep, position, tokens.shape[1])  # (N, 1, T_new, T_cache)
    x = model.tgt_embed(tokens, offset=position)  # (N, T_new, d_model)
    with inputs_checked():  # the step's tokens and position are checked: the layers trust them
        x, _, _, _ = model.decoder(
            x, None, tgt_mask, memory_mask, cache=cache, position=position
        )  # (N, T_new, d_model)
        if not project:
            return None, cache, keep
        logits = model.generator(x, model.tgt_embed.token.weight[...])  # (N, T_new, V)
    return logits, cache, keep


# Compiled once per (model structure, input shapes): the model is a pytree argument, as in
# model.py's ``_jit_forward``, and ``position`` a traced value.
_jit_initial_cache = jax.jit(initial_cache, static_argnums=2)


def select_rows(tree: Any, rows: Array) -> Any:
    """Every array in a (named) tuple tree, indexed by ``rows`` along its first (batch) axis."""
    return jax.tree.map(lambda array: array[rows], tree)  # (len(rows), ...) each


class CachedStepper:
    """``decoding.Stepper`` with a key/value cache: one token per sequence per step."""

    def __init__(self, model: Any):
        self.model = model
        # the model taken apart for jax.jit, at each start  # differs: decoding-layout
        self.split = None

    def start(self, src_ids: np.ndarray, max_new: int | None = None) -> DecodingState:
        """``max_new``: the steps to come; the cache reserves room for them (``cache_length``)."""
        # differs: jax-jit
        config = self.model.config
        src_ids = _to_device(self.model, src_ids)  # (N, T_src), or the prompt (N, P)
        vocab = (
            config.src_vocab_size if config.decoder_has_cross_attention else config.tgt_vocab_size
        )
        # eagerly, on the concrete ids: the compiled code cannot look at values
        if src_ids.shape[1]:
            check_token_ids("ids", src_ids, vocab, config.max_len)
        prompt = 0 if config.decoder_has_cross_attention else src_ids.shape[1]
        length = cache_length(config, prompt, max_new)
        # the model's arrays as they are now, for this generation's steps (split once, not per step)
        self.split = kernels.split_model(self.model)
        cache, keep, memory_mask = _jit_initial_cache(self.model, src_ids, length)
        if config.decoder_has_cross_attention or src_ids.shape[1] == 0:
            return DecodingState(cache, keep, memory_mask, 0)
        # decoder-only: the prompt, all of it in one call, fills the cache at positions 0 .. P - 1
        _, cache, keep = kernels.compiled_decode_step(
            *self.split, src_ids, cache, keep, None, 0, project=False
        )  # None, ...
        return DecodingState(cache, keep, None, src_ids.shape[1])

    def step(
        self, state: DecodingState, tokens: np.ndarray, position: int
    ) -> tuple[np.ndarray, DecodingState]:
        check_position(position, state.offset, self.model.config.max_len)
        tokens = _to_device(self.model, tokens)[:, None]  # (N, 1)
        # differs: jax-jit
        config = self.model.config
        check_token_ids(
            "ids", tokens, config.tgt_vocab_size, config.max_len, state.offset + position
        )  # eagerly
        # the buffer would clamp the write silently
        if state.offset + position >= state.keep.shape[1]:
            raise ValueError(
                f"position {state.offset + position} is past the cache's "
                f"{state.keep.shape[1]} positions: start the stepper with a larger max_new"
            )
        logits, cache, keep = kernels.compiled_decode_step(
            *self.split, tokens, state.cache, state.keep, state.memory_mask, state.offset + position
        )  # (N, 1, V), ...
        return _to_host(logits[:, -1]), state._replace(cache=cache, keep=keep)  # (N, V)

    def reorder(self, state: DecodingState, rows: np.ndarray) -> DecodingState:
        rows = _to_device(self.model, rows)  # (N,)
        cache, keep, memory_mask = select_rows((state.cache, state.keep, state.memory_mask), rows)
        return state._replace(cache=cache, keep=keep, memory_mask=memory_mask)


class UncachedStepper:
    """``decoding.Stepper`` without a cache: every step runs the model on the whole prefix."""

    def __init__(self, model: Any):
        self.model = model

    def start(self, src_ids: np.ndarray, max_new: int | None = None) -> PrefixState:
        src_ids = _to_device(self.model, src_ids)  # (N, T_src)
        return PrefixState(src_ids, jnp.zeros((src_ids.shape[0], 0), src_ids.dtype))  # (N, 0)

    def step(
        self, state: PrefixState, tokens: np.ndarray, position: int
    ) -> tuple[np.ndarray, PrefixState]:
        if state.tgt_ids.shape[1] != position:
            raise ValueError(
                f"{state.tgt_ids.shape[1]} tokens were fed so far, "
                f"but the next is for position {position}"
            )
        tokens = _to_device(self.model, tokens)[:, None]  # (N, 1)
        tgt_ids = jnp.concatenate([state.tgt_ids, tokens], axis=1)  # (N, position + 1)
        if self.model.config.decoder_has_cross_attention:
            logits = self.model(state.src_ids, tgt_ids).logits  # (N, position + 1, V)
        else:
            prefix = jnp.concatenate([state.src_ids, tgt_ids], axis=1)  # (N, P + position + 1)
            logits = self.model(prefix).logits  # (N, P + position + 1, V)
        return _to_host(logits[:, -1]), PrefixState(state.src_ids, tgt_ids)  # (N, V)

    def reorder(self, state: PrefixState, rows: np.ndarray) -> PrefixState:
        return select_rows(state, _to_device(self.model, rows))


def make_stepper(model: Any, cached: bool = True) -> CachedStepper | UncachedStepper:
    """A ``transformer_run.decoding.Stepper`` for a ``Transformer`` or a ``TransformerLM``."""
    if not model.config.uses_decoder:
        raise ValueError(f"decoding needs a model with a decoder, got kind={model.config.kind!r}")
    return CachedStepper(model) if cached else UncachedStepper(model)


def greedy(
    model: Any, src_ids: np.ndarray, bos: int, eos: int, max_len: int, cached: bool = True
) -> np.ndarray:
    """Greedy decoding (``transformer_run.decoding.greedy_decode``) -> (B, T <= max_len + 1) ids
    from ``bos``, padded after ``eos``; see the module docstring."""
    check_decoding(model.config, src_ids, bos, eos, max_len)  # up front, not at the step that fails
    stepper = make_stepper(model, cached)
    return greedy_decode(stepper, src_ids, bos, eos, max_len, model.config.pad_id)


def beam(
    model: Any,
    src_ids: np.ndarray,
    bos: int,
    eos: int,
    max_len: int,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    cached: bool = True,
) -> BeamResult:
    """Beam search (``transformer_run.decoding.beam_search``) -> the best hypothesis per row and
    its score. ``early_stopping``: when a row stops, by Hugging Face's rules (``True``,
    ``False`` or ``"never"``; see ``beam_search``)."""
    check_decoding(model.config, src_ids, bos, eos, max_len)  # up front, not at the step that fails
    stepper = make_stepper(model, cached)
    return beam_search(
        stepper, src_ids, bos, eos, max_len, beam_size, length_penalty, model.config.pad_id,
        early_stopping,
    )


def sample(
    model: Any,
    src_ids: np.ndarray,
    bos: int,
    eos: int,
    max_len: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    cached: bool = True,
) -> np.ndarray:
    """Sampling with temperature, top-k and top-p from a seeded NumPy generator
    (``transformer_run.decoding.sample_decode``) -> (B, T <= max_len + 1) ids from ``bos``."""
    check_decoding(model.config, src_ids, bos, eos, max_len)  # up front, not at the step that fails
    stepper = make_stepper(model, cached)
    return sample_decode(
        stepper, src_ids, bos, eos, max_len, temperature, top_k, top_p, seed, model.config.pad_id
    )


def _to_device(model: Any, ids: np.ndarray) -> Array:
    """The search's ids (NumPy) -> a JAX array on the default device."""
    return jnp.asarray(ids)  # differs: torch-device


def _to_host(logits: Array) -> np.ndarray:
    """This backend's logits -> the NumPy array the search reads (a copy from the device)."""
    return np.asarray(logits)  # differs: torch-device
