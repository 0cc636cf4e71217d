"""transformer_spec alone (no backend): config validation (hand-picked, and drawn at random by
hypothesis), schema, init, safetensors I/O."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from transformer_spec import (
    PRESETS,
    Config,
    WeightsError,
    attention_to_heads,
    check_params,
    init_params,
    load_params,
    param_schema,
    save_params,
)
from transformer_spec.config import FOLLOWS, PAPER_TRAINING, RENAMED

from ..helpers import configs, hypothesis_settings


def test_d_model_not_divisible_by_heads_is_refused_with_both_numbers():
    with pytest.raises(ValueError, match=r"d_model \(36\) must be divisible by num_heads \(5\)"):
        Config(d_model=36, num_heads=5)


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"activation": "swish"}, "activation must be one of ['relu', 'gelu', 'gelu_tanh', 'silu'], got 'swish'"),
        ({"positional": "rope"}, "positional must be one of"),
        ({"kind": "seq2seq"}, "kind must be one of"),
        ({"d_ff": 0}, "d_ff must be a positive integer, got 0"),
        ({"num_heads": 2.0}, "num_heads must be a positive integer, got 2.0"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps must be a positive finite number"),
        ({"pad_id": 32000}, "pad_id must be an id in [0, src_vocab_size=32000), got 32000"),
        ({"kind": "encoder_only", "tie_output": True}, "tie_output=True needs a decoder"),
        ({"kind": "decoder_only", "num_encoder_layers": 0, "share_embeddings": True},
         "share_embeddings=True shares the source and target tables of an encoder-decoder: it needs "
         "kind='encoder_decoder', got kind='decoder_only'"),
        ({"tgt_vocab_size": 37000, "share_embeddings": True},
         "src_vocab_size (32000) must equal tgt_vocab_size (37000)"),
        ({"share_embeddings": 1}, "share_embeddings must be a bool"),
    ],
)
def test_invalid_configs_are_refused_at_construction(changes, words):
    with pytest.raises(ValueError) as error:
        Config(**changes)
    assert words in str(error.value)


def test_presets_are_valid_and_the_paper_base_has_table_3_sizes():
    base = Config.preset("base")
    assert (base.d_model, base.num_heads, base.d_ff, base.num_encoder_layers, base.d_k) == (512, 8, 2048, 6, 64)
    assert not base.norm_first and not base.encoder_final_norm  # the paper is post-norm without final norms
    assert Config.preset("base", norm_first=True).encoder_final_norm  # pre-norm stacks get one by default
    assert set(PRESETS) >= {"tiny", "tiny-lm", "tiny-bert", "base", "bert-base"}
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        Config.preset("huge")


@pytest.mark.parametrize("name, d_model, heads, d_ff, dropout, count", [
    ("paper-base", 512, 8, 2048, 0.1, 63_082_496),
    ("paper-big", 1024, 16, 4096, 0.3, 214_245_376),
])  # fmt: skip
def test_the_paper_presets_have_table_3_sizes_and_its_parameter_counts(name, d_model, heads, d_ff, dropout, count):
    """Table 3 (65M and 213M, rounded): 6 + 6 post-norm layers, sinusoidal positions, one 37,000-token
    vocabulary whose one matrix is the source and target embeddings and the output projection;
    counted with every bias and LayerNorm. Without the sharing the base model would count 82,026,496
    (the source table again) and 101,007,496 (and the projection with its bias)."""
    config = Config.preset(name)
    assert (config.d_model, config.num_heads, config.d_ff, config.dropout) == (d_model, heads, d_ff, dropout)
    assert (config.num_encoder_layers, config.num_decoder_layers, config.src_vocab_size) == (6, 6, 37000)
    assert config.tgt_vocab_size == 37000 and config.share_embeddings and config.tie_output
    assert config.positional == "sinusoidal" and not config.norm_first and config.activation == "relu"
    assert sum(int(np.prod(shape)) for shape in param_schema(config).values()) == count
    if name == "paper-base":
        unshared = sum(int(np.prod(s)) for s in param_schema(config.replace(share_embeddings=False)).values())
        untied = config.replace(share_embeddings=False, tie_output=False)
        assert (unshared, sum(int(np.prod(s)) for s in param_schema(untied).values())) == (82_026_496, 101_007_496)
    assert (PAPER_TRAINING["label_smoothing"], PAPER_TRAINING["warmup_steps"]) == (0.1, 4000)


def test_config_survives_json():
    config = Config.preset("tiny-bert")
    assert Config.from_json(config.to_json()) == config
    with pytest.raises(ValueError, match=r"unknown Config fields \['heads'\]"):
        Config.from_dict({"heads": 3})


# ------------------------------------------------------------- fields that follow another one
@pytest.mark.parametrize(
    "given, name, want",
    [
        ({"num_heads": 4}, "num_kv_heads", 4),
        ({"bias": False, "ffn_bias": True}, "attention_bias", False),
        ({"bias": False, "attention_bias": True}, "ffn_bias", False),
        ({"norm_first": True, "decoder_final_norm": False}, "encoder_final_norm", True),
        ({"norm_first": True, "encoder_final_norm": False}, "decoder_final_norm", True),
    ],
)
def test_a_field_left_as_none_holds_the_value_of_the_field_it_follows(given, name, want):
    """Model code reads one name per concept, always resolved; each field follows its own leader
    (``FOLLOWS``), not a neighbour set to the opposite value (kills
    spec-decoder-final-norm-reads-encoder-field)."""
    config = Config(**given)
    assert getattr(config, name) == want
    assert config.to_dict()[name] is None  # still stored as "follows"


def test_replace_keeps_a_field_that_was_left_to_follow_following():
    """``replace`` starts from the fields as given, not as resolved: changing num_heads must not
    pin num_kv_heads to the old head count (which would turn on grouped-query attention)."""
    config = Config(d_model=48, num_heads=8)
    assert config.num_kv_heads == 8
    assert config.replace(num_heads=4).num_kv_heads == 4
    assert config.replace(norm_first=True).encoder_final_norm and config.replace(norm_first=True).decoder_final_norm
    assert not config.replace(bias=False).attention_bias and not config.replace(bias=False).ffn_bias
    given = Config(d_model=48, num_heads=8, num_kv_heads=2, attention_bias=False)
    assert given.replace(num_heads=4).num_kv_heads == 2  # a value given stays given
    assert given.replace(bias=False, attention_bias=True).attention_bias
    assert given.replace(num_kv_heads=None).num_kv_heads == 8  # None follows again
    assert given.replace(num_kv_heads=None, num_heads=4).num_kv_heads == 4


def _copies(config: Config, **changes):
    """``config`` with ``changes``, copied each way a user copies a frozen dataclass."""
    import copy

    ways = {
        "Config.replace": config.replace(**changes),
        "dataclasses.replace": dataclasses.replace(config, **changes),
        "Config(**asdict(c))": Config(**(dataclasses.asdict(config) | changes)),
        "copy.deepcopy then replace": copy.deepcopy(config).replace(**changes),
    }
    if hasattr(copy, "replace"):  # Python 3.13
        ways["copy.replace"] = copy.replace(config, **changes)
    return ways


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_standard_copy_of_a_preset_with_other_heads_or_switches_is_the_model_asked_for(name):
    """A field left to follow follows through Python's own copies too, not only ``Config.replace``:
    ``dataclasses.replace(Config.preset("base"), num_heads=16)`` has 16 key/value heads (the model
    asked for), not 8 (a grouped-query model nobody asked for). Each copy equals the config built
    from scratch with the preset's fields as given and the change, and stores the same fields."""
    preset = Config.preset(name)
    given = preset.to_dict()  # None where a field follows
    heads = preset.num_heads * 2  # still divides d_model into even heads; a pinned num_kv_heads divides it
    if preset.d_model % heads or (preset.positional == "rotary" and (preset.d_model // heads) % 2):
        heads = preset.num_kv_heads
    for changes in ({"num_heads": heads}, {"bias": not preset.bias}, {"norm_first": not preset.norm_first}):
        want = Config(**(given | changes))
        for way, copied in _copies(preset, **changes).items():
            assert copied == want and copied.to_dict() == want.to_dict(), (way, changes)
            for field, leader in FOLLOWS.items():
                if given[field] is None:  # left to follow: the copy's value is its leader's
                    assert getattr(copied, field) == getattr(copied, leader), (way, changes, field)
                assert repr(getattr(copied, field)) == repr(getattr(want, field)), (way, field)
    pinned = preset.replace(num_kv_heads=preset.num_kv_heads)  # given to replace: pinned, in every copy after
    for way, copied in _copies(pinned, num_heads=heads).items():
        assert copied.num_kv_heads == preset.num_kv_heads and copied.to_dict()["num_kv_heads"] is not None, way


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_config_survives_json_and_still_follows_after_it(name):
    """to_json stores null where a field follows (as every weights file always has): the config
    read back is equal, stores the same text, and its fields follow as before."""
    config = Config.preset(name)
    back = Config.from_json(config.to_json())
    assert back == config and back.to_json() == config.to_json()
    for field in FOLLOWS:
        assert getattr(back, field) == getattr(config, field)
        assert back.to_dict()[field] == config.to_dict()[field]  # None (follows) stays None
    read_back = Config.from_json(Config(d_model=48, num_heads=8).to_json())
    assert read_back.replace(num_heads=4).num_kv_heads == 4


def test_configs_that_build_the_same_model_are_equal():
    """Equality (and the hash) compare the resolved fields: a field left to follow equals the
    same value given; ``to_dict`` still tells them apart, since they differ under ``replace``."""
    following = Config(d_model=48, num_heads=8)
    given = Config(d_model=48, num_heads=8, num_kv_heads=8, attention_bias=True, ffn_bias=True,
                   encoder_final_norm=False, decoder_final_norm=False)  # fmt: skip
    assert following == given and hash(following) == hash(given)
    assert following.to_dict() != given.to_dict()
    assert following != Config(d_model=48, num_heads=8, num_kv_heads=4)


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_a_former_name_is_refused_with_the_current_one(old, new):
    """Each concept has one name: the former spellings are refused at construction, in a stored
    config and on reading, each error naming the field to use."""
    value = 3 if new == "num_kv_heads" else True
    with pytest.raises(TypeError, match=f"use {new}"):
        Config(**{old: value})
    with pytest.raises(TypeError, match=f"use {new}"):
        Config.preset("tiny").replace(**{old: value})
    with pytest.raises(ValueError, match=f"use {new}"):
        Config.from_dict(Config.preset("tiny").to_dict() | {old: value})
    with pytest.raises(AttributeError, match=new):
        getattr(Config.preset("tiny"), old)
    assert not hasattr(Config.preset("tiny"), old)


def test_bert_base_schema_has_bert_base_parameter_count():
    schema = param_schema(Config.preset("bert-base"))
    total = sum(int(np.prod(s)) for s in schema.values())
    assert total == 109_482_240  # transformers.BertModel(bert-base-uncased), pooler included


def test_init_is_seeded_and_layers_get_different_weights():
    config = Config.preset("tiny")
    a, b, c = init_params(config, seed=1), init_params(config, seed=1), init_params(config, seed=2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["encoder.layers.0.ffn.w_1.weight"], c["encoder.layers.0.ffn.w_1.weight"])
    assert not np.array_equal(a["encoder.layers.0.ffn.w_1.weight"], a["encoder.layers.1.ffn.w_1.weight"])
    assert np.all(a["encoder.layers.0.self_attn_norm.weight"] == 1) and np.all(a["encoder.layers.0.ffn.w_1.bias"] == 0)


def test_save_then_load_returns_the_same_weights_and_config(tmp_path):
    config = Config.preset("tiny-lm")
    params = init_params(config, dtype="float64")
    save_params(tmp_path / "w.safetensors", params, config)
    loaded, stored = load_params(tmp_path / "w.safetensors")
    assert stored == config and loaded.keys() == params.keys()
    assert all(np.array_equal(loaded[k], params[k]) and loaded[k].dtype == np.float64 for k in params)


def test_check_params_names_every_problem():
    schema = {"a.weight": (2, 3), "a.bias": (3,), "b.weight": (3, 3)}
    with pytest.raises(WeightsError) as error:
        check_params({"a.weight": (3, 2), "b.weight": (3, 3), "c": (1,)}, schema)
    message = str(error.value)
    assert "missing keys ['a.bias']" in message
    assert "unexpected keys ['c']" in message
    assert "a.weight: expected (2, 3), got (3, 2)" in message


def test_attention_to_heads_slices_columns_per_head():
    config = Config.preset("tiny")
    params = init_params(config, component="attention", nonzero_biases=True)
    heads = attention_to_heads(params, config)
    assert set(heads) == set(param_schema(config, "attention_heads"))
    assert np.array_equal(heads["heads.1.w_k.weight"], params["w_k.weight"][:, 12:24])
    assert np.array_equal(heads["heads.2.w_v.bias"], params["w_v.bias"][24:36])


# ------------------------------------------------------------------ random bad configs, drawn by hypothesis
BAD_FIELDS = st.sampled_from(
    [
        ("kind", "decoder"), ("d_model", 0), ("d_model", 1), ("num_heads", -1), ("num_kv_heads", 2),
        ("num_kv_heads", 0), ("d_ff", 2.5), ("max_len", True), ("norm", "batch_norm"), ("activation", "tanh"),
        ("positional", "alibi"), ("rope_layout", "pairs"), ("sinusoid_layout", "cosines"), ("dropout", 1.0),
        ("layer_norm_eps", 0.0), ("rope_theta", float("inf")), ("pad_id", 99), ("bias", 1), ("norm_first", None),
        ("tie_output", "yes"), ("type_vocab_size", -2), ("attention_bias", 0), ("final_logits_bias", "no"),
        ("share_embeddings", "yes"),
    ]
)  # fmt: skip


@hypothesis_settings(max_examples=25)
@given(config=configs(), bad=BAD_FIELDS)
def test_an_invalid_config_is_refused_before_any_backend_sees_it(config, bad):
    """A drawn config with one field made invalid: one validation, in transformer_spec, refuses it
    (a ValueError naming the field), so every backend refuses it with the same message."""
    name, value = bad
    if name == "num_kv_heads" and value > 0:
        value = config.num_heads + 1  # never divides num_heads
    if name == "d_model" and value > 0:
        value = config.d_model + 1 if config.num_heads > 1 else -config.d_model  # indivisible, or negative
    with pytest.raises(ValueError, match=name):
        config.replace(**{name: value})
