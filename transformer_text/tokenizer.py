"""BERT's WordPiece tokenizer in plain Python, loaded offline from a ``vocab.txt``.

Two stages, as in Google's original BERT code and Hugging Face's ``BertTokenizer``:
1. basic: drop control characters, put spaces around CJK characters, lower-case and
   strip accents (NFD, then drop combining marks), split on whitespace and punctuation;
2. WordPiece: split each word greedily into the longest vocabulary pieces, the
   non-initial ones spelled with a ``##`` prefix ("flies" -> "flies"; "tokenizer" ->
   "token", "##izer"); a word that cannot be split becomes ``[UNK]``.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Sequence

import numpy as np


class WordPieceTokenizer:
    def __init__(self, vocab: dict[str, int], lowercase: bool = True, max_chars_per_word: int = 100):
        self.vocab = vocab
        self.inverse = {i: token for token, i in vocab.items()}
        self.lowercase = lowercase
        self.max_chars_per_word = max_chars_per_word
        for special in ("[UNK]", "[CLS]", "[SEP]", "[PAD]"):
            if special not in vocab:
                raise ValueError(f"the vocabulary has no {special} token; expected a BERT vocab.txt")
        self.unk_id, self.cls_id, self.sep_id, self.pad_id = (vocab[t] for t in ("[UNK]", "[CLS]", "[SEP]", "[PAD]"))

    @classmethod
    def from_file(cls, path: str | os.PathLike, lowercase: bool = True) -> WordPieceTokenizer:
        """``path``: a ``vocab.txt`` (one token per line, the line number is the id) or a
        directory that holds one."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "vocab.txt")
        with open(path, encoding="utf-8") as f:
            vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
        return cls(vocab, lowercase)

    # ------------------------------------------------------------------ stage 1
    def basic_tokenize(self, text: str) -> list[str]:
        text = "".join(
            " " if _is_whitespace(ch) else ch for ch in text if not _is_control(ch) and ord(ch) not in (0, 0xFFFD)
        )
        text = "".join(f" {ch} " if _is_cjk(ord(ch)) else ch for ch in text)
        if self.lowercase:
            text = unicodedata.normalize("NFD", text.lower())
            text = "".join(ch for ch in text if unicodedata.category(ch) != "Mn")
        words: list[str] = []
        for chunk in text.split():
            current = ""
            for ch in chunk:
                if _is_punctuation(ch):
                    if current:
                        words.append(current)
                    words.append(ch)
                    current = ""
                else:
                    current += ch
            if current:
                words.append(current)
        return words

    # ------------------------------------------------------------------ stage 2
    def wordpiece(self, word: str) -> list[str]:
        if len(word) > self.max_chars_per_word:
            return ["[UNK]"]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:  # the longest piece in the vocabulary wins
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            if end == start:
                return ["[UNK]"]  # no piece fits: the whole word is unknown
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> list[str]:
        _check_text("text", text)
        return [piece for word in self.basic_tokenize(text) for piece in self.wordpiece(word)]

    def encode(
        self, text: str, pair: str | None = None, add_special_tokens: bool = True, max_length: int | None = None
    ) -> tuple[list[int], list[int]]:
        """-> (ids, token type ids): ``[CLS] text [SEP] (pair [SEP])``, types 0 then 1. With
        ``max_length`` the text (and pair) are cut at the end, never the special tokens (see
        ``_truncate``: the ``tokenizers`` library's "longest_first")."""
        _check_text("text", text)
        if pair is not None:
            _check_text("pair", pair)
        first = [self.vocab.get(t, self.unk_id) for t in self.tokenize(text)]
        second = [self.vocab.get(t, self.unk_id) for t in self.tokenize(pair)] if pair is not None else None
        if max_length is not None:
            specials = (3 if second is not None else 2) if add_special_tokens else 0
            _check_max_length(max_length, specials)
            first, second = _truncate(first, second, max_length - specials)
        if not add_special_tokens:
            ids = first + (second or [])
            return ids, [0] * len(first) + [1] * len(second or [])
        ids = [self.cls_id, *first, self.sep_id]
        types = [0] * len(ids)
        if second is not None:
            ids += [*second, self.sep_id]
            types += [1] * (len(second) + 1)
        return ids, types

    def __call__(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        add_special_tokens: bool = True,
        max_length: int | None = None,
    ) -> dict[str, np.ndarray]:
        """A batch, padded with [PAD] to its longest member (each cut to ``max_length`` tokens,
        special tokens kept, see ``encode``): ``ids``, ``token_type_ids`` and ``attention_mask``
        (1 = real token), int64 (B, T)."""
        _check_batch("texts", texts)
        if pairs is not None:
            _check_batch("pairs", pairs)
            if len(pairs) != len(texts):
                raise ValueError(f"got {len(texts)} texts but {len(pairs)} pairs")
        encoded = [
            self.encode(t, pairs[i] if pairs is not None else None, add_special_tokens, max_length)
            for i, t in enumerate(texts)
        ]
        width = max(len(ids) for ids, _ in encoded)
        batch = {
            "ids": np.full((len(texts), width), self.pad_id, np.int64),
            "token_type_ids": np.zeros((len(texts), width), np.int64),
            "attention_mask": np.zeros((len(texts), width), np.int64),
        }
        for row, (ids, types) in enumerate(encoded):
            batch["ids"][row, : len(ids)] = ids
            batch["token_type_ids"][row, : len(ids)] = types
            batch["attention_mask"][row, : len(ids)] = 1
        return batch

    def decode(self, ids: Sequence[int]) -> str:
        tokens = [self.inverse.get(int(i), "[UNK]") for i in ids]
        return " ".join(tokens).replace(" ##", "")


