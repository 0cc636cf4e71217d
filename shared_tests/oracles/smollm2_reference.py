"""What the two SmolLM2 oracle modules share: a plain NumPy Llama over our canonical weights,
the tokenizers-library tokenizer built from the file's vocabulary, and the texts they encode.

The Llama here uses no class of ours: it is written from the papers' and HF's equations
(RMSNorm, rotate_half rotary embedding, grouped-query attention by repeating key/value
heads, SwiGLU, the head tied to the embedding), so that a loader bug cannot hide behind a
matching model bug.
"""

from __future__ import annotations

import importlib
import inspect

import numpy as np
import pytest

HARD_TEXTS = [
    "",
    " ",
    "Hello world",
    "  leading, trailing and   inner   runs of spaces  ",
    "\ttabs\t\tand\t mixed \t whitespace",
    "new\nlines\n\n\nand\r\nwindows\r\n\r\nline ends\n",
    "a \n b  \n\n  c\u00a0nbsp\u2003em-space\u3000ideographic\u2028line-sep",
    "naïve café résumé Ærøskøbing straße",
    "e\u0301 (combining acute) vs \u00e9; a\u0308\u0304 stacked marks; Zalgo z\u0336\u0311a\u0334",
    "日本語のテキスト、中文文本。한국어 텍스트",
    "العربية نص مكتوب من اليمين إلى اليسار، עברית",
    "Ελληνικά Русский текст हिन्दी ไทย",
    "emoji 😀 👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈 flags 🇫🇷🇯🇵 keycap 1️⃣",
    "digits 0 1 22 333 4444 1234567890 3.14159 -2.5e-10 1,000,000 $19.99 2024-11-23 10:30",
    "non-ASCII numbers: x² ½ ¾ Ⅻ ١٢٣ ٤٥٦ १२३ ①②",
    "punctuation!?... «guillemets» “curly” ‘quotes’ — en–dash (parens) [brackets] {braces} <angle> @#%^&*_+=|\\/~`",
    "contractions: it's don't we're I've she'll he'd I'm IT'S DON'T 's 't 're rock'n'roll ''quoted''",
    "code: def f(x): return x**2  # comment\n    if a != b: print(f'{a!r}')",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n",
    "special tokens inside words: abc<|endoftext|>def<|im_end|><|im_start|> and a broken <|im_start| one",
    "<filename>src/main.py<file_sep><gh_stars>100<jupyter_code>x = 1<empty_output>",
    "zero\u200bwidth\u200cjoiner\u200d and soft\u00adhyphen and BOM\ufeff",
    "control characters \x01\x02\x07\x1b[0m and information separators \x1c\x1d\x1e\x1f",
    "a" * 300,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
]

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "<|im_start|>user\nName three colors.<|im_end|>\n"]


def real_text() -> str:
    """A few hundred lines of English prose and code: the standard library's module docstrings."""
    names = ["re", "json", "argparse", "textwrap", "difflib", "heapq", "bisect", "string", "pickle", "decimal"]
    docs = [inspect.getdoc(importlib.import_module(name)) for name in names]
    text = "\n\n".join(doc for doc in docs if doc)
    assert text.count("\n") > 300
    return text


def tokenizers_library(info, digits: bool = True):
    """The file's tokenizer built with the tokenizers library from its vocabulary and merges:
    SmolLM2's tokenizer.json pipeline, Digits(individual_digits=True) then ByteLevel (GPT-2's
    regex, no prefix space), CONTROL/USER_DEFINED tokens added whole; ``digits=False`` leaves
    the digit split out (ByteLevel alone, what transformers builds for any "gpt2" GGUF file)."""
    tokenizers = pytest.importorskip("tokenizers", reason="needs the [oracles] extra")
    from tokenizers import AddedToken, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(info.tokens)}
    reference = tokenizers.Tokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in info.merges]))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    digit_split = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    reference.pre_tokenizer = pre_tokenizers.Sequence([*digit_split, byte_level])
    reference.decoder = decoders.ByteLevel()
    reference.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in info.special_tokens])
    return reference


def _rms_norm(x, weight, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight  # (T, d_model)


def _rotate(x, theta):
    """Rotary embedding, "halves" layout (HF's rotate_half): feature i pairs with i + d_k/2."""
    _, seq_len, d_k = x.shape  # (heads, T, d_k)
    inv_freq = theta ** (-np.arange(0, d_k, 2) / d_k)  # (d_k/2,)
    angles = np.arange(seq_len)[:, None] * inv_freq[None, :]  # (T, d_k/2)
    angles = np.concatenate([angles, angles], -1)  # (T, d_k)
    half = d_k // 2
    rotated_half = np.concatenate([-x[..., half:], x[..., :half]], -1)  # (heads, T, d_k)
    return x * np.cos(angles) + rotated_half * np.sin(angles)


def llama_last_logits(params, config, ids) -> np.ndarray:
    """ids (T,) -> logits (V,) at the last position, computed in float64 from "halves" weights."""
    p = lambda name: params[name].astype(np.float64)  # noqa: E731
    heads, kv_heads, eps = config.num_heads, config.num_kv_heads, config.layer_norm_eps
    d_k, seq_len = config.d_model // heads, len(ids)
    x = params["tgt_embed.token.weight"][ids].astype(np.float64)  # (T, d_model): unscaled embeddings
    causal = np.triu(np.full((seq_len, seq_len), -np.inf), k=1)  # (T, T)
    for i in range(config.num_decoder_layers):
        layer = f"decoder.layers.{i}."
        h = _rms_norm(x, p(layer + "self_attn_norm.weight"), eps)  # (T, d_model)
        q = (h @ p(layer + "self_attn.w_q.weight")).reshape(seq_len, heads, d_k).transpose(1, 0, 2)  # (H, T, d_k)
        k = (h @ p(layer + "self_attn.w_k.weight")).reshape(seq_len, kv_heads, d_k).transpose(1, 0, 2)  # (H_kv, T, d_k)
        v = (h @ p(layer + "self_attn.w_v.weight")).reshape(seq_len, kv_heads, d_k).transpose(1, 0, 2)  # (H_kv, T, d_k)
        q, k = _rotate(q, config.rope_theta), _rotate(k, config.rope_theta)
        k, v = np.repeat(k, heads // kv_heads, axis=0), np.repeat(v, heads // kv_heads, axis=0)  # (H, T, d_k)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(d_k) + causal  # (H, T, T)
        weights = np.exp(scores - scores.max(-1, keepdims=True))  # (H, T, T)
        weights /= weights.sum(-1, keepdims=True)
        attended = (weights @ v).transpose(1, 0, 2).reshape(seq_len, heads * d_k)  # (T, d_model)
        x = x + attended @ p(layer + "self_attn.w_o.weight")  # (T, d_model)
        h = _rms_norm(x, p(layer + "ffn_norm.weight"), eps)  # (T, d_model)
        gate = h @ p(layer + "ffn.w_gate.weight")  # (T, d_ff)
        swiglu = gate / (1 + np.exp(-gate)) * (h @ p(layer + "ffn.w_up.weight"))  # (T, d_ff): silu(gate) * up
        x = x + swiglu @ p(layer + "ffn.w_down.weight")  # (T, d_model)
    last = _rms_norm(x[-1], p("decoder.norm.weight"), eps)  # (d_model,)
    if config.tie_output:
        return p("tgt_embed.token.weight") @ last  # (V, d_model) @ (d_model,) -> (V,): the embedding is the head
    return last @ p("generator.proj.weight")  # (V,)
