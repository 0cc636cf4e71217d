"""Hugging Face's Llama, GPT-2 and Marian (code nobody here wrote) against our three backends,
through the converters ``transformer_convert.hf_llama``, ``hf_gpt2`` and ``hf_marian``.

Each model is built offline from a small config with deliberately odd sizes, every weight
drawn at random under a seed (norm scales 1 + noise, biases and ``final_logits_bias``
nonzero, so that each one counts), converted to our canonical weights, and run in each
backend; our logits must equal Hugging Face's at the real tokens of a right-padded batch
(at padded query rows the references themselves disagree). Hugging Face runs in
eval mode with ``attn_implementation="eager"`` (the written-out attention; SDPA's padded
rows differ from it by ~5e-5 in float32), in the same dtype as ours.

float64 needs care on Hugging Face's side: its Llama computes RMSNorm, the rotary angles and
the eager softmax in float32 whatever the model's dtype (upcasts meant for float16), and its
Marian rounds the sinusoid table to float32 when it creates it. For the float64 comparison
those islands are put back into float64 (``float64_everywhere``, each replacement HF's own
code without the cast); everything else is HF's code as it ships. Measured without them, HF's
float64 Llama is only float32-accurate (see ``test_hf_llama_float64_has_float32_islands``).

The converters' own checks (every key and shape, both ways; tied copies; buffers) are tested
here too, and the configs each refuses. Skipped, with the reason, without transformers.
"""

from __future__ import annotations

import copy
import functools
import os
import re

import numpy as np
import pytest

from transformer_convert.hf_gpt2 import gpt2_config, params_from_gpt2, params_to_gpt2
from transformer_convert.hf_llama import llama_config, params_from_llama, params_to_llama
from transformer_convert.hf_marian import marian_config, marian_sinusoids, params_from_marian, params_to_marian
from transformer_spec.checks import WeightsError

from ..cases import DTYPES
from ..tolerances import TOLERANCE, assert_close, max_relative_difference

ORACLE = "transformers (random weights)"
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PAD = 0  # every config's pad_token_id; real tokens are drawn from 1 .. vocab - 1
LENGTHS = (11, 7, 4)  # a right-padded batch of 3: the longest row has no padding
B, T = len(LENGTHS), max(LENGTHS)

# name -> Hugging Face config fields (deliberately odd sizes, no two equal)
LLAMA = {
    "gqa-tied": dict(num_key_value_heads=3, tie_word_embeddings=True),
    "gqa-untied-biases": dict(num_key_value_heads=3, attention_bias=True, mlp_bias=True),
    "mqa-untied": dict(num_key_value_heads=1, attention_bias=True),
    "mha-tied-mlp-bias": dict(num_key_value_heads=9, tie_word_embeddings=True, mlp_bias=True),
}
LLAMA_BASE = dict(vocab_size=61, hidden_size=54, intermediate_size=37, num_hidden_layers=2, num_attention_heads=9,
                  max_position_embeddings=63, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                  "rope_theta": 100000.0}, pad_token_id=PAD, bos_token_id=1, eos_token_id=2)  # fmt: skip
GPT2 = {
    "tied-gelu_new": dict(),
    "tied-inner37": dict(n_inner=37),
    "untied-relu": dict(tie_word_embeddings=False, activation_function="relu", n_inner=37),
}
GPT2_BASE = dict(vocab_size=53, n_positions=29, n_embd=36, n_layer=2, n_head=3, pad_token_id=PAD, bos_token_id=1,
                 eos_token_id=1)  # fmt: skip
MARIAN = {
    "d36-swish-scaled": dict(d_model=36, activation_function="swish", scale_embedding=True),
    "d33-gelu": dict(d_model=33, activation_function="gelu"),  # odd d_model: 17 sines, 16 cosines
    "d36-unshared-untied-relu": dict(
        d_model=36,
        activation_function="relu",
        share_encoder_decoder_embeddings=False,
        tie_word_embeddings=False,
        decoder_vocab_size=47,
    ),
}
MARIAN_BASE = dict(vocab_size=59, encoder_layers=2, decoder_layers=2, encoder_attention_heads=3,
                   decoder_attention_heads=3, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=31,
                   pad_token_id=PAD, decoder_start_token_id=PAD, eos_token_id=1, forced_eos_token_id=1)  # fmt: skip


# ------------------------------------------------------------------------------ Hugging Face side
@pytest.fixture(scope="module")
def transformers():
    pytest.importorskip("torch", reason="the Hugging Face oracles need torch: install the [oracles] extra")
    return pytest.importorskip("transformers", reason="the Hugging Face oracles need the [oracles] extra")


