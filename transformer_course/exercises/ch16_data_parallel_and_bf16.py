"""Chapter 16, data parallel and bf16 mixed precision: the replicas' gradients weighed by their tokens, and a
float32 array rounded to bfloat16."""

from __future__ import annotations

import numpy as np

from transformer_run.data_parallel import shard
from transformer_spec import Config, init_params, param_schema

from ..check import Exercise, Mistake

# ------------------------------------------------------------------ average_gradients
CONFIG = Config.preset("tiny-lm", num_decoder_layers=1)  # one layer: JAX compiles its step in half the time
ROWS, LENGTH = 8, 8  # every case's global batch: 8 rows of 8 targets (one shape: JAX compiles once)


def _row_lengths(count: int, rows: int) -> list[int]:
    """``count`` real targets over ``rows`` rows of LENGTH, the first rows full: 12 over 2 rows -> [8, 4]."""
    return [min(LENGTH, max(0, count - LENGTH * row)) for row in range(rows)]


def _batch(counts) -> dict[str, np.ndarray]:
    """A right-padded global batch of ROWS rows shared by len(counts) replicas (rows split evenly, in
    order), replica r's rows holding counts[r] real targets. Every row starts with one real token."""
    counts = [int(c) for c in counts]
    rows = ROWS // len(counts)
    lengths = [n for c in counts for n in _row_lengths(c, rows)]  # real targets per row
    ids = np.random.default_rng(16).integers(4, CONFIG.tgt_vocab_size, (ROWS, LENGTH + 1))
    for row, length in enumerate(lengths):
        ids[row, length + 1 :] = CONFIG.pad_id  # a row of n targets reads n + 1 tokens
    return {"ids": ids[:, :-1], "targets": ids[:, 1:]}


def _flat(grads: dict[str, np.ndarray]) -> np.ndarray:
    """Every parameter's gradient, in the schema's order, as one vector (P,)."""
    return np.concatenate([np.ravel(grads[name]) for name in param_schema(CONFIG)])


def _average_cases():
    import numpy_impl  # each replica's own gradient, as the replica computes it: its rows, its mean

    model = numpy_impl.build_model(CONFIG, init_params(CONFIG, seed=0, dtype="float64"))
    cases = []
    for description, counts in [
        ("4 replicas holding 16, 12, 5 and 3 real targets", [16, 12, 5, 3]),
        ("2 replicas, the second all padding: 20 and 0 targets", [20, 0]),
        ("8 replicas, one row each: 8, 8, 7, 5, 3, 2, 2, 1 targets", [8, 8, 7, 5, 3, 2, 2, 1]),
        ("one replica: nothing to average", [29]),
        ("2 replicas, both all padding: no target anywhere, the gradient is 0", [0, 0]),
    ]:
        batch = _batch(counts)
        grads = [_flat(numpy_impl.loss_and_grads(model, shard(CONFIG, batch, rank, len(counts)))[1])
                 for rank in range(len(counts))]  # fmt: skip
        cases.append((description, {"grads": np.stack(grads), "counts": np.array(counts)}))
    return cases


def _average_expected(b, x):
    """The backend's own single-device gradient of the whole global batch: what the replicas must add up to."""
    model = b.impl.build_model(CONFIG, init_params(CONFIG, seed=0, dtype="float64"))
    _, grads = b.impl.loss_and_grads(model, _batch(x["counts"]))
    return _flat(grads)


def _weights(counts) -> np.ndarray:
    counts = np.asarray(counts, np.float64)
    return counts / max(counts.sum(), 1.0)


# ------------------------------------------------------------------ to_bfloat16
def _from_bits(bits) -> np.ndarray:
    return np.asarray(bits, np.uint32).view(np.float32)


def _bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def _bf16_cases():
    rng = np.random.default_rng(16)
    ordinary = (rng.standard_normal((4, 6)) * 10.0 ** rng.integers(-3, 4, (4, 6))).astype(np.float32)
    high = rng.integers(0x3C00, 0x4400, 16).astype(np.uint32)  # bf16 patterns from 2^-7 to 2^9
    high = (high & ~np.uint32(1)) | (np.arange(16, dtype=np.uint32) % 2)  # even and odd last bits, alternating
    high[::4] |= np.uint32(0x8000)  # some negative
    ties = _from_bits((high << np.uint32(16)) | np.uint32(0x8000)).reshape(2, 8)  # exactly halfway
    edges = np.array(
        [1e-30, -3e-20, 1e20, 3e38, 1e-40, -3e-39, 0.0, -0.0,  # beyond float16; subnormal; zeros
         _from_bits(0x3FFFFFFF), _from_bits(0x3F7FFFFF), _from_bits(0x3F808001), _from_bits(0xBF807FFF)],
        np.float32,
    )  # fmt: skip
    special = _from_bits(np.array(
        [0x7FC00000, 0x7FFFFFFF, 0x7F800001, 0xFFC00001, 0xFF80FFFF,  # NaNs: quiet, all ones, tiny payloads, signed
         0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF],  # +-inf; the largest floats, which round to +-inf
        np.uint32,
    ))  # fmt: skip
    return [
        ("normal values from 1e-3 to 1e3, (4, 6)", {"x": ordinary}),
        ("exact ties: the low 16 bits are 0x8000, after even and after odd last bits, (2, 8)", {"x": ties}),
        ("1e-30 to 3e38, subnormals, signed zeros, a carry into the next power of two, just above and below a "
         "tie", {"x": edges}),
        ("NaNs (whatever their payload, in the low bits too), the infinities, the largest floats", {"x": special}),
    ]  # fmt: skip


