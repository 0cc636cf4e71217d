"""The Transformer in JAX + Flax NNX (float32, or float64 with jax_enable_x64): a translation
of numpy_impl."""

import jax

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

# Matmul precision, set once for the process as torch's is: without it JAX lets a GPU or TPU run
# a float32 matmul as TF32 or bf16 passes (about 3 significant digits), far from the NumPy
# reference; torch's float32 matmuls are full precision unless a user allows TF32.
jax.config.update("jax_default_matmul_precision", "highest")

BACKEND = "jax"

__all__ = [
    "data_parallel_loss_and_grads",
    "data_parallel_train",
    "Dropout",
    "seed_dropout",
    "named_modules",
    "trace_model",
    "Adam",
    "ACTIVATIONS",
    "KERNELS",
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
    "fused_kernels",
    "fused_kernels_enabled",
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
    "use_fused_kernels",
]
