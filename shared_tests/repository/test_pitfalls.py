"""Pitfalls, demonstrated: each classic mistake is wrong in the way its page says, and ours is right.

One test per pitfall, run in every backend where the mistake can happen (and that
--backend selected; a framework that is not installed is skipped). Each test checks the
wrong code's result against the stated failure (a NaN count, a factor, an exception, a
shared object) and ours against an independent reference written here in NumPy
float64, or against the project's own error. The demonstrations come from
``transformer_pitfalls`` (one module per pitfall); the command ``transformer-ref pitfalls`` and the page data
``pitfalls.run_all`` are tested at the end.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest

import transformer_pitfalls as pitfalls
from transformer_backends import get_backend
from transformer_cli.main import main
from transformer_spec import Config, param_schema

from .. import tolerances
from ..tolerances import assert_close

TINY = Config.preset("tiny")  # what the demonstrations use
TESTED: set[str] = set()  # filled by ``over`` at import: every registered pitfall must be in it
_RUNS: dict[tuple[str, str], pitfalls.Demonstration] = {}


def over(name: str):
    """Parametrize a test over the backends where pitfall ``name`` can happen."""
    TESTED.add(name)
    return pytest.mark.parametrize("framework", pitfalls.get(name).backends)


def demonstrate(request, name: str, framework: str) -> pitfalls.Demonstration:
    selected = request.config.getoption("--backend")
    if selected and framework not in selected:
        pytest.skip(f"{framework} not selected with --backend")
    try:
        get_backend(framework)
    except ImportError as error:
        pytest.skip(f"backend {framework!r} is not installed ({error.name})")
    tolerances.current_backend["name"] = framework
    if (name, framework) not in _RUNS:
        _RUNS[(name, framework)] = pitfalls.get(name).run(framework)
    return _RUNS[(name, framework)]


def softmax(scores: np.ndarray) -> np.ndarray:
    exp = np.exp(scores - scores.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


# --------------------------------------------------------------------------- the pitfalls


@over("scale-by-d-model")
def test_scaling_by_sqrt_d_model_is_a_softmax_at_temperature_sqrt_heads(request, framework):
    demo = demonstrate(request, "scale-by-d-model", framework)
    a, n = demo.arrays, demo.numbers
    reference = softmax(a["q"] @ np.swapaxes(a["k"], -1, -2) / math.sqrt(n["d_k"]))  # the paper's weights
    assert_close(a["ours_weights"], reference, "float64", "ours: softmax(q k^T / sqrt(d_k))")
    # The wrong weights are ours with every score divided by sqrt(h) once more (log w = s - const per row).
    flatter = softmax(np.log(a["ours_weights"]) / math.sqrt(n["num_heads"]))
    assert_close(a["wrong_weights"], flatter, "float64", "wrong: ours at temperature sqrt(num_heads)")
    assert n["max_abs_weight_difference"] > 0.05
    assert n["wrong_score_std"] / n["ours_score_std"] == pytest.approx(1 / math.sqrt(n["num_heads"]), rel=1e-9)
    assert n["wrong_mean_max_weight"] < n["ours_mean_max_weight"]  # flatter attention


@over("one-linear-for-all-heads")
def test_one_small_linear_for_all_heads_is_block_diagonal_tied_attention(request, framework):
    n = demonstrate(request, "one-linear-for-all-heads", framework).numbers
    assert n["wrong_projection_parameters"] == 3 * TINY.d_k**2
    assert n["ours_projection_parameters"] == 3 * TINY.d_model**2
    assert n["wrong_head0_change_from_other_features"] == 0.0  # head 0 never reads features d_k..
    assert n["ours_head0_change_from_other_features"] > 1e-3
    assert n["wrong_vs_ours_block_diagonal"] <= tolerances.TOLERANCE["float64"] * 10
    assert n["max_abs_output_difference"] > 0.1


@over("layer-norm-unbiased-std")
def test_layer_norm_with_std_plus_eps_differs_and_torch_std_is_unbiased(request, framework):
    demo = demonstrate(request, "layer-norm-unbiased-std", framework)
    x, n = demo.arrays["x"], demo.numbers
    eps, d = n["eps"], n["d_model"]
    centered = x - x.mean(-1, keepdims=True)
    reference = centered / np.sqrt((centered**2).mean(-1, keepdims=True) + eps)  # biased variance, eps inside
    assert_close(demo.arrays["ours"], reference, "float64", "ours: LayerNorm")
    ddof = 1 if framework == "torch" else 0  # the same x.std() line: unbiased in torch only
    stated = centered / (centered.std(-1, ddof=ddof, keepdims=True) + eps)
    assert_close(demo.arrays["wrong"], stated, "float64", "wrong: (x - mean) / (std + eps)")
    assert n["wrong_std_divides_by"] == d - ddof
    assert n["ours_std_typical"] == pytest.approx(1.0, abs=1e-5)
    # eps on the std: a row that barely varies comes out about 3x too spread
    assert n["wrong_std_near_constant"] > 2.5 * n["ours_std_near_constant"]
    assert n["max_abs_difference_near_constant"] > 0.5


@over("shared-layer-stack")
def test_a_stack_of_one_layer_object_has_one_layers_parameters(request, framework):
    n = demonstrate(request, "shared-layer-stack", framework).numbers
    config = TINY.replace(num_encoder_layers=n["num_layers"])
    schema = param_schema(config, "encoder")
    one_layer = sum(math.prod(s) for k, s in schema.items() if not k.startswith("layers.") or k.startswith("layers.0."))
    assert n["wrong_distinct_layers"] == 1 and n["ours_distinct_layers"] == n["num_layers"] == 3
    assert n["ours_parameters"] == n["schema_parameters"] == sum(math.prod(s) for s in schema.values())
    assert n["wrong_parameters"] == one_layer < n["ours_parameters"]
    assert n["max_abs_output_difference"] > 0.1


@over("dropout-default-half")
def test_default_dropout_zeroes_half_and_changes_every_call(request, framework):
    n = demonstrate(request, "dropout-default-half", framework).numbers
    assert n["default_p"] == 0.5 and n["paper_p"] == 0.1
    assert 0.4 < n["wrong_zero_fraction"] < 0.6
    assert n["wrong_kept_scale"] == pytest.approx(2.0, rel=1e-12)  # survivors divided by 1 - p
    assert n["wrong_repeat_max_difference"] > 0.1
    assert n["ours_zero_fraction"] == 0.0 and n["ours_repeat_max_difference"] == 0.0
    assert 0.03 < n["ours_training_zero_fraction"] < 0.2  # 10% of 2 x 7 x 36 features


@over("neg-inf-mask-nan")
def test_neg_inf_fill_makes_padded_rows_nan_and_the_nan_spreads(request, framework):
    n = demonstrate(request, "neg-inf-mask-nan", framework).numbers
    assert n["wrong_nan_rows_layer_1"] == n["padded_positions"] == 2
    assert n["wrong_nan_rows_layer_2"] == 5  # every position of the padded sentence, real tokens too
    assert n["ours_nan_rows_layer_1"] == n["ours_nan_rows_layer_2"] == 0
    assert n["ours_padded_rows_max_abs"] == 0.0
    assert n["real_rows_max_difference_layer_1"] <= 1e-12  # the fill changes nothing else


@over("sinusoidal-odd-d-model")
def test_classic_sinusoidal_code_fails_for_odd_d_model_and_ours_does_not(request, framework):
    demo = demonstrate(request, "sinusoidal-odd-d-model", framework)
    n = demo.numbers
    assert n["wrong_error_type"] in ("ValueError", "RuntimeError") and n["wrong_error"]
    assert n["even_max_difference"] <= 1e-6  # the classic code is right for an even size (torch: float32)
    max_len, d = demo.arrays["max_len"], 7
    reference = np.empty((max_len, d))
    for pos in range(max_len):
        for col in range(d):
            angle = pos / 10000 ** ((col - col % 2) / d)  # columns 2i and 2i + 1 share frequency i
            reference[pos, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    assert n["ours_odd_shape"] == (max_len, d) and n["ours_odd_finite"]
    assert_close(demo.arrays["ours_odd"], reference, "float64", "ours: sinusoidal_table(6, 7)")


@over("decoder-mask-shapes")
def test_tutorial_decoder_masks_block_padded_queries_and_mix_batch_with_heads(request, framework):
    n = demonstrate(request, "decoder-mask-shapes", framework).numbers
    assert n["wrong_self_mask_shape"] == n["ours_self_mask_shape"] == (3, 1, 5, 5)
    assert n["wrong_fully_blocked_rows"] == 2 and n["ours_fully_blocked_rows"] == 0
    assert n["wrong_max_weight_on_future"] == pytest.approx(1 / 5)  # uniform over all 5 positions
    assert n["ours_max_weight_on_future"] == 0.0
    assert n["self_real_rows_max_difference"] <= 1e-12  # only the padded queries differ
    assert n["wrong_cross_mask_shape"] == (3, 1, 7) and n["ours_cross_mask_shape"] == (3, 1, 1, 7)
    assert n["wrong_cross_error_type_batch_2"] in ("ValueError", "RuntimeError", "TypeError")
    assert n["wrong_cross_max_weight_on_own_padding"] > 0.1  # batch == heads: no error, wrong padding
    assert n["ours_cross_max_weight_on_own_padding"] == 0.0
    assert n["ours_error_type_for_3d_mask"] == "ValueError" and "with 4 dims" in n["ours_error_for_3d_mask"]


@over("jax-clamped-token-ids")
def test_out_of_range_ids_read_a_real_row_but_ours_raise(request, framework):
    n = demonstrate(request, "jax-clamped-token-ids", framework).numbers
    last = n["vocab_size"] - 1
    if framework == "jax":
        assert n["wrong_silent_ids"] == [3, n["vocab_size"], -1]
        assert n["wrong_rows_read"] == [3, last, last]  # clamped past the end, wrapped below 0
        assert n["ours_jit_nan_rows"] == [False, True, True]  # under a trace: NaN, not a clamped row
    else:
        assert n["wrong_error_type"] == "IndexError"  # NumPy does raise past the end
        assert n["wrong_silent_ids"] == [3, -1] and n["wrong_rows_read"] == [3, last]  # but wraps -1
    assert n["ours_error_type"] == "ValueError"
    assert f"[0, {n['vocab_size']})" in n["ours_error"] and f"[-1, {n['vocab_size']}]" in n["ours_error"]


@over("float64-without-x64")
def test_float64_without_x64_is_float32_and_ours_refuses(request, framework):
    n = demonstrate(request, "float64-without-x64", framework).numbers
    assert n["x64"] is False
    assert n["wrong_implicit_dtype"] == n["wrong_explicit_dtype"] == "float32"
    assert "float64" in n["wrong_warning"]
    assert n["wrong_minus_one"] == 0.0 and n["input_minus_one"] == 1e-12  # float32 cannot hold 1 + 1e-12
    assert n["wrong_third_error"] > 1e-9
    assert n["ours_error_type"] == "TypeError" and "jax_enable_x64" in n["ours_error"]


@over("rope-layout-mix-up")
def test_gguf_q_k_read_in_the_halves_layout_are_wrong_after_the_first_position(request, framework):
    n = demonstrate(request, "rope-layout-mix-up", framework).numbers
    assert n["wrong_max_abs_logit_difference"] > 0.3 * n["max_abs_logit"]  # not a rounding difference
    assert n["wrong_same_next_token"] < 0.8
    assert n["wrong_first_position_difference"] <= 1e-12  # position 0 is not rotated: a one-token test passes
    assert n["wrong_layer0_scores_diagonal_difference"] <= 1e-12  # relative distance 0 is not rotated either
    assert n["wrong_layer0_scores_off_diagonal_difference"] > 0.1
    assert n["ours_max_abs_logit_difference"] == 0.0  # the permutation undone: the same weights, exactly
    assert n["file_layout_max_abs_logit_difference"] <= tolerances.TOLERANCE["float64"] * 10  # another computation


@over("gqa-repeat-order")
def test_tiled_kv_heads_pair_query_heads_with_another_groups_keys(request, framework):
    demo = demonstrate(request, "gqa-repeat-order", framework)
    n, a = demo.numbers, demo.arrays
    heads, kv_heads = n["num_heads"], n["gqa_kv_heads"]
    groups = heads // kv_heads
    assert (heads, kv_heads) == (9, 3)

    def attention_reading(kv_head_of):  # per query head h, attention over kv head kv_head_of(h)
        kv = [kv_head_of(h) for h in range(heads)]
        k, v = a["k"][:, kv], a["v"][:, kv]  # (B, H, T, d_k)
        return softmax(a["q"] @ np.swapaxes(k, -1, -2) / math.sqrt(a["q"].shape[-1])) @ v

    assert_close(a["ours"], attention_reading(lambda h: h // groups), "float64", "ours: head h reads h // groups")
    assert_close(a["wrong"], attention_reading(lambda h: h % kv_heads), "float64", "wrong: head h reads h % H_kv")
    assert n["ours_kv_head_read"] == [h // groups for h in range(heads)]  # 0, 0, 0, 1, 1, 1, 2, 2, 2
    assert n["wrong_kv_head_read"] == [h % kv_heads for h in range(heads)]  # 0, 1, 2, 0, 1, 2, ...
    assert n["heads_right_by_chance"] == sum(h // groups == h % kv_heads for h in range(heads)) == 3
    assert n["gqa_max_abs_difference"] > 0.1
    assert n["mha_kv_heads"] == heads and n["mha_max_abs_difference"] == 0.0  # multi-head: nothing to repeat
    assert n["mqa_kv_heads"] == 1 and n["mqa_max_abs_difference"] == 0.0  # multi-query: one head, any order


# ---------------------------------------------------------- the registry, the page, the command


def test_every_registered_pitfall_has_a_test():
    assert TESTED == set(pitfalls.REGISTRY)


def test_each_pitfall_says_why_and_where():
    for pitfall in pitfalls.REGISTRY.values():
        sentences = len(re.findall(r"[.!?](?:\s|$)", pitfall.explanation))
        assert 2 <= sentences <= 5, f"{pitfall.name}: {sentences} sentences"
        assert pitfall.backends and set(pitfall.backends) <= set(pitfalls.BACKENDS)
    with pytest.raises(ValueError, match="cannot happen in 'numpy'"):
        pitfalls.get("dropout-default-half").run("numpy")


def test_run_all_gives_plain_data_for_the_page():
    pages = pitfalls.run_all(["numpy"])
    assert [p["name"] for p in pages] == list(pitfalls.REGISTRY)
    json.dumps(pages)  # plain data: strings, numbers, lists, dicts
    for page in pages:
        assert page["title"] and page["explanation"] and page["skipped"] == []
        assert len(page["results"]) == (1 if "numpy" in page["backends"] else 0)
        for result in page["results"]:
            assert result["wrong_code"].startswith("def wrong_") and result["ours_code"].startswith("def ours_")
            assert result["wrong"] and result["ours"] and result["numbers"]
    html = pitfalls.render_html(pages)
    assert html.count('<section class="pitfall"') == len(pages)
    assert "ops.where(mask == 0, -math.inf, scores)" in html  # the wrong code as it ran, escaped
    assert "positions[None, :] &gt; positions[:, None]" in html  # escaped, not markup


def test_import_pitfalls_needs_only_numpy_and_skips_missing_frameworks():
    code = (
        "import sys\n"
        "for name in ('torch', 'jax', 'flax'): sys.modules[name] = None\n"  # as if not installed
        "import json\nimport transformer_pitfalls as pitfalls\n"
        "pages = pitfalls.run_all(['numpy', 'torch'], ['neg-inf-mask-nan', 'dropout-default-half'])\n"
        "print(json.dumps(pages))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    nan_page, dropout_page = json.loads(out)
    assert [r["backend"] for r in nan_page["results"]] == ["numpy"]
    assert nan_page["skipped"] == [{"backend": "torch", "reason": "torch is not installed"}]
    assert dropout_page["results"] == [] and dropout_page["skipped"][0]["backend"] == "torch"


def test_command_prints_the_wrong_result_next_to_ours(capsys):
    assert main(["pitfalls", "--backend", "numpy", "neg-inf-mask-nan", "float64-without-x64", "--code"]) == 0
    out = capsys.readouterr().out
    assert "== neg-inf-mask-nan" in out and "numpy  wrong: NaN at 2 of 10 positions" in out
    assert "ours:  NaN at 0 and 0" in out
    assert "def wrong_attention_neg_inf_fill" in out
    assert "(not run: it cannot happen in numpy)" in out  # float64-without-x64 is JAX only


def test_command_lists_the_pitfalls_and_refuses_unknown_names(capsys):
    assert main(["pitfalls", "--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in pitfalls.REGISTRY)
    with pytest.raises(SystemExit, match="unknown pitfall"):
        main(["pitfalls", "no-such-mistake"])
