"""Contracts only JAX can break: jit vs eager, float64 without x64, values hidden by tracing."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from transformer_spec import init_params

from .. import tolerances
from ..cases import DTYPES, VARIANTS, as_kind, flatten_output, model_inputs
from ..tolerances import assert_close

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
