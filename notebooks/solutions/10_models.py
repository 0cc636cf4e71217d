"""Solutions to chapter 10's exercises (the models): one function per exercise, named as the exercise."""


def count_parameters(config):
    d = config.d_model

    def linear(d_in, d_out):
        return d_in * d_out + (d_out if config.bias else 0)  # x W + b, W stored [in, out]

    norm = 2 * d if config.bias else d  # LayerNorm: a weight, and a bias when config.bias
    attention = 4 * linear(d, d)  # w_q, w_k, w_v, w_o
    ffn = linear(d, config.d_ff) + linear(config.d_ff, d)
    positions = config.max_len * d if config.positional == "learned" else 0  # sinusoids are computed, not trained
    total = 0
    if config.kind in ("encoder_decoder", "encoder_only"):
        total += config.src_vocab_size * d + positions
        total += config.num_encoder_layers * (attention + norm + ffn + norm)
        total += norm if config.encoder_final_norm else 0  # pre-norm's final norm
    if config.kind in ("encoder_decoder", "decoder_only"):
        cross = attention + norm if config.kind == "encoder_decoder" else 0  # a decoder-only layer has none
        total += config.tgt_vocab_size * d + positions
        total += config.num_decoder_layers * (attention + norm + cross + ffn + norm)
        total += norm if config.decoder_final_norm else 0
        total += 0 if config.tie_output else linear(d, config.tgt_vocab_size)  # tied: the embedding table, reused
    return total


def tied_logits(hidden, embedding):
    return hidden @ embedding.T  # (B, T, d_model) @ (d_model, V) -> (B, T, V), no scale
