"""Greedy search, beam search and sampling, written once for every backend.

A backend supplies a *stepper* (``make_stepper`` in its ``generate.py``): an object with

    start(src_ids, max_new)            -> state      encode the source once, empty cache for
                                                     up to max_new steps (None: config.max_len)
    step(state, tokens, position)      -> (logits, state)
        tokens (N,) int64: the newest token of each of N running sequences, at ``position``;
        logits (N, V) as NumPy: the scores of the next token. With a key/value cache the
        step feeds one token per sequence; without one it re-runs the whole prefix.
    reorder(state, rows)               -> state      keep/reorder running sequences (beams)

All the search logic (argmax, top-k over beams, finished hypotheses, length penalty, the
sampler's temperature, top-k, top-p and random draws) is NumPy here, so the three backends
cannot differ in it: only the logits they return. For a decoder-only model ``src_ids`` are
the prompt ids. ``bos``, the first token fed, is one id for every row or one per row (B,):
to continue prompts, pass all but their last token as ``src_ids`` and the last as ``bos``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol

import numpy as np

from transformer_spec.checks import check_integer_ids, host_array


class Stepper(Protocol):
    def start(self, src_ids: np.ndarray, max_new: int | None = None) -> Any: ...

    def step(self, state: Any, tokens: np.ndarray, position: int) -> tuple[np.ndarray, Any]: ...

    def reorder(self, state: Any, rows: np.ndarray) -> Any: ...


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def host_ids(src_ids: Any) -> np.ndarray:
    """The search runs in NumPy on the host: ids (B, T) from any backend (a NumPy or JAX array,
    a torch tensor on any device, nested lists) as a NumPy integer array, checked: not integers
    is the model's TypeError, a wrong shape a ValueError. T may be 0 (an empty prompt)."""
    src_ids = host_array("src_ids", src_ids)
    check_integer_ids("src_ids", str(src_ids.dtype), np.issubdtype(src_ids.dtype, np.integer))
    if src_ids.ndim != 2:
        raise ValueError(f"src_ids must have shape (batch, seq_len), got shape {src_ids.shape}")
    return src_ids


def first_tokens(bos: Any, batch: int) -> np.ndarray:
    """``bos``: one id, or one per row -> (B, 1) int64, checked."""
    bos = np.asarray(bos)
    if not np.issubdtype(bos.dtype, np.integer) or bos.ndim > 1 or (bos.ndim == 1 and bos.shape != (batch,)):
        raise ValueError(f"bos must be one integer id or one per row ({batch},), got {bos.dtype} {bos.shape}")
    return np.broadcast_to(bos.astype(np.int64), (batch,))[:, None].copy()  # (B, 1)


def _is_integer(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_steps(max_len: Any, eos: Any) -> None:
    """What every search takes: ``max_len``, the number of tokens to generate, a positive integer;
    ``eos`` an integer id, or None for a search that never stops early."""
    if not _is_integer(max_len) or max_len < 1:
        raise ValueError(f"max_len (the number of tokens to generate) must be a positive integer, got {max_len!r}")
    if eos is not None and not _is_integer(eos):
        raise ValueError(f"eos must be an integer id, or None to never stop early, got {eos!r}")


def check_beam(beam_size: Any, length_penalty: Any, early_stopping: Any = False) -> None:
    if not _is_integer(beam_size) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}")
    number = isinstance(length_penalty, (int, float, np.integer, np.floating)) and not isinstance(length_penalty, bool)
    if not number or not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty must be a finite number (0: no length normalisation), got {length_penalty!r}")
    never = isinstance(early_stopping, str) and early_stopping == "never"
    if not (isinstance(early_stopping, (bool, np.bool_)) or never):
        raise ValueError(f"early_stopping must be True, False or 'never' (as Hugging Face's), got {early_stopping!r}")


