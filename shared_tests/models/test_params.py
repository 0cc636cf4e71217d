"""Weights: the schema is the single source of names and shapes; round trips are exact."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors import safe_open

from transformer_spec import Config, WeightsError, init_params, load_params, param_schema, save_params

from ..cases import DTYPES, SHARED, VARIANTS, as_kind, model_inputs
from ..tolerances import assert_close

KIND_CONFIGS = [
    pytest.param(as_kind(VARIANTS[v], kind), id=f"{kind}-{v}")
    for kind in ("encoder_decoder", "decoder_only", "encoder_only")
    for v in ("post-relu-sinusoidal", "pre-relu-none-tied-nofinal", "post-gelu_tanh-nobias")
] + [pytest.param(Config.preset("tiny-bert"), id="tiny-bert"), pytest.param(SHARED, id="encoder_decoder-shared")]



@pytest.mark.parametrize("dtype", DTYPES)
def test_a_model_built_without_weights_holds_the_shared_seeded_initialisation(backend, dtype):
    """build_model(config) in any backend holds init_params(config, seed=0): the same numbers everywhere."""
    config = Config.preset("tiny-lm")
    exported = backend.impl.to_params(backend.impl.build_model(config, dtype=dtype))
    for name, value in init_params(config, seed=0, dtype=dtype).items():
        assert exported[name].dtype == value.dtype, name
        assert np.array_equal(exported[name], value), f"{name}: not the seeded initialisation"

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("config", KIND_CONFIGS)
def test_from_params_then_to_params_is_exact(backend, config, dtype):
    params = init_params(config, seed=2, dtype=dtype, nonzero_biases=True)
    exported = backend.impl.to_params(backend.impl.build_model(config, params))
    assert list(exported) == list(param_schema(config))
    for name, value in params.items():
        assert exported[name].dtype == value.dtype, name
        assert np.array_equal(exported[name], value), f"{name} changed in the round trip"


@pytest.mark.parametrize("config", KIND_CONFIGS)
def test_the_schema_counts_every_trainable_parameter_of_the_backend(backend, config):
    """A parameter the backend has but the schema lacks would never be loaded (left at its init)."""
    model = backend.impl.build_model(config, init_params(config))
    counted = sum(int(np.prod(s)) for s in param_schema(config).values())
    assert count_parameters(backend, model) == counted


def count_parameters(backend, model) -> int:
    if backend.name == "torch":
        return sum(p.numel() for p in model.parameters())
    if backend.name == "jax":
        from flax import nnx

        return sum(int(np.prod(v.shape)) for v in __import__("jax").tree.leaves(nnx.state(model, nnx.Param)))
    return sum(v.size for v in backend.impl.to_params(model).values())


def test_tied_output_uses_the_target_embedding_table(backend):
    config = as_kind(VARIANTS["pre-relu-none-tied-nofinal"], "decoder_only")
    assert "generator.proj.weight" not in param_schema(config)
    params = init_params(config, seed=1, dtype="float64")
    model = backend.impl.build_model(config, params)
    (ids,) = model_inputs(config, (2, 5, 5, False))
    out = backend.call(model, ids, return_hidden_states=True)
    assert_close(out.logits, out.last_hidden_state @ params["tgt_embed.token.weight"].T, "float64", "tied logits")


def test_shared_embeddings_read_one_table_on_both_sides_and_in_the_output(backend, tmp_path):
    """share_embeddings with tie_output: the schema, the seeded initialisation and the file hold
    the table once (tgt_embed.token.weight); the source side and the output projection read it,
    so changing that one array changes the encoder's input and the logits."""
    assert "src_embed.token.weight" not in param_schema(SHARED)
    assert "generator.proj.weight" not in param_schema(SHARED)
    params = init_params(SHARED, seed=1, dtype="float64", nonzero_biases=True)
    assert "src_embed.token.weight" not in params
    save_params(tmp_path / "shared.safetensors", params, SHARED)
    with safe_open(tmp_path / "shared.safetensors", framework="numpy") as f:
        assert sorted(f.keys()) == sorted(param_schema(SHARED))  # stored once
    model = backend.impl.load_model(str(tmp_path / "shared.safetensors"))
    src, tgt = model_inputs(SHARED, (2, 6, 5, False))
    out = backend.call(model, src, tgt, return_hidden_states=True)
    table = params["tgt_embed.token.weight"]
    assert_close(out.logits, out.last_hidden_state @ table.T, "float64", "logits read the shared table")
    # the same model with a source table of its own, a copy of the shared one: the same outputs
    own = backend.impl.build_model(SHARED.replace(share_embeddings=False), dict(params, **{"src_embed.token.weight": table}))
    copied = backend.call(own, src, tgt)
    assert_close(out.encoder_last_hidden_state, copied.encoder_last_hidden_state, "float64", "encoder output")
    assert_close(out.logits, copied.logits, "float64", "logits")
    changed = dict(params, **{"tgt_embed.token.weight": table + 0.5})
    moved = backend.call(backend.impl.build_model(SHARED, changed), src, tgt).encoder_last_hidden_state
    assert not np.allclose(moved, out.encoder_last_hidden_state), "the encoder must read the shared table"
    two_tables = dict(params, **{"src_embed.token.weight": table})
    with pytest.raises(WeightsError, match=r"unexpected keys \['src_embed.token.weight'\] \(share_embeddings=True: "
                       r"the source reads the target's table, tgt_embed.token.weight"):  # fmt: skip
        backend.impl.build_model(SHARED, two_tables)
    with pytest.raises(ValueError, match="no table of its own: its model shares the target's"):
        backend.call(model.src_embed, src)  # called alone, the source side has no table to read


def test_weights_saved_from_one_backend_load_into_another_with_the_same_outputs(backend, reference, tmp_path):
    config = VARIANTS["pre-gelu-learned"]
    path = tmp_path / "model.safetensors"
    save_params(
        path, backend.impl.to_params(backend.impl.build_model(config, init_params(config, dtype="float64"))), config
    )
    params, stored = load_params(path)
    assert stored == config
    inputs = model_inputs(config, (3, 11, 7, True))
    got = backend.call(backend.impl.load_model(str(path)), *inputs).logits
    want = reference.call(reference.impl.load_model(str(path)), *inputs).logits
    assert_close(got, want, "float64", "logits after a save/load")


def test_explicit_dtype_casts_the_weights(backend):
    config = VARIANTS["post-relu-sinusoidal"]
    model = backend.impl.build_model(config, init_params(config, dtype="float64"), dtype="float32")
    assert {v.dtype for v in backend.impl.to_params(model).values()} == {np.dtype("float32")}
