"""Toy data shipped in the repository (nothing is downloaded): the tutorials' corpora and
the copy/reverse task, as padded id arrays in the batch format of ``batches.py``.

Id 0 is padding everywhere (``Config.pad_id``'s default); then <bos>, <eos>, <unk>.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from .batches import decoder_only_batch, encoder_decoder_batch

# The parallel corpus of the LLM notes tutorial, English -> a pretend "French" (docs: tutorials.html).
TOY_TRANSLATION: tuple[tuple[str, str], ...] = (
    ("i eat fish", "je mange poisson"),
    ("i like fish", "je aime poisson"),
    ("you eat meat", "tu mange viande"),
    ("i eat meat", "je mange viande"),
    ("she likes fish", "elle aime poisson"),
    ("he hates meat", "il deteste viande"),
)

# A model trained on TOY_TRANSLATION, shipped inside the package so that ``transformer-ref attention
# --preset toy-translate`` shows real words and real alignments; python -m transformer_cli.make_toy_model writes it.
TOY_TRANSLATION_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights", "toy-translate.safetensors")

# The next-word corpus of the LLM notes tutorial.
NEXT_WORD: tuple[str, ...] = (
    "the cat likes fish",
    "the dog hates fish",
    "the cat eats fish",
    "the dog likes meat",
    "the girl likes cat",
    "the boy hates dog",
)

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
PAD, BOS, EOS, UNK = range(4)


class WordVocab:
    """Whitespace words <-> ids, the specials first (so <pad> is 0)."""

    def __init__(self, words: Sequence[str]):
        self.itos = list(SPECIALS) + sorted(set(words) - set(SPECIALS))
        self.stoi = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def from_sentences(cls, sentences: Sequence[str]) -> WordVocab:
        return cls([w for s in sentences for w in s.split()])

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, sentence: str, bos: bool = True, eos: bool = True) -> list[int]:
        ids = [self.stoi.get(w, UNK) for w in sentence.split()]
        return ([BOS] if bos else []) + ids + ([EOS] if eos else [])

    def decode(self, ids: Sequence[int]) -> str:
        """Words up to the first <eos>, without <bos> and padding."""
        words = []
        for i in ids:
            if int(i) == EOS:
                break
            if int(i) not in (PAD, BOS):
                words.append(self.itos[int(i)] if 0 <= int(i) < len(self.itos) else "<unk>")
        return " ".join(words)


def pad(sequences: Sequence[Sequence[int]], length: int | None = None) -> np.ndarray:
    """Ragged id lists -> (B, T) int64, right-padded with PAD."""
    width = length or max(len(s) for s in sequences)
    out = np.full((len(sequences), width), PAD, np.int64)
    for row, seq in enumerate(sequences):
        out[row, : len(seq)] = seq[:width]
    return out


def translation_batch(
    pairs: Sequence[tuple[str, str]], src_vocab: WordVocab, tgt_vocab: WordVocab
) -> dict[str, np.ndarray]:
    """Sentence pairs -> {"src_ids", "tgt_in", "tgt_out"} (source without <bos>, target framed by both)."""
    src = pad([src_vocab.encode(s, bos=False) for s, _ in pairs])
    tgt = pad([tgt_vocab.encode(t) for _, t in pairs])
    return encoder_decoder_batch(src, tgt)


def next_word_batch(sentences: Sequence[str], vocab: WordVocab) -> dict[str, np.ndarray]:
    """Sentences -> {"ids", "targets"}: read <bos> w_1 .. w_n, predict w_1 .. w_n <eos>."""
    return decoder_only_batch(pad([vocab.encode(s) for s in sentences]))


def copy_task(
    num_sequences: int, length: int, vocab_size: int, seed: int = 0, reverse: bool = False
) -> dict[str, np.ndarray]:
    """The classic sanity task: random sequences of ``length`` symbols (ids 4 .. vocab_size-1);
    the target is the sequence itself (or reversed). -> {"src_ids", "tgt_in", "tgt_out"}."""
    if vocab_size <= len(SPECIALS) + 1:
        raise ValueError(f"vocab_size must leave symbols after the {len(SPECIALS)} specials, got {vocab_size}")
    rng = np.random.default_rng(seed)
    symbols = rng.integers(len(SPECIALS), vocab_size, size=(num_sequences, length))
    target = symbols[:, ::-1] if reverse else symbols
    bos, eos = np.full((num_sequences, 1), BOS), np.full((num_sequences, 1), EOS)
    return encoder_decoder_batch(symbols.astype(np.int64), np.concatenate([bos, target, eos], axis=1).astype(np.int64))