def _is_norm_scale(name: str) -> bool:
    return name.endswith(".weight") and any(part in name for part in ("norm", "ln_"))


def randomize(model, seed: int):
    """Every parameter drawn anew: N(0, 0.1^2), norm scales 1 + N(0, 0.1^2), so that no bias is zero
    and no scale is one. Marian's sinusoid tables are frozen parameters, not weights: kept."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():  # a tied parameter is listed once
            if "embed_positions" in name:
                continue
            noise = 0.1 * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            parameter.copy_(noise + (1.0 if _is_norm_scale(name) else 0.0))
        if hasattr(model, "final_logits_bias"):  # a buffer in torch, a weight for us
            model.final_logits_bias.copy_(0.1 * torch.randn(model.final_logits_bias.shape, generator=generator))
    return model.eval()


@functools.cache
def hf_model(family: str, variant: str):
    """The float32 Hugging Face model of one variant, random weights, seeded by its name."""
    import transformers

    table = {"llama": (LLAMA, LLAMA_BASE, "LlamaConfig", "LlamaForCausalLM"),
             "gpt2": (GPT2, GPT2_BASE, "GPT2Config", "GPT2LMHeadModel"),
             "marian": (MARIAN, MARIAN_BASE, "MarianConfig", "MarianMTModel")}  # fmt: skip
    variants, base, config_class, model_class = table[family]
    hf_config = getattr(transformers, config_class)(**(base | variants[variant]))
    model = getattr(transformers, model_class)._from_config(hf_config, attn_implementation="eager")
    return randomize(model, seed=sum(map(ord, family + variant)))


def float64_everywhere(model):
    """A float64 copy of ``model`` whose float32 islands are float64 too (each one HF's own code
    without its cast): Llama's RMSNorm and rotary angles, its eager softmax; Marian's sinusoids."""
    import types

    import torch
    from transformers.models.llama import modeling_llama

    model = copy.deepcopy(model).double()

    def rms_norm(self, hidden_states):  # LlamaRMSNorm.forward, without .to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    def rotary(self, x, position_ids):  # LlamaRotaryEmbedding.forward, with float64 frequencies
        theta, dim = self.config.rope_parameters["rope_theta"], self.config.head_dim
        inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    for module in model.modules():
        if isinstance(module, modeling_llama.LlamaRMSNorm):
            module.forward = types.MethodType(rms_norm, module)
        elif isinstance(module, modeling_llama.LlamaRotaryEmbedding):
            module.forward = types.MethodType(rotary, module)
    if model.config.model_type == "llama":
        model.set_attn_implementation("eager_float64")
    if model.config.model_type == "marian":
        with torch.no_grad():
            for stack in (model.model.encoder, model.model.decoder):
                table = marian_sinusoids(*stack.embed_positions.weight.shape)  # HF's formula, not rounded
                stack.embed_positions.weight.copy_(torch.from_numpy(table))
    return model


def _eager_float64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """modeling_llama.eager_attention_forward with the softmax in the inputs' dtype (HF: float32)."""
    import torch
    from transformers.models.llama.modeling_llama import repeat_kv

    key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