def _bf16_expected(b, x):
    """The framework's own cast to bfloat16 and back: ml_dtypes' (the NumPy backend's bf16), torch's, JAX's."""
    if b.name == "numpy":
        with np.errstate(invalid="ignore"):  # a signalling NaN's cast raises the invalid flag; it stays a NaN
            return x["x"].astype(b.impl.mixed_precision.BF16).astype(np.float32)
    if b.name == "torch":
        return b.to_numpy(b.asarray(x["x"]).to(b.torch.bfloat16).float())
    return b.to_numpy(b.asarray(x["x"]).astype(b.jnp.bfloat16).astype(b.jnp.float32))


def _truncated(x):
    return _from_bits(_bits(x) & np.uint32(0xFFFF0000))


def _half_up(x):
    return _from_bits((_bits(x) + np.uint32(0x8000)) & np.uint32(0xFFFF0000))


def _nan_rounded(x):
    bits = _bits(x)
    return _from_bits((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000))


EXERCISES = [
    Exercise(
        name="average_gradients",
        chapter="16_data_parallel_and_bf16",
        task="average_gradients(grads, counts) -> (P,): grads (N, P), row r the gradient replica r computed of its "
        "own loss (the mean over its counts[r] non-pad targets), counts (N,) ints; the gradient of the global "
        "batch's loss (the mean over all sum(counts) targets), equal to one device's on the whole batch.",
        cases=_average_cases,
        expected=_average_expected,
        mistakes=(
            Mistake(
                "the mean of the replicas' means",
                "grads.mean(0) weighs a replica of 3 targets as much as one of 16: it is the global gradient only "
                "when every replica holds as many real targets. Weigh replica r by its share of the tokens, "
                "counts[r] / counts.sum() (a replica of padding only weighs 0).",
                lambda grads, counts: grads.mean(axis=0),
            ),
            Mistake(
                "the sum of the replicas' means",
                "each row is already a mean over its replica's tokens: adding them counts the batch N times over. "
                "Weigh each by counts[r] / counts.sum(), weights that add up to 1.",
                lambda grads, counts: grads.sum(axis=0),
            ),
            Mistake(
                "weighted, then averaged again",
                "the token weights counts[r] / counts.sum() already add up to 1; dividing by N once more is "
                "DistributedDataParallel's own averaging on top (torch_impl multiplies each replica's loss by N "
                "before backward for that reason). Sum the weighted rows, no more.",
                lambda grads, counts: _weights(counts) @ grads / len(counts),
            ),
        ),
    ),
    Exercise(
        name="to_bfloat16",
        chapter="16_data_parallel_and_bf16",
        task="to_bfloat16(x) -> x's shape, float32: each float32 value rounded to the nearest bfloat16 (the top 16 "
        "bits of a float32: sign, 8 exponent bits, 7 mantissa bits), ties to the even one, returned as float32; "
        "a NaN stays a NaN, and what rounds past the largest bfloat16 becomes an infinity. Work on the bits: "
        "x.view(np.uint32).",
        cases=_bf16_cases,
        expected=_bf16_expected,
        tolerance=0.0,  # a rounding is exact or wrong
        mistakes=(
            Mistake(
                "truncation (the low 16 bits dropped)",
                "bits & 0xFFFF0000 rounds every value toward zero: an error of up to a whole bf16 step instead of "
                "half of one, always in the same direction, which adds up over a long sum. Add 0x7FFF plus the "
                "last kept bit ((bits >> 16) & 1) before masking: round to nearest, ties to even.",
                _truncated,
            ),
            Mistake(
                "float16 instead of bfloat16",
                "float16 (np.float16) is another 16-bit format: 5 exponent bits and 10 mantissa bits, so more "
                "precision but a range of only 6e-8 .. 65504. bfloat16 keeps float32's 8 exponent bits (its whole "
                "range) and 7 mantissa bits: the top half of a float32.",
                lambda x: np.asarray(x).astype(np.float16).astype(np.float32),
            ),
            Mistake(
                "a NaN rounded like a number",
                "a NaN is all ones in the exponent and anything but zero in the mantissa; rounding its bits like a "
                "number's carries a payload in the low half into the exponent and sign (0x7FFFFFFF becomes -0.0) or "
                "cuts it off (0x7F800001 becomes +inf). Every framework's cast keeps a NaN a NaN: for those, keep the "
                "top 16 bits with the quiet bit set, (bits & 0xFFFF0000) | 0x00400000.",
                _nan_rounded,
            ),
            Mistake(
                "ties rounded up, not to even",
                "adding 0x8000 and masking rounds to nearest, but a value exactly halfway always goes up (away from "
                "zero), a small bias. IEEE rounding, and every framework's cast, sends a tie to the neighbour whose "
                "last bit is 0: add 0x7FFF + ((bits >> 16) & 1).",
                _half_up,
            ),
        ),
    ),
]
