"""The Transformer in pure NumPy (float32 or float64): the reference the other backends are held to.

NumPy has no autograd: every module also has a hand-written backward pass right after its
forward (``backward``, reading what the forward kept by name inside ``enable_grad()``; see
``layers.py``), and ``loss_and_grads`` chains them; torch_impl and jax_impl get the same
gradients from their autograd.
"""

from transformer_spec import ModelOutput

from .attention import (
    AttentionHead,
    MultiHeadAttention,
    MultiHeadAttentionLoop,
    masked_softmax,
    repeat_kv,
    scaled_dot_product_attention,
)
from .compiled import compiled
from .data_parallel import data_parallel_loss_and_grads, data_parallel_train
from .decoder import Decoder, DecoderLayer
from .embeddings import Embeddings, TokenEmbedding
from .encoder import Encoder, EncoderLayer
from .feed_forward import (
    ACTIVATIONS,
    GatedFeedForward,
    PositionwiseFeedForward,
    gelu,
    gelu_tanh,
    make_feed_forward,
    relu,
    silu,
)
from .generate import beam, greedy, make_stepper, sample
from .gradients import loss_and_grads
from .kernels import KERNELS, fused_kernels, fused_kernels_enabled, use_fused_kernels
from .layer_norm import LayerNorm, RMSNorm, make_norm
from .layers import Dropout, Linear, seed_dropout
from .loss import cross_entropy
from .masks import (
    make_causal_mask,
    make_cross_attention_mask,
    make_decoder_mask,
    make_padding_mask,
    make_target_mask,
)
from .model import (
    MODEL_CLASSES,
    Generator,
    Pooler,
    Transformer,
    TransformerEncoderModel,
    TransformerLM,
)
from .optim import Adam
from .params import build_model, from_params, load_model, to_params
from .positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    rotary_tables,
    rotate_pairs,
    sinusoidal_table,
)
from .sublayer import sublayer_connection
from .tiled_attention import TiledAttention, tiled_attention
from .trace import named_modules, trace_model
from .train import train, train_step

BACKEND = "numpy"

__all__ = [
    "data_parallel_loss_and_grads",
    "data_parallel_train",
    "use_fused_kernels",
    "fused_kernels_enabled",
    "fused_kernels",
    "KERNELS",
    "Dropout",
    "seed_dropout",
    "named_modules",
    "trace_model",
    "Adam",
    "ACTIVATIONS",
    "BACKEND",
    "MODEL_CLASSES",
    "AttentionHead",
    "Decoder",
    "DecoderLayer",
    "Embeddings",
    "Encoder",
    "EncoderLayer",
    "GatedFeedForward",
    "Generator",
    "LayerNorm",
    "LearnedPositionalEmbedding",
    "Linear",
    "ModelOutput",
    "MultiHeadAttention",
    "MultiHeadAttentionLoop",
    "Pooler",
    "RMSNorm",
    "RotaryEmbedding",
    "PositionwiseFeedForward",
    "SinusoidalPositionalEncoding",
    "TiledAttention",
    "TokenEmbedding",
    "Transformer",
    "TransformerEncoderModel",
    "TransformerLM",
    "beam",
    "build_model",
    "compiled",
    "cross_entropy",
    "from_params",
    "gelu",
    "gelu_tanh",
    "greedy",
    "load_model",
    "loss_and_grads",
    "make_causal_mask",
    "make_feed_forward",
    "make_norm",
    "make_cross_attention_mask",
    "make_decoder_mask",
    "make_padding_mask",
    "make_stepper",
    "make_target_mask",
    "masked_softmax",
    "relu",
    "repeat_kv",
    "rotary_tables",
    "rotate_pairs",
    "sample",
    "scaled_dot_product_attention",
    "silu",
    "sinusoidal_table",
    "sublayer_connection",
    "tiled_attention",
    "to_params",
    "train",
    "train_step",
]