@pytest.fixture(scope="module", autouse=True)
def _register_eager_float64():
    """An attention implementation is two entries in HF's registries: the function, and the mask
    it takes (without the second, HF builds SDPA's boolean mask, which eager code would add)."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, eager_mask
    except ImportError:
        return
    AttentionInterface.register("eager_float64", _eager_float64)
    AttentionMaskInterface.register("eager_float64", eager_mask)


def hf_in(model, dtype: str):
    return model if dtype == "float32" else float64_everywhere(model)


def hf_state(model) -> dict[str, np.ndarray]:
    return {name: value.detach().numpy() for name, value in model.state_dict().items()}


def as_torch(arrays: dict[str, np.ndarray]) -> dict:
    import torch

    return {name: torch.from_numpy(value) for name, value in arrays.items()}


def hf_logits(model, **inputs) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(**as_torch(inputs)).logits.numpy()


# ------------------------------------------------------------------------------ inputs
def padded_ids(vocab_size: int, seed: int, lengths=LENGTHS, first: int | None = None) -> np.ndarray:
    """(B, T) ids in 1 .. vocab - 1, right-padded with PAD to the longest of ``lengths``."""
    rng = np.random.default_rng(seed)
    ids = np.full((len(lengths), max(lengths)), PAD, np.int64)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(1, vocab_size, length)
        if first is not None:
            ids[row, 0] = first
    return ids


def marian_target_mask(tgt_real: np.ndarray) -> np.ndarray:
    """Our decoder's self-attention mask for Marian's targets: causal, padding hidden, but the
    start token (which is the pad id) seen. (B, 1, T, T), True = may attend."""
    causal = np.tril(np.ones((tgt_real.shape[1],) * 2, bool))
    return causal[None, None] & tgt_real[:, None, None, :]


# ------------------------------------------------------------------------------ the comparisons
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", list(LLAMA))
def test_llama_logits_equal_transformers(backend, transformers, variant, dtype):
    reference = hf_in(hf_model("llama", variant), dtype)
    config = llama_config(reference.config.to_dict())
    params = params_from_llama(hf_state(reference), config)
    ids = padded_ids(config.tgt_vocab_size, seed=1)
    real = ids != PAD
    want = hf_logits(reference, input_ids=ids, attention_mask=real.astype(np.int64))
    got = backend.call(backend.impl.build_model(config, params, dtype=dtype), ids).logits
    assert got.dtype == np.dtype(dtype)
    assert_close(got[real], want[real], dtype, f"Llama {variant} logits at real tokens")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", list(GPT2))
def test_gpt2_logits_equal_transformers(backend, transformers, variant, dtype):
    reference = hf_in(hf_model("gpt2", variant), dtype)
    config = gpt2_config(reference.config.to_dict())
    params = params_from_gpt2(hf_state(reference), config)
    ids = padded_ids(config.tgt_vocab_size, seed=2)
    real = ids != PAD
    want = hf_logits(reference, input_ids=ids, attention_mask=real.astype(np.int64))
    got = backend.call(backend.impl.build_model(config, params, dtype=dtype), ids).logits
    assert_close(got[real], want[real], dtype, f"GPT-2 {variant} logits at real tokens")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", list(MARIAN))
def test_marian_logits_equal_transformers(backend, transformers, variant, dtype):
    reference = hf_in(hf_model("marian", variant), dtype)
    hf_config = reference.config.to_dict()
    config, shared = marian_config(hf_config), hf_config["share_encoder_decoder_embeddings"]
    params = params_from_marian(hf_state(reference), config, shared_embeddings=shared)
    src = padded_ids(config.src_vocab_size, seed=3)
    tgt = padded_ids(config.tgt_vocab_size, seed=4, lengths=(7, 5, 2), first=hf_config["decoder_start_token_id"])
    tgt_real = (tgt != PAD) | (np.arange(tgt.shape[1]) == 0)  # the start token is the pad id, and real
    want = hf_logits(reference, input_ids=src, attention_mask=(src != PAD).astype(np.int64), decoder_input_ids=tgt,
                     decoder_attention_mask=tgt_real.astype(np.int64))  # fmt: skip
    model = backend.impl.build_model(config, params, dtype=dtype)
    got = backend.call(model, src, tgt, tgt_mask=marian_target_mask(tgt_real)).logits
    assert_close(got[tgt_real], want[tgt_real], dtype, f"Marian {variant} logits at real target tokens")
    # the default mask (make_target_mask) keeps the start token visible although it is the pad id
    default = backend.call(model, src, tgt).logits
    assert_close(default[tgt_real], want[tgt_real], dtype, f"Marian {variant} logits, default target mask")


@pytest.mark.parametrize("variant", list(MARIAN))
def test_marian_greedy_and_beam_equal_transformers_generate(backend, transformers, variant):
    """Decoding starts from Marian's pad token (decoder_start_token_id): our steppers keep that
    start token visible, as the forward pass's default mask does, and give generate's tokens."""
    import torch

    reference = hf_in(hf_model("marian", variant), "float64")
    with torch.no_grad():  # never the pad token (Marian's generation bans it): ours hides a fed pad from later queries
        reference.final_logits_bias[..., PAD] = -1e4
    hf_config = reference.config.to_dict()
    config, shared = marian_config(hf_config), hf_config["share_encoder_decoder_embeddings"]
    model = backend.impl.build_model(config, params_from_marian(hf_state(reference), config, shared_embeddings=shared))
    src = padded_ids(config.src_vocab_size, seed=3)
    start, eos = hf_config["decoder_start_token_id"], hf_config["eos_token_id"]
    for beams in (1, 3):
        with torch.no_grad():
            want = reference.generate(
                torch.from_numpy(src), attention_mask=torch.from_numpy((src != PAD).astype(np.int64)),
                max_new_tokens=6, num_beams=beams, do_sample=False, length_penalty=1.0,
                forced_eos_token_id=None,  # Marian's config forces <eos> at the last step; ours does not
            ).numpy()  # fmt: skip
        if beams == 1:
            got = backend.impl.greedy(model, src, start, eos, 6)
        else:
            got = backend.impl.beam(model, src, start, eos, 6, beam_size=beams, length_penalty=1.0).ids
        for row in range(len(src)):
            hf_row = [int(t) for t in want[row]]
            ours = [int(t) for t in got[row]][: len(hf_row)]
            if eos in hf_row:  # HF pads after <eos> with the pad id, as we do
                hf_row = hf_row[: hf_row.index(eos) + 1]
                ours = ours[: len(hf_row)]
            assert ours == hf_row, f"beams={beams} row {row}: ours {ours}, transformers {hf_row}"


# ------------------------------------------------------------------------------ beam search's stopping rules
EARLY_STOPPING = [True, False, "never"]
BEAM_SETTINGS = ((0.6, 3), (1.0, 2), (2.0, 2), (2.0, 3))  # (length_penalty, beam_size)
NEW_TOKENS = 10


@functools.cache
def eos_reachable(family: str):
    """A float64 Hugging Face model whose <eos> some rows emit at once, some late, some never
    within NEW_TOKENS, our float64 config and weights converted from it, and the inputs:
    ``(reference, config, params, hf_inputs, src_ids, bos, eos)``. The eos row of the output
    projection is scaled, so the eos logit swings with the hidden state from row to row and step
    to step. Marian (untied head) never emits its pad token, which is its decoder's start (HF's
    generation bans it; ours hides a fed pad from later queries); the Llama model reads its pad
    id as eos, which a running hypothesis never holds, for the same reason. Six rows each; the
    Llama prompts are of equal length (HF pads prompts on the left, we on the right)."""
    import torch

    variant = {"marian": "d36-unshared-untied-relu", "llama": "gqa-untied-biases"}[family]
    reference = hf_in(hf_model(family, variant), "float64")
    hf_config = reference.config.to_dict()
    eos = hf_config["eos_token_id"]
    with torch.no_grad():
        reference.lm_head.weight[eos] *= {"marian": 5.0, "llama": 12.0}[family]
    if family == "marian":
        with torch.no_grad():
            reference.final_logits_bias[..., PAD] = -1e4
            reference.final_logits_bias[..., eos] -= 0.5
        config = marian_config(hf_config)
        params = params_from_marian(hf_state(reference), config, shared_embeddings=False)
        src = padded_ids(config.src_vocab_size, seed=3, lengths=(11, 7, 4, 9, 6, 10))
        hf_inputs = {"input_ids": src, "attention_mask": (src != PAD).astype(np.int64), "forced_eos_token_id": None}
        return reference, config, params, hf_inputs, src, hf_config["decoder_start_token_id"], eos
    config = llama_config(hf_config | {"pad_token_id": eos})
    params = params_from_llama(hf_state(reference), config)
    prompts = np.random.default_rng(7).integers(3, config.tgt_vocab_size, (6, 5))  # never pad (= eos) nor bos
    hf_inputs = {"input_ids": prompts, "attention_mask": np.ones_like(prompts), "pad_token_id": eos}
    return reference, config, params, hf_inputs, prompts[:, :-1], prompts[:, -1], eos  # the last is our bos


@functools.cache
def hf_generated(family: str, num_beams: int, length_penalty: float, early_stopping) -> tuple[tuple[int, ...], ...]:
    """generate's new tokens per row, up to and with <eos> (HF pads after it)."""
    import torch

    reference, _, _, hf_inputs, _, _, eos = eos_reachable(family)
    inputs = {name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
              for name, value in hf_inputs.items()}  # fmt: skip
    beam_arguments = {"length_penalty": length_penalty, "early_stopping": early_stopping} if num_beams > 1 else {}
    with torch.no_grad():
        out = reference.generate(**inputs, max_new_tokens=NEW_TOKENS, num_beams=num_beams, do_sample=False,
                                 **beam_arguments).numpy()  # fmt: skip
    start = 1 if family == "marian" else hf_inputs["input_ids"].shape[1]  # after the start token, or the prompt
    rows = [[int(t) for t in row[start:]] for row in out]
    return tuple(tuple(row[: row.index(eos) + 1] if eos in row else row) for row in rows)


