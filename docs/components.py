"""The pages of the reference site: one per component, in the paper's order.

Each page names what to show, never the code itself: ``code`` lists ``"file.py: name, name"``
(the same file and names in ``numpy_impl/``, ``jax_impl/`` and ``torch_impl/``; one row per
name, the three backends side by side) or ``"transformer_run/train.py: name"`` (backend-neutral
code, shown once across the full width). ``docs.source`` cuts those definitions out of the
real files at build time. ``equations`` are TeX (the subset of ``docs.mathml``), ``text``
is plain prose with ``code`` in backticks, and ``tests`` are patterns (``fnmatch``) over the
test ids in ``docs/parity.json``: the parity numbers shown under the code.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Page:
    slug: str  # the file name: <slug>.html
    title: str
    summary: str  # one line, for the index
    equations: tuple[str, ...]
    text: tuple[str, ...]  # paragraphs
    code: tuple[str, ...]
    tests: tuple[str, ...] = ()
    # symbol -> why a backend has no such definition (shown in the empty cell)
    notes: dict[str, str] = field(default_factory=dict)
    parity_note: str = ""


# Backend-only helpers that belong to no page (each is one line of framework glue).
NOT_SHOWN = {
    "layers.py": {"_torch_dtype", "_filled", "_zeros"},
    "module.py": {"with_prefix"},
}

AUTOGRAD = "No counterpart: {framework} derives the backward pass from the forward one."


def is_backward(name: str) -> bool:
    """A hand-written backward pass (or its helper): NumPy's alone, the others have autograd."""
    return name.endswith("_backward")


def declared_absent(page: Page, name: str, backend: str) -> bool:
    """Whether ``backend`` may lack ``name`` (its empty cell then says why): the page's ``notes``
    give the reason, or it is a backward pass and the backend has autograd."""
    return name in page.notes or (backend != "numpy" and is_backward(name))


