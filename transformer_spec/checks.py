"""Input checks shared by the three backends.

Each backend reads shapes, dtypes and value ranges off its own arrays and hands
plain Python values to these functions, so the rule and the error message are
written once and are the same in NumPy, JAX and PyTorch.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from .schema import Schema


class WeightsError(ValueError):
    """A weights dict that does not fit the config (missing, unexpected, mis-shaped keys)."""


class WeightsFileError(ValueError):
    """A file that is not one of our safetensors weights files."""


# ------------------------------------------------------------- checked once, where they enter
# A model checks and converts its inputs in the first line of its forward (``check_inputs``);
# each component checks its own, cheaply (shapes and dtypes), in the first line of its forward,
# so that one called on its own refuses bad input with the same message. A caller that has
# checked what a whole pass will see and then runs it in another dtype (a mixed-precision pass,
# whose activations are bf16 beside float32 weights) or step by step (cached decoding) says so
# with ``inputs_checked()``: inside, the component checks return at once. The state is per
# thread: a model checking its inputs in one thread skips nothing in another.
_checked = threading.local()


@contextmanager
def inputs_checked() -> Iterator[None]:
    """Inside: the caller has checked every input; component checks are skipped."""
    depth = getattr(_checked, "depth", 0)
    _checked.depth = depth + 1
    try:
        yield
    finally:
        _checked.depth = depth


def caller_checked() -> bool:
    """Whether a caller (a model's entry) has already checked the inputs of this call."""
    return getattr(_checked, "depth", 0) > 0


def host_array(name: str, x: Any) -> np.ndarray:
    """A Python list or tuple (nested), or another framework's array -> a NumPy array, read as
    ``np.asarray`` reads it. What a model accepts besides its own arrays, in every backend.

    A torch tensor is detached and copied to the host first, duck-typed (this package imports
    no framework); a JAX array converts through ``__array__``. Ragged nesting (rows of unequal
    length) is refused here, with one message in every backend."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, perhaps on a GPU
        x = x.detach().cpu().numpy()
    try:
        return np.array(x)  # a copy, writable: the caller's array stays theirs (a JAX array's is read-only)
    except ValueError:  # NumPy's "inhomogeneous shape"
        raise ValueError(
            f"{name} must be an array, or nested lists or tuples with rows of equal length, got a ragged "
            f"{type(x).__name__}"
        ) from None


def _shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(d)) for d in shape) + ")"


def check_token_ids(
    name: str,
    shape: Sequence[int],
    dtype: str,
    is_integer: bool,
    vocab_size: int,
    max_len: int | None,
    offset: int = 0,
) -> None:
    """ids must be an integer (B, T) array whose positions offset .. offset + T - 1 are < max_len."""
    if caller_checked():
        return
    check_integer_ids(name, dtype, is_integer)
    if len(shape) != 2:
        raise ValueError(f"{name} must have shape (batch, seq_len), got shape {_shape(shape)}")
    if shape[0] == 0:  # refused up front: the layers' reshapes and JAX's steps fail on it obscurely
        raise ValueError(f"{name} must hold at least one sequence, got shape {_shape(shape)}")
    if shape[1] == 0:
        raise ValueError(f"{name} must hold at least one token, got shape {_shape(shape)}")
    if offset < 0:  # NumPy and torch slices would read the positional table from its end, JAX clamp
        raise ValueError(f"{name} cannot start at position {offset}: positions count from 0")
    if max_len is not None and offset + shape[1] > max_len:
        start = f" starting at position {offset}" if offset else ""
        raise ValueError(
            f"{name} has sequence length {shape[1]}{start} but the model's max_len is {max_len} "
            f"(the positional table has {max_len} rows)"
        )


def check_integer_ids(name: str, dtype: str, is_integer: bool) -> None:
    """Token ids are integers of any width, signed or not; not floats, not bool (a bool is no id)."""
    if not is_integer:
        raise TypeError(f"{name} must be integer token ids, got dtype {dtype}")


def check_rows(offset: int, seq_len: int, max_len: int) -> None:
    """Rows offset .. offset + seq_len - 1 of a (max_len, ...) positional table (sinusoids, learned
    positions, rotary angles). Outside it NumPy and torch slices silently return fewer rows (a
    shape error later, or none) and JAX silently clamps to other rows: refused in every backend.
    (A traced offset, JAX's compiled decoding step, was checked eagerly by the stepper.)"""
    if caller_checked() or is_traced(offset):
        return
    if offset < 0:
        raise ValueError(f"positions cannot start at {offset}: they count from 0")
    if offset + seq_len > max_len:
        raise ValueError(
            f"positions {offset} .. {offset + seq_len - 1} are past the positional table's {max_len} rows "
            f"(the model's max_len is {max_len})"
        )


def check_token_id_range(name: str, bad_ids: Sequence[int], vocab_size: int) -> None:
    """``bad_ids``: the distinct ids outside [0, vocab_size), as the backend found them."""
    if caller_checked():
        return
    if len(bad_ids):
        shown = sorted(int(i) for i in bad_ids)[:8]
        raise ValueError(f"{name} must lie in [0, {vocab_size}) (the vocabulary size), but contains {shown}")


def is_traced(x: Any) -> bool:
    """Whether ``x`` is a JAX tracer (inside ``jax.jit``, ``grad`` or ``vmap``): a shape and a dtype,
    no values yet. Duck-typed, as in ``transformer_spec.trace``: this package imports no framework."""
    return "Tracer" in type(x).__name__


def dtype_name(x: Any) -> str:
    """The name of an array's dtype in any backend: "float32", "int64", "bool" (torch's without its prefix)."""
    return str(x.dtype).removeprefix("torch.")


def check_token_array(name: str, ids: Any, vocab_size: int, max_len: int | None, offset: Any = 0) -> None:
    """``check_token_ids`` and ``check_token_id_range`` on any backend's ids, their values read on a
    host copy: NumPy reads every integer dtype alike, where torch cannot even compare uint16/32/64
    tensors. One check, and one message, in every backend.

    Inside JAX's jit the ids (and a decoding step's position) are tracers, with no values: then
    only their shape and dtype are checked. The models check their ids eagerly, before jit, and
    the JAX steppers their positions; a bad id that gets past fills a row with NaN (loud)."""
    if caller_checked():
        return
    if is_traced(offset):
        offset = 0
    values = None if is_traced(ids) else host_array(name, ids)  # (B, T) on the host
    dtype = ids.dtype if values is None else values.dtype
    integer = np.issubdtype(dtype, np.integer)
    check_token_ids(name, ids.shape, str(dtype), integer, vocab_size, max_len, offset)
    if values is None:
        return
    # NumPy would raise on ids >= vocab_size but silently wrap negative ids around.
    bad = np.unique(values[(values < 0) | (values >= vocab_size)])
    check_token_id_range(name, bad.tolist(), vocab_size)


def check_mask(name: str, shape: Sequence[int] | None, dtype: str, is_bool: bool, expected: Sequence[int]) -> None:
    """A mask is boolean (True = may attend) with as many dims as the scores ``expected``
    (B, H, T_q, T_k), each of size 1 or equal to the scores'.

    Same rank on purpose: a (B, T_k) padding mask would otherwise broadcast against
    (T_q, T_k) and be silently wrong whenever B == T_q.
    """
    if caller_checked():
        return
    if shape is None:
        return
    dims = "(B, H, T_q, T_k) = " if len(expected) == 4 else ""
    want = f"a boolean mask (True = may attend) broadcastable to {dims}{_shape(expected)} with {len(expected)} dims"
    if not is_bool:
        raise TypeError(f"{name} must be {want}, got dtype {dtype}")
    fits = len(shape) == len(expected) and all(s in (1, e) for s, e in zip(shape, expected, strict=True))
    if not fits:
        raise ValueError(f"{name} must be {want}, got shape {_shape(shape)}")


def check_attention_inputs(q_shape: Sequence[int], k_shape: Sequence[int], v_shape: Sequence[int]) -> None:
    """q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v), same leading dims."""
    if caller_checked():
        return
    q, k, v = tuple(q_shape), tuple(k_shape), tuple(v_shape)
    ok = len(q) >= 2 and len(q) == len(k) == len(v) and q[:-2] == k[:-2] == v[:-2] and q[-1] == k[-1] and k[-2] == v[-2]
    if not ok:
        raise ValueError(
            "expected q (..., T_q, d_k), k (..., T_k, d_k), v (..., T_k, d_v) with the same leading "
            f"dims, got q {_shape(q)}, k {_shape(k)}, v {_shape(v)}"
        )


def check_block_size(block_size: Any) -> None:
    """A tiled attention's block: a positive int, the number of keys (and values) each step reads."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)):
        raise TypeError(f"block_size must be a positive int (keys per block), got {block_size!r}")
    if block_size < 1:
        raise ValueError(f"block_size must be a positive int (keys per block), got {block_size}")


def check_attention_projections(
    q_shape: Sequence[int], k_shape: Sequence[int], v_shape: Sequence[int], d_model: int
) -> None:
    """Multi-head attention inputs: query (B, T_q, d_model), key and value (B, T_k, d_model)."""
    if caller_checked():
        return
    q, k, v = tuple(q_shape), tuple(k_shape), tuple(v_shape)
    ok = (
        len(q) == len(k) == len(v) == 3 and q[-1] == k[-1] == v[-1] == d_model and q[0] == k[0] == v[0] and k[1] == v[1]
    )
    if not ok:
        raise ValueError(
            f"expected query (B, T_q, d_model={d_model}), key and value (B, T_k, d_model={d_model}), "
            f"got query {_shape(q)}, key {_shape(k)}, value {_shape(v)}"
        )


def check_cache_holds_keys(key: Any, value: Any, has_cache: bool) -> None:
    """Attention given no key and value (None) reads every key and value from its cache: decoding's
    cross-attention, whose cache holds the memory's, projected once before the first step."""
    if (key is None) != (value is None):
        raise ValueError(
            "key and value must both be arrays (B, T_k, d_model), or both None (the cache holds them), "
            f"got key {'None' if key is None else 'an array'} and value {'None' if value is None else 'an array'}"
        )
    if not has_cache:
        raise ValueError("key and value are None but no cache holds them: pass arrays (B, T_k, d_model)")


def check_hidden(name: str, shape: Sequence[int], d_model: int) -> None:
    """Activations entering a layer: (B, T, d_model)."""
    if caller_checked():
        return
    if len(shape) != 3 or shape[-1] != d_model:
        raise ValueError(f"{name} must have shape (batch, seq_len, d_model={d_model}), got {_shape(shape)}")


def check_features(name: str, shape: Sequence[int], d_model: int) -> None:
    """The input of a norm or a feed-forward: (..., d_model), any leading dims."""
    if caller_checked():
        return
    if len(shape) == 0 or shape[-1] != d_model:
        raise ValueError(f"{name} must have shape (..., d_model={d_model}), got {_shape(shape)}")


def check_same_batch(names: tuple[str, str], shapes: tuple[Sequence[int], Sequence[int]]) -> None:
    if caller_checked():
        return
    if shapes[0][0] != shapes[1][0]:
        raise ValueError(
            f"{names[0]} and {names[1]} must have the same batch size, got {_shape(shapes[0])} and {_shape(shapes[1])}"
        )


def check_float_dtype(name: str, dtype: str) -> None:
    if dtype not in ("float32", "float64"):
        raise TypeError(f"{name} must be float32 or float64, got {dtype}")


def check_float_inputs(names: Sequence[str], dtypes: Sequence[str], weights_dtype: str | None = None) -> None:
    """A component's float inputs: float32 or float64, all one dtype, and the dtype of its weights
    (``weights_dtype``; None for a function without weights).

    Mixed dtypes are refused rather than resolved: NumPy would promote to float64, JAX cast to
    the weights' dtype (Flax's ``dtype``), torch raise inside a matmul; three answers to one call."""
    if caller_checked():
        return
    for name, dtype in zip(names, dtypes, strict=True):
        check_float_dtype(name, dtype)
    if len(set(dtypes)) > 1:
        found = ", ".join(f"{name} {dtype}" for name, dtype in zip(names, dtypes, strict=True))
        raise TypeError(f"{', '.join(names)} must share one dtype, got {found}: cast them to one first")
    if weights_dtype is not None and dtypes[0] != weights_dtype:
        raise TypeError(
            f"{names[0]} is {dtypes[0]} but the weights are {weights_dtype}: cast the input to {weights_dtype}, "
            f"or build the module in {dtypes[0]}"
        )


def check_params(params: Mapping[str, Sequence[int]], schema: Schema, what: str = "the config") -> None:
    """``params`` maps names to shapes. Raise WeightsError naming every key that does not fit."""
    missing = [k for k in schema if k not in params]
    unexpected = [k for k in params if k not in schema]
    misshaped = [
        f"{k}: expected {_shape(schema[k])}, got {_shape(params[k])}"
        for k in schema
        if k in params and tuple(params[k]) != tuple(schema[k])
    ]
    problems = []
    if missing:
        problems.append(f"missing keys {missing}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
        shared = [k for k in unexpected if k.endswith("src_embed.token.weight")]
        if [k for k in shared if k.replace("src_embed", "tgt_embed") in schema]:
            problems[-1] += (
                " (share_embeddings=True: the source reads the target's table, tgt_embed.token.weight; "
                "two tables need share_embeddings=False)"
            )
    if misshaped:
        problems.append("wrong shapes [" + "; ".join(misshaped) + "]")
    if problems:
        raise WeightsError(f"weights do not fit {what}: " + ", ".join(problems))


def check_same_shape(names: tuple[str, str], shapes: tuple[Sequence[int], Sequence[int]]) -> None:
    if caller_checked():
        return
    if tuple(shapes[0]) != tuple(shapes[1]):
        raise ValueError(
            f"{names[0]} must have the same shape as {names[1]} {_shape(shapes[1])}, got {_shape(shapes[0])}"
        )


def check_no_token_types() -> None:
    raise ValueError("token_type_ids given, but the config has type_vocab_size=0 (no token-type embedding)")


def check_table(own: Any, table: Any) -> None:
    """A token embedding without a table of its own (the source side of ``share_embeddings``)
    reads the one its model passes in; called alone, it has none to read."""
    if own is None and table is None:
        raise ValueError(
            "this token embedding has no table of its own: its model shares the target's "
            "(share_embeddings=True); call the model, or pass table=model.tgt_embed.token.weight"
        )


def check_params_dtype(dtypes: Mapping[str, str]) -> str:
    """All weights share one float dtype (float32 or float64); returns it."""
    found = sorted(set(dtypes.values()))
    if len(found) > 1 or (found and found[0] not in ("float32", "float64")):
        by_dtype = {d: [k for k, v in dtypes.items() if v == d][:3] for d in found}
        raise WeightsError(f"weights must all be float32 or all float64, got {by_dtype}")
    return found[0] if found else "float32"


def check_dtype_request(dtype: str) -> None:
    if dtype not in ("float32", "float64"):
        raise TypeError(f"dtype must be 'float32' or 'float64', got {dtype!r}")


def check_model_kind(class_name: str, expected: str, kind: str) -> None:
    if kind != expected:
        raise ValueError(f"{class_name} needs a config with kind={expected!r}, got kind={kind!r}")


def check_loss_inputs(logits_shape: Sequence[int], targets_shape: Sequence[int], label_smoothing: float) -> None:
    """cross_entropy: logits (B, T, V), targets (B, T), 0 <= label_smoothing <= 1."""
    if len(logits_shape) != 3 or tuple(logits_shape[:2]) != tuple(targets_shape):
        raise ValueError(
            f"cross_entropy needs logits (batch, seq_len, vocab) and targets (batch, seq_len), "
            f"got logits {_shape(logits_shape)} and targets {_shape(targets_shape)}"
        )
    number = isinstance(label_smoothing, (int, float)) and not isinstance(label_smoothing, bool)
    if not number or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"label_smoothing must be a number in [0, 1], got {label_smoothing!r}")
