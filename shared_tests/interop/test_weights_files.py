"""Weights files: what loading refuses, saving refuses too; a bad file or a bad stored config is
one clear error naming what is wrong; non-finite weights are refused everywhere unless asked
for; the same weights give the same bytes in any process; a save replaces the file atomically."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from transformer_spec import Config, WeightsError, WeightsFileError, init_params, load_params, save_params
from transformer_spec.io import FORMAT

LM = Config.preset("tiny-lm")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_raw(path, params, metadata) -> str:
    """A safetensors file with any metadata at all (safetensors' own writer, no checks of ours)."""
    save_file({k: np.ascontiguousarray(v) for k, v in params.items()}, str(path), metadata=metadata)
    return str(path)


def config_json(**changes) -> str:
    values = LM.to_dict() | changes
    return json.dumps({k: v for k, v in values.items() if v is not DROP})


DROP = object()


# ------------------------------------------------------------------ the stored config
@pytest.mark.parametrize(
    "config_text,words",
    [
        (config_json(norm_first="post"), ["norm_first", "'post'", "bool"]),
        (config_json(tie_output="False"), ["tie_output", "'False'"]),
        (config_json(bias="no"), ["bias", "'no'"]),
        (config_json(d_model="36"), ["d_model", "'36'", "positive integer"]),
        (config_json(d_model=36.0), ["d_model", "36.0", "positive integer"]),
        (config_json(num_decoder_layers=-1), ["num_decoder_layers", "-1"]),
        (config_json(layer_norm_eps=float("inf")), ["layer_norm_eps", "inf", "finite"]),
        (config_json(layer_norm_eps=float("nan")), ["layer_norm_eps", "nan"]),
        (config_json(dropout=1.5), ["dropout", "1.5"]),
        (config_json(kind="gpt"), ["kind", "'gpt'"]),
        (config_json(activation=None), ["activation", "None"]),
        (config_json(heads=3), ["unknown Config fields ['heads']"]),
        (config_json(norm_first=DROP), ["Config fields missing: ['norm_first']"]),
        ('{"d_model": 36, "d_model": 48}', ["fields given twice: ['d_model']"]),
        ("{not json", ["not valid JSON"]),
        ("[1, 2]", ["dict of fields", "list"]),
        ('"tiny-lm"', ["dict of fields", "str"]),
        ("null", ["dict of fields", "NoneType"]),
    ],
)
def test_a_stored_config_with_a_wrong_field_is_refused_naming_the_field_and_value(tmp_path, config_text, words):
    path = write_raw(tmp_path / "w.safetensors", init_params(LM), {"format": FORMAT, "config": config_text})
    with pytest.raises(WeightsFileError) as error:
        load_params(path)
    message = str(error.value)
    assert path in message
    for word in words:
        assert word in message, f"{message!r} does not name {word!r}"


@pytest.mark.parametrize(
    "metadata,words",
    [
        (None, ["without transformer_spec metadata", "metadata keys []"]),
        ({"config": LM.to_json()}, ["without transformer_spec metadata", "['config']"]),
        ({"format": FORMAT}, ["without transformer_spec metadata", "['format']"]),
        ({"format": "transformer_spec/0", "config": LM.to_json()}, ["format='transformer_spec/1'"]),
    ],
)
def test_a_file_without_our_metadata_is_refused(tmp_path, metadata, words):
    path = write_raw(tmp_path / "w.safetensors", init_params(LM), metadata)
    with pytest.raises(WeightsFileError) as error:
        load_params(path)
    for word in words:
        assert word in str(error.value)


def test_files_that_are_not_weights_files_are_refused(tmp_path):
    good = tmp_path / "good.safetensors"
    save_params(good, init_params(LM), LM)
    data = good.read_bytes()
    cases = {
        "README.md": (os.path.join(ROOT, "README.md"), "is not a safetensors file"),
        "empty": (tmp_path / "empty.safetensors", "is not a safetensors file"),
        "truncated": (tmp_path / "truncated.safetensors", "is not a safetensors file"),
        "header only": (tmp_path / "header.safetensors", "is not a safetensors file"),
        "folder": (tmp_path, "is not a file"),
        "missing": (tmp_path / "missing.safetensors", "is not a file"),
    }
    (tmp_path / "empty.safetensors").write_bytes(b"")
    (tmp_path / "truncated.safetensors").write_bytes(data[: len(data) // 2])
    (tmp_path / "header.safetensors").write_bytes(data[:7])
    for name, (path, words) in cases.items():
        with pytest.raises(WeightsFileError, match=words) as error:
            load_params(path)
        assert repr(str(path)) in str(error.value), name


# ------------------------------------------------------------------ the weights in a file
def test_non_finite_weights_are_refused_at_load_naming_each_key_and_its_count(tmp_path):
    params = init_params(LM)
    params["decoder.norm.weight"][[1, 5, 7]] = np.nan
    params["generator.proj.bias"][0] = np.inf
    params["tgt_embed.token.weight"][2, 3] = -np.inf
    path = write_raw(tmp_path / "w.safetensors", params, {"format": FORMAT, "config": LM.to_json()})
    with pytest.raises(WeightsError) as error:
        load_params(path)
    message = str(error.value)
    assert "non-finite values (NaN or inf) in 3 keys" in message
    assert "decoder.norm.weight: 3 of 36" in message
    assert "generator.proj.bias: 1 of 53" in message
    assert "tgt_embed.token.weight: 1 of 1908" in message
    assert "allow_non_finite=True" in message
    loaded, _ = load_params(path, allow_non_finite=True)
    assert np.isnan(loaded["decoder.norm.weight"]).sum() == 3


def test_save_refuses_non_finite_weights_unless_asked_and_load_then_needs_asking_too(tmp_path):
    params = init_params(LM)
    params["decoder.layers.1.ffn.w_2.weight"][0, 0] = np.nan
    path = tmp_path / "w.safetensors"
    with pytest.raises(WeightsError, match=r"decoder\.layers\.1\.ffn\.w_2\.weight: 1 of 1332"):
        save_params(path, params, LM)
    assert not path.exists() and os.listdir(tmp_path) == []
    save_params(path, params, LM, allow_non_finite=True)
    with pytest.raises(WeightsError, match="non-finite"):
        load_params(path)
    assert np.isnan(load_params(path, allow_non_finite=True)[0]["decoder.layers.1.ffn.w_2.weight"][0, 0])


def test_non_finite_weights_are_refused_by_every_backend_unless_asked(backend, tmp_path):
    params = init_params(LM)
    params["decoder.layers.0.self_attn.w_q.weight"][3] = np.inf
    with pytest.raises(WeightsError, match=r"decoder\.layers\.0\.self_attn\.w_q\.weight: 36 of 1296"):
        backend.impl.build_model(LM, params)
    with pytest.raises(WeightsError, match="non-finite"):
        backend.impl.from_params(backend.impl.TransformerLM, LM, params)
    model = backend.impl.build_model(LM, params, allow_non_finite=True)
    assert np.isinf(backend.impl.to_params(model)["decoder.layers.0.self_attn.w_q.weight"][3]).all()
    save_params(tmp_path / "w.safetensors", params, LM, allow_non_finite=True)
    with pytest.raises(WeightsError, match="non-finite"):
        backend.impl.load_model(str(tmp_path / "w.safetensors"))
    backend.impl.load_model(str(tmp_path / "w.safetensors"), allow_non_finite=True)


@pytest.mark.parametrize(
    "weights, words",
    [
        (None, "got NoneType"),
        ("pairs", "got list (dict(pairs) makes one from (name, array) pairs)"),
        ("array", "got ndarray"),
    ],
)
def test_weights_that_are_not_a_dict_are_refused_by_every_backend_naming_what_came(backend, weights, words):
    params = init_params(LM)
    weights = {"pairs": list(params.items()), "array": np.zeros(3)}.get(weights, weights)
    with pytest.raises(TypeError, match=r"params must be a dict of canonical names -> arrays, " + re.escape(words)):
        backend.impl.from_params(backend.impl.TransformerLM, LM, weights)
    if weights is not None:  # build_model(config) without weights draws the seeded ones
        with pytest.raises(TypeError, match="params must be a dict of canonical names -> arrays"):
            backend.impl.build_model(LM, weights)


@pytest.mark.parametrize(
    "change,words",
    [
        (lambda p: {k: v.astype(np.float16) for k, v in p.items()}, ["must all be float32 or all float64", "float16"]),
        (lambda p: p | {"decoder.norm.weight": p["decoder.norm.weight"].astype(np.float64)}, ["float64"]),
        (lambda p: {k: v.astype(np.int64) for k, v in p.items()}, ["int64"]),
        (lambda p: {k: v for k, v in p.items() if k != "decoder.norm.bias"}, ["missing keys ['decoder.norm.bias']"]),
        (lambda p: p | {"decoder.layers.2.ffn_norm.weight": np.ones(36, np.float32)}, ["unexpected keys"]),
        (
            lambda p: p | {"decoder.norm.weight": np.ones(37, np.float32)},
            ["decoder.norm.weight: expected (36), got (37)"],
        ),
        (lambda p: p | {"decoder.norm.weight": np.ones((36, 1), np.float32)}, ["expected (36), got (36, 1)"]),
    ],
)
def test_save_refuses_what_load_would_refuse(tmp_path, change, words):
    params = change(init_params(LM))
    path = tmp_path / "w.safetensors"
    with pytest.raises(WeightsError) as saved:
        save_params(path, params, LM)
    assert not path.exists(), "a refused save writes nothing"
    raw = write_raw(tmp_path / "raw.safetensors", params, {"format": FORMAT, "config": LM.to_json()})
    with pytest.raises(WeightsError) as loaded:
        load_params(raw)
    for word in words:
        assert word in str(saved.value) and word in str(loaded.value), (str(saved.value), str(loaded.value))


def test_save_needs_a_config_and_a_dict_of_arrays(tmp_path):
    with pytest.raises(TypeError, match="config must be a transformer_spec.Config, got dict"):
        save_params(tmp_path / "w.safetensors", init_params(LM), LM.to_dict())
    with pytest.raises(TypeError, match="params must be a dict"):
        save_params(tmp_path / "w.safetensors", list(init_params(LM).values()), LM)


def test_weights_from_any_framework_are_saved_alike(backend, tmp_path):
    model = backend.impl.build_model(LM, init_params(LM, dtype="float64"))
    save_params(tmp_path / "w.safetensors", backend.impl.to_params(model), LM)
    params, config = load_params(tmp_path / "w.safetensors")
    assert config == LM and all(np.array_equal(params[k], v) for k, v in init_params(LM, dtype="float64").items())


# ------------------------------------------------------------------ the same bytes every time
SAVE_IN_A_PROCESS = textwrap.dedent(
    """
    import sys
    from transformer_spec import Config, init_params, save_params
    config = Config.preset("tiny")
    params = init_params(config, seed=3, dtype="float64")
    if sys.argv[2] == "reversed":
        params = dict(reversed(list(params.items())))
    save_params(sys.argv[1], params, config)
    """
)


def test_the_same_weights_give_the_same_bytes_in_any_process_and_any_key_order(tmp_path):
    files = []
    for seed, order in [("0", "forward"), ("1", "reversed"), ("12345", "forward"), ("random", "reversed")]:
        path = tmp_path / f"w{len(files)}.safetensors"
        env = os.environ | {"PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-c", SAVE_IN_A_PROCESS, str(path), order], check=True, env=env, cwd=ROOT)
        files.append(path.read_bytes())
    config = Config.preset("tiny")
    here = tmp_path / "here.safetensors"
    save_params(here, init_params(config, seed=3, dtype="float64"), config)
    save_params(tmp_path / "again.safetensors", init_params(config, seed=3, dtype="float64"), config)
    files += [here.read_bytes(), (tmp_path / "again.safetensors").read_bytes()]
    assert all(f == files[0] for f in files), "saving the same weights gave different bytes"
    header_length = int.from_bytes(files[0][:8], "little")
    header = json.loads(files[0][8 : 8 + header_length])
    assert list(header) == ["__metadata__", *sorted(init_params(config))]
    assert list(header["__metadata__"]) == ["config", "format"]


def test_our_files_are_plain_safetensors_files(tmp_path):
    params = init_params(LM, dtype="float64")
    save_params(tmp_path / "w.safetensors", params, LM)
    assert all(np.array_equal(load_file(str(tmp_path / "w.safetensors"))[k], v) for k, v in params.items())
    torch_safetensors = pytest.importorskip("safetensors.torch")
    loaded = torch_safetensors.load_file(str(tmp_path / "w.safetensors"))
    assert all(np.array_equal(loaded[k].numpy(), v) for k, v in params.items())


# ------------------------------------------------------------------ atomic replacement
def test_a_save_that_fails_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "w.safetensors"
    save_params(path, init_params(LM, seed=1), LM)
    before = path.read_bytes()

    def disk_full(descriptor):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        save_params(path, init_params(LM, seed=2), LM)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["w.safetensors"]
    monkeypatch.undo()
    save_params(path, init_params(LM, seed=2), LM)
    assert np.array_equal(load_params(path)[0]["decoder.norm.weight"], init_params(LM, seed=2)["decoder.norm.weight"])
    assert os.listdir(tmp_path) == ["w.safetensors"]


def test_a_save_into_a_missing_folder_or_onto_a_folder_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        save_params(tmp_path / "no" / "such" / "w.safetensors", init_params(LM), LM)
    with pytest.raises(IsADirectoryError, match="it is a folder"):
        save_params(tmp_path, init_params(LM), LM)


def test_a_saved_file_keeps_the_usual_permissions(tmp_path):
    path = tmp_path / "w.safetensors"
    save_params(path, init_params(LM), LM)
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    assert (path.stat().st_mode & 0o777) == (plain.stat().st_mode & 0o777)


def test_a_file_storing_null_for_the_fields_that_follow_loads_to_the_model_it_was_written_from(tmp_path):
    """Files store null where a field follows another one (num_kv_heads follows num_heads, the
    biases follow bias, the final norms follow norm_first), as every file written so far does: such
    a file loads to the same model, each field resolved, and its config saves back to the same text."""
    from transformer_spec.config import FOLLOWS

    stored = {f.name: None if f.name in FOLLOWS else getattr(LM, f.name) for f in dataclasses.fields(Config)}
    metadata = {"format": FORMAT, "config": json.dumps(stored)}
    path = write_raw(tmp_path / "w.safetensors", init_params(LM, seed=0), metadata)
    params, config = load_params(path)
    assert config == LM
    assert (config.num_kv_heads, config.attention_bias, config.ffn_bias) == (LM.num_heads, LM.bias, LM.bias)
    assert config.decoder_final_norm == LM.norm_first and LM.norm_first and "decoder.norm.weight" in params
    assert json.loads(config.to_json()) == stored
    assert config.replace(num_heads=4, d_model=36).num_kv_heads == 4  # still follows num_heads


# The weights files of each earlier version, oldest first, and the Config fields they lack: every version
# has written every field its Config had (``to_json``) under the one format string, so a file of a version
# lacks exactly the fields added since. Written out from the history of transformer_spec/config.py
# (``git log -p -S <field> -- transformer_spec/config.py``), not computed from ADDED_LATER, which it checks.
# ``loads``: whether such a file loads today (the first two versions' files are refused since a stored
# config must hold every field, ADDED_LATER excepted, and ADDED_LATER names neither pooler nor dropout);
# ``model``: a model such a file held, made of the parts that version had.
@dataclasses.dataclass(frozen=True)
class EarlierVersion:
    commit: str  # the commit whose Config the version's files store
    lacks: frozenset[str]
    model: Config


MODERN_DECODER_FIELDS = frozenset({"norm", "gated_ffn", "num_kv_heads", "rope_theta", "rope_layout", "attention_bias",
                                   "ffn_bias", "sinusoid_layout", "final_logits_bias", "share_embeddings"})  # fmt: skip
PAPER_PARTS = Config.preset("tiny").replace(norm_first=True, activation="gelu", positional="learned", tie_output=True,
                                            src_vocab_size=47)  # fmt: skip
MODERN_PARTS = PAPER_PARTS.replace(positional="rotary", norm="rms_norm", gated_ffn=True, activation="silu",
                                   num_kv_heads=1, rope_theta=500.0, rope_layout="interleaved", attention_bias=False,
                                   sinusoid_layout="halves", final_logits_bias=True)  # fmt: skip
EARLIER_VERSIONS = {
    "first": EarlierVersion("18df653", MODERN_DECODER_FIELDS | {"pooler", "dropout"}, PAPER_PARTS),
    "with-pooler": EarlierVersion("c5c20f7", MODERN_DECODER_FIELDS | {"dropout"}, PAPER_PARTS),
    "with-dropout": EarlierVersion("bc1741c", MODERN_DECODER_FIELDS, PAPER_PARTS),
    "with-the-modern-decoder": EarlierVersion("51aa1b3", frozenset(), MODERN_PARTS.replace(share_embeddings=True)),
    "without-share-embeddings": EarlierVersion("6977f45", frozenset({"share_embeddings"}), MODERN_PARTS),
}  # fmt: skip


def earlier_file(tmp_path, version: EarlierVersion) -> str:
    """A weights file of ``version``: its model's weights and config, the fields it lacks left out."""
    stored = {k: v for k, v in version.model.to_dict().items() if k not in version.lacks}
    metadata = {"format": FORMAT, "config": json.dumps(stored)}
    return write_raw(tmp_path / "earlier.safetensors", init_params(version.model, seed=0), metadata)


def test_added_later_names_exactly_the_fields_that_the_earlier_files_lack():
    """ADDED_LATER, the fields a stored config may lack, is every field that the files of an earlier
    version lack, and no other: a field left out of it refuses that version's files (as
    share_embeddings would the files written while Config was without it, between the modern decoder's
    fields and its return). Kills spec-added-later-misses-share-embeddings, -gated-ffn and -dropout."""
    from transformer_spec.config import ADDED_LATER

    fields = {f.name for f in dataclasses.fields(Config)}
    assert all(version.lacks <= fields for version in EARLIER_VERSIONS.values())
    assert ADDED_LATER == frozenset().union(*(v.lacks for v in EARLIER_VERSIONS.values()))


@pytest.mark.parametrize("name", list(EARLIER_VERSIONS))
def test_a_file_of_an_earlier_version_loads_as_the_model_it_was_written_from(tmp_path, name):
    """A file of an earlier version lacks the fields added since; their defaults are the model it
    holds (the parts did not exist yet), so it loads as that model, weights and config. Kills
    spec-added-later-misses-share-embeddings, -gated-ffn and -dropout."""
    version = EARLIER_VERSIONS[name]
    defaults = Config().to_dict()
    assert all(version.model.to_dict()[field] == defaults[field] for field in version.lacks)
    params, config = load_params(earlier_file(tmp_path, version))
    assert config == version.model
    expected = init_params(version.model, seed=0)
    assert sorted(params) == sorted(expected) and all(np.array_equal(params[k], expected[k]) for k in expected)


def test_a_file_lacking_a_field_every_version_wrote_is_refused_naming_it(tmp_path):
    """A field no earlier version lacked (d_model, pad_id) is never filled in by a default: a file
    without it is refused, naming it."""
    version = EarlierVersion("HEAD", frozenset({"d_model", "pad_id"}), PAPER_PARTS)
    with pytest.raises(WeightsFileError, match="Config fields missing") as error:
        load_params(earlier_file(tmp_path, version))
    named = re.search(r"missing: \[(.*?)\]", str(error.value)).group(1)
    assert sorted(named.replace("'", "").split(", ")) == ["d_model", "pad_id"]