def ours_up_to(ids: np.ndarray, want: tuple[int, ...]) -> tuple[int, ...]:
    """Our row (from bos) as generate's: the new tokens, as many as HF's."""
    return tuple(int(t) for t in ids[1 : 1 + len(want)])


@pytest.mark.parametrize("family", ["marian", "llama"])
def test_the_stopping_rule_models_end_early_late_and_never_and_the_rules_differ(transformers, family):
    """So that the comparisons below cannot pass on outputs that never emit <eos>, or on settings
    where the three rules agree: HF's own outputs end at several lengths (1 token, later, never),
    and each rule gives another answer than the next on some row."""
    *_, eos = eos_reachable(family)
    lengths = set()
    differs = [False, False]
    for length_penalty, beams in BEAM_SETTINGS:
        outputs = [hf_generated(family, beams, length_penalty, rule) for rule in EARLY_STOPPING]
        lengths |= {len(row) if row[-1] == eos else None for rows in outputs for row in rows}
        differs = [differs[0] or outputs[0] != outputs[1], differs[1] or outputs[1] != outputs[2]]
    assert None in lengths and 1 in lengths and len(lengths - {None, 1}) >= 2, lengths
    assert differs == [True, True], "the rules gave the same outputs: the comparisons could not tell them apart"


@pytest.mark.parametrize("early_stopping", EARLY_STOPPING, ids=str)
@pytest.mark.parametrize("family", ["marian", "llama"])
def test_beam_search_equals_transformers_generate_for_each_early_stopping(backend, transformers, family,
                                                                          early_stopping):  # fmt: skip
    """The same tokens as generate(num_beams=k, early_stopping=..., length_penalty=...) for
    several length penalties and beam sizes; and each row decoded alone, without the others of
    its batch, gives the same hypothesis and score."""
    _, config, params, _, src, bos, eos = eos_reachable(family)
    model = backend.impl.build_model(config, params)
    for length_penalty, beams in BEAM_SETTINGS:
        want = hf_generated(family, beams, length_penalty, early_stopping)
        got = backend.impl.beam(model, src, bos, eos, NEW_TOKENS, beams, length_penalty, early_stopping)
        for row, hf_row in enumerate(want):
            ours = ours_up_to(got.ids[row], hf_row)
            assert ours == hf_row, f"k={beams} length_penalty={length_penalty} row {row}: ours {ours}, HF {hf_row}"
    for row in range(len(src)):  # the last setting, whose rules differ most
        first = bos if np.ndim(bos) == 0 else bos[row : row + 1]
        alone = backend.impl.beam(model, src[row : row + 1], first, eos, NEW_TOKENS, beams, length_penalty,
                                  early_stopping)  # fmt: skip
        hypothesis = alone.ids[0].tolist()
        assert got.ids[row, : len(hypothesis)].tolist() == hypothesis, f"row {row}: batched and alone differ"
        assert abs(got.scores[row] - alone.scores[0]) <= 1e-12 * abs(alone.scores[0])


