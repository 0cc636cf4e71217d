"""Contracts only JAX can break: jit vs eager, float64 without x64, values hidden by tracing."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from transformer_spec import Config, init_params

from .. import LIGHT_XLA_FLAGS, tolerances
from ..cases import DTYPES, VARIANTS, as_kind, flatten_output, model_inputs
from ..helpers import training_batch
from ..tolerances import assert_close, assert_loss_and_gradients_match

jax = pytest.importorskip("jax", reason="the [jax] extra is not installed")
jax_impl = pytest.importorskip("jax_impl")
jnp = jax.numpy


@pytest.fixture(autouse=True)
def _only_when_jax_is_selected(request):
    selected = request.config.getoption("--backend")
    if selected and "jax" not in selected:
        pytest.skip("JAX not selected with --backend")
    tolerances.current_backend["name"] = "jax"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["encoder_decoder", "decoder_only", "encoder_only"])
def test_jit_compiled_forward_equals_eager_forward(kind, dtype):
    config = as_kind(VARIANTS["pre-gelu-learned"], kind)
    model = jax_impl.build_model(config, init_params(config, seed=4, dtype=dtype, nonzero_biases=True))
    inputs = [jnp.asarray(x) for x in model_inputs(config, (3, 11, 7, True))]
    jitted = flatten_output(jax_impl.compiled(model)(*inputs, return_attentions=True, return_hidden_states=True))
    eager = flatten_output(model(*inputs, return_attentions=True, return_hidden_states=True))
    assert jitted.keys() == eager.keys()
    for name in eager:
        assert_close(np.asarray(jitted[name]), np.asarray(eager[name]), dtype, f"jit vs eager {name}")


@pytest.mark.parametrize("flag", ["return_attentions", "return_hidden_states"])
def test_jit_compiled_forward_returns_what_its_one_output_flag_asks_for(flag):
    """Asked for the attention weights or the hidden states alone, ``compiled(model)`` returns that
    field (one entry per layer; the hidden states also the embeddings) and the other one empty, as
    the eager model does: ``compiled`` passes each flag on by its name (the test above asks for both
    at once, which jax-compiled-swaps-the-output-flags passed)."""
    config = as_kind(VARIANTS["pre-gelu-learned"], "decoder_only")
    model = jax_impl.build_model(config, init_params(config, seed=4, dtype="float64"))
    (ids,) = model_inputs(config, (2, 5, 5, True))
    output = jax_impl.compiled(model)(jnp.asarray(ids), **{flag: True})
    asked = flag.removeprefix("return_")
    other = "hidden_states" if asked == "attentions" else "attentions"
    assert len(getattr(output, asked)) == config.num_decoder_layers + (asked == "hidden_states"), asked
    assert getattr(output, other) == (), other


def test_the_cached_step_fills_its_buffer_to_the_last_slot_and_refuses_the_one_past_it():
    """JAX's cache is a buffer of fixed size (the prompt and ``max_new`` steps, rounded up to
    CACHE_BLOCK; NumPy and torch grow theirs); ``dynamic_update_slice`` would clamp a write past
    its end onto the last slot, silently. The step at the last slot runs; the one past it is
    refused, naming the remedy."""
    from jax_impl.generate import CACHE_BLOCK, make_stepper

    config = Config.preset("tiny-lm", max_len=CACHE_BLOCK + 8)  # room past the buffer in the table
    model = jax_impl.build_model(config, init_params(config, seed=3))
    prompt = np.array([[3, 4, 5]])
    stepper = make_stepper(model)
    state = stepper.start(prompt, max_new=2)  # a buffer of CACHE_BLOCK positions
    last = CACHE_BLOCK - 1 - prompt.shape[1]  # the step whose token sits in the buffer's last slot
    logits, state = stepper.step(state, np.array([6]), last)
    assert np.isfinite(logits).all() and logits.shape == (1, config.tgt_vocab_size)
    with pytest.raises(ValueError, match=f"position {CACHE_BLOCK} is past the cache's {CACHE_BLOCK} positions"):
        stepper.step(state, np.array([7]), last + 1)


def test_float64_without_x64_is_refused_not_silently_truncated():
    code = (
        "import jax; jax.config.update('jax_enable_x64', False)\n"
        "import jax_impl; from transformer_spec import Config, init_params\n"
        "c = Config.preset('tiny')\n"
        "try:\n"
        "    jax_impl.build_model(c, init_params(c, dtype='float64'))\n"
        "except TypeError as e:\n"
        "    print('refused:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "refused:" in out and "jax_enable_x64" in out


def test_an_out_of_range_id_inside_a_user_jit_gives_nan_not_a_clamped_row():
    """Our models check ids eagerly; under a trace the values are unknown, and JAX would clamp
    id 60 to the last row. Our lookup fills NaN instead, so the mistake cannot pass unseen."""
    config = VARIANTS["post-relu-sinusoidal"]
    embeddings = jax_impl.from_params(jax_impl.Embeddings, config, init_params(config, component="embeddings"))
    out = jax.jit(lambda ids: embeddings(ids))(jnp.array([[1, 60, -1]]))
    assert np.all(np.isfinite(out[0, 0])) and np.all(np.isnan(out[0, 1])) and np.all(np.isnan(out[0, 2]))
    with pytest.raises(ValueError, match=r"contains \[-1, 60\]"):
        embeddings(jnp.array([[1, 60, -1]]))  # eagerly, the same call raises


# The models the code generator test computes: the paper's encoder-decoder and the modern decoder.
CODEGEN_MODELS = {"paper": VARIANTS["pre-gelu-learned"], "llama": Config.preset("tiny-llama")}


def codegen_results() -> dict[str, np.ndarray]:
    """Every CODEGEN_MODELS model's jit-compiled logits (float64 and float32) and float64 loss and
    gradients, and one eager attention: what this process's XLA code generator computes."""
    results = {}
    for name, config in CODEGEN_MODELS.items():
        for dtype in DTYPES:
            model = jax_impl.build_model(config, init_params(config, seed=3, dtype=dtype, nonzero_biases=True))
            inputs = [jnp.asarray(x) for x in model_inputs(config, (3, 11, 7, True))]
            results[f"{name}/{dtype}/logits"] = np.asarray(jax_impl.compiled(model)(*inputs).logits)
        model = jax_impl.build_model(config, init_params(config, seed=3, dtype="float64", nonzero_biases=True))
        loss, grads = jax_impl.loss_and_grads(model, training_batch(config))
        results[f"{name}/float64/loss"] = np.asarray(loss)
        results.update({f"{name}/float64/grad/{key}": np.asarray(g) for key, g in grads.items()})
    return results


