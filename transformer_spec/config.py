"""One dataclass for every hyper-parameter, validated when it is built.

Every backend, the weight schema, the safetensors metadata and the command line read
this same class, so a size is written in exactly one place.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

KINDS = ("encoder_decoder", "encoder_only", "decoder_only")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
POSITIONAL = ("sinusoidal", "learned", "rotary", "none")
NORMS = ("layer_norm", "rms_norm")
ROPE_LAYOUTS = ("halves", "interleaved")
SINUSOID_LAYOUTS = ("interleaved", "halves")
_BOOLS = ("norm_first", "bias", "tie_output", "scale_embeddings", "embedding_norm", "pooler", "gated_ffn",
          "final_logits_bias", "share_embeddings")  # fmt: skip
_OPTIONAL_BOOLS = ("encoder_final_norm", "decoder_final_norm", "attention_bias", "ffn_bias")


@dataclasses.dataclass(frozen=True)
class Config:
    """Sizes and switches of one Transformer.

    kind:
        "encoder_decoder" -- the paper's translation model (``Transformer``);
        "encoder_only"    -- a BERT-style encoder (``TransformerEncoderModel``);
        "decoder_only"    -- a causal language model (``TransformerLM``), the tutorials'
                             next-word model: decoder layers without cross-attention.
    norm_first:
        False is the paper's post-norm ``LayerNorm(x + sublayer(x))``; True is the
        pre-norm ``x + sublayer(LayerNorm(x))`` that the tutorials (and GPT-2) use.
    encoder_final_norm / decoder_final_norm:
        a LayerNorm after the last layer. ``None`` (the default) follows ``norm_first``:
        pre-norm stacks need one (their residual stream is never normalised otherwise),
        the paper's post-norm stack has none. ``torch.nn.Transformer`` always has both.
    dropout:
        the probability of zeroing each element, in training mode only, at the four places
        the paper and ``torch.nn.Transformer`` put it: the embeddings' output, the attention
        weights, the feed-forward hidden layer and each sub-layer's output before the
        residual addition. The paper trains with 0.1 (0.3 for its English-German big model);
        the ``paper-base`` and ``paper-big`` presets have the paper's rates, every other preset
        has 0.0, so that a model computes the same function in training and in inference.

    The modern decoder (Llama, SmolLM2) is the same model with other parts switched in:
    norm:
        "layer_norm" (the paper) or "rms_norm": ``x / sqrt(mean(x^2) + eps) * weight``, no
        mean subtracted and no bias (Zhang & Sennrich, 2019; Llama).
    gated_ffn:
        False is the paper's ``act(x W_1) W_2``; True is the gated feed-forward
        ``(act(x W_gate) * (x W_up)) W_down`` (Shazeer, 2020): SwiGLU with
        ``activation="silu"`` (Llama), GeGLU with "gelu".
    positional="rotary", rope_theta, rope_layout:
        rotary position embedding (Su et al., 2021): each query and key head is rotated by
        an angle proportional to its position, pair by pair, frequencies theta^(-2i/d_k);
        nothing is added to the embeddings. ``rope_layout`` says which features form a pair:
        "halves" (i, i + d_k/2), as HF Llama's ``rotate_half``; "interleaved" (2i, 2i + 1),
        as GGUF/GGML and GPT-J. The same model in the two layouts differs by a fixed
        permutation of each head's q and k rows (``transformer_convert.rope``).
    num_kv_heads:
        grouped-query attention (Ainslie et al., 2023): keys and values have fewer heads
        than queries, each shared by num_heads / num_kv_heads query heads (1: multi-query).
        ``None`` (the default) follows num_heads (the paper's multi-head attention).
    attention_bias / ffn_bias:
        biases of the attention projections / feed-forward layers; ``None`` follows ``bias``.

    A field given as ``None`` follows another one (``FOLLOWS``): once built, the Config holds
    the resolved value under the field's own name (``Config(num_heads=8).num_kv_heads == 8``),
    and remembers that it was left to follow, so that ``replace`` and ``to_dict`` keep
    following (``Config(num_heads=8).replace(num_heads=4).num_kv_heads == 4``, and the JSON in
    a weights file stores ``null`` there, as files always have). Python's own copies follow
    too: ``dataclasses.replace``, ``copy.replace`` and ``Config(**dataclasses.asdict(c))``
    read each field's value and pass it back, and a resolved value is one that says it
    follows (an ``int`` that prints as the number or as True/False), so
    ``dataclasses.replace(Config.preset("base"), num_heads=16).num_kv_heads == 16``, not a
    grouped-query model with 8. To pin a followed value in such a copy, pass it as a plain
    ``int(...)`` or ``bool(...)``; ``replace`` pins whatever it is given. A followed switch
    equals its bool (compare with ``==`` or test it with ``if``), but is not the object
    ``True`` or ``False`` (bool cannot be subclassed): ``is True`` is False for it. Two
    Configs are equal when they build the same model:
    ``Config(num_heads=8) == Config(num_heads=8, num_kv_heads=8)``.
    sinusoid_layout:
        the fixed sinusoids' columns: "interleaved" (the paper: sin, cos, sin, ...) or
        "halves" (all sines, then all cosines: Marian, fairseq).
    final_logits_bias:
        a bias vector added to the logits even when the output projection is tied (Marian).
    share_embeddings:
        one token table for the source and the target (an encoder-decoder over one joint
        vocabulary, so src_vocab_size == tgt_vocab_size): the encoder reads the decoder's
        ``tgt_embed.token.weight``, and ``src_embed`` has no table of its own. With
        ``tie_output`` too, it is the paper's three-way sharing (section 3.4): one matrix for
        the source embedding, the target embedding and the pre-softmax projection.
    """

    kind: str = "encoder_decoder"
    d_model: int = 512
    num_heads: int = 8
    d_ff: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    src_vocab_size: int = 32000
    tgt_vocab_size: int = 32000
    max_len: int = 512
    norm_first: bool = False
    activation: str = "relu"
    positional: str = "sinusoidal"
    layer_norm_eps: float = 1e-5
    bias: bool = True
    encoder_final_norm: bool | None = None
    decoder_final_norm: bool | None = None
    tie_output: bool = False
    scale_embeddings: bool = True
    type_vocab_size: int = 0
    embedding_norm: bool = False
    pooler: bool = False
    pad_id: int = 0
    dropout: float = 0.0
    norm: str = "layer_norm"
    gated_ffn: bool = False
    num_kv_heads: int | None = None
    rope_theta: float = 10000.0
    rope_layout: str = "halves"
    attention_bias: bool | None = None
    ffn_bias: bool | None = None
    sinusoid_layout: str = "interleaved"
    final_logits_bias: bool = False
    share_embeddings: bool = False

    def __post_init__(self) -> None:
        following = frozenset(name for name in FOLLOWS if _follows(getattr(self, name)))
        object.__setattr__(self, "_following", following)  # not a field: equality compares the model
        for name, leader in FOLLOWS.items():
            if name in following:
                object.__setattr__(self, name, _Followed.of(getattr(self, leader)))
        self._validate()

    def __replace__(self, **changes: Any) -> Config:  # copy.replace (Python 3.13): Config.replace
        return self.replace(**changes)

    def __getattr__(self, name: str) -> Any:
        """Only reached for a missing attribute: a former name is refused with the current one."""
        if name in RENAMED:
            raise AttributeError(f"Config has no {name!r}: use {RENAMED[name]!r}", name=name, obj=self)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)

    # ------------------------------------------------------------------ checks
    def _validate(self) -> None:
        _one_of("kind", self.kind, KINDS)
        _one_of("activation", self.activation, ACTIVATIONS)
        _one_of("positional", self.positional, POSITIONAL)
        _one_of("norm", self.norm, NORMS)
        _one_of("rope_layout", self.rope_layout, ROPE_LAYOUTS)
        _one_of("sinusoid_layout", self.sinusoid_layout, SINUSOID_LAYOUTS)
        for name in _BOOLS:
            _bool(name, getattr(self, name))
        for name in _OPTIONAL_BOOLS:
            _bool(name, getattr(self, name), f"None (follow {FOLLOWS[name]})")
        _non_negative_int("pad_id", self.pad_id)
        for name in ("d_model", "num_heads", "d_ff", "max_len"):
            _positive_int(name, getattr(self, name))
        for name in ("num_encoder_layers", "num_decoder_layers", "type_vocab_size"):
            _non_negative_int(name, getattr(self, name))
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by num_heads "
                f"({self.num_heads}): each head gets d_model / num_heads features"
            )
        if self.uses_encoder:
            _positive_int("src_vocab_size", self.src_vocab_size)
            _positive_int("num_encoder_layers", self.num_encoder_layers)
            _id_in_vocab("pad_id", self.pad_id, "src_vocab_size", self.src_vocab_size)
        if self.uses_decoder:
            _positive_int("tgt_vocab_size", self.tgt_vocab_size)
            _positive_int("num_decoder_layers", self.num_decoder_layers)
            _id_in_vocab("pad_id", self.pad_id, "tgt_vocab_size", self.tgt_vocab_size)
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be a probability in [0, 1), got {self.dropout!r}")
        _positive_finite("layer_norm_eps", self.layer_norm_eps)
        _positive_finite("rope_theta", self.rope_theta)
        _positive_int("num_kv_heads", self.num_kv_heads)
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads}): "
                "each key/value head serves the same number of query heads"
            )
        if self.positional == "rotary" and self.d_k % 2 != 0:
            raise ValueError(
                f"positional='rotary' rotates pairs of features, so d_k = d_model / num_heads must be even, "
                f"got {self.d_model} / {self.num_heads} = {self.d_k}"
            )
        if self.final_logits_bias and not self.uses_decoder:
            raise ValueError(f"final_logits_bias=True needs a decoder, but kind is {self.kind!r}")
        if self.pooler and self.kind != "encoder_only":
            raise ValueError(f"pooler=True needs kind='encoder_only' (BERT's pooler), got kind={self.kind!r}")
        if self.tie_output and not self.uses_decoder:
            raise ValueError(f"tie_output=True needs a decoder, but kind is {self.kind!r}")
        if self.share_embeddings and self.kind != "encoder_decoder":
            raise ValueError(
                f"share_embeddings=True shares the source and target tables of an encoder-decoder: "
                f"it needs kind='encoder_decoder', got kind={self.kind!r}"
            )
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"share_embeddings=True needs one vocabulary for both sides: src_vocab_size "
                f"({self.src_vocab_size}) must equal tgt_vocab_size ({self.tgt_vocab_size})"
            )

    # --------------------------------------------------------------- derived
    @property
    def d_k(self) -> int:
        """Features per head (the paper's d_k = d_v = d_model / h)."""
        return self.d_model // self.num_heads

    @property
    def uses_encoder(self) -> bool:
        return self.kind in ("encoder_decoder", "encoder_only")

    @property
    def uses_decoder(self) -> bool:
        return self.kind in ("encoder_decoder", "decoder_only")

    @property
    def decoder_has_cross_attention(self) -> bool:
        return self.kind == "encoder_decoder"

    # ---------------------------------------------------------- conversions
    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes``; a field that was left to follow still follows (not
        ``dataclasses.replace``, which would pin it to its value before the change)."""
        plain = {name: _plain(value) for name, value in changes.items()}  # a value passed here is given
        return type(self)(**(self.to_dict() | plain))

    def to_dict(self) -> dict[str, Any]:
        """Every field as given: ``None`` where a field follows another one (``FOLLOWS``)."""
        return {f.name: None if f.name in self._following else getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, values: dict[str, Any], complete: bool = False) -> Config:
        """A Config from ``{field: value}``; unknown fields are refused, and with ``complete``
        missing ones too (a weights file stores them all), each named."""
        if not isinstance(values, dict):
            raise TypeError(f"a Config is read from a dict of fields, got {type(values).__name__} {values!r:.80}")
        for old in sorted(set(values) & set(RENAMED)):
            raise ValueError(f"{old!r} is not a Config field: use {RENAMED[old]}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(str(k) for k in set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown Config fields {unknown}; expected some of {sorted(known)}")
        missing = [name for name in known if name not in values and name not in ADDED_LATER]
        if complete and missing:
            raise ValueError(f"Config fields missing: {missing} (every field is stored)")
        return cls(**values)

    @classmethod
    def from_json(cls, text: str) -> Config:
        return cls.from_dict(json.loads(text))

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Config:
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
        return PRESETS[name].replace(**overrides)


# A field given as None takes the value of the field named here (see Config's docstring).
FOLLOWS = {"num_kv_heads": "num_heads", "attention_bias": "bias", "ffn_bias": "bias",
           "encoder_final_norm": "norm_first", "decoder_final_norm": "norm_first"}  # fmt: skip

# Former names, refused with the current one (each concept has one name: the field's).
RENAMED = {"kv_heads": "num_kv_heads", "use_attention_bias": "attention_bias", "use_ffn_bias": "ffn_bias",
           "use_encoder_final_norm": "encoder_final_norm", "use_decoder_final_norm": "decoder_final_norm"}  # fmt: skip


def _refuse_renamed(init: Any) -> Any:
    """``Config.__init__`` that names the current field for a former one (a TypeError, as for
    any unexpected keyword)."""

    @functools.wraps(init)
    def checked_init(self: Config, *args: Any, **kwargs: Any) -> None:
        for old in sorted(set(kwargs) & set(RENAMED)):
            raise TypeError(f"Config() got {old}={kwargs[old]!r}, which is not a field: use {RENAMED[old]}")
        init(self, *args, **kwargs)

    return checked_init


Config.__init__ = _refuse_renamed(Config.__init__)  # type: ignore[method-assign]

# Fields added after weights files were first written (the pooler, dropout, the modern decoder's
# switches): a file without them predates them, and their defaults are exactly the model it was
# written from.
ADDED_LATER = frozenset(
    {"pooler", "dropout",  # absent from the first files: no pooler, no dropout, as the defaults say
     "norm", "gated_ffn", "num_kv_heads", "rope_theta", "rope_layout", "attention_bias", "ffn_bias",
     "sinusoid_layout", "final_logits_bias", "share_embeddings"}
)  # fmt: skip


def _one_of(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class _Followed(int):
    """The value a field left to follow took from its leader (``FOLLOWS``): equal to it, hashed as
    it, and read back by ``Config()`` as "follows", which is what a copy made by reading the
    fields' values (``dataclasses.replace``, ``dataclasses.asdict``) hands back."""

    @staticmethod
    def of(value: Any) -> Any:
        """``value`` marked as followed; a value of no such type as is (validation names the leader)."""
        if isinstance(value, bool):
            return _FollowedBool(value)
        return _FollowedInt(value) if isinstance(value, int) else value


class _FollowedInt(_Followed):
    """An int's value: prints as the number (int's own repr)."""


class _FollowedBool(_Followed):
    """A bool's value (bool cannot be subclassed): prints as True or False."""

    def __repr__(self) -> str:
        return repr(bool(self))

    __str__ = __repr__


def _plain(value: Any) -> Any:
    """A followed value as the plain bool or int it equals (given, it no longer follows)."""
    if isinstance(value, _FollowedBool):
        return bool(value)
    return int(value) if isinstance(value, _FollowedInt) else value


def _follows(value: Any) -> bool:
    return value is None or isinstance(value, _Followed)


def _bool(name: str, value: Any, or_else: str = "") -> None:
    if not isinstance(value, (bool, _FollowedBool)):
        raise ValueError(f"{name} must be a bool (True or False){' or ' + or_else if or_else else ''}, got {value!r}")


def _positive_finite(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _non_negative_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def _id_in_vocab(name: str, value: int, vocab_name: str, vocab_size: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise ValueError(f"{name} must be an id in [0, {vocab_name}={vocab_size}), got {value!r}")


PRESETS: dict[str, Config] = {
    # Deliberately odd sizes (HF-tests style): no two dimensions are equal, so a
    # transposed weight or a broadcast over the wrong axis cannot go unnoticed.
    "tiny": Config(
        d_model=36,
        num_heads=3,
        d_ff=37,
        num_encoder_layers=2,
        num_decoder_layers=2,
        src_vocab_size=53,
        tgt_vocab_size=47,
        max_len=64,
    ),
    "tiny-lm": Config(
        kind="decoder_only",
        d_model=36,
        num_heads=3,
        d_ff=37,
        num_encoder_layers=0,
        num_decoder_layers=2,
        tgt_vocab_size=53,
        max_len=64,
        norm_first=True,
        activation="gelu",
    ),
    "tiny-bert": Config(
        kind="encoder_only",
        d_model=36,
        num_heads=3,
        d_ff=37,
        num_encoder_layers=2,
        num_decoder_layers=0,
        src_vocab_size=53,
        max_len=64,
        activation="gelu",
        positional="learned",
        layer_norm_eps=1e-12,
        scale_embeddings=False,
        type_vocab_size=2,
        embedding_norm=True,
        pooler=True,
    ),
    # The modern decoder (Llama, SmolLM2) at the same odd sizes: RMSNorm, SwiGLU, rotary
    # positions, 9 query heads sharing 3 key/value heads, no biases, pre-norm.
    "tiny-llama": Config(
        kind="decoder_only",
        d_model=54,
        num_heads=9,
        num_kv_heads=3,
        d_ff=37,
        num_encoder_layers=0,
        num_decoder_layers=2,
        tgt_vocab_size=61,
        max_len=64,
        norm_first=True,
        norm="rms_norm",
        activation="silu",
        gated_ffn=True,
        positional="rotary",
        rope_theta=100000.0,
        bias=False,
        scale_embeddings=False,
    ),
    # SmolLM2-135M(-Instruct), the real model the GGUF loader reads (transformer_convert.gguf).
    "smollm2-135m": Config(
        kind="decoder_only",
        d_model=576,
        num_heads=9,
        num_kv_heads=3,
        d_ff=1536,
        num_encoder_layers=0,
        num_decoder_layers=30,
        tgt_vocab_size=49152,
        max_len=8192,
        norm_first=True,
        norm="rms_norm",
        activation="silu",
        gated_ffn=True,
        positional="rotary",
        rope_theta=100000.0,
        layer_norm_eps=1e-5,
        bias=False,
        tie_output=True,
        scale_embeddings=False,
        pad_id=0,  # <|endoftext|>: never inside a prompt (a chat's <|im_end|> is, and padding is hidden)
    ),
    # "Attention Is All You Need", Table 3, base model.
    "base": Config(),
    # The paper's own models as trained for English-German (Table 3): one 37,000-token BPE
    # vocabulary shared by source and target, and one matrix for the source embedding, the
    # target embedding and the pre-softmax projection (section 3.4); post-norm, sinusoidal
    # positions, ReLU. Dropout as Table 3's P_drop: 0.1 (base), 0.3 (big: the 0.1 of section 6.1
    # is the English-French big model, whose vocabulary is 32,000 word pieces). Training
    # settings that are not the model's: PAPER_TRAINING.
    "paper-base": Config(
        src_vocab_size=37000, tgt_vocab_size=37000, share_embeddings=True, tie_output=True, dropout=0.1
    ),
    "paper-big": Config(
        d_model=1024,
        num_heads=16,
        d_ff=4096,
        src_vocab_size=37000,
        tgt_vocab_size=37000,
        share_embeddings=True,
        tie_output=True,
        dropout=0.3,
    ),
    # BERT-base (uncased): 12 layers, hidden 768, 12 heads, ff 3072.
    "bert-base": Config(
        kind="encoder_only",
        d_model=768,
        num_heads=12,
        d_ff=3072,
        num_encoder_layers=12,
        num_decoder_layers=0,
        src_vocab_size=30522,
        max_len=512,
        activation="gelu",
        positional="learned",
        layer_norm_eps=1e-12,
        scale_embeddings=False,
        type_vocab_size=2,
        embedding_norm=True,
        pooler=True,
    ),
}

# The paper's training settings for paper-base and paper-big (sections 5.3 and 5.4): not sizes
# of the model, so not Config fields. Label smoothing eps_ls = 0.1; Adam with beta_1 = 0.9,
# beta_2 = 0.98, eps = 1e-9, at lr = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5).
PAPER_TRAINING: dict[str, Any] = {"label_smoothing": 0.1, "warmup_steps": 4000, "betas": (0.9, 0.98), "eps": 1e-9}
