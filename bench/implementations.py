"""Every implementation the benchmark times, each built from the same canonical weights and inputs.

A builder returns a :class:`~bench.timing.Candidate` whose ``run()`` is one forward pass
on inputs already converted to the framework's arrays (conversion is not timed) and
finished when it returns (JAX: ``block_until_ready``; torch and NumPy on the CPU are
synchronous). ``run()`` returns the (B, T, d_model) output, which ``to_numpy`` turns into
a NumPy array for the agreement check made before any timing.

Frameworks are imported inside the builders, so a missing one only skips its rows.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from transformer_spec import Config, init_params

from .timing import Candidate


@dataclasses.dataclass
class Workload:
    """One batch, as NumPy arrays; every implementation converts it for itself.

    The stacks take embedded inputs (``x`` for the encoder, ``y`` for the decoder), the
    whole models take ``ids``. Sequence 0 is full length, the others are padded after a
    random length in [3T/4, T], so every implementation gets a padding mask.
    """

    config: Config
    batch: int
    seq_len: int
    x: np.ndarray  # (B, T, d_model) float32
    y: np.ndarray  # (B, T, d_model) float32
    valid: np.ndarray  # (B, T) bool: True at real tokens
    ids: np.ndarray  # (B, T) int64, pad_id where not valid

    @property
    def src_mask(self) -> np.ndarray:
        """Ours: bool, True = may attend, (B, 1, 1, T)."""
        return self.valid[:, None, None, :]

    @property
    def tgt_mask(self) -> np.ndarray:
        """Ours, decoder self-attention: causal AND key not padding, (B, 1, T, T)."""
        causal = np.tril(np.ones((self.seq_len, self.seq_len), dtype=bool))  # (T, T)
        return self.valid[:, None, None, :] & causal[None, None]


def make_workload(config: Config, batch: int, seq_len: int, seed: int = 0, padded: bool = True) -> Workload:
    """``padded=False``: every sequence full length (the same draws otherwise)."""
    rng = np.random.default_rng(seed)
    lengths = np.full(batch, seq_len)
    lengths[1:] = rng.integers(max(1, 3 * seq_len // 4), seq_len + 1, batch - 1)
    if not padded:
        lengths[:] = seq_len
    valid = np.arange(seq_len)[None, :] < lengths[:, None]  # (B, T)
    vocab = config.src_vocab_size if config.uses_encoder else config.tgt_vocab_size
    ids = rng.integers(1, vocab, (batch, seq_len)) if vocab > 1 else np.ones((batch, seq_len), np.int64)
    ids = np.where(valid, ids, config.pad_id).astype(np.int64)
    x, y = (rng.standard_normal((batch, seq_len, config.d_model)).astype(np.float32) for _ in range(2))
    return Workload(config, batch, seq_len, x, y, valid, ids)


def encoder_params(config: Config, seed: int = 0) -> dict[str, np.ndarray]:
    return init_params(config, seed=seed, dtype="float32", component="encoder", nonzero_biases=True)


def decoder_params(config: Config, seed: int = 1) -> dict[str, np.ndarray]:
    return init_params(config, seed=seed, dtype="float32", component="decoder", nonzero_biases=True)


def to_numpy(framework: str, output: Any) -> np.ndarray:
    if framework == "torch":
        return output.detach().cpu().numpy()
    return np.asarray(output)


# ----------------------------------------------------------------------------- torch


def _torch_candidate(label: str, forward, fast_path: bool = True) -> Candidate:
    """torch, eval and ``inference_mode`` for every torch implementation alike.

    ``fast_path=False`` switches off ``torch.backends.mha``'s fast path (fused encoder
    layer, nested tensors for padded batches) for the call: nn.Transformer* then runs
    op by op, as ours does.
    """
    import torch

    def run():
        previous = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(fast_path)
        try:
            with torch.inference_mode():
                return forward()
        finally:
            torch.backends.mha.set_fastpath_enabled(previous)

    return Candidate(label, "torch", run)


def torch_ours_encoder(work: Workload, params) -> Candidate:
    import torch

    import torch_impl

    encoder = torch_impl.from_params(torch_impl.Encoder, work.config, params)
    x, mask = torch.from_numpy(work.x), torch.from_numpy(work.src_mask)
    return _torch_candidate("ours (torch)", lambda: encoder(x, mask)[0])


def _nn_encoder_layer_args(config: Config) -> dict[str, Any]:
    return dict(
        d_model=config.d_model, nhead=config.num_heads, dim_feedforward=config.d_ff, dropout=0.0,
        activation=config.activation, layer_norm_eps=config.layer_norm_eps, batch_first=True,
        norm_first=config.norm_first, bias=config.bias,
    )  # fmt: skip


def _load(module, state: dict[str, np.ndarray]):
    import torch

    module.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    return module.eval()


def torch_nn_encoder(work: Workload, params, fast_path: bool = True) -> Candidate:
    """``nn.TransformerEncoder`` with the same weights (converted by transformer_convert.torch_transformer)."""
    import torch
    from torch import nn

    from transformer_convert.torch_transformer import to_torch_transformer

    config = work.config
    if config.activation == "gelu_tanh":
        raise ValueError("nn.TransformerEncoderLayer has no tanh-approximated GELU")
    layer = nn.TransformerEncoderLayer(**_nn_encoder_layer_args(config))
    norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.encoder_final_norm else None
    encoder = nn.TransformerEncoder(layer, config.num_encoder_layers, norm=norm, enable_nested_tensor=True)
    _load(encoder, to_torch_transformer(params, config, module="encoder"))
    x, padding = torch.from_numpy(work.x), torch.from_numpy(~work.valid)  # True = masked, there
    label = "nn.TransformerEncoder" + ("" if fast_path else " (fast path off)")
    return _torch_candidate(label, lambda: encoder(x, src_key_padding_mask=padding), fast_path)


def torch_ours_encoder_decoder(work: Workload, params, decoder_weights) -> Candidate:
    import torch

    import torch_impl

    encoder = torch_impl.from_params(torch_impl.Encoder, work.config, params)
    decoder = torch_impl.from_params(torch_impl.Decoder, work.config, decoder_weights)
    x, y = torch.from_numpy(work.x), torch.from_numpy(work.y)
    src_mask, tgt_mask = torch.from_numpy(work.src_mask), torch.from_numpy(work.tgt_mask)

    def forward():
        memory = encoder(x, src_mask)[0]  # (B, T_src, d_model)
        return decoder(y, memory, tgt_mask, src_mask)[0]  # (B, T_tgt, d_model)

    return _torch_candidate("ours (torch)", forward)


def torch_nn_transformer(work: Workload, params, decoder_weights, fast_path: bool = True) -> Candidate:
    """``nn.Transformer`` (it always has final norms: the config must say so too)."""
    import torch
    from torch import nn

    from transformer_convert.torch_transformer import to_torch_transformer

    config = work.config
    args = _nn_encoder_layer_args(config)
    model = nn.Transformer(
        args.pop("d_model"), args.pop("nhead"), config.num_encoder_layers, config.num_decoder_layers, **args
    )
    weights = {f"encoder.{k}": v for k, v in params.items()} | {f"decoder.{k}": v for k, v in decoder_weights.items()}
    _load(model, to_torch_transformer(weights, config, module="transformer"))
    x, y = torch.from_numpy(work.x), torch.from_numpy(work.y)
    padding = torch.from_numpy(~work.valid)  # True = masked
    causal = nn.Transformer.generate_square_subsequent_mask(work.seq_len, dtype=torch.bool)  # True above the diagonal

    def forward():
        return model(
            x, y, tgt_mask=causal, src_key_padding_mask=padding, tgt_key_padding_mask=padding,
            memory_key_padding_mask=padding,
        )  # fmt: skip

    label = "nn.Transformer" + ("" if fast_path else " (fast path off)")
    return _torch_candidate(label, forward, fast_path)


def torch_fast_path_ops(candidate: Candidate) -> tuple[Any, list[str]]:
    """One call of ``candidate`` -> (its output, the fused / nested-tensor aten ops it ran, if any).

    Read with a ``TorchDispatchMode``, which sees every aten op as it is dispatched (and,
    unlike torch.profiler, prints nothing)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpNames(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.add(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    with OpNames() as seen:
        output = candidate.run()
    markers = ("_transformer_encoder_layer_fwd", "_native_multi_head_attention", "_nested_tensor_from_mask")
    return output, sorted(name for name in seen.names if name.startswith(markers))


# ------------------------------------------------------------------------------- jax


@functools.cache
def jax_encoder_forward():
    """One jitted function for both JAX encoders: the module is an argument (a pytree,
    its arrays traced), as jax_impl's ``compiled(model)`` does."""
    import jax

    def forward(encoder, x, mask):
        out = encoder(x, mask)
        return out[0] if isinstance(out, tuple) else out  # ours returns (x, hidden states, weights)

    return jax.jit(forward)


def _jax_candidate(label: str, module, work: Workload) -> Candidate:
    import jax.numpy as jnp

    x, mask = jnp.asarray(work.x), jnp.asarray(work.src_mask)
    forward = jax_encoder_forward()
    return Candidate(label, "jax", lambda: forward(module, x, mask).block_until_ready())


def jax_ours_encoder(work: Workload, params) -> Candidate:
    import jax_impl

    return _jax_candidate("ours (jax)", jax_impl.from_params(jax_impl.Encoder, work.config, params), work)


def jax_flax_encoder(work: Workload, params) -> Candidate:
    from .flax_encoder import flax_encoder_from_params

    return _jax_candidate("Flax NNX layers", flax_encoder_from_params(work.config, params), work)


# ----------------------------------------------------------------------------- numpy


def numpy_ours_encoder(work: Workload, params) -> Candidate:
    import numpy_impl

    encoder = numpy_impl.from_params(numpy_impl.Encoder, work.config, params)
    x, mask = work.x, work.src_mask
    return Candidate("ours (numpy)", "numpy", lambda: encoder(x, mask)[0])


# ------------------------------------------------------------------------------ BERT


def hf_bert_weights(config: Config, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A randomly initialised ``transformers.BertModel``'s weights: as our canonical weights
    (converted by transformer_convert.hf_bert) and as its own state_dict."""
    import torch
    from transformers import BertModel

    from transformer_convert.hf_bert import from_hf_bert

    torch.manual_seed(seed)
    state_dict = BertModel(_hf_config(config, "eager")).state_dict()
    state = {k: v.numpy() for k, v in state_dict.items() if not k.endswith("position_ids")}  # a buffer
    return from_hf_bert(state, config), state_dict


def _hf_config(config: Config, attn_implementation: str):
    """A new BertConfig per model: a BertModel reads its attention implementation from its
    config at every call, so two models sharing one config would share that choice."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=config.src_vocab_size, hidden_size=config.d_model, num_hidden_layers=config.num_encoder_layers,
        num_attention_heads=config.num_heads, intermediate_size=config.d_ff, hidden_act=config.activation,
        max_position_embeddings=config.max_len, type_vocab_size=config.type_vocab_size,
        layer_norm_eps=config.layer_norm_eps, pad_token_id=config.pad_id, attn_implementation=attn_implementation,
    )  # fmt: skip


def hf_bert(work: Workload, state_dict, attn_implementation: str) -> Candidate:
    """``transformers.BertModel`` with ``attn_implementation`` "eager" (softmax written out) or
    "sdpa" (``F.scaled_dot_product_attention``)."""
    import torch
    from transformers import BertModel

    model = BertModel(_hf_config(work.config, attn_implementation))
    model.load_state_dict(state_dict)
    model.eval()
    ids, attention_mask = torch.from_numpy(work.ids), torch.from_numpy(work.valid.astype(np.int64))
    forward = lambda: model(input_ids=ids, attention_mask=attention_mask).last_hidden_state
    return _torch_candidate(f"HF BertModel ({attn_implementation})", forward)


def torch_ours_bert(work: Workload, params) -> Candidate:
    import torch

    import torch_impl

    model = torch_impl.build_model(work.config, params)
    ids = torch.from_numpy(work.ids)
    return _torch_candidate("ours (torch)", lambda: model(ids).last_hidden_state)
