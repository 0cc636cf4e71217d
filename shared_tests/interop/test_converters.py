"""Every converter (torch's nn.Transformer state_dicts, Hugging Face BERT, Llama, GPT-2, Marian)
checks every key and shape in both directions: a layer more than the config, a key missing, a
key of another shape, a packed tensor with rows to spare are each refused with an error naming
the key, never silently dropped or truncated. (No framework needed: the state dicts are made by
the converters' own export, then spoiled; test_oracle_*.py holds the conversions to the real
libraries.)"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable

import numpy as np
import pytest

from transformer_convert.hf_bert import bert_config, from_hf_bert, to_hf_bert
from transformer_convert.hf_gpt2 import gpt2_config, params_from_gpt2, params_to_gpt2
from transformer_convert.hf_llama import llama_config, params_from_llama, params_to_llama
from transformer_convert.hf_marian import marian_config, params_from_marian, params_to_marian
from transformer_convert.torch_transformer import from_torch_transformer, to_torch_transformer, torch_transformer_config
from transformer_spec import Config, WeightsError, init_params


@dataclasses.dataclass(frozen=True)
class Converter:
    config: Config
    from_theirs: Callable  # (state, config) -> params
    to_theirs: Callable  # (params, config) -> state
    their_layer: str  # the second layer's key prefix in their names ("...layers.1.")
    packed: tuple[str, int] | None = None  # a packed q/k/v tensor and the axis of its stacked rows
    ours: Callable[[Config], dict] = lambda config: init_params(config, seed=1, nonzero_biases=True)


def _stacks(config: Config) -> dict:
    params = init_params(config, seed=1, nonzero_biases=True)
    return {k: v for k, v in params.items() if k.startswith(("encoder.", "decoder."))}


TORCH = torch_transformer_config(36, 3, 2, 2, 37, src_vocab_size=53, tgt_vocab_size=47)
CONVERTERS = {
    "nn.Transformer": Converter(
        TORCH, from_torch_transformer, to_torch_transformer, "encoder.layers.1.",
        ("decoder.layers.0.multihead_attn.in_proj_weight", 0), _stacks,
    ),
    "nn.TransformerEncoder": Converter(
        TORCH, functools.partial(from_torch_transformer, module="encoder"),
        functools.partial(to_torch_transformer, module="encoder"), "layers.1.",
        ("layers.1.self_attn.in_proj_bias", 0), lambda c: init_params(c, seed=1, component="encoder"),
    ),
    "nn.MultiheadAttention": Converter(
        TORCH, functools.partial(from_torch_transformer, module="attention"),
        functools.partial(to_torch_transformer, module="attention"), "",
        ("in_proj_weight", 0), lambda c: init_params(c, seed=1, component="attention"),
    ),
    "BertModel": Converter(
        bert_config(dict(hidden_size=36, num_attention_heads=3, intermediate_size=37, num_hidden_layers=2,
                         vocab_size=53, max_position_embeddings=64)),
        from_hf_bert, to_hf_bert, "encoder.layer.1.",
    ),
    "LlamaForCausalLM": Converter(
        llama_config(dict(vocab_size=61, hidden_size=54, intermediate_size=37, num_hidden_layers=2,
                          num_attention_heads=9, num_key_value_heads=3, pad_token_id=0)),
        params_from_llama, params_to_llama, "model.layers.1.",
    ),
    "GPT2LMHeadModel": Converter(
        gpt2_config(dict(vocab_size=53, n_positions=29, n_embd=36, n_layer=2, n_head=3, pad_token_id=0)),
        params_from_gpt2, params_to_gpt2, "transformer.h.1.", ("transformer.h.0.attn.c_attn.weight", 1),
    ),
    "MarianMTModel": Converter(
        marian_config(dict(vocab_size=59, d_model=36, encoder_layers=2, decoder_layers=2, encoder_attention_heads=3,
                           decoder_attention_heads=3, encoder_ffn_dim=37, decoder_ffn_dim=37,
                           max_position_embeddings=31, pad_token_id=0, decoder_start_token_id=0)),
        params_from_marian, params_to_marian, "model.decoder.layers.1.",
    ),
}  # fmt: skip
NAMES = list(CONVERTERS)


def exported(name: str) -> tuple[Converter, dict, dict]:
    """(the converter, our weights, their state dict made from them)."""
    converter = CONVERTERS[name]
    params = converter.ours(converter.config)
    if "src_embed.token.weight" in params and name == "MarianMTModel":  # a shared table, as two equal copies
        params["src_embed.token.weight"] = params["tgt_embed.token.weight"]
    return converter, params, converter.to_theirs(params, converter.config)


def next_layer(key: str, layer: str) -> str:
    """The same key one layer further: "...layers.1.x" -> "...layers.2.x"."""
    return key.replace(layer, re.sub(r"1\.$", "2.", layer), 1)


@pytest.mark.parametrize("name", NAMES)
def test_a_conversion_round_trips_exactly(name):
    converter, params, state = exported(name)
    back = converter.from_theirs(state, converter.config)
    assert sorted(back) == sorted(params)
    assert all(np.array_equal(back[k], params[k]) for k in params)
    again = converter.to_theirs(back, converter.config)
    assert sorted(again) == sorted(state) and all(np.array_equal(again[k], state[k]) for k in state)


@pytest.mark.parametrize("name", [n for n in NAMES if CONVERTERS[n].their_layer])
def test_a_layer_more_than_the_config_is_refused_naming_its_keys(name):
    converter, params, state = exported(name)
    layer = converter.their_layer
    extra = {next_layer(k, layer): v for k, v in state.items() if k.startswith(layer) or f".{layer}" in k}
    assert extra
    with pytest.raises(WeightsError, match=r"unexpected keys \[") as error:
        converter.from_theirs(state | extra, converter.config)
    named = next(iter(extra)).removeprefix("transformer.")
    assert named in str(error.value)
    ours_extra = {k.replace("layers.1.", "layers.2."): v for k, v in params.items() if "layers.1." in k}
    with pytest.raises(WeightsError, match=r"unexpected keys \[.*layers\.2\."):
        converter.to_theirs(params | ours_extra, converter.config)


@pytest.mark.parametrize("name", NAMES)
def test_a_missing_key_is_named_in_both_directions(name):
    converter, params, state = exported(name)
    victim = sorted(k for k in state if "norm" in k.lower() or "ln_" in k or "out_proj" in k)[-1]
    with pytest.raises(WeightsError, match=r"missing keys \[") as error:
        converter.from_theirs({k: v for k, v in state.items() if k != victim}, converter.config)
    assert victim.removeprefix("transformer.") in str(error.value)
    ours = sorted(params)[-1]
    with pytest.raises(WeightsError, match=rf"missing keys \['{re.escape(ours)}'\]"):
        converter.to_theirs({k: v for k, v in params.items() if k != ours}, converter.config)


@pytest.mark.parametrize("name", NAMES)
def test_a_key_of_another_shape_is_named_with_both_shapes_in_both_directions(name):
    converter, params, state = exported(name)
    victim = sorted(k for k in state if np.ndim(state[k]) == 2 and "embed" not in k and "wte" not in k)[0]
    wrong = np.concatenate([state[victim], state[victim][:1]])  # one row more
    with pytest.raises(WeightsError, match="wrong shapes") as error:
        converter.from_theirs(state | {victim: wrong}, converter.config)
    expected, got = tuple(np.shape(state[victim])), wrong.shape
    shapes = f"expected ({', '.join(map(str, expected))}), got ({', '.join(map(str, got))})"
    assert victim.removeprefix("transformer.") in str(error.value) and shapes in str(error.value)
    ours = next(k for k in sorted(params) if k.endswith("w_v.weight"))
    with pytest.raises(WeightsError, match=rf"wrong shapes \[{re.escape(ours)}: expected"):
        converter.to_theirs(params | {ours: params[ours][:, 1:]}, converter.config)


@pytest.mark.parametrize("name", [n for n in NAMES if CONVERTERS[n].packed])
@pytest.mark.parametrize("extra", [1, 3])
def test_a_packed_qkv_tensor_with_rows_to_spare_is_refused_not_truncated(name, extra):
    converter, _, state = exported(name)
    key, axis = converter.packed
    value = state[key]
    padding = [(0, 0)] * value.ndim
    padding[axis] = (0, extra)
    spoiled = np.pad(value, padding, constant_values=0.5)
    with pytest.raises(WeightsError, match="wrong shapes") as error:
        converter.from_theirs(state | {key: spoiled}, converter.config)
    assert key.removeprefix("transformer.") in str(error.value)
    assert f"got ({', '.join(map(str, spoiled.shape))})" in str(error.value)


def test_torch_converters_refuse_a_config_nn_transformer_cannot_hold():
    for changes, field in [({"norm": "rms_norm"}, "norm"), ({"gated_ffn": True}, "gated_ffn"),
                           ({"num_kv_heads": 1}, "num_kv_heads"), ({"attention_bias": False}, "attention_bias")]:  # fmt: skip
        config = TORCH.replace(**changes)
        with pytest.raises(ValueError, match=f"nn.Transformer has {field}="):
            to_torch_transformer(_stacks(config), config)
        with pytest.raises(ValueError, match=f"nn.Transformer has {field}="):
            from_torch_transformer({}, config)


def test_torch_export_of_a_whole_model_leaves_out_embeddings_but_refuses_strangers():
    params = init_params(TORCH, seed=1)
    state = to_torch_transformer(params, TORCH)
    assert not any(k.startswith(("src_embed", "tgt_embed", "generator")) for k in state)
    with pytest.raises(WeightsError, match=r"unexpected keys \['decoder.layers.0.extra'\]"):
        to_torch_transformer(params | {"decoder.layers.0.extra": np.zeros(3)}, TORCH)
    with pytest.raises(WeightsError, match=r"wrong shapes \[src_embed.token.weight: expected \(53, 36\)"):
        to_torch_transformer(params | {"src_embed.token.weight": np.zeros((52, 36))}, TORCH)


def test_marian_shared_table_is_one_parameter_and_two_separate_tables_load_into_it_only_when_equal():
    """A Marian checkpoint that shares its embeddings gives a config with share_embeddings: one
    table in our weights (no copy to drift apart while training). Separate encoder and decoder
    tables load into such a config only when equal; two that differ are refused, naming both,
    and load into a config with two tables. Our one table exports as both, and back again."""
    config = CONVERTERS["MarianMTModel"].config
    assert config.share_embeddings and config.tie_output
    params = init_params(config, seed=1, nonzero_biases=True)
    assert "src_embed.token.weight" not in params
    shared = params_to_marian(params, config)
    assert "model.shared.weight" in shared and "model.encoder.embed_tokens.weight" in shared  # state_dict()'s copy
    state = params_to_marian(params, config, shared_embeddings=False)  # two tables, written from the one
    encoder, decoder = "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"
    assert np.array_equal(state[encoder], state[decoder]) and "model.shared.weight" not in state
    back = params_from_marian(state, config, shared_embeddings=False)
    assert sorted(back) == sorted(params) and all(np.array_equal(back[k], params[k]) for k in params)
    drifted = state | {encoder: state[encoder] + 1.0}
    with pytest.raises(WeightsError, match=f"{encoder} differs from {decoder}, but the config shares one table"):
        params_from_marian(drifted, config, shared_embeddings=False)
    two = params_from_marian(drifted, config.replace(share_embeddings=False), shared_embeddings=False)
    assert np.array_equal(two["src_embed.token.weight"], drifted[encoder])


SOURCE, TARGET = "src_embed.token.weight", "tgt_embed.token.weight"
ENCODER, DECODER = "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"


@pytest.mark.parametrize("checkpoint_shares", [True, False], ids=["checkpoint-shared", "checkpoint-two-tables"])
@pytest.mark.parametrize("config_shares", [True, False], ids=["config-one-table", "config-two-tables"])
def test_marian_export_refuses_two_different_tables_only_into_a_shared_checkpoint(config_shares, checkpoint_shares):
    """Two flags say two things: the config's share_embeddings, whether our weights hold one token
    table or two; shared_embeddings, whether the checkpoint does (model.shared, or an encoder and a
    decoder table). An export writes the checkpoint's keys, its encoder table our source table and its
    decoder table our target table, and reads back to our weights; two tables of ours that differ are
    refused only where they would become one, in a shared checkpoint. Kills
    spec-marian-export-checks-the-configs-sharing."""
    config = CONVERTERS["MarianMTModel"].config.replace(share_embeddings=config_shares)
    params = init_params(config, seed=1, nonzero_biases=True)
    if not config_shares:
        assert not np.array_equal(params[SOURCE], params[TARGET])
    source = params[TARGET if config_shares else SOURCE]
    if checkpoint_shares and not config_shares:
        with pytest.raises(WeightsError, match=f"{SOURCE} differs from {TARGET}, but a Marian model with shared"):
            params_to_marian(params, config, shared_embeddings=checkpoint_shares)
        params[SOURCE] = source = params[TARGET].copy()  # equal copies export
    state = params_to_marian(params, config, shared_embeddings=checkpoint_shares)
    assert ("model.shared.weight" in state) == checkpoint_shares
    assert np.array_equal(state[ENCODER], source) and np.array_equal(state[DECODER], params[TARGET])
    back = params_from_marian(state, config, shared_embeddings=checkpoint_shares)
    assert sorted(back) == sorted(params) and all(np.array_equal(back[k], params[k]) for k in params)


@pytest.mark.parametrize("checkpoint_shares", [True, False], ids=["checkpoint-shared", "checkpoint-two-tables"])
@pytest.mark.parametrize("config_shares", [True, False], ids=["config-one-table", "config-two-tables"])
def test_marian_import_refuses_two_different_tables_only_into_a_config_with_one(config_shares, checkpoint_shares):
    """The other way: a checkpoint's encoder table becomes our source table and its decoder table
    our target table; a checkpoint with two tables that differ is refused only where they would
    become one, in a config with share_embeddings."""
    exporting = CONVERTERS["MarianMTModel"].config.replace(share_embeddings=False)
    params = init_params(exporting, seed=1, nonzero_biases=True)
    if checkpoint_shares:
        params[SOURCE] = params[TARGET]
    state = params_to_marian(params, exporting, shared_embeddings=checkpoint_shares)
    assert np.array_equal(state[ENCODER], state[DECODER]) == checkpoint_shares
    config = exporting.replace(share_embeddings=config_shares)
    if config_shares and not checkpoint_shares:
        with pytest.raises(WeightsError, match=f"{ENCODER} differs from {DECODER}, but the config shares one table"):
            params_from_marian(state, config, shared_embeddings=checkpoint_shares)
        return
    back = params_from_marian(state, config, shared_embeddings=checkpoint_shares)
    assert np.array_equal(back[TARGET], state[DECODER])
    assert np.array_equal(back[TARGET if config_shares else SOURCE], state[ENCODER])
    assert (SOURCE in back) != config_shares


def test_bert_refuses_heads_of_other_models_and_a_pooler_the_config_lacks():
    converter, params, state = exported("BertModel")
    head = {"cls.predictions.bias": np.zeros(53, np.float32)}
    with pytest.raises(WeightsError, match=r"unexpected keys \['cls.predictions.bias'\]"):
        from_hf_bert(state | head, converter.config)
    no_pooler = converter.config.replace(pooler=False)
    with pytest.raises(WeightsError, match=r"unexpected keys \['pooler.dense.weight', 'pooler.dense.bias'\]"):
        from_hf_bert(state, no_pooler)
    kept = {k: v for k, v in params.items() if not k.startswith("pooler.")}
    assert sorted(from_hf_bert(to_hf_bert(kept, no_pooler), no_pooler)) == sorted(kept)


def test_bert_buffers_are_checked_then_skipped_and_a_doubled_key_is_refused():
    converter, params, state = exported("BertModel")
    positions = np.arange(64)[None]
    back = from_hf_bert({f"bert.{k}": v for k, v in state.items()} | {"bert.embeddings.position_ids": positions},
                        converter.config)  # fmt: skip
    assert sorted(back) == sorted(params)
    with pytest.raises(WeightsError, match="embeddings.position_ids is not 0, 1, 2"):
        from_hf_bert(state | {"embeddings.position_ids": positions[:, ::-1]}, converter.config)
    with pytest.raises(WeightsError, match=r"embeddings.position_ids: expected \(1, 64\), got \(1, 512\)"):
        from_hf_bert(state | {"embeddings.position_ids": np.arange(512)[None]}, converter.config)
    doubled = state | {"bert.pooler.dense.bias": state["pooler.dense.bias"]}
    with pytest.raises(WeightsError, match=r"both with and without the bert. prefix: \['bert.pooler.dense.bias'\]"):
        from_hf_bert(doubled, converter.config)


def test_bert_converters_refuse_a_config_a_bert_cannot_hold():
    config = CONVERTERS["BertModel"].config
    for changes, field in [({"norm_first": True}, "norm_first"), ({"positional": "sinusoidal"}, "positional"),
                           ({"bias": False}, "bias"), ({"embedding_norm": False}, "embedding_norm")]:  # fmt: skip
        bad = config.replace(**changes)
        with pytest.raises(ValueError, match=f"a BERT has {field}="):
            to_hf_bert(init_params(bad), bad)
        with pytest.raises(ValueError, match=f"a BERT has {field}="):
            from_hf_bert({}, bad)


# ------------------------------------------------------------------ converters' key mapping
# Their name -> (our name, how their tensor is laid out from ours), as the converters' docstrings
# and the real libraries have them (nn.Linear stores [out, in]; GPT-2's Conv1D [in, out], with
# c_attn = [q | k | v] side by side). Layer 0 of each; the round trip of test_converters.py
# cannot see two names exchanged in both directions.
D = 36  # the GPT-2 converter's d_model in test_converters.py


PINNED = {
    "BertModel": {
        "encoder.layer.0.attention.output.LayerNorm.weight": ("encoder.layers.0.self_attn_norm.weight", None),
        "encoder.layer.0.output.LayerNorm.weight": ("encoder.layers.0.ffn_norm.weight", None),
        "encoder.layer.0.attention.self.key.weight": ("encoder.layers.0.self_attn.w_k.weight", np.transpose),
        "encoder.layer.0.output.dense.weight": ("encoder.layers.0.ffn.w_2.weight", np.transpose),
    },
    "LlamaForCausalLM": {
        "model.layers.0.self_attn.k_proj.weight": ("decoder.layers.0.self_attn.w_k.weight", np.transpose),
        "model.layers.0.self_attn.v_proj.weight": ("decoder.layers.0.self_attn.w_v.weight", np.transpose),
        "model.layers.0.mlp.gate_proj.weight": ("decoder.layers.0.ffn.w_gate.weight", np.transpose),
        "model.layers.0.input_layernorm.weight": ("decoder.layers.0.self_attn_norm.weight", None),
    },
    "GPT2LMHeadModel": {
        "transformer.h.0.attn.c_attn.weight": ("decoder.layers.0.self_attn.w_q.weight", lambda w: w[:, :D]),
        "transformer.h.0.attn.c_attn.bias": ("decoder.layers.0.self_attn.w_k.bias", lambda b: b[D : 2 * D]),
        "transformer.h.0.ln_2.weight": ("decoder.layers.0.ffn_norm.weight", None),
    },
}


@pytest.mark.parametrize("name", list(PINNED))
def test_their_names_hold_the_tensors_the_libraries_give_them(name):
    """Kills spec-bert-norm-names-swapped, spec-llama-k-v-swapped, spec-gpt2-qkv-order."""
    converter, params, state = exported(name)
    for theirs, (ours, cut) in PINNED[name].items():
        tensor = state[theirs] if cut is None else cut(state[theirs])
        assert np.array_equal(tensor, params[ours]), f"{theirs} does not hold our {ours}"
    back = converter.from_theirs(state, converter.config)
    assert all(np.array_equal(back[k], params[k]) for k in params)


_BERT_JSON = {
    "hidden_size": 36, "num_attention_heads": 3, "intermediate_size": 48, "num_hidden_layers": 2,
    "vocab_size": 53, "max_position_embeddings": 16,
}  # fmt: skip
_LLAMA_JSON = {
    "hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 48, "num_hidden_layers": 2,
    "vocab_size": 64, "pad_token_id": 0,
}  # fmt: skip
_GPT2_JSON = {"n_embd": 32, "n_head": 4, "n_layer": 2, "vocab_size": 64, "pad_token_id": 0}


@pytest.mark.parametrize(
    "convert, config_json, name",
    [(bert_config, _BERT_JSON, n) for n in _BERT_JSON]
    + [(llama_config, _LLAMA_JSON, n) for n in _LLAMA_JSON if n != "pad_token_id"]
    + [(gpt2_config, _GPT2_JSON, n) for n in _GPT2_JSON if n != "pad_token_id"],
    ids=lambda v: v if isinstance(v, str) else getattr(v, "__name__", ""),
)
def test_a_config_json_lacking_a_required_field_is_refused_naming_the_field(convert, config_json, name):
    """Every converter, not only the one a user tried: the error names the missing field, never a bare KeyError."""
    convert(dict(config_json))  # complete: converts
    lacking = {k: v for k, v in config_json.items() if k != name}
    with pytest.raises(ValueError, match=rf"config has no '{name}' field"):
        convert(lacking)