@pytest.mark.parametrize("family", ["marian", "llama"])
def test_greedy_search_equals_transformers_generate_when_eos_is_reached(backend, transformers, family):
    _, config, params, _, src, bos, eos = eos_reachable(family)
    got = backend.impl.greedy(backend.impl.build_model(config, params), src, bos, eos, NEW_TOKENS)
    want = hf_generated(family, 1, 1.0, False)
    assert any(row[-1] == eos for row in want), "no row reached <eos>: the comparison would not test it"
    for row, hf_row in enumerate(want):
        assert ours_up_to(got[row], hf_row) == hf_row, f"row {row}: ours {got[row].tolist()}, HF {hf_row}"


def test_hf_llama_float64_has_float32_islands(transformers):
    """Why ``float64_everywhere`` exists: HF's float64 Llama as it ships is float32-accurate only."""
    model = hf_model("llama", "gqa-untied-biases")
    ids = padded_ids(LLAMA_BASE["vocab_size"], seed=1)
    real = ids != PAD
    as_shipped = hf_logits(copy.deepcopy(model).double(), input_ids=ids, attention_mask=real.astype(np.int64))
    exact = hf_logits(float64_everywhere(model), input_ids=ids, attention_mask=real.astype(np.int64))
    error = max_relative_difference(as_shipped[real], exact[real])
    assert TOLERANCE["float64"] < error < TOLERANCE["float32"], error


