"""The five tutorials this reference grew from: what each covers, what was taken from it, and
which of its bugs are fixed here and where. Plain data for the page ``tutorials.html``
(rendered by ``docs.pages.tutorials_page``).

They are five Chinese PyTorch tutorials: two Jupyter notebooks, a blog post, an article and a
set of study notes. The pitfalls refer to them by ``slug`` (``@register(...,
tutorials=("from-scratch",))`` in ``transformer_pitfalls``); ``shared_tests/repository/test_docs.py``
checks that each pitfall a tutorial makes is listed among that tutorial's bugs below.

Prose is plain text with `code` in backticks and [links](page.html#anchor) to the site's pages.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Fix:
    bug: str  # what the tutorial does
    here: str  # what this reference does instead, and where (links)
    pitfall: str = ""  # the pitfall that runs this bug next to our code, if there is one


@dataclass(frozen=True)
class Tutorial:
    slug: str  # the page anchor, and the name the pitfalls use
    title: str  # in English
    source: str  # what it is: its own title, form, author and date where it gives them
    covers: str
    took: tuple[str, ...]
    fixes: tuple[Fix, ...]


TUTORIALS: tuple[Tutorial, ...] = (
    Tutorial(
        slug="encoder-notebook",
        title="A Transformer encoder, cell by cell",
        source="“Transformers”, a Jupyter notebook (zhen Gao, 2025). Its code is that of chapter 3 of "
        "Natural Language Processing with Transformers (Tunstall, von Werra and Wolf), with notes in Chinese.",
        covers="BERT's tokenizer on “time flies like an arrow”, token embeddings of size 768, scaled "
        "dot-product attention written out with `torch.bmm` (Q = K = V = the embeddings), a head as three "
        "`nn.Linear` of its own and multi-head attention as a list of such heads, concatenated; a GELU "
        "feed-forward layer, a pre-norm encoder layer, learned position embeddings with a LayerNorm, the "
        "encoder stack, and the decoder's lower-triangular mask. (Its first cell fails: the download of "
        "bert-base-uncased is refused.)",
        took=(
            "The sentence “time flies like an arrow” through a BERT-sized encoder: the "
            "[walkthrough](walkthrough.html), every intermediate's shape in all three frameworks.",
            "A head as a module of its own: `AttentionHead` and `MultiHeadAttentionLoop` are its list of heads, "
            "kept to show that they are the fused layer with sliced weights "
            "([multi-head attention](multi_head_attention.html#MultiHeadAttentionLoop)).",
            "BERT's embeddings, token plus learned position, then LayerNorm "
            "([embeddings](embeddings.html#Embeddings)); the GELU feed-forward layer "
            "([feed-forward](feed_forward.html)); pre-norm as an option beside the paper's post-norm "
            "(`Config.norm_first`, [sub-layer connection](sublayer.html)).",
        ),
        fixes=(
            Fix(
                bug="`Embeddings` creates `nn.Dropout()`: p = 0.5, five times the paper's rate, and active in "
                "every forward pass until `.eval()` is called.",
                here="One rate, `config.dropout` (0 unless asked), at the paper's four places; `build_model` "
                "and `load_model` return inference mode ([dropout](dropout.html#Dropout)).",
                pitfall="dropout-default-half",
            ),
            Fix(
                bug="The padding mask is `query_mask` times `key_mask`, filled with -inf: a padded query has no "
                "allowed key, its softmax row is NaN, and the next layer spreads the NaN to every token.",
                here="Padding masks hide keys only ([masks](masks.html#make_padding_mask)), and a row with no "
                "allowed key gets weights 0, not NaN ([attention](attention.html#masked_softmax)).",
                pitfall="neg-inf-mask-nan",
            ),
            Fix(
                bug="Its pre-norm encoder stack ends without a final LayerNorm, so the encoder's output is the "
                "un-normalised residual stream.",
                here="A pre-norm stack ends with a LayerNorm (`encoder_final_norm`, on by default with "
                "`norm_first`; [sub-layer connection](sublayer.html), [encoder](encoder.html#Encoder)).",
            ),
        ),
    ),
    Tutorial(
        slug="from-scratch",
        title="A Transformer from scratch in PyTorch",
        source="“基于Pytorch架构手撕Transformer” (“Tearing a Transformer apart by hand, on PyTorch”), a blog "
        "post (2024); its component files are by pan binghong.",
        covers="The same book code as the encoder notebook, then one file per component: sinusoidal "
        "positional encoding, multi-head attention with `torch.einsum`, a ReLU feed-forward network, layer "
        "normalisation, a pre-norm residual connection, the encoder layer and stack, and the decoder layer. "
        "The decoder stack stays unfinished: the author, helped by GPT-4o, gave up on a mask whose "
        "dimensions would not match.",
        took=(
            "One file per component, here the same file in each backend (`masks.py`, `positional.py`, "
            "`attention.py`, `feed_forward.py`, `layer_norm.py`, `sublayer.py`, `encoder.py`, `decoder.py`).",
            "The residual connection written once, around any sub-layer: "
            "[`sublayer_connection`](sublayer.html#sublayer_connection).",
            "The sinusoidal table ([positional encodings](positional.html#sinusoidal_table)), and the decoder "
            "layer, finished: self-attention, attention over the memory, feed-forward "
            "([decoder](decoder.html#DecoderLayer)), with masks that fit ([masks](masks.html)).",
        ),
        fixes=(
            Fix(
                bug="Its attention divides the scores by sqrt(embed_size), the model's width, instead of the "
                "head's: every head's softmax runs at temperature sqrt(heads).",
                here="Scores are divided by sqrt(d_k) ([attention](attention.html#scaled_dot_product_attention)).",
                pitfall="scale-by-d-model",
            ),
            Fix(
                bug="It splits x into heads before projecting, and gives q, k and v one small "
                "`nn.Linear(heads_dim, heads_dim)` each, shared by all heads.",
                here="Each projection is (d_model, d_model), split into heads after it "
                "([multi-head attention](multi_head_attention.html#MultiHeadAttention)).",
                pitfall="one-linear-for-all-heads",
            ),
            Fix(
                bug="Its LayerNorm is `(x - mean) / (x.std() + eps)`: torch's `std` is unbiased, and eps "
                "is added to the standard deviation.",
                here="The biased variance, eps inside the square root, as torch, Flax and BERT compute it "
                "([layer normalisation](layer_norm.html#LayerNorm)).",
                pitfall="layer-norm-unbiased-std",
            ),
            Fix(
                bug="Its encoder fills its list of layers with one layer object, N times: every layer "
                "shares one set of weights.",
                here="Each layer is built anew ([encoder](encoder.html#Encoder)), and a checkpoint with N "
                "different layers loads into it.",
                pitfall="shared-layer-stack",
            ),
            Fix(
                bug="Its positional encoding fails for an odd `d_model`: there are fewer cosine columns "
                "than sine columns.",
                here="[`sinusoidal_table`](positional.html#sinusoidal_table) fills ceil(d/2) sine and "
                "floor(d/2) cosine columns.",
                pitfall="sinusoidal-odd-d-model",
            ),
            Fix(
                bug="Its decoder's masks are 3-D: against 4-D scores the batch axis lands on the heads axis.",
                here="Masks are 4-D: (B, 1, T, T) for the decoder's self-attention, (B, 1, 1, T_src) for "
                "attention over the memory, and any other shape is refused "
                "([masks](masks.html#make_cross_attention_mask)).",
                pitfall="decoder-mask-shapes",
            ),
            Fix(
                bug="The decoder layer's demo passes `torch.rand` masks, which `mask == 0` never matches: "
                "nothing is masked, and nothing says so.",
                here="Masks are boolean, and a mask of another dtype raises `TypeError` "
                "([`check_mask`](masks.html#check_mask)).",
            ),
            Fix(
                bug="It copies the book's `Embeddings` with `nn.Dropout()` (p = 0.5).",
                here="See the encoder notebook's first fix ([dropout](dropout.html#Dropout)).",
                pitfall="dropout-default-half",
            ),
            Fix(
                bug="It copies the book's `query_mask` times `key_mask` with a -inf fill (NaN rows).",
                here="See the encoder notebook's second fix ([attention](attention.html#masked_softmax)).",
                pitfall="neg-inf-mask-nan",
            ),
        ),
    ),
    Tutorial(
        slug="time-flies",
        title="Self-attention on “time flies like an arrow”, shape by shape",
        source="A Jupyter notebook, in Chinese, untitled (its sections: tokenizer, embeddings, "
        "self-attention scores, softmax, output).",
        covers="The sentence's ids [2051, 10029, 2066, 2019, 8612] (bert-base-uncased, no special tokens), "
        "a (30522, 768) embedding, the (1, 5, 5) scores with Q = K = V = the embeddings, the softmax (each "
        "row sums to 1) and the (1, 5, 768) output; what batch_size, seq_len and hidden_size are, and the "
        "roles of Q, K and V.",
        took=(
            "The ids: our WordPiece tokenizer (`transformer_text.tokenizer`) gives the same five, offline, "
            "from bert-base-uncased's `vocab.txt`, and is held to the `tokenizers` library by the oracle tests.",
            "A shape for every step: the [walkthrough](walkthrough.html) gives the shape of every "
            "intermediate of BERT-base on this sentence in all three frameworks, and every tensor line of "
            "the code carries its shape, `# (B, T, d_model)`.",
        ),
        fixes=(
            Fix(
                bug="It expects ids like `[[101, 2078, ...]]`, but with `add_special_tokens=False` there is no "
                "[CLS] (101): the ids it prints start at 2051.",
                here="The walkthrough tokenizes as it does, without [CLS] and [SEP], and shows the ids "
                "([walkthrough](walkthrough.html)).",
            ),
            Fix(
                bug="It reads the score matrix as symmetric, with a dominant diagonal: true only because "
                "Q = K = the embeddings, with no projection.",
                here="With separate `w_q` and `w_k` it is neither "
                "([multi-head attention](multi_head_attention.html#MultiHeadAttention)).",
            ),
        ),
    ),
    Tutorial(
        slug="dimensions",
        title="Transformer dimensions, layer by layer",
        source="An article from a CSDN community site, in Chinese, tracing the implementation's "
        "dimensions line by line (untitled here).",
        covers="The shapes from ids (batch, max_length) through the embedding (batch, max_length, d_model) "
        "and every layer to the language-model head (batch, max_length, vocab_size), and what "
        "hidden_states holds; then a multi-head attention adapted from Qwen's (`BITDDDAttention`: `view`, "
        "`permute`, scores / sqrt(head_dim)), run with BERT-base on two sentences padded to length 10.",
        took=(
            "The shape walk through BERT-base: the [walkthrough](walkthrough.html).",
            "Multi-head attention as one projection each for q, k and v, split by a reshape and a transpose, "
            "(B, T, d_model) -> (B, H, T, d_k) "
            "([multi-head attention](multi_head_attention.html#MultiHeadAttention)).",
            "The projection to the vocabulary, `Generator` ([the models](models.html#Generator)).",
        ),
        fixes=(
            Fix(
                bug="Its attention takes no mask, yet its two sentences are padded to length 10: every real "
                "token attends to the padding.",
                here="A model given no mask builds it from the ids and `config.pad_id` "
                "([masks](masks.html#make_padding_mask), [the models](models.html)); adding padding does not "
                "change the outputs at real tokens (`test_models.py`).",
            ),
            Fix(
                bug="What it calls the embedding layer's output is BERT's last hidden state "
                "(`BertModel(...)[0]`): its attention runs on the output of twelve layers.",
                here="The walkthrough records the embeddings' output (`src_embed.output`) apart from each "
                "layer's ([walkthrough](walkthrough.html)).",
            ),
            Fix(
                bug="It counts 12 hidden states for 12 layers.",
                here="`return_hidden_states=True` gives N + 1, the embeddings' output and then each layer's, "
                "as Hugging Face's `hidden_states` does ([the models](models.html)).",
            ),
        ),
    ),
    Tutorial(
        slug="llm-notes",
        title="LLM study notes: attention, a tiny language model, a toy translator",
        source="“LLM Learning”, study notes in Chinese.",
        covers="Attention explained on “The animal didn't cross the street because it was too tired”; "
        "scaled dot-product attention (mask True = blocked), sinusoidal positions, multi-head "
        "self-attention, a ReLU feed-forward network, a pre-norm encoder with a final LayerNorm; a tiny "
        "two-layer language model trained on six sentences (“the cat likes fish”) with a heatmap per head; "
        "an encoder-decoder trained on six English -> pretend-French pairs (“i eat fish” -> “je mange "
        "poisson”), decoded greedily, with its encoder-decoder attention drawn per layer and head.",
        took=(
            "The toy corpora, in the repository: `transformer_run.data.TOY_TRANSLATION` and `NEXT_WORD`, "
            "the tasks `translate` and `next-word` of `transformer-ref train`, and the sentences that "
            "`transformer-ref trace --text` tokenizes for those models.",
            "A heatmap per head with the tokens on both axes: `transformer-ref attention`, from the "
            "models' `return_attentions=True` (the same weights in every backend).",
            "Models that return every attention map and hidden state on request ([the models](models.html)), "
            "and greedy decoding ([decoding](decoding.html)).",
        ),
        fixes=(
            Fix(
                bug="Its tiny language model has no causal mask: predicting the next word, each position "
                "attends to that very word.",
                here="`TransformerLM` builds a causal mask when given none "
                "([masks](masks.html#make_decoder_mask), [the models](models.html#TransformerLM)); a future "
                "token never changes a past output (`test_models.py`).",
            ),
            Fix(
                bug="Its translator ORs a (B, 1, T, 1) target-padding mask into the causal mask: padded "
                "queries are fully blocked and, with its -1e9 fill, attend uniformly, future included.",
                here="The decoder's mask is causal AND key-not-padding, (B, 1, T, T) "
                "([masks](masks.html#make_decoder_mask)).",
                pitfall="decoder-mask-shapes",
            ),
            Fix(
                bug="Its first attention fills masked scores with -inf: a row with no allowed key is NaN.",
                here="Such a row gets weights 0 ([attention](attention.html#masked_softmax)).",
                pitfall="neg-inf-mask-nan",
            ),
            Fix(
                bug="Its translator's cross-entropy counts the padding targets.",
                here="The loss is the mean over non-pad targets ([loss](loss.html#cross_entropy)).",
            ),
            Fix(
                bug="Its masks mean True = blocked, as `nn.MultiheadAttention`'s do, while "
                "`F.scaled_dot_product_attention` and Flax read True as may attend.",
                here="One meaning everywhere, True = may attend, and a mask that is not boolean is refused "
                "([masks](masks.html)).",
            ),
        ),
    ),
)

BY_SLUG = {tutorial.slug: tutorial for tutorial in TUTORIALS}
