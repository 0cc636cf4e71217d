"""Save and load canonical weights as safetensors, with the Config in the metadata; check a
weight dict before a backend loads it into a module.

What loading refuses, saving refuses too (a file this project writes always loads back):
keys or shapes that do not fit the config, weights that are not all float32 or all
float64, and non-finite values (NaN, inf: a diverged run; ``allow_non_finite=True`` lets
them through where they are wanted). A file is written atomically (a temporary file in
the same folder, flushed to disk, then renamed over the old one), so a process killed in
the middle of a save leaves the previous file whole, and byte for byte the same for the
same weights and config: the header's keys are in sorted order, whatever the process.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import numpy as np
from safetensors import SafetensorError, safe_open

from .checks import WeightsError, WeightsFileError, check_dtype_request, check_params, check_params_dtype
from .config import Config
from .schema import Schema, param_schema

FORMAT = "transformer_spec/1"
TRAINING = "training"  # metadata key of a training checkpoint (transformer_run.checkpoint)
_SAFETENSORS_DTYPES = {"float32": "F32", "float64": "F64"}


# ------------------------------------------------------------------------------- saving
def save_params(
    path: str | os.PathLike,
    params: Mapping[str, Any],
    config: Config,
    *,
    allow_non_finite: bool = False,
) -> None:
    """Write ``params`` and ``config`` to ``path``, atomically. Refuses (``WeightsError``)
    what :func:`load_params` would refuse: keys or shapes that do not fit ``config``'s schema,
    weights not all float32 or all float64, non-finite values (unless ``allow_non_finite``)."""
    arrays = check_weights(params, config, allow_non_finite=allow_non_finite)
    write_safetensors(path, arrays, {"format": FORMAT, "config": config.to_json()})


def check_weights(
    params: Mapping[str, Any], config: Config, *, allow_non_finite: bool = False, what: str = "the config"
) -> dict[str, np.ndarray]:
    """``params`` as NumPy arrays, once they fit ``config``'s schema, share one float dtype and
    are finite (``allow_non_finite``: NaN and inf pass). Raises ``WeightsError`` naming the keys."""
    if not isinstance(config, Config):
        raise TypeError(f"config must be a transformer_spec.Config, got {type(config).__name__}")
    check_params_container(params)
    arrays = {str(name): np.asarray(value) for name, value in params.items()}
    check_params({k: v.shape for k, v in arrays.items()}, param_schema(config), what=what)
    check_params_dtype({k: str(v.dtype) for k, v in arrays.items()})
    if not allow_non_finite:
        check_finite(arrays)
    return arrays


def check_finite(arrays: Mapping[str, Any]) -> None:
    """Every value finite, or ``WeightsError`` naming each key that holds NaN or inf and how many."""
    counts = {}
    for name, value in arrays.items():
        bad = int(np.size(value) - np.count_nonzero(np.isfinite(value)))
        if bad:
            counts[name] = (bad, int(np.size(value)))
    if counts:
        shown = "; ".join(f"{name}: {bad} of {size}" for name, (bad, size) in list(counts.items())[:8])
        more = f" (and {len(counts) - 8} more keys)" if len(counts) > 8 else ""
        raise WeightsError(
            f"weights hold non-finite values (NaN or inf) in {len(counts)} keys: {shown}{more}; "
            "pass allow_non_finite=True to load them anyway"
        )


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
    """A safetensors file with the tensors in name order and the metadata's keys sorted, written
    atomically (see :func:`write_atomically`). The same input gives the same bytes in any process:
    safetensors' own writer keeps the metadata in a hash map whose order changes from call to call.

    The tensors must share one dtype (float32 or float64), so that each one starts aligned."""
    names = sorted(tensors)
    header: dict[str, Any] = {"__metadata__": {key: str(metadata[key]) for key in sorted(metadata)}}
    offset = 0
    for name in names:
        value = tensors[name]
        size = value.size * value.dtype.itemsize
        header[name] = {"dtype": _SAFETENSORS_DTYPES[str(value.dtype)], "shape": list(value.shape),
                        "data_offsets": [offset, offset + size]}  # fmt: skip
        offset += size
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors pads it

    def write(f: BinaryIO) -> None:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for name in names:
            value = tensors[name]
            # its own memory, little-endian, written as it lies (a copy only where it is not so)
            f.write(memoryview(np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<"))).cast("B"))

    write_atomically(path, write)


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """``write(f)`` into a new temporary file next to ``path``, flushed to disk (fsync), then
    renamed over ``path`` (``os.replace``, atomic): a reader, or a run killed at any moment,
    sees the old file or the new one, never half of one. The temporary file is removed if
    ``write`` fails; a process killed before the rename leaves it behind (``.<name>.*.tmp``)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {path!r}: the folder {directory!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {path!r}: it is a folder")
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to open()
    try:
        with os.fdopen(descriptor, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it the file
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    with contextlib.suppress(OSError):  # the rename itself on disk (POSIX; not possible everywhere)
        folder = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


# ------------------------------------------------------------------------------ loading
def load_params(path: str | os.PathLike, *, allow_non_finite: bool = False) -> tuple[dict[str, np.ndarray], Config]:
    """Read a file written by :func:`save_params` (or a training checkpoint: its weights);
    returns ``(params, config)``. ``WeightsFileError`` for a file that is not one of ours or
    whose stored config is not valid (naming the field and the value); ``WeightsError`` for
    weights that do not fit that config, are not all float32 or all float64, or hold NaN or
    inf (unless ``allow_non_finite``), naming the keys."""
    tensors, metadata, config = read_safetensors(path)
    params = {k: v for k, v in tensors.items() if not (TRAINING in metadata and k.startswith("optimizer."))}
    arrays = check_weights(params, config, allow_non_finite=allow_non_finite, what=f"the config stored in {path!r}")
    return arrays, config


def read_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str], Config]:
    """One of our files -> (every tensor, the metadata, the stored Config, checked)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise WeightsFileError(f"{path!r} is not a file; expected a transformer_spec safetensors weights file")
    try:
        with safe_open(path, framework="numpy") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as error:
        raise WeightsFileError(
            f"{path!r} is not a safetensors file ({error}); expected a transformer_spec weights file"
        ) from None
    if metadata.get("format") != FORMAT or "config" not in metadata:
        raise WeightsFileError(
            f"{path!r} is a safetensors file without transformer_spec metadata: expected "
            f"format={FORMAT!r} and a config, got metadata keys {sorted(metadata)}"
        )
    return tensors, metadata, stored_config(path, metadata["config"])


def stored_config(path: str, text: str) -> Config:
    """The Config of a file's metadata: a JSON object with every field of Config, each valid.

    Every field is required: ``save_params`` writes them all, and a field left out would
    silently take its default (``norm_first`` False for a pre-norm model: a wrong model that
    loads without an error, as no weight's shape depends on it)."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise ValueError(f"fields given twice: {repeated}")
        return dict(pairs)

    try:
        values = json.loads(text, object_pairs_hook=no_duplicates)
    except ValueError as error:  # json.JSONDecodeError is one
        raise WeightsFileError(f"{path!r} holds a config that is not valid JSON: {error}") from None
    try:
        return Config.from_dict(values, complete=True)
    except (ValueError, TypeError) as error:
        raise WeightsFileError(f"{path!r} holds an invalid config: {error}") from None


def check_params_container(params: Any) -> None:
    """Weights come as a mapping of canonical names to arrays; anything else (None, a list of
    (name, array) pairs, a module) is refused here, naming what came, before any key is read."""
    if not isinstance(params, Mapping):
        hint = " (dict(pairs) makes one from (name, array) pairs)" if isinstance(params, (list, tuple)) else ""
        raise TypeError(f"params must be a dict of canonical names -> arrays, got {type(params).__name__}{hint}")


def check_weights_to_load(
    module_class: type,
    config: Config,
    params: Mapping[str, Any],
    dtype: str | None,
    allow_non_finite: bool = False,
) -> tuple[Schema, str]:
    """Before a backend's ``from_params(module_class, config, params, dtype)`` loads ``params``:
    every key fits the schema of ``module_class.schema`` (``WeightsError`` names each one that
    does not), the weights share one float dtype, every value is finite (``WeightsError``
    naming each key holding NaN or inf and how many, unless ``allow_non_finite``), and
    ``dtype`` (None: theirs) is float32 or float64. -> (that schema, the dtype to load the weights in)."""
    check_params_container(params)
    schema = param_schema(config, module_class.schema)
    check_params({k: tuple(np.shape(v)) for k, v in params.items()}, schema, what=f"{module_class.__name__}'s config")
    found = check_params_dtype({k: str(np.asarray(v).dtype) for k, v in params.items()})
    if not allow_non_finite:
        check_finite({k: np.asarray(v) for k, v in params.items()})
    dtype = dtype or found
    check_dtype_request(dtype)
    return schema, dtype
