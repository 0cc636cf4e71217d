"""Matmul FLOPs of one forward pass: 2 * m * n * k per (m x k) @ (k x n) product.

Only matrix products count (the projections, q k^T, weights @ v, the feed-forward);
softmax, LayerNorm, GELU and the residual additions are O(B T d) and left out, so
"GFLOP/s" below means useful matmul work per second. Attention is counted over the
full T x T square, padding included, as our implementations compute it (torch's
nested-tensor fast path skips the padded rows, so it does less work than counted).
"""

from __future__ import annotations

from transformer_spec import Config


def _projection(tokens: int, d_in: int, d_out: int) -> int:
    return 2 * tokens * d_in * d_out


def attention_flops(config: Config, batch: int, t_q: int, t_k: int) -> int:
    """Multi-head attention: q from T_q tokens, k and v from T_k tokens, then w_o."""
    d = config.d_model
    projections = _projection(batch * t_q, d, d) * 2 + _projection(batch * t_k, d, d) * 2  # w_q, w_o; w_k, w_v
    # per head: (T_q x d_k) @ (d_k x T_k) and (T_q x T_k) @ (T_k x d_k); over H heads d_k * H = d
    scores_and_context = 2 * (2 * batch * t_q * t_k * d)
    return projections + scores_and_context


def feed_forward_flops(config: Config, tokens: int) -> int:
    return _projection(tokens, config.d_model, config.d_ff) + _projection(tokens, config.d_ff, config.d_model)


def encoder_flops(config: Config, batch: int, seq_len: int) -> int:
    """The encoder stack (no embeddings)."""
    layer = attention_flops(config, batch, seq_len, seq_len) + feed_forward_flops(config, batch * seq_len)
    return config.num_encoder_layers * layer


def decoder_flops(config: Config, batch: int, t_tgt: int, t_src: int) -> int:
    """The decoder stack (no embeddings, no generator): self-attention, cross-attention, feed-forward."""
    layer = attention_flops(config, batch, t_tgt, t_tgt) + feed_forward_flops(config, batch * t_tgt)
    if config.decoder_has_cross_attention:
        layer += attention_flops(config, batch, t_tgt, t_src)
    return config.num_decoder_layers * layer


def encoder_decoder_flops(config: Config, batch: int, t_src: int, t_tgt: int) -> int:
    return encoder_flops(config, batch, t_src) + decoder_flops(config, batch, t_tgt, t_src)


def bert_flops(config: Config, batch: int, seq_len: int) -> int:
    """BERT's whole forward: embeddings are lookups (no matmul); the encoder; the pooler on [CLS]."""
    return encoder_flops(config, batch, seq_len) + (
        _projection(batch, config.d_model, config.d_model) if config.pooler else 0
    )
