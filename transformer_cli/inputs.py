"""The model and the input of ``compare``, ``trace`` and ``attention``: a preset, a checkpoint or
the real all-MiniLM-L6-v2 weights, and random ids or a sentence tokenized for that model; and
the backends a command runs in.

Sentences are tokenized with the vocabulary the model's kind was trained with in this
project: BERT's WordPiece for encoder-only models (bert-base-uncased's 30522 ids, as in
all-MiniLM-L6-v2), the tutorials' toy translation corpus for encoder-decoder models, and
the tutorials' next-word corpus for decoder-only ones (``transformer-ref train --save`` writes
checkpoints with exactly those vocabularies).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from backend_adapters import available_backends
from transformer_spec import BACKENDS, PRESETS, Config, init_params, load_params
from transformer_spec.data import BOS, NEXT_WORD, TOY_TRANSLATION, WordVocab

MINILM = "minilm"  # the real all-MiniLM-L6-v2 weights, offline (the [oracles] extra)


@dataclass
class ModelInput:
    config: Config
    params: dict[str, np.ndarray]  # float64
    inputs: tuple[np.ndarray, ...]  # the model's positional inputs: ids (and target ids, or token types)
    tokens: list[list[str]]  # per sequence in ``inputs`` (source, target): the first row's tokens
    label: str  # what the model is, for the printout


def add_model_arguments(parser: argparse.ArgumentParser, default_preset: str = "tiny") -> None:
    parser.add_argument(
        "--preset",
        default=default_preset,
        choices=sorted(PRESETS) + [MINILM],
        help=f"model: a preset size with seeded random weights, or '{MINILM}' for the real all-MiniLM-L6-v2 "
        f"weights (needs the [oracles] extra) (default: {default_preset})",
    )
    parser.add_argument("--weights", help="a safetensors checkpoint (transformer-ref train --save); overrides --preset")
    parser.add_argument(
        "--text",
        help="a sentence instead of random ids: BERT WordPiece for encoder-only models, the tutorials' toy corpora's "
        "words for the others (unknown words become <unk>)",
    )
    parser.add_argument(
        "--target",
        help="encoder-decoder models: the target sentence fed to the decoder after <bos> (default: the corpus "
        "translation of --text when it has one, else <bos> alone)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and ids (default: 0)")
    parser.add_argument(
        "--length", type=int, default=7, help="random ids: the source's (or only) length (default: %(default)s)"
    )
    parser.add_argument(
        "--target-length",
        type=int,
        default=7,
        help="random ids, encoder-decoder models: the target's length (default: %(default)s)",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="random ids: rows; every row after the first is padded to a shorter real length (default: %(default)s)",
    )


def load_model_input(args: argparse.Namespace) -> ModelInput:
    """Parse the model arguments into a config, float64 weights and one batch of inputs."""
    if args.weights:
        params, config = load_params(args.weights)
        label = args.weights
    elif args.preset == MINILM:
        from transformer_spec.hf_bert import load_hf_bert, minilm_directory

        try:
            params, config = load_hf_bert(minilm_directory())
        except ImportError as error:
            raise SystemExit(str(error)) from None
        label = "all-MiniLM-L6-v2 (real weights)"
    else:
        config = Config.preset(args.preset)
        if args.text is not None and config.kind != "encoder_only":
            config = _fit_toy_vocabulary(config)
        params = init_params(config, seed=args.seed, dtype="float64", nonzero_biases=True)
        label = f"preset {args.preset} (seeded random weights)"
    params = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    if args.text is None:
        inputs, tokens = _random_inputs(config, args.seed, args.batch, args.length, args.target_length)
    else:
        inputs, tokens = _sentence_inputs(config, args.text, args.target)
    return ModelInput(config, params, inputs, tokens, label)


def describe(model_input: ModelInput) -> str:
    c = model_input.config
    return (
        f"model: {model_input.label}: {c.kind}, d_model {c.d_model}, {c.num_heads} heads, d_ff {c.d_ff}, "
        f"layers {c.num_encoder_layers}+{c.num_decoder_layers}, {'pre' if c.norm_first else 'post'}-norm, "
        f"{c.activation}, {c.positional} positions"
    )


def add_backends_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: all installed)")


def chosen_backends(names: str) -> tuple[list[str], list[str]]:
    """``--backends`` ("numpy,torch") -> (those installed, those not), in the order given; an
    unknown name ends the command with the known ones."""
    wanted = [b.strip() for b in names.split(",") if b.strip()]
    unknown = sorted(set(wanted) - set(BACKENDS))
    if unknown:
        raise SystemExit(f"unknown backends {unknown}; expected some of {list(BACKENDS)}")
    installed = available_backends()
    return [b for b in wanted if b in installed], [b for b in wanted if b not in installed]


# ------------------------------------------------------------------------------ vocabularies
def _toy_vocabularies() -> tuple[WordVocab, WordVocab, WordVocab]:
    """-> (translation source, translation target, next-word): as ``transformer-ref train`` builds them."""
    return (
        WordVocab.from_sentences([s for s, _ in TOY_TRANSLATION]),
        WordVocab.from_sentences([t for _, t in TOY_TRANSLATION]),
        WordVocab.from_sentences(NEXT_WORD),
    )


def _fit_toy_vocabulary(config: Config) -> Config:
    """A preset resized to the toy corpus' vocabulary, so that its words are ids of the model."""
    src, tgt, words = _toy_vocabularies()
    if config.kind == "encoder_decoder":
        return config.replace(src_vocab_size=len(src), tgt_vocab_size=len(tgt))
    return config.replace(tgt_vocab_size=len(words))