@pytest.mark.parametrize("d_model", [36, 33])
def test_marian_sinusoids_are_hf_tables_in_float64(transformers, d_model):
    """HF's own float32 table is ``marian_sinusoids`` rounded: the same formula, odd d_model included
    (ceil(d/2) sines, then floor(d/2) cosines)."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    hf_table = MarianSinusoidalPositionalEmbedding(31, d_model).create_weight().numpy()
    ours = marian_sinusoids(31, d_model)
    np.testing.assert_array_equal(hf_table, ours.astype(np.float32))
    sines = (d_model + 1) // 2
    np.testing.assert_allclose(ours[5, :sines], np.sin(5 * 10000.0 ** (-2 * np.arange(sines) / d_model)), atol=1e-14)
    cosines = np.cos(5 * 10000.0 ** (-2 * np.arange(d_model // 2) / d_model))
    np.testing.assert_allclose(ours[5, sines:], cosines, atol=1e-14)


# ------------------------------------------------------------------------------ round trips
FAMILIES = {
    "llama": (LLAMA, llama_config, params_from_llama, params_to_llama),
    "gpt2": (GPT2, gpt2_config, params_from_gpt2, params_to_gpt2),
    "marian": (MARIAN, marian_config, params_from_marian, params_to_marian),
}
ALL_VARIANTS = [pytest.param(family, variant, id=f"{family}-{variant}") for family in FAMILIES
                for variant in FAMILIES[family][0]]  # fmt: skip


def converted(family: str, variant: str):
    """(HF model, our config, its state dict, our params, from, to) with the Marian keyword bound."""
    _, make_config, from_hf, to_hf = FAMILIES[family]
    model = hf_model(family, variant)
    hf_config = model.config.to_dict()
    config = make_config(hf_config)
    if family == "marian":
        shared = hf_config["share_encoder_decoder_embeddings"]
        from_hf = functools.partial(from_hf, shared_embeddings=shared)
        to_hf = functools.partial(to_hf, shared_embeddings=shared)
    state = hf_state(model)
    return model, config, state, from_hf(state, config), from_hf, to_hf


@pytest.mark.parametrize(("family", "variant"), ALL_VARIANTS)
def test_hf_state_dict_round_trips_exactly(transformers, family, variant):
    model, config, state, params, from_hf, to_hf = converted(family, variant)
    back = to_hf(params, config)
    assert sorted(back) == sorted(state), "the export has every key of state_dict(), and no other"
    for name in state:
        assert back[name].dtype == state[name].dtype and np.array_equal(back[name], state[name]), name
    model.load_state_dict(as_torch(back), strict=True)
    again = from_hf(back, config)
    assert all(np.array_equal(again[name], params[name]) for name in params)


@pytest.mark.parametrize(("family", "variant"), ALL_VARIANTS)
def test_a_missing_key_is_named(transformers, family, variant):
    _, config, state, _, from_hf, _ = converted(family, variant)
    victim = [name for name in state if ".layers.1." in name or ".h.1." in name][-1]
    with pytest.raises(WeightsError, match=f"missing keys.*{victim.removeprefix('transformer.')}"):
        from_hf({k: v for k, v in state.items() if k != victim}, config)


@pytest.mark.parametrize(("family", "variant"), ALL_VARIANTS)
def test_an_extra_layer_is_refused_not_dropped(transformers, family, variant):
    _, config, state, _, from_hf, _ = converted(family, variant)
    layer = ".h." if family == "gpt2" else ".layers."
    extra = {name.replace(f"{layer}1.", f"{layer}2."): value for name, value in state.items() if f"{layer}1." in name}
    with pytest.raises(WeightsError, match=r"unexpected keys.*\.2\."):
        from_hf(state | extra, config)


@pytest.mark.parametrize(("family", "variant"), ALL_VARIANTS)
def test_an_export_of_the_wrong_weights_is_refused(transformers, family, variant):
    _, config, _, params, _, to_hf = converted(family, variant)
    victim = sorted(params)[0]
    with pytest.raises(WeightsError, match=f"missing keys.*{victim}"):
        to_hf({k: v for k, v in params.items() if k != victim}, config)
    name = next(name for name in params if name.endswith("w_v.weight"))
    with pytest.raises(WeightsError, match=f"wrong shapes.*{name}"):
        to_hf(params | {name: params[name][:, 1:]}, config)


def test_llama_wrong_kv_rows_are_named(transformers):
    _, config, state, _, from_hf, _ = converted("llama", "gqa-tied")
    name = "model.layers.0.self_attn.k_proj.weight"
    wrong = np.concatenate([state[name], state[name][:6]])  # one kv head too many: (24, 54)
    with pytest.raises(WeightsError, match=r"wrong shapes.*k_proj.weight: expected \(18, 54\), got \(24, 54\)"):
        from_hf(state | {name: wrong}, config)


def test_gpt2_c_attn_with_extra_packed_rows_is_refused(transformers):
    _, config, state, _, from_hf, _ = converted("gpt2", "tied-gelu_new")
    weight, bias = "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias"
    with pytest.raises(WeightsError, match=r"h.0.attn.c_attn.weight: expected \(36, 108\), got \(36, 109\)"):
        from_hf(state | {weight: np.pad(state[weight], ((0, 0), (0, 1)))}, config)
    with pytest.raises(WeightsError, match=r"h.0.attn.c_attn.bias: expected \(108\), got \(111\)"):
        from_hf(state | {bias: np.pad(state[bias], (0, 3))}, config)


def test_gpt2_splits_c_attn_into_q_k_v_in_that_order(transformers):
    _, config, state, params, _, _ = converted("gpt2", "tied-gelu_new")
    c_attn = state["transformer.h.1.attn.c_attn.weight"]  # (36, 108): [q | k | v]
    for j, name in enumerate(("w_q", "w_k", "w_v")):
        np.testing.assert_array_equal(
            params[f"decoder.layers.1.self_attn.{name}.weight"], c_attn[:, 36 * j : 36 * (j + 1)]
        )


def test_gpt2_loads_openai_keys_and_old_buffers(transformers):
    """OpenAI's converted checkpoints: no ``transformer.`` prefix, a causal ``attn.bias`` and a
    ``masked_bias`` per layer (buffers, not weights); a mask that is not causal is refused."""
    _, config, state, params, from_hf, _ = converted("gpt2", "tied-gelu_new")
    old = {name.removeprefix("transformer."): value for name, value in state.items() if name != "lm_head.weight"}
    n = config.max_len
    for i in range(config.num_decoder_layers):
        old[f"h.{i}.attn.bias"] = np.tril(np.ones((n, n), np.uint8))[None, None]
        old[f"h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    loaded = from_hf(old, config)
    assert all(np.array_equal(loaded[name], params[name]) for name in params)
    old["h.1.attn.bias"] = np.ones((1, 1, n, n), np.uint8)
    with pytest.raises(WeightsError, match="h.1.attn.bias is not GPT-2's causal mask"):
        from_hf(old, config)


def test_gpt2_untied_head_has_no_bias_to_export(transformers):
    _, config, _, params, _, to_hf = converted("gpt2", "untied-relu")
    assert not params["generator.proj.bias"].any()
    with pytest.raises(WeightsError, match="generator.proj.bias is not zero"):
        to_hf(params | {"generator.proj.bias": params["generator.proj.bias"] + 1.0}, config)


@pytest.mark.parametrize(("family", "variant", "copy"), [
    ("llama", "gqa-tied", "lm_head.weight"),
    ("gpt2", "tied-gelu_new", "lm_head.weight"),
    ("marian", "d36-swish-scaled", "lm_head.weight"),
    ("marian", "d36-swish-scaled", "model.encoder.embed_tokens.weight"),
    ("marian", "d36-swish-scaled", "model.decoder.embed_tokens.weight"),
])  # fmt: skip
def test_a_tied_copy_that_differs_is_refused(transformers, family, variant, copy):
    _, config, state, _, from_hf, _ = converted(family, variant)
    with pytest.raises(WeightsError, match=f"{copy} differs from"):
        from_hf(state | {copy: state[copy] + 1.0}, config)


def test_marian_shared_tables_must_be_equal_to_export(transformers):
    """A shared checkpoint reads into one table (share_embeddings); read into a config with two
    tables, they are equal copies, and an export refuses copies that drifted apart."""
    _, config, state, params, from_hf, to_hf = converted("marian", "d36-swish-scaled")
    assert config.share_embeddings and "src_embed.token.weight" not in params
    two_tables = config.replace(share_embeddings=False)
    params = from_hf(state, two_tables)
    assert np.array_equal(params["src_embed.token.weight"], params["tgt_embed.token.weight"])
    changed = params | {"src_embed.token.weight": params["src_embed.token.weight"] + 1.0}
    with pytest.raises(WeightsError, match="src_embed.token.weight differs from tgt_embed.token.weight"):
        to_hf(changed, two_tables)


def test_marian_positions_in_another_layout_are_refused(transformers):
    _, config, state, _, from_hf, _ = converted("marian", "d33-gelu")
    name = "model.decoder.embed_positions.weight"
    halves = state[name]
    interleaved = np.empty_like(halves)
    interleaved[:, 0::2], interleaved[:, 1::2] = halves[:, :17], halves[:, 17:]
    with pytest.raises(WeightsError, match=f"{name} is not Marian's"):
        from_hf(state | {name: interleaved}, config)
    saved = {k: v for k, v in state.items() if "embed_positions" not in k}  # as save_pretrained writes it
    assert all(np.array_equal(from_hf(saved, config)[k], v) for k, v in from_hf(state, config).items())


def test_marian_final_logits_bias_is_our_logits_bias(transformers):
    _, config, state, params, _, _ = converted("marian", "d36-swish-scaled")
    assert config.final_logits_bias and config.tie_output
    np.testing.assert_array_equal(params["generator.logits_bias"], state["final_logits_bias"][0])
    _, config, state, params, _, _ = converted("marian", "d36-unshared-untied-relu")
    assert not config.final_logits_bias and not config.tie_output  # untied: lm_head's bias
    np.testing.assert_array_equal(params["generator.proj.bias"], state["final_logits_bias"][0])


# ------------------------------------------------------------------------------ configs
def test_configs_read_what_each_model_is():
    llama = llama_config(LLAMA_BASE | LLAMA["gqa-tied"])
    assert (llama.norm, llama.gated_ffn, llama.activation, llama.positional, llama.rope_layout) == (
        "rms_norm", True, "silu", "rotary", "halves")  # fmt: skip
    assert (llama.num_kv_heads, llama.rope_theta, llama.layer_norm_eps, llama.tie_output) == (3, 1e5, 1e-5, True)
    mha = llama_config(LLAMA_BASE | LLAMA["mha-tied-mlp-bias"])
    assert mha.num_kv_heads == mha.num_heads and mha.to_dict()["num_kv_heads"] is None  # follows num_heads
    gpt2 = gpt2_config(GPT2_BASE)
    assert (gpt2.activation, gpt2.positional, gpt2.d_ff, gpt2.max_len, gpt2.tie_output) == (
        "gelu_tanh", "learned", 144, 29, True)  # fmt: skip
    marian = marian_config(MARIAN_BASE | MARIAN["d36-swish-scaled"])
    assert (marian.activation, marian.sinusoid_layout, marian.norm_first, marian.final_logits_bias) == (
        "silu", "halves", False, True)  # fmt: skip
    assert not marian.encoder_final_norm and not marian.decoder_final_norm and marian.scale_embeddings


REFUSED = [
    pytest.param(llama_config, LLAMA_BASE | {"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling",
                 id="llama-rope_scaling"),
    pytest.param(llama_config, LLAMA_BASE | {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}},
                 "rope_parameters.rope_type='llama3'", id="llama-rope_type"),
    pytest.param(llama_config, LLAMA_BASE | {"head_dim": 8}, "head_dim=8", id="llama-head_dim"),
    pytest.param(llama_config, LLAMA_BASE | {"hidden_act": "gelu_fast"}, "hidden_act='gelu_fast'", id="llama-act"),
    pytest.param(llama_config, LLAMA_BASE | {"pad_token_id": None}, "pad_token_id=None", id="llama-no-pad"),
    pytest.param(llama_config, LLAMA_BASE | {"model_type": "mistral"}, "model_type='mistral'", id="llama-mistral"),
    pytest.param(gpt2_config, GPT2_BASE | {"scale_attn_by_inverse_layer_idx": True},
                 "scale_attn_by_inverse_layer_idx=True", id="gpt2-layer-scaled"),
    pytest.param(gpt2_config, GPT2_BASE | {"add_cross_attention": True}, "add_cross_attention=True",
                 id="gpt2-cross-attention"),
    pytest.param(gpt2_config, GPT2_BASE | {"activation_function": "quick_gelu"}, "activation_function='quick_gelu'",
                 id="gpt2-act"),
    pytest.param(marian_config, MARIAN_BASE | {"d_model": 36, "decoder_attention_heads": 4},
                 "decoder_attention_heads=4", id="marian-heads"),
    pytest.param(marian_config, MARIAN_BASE | {"d_model": 36, "decoder_ffn_dim": 41}, "decoder_ffn_dim=41",
                 id="marian-ffn"),
    pytest.param(marian_config, MARIAN_BASE | {"d_model": 36, "normalize_before": True}, "normalize_before=True",
                 id="marian-pre-norm"),
    pytest.param(marian_config, MARIAN_BASE | {"d_model": 36, "activation_function": "tanh"},
                 "activation_function='tanh'", id="marian-act"),
    pytest.param(marian_config, MARIAN_BASE | {"d_model": 36, "tie_word_embeddings": False},
                 "tie_word_embeddings=False", id="marian-shared-untied"),
]  # fmt: skip


@pytest.mark.parametrize(("read", "hf_config", "field"), REFUSED)
def test_unsupported_settings_are_refused_naming_the_field(read, hf_config, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        read(hf_config)


def test_a_pad_id_can_be_given_when_the_config_has_none():
    assert llama_config(LLAMA_BASE | {"pad_token_id": None}, pad_id=2).pad_id == 2
    assert gpt2_config(GPT2_BASE | {"pad_token_id": None}, pad_id=52).pad_id == 52
    with pytest.raises(ValueError, match="pad id 99"):
        gpt2_config(GPT2_BASE, pad_id=99)