def test_the_default_code_generator_computes_what_the_suites_computes(tmp_path):
    """The suite compiles with XLA's light code generation (conftest.py's LIGHT_XLA_FLAGS: the test
    run's time is mostly compiling); users run XLA's defaults. A child process with the default flags
    computes the same models' logits, loss and gradients, held to this process's within the suite's
    tolerances: the suite's numbers are the numbers users get."""
    out = tmp_path / "default.npz"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if f not in LIGHT_XLA_FLAGS]
    env = dict(os.environ, XLA_FLAGS=" ".join(flags))
    root = pathlib.Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "shared_tests.models.test_jax_specifics", str(out)], cwd=root, env=env,
                   check=True, capture_output=True, text=True, timeout=600)  # fmt: skip
    default, here = dict(np.load(out)), codegen_results()
    assert default.keys() == here.keys()
    for name in CODEGEN_MODELS:
        for dtype in DTYPES:
            key = f"{name}/{dtype}/logits"
            assert_close(here[key], default[key], dtype, f"light vs default XLA {key}")
        grads = [{k.split("/grad/")[1]: v for k, v in r.items() if k.startswith(f"{name}/float64/grad/")}
                 for r in (here, default)]  # fmt: skip
        assert_loss_and_gradients_match((float(here[f"{name}/float64/loss"]), grads[0]),
                                        (float(default[f"{name}/float64/loss"]), grads[1]),
                                        f"light vs default XLA {name}")  # fmt: skip


if __name__ == "__main__":  # the default code generator's child (the test above)
    jax.config.update("jax_enable_x64", True)
    np.savez(sys.argv[1], **codegen_results())
