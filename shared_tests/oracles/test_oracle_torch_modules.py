"""Our three backends against PyTorch's own modules (code nobody here wrote), given the
same weights through ``transformer_convert.torch_transformer``.

PyTorch runs in eval mode with dropout 0, in the same dtype as ours. Masks are
translated (True = masked there). Outputs are compared at real (non-pad) query
positions only: PyTorch's fast path returns zeros at padded positions, where the
references disagree with each other anyway.
"""

from __future__ import annotations

import numpy as np
import pytest

from transformer_convert.torch_transformer import (
    from_torch_transformer,
    to_torch_transformer,
    torch_transformer_config,
)
from transformer_spec import init_params
from transformer_spec.checks import WeightsError

from ..cases import DTYPES, hidden, token_ids
from ..tolerances import assert_close

ORACLE = "torch.nn"
torch = pytest.importorskip("torch", reason="the oracle is torch.nn: install the [torch] extra")
nn = torch.nn

SETTINGS = [
    pytest.param(False, "relu", id="post-relu"),
    pytest.param(False, "gelu", id="post-gelu"),
    pytest.param(True, "relu", id="pre-relu"),
    pytest.param(True, "gelu", id="pre-gelu"),
]
B, T_SRC, T_TGT, D, H, F = 3, 11, 7, 36, 3, 37


def torch_transformer(norm_first: bool, activation: str, dtype: str, seed: int = 0) -> nn.Transformer:
    torch.manual_seed(seed)
    model = nn.Transformer(
        d_model=D, nhead=H, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=F, dropout=0.0,
        activation=activation, batch_first=True, norm_first=norm_first,
    )  # fmt: skip
    with torch.no_grad():  # torch initialises LayerNorms to 1 and biases to 0: perturb them, so they count
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model.to(getattr(torch, dtype)).eval()


def numpy_state(module: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() for k, v in module.state_dict().items()}


def masks(src_ids: np.ndarray, tgt_ids: np.ndarray):
    """Ours (True = may attend) and torch's (True = masked) for the same padding and causality."""
    src_real, tgt_real = src_ids != 0, tgt_ids != 0
    causal = np.tril(np.ones((T_TGT, T_TGT), bool))
    ours = {
        "src": src_real[:, None, None, :],  # (B, 1, 1, T_src)
        "tgt": tgt_real[:, None, None, :] & causal[None, None],  # (B, 1, T_tgt, T_tgt)
    }
    theirs = {
        "src_key_padding_mask": torch.from_numpy(~src_real),
        "tgt_key_padding_mask": torch.from_numpy(~tgt_real),
        "memory_key_padding_mask": torch.from_numpy(~src_real),
        "tgt_mask": torch.from_numpy(~causal),
    }
    return ours, theirs, src_real, tgt_real