def check_decoding(config: Any, src_ids: Any, bos: Any, eos: Any, max_len: Any) -> None:
    """The arguments of a backend's ``greedy``, ``beam`` and ``sample`` for a model with ``config``,
    checked before anything runs: ids, ``max_len`` steps that fit in the model's positions
    (a decoder-only model reads the prompt first: prompt + steps), ``bos`` and ``eos`` in the
    target vocabulary. Without this a search would fail only on reaching position
    config.max_len, after every earlier step had run."""
    src_ids = host_ids(src_ids)  # (B, T_src)
    check_steps(max_len, eos)
    prompt = 0 if config.decoder_has_cross_attention else src_ids.shape[1]
    if prompt + max_len > config.max_len:
        after = f" after a prompt of {prompt} tokens" if prompt else ""
        raise ValueError(
            f"decoding max_len={max_len} tokens{after} needs {prompt + max_len} positions, "
            f"but the model's max_len is {config.max_len}"
        )
    vocab = config.tgt_vocab_size
    first = first_tokens(bos, src_ids.shape[0])  # (B, 1)
    bad = sorted({int(i) for i in first.ravel() if not 0 <= i < vocab})
    if bad:
        raise ValueError(f"bos must lie in [0, {vocab}) (the target vocabulary), but contains {bad}")
    if eos is not None and not 0 <= eos < vocab:
        raise ValueError(f"eos must lie in [0, {vocab}) (the target vocabulary) or be None, got {eos}")


def check_position(position: Any, offset: int, max_len: int) -> None:
    """A cached step's ``position`` (counted after the prompt's ``offset`` positions): an integer
    from 0 on, whose token still has a row in the positional tables."""
    if not _is_integer(position) or position < 0:
        raise ValueError(f"a step's position must be an integer >= 0, got {position!r}")
    if offset + position >= max_len:
        raise ValueError(f"position {offset + position} is past the model's positions: its max_len is {max_len}")


def greedy_decode(stepper: Stepper, src_ids: Any, bos: Any, eos: int, max_len: int, pad: int = 0) -> np.ndarray:
    """-> (B, T <= max_len + 1) ids starting with <bos>; after <eos> a row is padded."""
    check_steps(max_len, eos)
    src_ids = host_ids(src_ids)  # (B, T_src)
    batch = src_ids.shape[0]
    out = first_tokens(bos, batch)  # (B, 1)
    state = stepper.start(src_ids, max_len)
    done = np.zeros(batch, bool)
    for position in range(max_len):
        logits, state = stepper.step(state, out[:, -1], position)  # (B, V)
        next_ids = np.where(done, pad, logits.argmax(axis=-1))  # (B,)
        out = np.concatenate([out, next_ids[:, None]], axis=1)
        done |= next_ids == eos
        if done.all():
            break
    return out


@dataclasses.dataclass
class BeamResult:
    ids: np.ndarray  # (B, T): the best hypothesis of each source, from <bos>, padded
    scores: np.ndarray  # (B,): its total log-probability divided by length ** length_penalty


