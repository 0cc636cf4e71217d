"""A new user's first hour: ``transformer-ref --help`` and every subcommand's ``--help`` are plain text
with help for every option, and the shipped toy translator makes the examples show real words."""

from __future__ import annotations

import argparse
import io
import itertools
import subprocess
import sys
from contextlib import redirect_stdout

import numpy as np
import pytest

from transformer_cli.main import main
from transformer_run.data import BOS, EOS, TOY_TRANSLATION, TOY_TRANSLATION_MODEL, WordVocab, pad
from transformer_spec import load_params

COMMANDS = ["compare", "embed", "generate", "pitfalls", "train", "shakespeare", "trace", "attention", "mirror", "params"]


def help_text(*argv: str) -> str:
    with redirect_stdout(io.StringIO()) as out, pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return out.getvalue()


def subparsers() -> dict[str, argparse.ArgumentParser]:
    """Each subcommand's parser, as main builds them."""
    captured = {}
    original = argparse._SubParsersAction.add_parser

    def add_parser(self, name, **kwargs):
        captured[name] = original(self, name, **kwargs)
        return captured[name]

    argparse._SubParsersAction.add_parser = add_parser
    try:
        help_text()
    finally:
        argparse._SubParsersAction.add_parser = original
    return captured


def test_the_top_level_help_lists_every_command_with_a_whole_sentence():
    text = help_text()
    assert "``" not in text
    for command in COMMANDS:
        lines = text.split(f"\n    {command} ", 1)[1].splitlines()
        rest = [lines[0]] + [x for x in itertools.takewhile(lambda x: x.startswith(" " * 10), lines[1:])]
        line = " ".join(" ".join(rest).split())
        assert line.endswith("."), f"{command}: {line!r} is cut mid-sentence"
        assert not line.startswith("transformer-ref"), line


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_help_and_no_rst_markup(command):
    text = help_text(command)
    assert "``" not in text, f"{command} --help shows reStructuredText backticks"
    parser = subparsers()[command]
    for action in parser._actions:
        assert action.help and action.help.strip() and not action.help.startswith("("), (
            f"{command} {'/'.join(action.option_strings) or action.dest} has no help"
        )


@pytest.mark.parametrize(
    "command", ["compare", "trace", "attention", "embed", "train", "shakespeare", "generate", "pitfalls"]
)
def test_commands_that_run_torch_take_threads(command):
    assert "--threads N" in help_text(command)


def test_the_shipped_toy_translator_is_small_and_translates_its_corpus():
    """transformer_run/weights/toy-translate.safetensors (python -m transformer_cli.make_toy_model)."""
    params, config = load_params(TOY_TRANSLATION_MODEL)
    assert sum(v.nbytes for v in params.values()) < 300_000
    src_vocab = WordVocab.from_sentences([s for s, _ in TOY_TRANSLATION])
    tgt_vocab = WordVocab.from_sentences([t for _, t in TOY_TRANSLATION])
    import numpy_impl

    model = numpy_impl.build_model(config, params)
    out = numpy_impl.greedy(model, pad([src_vocab.encode(s, bos=False) for s, _ in TOY_TRANSLATION]), BOS, EOS, 8)
    assert [tgt_vocab.decode(ids) for ids in out] == [t for _, t in TOY_TRANSLATION]


def test_the_attention_example_draws_real_words_and_alignments(tmp_path, capsys):
    """The first example of attention --help: the toy translator on one of its sentences. Its
    clearest cross-attention head looks from each target word to the source word it translates."""
    pytest.importorskip("matplotlib")
    from transformer_cli.attention import attention_maps
    from transformer_cli.inputs import load_model_input

    assert main(["attention", "--preset", "toy-translate", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "input: she likes fish <eos>" in out and "input: <bos> elle aime poisson" in out
    assert (tmp_path / "decoder_cross_layer0.png").exists()
    args = argparse.Namespace(preset="toy-translate", weights=None, text=None, target=None, seed=0, length=7,
                              target_length=7, batch=1)  # fmt: skip
    maps = {stem: weights for stem, _, weights, _, _ in attention_maps(load_model_input(args), "numpy", "float64")}
    cross = maps["decoder_cross_layer0"]  # (H, T_tgt, T_src): <bos> elle aime poisson over she likes fish <eos>
    diagonal = np.diagonal(cross, axis1=1, axis2=2)  # query t (predicting target word t + 1) on source word t
    assert diagonal.mean(-1).max() > 0.6, diagonal


def test_the_toy_model_script_rebuilds_a_model_like_the_shipped_one(tmp_path):
    """The recipe in transformer_cli/make_toy_model.py makes a model of the shipped file's config and
    keys that translates every training sentence. Not the same bits on every machine: the last bits
    of each matmul follow the CPU's BLAS kernels and 600 Adam steps amplify them (measured on one CPU:
    OpenBLAS's Haswell and Zen kernels rebuild the shipped file byte for byte, its Sandybridge and
    SkylakeX kernels two other models, each a correct translator); any thread count gives the same file."""
    done = subprocess.run([sys.executable, "-m", "transformer_cli.make_toy_model", str(tmp_path / "toy.safetensors")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    translations = [line for line in done.stdout.splitlines() if "->" in line]
    assert len(translations) == len(TOY_TRANSLATION) and all(line.endswith(" ok") for line in translations), done.stdout
    rebuilt, rebuilt_config = load_params(str(tmp_path / "toy.safetensors"))
    shipped, shipped_config = load_params(TOY_TRANSLATION_MODEL)
    assert rebuilt_config == shipped_config
    assert {k: (v.shape, v.dtype) for k, v in rebuilt.items()} == {k: (v.shape, v.dtype) for k, v in shipped.items()}
