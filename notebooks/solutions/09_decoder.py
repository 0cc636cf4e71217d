"""Solutions to chapter 9's exercises (the decoder): one function per exercise, named as the exercise."""

import numpy as np


def target_mask(tgt_ids, pad_id):
    seq_len = tgt_ids.shape[1]
    keep = (tgt_ids != pad_id) | (np.arange(seq_len) == 0)  # (B, T): the start token is never hidden
    causal = np.tril(np.ones((seq_len, seq_len), dtype=bool))  # (T, T)
    return keep[:, None, None, :] & causal  # (B, 1, T, T)


def cross_attention_mask(src_ids, tgt_ids, pad_id):
    return (src_ids != pad_id)[:, None, None, :]  # (B, 1, 1, T_src): the source's padding; every query shares it


def decoder_layer(x, memory, tgt_mask, memory_mask, parts, norm_first):
    def connection(x, sublayer, norm):
        return x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))

    x = connection(x, lambda h: parts["self_attn"](h, h, h, tgt_mask), parts["self_attn_norm"])
    # queries from the decoder, keys and values from the memory as it is: (B, T_tgt, T_src) scores
    x = connection(x, lambda h: parts["cross_attn"](h, memory, memory, memory_mask), parts["cross_attn_norm"])
    return connection(x, parts["ffn"], parts["ffn_norm"])  # (B, T_tgt, d_model)