def _sentence_inputs(config: Config, text: str, target: str | None) -> tuple[tuple[np.ndarray, ...], list[list[str]]]:
    if config.kind == "encoder_only":
        from transformer_spec.hf_bert import minilm_directory
        from transformer_spec.tokenizer import WordPieceTokenizer

        try:
            tokenizer = WordPieceTokenizer.from_file(minilm_directory())
        except ImportError as error:
            raise SystemExit(str(error)) from None
        if config.src_vocab_size < len(tokenizer.inverse):
            raise SystemExit(
                f"--text on an encoder-only model uses BERT's WordPiece vocabulary ({len(tokenizer.inverse)} ids), "
                f"but this model's src_vocab_size is {config.src_vocab_size}: use --preset bert-base or {MINILM}"
            )
        batch = tokenizer([text])
        tokens = [tokenizer.inverse[int(i)] for i in batch["ids"][0]]
        return (batch["ids"], batch["token_type_ids"]), [tokens]
    src_vocab, tgt_vocab, words = _toy_vocabularies()
    if config.kind == "decoder_only":
        ids = words.encode(text, bos=True, eos=False)
        _check_fits("tgt_vocab_size", config.tgt_vocab_size, len(words))
        return (np.array([ids]),), [[words.itos[i] for i in ids]]
    _check_fits("src_vocab_size", config.src_vocab_size, len(src_vocab))
    _check_fits("tgt_vocab_size", config.tgt_vocab_size, len(tgt_vocab))
    if target is None:
        target = dict(TOY_TRANSLATION).get(text, "")
    src = src_vocab.encode(text, bos=False, eos=True)
    tgt = tgt_vocab.encode(target, bos=True, eos=False) if target else [BOS]
    tokens = [[src_vocab.itos[i] for i in src], [tgt_vocab.itos[i] for i in tgt]]
    return (np.array([src]), np.array([tgt])), tokens


def _check_fits(name: str, size: int, vocab: int) -> None:
    if size < vocab:
        raise SystemExit(f"--text uses the toy corpus' {vocab} words, but this model's {name} is {size}")


def _random_inputs(
    config: Config, seed: int, batch: int, length: int, target_length: int
) -> tuple[tuple[np.ndarray, ...], list[list[str]]]:
    """``batch`` rows of random non-pad ids (of each sequence the model takes); every row after
    the first is padded to a shorter real length, so that padding is part of what is compared."""
    rng = np.random.default_rng(seed)

    def ids(vocab: int, length: int) -> np.ndarray:
        x = rng.integers(0, vocab - 1, size=(batch, length))  # (batch, length)
        x = x + (x >= config.pad_id)  # skip pad_id
        for row in range(1, batch):
            x[row, max(1, length - 2 * row) :] = config.pad_id
        return x

    if config.kind == "encoder_decoder":
        inputs = (ids(config.src_vocab_size, length), ids(config.tgt_vocab_size, target_length))
    else:
        inputs = (ids(config.tgt_vocab_size if config.kind == "decoder_only" else config.src_vocab_size, length),)
    return inputs, [[f"#{int(i)}" for i in x[0]] for x in inputs]