def _truncate(first: list[int], second: list[int] | None, room: int) -> tuple[list[int], list[int] | None]:
    """Cut the text (and pair) to ``room`` tokens in all, as ``tokenizers`` does ("longest_first"):
    the shorter one (the text on a tie) keeps at most half the room, the longer one the rest."""
    if second is None:
        return first[:room], None
    if len(first) + len(second) <= room:
        return first, second
    if len(first) > len(second):
        keep_second = min(len(second), room // 2)
        return first[: room - keep_second], second[:keep_second]
    keep_first = min(len(first), room // 2)
    return first[:keep_first], second[: room - keep_first]


def _check_text(name: str, text: object) -> None:
    if isinstance(text, (bytes, bytearray)):
        raise TypeError(f"{name} must be a str, got bytes: decode them first (text = data.decode('utf-8'))")
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")


def _check_batch(name: str, texts: object) -> None:
    """A batch is a non-empty list or tuple of str (a lone str would be a batch of characters)."""
    if isinstance(texts, (str, bytes, bytearray)):
        raise TypeError(f"{name} must be a list of strings (a batch); wrap a single sentence in a list")
    if not isinstance(texts, Sequence):
        raise TypeError(f"{name} must be a list of strings (a batch), got {type(texts).__name__}")
    if len(texts) == 0:
        raise ValueError(f"{name} is an empty batch: give at least one text")
    for i, text in enumerate(texts):
        _check_text(f"{name}[{i}]", text)


def _check_max_length(max_length: object, specials: int) -> None:
    """Room for the special tokens and at least one token of each text: below that ``[SEP]`` would go."""
    integer = isinstance(max_length, (int, np.integer)) and not isinstance(max_length, bool)
    if not integer or max_length <= specials:
        raise ValueError(
            f"max_length must be an integer > {specials} (room for the {specials} special tokens and some text), "
            f"got {max_length!r}"
        )


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
    return ch not in "\t\n\r" and unicodedata.category(ch).startswith("C")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)  # BERT counts every non-alphanumeric ASCII symbol as punctuation ("$", "^", "`")
    return (
        33 <= cp <= 47
        or 58 <= cp <= 64
        or 91 <= cp <= 96
        or 123 <= cp <= 126
        or unicodedata.category(ch).startswith("P")
    )


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F
    )  # fmt: skip
