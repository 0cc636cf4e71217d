"""The pitfall "rope-layout-mix-up": RoPE weights read in the other rotary layout."""

from __future__ import annotations

import numpy as np

from transformer_convert.rope import convert_rope_layout
from transformer_spec import Config, init_params

from .common import DTYPE, _backend, _g
from .registry import BACKENDS, Demonstration, register, source


def wrong_read_gguf_q_k(gguf_params, config):
    # llama.cpp's converter permuted each head's attn_q / attn_k rows for GGML's interleaved pairs (2i, 2i + 1);
    # taken over as they are, and rotated with HF's rotate_half pairs (i, i + d_k/2):
    return dict(gguf_params), config.replace(rope_layout="halves")


def ours_read_gguf_q_k(gguf_params, config):
    from transformer_convert.rope import convert_rope_layout

    file_config = config.replace(rope_layout="interleaved")  # the layout the file's q/k rows are laid out for
    return convert_rope_layout(gguf_params, file_config, to="halves"), config.replace(rope_layout="halves")


@register("rope-layout-mix-up", "RoPE weights read in the other rotary layout", BACKENDS)
def rope_layout_mix_up(backend: str) -> Demonstration:
    """Rotary position embedding rotates pairs of each head's query and key features, and which
    features form a pair is a convention: HF's Llama pairs i with i + d_k/2 ("halves"), GGUF files,
    GGML and GPT-J pair 2i with 2i + 1 ("interleaved"), and a GGUF file's q/k rows are permuted to
    match. Loading such weights into a halves model without undoing that permutation
    (transformer_convert.rope) raises nothing and changes no shape: every pair is rotated at another
    pair's frequency, so the logits are wrong at every position but the first (a token at relative
    distance 0 is not rotated at all), which is why a one-token test passes. On the real
    SmolLM2-135M the mixed-up model still writes fluent text that soon repeats itself (the SmolLM2
    page shows it)."""
    b = _backend(backend)
    config = Config.preset("tiny-llama")  # 9 query heads, 3 kv heads, d_k 6, rotary, halves layout
    hf_params = init_params(config, seed=11, dtype=DTYPE)  # the HF-layout model, as trained
    gguf_params = convert_rope_layout(hf_params, config, "interleaved")  # as llama.cpp writes it to a GGUF file
    ids = np.random.default_rng(12).integers(1, config.tgt_vocab_size, size=(2, 16))  # (B, T)

    def logits_and_scores(config, params):
        model = b.impl.build_model(config, params)
        logits = b.call(model, ids).logits  # (B, T, vocab)
        scores = b.impl.trace_model(model, b.asarray(ids))["decoder.layers.0.self_attn.scores"]  # (B, H, T, T)
        return logits, scores

    reference, reference_scores = logits_and_scores(config, hf_params)
    wrong, wrong_scores = logits_and_scores(*reversed(wrong_read_gguf_q_k(gguf_params, config)))
    ours, _ = logits_and_scores(*reversed(ours_read_gguf_q_k(gguf_params, config)))
    as_file, _ = logits_and_scores(config.replace(rope_layout="interleaved"), gguf_params)  # the file's own layout
    diagonal = np.eye(ids.shape[1], dtype=bool)  # (T_q, T_k): a query and its own key, relative distance 0
    score_difference = np.abs(wrong_scores - reference_scores)  # (B, H, T, T)
    numbers = {
        "d_k": config.d_k,
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "seq_len": ids.shape[1],
        "max_abs_logit": float(np.abs(reference).max()),
        "wrong_max_abs_logit_difference": float(np.abs(wrong - reference).max()),
        "wrong_first_position_difference": float(np.abs(wrong - reference)[:, 0].max()),
        "wrong_same_next_token": float((wrong.argmax(-1) == reference.argmax(-1)).mean()),
        "wrong_layer0_scores_diagonal_difference": float(score_difference[..., diagonal].max()),
        "wrong_layer0_scores_off_diagonal_difference": float(score_difference[..., ~diagonal].max()),
        "ours_max_abs_logit_difference": float(np.abs(ours - reference).max()),
        "file_layout_max_abs_logit_difference": float(np.abs(as_file - reference).max()),
    }
    return Demonstration(
        pitfall="rope-layout-mix-up",
        backend=backend,
        wrong_code=source(wrong_read_gguf_q_k),
        ours_code=source(ours_read_gguf_q_k),
        wrong=(
            f"logits off by up to {_g(numbers['wrong_max_abs_logit_difference'])} (largest logit "
            f"{_g(numbers['max_abs_logit'])}), the same next token at {numbers['wrong_same_next_token']:.0%} of the "
            f"positions; position 0 off by {_g(numbers['wrong_first_position_difference'])}, layer 0's scores "
            f"equal on the diagonal ({_g(numbers['wrong_layer0_scores_diagonal_difference'])}), off it by up to "
            f"{_g(numbers['wrong_layer0_scores_off_diagonal_difference'])}"
        ),
        ours=(
            f"permuted back, the weights are the HF model's: logits off by "
            f"{_g(numbers['ours_max_abs_logit_difference'])}; "
            f"the file's weights run in the interleaved layout: off by "
            f"{_g(numbers['file_layout_max_abs_logit_difference'])}"
        ),
        numbers=numbers,
    )
