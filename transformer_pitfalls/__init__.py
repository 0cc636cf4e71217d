"""Pitfalls, demonstrated: one runnable demonstration per classic Transformer mistake.

Each registered pitfall runs the wrong code (as the tutorials write it) next to the
project's own code, on the same small seeded input, in every backend where the mistake
can happen, and reports both results::

    import transformer_pitfalls as pitfalls
    pitfalls.get("neg-inf-mask-nan").run("torch").wrong   # "NaN at 2 of 10 positions ..."
    pitfalls.run_all(["numpy"])                           # plain data for the docs page

``transformer-ref pitfalls`` prints them; ``shared_tests/repository/test_pitfalls.py`` holds each
wrong result to being wrong in the stated way, and ours to being right. Each pitfall is a module
of its own (named after it, ``neg_inf_mask_nan``); importing it registers it, and the order of the
imports below is the order of every listing.
"""

# Importing a pitfall's module registers it: this order is the order of every listing.
# isort: off
from . import (
    scale_by_d_model,
    one_linear_for_all_heads,
    layer_norm_unbiased_std,
    shared_layer_stack,
    dropout_default_half,
    neg_inf_mask_nan,
    sinusoidal_odd_d_model,
    decoder_mask_shapes,
    jax_clamped_token_ids,
    float64_without_x64,
    rope_layout_mix_up,
    gqa_repeat_order,
)
# isort: on
from .registry import BACKENDS, REGISTRY, Demonstration, Pitfall, get, register, render_html, run_all

__all__ = [
    "BACKENDS",
    "REGISTRY",
    "Demonstration",
    "Pitfall",
    "get",
    "register",
    "render_html",
    "run_all",
    "scale_by_d_model",
    "one_linear_for_all_heads",
    "layer_norm_unbiased_std",
    "shared_layer_stack",
    "dropout_default_half",
    "neg_inf_mask_nan",
    "sinusoidal_odd_d_model",
    "decoder_mask_shapes",
    "jax_clamped_token_ids",
    "float64_without_x64",
    "rope_layout_mix_up",
    "gqa_repeat_order",
]
