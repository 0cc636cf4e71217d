"""The search algorithms of transformer_run.decoding, on a stepper with known probabilities."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from transformer_run.decoding import beam_search, greedy_decode, log_softmax

BOS, EOS, VOCAB = 1, 2, 6


class MarkovStepper:
    """Next-token logits depend on (source row, previous token, position) through a fixed table."""

    def __init__(self, seed: int = 0):
        self.table = np.random.default_rng(seed).standard_normal((3, VOCAB, 8, VOCAB)) * 2.0
        self.table[..., 0] = -1e9  # never the pad id
        self.table[..., BOS] = -1e9  # never <bos> again

    def start(self, src_ids, max_new=None):
        return src_ids[:, 0].copy()  # the state: which source each running sequence belongs to

    def step(self, state, tokens, position):
        return self.table[state, tokens, position], state

    def reorder(self, state, rows):
        return state[rows]


def sequence_log_prob(stepper, source: int, hypothesis: list[int]) -> float:
    total = 0.0
    for position, (previous, token) in enumerate(itertools.pairwise(hypothesis)):
        total += log_softmax(stepper.table[source, previous, position])[token]
    return total


def brute_force_best(stepper, source: int, max_len: int, length_penalty: float) -> tuple[float, list[int]]:
    """The best of every hypothesis a search can finish: ended by <eos> within max_len tokens, or
    max_len tokens without it (at max_len every hypothesis ends, as in Hugging Face's search)."""
    best = (-np.inf, [])
    for length in range(1, max_len + 1):
        endings = [EOS, *range(3, VOCAB)] if length == max_len else [EOS]
        for body in itertools.product(range(3, VOCAB), repeat=length - 1):
            for ending in endings:
                hypothesis = [BOS, *body, ending]
                score = sequence_log_prob(stepper, source, hypothesis) / length**length_penalty
                best = max(best, (score, hypothesis), key=lambda item: item[0])
    return best


def test_a_wide_beam_finds_the_most_probable_finished_sequence():
    """early_stopping="never" stops only when no running hypothesis can improve: with a beam
    wide enough to hold every prefix, the search is exact."""
    stepper, src = MarkovStepper(), np.array([[0], [1], [2]])
    result = beam_search(
        stepper, src, BOS, EOS, max_len=4, beam_size=(VOCAB - 3) ** 3 + 1, length_penalty=1.0, early_stopping="never"
    )
    for row in range(3):
        score, hypothesis = brute_force_best(stepper, row, 4, 1.0)
        assert result.ids[row, : len(hypothesis)].tolist() == hypothesis
        assert abs(result.scores[row] - score) < 1e-12


def test_beam_size_one_is_greedy():
    stepper, src = MarkovStepper(seed=3), np.array([[0], [1], [2]])
    greedy = greedy_decode(stepper, src, BOS, EOS, max_len=6)
    beam = beam_search(stepper, src, BOS, EOS, max_len=6, beam_size=1).ids
    for row in range(3):
        g = greedy[row].tolist()
        g = g[: g.index(EOS) + 1] if EOS in g else g
        assert beam[row, : len(g)].tolist() == g


def test_greedy_pads_rows_after_their_eos():
    stepper = MarkovStepper(seed=1)
    out = greedy_decode(stepper, np.array([[0], [1]]), BOS, EOS, max_len=7)
    for row in out.tolist():
        if EOS in row:
            assert all(t == 0 for t in row[row.index(EOS) + 1 :])


# ------------------------------------------------------------------ beam search, nothing finished
@pytest.mark.parametrize("length_penalty", [0.0, 0.7, 1.0])
def test_beam_search_with_no_finished_hypothesis_returns_the_best_running_one_length_normalised(length_penalty):
    """eos=None: no hypothesis ever finishes, so the answer is the best running one, scored as a
    finished one would be: log-probability / (generated length ** length_penalty). A beam of 16
    holds every prefix of the 4 possible tokens, so the search is exact (brute force agrees).
    Kills spec-beam-unfinished-not-length-normalised and spec-beam-length-counts-bos."""
    stepper, src, max_len = MarkovStepper(seed=5), np.array([[0], [1], [2]]), 3
    result = beam_search(stepper, src, BOS, None, max_len=max_len, beam_size=16, length_penalty=length_penalty)
    for row in range(3):
        candidates = [[BOS, *body] for body in itertools.product(range(2, VOCAB), repeat=max_len)]
        log_probs = [sequence_log_prob(stepper, row, hypothesis) for hypothesis in candidates]
        best = int(np.argmax(log_probs))
        assert result.ids[row].tolist() == candidates[best]
        assert abs(result.scores[row] - log_probs[best] / max_len**length_penalty) < 1e-12


# ------------------------------------------------------------------ beam search, row by row
EARLY_STOPPING = [True, False, "never"]


def eos_early_or_late(seed: int, kind: type = MarkovStepper) -> MarkovStepper:
    stepper = kind(seed=seed)
    stepper.table[..., EOS] += np.random.default_rng(100 + seed).uniform(-1.0, 3.0, (3, 1, 8))  # eos early or late
    return stepper


@pytest.mark.parametrize("early_stopping", EARLY_STOPPING)
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("beam_size", [2, 3])
def test_a_sources_beams_do_not_depend_on_the_rest_of_its_batch(seed, beam_size, early_stopping):
    """Decoded alone or beside sources that run longer, a source gets the same hypothesis and
    score: once its stopping rule says it is done it collects no more, whatever the other rows
    still do."""
    stepper = eos_early_or_late(seed)
    src = np.array([[0], [1], [2]])
    search = functools.partial(
        beam_search, stepper, bos=BOS, eos=EOS, max_len=7, beam_size=beam_size, length_penalty=1.0,
        early_stopping=early_stopping,
    )  # fmt: skip
    batched = search(src)
    for row in range(3):
        alone = search(src[row : row + 1])
        hypothesis = alone.ids[0].tolist()
        assert batched.ids[row, : len(hypothesis)].tolist() == hypothesis
        assert (batched.ids[row, len(hypothesis) :] == 0).all()
        assert batched.scores[row] == alone.scores[0]


class CountingStepper(MarkovStepper):
    """A Markov stepper that counts the steps a search asks for."""

    def start(self, src_ids, max_new=None):
        self.steps = 0
        return super().start(src_ids, max_new)

    def step(self, state, tokens, position):
        self.steps += 1
        return super().step(state, tokens, position)


def test_each_stopping_rule_searches_at_least_as_long_and_scores_at_least_as_well_as_the_one_before():
    """The running beams do not depend on the rule, and each source's finished pool only improves
    as the search goes on, so the later a source stops the better its answer: True stops once it
    has beam_size finished hypotheses, False once, besides, its best running hypothesis at its
    current length cannot beat them, "never" once it cannot even at max_len. Per source, alone,
    for three length penalties: steps and scores ordered True <= False <= "never", and each rule
    differs from the next somewhere."""
    differs = {"steps": [False, False], "scores": [False, False]}
    for length_penalty, seed in itertools.product([0.6, 1.0, 2.0], range(8)):
        stepper = eos_early_or_late(seed, CountingStepper)
        for source in range(3):
            steps, scores = [], []
            for rule in EARLY_STOPPING:
                result = beam_search(stepper, np.array([[source]]), BOS, EOS, 7, 2, length_penalty, early_stopping=rule)
                steps.append(stepper.steps)
                scores.append(float(result.scores[0]))
            assert steps == sorted(steps) and scores == sorted(scores), (length_penalty, seed, source, steps, scores)
            for i in range(2):
                differs["steps"][i] |= steps[i] < steps[i + 1]
                differs["scores"][i] |= scores[i] < scores[i + 1]
    assert differs == {"steps": [True, True], "scores": [True, True]}, differs


def hugging_face_beam_search(stepper, source: int, max_len: int, beams: int, length_penalty: float, early_stopping):
    """Hugging Face's ``_beam_search`` (transformers 5) for one source, transcribed to NumPy with its
    own layout: fixed-size running and finished arrays, -1e9 for "nothing", the 2k best candidates,
    the finished ones merged by one top-k, its stopping heuristic. -> (hypothesis, score)."""
    k, none = beams, -1e9
    running = np.full((k, max_len + 1), -1)  # (k, max_length): -1 after the last token
    running[:, 0] = BOS
    running_scores = np.full(k, none)
    running_scores[0] = 0.0
    finished, finished_scores, is_finished = running.copy(), np.full(k, none), np.zeros(k, bool)
    unsatisfied, length = True, 1  # cur_len; the decoder prompt is <bos> alone
    while True:
        log_probs = np.stack([log_softmax(stepper.table[source, running[i, length - 1], length - 1]) for i in range(k)])
        accumulated = (log_probs + running_scores[:, None]).reshape(-1)  # (k * V,)
        top = np.argsort(-accumulated, kind="stable")[: 2 * k]
        top_scores, top_tokens = accumulated[top], top % VOCAB
        top_sequences = running[top // VOCAB].copy()
        top_sequences[:, length] = top_tokens
        hits = (top_tokens == EOS) | (length + 1 >= max_len + 1)  # eos, or max_length reached
        order = np.argsort(-(top_scores + hits * none), kind="stable")[:k]
        running, running_scores = top_sequences[order], (top_scores + hits * none)[order]
        just_finished = hits & (np.arange(2 * k) < k)
        scores = top_scores / (length + 1 - 1) ** length_penalty
        scores = scores + none * ((early_stopping is True and is_finished.all()) + (not unsatisfied) + ~just_finished)
        merged = np.concatenate([finished_scores, scores])
        order = np.argsort(-merged, kind="stable")[:k]
        finished = np.concatenate([finished, top_sequences])[order]
        finished_scores, is_finished = merged[order], np.concatenate([is_finished, just_finished])[order]
        length += 1
        best_length = max_len if early_stopping == "never" and length_penalty > 0 else length - 1
        worst = np.where(is_finished, finished_scores.min(), none)
        unsatisfied = unsatisfied and bool((running_scores[0] / best_length**length_penalty > worst).any())
        if not unsatisfied or (is_finished.all() and early_stopping is True) or hits.all():
            return [int(t) for t in finished[0] if t >= 0], finished_scores[0]


@pytest.mark.parametrize("early_stopping", EARLY_STOPPING)
def test_beam_search_is_hugging_faces_search(early_stopping):
    """The same hypothesis and score as a transcription of Hugging Face's search, for three length
    penalties and two beam sizes, on tables where <eos> comes early or late."""
    for seed, length_penalty, beams in itertools.product(range(6), [0.6, 1.0, 2.0], [2, 3]):
        stepper = eos_early_or_late(seed)
        result = beam_search(stepper, np.array([[0], [1], [2]]), BOS, EOS, 7, beams, length_penalty,
                             early_stopping=early_stopping)  # fmt: skip
        for source in range(3):
            hypothesis, score = hugging_face_beam_search(stepper, source, 7, beams, length_penalty, early_stopping)
            setting = f"seed {seed}, length_penalty {length_penalty}, {beams} beams, source {source}"
            assert result.ids[source, : len(hypothesis)].tolist() == hypothesis, setting
            assert abs(result.scores[source] - score) <= 1e-12 * abs(score), setting