def beam_search(
    stepper: Stepper,
    src_ids: Any,
    bos: int,
    eos: int,
    max_len: int,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    pad: int = 0,
    early_stopping: bool | str = False,
) -> BeamResult:
    """Keep the ``beam_size`` best partial hypotheses per source. A hypothesis that emits <eos>
    while among the ``beam_size`` best candidates of its step is finished, and so is each of the
    ``beam_size`` best at the last step (``max_len``), as in Hugging Face's ``generate``. Each
    source keeps its ``beam_size`` best finished hypotheses, scored log-probability /
    (generated length ** length_penalty), and is done by ``early_stopping``, Hugging Face's
    three rules:

    * ``True``: once it has ``beam_size`` finished hypotheses;
    * ``False`` (the default, as Hugging Face's): once it has them and its best running
      hypothesis, scored at its current length, does not beat the worst of them. A heuristic:
      with length_penalty > 0 a longer hypothesis could still have beaten it;
    * ``"never"``: the same, but the running hypothesis is scored at ``max_len`` when
      length_penalty > 0 (log-probabilities only fall as tokens are added, so no continuation
      scores more): the canonical rule, stopping only when nothing can improve.

    A done source collects no more while the others of its batch run on, so its answer does not
    depend on them. The search ends when every source is done, or at ``max_len``; the answer is
    the best finished hypothesis. The length counts the generated tokens (<eos> included; not
    <bos>, nor a decoder-only model's prompt), as Hugging Face's length penalty counts the
    tokens after the decoder's input (its start token, or the prompt and ``bos``). One difference:
    the scores here are float64, Hugging Face's float32, so a near-tie may rank otherwise."""
    check_steps(max_len, eos)
    check_beam(beam_size, length_penalty, early_stopping)
    src_ids = host_ids(src_ids)  # (B, T_src)
    batch, k = src_ids.shape[0], beam_size
    first = first_tokens(bos, batch)  # (B, 1)
    state = stepper.start(np.repeat(src_ids, k, axis=0), max_len)  # (B * k) running sequences
    tokens = np.repeat(first[:, None, :], k, axis=1)  # (B, k, 1)
    scores = np.full((batch, k), -np.inf)
    scores[:, 0] = 0.0  # all beams start identical: only the first may expand, or k copies would survive
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]  # per source: its k best, best first
    done = np.zeros(batch, bool)  # (B,): sources that collect no more, as if decoded alone
    for position in range(max_len):
        logits, state = stepper.step(state, tokens[:, :, -1].reshape(-1), position)  # (B * k, V)
        vocab = logits.shape[-1]
        candidates = scores[:, :, None] + log_softmax(logits.astype(np.float64)).reshape(batch, k, vocab)
        flat = candidates.reshape(batch, k * vocab)  # (B, k * V)
        best = np.argsort(-flat, axis=-1, kind="stable")[:, : 2 * k]  # 2k: room for k that do not end now
        last = position == max_len - 1  # at max_len every hypothesis ends
        new_tokens, new_scores, new_rows = [], [], []
        for b in range(batch):
            keep_tokens, keep_scores, keep_rows = [], [], []
            for rank, index in enumerate(() if done[b] else best[b]):  # a done source: dead beams
                beam, token = divmod(int(index), vocab)
                score = float(flat[b, index])
                if not np.isfinite(score):
                    continue
                hypothesis = tokens[b, beam].tolist() + [token]
                if token == eos or last:
                    if rank < k:  # an ending only counts if it is among the k best candidates now
                        finished[b].append((score / _length(hypothesis) ** length_penalty, hypothesis))
                elif len(keep_rows) < k:
                    keep_tokens.append(hypothesis)
                    keep_scores.append(score)
                    keep_rows.append(b * k + beam)
            while len(keep_rows) < k:  # fewer than k live continuations: pad with dead beams
                keep_tokens.append(tokens[b, 0].tolist() + [pad])
                keep_scores.append(-np.inf)
                keep_rows.append(b * k)
            finished[b] = sorted(finished[b], key=lambda item: -item[0])[:k]  # only the k best count
            new_tokens.append(keep_tokens)
            new_scores.append(keep_scores)
            new_rows.extend(keep_rows)
        tokens = np.array(new_tokens, np.int64)  # (B, k, position + 2)
        scores = np.array(new_scores)  # (B, k), best first
        state = stepper.reorder(state, np.array(new_rows))
        for b in range(batch):
            done[b] = done[b] or _source_is_done(
                finished[b], scores[b, 0], position + 1, max_len, k, length_penalty, early_stopping
            )
        if done.all():
            break
    results = []
    for b in range(batch):
        pool = finished[b] or [  # only if no candidate was ever finite
            (scores[b, i] / _length(tokens[b, i].tolist()) ** length_penalty, tokens[b, i].tolist()) for i in range(k)
        ]
        results.append(max(pool, key=lambda item: item[0]))
    width = max(len(h) for _, h in results)
    ids = np.full((batch, width), pad, np.int64)
    for b, (_, hypothesis) in enumerate(results):
        ids[b, : len(hypothesis)] = hypothesis
    return BeamResult(ids=ids, scores=np.array([s for s, _ in results]))


