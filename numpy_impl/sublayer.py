"""The residual connection around every sub-layer, written once (paper, section 5.4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numpy import ndarray as Array

from .layer_norm import LayerNorm
from .layers import Dropout


def sublayer_connection(
    x: Array,
    sublayer: Callable[[Array], tuple[Array, Any]],
    norm: LayerNorm,
    norm_first: bool,
    dropout: Dropout | None = None,
) -> tuple[Array, Any]:
    """Post-norm (the paper): LayerNorm(x + Dropout(sublayer(x))).
    Pre-norm: x + Dropout(sublayer(LayerNorm(x))).

    ``sublayer`` returns (output, extra), the extra being attention weights or None.
    Pre-norm keeps an un-normalised residual path from input to output, which trains
    deep stacks without warm-up, but then the stack needs a final LayerNorm. Dropout
    (section 5.4: "to the output of each sub-layer, before it is added to the
    sub-layer input") is the identity in inference mode.
    """
    if dropout is None:
        dropout = lambda y: y  # noqa: E731
    if norm_first:
        y, extra = sublayer(norm(x))  # (B, T, d_model)
        return x + dropout(y), extra  # (B, T, d_model)
    y, extra = sublayer(x)  # (B, T, d_model)
    return norm(x + dropout(y)), extra  # (B, T, d_model)


def sublayer_connection_backward(
    grad_output: Array,
    sublayer_backward: Callable[[Array], tuple[Array, Any]],
    norm: LayerNorm,
    norm_first: bool,
    dropout: Dropout | None = None,
) -> tuple[Array, dict[str, Array], Any]:
    """grad_output (B, T, d_model) -> (grad_x (B, T, d_model), the norm's grads, the
    sublayer's rest).

    Each module of the connection kept what its backward needs in its forward call.
    ``sublayer_backward(grad_y)`` -> (grad_h, rest): the gradient with respect to the
    sub-layer's input h, and whatever else it returns (its grads).
    """
    if norm_first:
        # output = x + dropout(sublayer(norm(x))): the residual hands grad_output to x
        # unchanged, and the sub-layer path adds its own part
        # (B, T, d_model)
        grad_y = grad_output if dropout is None else dropout.backward(grad_output)[0]
        grad_h, rest = sublayer_backward(grad_y)  # (B, T, d_model)
        grad_x_through_norm, norm_grads = norm.backward(grad_h)  # (B, T, d_model)
        return grad_output + grad_x_through_norm, norm_grads, rest  # (B, T, d_model)
    # output = norm(x + dropout(sublayer(x))): first back through the norm to the sum
    grad_sum, norm_grads = norm.backward(grad_output)  # (B, T, d_model)
    grad_y = grad_sum if dropout is None else dropout.backward(grad_sum)[0]  # (B, T, d_model)
    grad_x_through_sublayer, rest = sublayer_backward(grad_y)  # (B, T, d_model)
    return grad_sum + grad_x_through_sublayer, norm_grads, rest  # (B, T, d_model)