@pytest.fixture(scope="module")
def padded_ids():
    return token_ids(53, B, T_SRC, pad=True, seed=2), token_ids(47, B, T_TGT, pad=True, seed=1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first, activation", SETTINGS)
def test_encoder_matches_torch_transformer_encoder(backend, norm_first, activation, dtype, padded_ids):
    model = torch_transformer(norm_first, activation, dtype)
    config = torch_transformer_config(D, H, 2, 2, F, activation, norm_first=norm_first)
    encoder_params = from_torch_transformer(numpy_state(model.encoder), config, "encoder")
    src_ids, tgt_ids = padded_ids
    ours_mask, theirs, src_real, _ = masks(src_ids, tgt_ids)
    x = hidden(B, T_SRC, D, seed=5).astype(dtype)
    with torch.no_grad():
        want = model.encoder(torch.from_numpy(x), src_key_padding_mask=theirs["src_key_padding_mask"]).numpy()
    got = backend.call(backend.build("Encoder", config, encoder_params), x, ours_mask["src"])[0]
    assert_close(got[src_real], want[src_real], dtype, "encoder output at real tokens")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first, activation", SETTINGS)
def test_whole_transformer_matches_torch_nn_transformer(backend, norm_first, activation, dtype, padded_ids):
    """nn.Transformer(src, tgt) == our encoder then our decoder, causal and padding masks, T_src != T_tgt."""
    model = torch_transformer(norm_first, activation, dtype, seed=1)
    config = torch_transformer_config(D, H, 2, 2, F, activation, norm_first=norm_first)
    params = from_torch_transformer(numpy_state(model), config)
    encoder = backend.build("Encoder", config, {k[8:]: v for k, v in params.items() if k.startswith("encoder.")})
    decoder = backend.build("Decoder", config, {k[8:]: v for k, v in params.items() if k.startswith("decoder.")})
    src_ids, tgt_ids = padded_ids
    ours_mask, theirs, _, tgt_real = masks(src_ids, tgt_ids)
    src, tgt = hidden(B, T_SRC, D, seed=6).astype(dtype), hidden(B, T_TGT, D, seed=7).astype(dtype)
    with torch.no_grad():
        want = model(torch.from_numpy(src), torch.from_numpy(tgt), **theirs).numpy()
    memory = backend.call(encoder, src, ours_mask["src"])[0]
    got = backend.call(decoder, tgt, memory, ours_mask["tgt"], ours_mask["src"])[0]
    assert_close(got[tgt_real], want[tgt_real], dtype, "nn.Transformer output at real target tokens")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm_first, activation", SETTINGS[:1] + SETTINGS[3:])
def test_decoder_layer_matches_torch_decoder_layer(backend, norm_first, activation, dtype, padded_ids):
    torch.manual_seed(3)
    layer = nn.TransformerDecoderLayer(D, H, F, dropout=0.0, activation=activation, batch_first=True,
                                       norm_first=norm_first).to(getattr(torch, dtype)).eval()  # fmt: skip
    config = torch_transformer_config(D, H, 1, 1, F, activation, norm_first=norm_first)
    params = from_torch_transformer(numpy_state(layer), config, "decoder_layer")
    src_ids, tgt_ids = padded_ids
    ours_mask, theirs, _, tgt_real = masks(src_ids, tgt_ids)
    x, memory = hidden(B, T_TGT, D, seed=8).astype(dtype), hidden(B, T_SRC, D, seed=9).astype(dtype)
    with torch.no_grad():
        want = layer(torch.from_numpy(x), torch.from_numpy(memory), tgt_mask=theirs["tgt_mask"],
                     tgt_key_padding_mask=theirs["tgt_key_padding_mask"],
                     memory_key_padding_mask=theirs["memory_key_padding_mask"]).numpy()  # fmt: skip
    got = backend.call(backend.build("DecoderLayer", config, params), x, memory, ours_mask["tgt"], ours_mask["src"])[0]
    assert_close(got[tgt_real], want[tgt_real], dtype, "decoder layer output at real tokens")


@pytest.mark.parametrize("dtype", DTYPES)
def test_multi_head_attention_matches_torch_multihead_attention_per_head(backend, dtype, padded_ids):
    torch.manual_seed(4)
    attention = nn.MultiheadAttention(D, H, batch_first=True).to(getattr(torch, dtype)).eval()
    with torch.no_grad():
        attention.in_proj_bias.normal_(0, 0.1)
        attention.out_proj.bias.normal_(0, 0.1)
    config = torch_transformer_config(D, H, 1, 1, F)
    params = from_torch_transformer(numpy_state(attention), config, "attention")
    src_ids, _ = padded_ids
    query, memory = hidden(B, T_TGT, D, seed=10).astype(dtype), hidden(B, T_SRC, D, seed=11).astype(dtype)
    with torch.no_grad():
        want, want_weights = attention(
            torch.from_numpy(query), torch.from_numpy(memory), torch.from_numpy(memory),
            key_padding_mask=torch.from_numpy(src_ids == 0), need_weights=True, average_attn_weights=False,
        )  # fmt: skip
    mask = (src_ids != 0)[:, None, None, :]
    got, weights = backend.call(backend.build("MultiHeadAttention", config, params), query, memory, memory, mask, True)
    assert_close(got, want.numpy(), dtype, "nn.MultiheadAttention output")
    assert_close(weights, want_weights.numpy(), dtype, "nn.MultiheadAttention per-head weights")


def test_our_weights_load_into_nn_transformer_and_back(backend, padded_ids):
    """Weights from any of our backends -> nn.Transformer (strict load) -> the same outputs -> back, exactly."""
    config = torch_transformer_config(D, H, 2, 2, F, "gelu", norm_first=True, src_vocab_size=53, tgt_vocab_size=47)
    ours = backend.impl.to_params(backend.impl.build_model(config, init_params(config, seed=9, nonzero_biases=True)))
    model = torch_transformer(True, "gelu", "float32", seed=2)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in to_torch_transformer(ours, config).items()}, strict=True)
    back = from_torch_transformer(numpy_state(model), config)
    assert all(np.array_equal(back[k], ours[k]) for k in back)
    src_ids, tgt_ids = padded_ids
    ours_mask, theirs, _, tgt_real = masks(src_ids, tgt_ids)
    src, tgt = hidden(B, T_SRC, D, seed=6).astype("float32"), hidden(B, T_TGT, D, seed=7).astype("float32")
    with torch.no_grad():
        want = model(torch.from_numpy(src), torch.from_numpy(tgt), **theirs).numpy()
    encoder = backend.build("Encoder", config, {k[8:]: v for k, v in ours.items() if k.startswith("encoder.")})
    decoder = backend.build("Decoder", config, {k[8:]: v for k, v in ours.items() if k.startswith("decoder.")})
    memory = backend.call(encoder, src, ours_mask["src"])[0]
    got = backend.call(decoder, tgt, memory, ours_mask["tgt"], ours_mask["src"])[0]
    assert_close(got[tgt_real], want[tgt_real], "float32", "our weights inside nn.Transformer")


def test_a_state_dict_of_another_shape_is_refused_naming_the_keys():
    config = torch_transformer_config(D, H, 2, 2, F)
    state = numpy_state(torch_transformer(False, "relu", "float32"))
    del state["decoder.norm.weight"]
    state["decoder.extra"] = np.zeros(1)
    with pytest.raises(
        WeightsError, match=r"missing keys \['decoder.norm.weight'\], unexpected keys \['decoder.extra'\]"
    ):
        from_torch_transformer(state, config)
