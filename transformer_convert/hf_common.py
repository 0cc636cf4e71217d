"""What the Hugging Face converters (``hf_llama``, ``hf_gpt2``, ``hf_marian``) share.

A converter reads a Hugging Face ``config.json`` (as a dict) into our ``Config``, refusing
every setting our model cannot compute, and moves a state dict between Hugging Face's
names and layout and our canonical weights (``param_schema``: every Linear [in, out]).
Both directions check every key and shape against a schema, so that a checkpoint of
another size, an extra layer or a packed tensor with a row too many is an error naming
the keys, never silently dropped or truncated:

- ``hf_schema`` (each converter's): Hugging Face name -> shape, the weights we need;
- ``optional``: keys a state dict may also hold, each checked: tied copies (``lm_head.weight``
  in a tied model's ``state_dict()``) must equal their source; buffers that are not weights
  (a causal mask, a sinusoid table, rotary frequencies) must hold what the config implies.

Dropout is a training-time setting and Hugging Face puts it in other places than ours
(attention dropout, activation dropout, embedding dropout at separate rates): a converted
``Config`` has ``dropout=0.0``, the inference model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from transformer_spec.checks import WeightsError, check_params
from transformer_spec.schema import Schema

_REQUIRED = object()


def field(hf: Mapping[str, Any], name: str, default: Any = _REQUIRED, model: str = "Hugging Face") -> Any:
    """``hf[name]``, or ``default`` when absent; a missing required field is a ValueError naming it."""
    if name in hf:
        return hf[name]
    if default is _REQUIRED:
        raise ValueError(f"{model} config has no {name!r} field")
    return default


def refuse(model: str, name: str, value: Any, why: str) -> ValueError:
    """The error for a setting our model does not compute: names the field and its value."""
    return ValueError(f"{model} config: {name}={value!r} is not supported ({why})")


def activation(model: str, name: str, value: Any, table: Mapping[str, str]) -> str:
    """A Hugging Face activation name (``ACT2FN``'s) -> ours, or an error listing what we have."""
    if value not in table:
        raise refuse(model, name, value, f"our activations are {sorted(table)} in Hugging Face's names")
    return table[value]


def resolve_pad_id(model: str, hf: Mapping[str, Any], vocab_size: int, given: int | None) -> int:
    """The id our model hides as padding: ``given``, else the config's ``pad_token_id``.

    Our models build their padding mask from ``config.pad_id`` (a token equal to it is never
    attended to), while Hugging Face's take an ``attention_mask``. A config without a pad token
    is refused rather than guessed: the id must be one that never occurs inside real text."""
    value = given if given is not None else hf.get("pad_token_id")
    if value is None:
        raise ValueError(
            f"{model} config has pad_token_id=None, but our model hides one token id as padding: pass pad_id= "
            f"an id that never occurs inside real text (e.g. an end-of-text token that is not used inside prompts)"
        )
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise ValueError(f"{model}: pad id {value!r} is not an id of the vocabulary [0, {vocab_size})")
    return value


def check_state_dict(
    state_dict: Mapping[str, Any], required: Schema, optional: Schema, what: str
) -> dict[str, np.ndarray]:
    """``state_dict`` as NumPy arrays, once every ``required`` key is there with its shape and every
    other key is one of ``optional`` with its shape (raises ``WeightsError`` naming the rest)."""
    arrays = {name: np.asarray(value) for name, value in state_dict.items()}
    schema = required | {name: shape for name, shape in optional.items() if name in arrays}
    check_params({name: value.shape for name, value in arrays.items()}, schema, what=what)
    return arrays


def check_tied_copy(arrays: Mapping[str, np.ndarray], copy: str, source: str, why: str) -> None:
    """A tied copy, if the state dict holds it, must be the very same table as its source."""
    if copy in arrays and not np.array_equal(arrays[copy], arrays[source]):
        raise WeightsError(f"{copy} differs from {source}, but {why}: a tied copy must equal its source")


def check_buffer(arrays: Mapping[str, np.ndarray], name: str, expected: Callable[[], np.ndarray], what: str) -> None:
    """A buffer that is not a weight, if present, must hold what the config implies (to float32
    rounding: checkpoints store such tables in float32 whatever the model's dtype)."""
    if name not in arrays:
        return
    want = expected()
    got = np.asarray(arrays[name], dtype=np.float64)
    if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
        worst = float(np.abs(got - want).max())
        raise WeightsError(f"{name} is not {what} (max |difference| {worst:.3g}): not a checkpoint of this config")


def hf_shapes(pairs: Mapping[str, tuple[str, Callable]], schema: Schema) -> Schema:
    """``pairs``: canonical name -> (Hugging Face name, ``linear`` or ``as_is``) -> Hugging Face name ->
    shape, read off our ``schema`` (a Linear's shape reversed: [out, in])."""
    return {theirs: schema[ours][::-1] if how is linear else schema[ours] for ours, (theirs, how) in pairs.items()}


def linear(weight: np.ndarray) -> np.ndarray:
    """torch ``nn.Linear`` [out, in] <-> our [in, out] (the same transpose both ways)."""
    return np.ascontiguousarray(np.asarray(weight).T)


def as_is(value: np.ndarray) -> np.ndarray:
    """A tensor stored alike in both layouts (a norm's scale, a bias, an embedding table), copied."""
    return np.ascontiguousarray(np.asarray(value))