PAGES: tuple[Page, ...] = (
    Page(
        slug="positional",
        title="Positional encodings",
        summary="The paper's fixed sinusoids, or a learned table (BERT).",
        equations=(
            r"PE_{(\mathrm{pos},\, 2i)} = \sin\left(\mathrm{pos} / 10000^{2i / d_{\mathrm{model}}}\right)",
            r"PE_{(\mathrm{pos},\, 2i+1)} = \cos\left(\mathrm{pos} / 10000^{2i / d_{\mathrm{model}}}\right)",
        ),
        text=(
            "Attention by itself is blind to order: permute the tokens and the outputs permute with them. "
            "The paper adds a fixed table of sinusoids to the token embeddings, one frequency per pair of "
            "features, geometrically from 1 to 1/10000 (section 3.5); BERT and GPT learn one vector per position.",
            "The table is a constant, not a weight. It is computed in float64 on the host in every backend "
            "(in JAX's float32 the angle pos / 10000^(2i/d) loses ~3e-5 at position 512) and written so that an "
            "odd `d_model` works: there are ceil(d/2) sine columns but only floor(d/2) cosine columns.",
        ),
        code=(
            "positional.py: sinusoidal_table, SinusoidalPositionalEncoding, LearnedPositionalEmbedding, Buffer, _rows",
        ),
        tests=("*test_components.py::test_sinusoidal_table_matches_reference*",),
        notes={
            "Buffer": "Not needed: a plain array attribute here (torch: `register_buffer`, inside the module).",
            "_rows": "Not needed: a Python slice of the table serves every call.",
        },
    ),
    Page(
        slug="embeddings",
        title="Embeddings",
        summary="Token lookup (times sqrt(d_model)) + positions (+ token types) (-> LayerNorm).",
        equations=(
            r"x_t = E_{\mathrm{tok}}[\mathrm{id}_t] \cdot \sqrt{d_{\mathrm{model}}} + PE_t",
            r"x_t = \mathrm{LayerNorm}\left(E_{\mathrm{tok}}[\mathrm{id}_t] + E_{\mathrm{pos}}[t] + E_{\mathrm{type}}[\mathrm{type}_t]\right) \quad \text{(BERT)}",
        ),
        text=(
            "A lookup table of shape (vocab, d_model). The paper multiplies it by sqrt(d_model) (section 3.4) so "
            "that embeddings drawn with standard deviation d_model^-1/2 are not drowned by the unit-amplitude "
            "sinusoids; BERT does not scale, adds a segment (token type) embedding and normalises the sum.",
            "Every backend checks the ids before the lookup: NumPy and torch would raise on an id past the "
            "table, but JAX clamps it silently to the last row, so `check_token_ids` runs eagerly before the "
            "jitted forward pass.",
        ),
        code=("embeddings.py: TokenEmbedding, Embeddings", "checks.py: check_token_ids"),
        tests=(
            "*test_components.py::test_embeddings_match_reference*",
            "*test_components.py::test_bert_style_embeddings_with_token_types_match_reference*",
            "*test_gradients.py::test_embeddings_backward_matches_finite_differences*",
            "*test_gradients.py::test_bert_embeddings_with_token_types_and_norm_backward_matches_finite_differences*",
        ),
    ),
    Page(
        slug="attention",
        title="Scaled dot-product attention",
        summary="softmax(QK^T / sqrt(d_k)) V, with a masked softmax that never returns NaN.",
        equations=(
            r"\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V",
            r"w_{ij} = \frac{m_{ij} \exp(s_{ij} - \max_k s_{ik})}{\sum_k m_{ik} \exp(s_{ik} - \max_k s_{ik})}, \quad w_{ij} = 0 \text{ where row } i \text{ allows no key}",
        ),
        text=(
            "Each query scores every key by a dot product; the softmax of a row turns scores into weights, and "
            "the output is the weighted sum of the values. Dividing by sqrt(d_k), the per-head size, keeps the "
            "scores' variance near 1 when q and k have unit-variance entries, so the softmax does not saturate "
            "(section 3.2.1).",
            "The mask (boolean, True = may attend) sets masked scores to -inf, so their weight is exactly 0; a "
            "finite fill such as -1e9 would leave a tiny weight, and a fully masked row uniform weights over "
            "padding. A row with no allowed key is defined as all zeros, in every backend (`torch.softmax` "
            "returns NaN there). NumPy, which has no autograd, carries its backward next to each forward.",
        ),
        code=(
            "attention.py: masked_softmax, masked_softmax_backward, scaled_dot_product_attention, "
            "scaled_dot_product_attention_backward",
        ),
        tests=(
            "*test_components.py::test_scaled_dot_product_attention_matches_reference*",
            "*test_gradients.py::test_masked_softmax_backward*",
            "*test_gradients.py::test_scaled_dot_product_attention_backward*",
        ),
    ),
    Page(
        slug="tiled_attention",
        title="Tiled attention (FlashAttention)",
        summary="The same attention a block of keys at a time: a running max and sum per query row.",
        equations=(
            r"m_i \gets \max\left(m_i, \max_{j \in B} s_{ij}\right), \quad c_i = \exp(m_i^{\mathrm{old}} - m_i)",
            r"l_i \gets c_i l_i + \sum_{j \in B} \exp(s_{ij} - m_i), \quad o_i \gets c_i o_i + \sum_{j \in B} \exp(s_{ij} - m_i) v_j",
            r"\mathrm{output}_i = o_i / l_i, \quad \mathrm{logsumexp}_i = m_i + \log l_i",
        ),
        text=(
            "The plain attention makes the whole (B, H, T_q, T_k) scores, their exponentials and the weights: at "
            "8 heads and 8192 positions each is 2 GiB in float32. FlashAttention (Dao et al. 2022, Algorithm 1) "
            "reads the keys and values in blocks B of `block_size` and keeps, per query row, the largest score "
            "so far m, the sum l of exp(s - m) and the unnormalised output o. A block that raises m rescales "
            "what was summed by c = exp(m_old - m_new), so every term ends up relative to the same max; the "
            "result is the plain attention's up to rounding, with one (B, H, T_q, block_size) block in memory. "
            "The same masks; a row with no allowed key keeps m = -inf and l = 0, and gives 0.",
            "NumPy's backward is FlashAttention's: it keeps only the output and each row's logsumexp, recomputes "
            "a block's weights P = exp(s - logsumexp), and needs the softmax's inner product only per row, "
            "D = rowsum(dO * O), so that dS = P * (dP - D). NumPy's and JAX's attention kernels take this path "
            "for long sequences (see the kernels page); torch's `F.scaled_dot_product_attention` is already a "
            "flash kernel on the CPU.",
        ),
        code=("tiled_attention.py: tiled_attention, tiled_attention_backward, TiledAttention",),
        tests=(
            "*test_tiled_attention.py::*",
            "*test_gradients.py::test_tiled_attention_backward*",
        ),
    ),
    Page(
        slug="multi_head_attention",
        title="Multi-head attention",
        summary="Project, split into heads, attend, merge, project; the key/value cache for decoding.",
        equations=(
            r"\mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \ldots, \mathrm{head}_h) W^O",
            r"\mathrm{head}_i = \mathrm{Attention}(Q W_i^Q, K W_i^K, V W_i^V), \quad W_i^Q \in \mathbb{R}^{d_{\mathrm{model}} \times d_k}, \; d_k = d_{\mathrm{model}} / h",
        ),
        text=(
            "The h heads live in one (d_model, d_model) matrix per projection: project once, reshape "
            "(B, T, d_model) -> (B, T, H, d_k) and move the head axis forward -> (B, H, T, d_k), attend in every "
            "head at once, and undo the reshape before `w_o`. `MultiHeadAttentionLoop` is the tutorials' list of "
            "separate `AttentionHead` modules; given slices of the fused weights it is the same function.",
            "Weights are stored [in, out] (`x @ W`, the paper's layout) with q, k, v, o separate; torch's "
            "`nn.Linear` keeps [out, in], which `params.py` transposes. Decoding runs the same forward with "
            "a `KeyValueCache` (`cache=`, and the `position` of the first new token): each layer's projected "
            "keys and values are kept so that a step projects only its newest token, whose key and value "
            "`update` writes in; NumPy and torch grow the cache by concatenation, JAX writes into a buffer "
            "of fixed size so that one compiled step serves every position. Cross-attention passes no key "
            "and value while decoding: its cache holds the memory's, projected once.",
        ),
        code=(
            "attention.py: MultiHeadAttention, AttentionHead, MultiHeadAttentionLoop, KeyValueCache, append_to_cache",
            "layers.py: Linear, parameter",
        ),
        tests=(
            "*test_components.py::test_multi_head_attention_matches_reference*",
            "*test_components.py::test_a_loop_of_separate_heads_equals_the_fused_layer*",
            "*test_gradients.py::test_cross_attention_backward*",
            "*test_gradients.py::test_self_attention_backward*",
            "*test_gradients.py::test_linear_backward*",
        ),
    ),
    Page(
        slug="feed_forward",
        title="Position-wise feed-forward network",
        summary="Two linear maps with ReLU or GELU between, the same at every position.",
        equations=(
            r"\mathrm{FFN}(x) = \mathrm{act}(x W_1 + b_1) W_2 + b_2",
            r"\mathrm{GELU}(x) = x \Phi(x) = \frac{x}{2}\left(1 + \mathrm{erf}(x / \sqrt{2})\right) \approx \frac{x}{2}\left(1 + \tanh\left(\sqrt{2 / \pi}\,(x + 0.044715 x^3)\right)\right)",
        ),
        text=(
            "d_model -> d_ff -> d_model, applied to each position separately (section 3.3). The paper uses "
            "ReLU; BERT the exact GELU (`nn.GELU()`, `jax.nn.gelu(approximate=False)`); GPT-2 the tanh "
            "approximation, which is `jax.nn.gelu`'s default and differs from the exact one by up to ~5e-4: "
            "enough to fail a 1e-5 parity test, so every backend names both explicitly.",
        ),
        code=(
            "feed_forward.py: relu, relu_backward, gelu, gelu_backward, gelu_tanh, gelu_tanh_backward, "
            "PositionwiseFeedForward",
        ),
        tests=(
            "*test_components.py::test_activations_match_reference*",
            "*test_components.py::test_feed_forward_matches_reference*",
            "*test_gradients.py::test_activation_backward*",
            "*test_gradients.py::test_feed_forward_backward*",
        ),
    ),
    Page(
        slug="layer_norm",
        title="Layer normalisation",
        summary="(x - mean) / sqrt(var + eps) * weight + bias, over the feature axis.",
        equations=(
            r"\mathrm{LayerNorm}(x) = \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} \odot \gamma + \beta",
            r"\mu = \frac{1}{d} \sum_{i=1}^{d} x_i, \quad \sigma^2 = \frac{1}{d} \sum_{i=1}^{d} (x_i - \mu)^2",
        ),
        text=(
            "Normalise each position's feature vector to zero mean and unit variance, then scale and shift "
            "by learned per-feature weights (Ba et al., 2016). The variance is the biased one (divide by d, "
            "not d - 1) and eps sits inside the square root: what torch, Flax and BERT compute. The common "
            "hand-written `(x - mean) / (x.std() + eps)` is close, not equal.",
            "The tests feed inputs with mean 100: a one-pass variance E[x^2] - E[x]^2 loses its digits there "
            "in float32, and that is the float32 worst case of the whole suite.",
        ),
        code=("layer_norm.py: LayerNorm",),
        tests=(
            "*test_components.py::test_layer_norm_matches_reference*",
            "*test_gradients.py::test_layer_norm_backward*",
        ),
    ),
    Page(
        slug="rms_norm",
        title="RMSNorm",
        summary="x / sqrt(mean(x^2) + eps) * weight: LayerNorm without the mean or the bias (Llama).",
        equations=(r"\mathrm{RMSNorm}(x) = \frac{x}{\sqrt{\frac{1}{d} \sum_{i=1}^{d} x_i^2 + \epsilon}} \odot \gamma",),
        text=(
            "Rescale each position's feature vector to unit root-mean-square, then by learned per-feature "
            "weights (Zhang & Sennrich, 2019): no mean is subtracted and there is no bias. Llama, SmolLM2 and "
            'most modern decoders use it in place of LayerNorm (`Config(norm="rms_norm")`); eps sits inside '
            "the square root, as in LayerNorm.",
            "HF's `LlamaRMSNorm` computes in float32 whatever the model's dtype, so a float64 HF Llama is only "
            "float32-accurate there; ours computes in the input's dtype. Flax's `nnx.RMSNorm` defaults to eps "
            "1e-6 and calls its weight `scale`.",
        ),
        code=("layer_norm.py: RMSNorm, make_norm",),
        tests=("*test_modern.py::test_rms_norm*",),
    ),
    Page(
        slug="gated_feed_forward",
        title="Gated feed-forward (SwiGLU, GeGLU)",
        summary="(act(x W_gate) * (x W_up)) W_down: the gate multiplies the up projection (Llama's SwiGLU).",
        equations=(
            r"\mathrm{FFN}_{\mathrm{SwiGLU}}(x) = \left(\mathrm{SiLU}(x W_{\mathrm{gate}}) \odot x W_{\mathrm{up}}\right) W_{\mathrm{down}}",
            r"\mathrm{SiLU}(x) = x \, \sigma(x) = \frac{x}{1 + e^{-x}}",
        ),
        text=(
            "Two projections up to d_ff instead of one: the activated gate multiplies the plain up projection "
            "feature by feature, then W_down returns to d_model (Shazeer, 2020). SwiGLU with SiLU is Llama's, "
            'GeGLU with GELU falls out of the same code (`Config(gated_ffn=True, activation="silu")`). '
            "Llama's d_ff is about 8/3 d_model, so the three matrices cost what the paper's two of 4 d_model would.",
            "The backward pass: each factor of the product gets the other factor times the incoming gradient, and "
            "x, which fed both projections, gets the sum of their gradients.",
        ),
        code=("feed_forward.py: silu, silu_backward, GatedFeedForward, make_feed_forward",),
        tests=(
            "*test_modern.py::test_gated_feed_forward*",
            "*test_modern.py::test_silu*",
        ),
    ),
    Page(
        slug="rotary",
        title="Rotary position embedding (RoPE)",
        summary="Queries and keys rotated pair by pair by position-proportional angles: attention sees distances.",
        equations=(
            r"q'_{a} = q_{a} \cos m\theta_i - q_{b} \sin m\theta_i, \quad q'_{b} = q_{b} \cos m\theta_i + q_{a} \sin m\theta_i, \quad \theta_i = \mathrm{base}^{-2i/d_k}",
            r"(a, b) = (i, i + d_k/2) \ \text{(halves, HF)} \quad \text{or} \quad (2i, 2i + 1) \ \text{(interleaved, GGUF)}",
        ),
        text=(
            "Nothing is added to the embeddings: each head's query and key at position m are rotated, pair of "
            "features by pair, by angles m theta_i (Su et al., 2021). A rotation by m followed by one by -n is one "
            "by m - n, so the score of query m and key n depends on the positions only through their distance; "
            "the tests shift both positions and see the same score. A decoding step rotates its new key once, "
            "before it joins the cache, and its query at its own position. Every attention rotates its queries "
            "and keys the same way: where a model has no rotary positions (the paper's sinusoids and BERT's learned "
            "positions are added to the embeddings instead), and in every cross-attention, `NoRotation`, the "
            "identity, takes `RotaryEmbedding`'s place, so the forward has no branch for it.",
            "Which features form a pair is a convention, and two are in use: HF Llama's `rotate_half` pairs i with "
            "i + d_k/2, GGUF (llama.cpp) and GPT-J pair 2i with 2i + 1. The same model in the two layouts differs by "
            "a fixed permutation of each head's q and k projection columns (`transformer_convert.rope`); loading GGUF "
            "weights into the halves layout without it runs, and writes fluent nonsense. SmolLM2 uses theta = 1e5.",
        ),
        code=(
            "positional.py: rotary_tables, rotate_pairs, RotaryEmbedding",
            "attention.py: NoRotation",
            "transformer_convert/rope.py: halves_to_interleaved_order, halves_to_interleaved, interleaved_to_halves, convert_rope_layout",
        ),
        tests=(
            "*test_modern.py::test_rotary*",
            "*test_modern.py::test_the_two_rope_layouts*",
        ),
    ),
    Page(
        slug="grouped_query_attention",
        title="Grouped-query attention",
        summary="Fewer key/value heads than query heads, each shared by a group: a smaller key/value cache.",
        equations=(
            r"\mathrm{head}_h = \mathrm{Attention}\left(Q_h,\ K_{\lfloor h / g \rfloor},\ V_{\lfloor h / g \rfloor}\right), \quad g = H / H_{kv}",
        ),
        text=(
            "Keys and values get H_kv heads instead of H (Ainslie et al., 2023); query head h reads key/value head "
            "floor(h / g). `num_kv_heads=1` is multi-query attention. SmolLM2 has 9 query heads and 3 key/value "
            "heads, so its decoding cache is a third of multi-head attention's: the cache keeps the H_kv heads, and "
            "`repeat_kv` expands them only inside the attention.",
            "The order matters: `repeat` (0, 0, 0, 1, 1, 1, ...) is the model; `tile` (0, 1, 2, 0, 1, 2, ...) "
            "runs and gives nonsense with real weights. NumPy's backward sums the gradients of each group back "
            "onto its key/value head; torch's fused kernel passes `enable_gqa=True` to its attention kernel, "
            "which reads the shared heads without copying them.",
        ),
        code=("attention.py: repeat_kv, repeat_kv_backward",),
        tests=(
            "*test_modern.py::test_grouped_query*",
            "*test_modern.py::test_rotary_cache_holds_kv_heads*",
        ),
    ),
    Page(
        slug="sublayer",
        title="Residual sub-layer connection",
        summary="Post-norm (the paper) or pre-norm, written once and used by every layer.",
        equations=(
            r"x \gets \mathrm{LayerNorm}\left(x + \mathrm{Sublayer}(x)\right) \quad \text{(post-norm, the paper)}",
            r"x \gets x + \mathrm{Sublayer}\left(\mathrm{LayerNorm}(x)\right) \quad \text{(pre-norm)}",
        ),
        text=(
            "Every attention and feed-forward sub-layer sits inside the same wrapper (section 5.4). Pre-norm keeps an "
            "un-normalised residual path from input to output, which trains deep stacks without warm-up, but "
            "then the stack needs a final LayerNorm (`encoder_final_norm`).",
            "`sublayer` returns (output, extra), the extra being attention weights or None, so that one function "
            "serves attention and feed-forward alike. The parity numbers below are the encoder and decoder "
            "layers', which use it in both norm placements.",
        ),
        code=("sublayer.py: sublayer_connection, sublayer_connection_backward",),
        tests=(
            "*test_components.py::test_encoder_layer_matches_reference*",
            "*test_components.py::test_decoder_layer_matches_reference*",
        ),
    ),
    Page(
        slug="dropout",
        title="Dropout",
        summary="Inverted dropout at four places; train() / eval(); one seed for every mask.",
        equations=(
            r"\mathrm{Dropout}_p(x) = \frac{m \odot x}{1 - p}, \quad m_i \sim \mathrm{Bernoulli}(1 - p) \quad \text{(training mode; the identity in inference mode)}",
        ),
        text=(
            "The paper applies dropout to each sub-layer's output before the residual addition and to the sum "
            "of the embeddings and the positional encodings (section 5.4); its reference code, like torch and "
            "BERT, also to the attention weights and to the feed-forward network's hidden layer. "
            "`config.dropout` sets the one rate, 0 by default. Kept elements are scaled by 1 / (1 - p) during training, so that inference needs no "
            "rescaling. `model.train()` and `model.eval()` switch it as in torch and NNX.",
            "The masks are seeded per backend: NumPy gives each Dropout its own generator spawned from one "
            "seed; JAX an `nnx.RngStream` forked from one seed, whose counter is state that plain `jax.jit` "
            "would drop (so the model switches to `nnx.jit` while dropout is active); torch draws every mask "
            "from its global generator. The masks differ between backends; their statistics do not.",
        ),
        code=(
            "layers.py: Dropout, seed_dropout, dropout_active",
            "module.py: Module, enable_grad, is_grad_enabled, named_submodules",
        ),
        tests=("*test_dropout.py::*",),
        notes={
            "Module": "Not needed: `nn.Module` and `nnx.Module` bring `train()` and `eval()`.",
            "named_submodules": "Not needed: the framework walks its own module tree "
            "(`nn.Module.named_modules`, `nnx.iter_graph`).",
            "dropout_active": "Not needed: only JAX chooses between two ways of compiling the forward pass.",
            "enable_grad": "Not needed: torch's autograd records the graph whenever gradients are enabled "
            "(`torch.enable_grad`, on by default); NumPy's forward keeps what its backward needs only inside "
            "`enable_grad()`, so inference keeps nothing.",
            "is_grad_enabled": "Not needed: `torch.is_grad_enabled()`; JAX traces `jax.grad` instead.",
        },
    ),
    Page(
        slug="masks",
        title="Masks",
        summary="Boolean, True = may attend, 4-D: padding, causal, and their combination.",
        equations=(r"\mathrm{mask}_{b,\,1,\,i,\,j} = [\mathrm{ids}_{b,j} \ne \mathrm{pad}] \land [j \le i]",),
        text=(
            "Masks are boolean with True meaning may attend, shaped to broadcast against the scores "
            "(B, H, T_q, T_k): padding masks are (B, 1, 1, T_k), the causal mask (1, 1, T, T). They must be "
            "exactly 4-D: a (B, T) mask would broadcast silently wrong when B == T_q. torch's "
            "`nn.MultiheadAttention` reads True as masked; we follow `F.scaled_dot_product_attention` and Flax.",
            "The cross-attention mask hides the source padding: its last axis is the source length, not the "
            "target length (the mismatch on which the from-scratch tutorial's decoder stopped).",
        ),
        code=(
            "masks.py: make_padding_mask, make_causal_mask, make_decoder_mask, make_target_mask, make_cross_attention_mask",
            "checks.py: check_mask",
        ),
        parity_note=(
            "Masks are booleans and are compared exactly (test_attention_properties.py::"
            "test_causal_mask_is_lower_triangular_and_padding_mask_hides_pad_keys); every attention test above "
            "runs through them."
        ),
    ),
    Page(
        slug="encoder",
        title="Encoder layer and stack",
        summary="Self-attention, then feed-forward, each in a residual connection; N layers.",
        equations=(
            r"x \gets \mathrm{SublayerConnection}\left(x, \; h \mapsto \mathrm{MultiHead}(h, h, h, \mathrm{src\_mask})\right)",
            r"x \gets \mathrm{SublayerConnection}\left(x, \; \mathrm{FFN}\right), \quad \text{repeated } N \text{ times}",
        ),
        text=(
            "The left half of the paper's figure 1 (section 3.1): each layer lets every position attend to "
            "every non-pad position of the same sequence, then transforms each position on its own. The stack "
            "returns the final output (the decoder's `memory`), and on request every hidden state (the "
            "embedding output plus each layer's output) and every layer's per-head attention weights.",
        ),
        code=("encoder.py: EncoderLayer, Encoder",),
        tests=(
            "*test_components.py::test_encoder_layer_matches_reference*",
            "*test_components.py::test_encoder_and_decoder_stacks_match_reference*",
            "*test_gradients.py::test_encoder_layer_backward*",
        ),
    ),
    Page(
        slug="decoder",
        title="Decoder layer and stack",
        summary="Masked self-attention, cross-attention over the memory, feed-forward; N layers.",
        equations=(
            r"x \gets \mathrm{SublayerConnection}\left(x, \; h \mapsto \mathrm{MultiHead}(h, h, h, \mathrm{tgt\_mask})\right)",
            r"x \gets \mathrm{SublayerConnection}\left(x, \; h \mapsto \mathrm{MultiHead}(h, \mathrm{memory}, \mathrm{memory}, \mathrm{memory\_mask})\right)",
            r"x \gets \mathrm{SublayerConnection}\left(x, \; \mathrm{FFN}\right)",
        ),
        text=(
            "The right half of figure 1. The self-attention is causal (position i sees 0..i), so the model "
            "can be trained on whole sequences at once and still predict each token from its past only; the "
            "cross-attention takes its queries from the decoder and its keys and values from the encoder's "
            "output. A decoder-only language model (GPT, the LLM notes' tiny model) is the same stack without "
            "cross-attention.",
            "`LayerCache` holds a layer's self-attention keys and values of every token fed so far and the "
            "memory's, projected once, for incremental decoding.",
        ),
        code=("decoder.py: DecoderLayer, LayerCache, _check_memory, Decoder",),
        tests=(
            "*test_components.py::test_decoder_layer_matches_reference*",
            "*test_components.py::test_encoder_and_decoder_stacks_match_reference*",
            "*test_gradients.py::test_decoder_layer_backward*",
        ),
    ),
    Page(
        slug="models",
        title="The models",
        summary="Transformer (encoder-decoder), TransformerLM (decoder-only), TransformerEncoderModel (BERT).",
        equations=(
            r"p(y_t \mid y_{<t}, x) = \mathrm{softmax}\left(h_t W_{\mathrm{out}}\right), \quad W_{\mathrm{out}} = E_{\mathrm{tgt}}^\top \text{ when tied}",
            r"\mathrm{pooler}(h) = \tanh\left(h_{[\mathrm{CLS}]} W + b\right)",
        ),
        text=(
            "Three assemblies of the same parts. `Transformer` is the paper's: source ids -> encoder -> memory; "
            "target ids (shifted right) + memory -> decoder -> `Generator`, the projection to the vocabulary, "
            "which with `tie_output` reuses the target embedding table (section 3.4); `share_embeddings` "
            "makes the source embedding read that same table too (one vocabulary for both sides), so that "
            "with both switches one matrix serves all three uses, as in the paper. `TransformerLM` is a "
            "decoder without cross-attention; `TransformerEncoderModel` is BERT, with its `Pooler`.",
            "Masks left as None are built from the ids and `config.pad_id`. Every model returns a `ModelOutput` "
            "with the logits or last hidden state and, on request, every hidden state and attention map. JAX "
            "compiles from outside the model, as Flax's own examples do: `compiled(model)` checks the inputs "
            "eagerly, then runs the whole forward pass as one `jax.jit` program (`_run`); the module is a pytree "
            "whose arrays are traced and whose config is static. torch's `compiled(model)` checks the same way, "
            "then runs the forward pass through `torch.compile` (eager stays torch's default: compiling takes "
            "tens of seconds on a CPU); NumPy's is the model itself, so one caller serves every backend. Every "
            "model checks its inputs in the first line of "
            "its forward (`check_inputs`), which reads lists, tuples and other frameworks' arrays as "
            "`np.asarray` does (`readable`), checks them, and returns them as its own arrays (`to_backend`, "
            "`token_ids`, `attention_mask`): ids of every integer dtype, refused when ragged. Each component "
            "checks its own inputs' shapes and dtypes in the first line of its forward, so that one used on "
            "its own refuses bad input with the same message: its float inputs must share its weights' dtype "
            "(`check_float_inputs`, `weights_dtype`).",
        ),
        code=(
            "model.py: Generator, Transformer, TransformerLM, Pooler, TransformerEncoderModel",
            "compiled.py: _run, compiled, _loss, _compiled_loss, compiled_train_step, compile_layers",
            "checks.py: readable, to_backend, device_of, token_ids, attention_mask, check_float_inputs, weights_dtype",
        ),
        tests=("*test_models.py::*",),
        notes={
            "_run": "Not needed: runs eagerly, op by op.",
            "_loss": "Not needed: JAX compiles its whole training step (train.py's _update); NumPy has no compiler.",
            "_compiled_loss": "Not needed: `jax.jit` is cheap to import; torch.compile imports TorchDynamo (seconds), "
            "so torch compiles `_loss` on first use.",
            "compiled_train_step": "Not needed: JAX's train_step is always jit-compiled; NumPy has no compiler.",
            "compile_layers": "Not needed: JAX's decoding steps are always jit-compiled (generate.py); NumPy has "
            "no compiler.",
            "device_of": "Not needed: NumPy has one device, and JAX puts new arrays on its default device.",
        },
    ),
    Page(
        slug="weights",
        title="Weights: one flat dict, loaded into every backend",
        summary="from_params / to_params: canonical names and the [in, out] layout, mapped to each framework.",
        equations=(r"y = x W + b, \quad W \in \mathbb{R}^{d_{\mathrm{in}} \times d_{\mathrm{out}}}",),
        text=(
            "Weights are a flat dict from canonical names (the modules' attribute paths, "
            "`encoder.layers.0.self_attn.w_q.weight`) to arrays in the paper's layout, defined once by "
            "`transformer_spec.param_schema`. `params.py` maps that onto each framework and does nothing "
            "else: torch's `nn.Linear` stores [out, in], Flax's `nnx.Linear` calls the matrix `kernel`. "
            "`to_params(from_params(p)) == p` exactly; missing, unexpected or mis-shaped keys raise "
            "`WeightsError` naming each key and both shapes.",
        ),
        code=(
            "params.py: from_params, to_params, build_model, load_model, _to_torch_layout, _to_flax_name, _check_x64",
            "transformer_spec/schema.py: parent_of",
            "transformer_spec/io.py: check_weights_to_load",
        ),
        notes={
            "_to_torch_layout": "Not needed: the arrays are used in the paper's [in, out] layout as they are.",
            "_to_flax_name": "Not needed: the matrix is called `weight`, as its canonical name says.",
            "_check_x64": "Not needed: float64 is always available.",
        },
        parity_note=(
            "Every parity test loads the same float64 weights into each backend through these functions; "
            "the round trip is exact (test_params.py)."
        ),
    ),
    Page(
        slug="loss",
        title="Loss: cross-entropy with padding and label smoothing",
        summary="Mean token cross-entropy over non-pad targets; torch's and optax's definition of smoothing.",
        equations=(
            r"\mathrm{loss}_t = (1 - \epsilon)\,\left(-\log p_{y_t}\right) + \epsilon \cdot \frac{1}{V} \sum_{v=1}^{V} \left(-\log p_v\right)",
            r"\mathrm{loss} = \frac{1}{|\{t : y_t \ne \mathrm{pad}\}|} \sum_{t : y_t \ne \mathrm{pad}} \mathrm{loss}_t",
        ),
        text=(
            "The cross-entropy against the smoothed distribution (1 - eps) onehot(y) + eps / V, where eps / V "
            "covers the whole vocabulary, the target and the padding id included: what "
            "`F.cross_entropy(label_smoothing=eps)` and `optax.smooth_labels` compute (the paper's reference "
            "code spreads eps over V - 2 classes instead). Padding targets do not count, and a batch with no "
            "real target has loss 0, not 0 / 0. Its gradient with respect to the logits is (p - q) / count.",
        ),
        code=("loss.py: cross_entropy, cross_entropy_backward",),
        tests=("*test_gradients.py::test_cross_entropy*",),
    ),
    Page(
        slug="training",
        title="Training step and optimiser",
        summary="loss_and_grads, Adam written out / torch.optim.Adam / optax, the paper's warm-up schedule.",
        equations=(
            r"m \gets \beta_1 m + (1 - \beta_1)\, g, \quad v \gets \beta_2 v + (1 - \beta_2)\, g^2",
            r"p \gets p - \mathrm{lr}_t \frac{m / (1 - \beta_1^t)}{\sqrt{v / (1 - \beta_2^t)} + \epsilon}, \quad \mathrm{lr}_t = d_{\mathrm{model}}^{-0.5} \cdot \min\left(t^{-0.5}, \; t \cdot \mathrm{warmup}^{-1.5}\right)",
        ),
        text=(
            "One step is: the loss of a batch and its gradient with respect to every parameter, then an Adam "
            "update (section 5.3: beta1 0.9, beta2 0.98, eps 1e-9). NumPy runs its hand-written backward "
            "module by module (llm.c style); torch uses `torch.autograd`, JAX `nnx.value_and_grad` inside "
            "one jitted update. All three are driven by one Python schedule and one loop from "
            "`transformer_spec`, so their float64 loss curves agree step by step.",
        ),
        code=(
            "gradients.py: loss_and_grads",
            "optim.py: Adam, _adam",
            "train.py: _update, train_step, _cached_update, train",
            "transformer_run/train.py: train_loop, TrainingState",
            "train.py: training_state, restore_training_state, _adam_moments, _set_adam_moments, "
            "_adam_moment_variables, _set_adam_step, dropout_streams, set_dropout_streams",
            "transformer_run/schedules.py: warmup_schedule",
            "transformer_run/data_parallel.py: shard, shard_weights",
            "data_parallel.py: data_parallel_loss_and_grads, data_parallel_train, _replica_sum, data_parallel_mesh, "
            "shard_batch, replicate, gather, data_parallel_train_step, _train_replica, _loss_and_grads_replica, "
            "_run, _process_group_backend, _spawn, _replica",
        ),
        tests=(
            "*test_data_parallel.py::*",
            "*test_gradients.py::test_loss_and_gradients_match_reference*",
            "*test_gradients.py::test_fully_masked_attention_rows_*",
            "*test_gradients.py::test_model_loss_gradients_match_finite_differences*",
        ),
        notes={
            "_update": "Not needed: eager code needs no separately compiled update.",
            "_adam": "Not needed: torch's and NumPy's Adam compile nothing; a new one per run costs nothing.",
            "_cached_update": "Not needed: nothing walks the module graph on each step.",
            "_adam_moment_variables": "Not needed: the moments are found by the parameter (torch) or by "
            "the canonical name (NumPy's own Adam), not by a path through optax's state.",
            "_replica_sum": "Not needed: the replicas are real (processes, devices) and their framework adds "
            "the gradients (DDP's all-reduce, GSPMD's).",
            "data_parallel_mesh": "Not needed: no device mesh (torch: one process per replica; NumPy: shards in turn).",
            "shard_batch": "Not needed: each replica slices its own rows (transformer_run.data_parallel.shard).",
            "replicate": "Not needed: DDP broadcasts rank 0's weights; NumPy has one model.",
            "gather": "Not needed: the weights never left this device.",
            "data_parallel_train_step": "Not needed: JAX's step is train.py's own on a sharded batch; NumPy's "
            "is an inner function of data_parallel_train.",
            "_train_replica": "Not needed: no processes to start.",
            "_loss_and_grads_replica": "Not needed: no processes to start.",
            "_run": "Not needed: no processes to join or start.",
            "_process_group_backend": "Not needed: no process group.",
            "_spawn": "Not needed: no processes to start.",
            "_replica": "Not needed: no processes to start.",
        },
    ),
    Page(
        slug="mixed-precision",
        title="bf16 mixed precision",
        summary="float32 master weights, bf16 compute: torch.autocast, Flax's compute dtype, NumPy emulating both.",
        equations=(
            r"\mathrm{bf16}(x) = \mathrm{round}_{8\,\mathrm{bits}}(x), \quad "
            r"\frac{\lVert y_{\mathrm{bf16}} - y_{\mathrm{fp32}} \rVert}{\lVert y_{\mathrm{fp32}} \rVert} \le \mathrm{budget}",
        ),
        text=(
            "The weights, the gradients that reach Adam and Adam's moments stay float32; the passes run partly "
            "in bfloat16 (8 bits of mantissa, 3 significant digits). *Which* parts is each framework's own "
            "policy. torch's `torch.autocast` casts the inputs of each matmul and `nn.Linear` to bf16 and "
            "returns bf16; every other op runs in the dtype its inputs promote to, so the embeddings, the norms "
            "and the residual stream stay float32 (on CUDA softmax and layer_norm are forced to float32 too; "
            "on CPU they are not). Flax has no autocast: a module's `dtype` is the dtype it computes in, apart "
            "from `param_dtype`. JAX here makes, inside the jitted step, a copy of the model whose parameters "
            "and buffers are cast to bf16 and whose `nnx.Linear` layers compute in bf16: the whole forward, "
            "residual stream included, runs in bf16, and `jax.grad` carries the gradient back through the "
            "casts to the float32 weights.",
            "NumPy has neither. `ml_dtypes` gives it a bfloat16 dtype but NumPy's own promotion (bf16 @ bf16 "
            "is float32, bf16 * 2.0 is float32). So the NumPy model's weights are swapped, for one pass, for "
            "views of `Bf16Compute`, an array whose every op computes in float32 and rounds to the dtype torch "
            "and JAX give it: the same forward and hand-written backward text, emulating either policy. Its "
            "elementwise ops and reductions equal torch's bit for bit.",
            "In every backend the loss is computed in float32, from the logits cast to float32. bf16 cannot be "
            "equal across frameworks bit for bit (XLA fuses elementwise chains, oneDNN blocks its sums), so it "
            "is held to error budgets, norm-wise: the logits, the whole gradient and a bf16 training curve "
            "against float32, and the backends against each other. And to a floor it cannot beat: every "
            "policy multiplies by bf16 weights, and rounding the weights alone (everything else in float64) "
            "moves the post-norm encoder-decoder's gradient by 2.6e-2, so each bf16 run is held to a few "
            "times that rounding floor.",
        ),
        code=(
            "transformer_run/mixed_precision.py: POLICIES, OPS, BUDGET, relative_error, gradients_error",
            "mixed_precision.py: compute_in_bf16, in_compute_dtype, keep_random_streams, Bf16Compute, _plain, "
            "_result_dtype, _in_float32, _wrap, _float_arrays, _check",
            "mixed_precision.py: mixed_precision_logits, _logits, mixed_precision_loss_and_grads, _loss_and_grads",
        ),
        tests=("*test_mixed_precision.py::*",),
        notes={
            "compute_in_bf16": "Not needed: JAX's copy is made inside the jitted step (in_compute_dtype).",
            "in_compute_dtype": "Not needed: torch.autocast (torch) and the weights swapped in place (NumPy).",
            "keep_random_streams": "Not needed: the model itself runs, its dropout streams advance as they do.",
            "Bf16Compute": "Not needed: the framework has bf16 arithmetic of its own.",
            "_plain": "Not needed: no emulation.",
            "_result_dtype": "Not needed: the framework promotes.",
            "_in_float32": "Not needed: no emulation.",
            "_wrap": "Not needed: no emulation.",
            "_float_arrays": "Not needed: the framework finds its parameters.",
            "_check": "Not needed: checked in compute_in_bf16.",
            "_logits": "Not needed: nothing to compile.",
            "_loss_and_grads": "Not needed: nothing to compile.",
        },
    ),
    Page(
        slug="sharding",
        title="Sharding: FSDP and tensor parallelism",
        summary="One model over many devices: weights split by FSDP and by Megatron's column/row blocks, "
        "every collective of a step written out in NumPy.",
        equations=(
            r"Y = \mathrm{act}(X A)\, B = \sum_{t=1}^{K} \mathrm{act}(X A_t)\, B_t",
            r"M_{\mathrm{device}} \approx \frac{4 P}{N} + 2 P_{\mathrm{layer}} + 2 P_{\mathrm{rest}}",
        ),
        text=(
            "A plan (`transformer_run.sharding.Plan`) has three degrees on a mesh of two axes: `data` "
            "(data_parallel or fsdp devices, each on its own rows of the batch) and `model` (tensor_parallel "
            "devices, each on its own heads and its own slice of d_ff). `check_plan` refuses, before anything "
            "starts, a degree that does not divide what it splits (the heads, the key/value heads, d_ff, a "
            "weight's dimension such as the vocabulary, the batch), in one line naming both numbers.",
            "Tensor parallelism (Megatron) splits the matrix that opens a block by columns (w_q, w_k, w_v; w_1 "
            "or w_gate and w_up) and the one that closes it by rows (w_o; w_2 or w_down), so that each device "
            "computes its own heads, or its own hidden features, from the whole input, and one all-reduce adds "
            "the partial outputs: the sum above, A_t the columns and B_t the rows of device t. In the backward "
            "pass one all-reduce adds the devices' parts of the block's input gradient. Key/value heads are "
            "split in order like the query heads, so grouped-query attention keeps each group on one device. "
            "Norms, embeddings and the output projection stay whole on every model device.",
            "FSDP keeps 1/N of every weight, of its gradient and of both Adam moments on each device. Before a "
            "layer runs, the devices all-gather its weights, drop them after its forward, all-gather them again "
            "for its backward, and reduce-scatter its gradients; the rest of the model (embeddings, final norm, "
            "output projection) is gathered once for the step. Adam works element by element, so each device "
            "updating its own pieces is the whole update. A device's peak (above, in bytes: P the weights', "
            "counted four times for the weights, gradients and two moments) is its 1/N of everything plus the "
            "whole weights and gradients of one layer and of the rest: with 12 layers at N = 4, 0.28 of one "
            "device.",
            "NumPy runs every device in one process, a thread per data rank, and writes each collective as a "
            "function over the list of the devices' arrays (`all_gather`, `reduce_scatter`, `all_reduce`), "
            "counted per step (`step_collectives`): the reference the engines' counts are held to. torch runs "
            "one process per device (`fully_shard`, `parallelize_module` on a `DeviceMesh`); JAX places each "
            "weight with a `NamedSharding` and lets the compiler insert the collectives.",
            "Dropout: every device draws the one device's mask of the whole activation, from the one device's "
            "stream where it stands, and keeps its own part (`WholeMaskDropout`, wrapped around each Dropout from "
            "outside): its rows, and inside a tensor-parallel block its heads of the attention weights or its "
            "hidden features. So a sharded run with dropout is the single-device run with the same seed, in every "
            "backend, and a checkpoint's dropout streams are one device's. The price is random numbers: each "
            "device draws all that one device draws (`step_dropout_draws`): on the paper's base model, 4 times "
            "its share under FSDP 4, 2 under tensor parallel 4, 3 under FSDP 2 x TP 2.",
            "The engines do not run NumPy's collectives one for one, and the suite holds each difference to its "
            "reason. torch runs NumPy's exactly, in count and bytes: FSDP's all-gathers and reduce-scatters, and "
            "Megatron's all-reduces, once `BlockInput` makes each distinct input of a block one DTensor (alone, "
            "`ColwiseParallel` makes each column-split matrix's input its own and all-reduces each part of its "
            "gradient: q, k and v, three where Megatron adds the parts and all-reduces once). JAX runs each "
            "tensor-parallel block in `shard_map` (`TensorParallelBlock`: the block's own code on each device's "
            "shards, `pcast` at the entrance and `psum` at the exit), so its all-reduces are Megatron's too; "
            "left to GSPMD, it all-reduced each projection's part. JAX's FSDP and data parallel are written out "
            "as NumPy's are: the step in `shard_map` over the mesh (`data_sharded_loss`), each device on its "
            "rows and its pieces, each unit's pieces in one flat buffer (`gather_unit`: under FSDP one "
            "all-gather, whose transpose JAX derives as one reduce-scatter; under data parallel its transpose "
            "is one all-reduce), each layer wrapped from outside as `fully_shard` wraps it "
            "(`ShardedLayer`: gathered when it runs and, through `jax.checkpoint`, again when the backward "
            "reaches it), so FSDP alone runs NumPy's collectives exactly, count and bytes. With tensor parallel "
            "a layer's pieces travel in two buffers, those split over `model` and those whole along it: in "
            "`shard_map` an array is the same on every device of an axis or not, and one buffer would make the "
            "norms' weights each device's own. Left to GSPMD, FSDP did not gather the weights at all (it split "
            "d_model over `data` and moved the activations with all-to-alls: right numbers, not FSDP); asked "
            "for each layer's weights whole, it gathered per tensor and, on the CPU, all-reduced each gradient "
            "whole and sliced it, with no reduce-scatter; data parallel's gradients it all-reduced tensor by "
            "tensor.",
            "Checkpoints: each device writes its own shards in its framework's own format "
            "(`torch.distributed.checkpoint`, Orbax, NumPy's file per device), into `step-N.partial`, committed "
            "by one rename once all have written (`transformer_run.sharded_checkpoint`); each framework reads a "
            "checkpoint saved under any plan into its own plan's shards, and `consolidate` makes one file "
            "every backend resumes. No device holds more while saving than its own shards and the file's "
            "bookkeeping.",
            "Memory per device under FSDP over 4 devices, against one device's weights, gradients and Adam "
            "moments: NumPy's peak, with one layer's weights and gradients gathered, is 0.28 at 12 layers; "
            "torch's fullest rank at the peak of a step on 12 layers at d_model 576, float32, measured by torch's "
            "own `FSDPMemTracker` (`step_memory`): 0.26 in weights, gradients, moments and FSDP's buffers, "
            "0.39 with the activations and temporaries; for JAX, everything XLA "
            "allocates for one device's step (`step_memory`: arguments, outputs and temporaries, activations "
            "included) is 0.25 of one device on 12 layers at d_model 576, float32 (at d_model 72 XLA's fixed "
            "temporaries are a larger share: 0.43). The step donates the weights and moments, so that they "
            "are updated in place (without, the updated ones are a second copy), and takes three options "
            "of XLA's CPU compiler (`COMPILER_OPTIONS`): without them its common-subexpression pass merges "
            "each layer's second gather into its first (0.48: every layer's whole weights kept from the "
            "forward to the backward), its schedule runs independent work early, and its combiner packs data "
            "parallel's all-reduces into one.",
        ),
        code=(
            "transformer_run/sharding.py: Plan, placement, check_plan, fsdp_units, piece, join",
            "sharding.py: sharded_train, sharded_loss_and_grads, step_collectives",
            "sharding.py: all_gather, reduce_scatter, all_reduce, _add_up, CollectiveLog",
            "sharding.py: TensorParallelAttention, TensorParallelFeedForward, local_attention, local_feed_forward",
            "sharding.py: WholeMaskDropout, keep_own_parts, keep_own_heads_or_features, step_dropout_draws",
            "sharding.py: Device, ShardedUnit, DataAxis, Replica, ShardedRun, load_whole",
            "sharding.py: sharding_mesh, shard_model, weight_spec, weight_shardings, tensor_parallel_plan, "
            "_fsdp_dim, shard_optimizer, shard_batch, _keys, _canonical, _parameter_names, _device, _layers",
            "sharding.py: gather_unit, _keep_all_but_moves, ShardedLayer, _stacks, wrap_units, "
            "data_sharded_loss, _loss, "
            "_sharded_update, _sharded_loss_and_grads, _compile, _signature, _compiled_step, "
            "_checked, _rows, gather, sharded_train_step, sharded_backward, _sum_over, whole, sharded_logits",
            "sharding.py: _put, _placed",
            "distributed.py: from_environment, initialize, free_port, _process, launch, _context, _launch_once, _same, "
            "place, "
            "replicated, local",
            "sharded_checkpoint.py: save, restore, restore_moments, whole_tensors",
            "sharded_checkpoint.py: device_file, writers, device_tensors, whole_tensor, _transposed, state_dict, "
            "_state_path, _weight_variable, _variables, _metadata, _check_shapes",
            "sharding.py: _save_sharded",
            "sharding.py: _check_devices, _setup, _quiet, _loss_and_grads_rank, _logits_rank, _collectives_rank, "
            "_train_rank",
            "sharding.py: hlo_collectives, _group_size, step_program, step_memory, CollectiveCounter, "
            "_whole_buffer_bytes, _nbytes, _memory_rank",
            "sharding.py: TensorParallelBlock, BlockInput, _closing_linear, _drops, tensor_parallel_blocks, "
            "tensor_parallel_block",
        ),
        tests=("*sharding*",),
        notes={
            # placing the weights on the devices
            "sharding_mesh": "No counterpart: NumPy's devices are simulated in one process, with no mesh.",
            "shard_model": "No counterpart: NumPy cuts each device's pieces itself (piece, in the plan).",
            "weight_spec": "No counterpart: torch says the split per module (tensor_parallel_plan, _fsdp_dim); "
            "NumPy cuts its pieces itself.",
            "weight_shardings": "No counterpart: as weight_spec.",
            "tensor_parallel_plan": "No counterpart: JAX names each weight's PartitionSpec (weight_spec); NumPy "
            "builds its tensor-parallel blocks itself.",
            "_fsdp_dim": "No counterpart: JAX's PartitionSpec names the dimension (weight_spec); NumPy's plan does.",
            "shard_optimizer": "No counterpart: torch's Adam follows its DTensor weights; NumPy's runs on each "
            "device's pieces.",
            "shard_batch": "No counterpart: each torch process and NumPy data rank takes its own rows.",
            "_keys": "No counterpart: torch's modules are named by their paths; NumPy's by the schema.",
            "_canonical": "No counterpart: as _keys.",
            "_parameter_names": "No counterpart: JAX finds names by the state's paths (_canonical).",
            "_device": "No counterpart: JAX's mesh names its devices; NumPy has one.",
            "_layers": "No counterpart: JAX lets the compiler place each layer's collectives; NumPy lists its "
            "FSDP units in the plan (fsdp_units).",
            # the step
            "gather_unit": "torch: fully_shard's all-gather of a layer's flat buffer (torch's own); NumPy: "
            "Replica.gather.",
            "_keep_all_but_moves": "No counterpart: torch's FSDP frees a layer's gathered weights after its "
            "forward and gathers them again before its backward itself; NumPy's ShardedUnit does.",
            "ShardedLayer": "torch: fully_shard (torch's own, applied per layer); NumPy: ShardedUnit.",
            # dropout: every device draws the one device's masks and keeps its part
            "keep_own_parts": "JAX: wrap_units (the rows, inside the step's shard_map) and "
            "keep_own_heads_or_features (the heads or features, inside a TensorParallelBlock's).",
            "keep_own_heads_or_features": "No counterpart: NumPy's and torch's keep_own_parts wraps each "
            "device's Dropouts with its heads or features too, before the run.",
            "step_dropout_draws": "No counterpart: NumPy's simulated devices count their draws; torch's ranks "
            "and JAX's devices draw the same whole masks (WholeMaskDropout).",
            "_stacks": "No counterpart: torch's and NumPy's plans name the layers (fsdp_units).",
            # sharded checkpoints: each framework's own format
            "restore_moments": "No counterpart: JAX puts whole moments back with restore_training_state and "
            "places them by the plan (shard_optimizer).",
            "device_file": "No counterpart: torch.distributed.checkpoint and Orbax name their own files.",
            "writers": "No counterpart: torch.distributed.checkpoint and Orbax write each shard once themselves.",
            "device_tensors": "No counterpart: torch's state_dict; JAX's _variables.",
            "whole_tensor": "No counterpart: torch.distributed.checkpoint and Orbax read a tensor from its "
            "shards themselves.",
            "_transposed": "No counterpart: NumPy's and JAX's layout is the canonical one.",
            "state_dict": "NumPy: device_tensors; JAX: _variables.",
            "_state_path": "No counterpart: Orbax alone asks for an absolute path.",
            "_weight_variable": "No counterpart: torch finds a weight by parent_of; NumPy's devices hold pieces "
            "by name.",
            "_variables": "NumPy: device_tensors; torch: state_dict.",
            "_metadata": "No counterpart: torch.distributed.checkpoint checks the shapes as it reads.",
            "_check_shapes": "No counterpart: as _metadata.",
            "_save_sharded": "torch: inside _train_rank's save; NumPy: inside sharded_train's save.",
            "_launch_once": "No counterpart: torchrun restarts torch's ranks; NumPy's devices are threads.",
            "_context": "No counterpart: torchrun starts each rank as a fresh interpreter; the tests' torch ranks "
            "are forked from their launcher; NumPy's devices are threads.",
            "wrap_units": "No counterpart: torch wraps the layers once, before training; NumPy's plan lists "
            "its units (fsdp_units).",
            "data_sharded_loss": "NumPy: Replica.loss_and_grads; torch: each rank's step (sharded_train_step).",
            "_compile": "No counterpart: torch and NumPy run their step eagerly.",
            "_signature": "No counterpart: as _compile.",
            "_loss": "No counterpart: torch's step and NumPy's run the loss in their own step functions.",
            "_sharded_update": "No counterpart: torch's step is sharded_train_step; NumPy's is ShardedRun's.",
            "_sharded_loss_and_grads": "No counterpart: as _sharded_update.",
            "_compiled_step": "No counterpart: torch and NumPy run their step eagerly.",
            "_checked": "No counterpart: torch and NumPy check the batch on its concrete arrays in their step.",
            "_rows": "No counterpart: as shard_batch.",
            "gather": "No counterpart: torch gathers with whole (DTensor.full_tensor); NumPy joins its pieces.",
            "sharded_train_step": "No counterpart: JAX's step is one compiled program (_sharded_update); NumPy's "
            "is ShardedRun's.",
            "sharded_backward": "No counterpart: JAX differentiates the whole program; NumPy's backward is each "
            "unit's.",
            "_sum_over": "No counterpart: JAX's compiler inserts the all-reduce; NumPy calls all_reduce.",
            "whole": "No counterpart: JAX gathers with gather; NumPy joins its pieces (join).",
            "sharded_logits": "No counterpart: JAX's and NumPy's forward run inside sharded_loss_and_grads.",
            # torch's processes
            "_check_devices": "No counterpart: JAX's mesh and NumPy's simulated devices exist in this process, "
            "checked by check_plan.",
            "_setup": "No counterpart: one process holds every JAX device, and every NumPy one.",
            "_quiet": "No counterpart: no processes to start.",
            "_loss_and_grads_rank": "No counterpart: one process holds every device.",
            "_logits_rank": "No counterpart: one process holds every device.",
            "_collectives_rank": "No counterpart: one process holds every device.",
            "_train_rank": "No counterpart: one process holds every device.",
            # what a step communicates and holds
            "hlo_collectives": "No counterpart: torch counts the collectives as they run (CollectiveCounter); "
            "NumPy logs each (CollectiveLog).",
            "_group_size": "No counterpart: as hlo_collectives.",
            "step_program": "No counterpart: torch and NumPy run no compiled program.",
            "step_memory": "NumPy: ShardedRun.peak_bytes (each Device records its peak as it gathers and drops).",
            "CollectiveCounter": "No counterpart: JAX reads the compiled program (hlo_collectives); NumPy logs "
            "each collective (CollectiveLog).",
            "_whole_buffer_bytes": "No counterpart: as CollectiveCounter.",
            "_nbytes": "No counterpart: as CollectiveCounter.",
            "_memory_rank": "No counterpart: one process holds every device.",
            # the communication written out
            "TensorParallelBlock": "torch: BlockInput, with ColwiseParallel and RowwiseParallel (DTensors hide "
            "the all-reduces); NumPy: TensorParallelAttention and TensorParallelFeedForward.",
            "BlockInput": "JAX: TensorParallelBlock's pcast at the block's entrance; NumPy: the blocks' backward, "
            "which adds the parts of an input's gradient before its all-reduce.",
            "_drops": "No counterpart: torch's dropout draws from one global generator, which needs no update.",
            "_closing_linear": "No counterpart: torch's RowwiseParallel adds the bias after its all-reduce; "
            "NumPy's blocks hold it apart (output_bias).",
            "tensor_parallel_blocks": "No counterpart: torch's parallelize_module wraps the blocks once, before "
            "training; NumPy's run builds its blocks.",
            "tensor_parallel_block": "No counterpart: one block run as a TensorParallelBlock, for the course.",
            "all_gather": "No counterpart: the engine runs the collective between real devices.",
            "reduce_scatter": "No counterpart: the engine runs the collective between real devices.",
            "all_reduce": "No counterpart: the engine runs the collective between real devices.",
            "_add_up": "No counterpart: the engine runs the collective between real devices.",
            "CollectiveLog": "No counterpart: torch's profiler and JAX's compiled program list the collectives.",
            "TensorParallelAttention": "No counterpart: torch's parallelize_module turns the block's weights "
            "into DTensors in place; JAX's shardings leave the module as it is.",
            "TensorParallelFeedForward": "No counterpart: as TensorParallelAttention.",
            "local_attention": "No counterpart: a device's part of the weights is its shard of them.",
            "local_feed_forward": "No counterpart: a device's part of the weights is its shard of them.",
            "Device": "No counterpart: the devices are real (processes, or JAX devices).",
            "ShardedUnit": "No counterpart: fully_shard (torch) and the compiler (JAX) gather the weights.",
            "DataAxis": "No counterpart: the devices are real and meet in their process group or mesh.",
            "Replica": "No counterpart: each process (torch) or device (JAX) is its own data rank.",
            "ShardedRun": "No counterpart: the framework holds the sharded arrays.",
            "load_whole": "No counterpart: the backend gathers the shards into its own model at the end.",
            # JAX across processes (jax.distributed): the same step on a mesh over every process's devices
            "_put": "No counterpart: torch's ranks each place their own pieces; NumPy's devices are in one process.",
            "_placed": "No counterpart: torch's ranks and NumPy's check the batch on their concrete rows.",
            "from_environment": "No counterpart: under torchrun, torch.distributed reads RANK, WORLD_SIZE and "
            "MASTER_ADDR from the environment itself; NumPy has no processes.",
            "initialize": "No counterpart: torch's ranks join with dist.init_process_group (data_parallel.py's "
            "_replica); NumPy has no processes.",
            "free_port": "No counterpart: torch's spawned ranks meet at a file in a temporary folder; NumPy has no "
            "processes.",
            "_process": "No counterpart: torch's spawned rank is data_parallel.py's _replica; NumPy has no processes.",
            "launch": "No counterpart: torch.multiprocessing.spawn starts torch's ranks (data_parallel.py's _spawn); "
            "NumPy has no processes.",
            "_same": "No counterpart: a helper of place and replicated (one program for every move).",
            "place": "No counterpart: each torch rank shards its own copy of the model (fully_shard, "
            "parallelize_module); NumPy has no processes.",
            "replicated": "No counterpart: torch makes a DTensor whole with full_tensor (whole); NumPy has no "
            "processes.",
            "local": "No counterpart: as replicated.",
        },
    ),
    Page(
        slug="decoding",
        title="Decoding: greedy search, beam search and sampling",
        summary="One search in NumPy for every backend; steppers with and without a key/value cache.",
        equations=(
            r"y_t = \argmax_v \; \log p(v \mid y_{<t}, x)",
            r"\mathrm{score}(y_1, \ldots, y_T) = \frac{1}{T^{\alpha}} \sum_{t=1}^{T} \log p(y_t \mid y_{<t}, x)",
        ),
        text=(
            "The search (argmax, top-k over beams, finished hypotheses, length penalty) is written once, in "
            "NumPy, in `transformer_run.decoding`, so the backends cannot differ in it: only in the logits "
            "their steppers return. A stepper starts (encodes the source once), steps (newest tokens -> "
            "next-token logits) and reorders (keeps the surviving beams).",
            "Beam search follows Hugging Face's `generate`: a hypothesis ends when it emits <eos> among the "
            "k best candidates of its step, and every hypothesis ends at `max_len`; each source keeps its k best "
            "finished ones, scored by total log-probability over (generated length)^`length_penalty`, and "
            "stops, whatever the rest of its batch does, by `early_stopping`, Hugging Face's three rules. "
            "`True`: once it has k finished hypotheses. `False`, the default as in Hugging Face: once, "
            "besides, its best running hypothesis, scored at its current length, cannot beat the worst of "
            "them (a heuristic: with a positive length penalty a longer one might still). 'never': once it "
            "cannot even when scored at `max_len`, the best a continuation can reach when the length penalty "
            "is positive: the canonical rule, which stops only when nothing can improve.",
            "The uncached stepper re-runs the whole prefix every step; the cached one feeds only the newest "
            "token, whose key and value join each layer's cache. The tests hold the two to each other's "
            "logits in float64 and float32, and every backend to the NumPy reference's tokens.",
            "Sampling divides the logits by a temperature, keeps the `top_k` largest and then the smallest set "
            "whose probability reaches `top_p`, and draws from a seeded NumPy generator: one uniform number per "
            "row and step, so the three backends draw the same tokens from the same logits. With grouped-query "
            "attention the cache holds only the key/value heads; with rotary positions each new key is rotated "
            "once, at its position, before it joins the cache. JAX's compiled step writes into a buffer sized "
            "for the prompt and the steps asked for (`cache_length`), not for `max_len`.",
        ),
        code=(
            "generate.py: DecodingState, PrefixState, make_step_mask, initial_cache, cache_length, decode_step, "
            "select_rows, CachedStepper, UncachedStepper, make_stepper, greedy, beam, sample, _to_device, _to_host",
            "transformer_run/decoding.py: host_ids, first_tokens, greedy_decode, beam_search, filter_logits, "
            "sample_decode",
        ),
        tests=("*test_decoding.py::*",),
        parity_note=(
            "Here each backend's cached stepper is held to its own uncached one, step by step (the "
            "logits of every step); the tokens are compared exactly, to the NumPy reference's."
        ),
        notes={
            "_to_device": "Not needed: the ids are already host arrays of the right kind.",
            "cache_length": "Not needed: the cache grows by concatenation, one step at a time.",
        },
    ),
    Page(
        slug="kernels",
        title="Speed, in one place: fused kernels",
        summary="kernels.py per backend: one switch, one marked line in the teaching code, each kernel held equal.",
        equations=(),
        text=(
            "The component pages show the math as the paper writes it, in every backend. Where a framework has "
            "a faster equivalent, the teaching function or forward carries one marked line, "
            '`@fusable("gelu")`, the same in all three backends; while fused kernels are enabled (the '
            "default; `use_fused_kernels(False)` or `with fused_kernels(False):` switches them off, "
            "`transformer-ref compare --kernels written-out` too) and no trace is recording, the call goes to the "
            "kernel registered in that backend's `kernels.py`. A kernel returns `NotImplemented` where it does "
            "not apply (attention weights asked for, dropout active, gradients being kept), and the written-out "
            "code runs.",
            "torch registers `F.layer_norm`, `F.gelu`, `F.scaled_dot_product_attention` with q, k and v "
            "projected by one packed GEMM, and, in inference, a feed-forward network whose activation works in "
            "place on w_1's output (`torch._addmm_activation`, as `nn.TransformerEncoderLayer`'s fast path); "
            "its cached stepper lays the weights out for decoding's one-row products once (`decoding_layout`: "
            "each matrix stored as its BLAS reads a one-row product fastest, and q|k|v and gate|up made column "
            "blocks of one matrix each, as views), and a decoding step runs as one function (`decode_step`) "
            "for a pre-norm decoder-only model. NumPy does the same for decoding (`decoding_layout`, "
            "`decode_step`, `gated_feed_forward`) and registers a GELU whose erf is a float32 rational "
            "approximation computed block by "
            "block, and an inference attention one batch entry at a time with the softmax in place, so that the "
            "(B, H, T, T) scores never exist at once (from 4096 keys on, the tiled attention, a block of keys at a "
            "time). JAX registers one, for long sequences only: the tiled attention as one `lax.scan`, since "
            "under `jax.jit` an unrolled loop over blocks lets XLA hold every block's scores at once; otherwise "
            "XLA fuses the written-out math, and `jax.nn.dot_product_attention` computes its softmax in float32, "
            "which would break float64 parity. For decoding, JAX's stepper hands its compiled step packed copies "
            "of q|k|v and gate|up and the transposed output table (`decoding_weights`), and the model split "
            "once a generation (`split_model`), not flattened by `jax.jit` at every step.",
            "Tracing records the written-out path (a fused kernel has no intermediates); `transformer-ref trace` "
            "says so. `shared_tests/components/test_fast_paths.py` holds every kernel equal to the code it replaces.",
        ),
        code=(
            "transformer_spec/kernels.py: use_fused_kernels, fused_kernels_enabled, fused_kernels, fusable_in",
            "kernels.py: KERNELS, fusable, layer_norm, rms_norm, gelu, feed_forward, gated_feed_forward, _packed, "
            "_projections, attention_context, multi_head_attention, _grouped_attention, scanned_attention, "
            "decoding_layout, _read_fastest, _reading_one_input, _pack_columns, packed_columns, _packed_base, "
            "_without_grad, _product, decode_step, _layer_weights, _norm, _dropout_active, decoding_weights, _pack, "
            "decoding_with, _split_decode_step, _Structure, split_model",
        ),
        tests=("*test_fast_paths.py::*",),
        notes={
            "decoding_layout": "No counterpart in JAX: its arrays cannot be views of one another "
            "(`decoding_weights` makes packed copies), and XLA chooses its layouts itself.",
            "packed_columns": "No counterpart in JAX: `decoding_weights` keeps its packed copies.",
            "decoding_weights": "JAX's alone: NumPy and torch pack views of the model's own weights "
            "(`decoding_layout`).",
            "split_model": "JAX's alone: the other backends have no jit to hand the model to.",
            "_split_decode_step": "JAX's alone: the compiled step of a model split once (`split_model`).",
            "_Structure": "JAX's alone: a static argument of jax.jit, hashed once.",
            "decoding_with": "JAX's alone: its kernel is traced inside jax.jit, and the packed weights come in "
            "as the compiled step's arguments.",
            "_pack": "JAX's alone: its packed weights are copies (`decoding_weights`).",
            "_read_fastest": "NumPy's alone: torch's `decoding_layout` chooses each matrix's layout in place, and "
            "XLA chooses JAX's.",
            "_reading_one_input": "No counterpart in JAX: `decoding_weights` walks the layers itself.",
            "_pack_columns": "No counterpart in JAX: its packed weights are copies (`_pack`).",
            "_packed_base": "NumPy's alone: a view's `base` names the packed matrix; torch compares addresses.",
            "_product": "torch's products are `F.linear` calls.",
            "_layer_weights": "No counterpart in JAX: `decoding_weights` hands the packed weights to the step.",
            "_norm": "No counterpart in JAX: its fused step calls the norm modules, which XLA fuses.",
            "_without_grad": "torch's alone: a packed view is not traced by autograd back to each weight; NumPy's "
            "kernels run only without gradients, and JAX's packed copies only in decoding.",
            "_dropout_active": "torch's alone: NumPy reads the first dropout's mode, and JAX's decoding runs "
            "without dropout.",
            "layer_norm": "No kernel: the written-out LayerNorm is the one that runs.",
            "gelu": "No kernel: XLA fuses the written-out GELU itself.",
            "feed_forward": "No kernel: the written-out feed-forward network runs.",
            "_packed": "No kernel needs it here.",
            "_projections": "No kernel needs it here.",
            "attention_context": "No fused attention kernel here.",
            "rms_norm": "No kernel: the written-out RMSNorm runs (torch has `F.rms_norm`).",
            "gated_feed_forward": "No kernel in JAX: XLA fuses the written-out gated feed-forward (its decoding "
            "step multiplies by the packed gate|up in `decode_step`).",
            "_grouped_attention": "Not needed: torch's `F.scaled_dot_product_attention` reads each key/value "
            "head for its group of query heads itself (`enable_gqa`), and JAX's kernel takes no decoding step.",
            "scanned_attention": "Not needed: NumPy's loop over blocks runs one block at a time as written "
            "(`tiled_attention`), and torch's `F.scaled_dot_product_attention` is itself a tiled kernel.",
        },
    ),
    Page(
        slug="tracing",
        title="Tracing named intermediates",
        summary="trace_model: every intermediate of one forward pass, by the same names in every backend.",
        equations=(),
        text=(
            "The modules mark their intermediates with one line each, `record(self, name=value)` "
            "(`transformer_spec.trace`); outside a recording the call returns at once. `trace_model` names "
            "each module by its path in the model, the same paths as the weights' names, and runs one forward "
            "pass inside a recording. The walkthrough page is built from it.",
        ),
        code=("trace.py: named_modules, trace_model",),
        parity_note="See the walkthrough: every traced intermediate of BERT-base, in all three backends.",
    ),
)

# The per-backend helpers of the pages above that are not mirrored: backend -> symbol -> note is
# in Page.notes; a missing ``*_backward``/``*_for_backward`` gets AUTOGRAD.
