"""What a model call returns, the same dataclass in every backend (arrays are the backend's)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class ModelOutput:
    """Fields that do not apply to a model kind are None; tuples are empty unless requested.

    logits:               (B, T_tgt, tgt_vocab) for models with a decoder.
    last_hidden_state:    (B, T, d_model), output of the last stack after its final norm.
    hidden_states:        the last stack's input (the embeddings) and each layer's output.
    attentions:           the last stack's self-attention weights, (B, H, T, T) per layer.
    cross_attentions:     decoder-over-encoder weights, (B, H, T_tgt, T_src) per layer.
    encoder_last_hidden_state, encoder_hidden_states, encoder_attentions:
                          the encoder's, for the encoder-decoder model (its memory first).
    pooler_output:        (B, d_model), BERT's tanh(W h_first + b), for encoder-only models
                          with ``config.pooler``.
    """

    logits: Any = None
    last_hidden_state: Any = None
    hidden_states: tuple = ()
    attentions: tuple = ()
    cross_attentions: tuple = ()
    encoder_last_hidden_state: Any = None
    encoder_hidden_states: tuple = ()
    encoder_attentions: tuple = ()
    pooler_output: Any = None
