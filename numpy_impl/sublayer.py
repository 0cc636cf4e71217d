"""The residual connection around every sub-layer, written once (paper, section 5.4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .layer_norm import LayerNorm
from .layers import Dropout


def sublayer_connection(
    x: np.ndarray,
    sublayer: Callable[[np.ndarray], tuple[np.ndarray, Any]],
    norm: LayerNorm,
    norm_first: bool,
    dropout: Dropout | None = None,
) -> tuple[np.ndarray, Any]:
    """Post-norm (the paper): LayerNorm(x + Dropout(sublayer(x))). Pre-norm: x + Dropout(sublayer(LayerNorm(x))).

    ``sublayer`` returns (output, extra), the extra being attention weights or None.
    Pre-norm keeps an un-normalised residual path from input to output, which trains
    deep stacks without warm-up, but then the stack needs a final LayerNorm. Dropout
    (section 5.4: "to the output of each sub-layer, before it is added to the
    sub-layer input") is the identity in inference mode.
    """
    result, _ = sublayer_connection_for_backward(x, lambda h: (sublayer(h), None), norm, norm_first, dropout)
    return result


def sublayer_connection_for_backward(
    x: np.ndarray,
    sublayer: Callable[[np.ndarray], tuple[tuple[np.ndarray, Any], Any]],
    norm: LayerNorm,
    norm_first: bool,
    dropout: Dropout | None = None,
) -> tuple[tuple[np.ndarray, Any], tuple]:
    """``sublayer_connection`` that also keeps what its backward needs: -> ((output, extra), saved).

    Here ``sublayer`` is a ``forward_for_backward``: ``sublayer(h)`` -> ((output, extra), its saved).
    """
    dropout_saved = None
    if norm_first:
        h, norm_saved = norm.forward_for_backward(x)  # (B, T, d_model)
        (y, extra), sublayer_saved = sublayer(h)  # (B, T, d_model)
        if dropout is not None:
            y, dropout_saved = dropout.forward_for_backward(y)  # (B, T, d_model)
        return (x + y, extra), (norm_saved, sublayer_saved, dropout_saved)
    (y, extra), sublayer_saved = sublayer(x)  # (B, T, d_model)
    if dropout is not None:
        y, dropout_saved = dropout.forward_for_backward(y)  # (B, T, d_model)
    output, norm_saved = norm.forward_for_backward(x + y)  # (B, T, d_model)
    return (output, extra), (norm_saved, sublayer_saved, dropout_saved)


def sublayer_connection_backward(
    saved: tuple,
    grad_output: np.ndarray,
    sublayer_backward: Callable[[Any, np.ndarray], tuple[np.ndarray, Any]],
    norm: LayerNorm,
    norm_first: bool,
    dropout: Dropout | None = None,
) -> tuple[np.ndarray, dict[str, np.ndarray], Any]:
    """grad_output (B, T, d_model) -> (grad_x (B, T, d_model), the norm's grads, the sublayer's rest).

    ``sublayer_backward(sublayer_saved, grad_y)`` -> (grad_h, rest): the gradient with
    respect to the sub-layer's input h, and whatever else it returns (its grads).
    """
    norm_saved, sublayer_saved, dropout_saved = saved
    if norm_first:
        # output = x + dropout(sublayer(norm(x))): the residual hands grad_output to x
        # unchanged, and the sub-layer path adds its own part
        grad_y = grad_output if dropout is None else dropout.backward(dropout_saved, grad_output)[0]
        grad_h, rest = sublayer_backward(sublayer_saved, grad_y)  # (B, T, d_model)
        grad_x_through_norm, norm_grads = norm.backward(norm_saved, grad_h)  # (B, T, d_model)
        return grad_output + grad_x_through_norm, norm_grads, rest
    # output = norm(x + dropout(sublayer(x))): first back through the norm to the sum
    grad_sum, norm_grads = norm.backward(norm_saved, grad_output)  # (B, T, d_model)
    grad_y = grad_sum if dropout is None else dropout.backward(dropout_saved, grad_sum)[0]
    grad_x_through_sublayer, rest = sublayer_backward(sublayer_saved, grad_y)  # (B, T, d_model)
    return grad_sum + grad_x_through_sublayer, norm_grads, rest


def without_extra(forward_for_backward: Callable[[np.ndarray], tuple[np.ndarray, Any]]) -> Callable:
    """Adapts a sub-layer without an extra output (the feed-forward network) to the
    protocol above: h -> ((output, None), saved)."""

    def sublayer(h: np.ndarray) -> tuple[tuple[np.ndarray, None], Any]:
        output, saved = forward_for_backward(h)  # (B, T, d_model)
        return (output, None), saved

    return sublayer