def _source_is_done(
    finished: list[tuple[float, list[int]]],
    best_running: float,
    generated: int,
    max_len: int,
    beam_size: int,
    length_penalty: float,
    early_stopping: bool | str,
) -> bool:
    """Hugging Face's stopping rules for one source (``beam_search``): ``finished`` its best
    finished hypotheses (best first), ``best_running`` the total log-probability of its best
    running one, ``generated`` tokens long."""
    if len(finished) < beam_size:
        return False
    if early_stopping is True or early_stopping is np.True_:
        return True
    length = max_len if early_stopping == "never" and length_penalty > 0 else generated
    return best_running / length**length_penalty <= finished[-1][0]


def _length(hypothesis: list[int]) -> int:
    return len(hypothesis) - 1  # tokens generated, <bos> excluded


def filter_logits(
    logits: np.ndarray, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> np.ndarray:
    """logits (N, V) -> the sampling distribution (N, V), float64: logits / temperature, then only
    the ``top_k`` largest (ties at the k-th kept, as HF), then only the smallest set of tokens
    whose probability reaches ``top_p`` (nucleus sampling: the most probable token always
    stays), renormalised."""
    scaled = logits.astype(np.float64) / temperature  # (N, V)
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = np.sort(scaled, axis=-1)[:, -top_k][:, None]  # (N, 1): the k-th largest
        scaled = np.where(scaled < kth, -np.inf, scaled)
    probs = np.exp(scaled - scaled.max(axis=-1, keepdims=True))  # (N, V)
    probs /= probs.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")  # (N, V): most probable first
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        before = np.cumsum(sorted_probs, axis=-1) - sorted_probs  # probability of the tokens ranked above
        keep_sorted = before < top_p  # the first token always (0 < top_p)
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < np.inf:
        raise ValueError(
            f"temperature must be a positive finite number (greedy search is its limit at 0), got {temperature!r}"
        )
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be a probability in (0, 1] or None, got {top_p!r}")


def sample_decode(
    stepper: Stepper,
    src_ids: Any,
    bos: Any,
    eos: int,
    max_len: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    pad: int = 0,
) -> np.ndarray:
    """Ancestral sampling: each next token drawn from ``filter_logits``' distribution with a NumPy
    generator seeded by ``seed`` (the same draws in every backend: one uniform number per row
    and step, inverted through the cumulative distribution). -> (B, T <= max_len + 1) ids from
    <bos>, padded after <eos>."""
    check_steps(max_len, eos)
    check_sampling(temperature, top_k, top_p)
    src_ids = host_ids(src_ids)  # (B, T_src)
    batch = src_ids.shape[0]
    rng = np.random.default_rng(seed)
    out = first_tokens(bos, batch)  # (B, 1)
    state = stepper.start(src_ids, max_len)
    done = np.zeros(batch, bool)
    for position in range(max_len):
        logits, state = stepper.step(state, out[:, -1], position)  # (B, V)
        probs = filter_logits(logits, temperature, top_k, top_p)  # (B, V)
        cumulative = np.cumsum(probs, axis=-1)  # (B, V)
        draws = rng.random(batch) * cumulative[:, -1]  # (B,)
        sampled = (cumulative < draws[:, None]).sum(axis=-1)  # (B,): the first index whose cumulative >= the draw
        sampled = np.minimum(sampled, probs.shape[-1] - 1)
        next_ids = np.where(done, pad, sampled)  # (B,)
        out = np.concatenate([out, next_ids[:, None]], axis=1)
        done |= next_ids == eos
        if done.all():
            break
    return out
