"""Byte-level BPE (GPT-2's tokenizer, and SmolLM2's) in plain Python.

Encoding text takes four steps; decoding undoes the last three:

1. special tokens: strings like ``<|im_start|>`` are cut out of the text whole (the
   leftmost match, the longest one there) and become their ids directly;
2. pre-tokenization: the rest is split into pieces that BPE never merges across.
   GPT-2's rule is a regex (``GPT2_SPLIT``): a contraction ('s 't 're 've 'm 'll 'd), or
   an optional space then a run of letters, or of digits, or of other symbols, or a run of
   whitespace (all but its last character when a word follows, so that the word keeps its
   leading space: "a   b" -> "a", "  ", " b"). SmolLM2 ("smollm" in the GGUF metadata,
   ``Digits(individual_digits=True)`` before ``ByteLevel`` in its tokenizer.json) first
   cuts every digit out on its own: "2024" is four tokens, whatever the merges say;
3. bytes as characters: each piece's UTF-8 bytes are spelled with one printable
   character per byte (``bytes_to_unicode``: printable Latin-1 bytes stand for
   themselves, the others are shifted up past 255; a space is "Ġ", a newline "Ċ"), so
   the vocabulary is plain strings and any text, in any script, has a spelling;
4. BPE: starting from single characters, the adjacent pair with the best (lowest) merge
   rank is merged, everywhere in the piece, until no pair has a rank; the resulting
   strings are looked up in the vocabulary.

The regex needs Unicode classes (``\\p{L}`` letters, ``\\p{N}`` numbers) that the standard
library's ``re`` does not have; they are built here from ``unicodedata`` as explicit
character ranges, and ``\\s`` as the Rust engines' Unicode White_Space (Python's own ``\\s``
and ``str.isspace`` also count U+001C..U+001F, which they do not). One difference is left:
a character that a newer Unicode version assigned than this Python's ``unicodedata`` knows
is "other" here but a letter or digit there (Python 3.11 has Unicode 14.0; tokenizers 0.23
knows 16.0). Such characters are unassigned in every text written before 2022.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence

# GPT-2's pre-tokenizer (encoder.py of openai/gpt-2, and tokenizers' ByteLevel(use_regex=True)).
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """byte -> the printable character that spells it in a byte-level vocabulary.

    The 188 bytes that are printable Latin-1 characters (``!``..``~``, ``¡``..``¬``, ``®``..``ÿ``)
    stand for themselves; the other 68 (control characters, space, DEL, NBSP, soft hyphen)
    are given the characters 256, 257, ... in byte order: space (32) is "Ġ" (288)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelling = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in spelling:
            spelling[b] = chr(256 + shifted)
            shifted += 1
    return dict(sorted(spelling.items()))


def _ranges(code_points: Iterable[int]) -> str:
    """Sorted code points -> the body of a ``re`` character class, as escaped ranges."""
    parts, start, previous = [], None, None
    for cp in code_points:
        if start is None:
            start = previous = cp
        elif cp == previous + 1:
            previous = cp
        else:
            parts.append((start, previous))
            start = previous = cp
    if start is not None:
        parts.append((start, previous))
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in parts)


def _is_white_space(ch: str) -> bool:
    """Unicode's White_Space property: \\s in Oniguruma and Rust's regex, which tokenizers uses."""
    return ch.isspace() and not "\x1c" <= ch <= "\x1f"


@functools.lru_cache(maxsize=1)
def _unicode_classes() -> dict[str, str]:
    """``\\p{L}``, ``\\p{N}`` and ``\\s`` as ``re`` character-class bodies (built once, ~0.5 s)."""
    letters, numbers, spaces = [], [], []
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        category = unicodedata.category(ch)
        if category[0] == "L":
            letters.append(cp)
        elif category[0] == "N":
            numbers.append(cp)
        elif _is_white_space(ch):
            spaces.append(cp)
    return {"L": _ranges(letters), "N": _ranges(numbers), "S": _ranges(spaces)}


