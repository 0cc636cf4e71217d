"""Solutions to chapter 8's exercises (the encoder): one function per exercise, named as the exercise."""


def encoder_layer(x, mask, parts, norm_first):
    def connection(x, sublayer, norm):
        if norm_first:
            return x + sublayer(norm(x))  # pre-norm: the residual stream is never normalised
        return norm(x + sublayer(x))  # post-norm (the paper): the sum is normalised

    h = connection(x, lambda y: parts["self_attn"](y, y, y, mask), parts["self_attn_norm"])  # (B, T, d_model)
    return connection(h, parts["ffn"], parts["ffn_norm"])  # the feed-forward network reads h


def encoder_stack(x, mask, layers, final_norm, norm_first):
    for layer in layers:
        x = layer(x, mask)  # (B, T, d_model): each layer reads the one before
    return final_norm(x) if norm_first else x  # only a pre-norm stack needs its final norm
