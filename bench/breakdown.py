"""Where the time goes: our components, one at a time, against the framework's own op.

For torch: our function or module against the torch built-in computing the same thing
(``F.gelu``, ``torch.softmax``, ``F.scaled_dot_product_attention``,
``nn.MultiheadAttention``, an ``nn.Sequential`` feed-forward). For NumPy: our NumPy
component against our torch one. Same interleaved timing as the whole-model rows; the
inputs are the shapes one encoder layer sees (q, k, v already split into heads, as
``split_heads`` leaves them: transposed views, not contiguous copies).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from transformer_spec import Config, init_params

from .timing import Budget, Candidate, Ratio, interleaved


def _inputs(config: Config, batch: int, seq_len: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    h, d_k = config.num_heads, config.d_k

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def heads(x):  # (B, T, d_model) -> (B, H, T, d_k), a transposed view as split_heads makes it
        return x.reshape(batch, seq_len, h, d_k).transpose(0, 2, 1, 3)

    valid = np.ones((batch, seq_len), dtype=bool)
    valid[1:, 3 * seq_len // 4 :] = False  # padded rows
    return {
        "x": normal(batch, seq_len, config.d_model),
        "hidden": normal(batch, seq_len, config.d_ff),
        "scores": normal(batch, h, seq_len, seq_len),
        "q": heads(normal(batch, seq_len, config.d_model)),
        "k": heads(normal(batch, seq_len, config.d_model)),
        "v": heads(normal(batch, seq_len, config.d_model)),
        "mask": valid[:, None, None, :],  # (B, 1, 1, T), True = may attend
    }


def _torch_pairs(config: Config, data: dict[str, np.ndarray]) -> list[tuple[str, Candidate, Candidate]]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import torch_impl
    from transformer_convert.torch_transformer import to_torch_transformer

    t = {name: torch.from_numpy(value) for name, value in data.items()}
    x, mask = t["x"], t["mask"]
    attention_params = init_params(config, seed=0, component="attention", nonzero_biases=True)
    ours_attention = torch_impl.from_params(torch_impl.MultiHeadAttention, config, attention_params)
    their_attention = nn.MultiheadAttention(config.d_model, config.num_heads, batch_first=True)
    their_attention.load_state_dict(
        {k: torch.from_numpy(v) for k, v in to_torch_transformer(attention_params, config, "attention").items()}
    )
    their_attention.eval()
    ffn_params = init_params(config, seed=0, component="feed_forward", nonzero_biases=True)
    ours_ffn = torch_impl.from_params(torch_impl.PositionwiseFeedForward, config, ffn_params)
    activation = nn.GELU() if config.activation == "gelu" else nn.ReLU()
    their_ffn = nn.Sequential(
        nn.Linear(config.d_model, config.d_ff), activation, nn.Linear(config.d_ff, config.d_model)
    )
    their_ffn.load_state_dict(
        {
            "0.weight": torch.from_numpy(ffn_params["w_1.weight"].T.copy()),  # torch's Linear is [out, in]
            "0.bias": torch.from_numpy(ffn_params["w_1.bias"]),
            "2.weight": torch.from_numpy(ffn_params["w_2.weight"].T.copy()),
            "2.bias": torch.from_numpy(ffn_params["w_2.bias"]),
        }
    )
    padding = ~t["mask"][:, 0, 0, :]  # (B, T), True = masked (nn.MultiheadAttention's polarity)
    q_contiguous, k_contiguous = t["q"].contiguous(), t["k"].contiguous()  # (B, H, T, d_k), heads-major in memory

    def pair(name, ours, theirs, their_label):
        def candidate(label, fn):
            def run():
                with torch.inference_mode():
                    return fn()

            return Candidate(label, "torch", run)

        return name, candidate("ours (torch)", ours), candidate(their_label, theirs)

    gelu = "GELU" if config.activation == "gelu" else "ReLU"
    ours_act, their_act = torch_impl.ACTIVATIONS[config.activation], (F.gelu if gelu == "GELU" else F.relu)
    return [
        pair(
            f"{gelu} on (B, T, d_ff)",
            lambda: ours_act(t["hidden"]),
            lambda: their_act(t["hidden"]),
            f"F.{gelu.lower()}",
        ),
        pair(
            "masked softmax on (B, H, T, T)",
            lambda: torch_impl.masked_softmax(t["scores"], mask),
            lambda: torch.softmax(t["scores"].masked_fill(~mask, -math.inf), dim=-1),
            "torch.softmax",
        ),
        pair(
            "attention core softmax(q k^T / sqrt(d_k)) v",
            lambda: torch_impl.scaled_dot_product_attention(t["q"], t["k"], t["v"], mask),
            lambda: F.scaled_dot_product_attention(t["q"], t["k"], t["v"], attn_mask=mask),
            "F.scaled_dot_product_attention",
        ),
        pair(
            "q k^T alone (q, k as split_heads leaves them)",
            lambda: t["q"] @ t["k"].transpose(-1, -2),
            lambda: q_contiguous @ k_contiguous.transpose(-1, -2),
            "the same on contiguous q, k (copied beforehand)",
        ),
        pair(
            "multi-head self-attention (B, T, d_model)",
            lambda: ours_attention(x, x, x, mask)[0],
            lambda: their_attention(x, x, x, key_padding_mask=padding, need_weights=False)[0],
            "nn.MultiheadAttention",
        ),
        pair(
            "feed-forward (B, T, d_model)",
            lambda: ours_ffn(x),
            lambda: their_ffn(x),
            "nn.Sequential(Linear, act, Linear)",
        ),
    ]


def _numpy_pairs(config: Config, data: dict[str, np.ndarray]) -> list[tuple[str, Candidate, Candidate]]:
    import torch

    import numpy_impl
    import torch_impl

    t = {name: torch.from_numpy(value) for name, value in data.items()}
    weight = (0.02 * np.random.default_rng(0).standard_normal((config.d_model, config.d_ff))).astype(np.float32)
    bias = np.zeros(config.d_ff, np.float32)
    ours_linear = numpy_impl.Linear(config.d_model, config.d_ff)
    ours_linear.weight, ours_linear.bias = weight, bias  # [in, out], as the canonical layout
    torch_linear = torch_impl.Linear(config.d_model, config.d_ff)
    with torch.no_grad():
        torch_linear.weight.copy_(torch.from_numpy(weight.T.copy()))  # nn.Linear keeps [out, in]
        torch_linear.bias.copy_(torch.from_numpy(bias))
    norm_params = init_params(config, seed=0, component="layer_norm", nonzero_biases=True)
    numpy_norm = numpy_impl.from_params(numpy_impl.LayerNorm, config, norm_params)
    torch_norm = torch_impl.from_params(torch_impl.LayerNorm, config, norm_params)
    mask = data["mask"]

    def pair(name, ours, theirs):
        def run_torch():
            with torch.inference_mode():
                return theirs()

        return name, Candidate("ours (numpy)", "numpy", ours), Candidate("ours (torch)", "torch", run_torch)

    act = config.activation
    return [
        pair("Linear (B, T, d_model) -> d_ff", lambda: ours_linear(data["x"]), lambda: torch_linear(t["x"])),
        pair(
            f"{act} on (B, T, d_ff)",
            lambda: numpy_impl.ACTIVATIONS[act](data["hidden"]),
            lambda: torch_impl.ACTIVATIONS[act](t["hidden"]),
        ),  # fmt: skip
        pair(
            "masked softmax on (B, H, T, T)",
            lambda: numpy_impl.masked_softmax(data["scores"], mask),
            lambda: torch_impl.masked_softmax(t["scores"], t["mask"]),
        ),
        pair(
            "attention core softmax(q k^T / sqrt(d_k)) v",
            lambda: numpy_impl.scaled_dot_product_attention(data["q"], data["k"], data["v"], mask),
            lambda: torch_impl.scaled_dot_product_attention(t["q"], t["k"], t["v"], t["mask"]),
        ),
        pair("LayerNorm on (B, T, d_model)", lambda: numpy_norm(data["x"]), lambda: torch_norm(t["x"])),
    ]


def breakdown_section(size: str, batch: int, seq_len: int, budget: Budget) -> list[dict[str, Any]]:
    config = Config.preset(size)
    data = _inputs(config, batch, seq_len)
    rows = []
    for section, pairs in (("torch", _torch_pairs(config, data)), ("numpy", _numpy_pairs(config, data))):
        for name, ours, theirs in pairs:
            for candidate in (ours, theirs, ours, theirs):
                candidate.run()  # warm
            times = interleaved([ours, theirs], budget)
            rows.append(
                {
                    "section": section,
                    "component": name,
                    "size": size,
                    "shape": f"{batch}x{seq_len}",
                    "ours": ours.label,
                    "theirs": theirs.label,
                    "ours_ms": 1e3 * float(np.median(times[ours.label])),
                    "theirs_ms": 1e3 * float(np.median(times[theirs.label])),
                    "ratio": Ratio.of(times[ours.label], times[theirs.label]).to_dict(),
                }
            )
    return rows