@functools.lru_cache(maxsize=1)
def _gpt2_regex() -> re.Pattern:
    """``GPT2_SPLIT`` spelled for the standard library's ``re``."""
    c = _unicode_classes()
    L, N, S = c["L"], c["N"], c["S"]  # noqa: N806 (the regex's own names)
    return re.compile(rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+")


@functools.lru_cache(maxsize=1)
def _digit_regex() -> re.Pattern:
    c = _unicode_classes()
    return re.compile(rf"[{c['N']}]|[^{c['N']}]+")


def split_gpt2(text: str) -> list[str]:
    """GPT-2's pre-tokenization: ``GPT2_SPLIT``'s matches, which cover the text."""
    return _gpt2_regex().findall(text)


def split_smollm(text: str) -> list[str]:
    """SmolLM2's: every digit (``\\p{N}``) alone, then GPT-2's regex within each stretch between digits."""
    return [piece for part in _digit_regex().findall(text) for piece in split_gpt2(part)]


PRE_TOKENIZERS: dict[str, Callable[[str], list[str]]] = {"gpt2": split_gpt2, "smollm": split_smollm}


class ByteLevelBPE:
    """A byte-level BPE tokenizer from its vocabulary and ranked merges.

    vocab:
        token strings in id order (a list), or ``{token: id}``; tokens spelled in the byte
        alphabet of ``bytes_to_unicode`` (special tokens as plain text).
    merges:
        best first, each ``"left right"`` or ``(left, right)``; ``left + right`` must be a token.
    special_tokens:
        tokens matched whole in the text before anything else (``<|im_start|>``).
    pre_tokenizer:
        "gpt2", "smollm" (``PRE_TOKENIZERS``) or a function ``str -> list[str]`` whose pieces
        cover the text.
    """

    def __init__(
        self,
        vocab: Sequence[str] | Mapping[str, int],
        merges: Iterable[str | tuple[str, str]],
        special_tokens: Iterable[str] = (),
        pre_tokenizer: str | Callable[[str], list[str]] = "gpt2",
    ):
        if isinstance(vocab, Mapping):
            self.token_to_id = {str(t): int(i) for t, i in vocab.items()}
        elif isinstance(vocab, Sequence) and not isinstance(vocab, (str, bytes)):
            self.token_to_id = {t: i for i, t in enumerate(vocab)}
            if len(self.token_to_id) != len(vocab):
                raise ValueError("the vocabulary lists a token twice")
        else:
            raise TypeError(f"vocab must be a list of tokens or a {{token: id}} dict, got {type(vocab).__name__}")
        self.id_to_token = {i: t for t, i in self.token_to_id.items()}
        if len(self.id_to_token) != len(self.token_to_id) or min(self.id_to_token, default=0) < 0:
            raise ValueError("vocabulary ids must be distinct and non-negative")
        self.byte_to_char = bytes_to_unicode()
        self.char_to_byte = {c: b for b, c in self.byte_to_char.items()}
        # A byte without a token of its own is dropped from the text, before merging, as tokenizers'
        # BPE (with no unknown token) and llama.cpp do. SmolLM2's vocabulary lacks 21 of the 256:
        # U+0004, U+0006, U+0013, U+0014, U+0016, U+001D, and lead bytes that valid UTF-8 of
        # assigned characters never uses.
        self.missing_bytes = bytes(b for b, c in self.byte_to_char.items() if c not in self.token_to_id)

        self.ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            pair = tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge)
            if len(pair) != 2 or not all(isinstance(p, str) and p for p in pair):
                raise ValueError(f"merge {rank} must be 'left right' or (left, right), got {merge!r}")
            if pair[0] + pair[1] not in self.token_to_id:
                raise ValueError(f"merge {rank} {merge!r} makes {pair[0] + pair[1]!r}, which is not in the vocabulary")
            self.ranks.setdefault(pair, rank)

        self.special_tokens = {}
        for token in special_tokens:
            if token not in self.token_to_id:
                raise ValueError(f"special token {token!r} is not in the vocabulary")
            self.special_tokens[token] = self.token_to_id[token]
        # Leftmost match first; at one position the longest special token (re tries alternatives in order).
        by_length = sorted(self.special_tokens, key=len, reverse=True)
        self._special_regex = re.compile("|".join(map(re.escape, by_length))) if by_length else None

        if isinstance(pre_tokenizer, str):
            if pre_tokenizer not in PRE_TOKENIZERS:
                raise ValueError(f"unknown pre_tokenizer {pre_tokenizer!r}; expected one of {sorted(PRE_TOKENIZERS)}")
            self.pre_tokenizer = PRE_TOKENIZERS[pre_tokenizer]
        elif callable(pre_tokenizer):
            self.pre_tokenizer = pre_tokenizer
        else:
            raise TypeError(f"pre_tokenizer must be a name or a function, got {type(pre_tokenizer).__name__}")
        self._cache: dict[str, tuple[int, ...]] = {}  # piece -> ids: text repeats its words

    @classmethod
    def from_gguf(cls, info) -> ByteLevelBPE:
        """The tokenizer a GGUF file describes (``transformer_convert.gguf.GGUFInfo``): byte-level BPE
        ("gpt2"), its tokens and merges, the tokens typed CONTROL or USER_DEFINED matched whole,
        and the pre-tokenizer ``tokenizer.ggml.pre`` names."""
        if info.tokenizer_model != "gpt2":
            raise ValueError(f"the file's tokenizer is {info.tokenizer_model!r}, not byte-level BPE ('gpt2')")
        pre = info.pre_tokenizer
        if pre not in PRE_TOKENIZERS:  # llama.cpp's names; a missing one is not GPT-2's regex there either
            raise ValueError(
                f"the file's pre-tokenizer (tokenizer.ggml.pre) {pre!r} is not implemented; expected one of "
                f"{sorted(PRE_TOKENIZERS)} (or build ByteLevelBPE(..., pre_tokenizer=...) yourself)"
            )
        if info.add_space_prefix:
            raise ValueError("the file asks for a space prefix, which ByteLevelBPE does not add")
        return cls(list(info.tokens), info.merges, info.special_tokens, pre)

    @property
    def vocab_size(self) -> int:
        return max(self.id_to_token) + 1

    # ------------------------------------------------------------------ encoding
    def _bpe(self, piece: str) -> tuple[int, ...]:
        """One pre-tokenized piece -> its ids: merge the best-ranked adjacent pair, everywhere, until none is ranked."""
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        spelled = (self.byte_to_char[b] for b in piece.encode("utf-8"))  # one character per byte
        symbols = [c for c in spelled if c in self.token_to_id]
        while len(symbols) > 1:
            pairs = set(zip(symbols, symbols[1:], strict=False))  # adjacent pairs
            best = min(pairs, key=lambda pair: self.ranks.get(pair, len(self.ranks)))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(symbols):  # left to right: "a a a" with merge "a a" -> "aa", "a"
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        ids = tuple(self.token_to_id[s] for s in symbols)
        self._cache[piece] = ids
        return ids

    def _segments(self, text: str) -> list[tuple[str, bool]]:
        """text -> [(segment, is a special token)] in order."""
        if self._special_regex is None:
            return [(text, False)] if text else []
        segments, start = [], 0
        for match in self._special_regex.finditer(text):
            if match.start() > start:
                segments.append((text[start : match.start()], False))
            segments.append((match.group(), True))
            start = match.end()
        if start < len(text):
            segments.append((text[start:], False))
        return segments

    def tokenize(self, text: str) -> list[str]:
        """text -> token strings (byte-alphabet spelling), for reading what ``encode`` did."""
        return [self.id_to_token[i] for i in self.encode(text)]

    def encode(self, text: str) -> list[int]:
        """text -> ids. Adds nothing (no bos): SmolLM2's file says add_bos_token=False. Bytes
        without a token (``missing_bytes``) are dropped, as the reference tokenizers do."""
        _check_text(text)
        ids: list[int] = []
        for segment, special in self._segments(text):
            if special:
                ids.append(self.special_tokens[segment])
            else:
                for piece in self.pre_tokenizer(segment):
                    ids.extend(self._bpe(piece))
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        if isinstance(texts, (str, bytes, bytearray)) or not isinstance(texts, Sequence):
            raise TypeError(f"encode_batch needs a list of strings, got {type(texts).__name__}")
        if not texts:
            raise ValueError("encode_batch needs at least one text, got an empty batch")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
        return [self.encode(text) for text in texts]

    # ------------------------------------------------------------------ decoding
    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """ids -> text. Special tokens are written as they are spelled (or left out); the other
        tokens' bytes are joined and read as UTF-8, an incomplete or invalid sequence as U+FFFD
        (a generated prefix may end inside a character)."""
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise TypeError(f"decode needs a sequence of token ids, got {type(ids).__name__}")
        out: list[str] = []
        pending = bytearray()
        for position, token_id in enumerate(ids):
            if isinstance(token_id, bool) or not hasattr(token_id, "__index__"):
                raise TypeError(f"ids[{position}] must be an integer token id, got {token_id!r}")
            token = self.id_to_token.get(int(token_id))
            if token is None:
                raise ValueError(
                    f"ids[{position}] = {int(token_id)} is not a token id (vocabulary of {self.vocab_size})"
                )
            if token in self.special_tokens:
                out.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
                if not skip_special_tokens:
                    out.append(token)
            else:
                for ch in token:  # a character outside the byte alphabet stands for its own UTF-8
                    b = self.char_to_byte.get(ch)
                    pending.extend(ch.encode("utf-8") if b is None else (b,))
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)


def _check_text(text: object) -> None:
    if isinstance(text, (bytes, bytearray)):
        raise TypeError("encode needs a str, got bytes: decode them first (text = data.decode('utf-8'))")
    if not isinstance(text, str):
        raise TypeError(f"encode needs a str, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"the text is not valid Unicode (a lone surrogate at {error.start}): it has no UTF-8"
        ) from error
