"""Chapter 2, positional encodings: the paper's sinusoidal table, and the rotation that moves it along."""

from __future__ import annotations

import numpy as np

from ..check import Exercise, Mistake

BASE = 10000.0  # the paper's base wavelength factor


# ------------------------------------------------------------------ sinusoidal_table
def _table_cases():
    return [
        ("max_len = 50, d_model = 16", {"max_len": 50, "d_model": 16}),
        ("one position, d_model = 2: a single (sin, cos) pair", {"max_len": 1, "d_model": 2}),
        ("an odd d_model = 7: four sine columns, three cosine columns", {"max_len": 20, "d_model": 7}),
    ]


def _table_expected(b, x):
    return b.call(b.impl.sinusoidal_table, x["max_len"], x["d_model"], "float64")


def _table(max_len, d_model, layout="interleaved", pair_exponent=False, swapped=False, sign=-1.0):
    """The sinusoidal table; each keyword switches on one classic mistake (none by default)."""
    pairs = (d_model + 1) // 2  # ceil(d/2) frequencies
    i = np.arange(pairs, dtype=np.float64)
    exponent = i / d_model if pair_exponent else 2.0 * i / d_model
    angles = np.arange(max_len, dtype=np.float64)[:, None] * BASE ** (sign * exponent)  # (max_len, pairs)
    first, second = (np.cos, np.sin) if swapped else (np.sin, np.cos)
    table = np.empty((max_len, d_model))
    if layout == "halves":
        table[:, :pairs] = first(angles)
        table[:, pairs:] = second(angles[:, : d_model // 2])
    else:
        table[:, 0::2] = first(angles)
        table[:, 1::2] = second(angles[:, : d_model // 2])
    return table


# ------------------------------------------------------------------ shift_sinusoids
def _shift_cases():
    table = _table(40, 16)  # the correct table: no mistake switched on
    rng = np.random.default_rng(2)
    return [
        ("positions 0..9 of a (., 16) table, moved on by 5", {"pe": table[:10], "offset": 5}),
        ("positions 20..29, moved on by 1000: past any table's end", {"pe": table[20:30], "offset": 1000}),
        ("offset 0: nothing moves", {"pe": table[3:6], "offset": 0}),
        ("any vector, not only the table's rows: the map is linear", {"pe": rng.standard_normal((2, 3, 8)),
                                                                      "offset": 3}),  # fmt: skip
    ]


def _shift_expected(b, x):
    """The backend's own rotation (rotary position embedding's rotate_pairs, pairs (2i, 2i + 1)) by the
    angles offset * 10000^(-2i/d): sin and cos of pos + k are those of pos turned by k omega_i."""
    pe, offset = x["pe"], x["offset"]
    cos, sin = b.impl.rotary_tables(offset + 1, pe.shape[-1], BASE, "float64")  # rows 0 .. offset
    cos, sin = b.to_numpy(cos)[offset], b.to_numpy(sin)[offset]  # (d/2,) each: the angles offset * omega_i
    # rotate_pairs turns (x1, x2) to (x1 cos - x2 sin, x2 cos + x1 sin); a (sin, cos) pair moves on by
    # the opposite angle, hence -sin
    return b.call(b.impl.rotate_pairs, pe, cos, -sin, "interleaved")


def _rotate(pe, offset, layout="interleaved", direction=1.0, pair_exponent=False):
    """pe's (sin, cos) pairs turned by offset * omega_i, with one classic mistake switched on."""
    d = pe.shape[-1]
    i = np.arange(d // 2, dtype=np.float64)
    omega = BASE ** (-(i if pair_exponent else 2.0 * i) / d)
    c, s = np.cos(offset * omega), direction * np.sin(offset * omega)
    if layout == "halves":
        a, b = pe[..., : d // 2], pe[..., d // 2 :]
        return np.concatenate([a * c + b * s, b * c - a * s], axis=-1)
    a, b = pe[..., 0::2], pe[..., 1::2]
    out = np.empty_like(pe)
    out[..., 0::2], out[..., 1::2] = a * c + b * s, b * c - a * s
    return out


EXERCISES = [
    Exercise(
        name="sinusoidal_table",
        chapter="02_positional_encodings",
        task="sinusoidal_table(max_len, d_model) -> (max_len, d_model) float64: PE[pos, 2i] = sin(pos / "
        "10000^(2i/d_model)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model)); an odd d_model has one more sine "
        "column than cosine columns.",
        cases=_table_cases,
        expected=_table_expected,
        mistakes=(
            Mistake(
                "sines and cosines in two halves",
                "The paper interleaves them: column 2i holds a sine, column 2i + 1 the cosine of the same angle. "
                "All the sines and then all the cosines (np.concatenate([sin, cos], -1)) is another layout "
                "(fairseq's, Marian's): the same numbers in other columns, vectors that a model trained with the "
                "paper's layout has never seen. Write pe[:, 0::2] = sin and pe[:, 1::2] = cos.",
                lambda max_len, d_model: _table(max_len, d_model, layout="halves"),
            ),
            Mistake(
                "the exponent i/d instead of 2i/d",
                "Pair i's frequency is 10000^(-2i/d_model), with 2i the index of its sine column, so the "
                "wavelengths run from 2 pi up to 10000 * 2 pi. With i/d_model (i counting pairs) the slowest "
                "pair only reaches 100 * 2 pi. np.arange(0, d_model, 2) / d_model are the exponents 2i/d.",
                lambda max_len, d_model: _table(max_len, d_model, pair_exponent=True),
            ),
            Mistake(
                "sin and cos swapped",
                "The even columns (0, 2, 4, ...) hold the sines and the odd ones the cosines: PE[0] is then "
                "(0, 1, 0, 1, ...). With cos first, PE[0] is (1, 0, 1, 0, ...).",
                lambda max_len, d_model: _table(max_len, d_model, swapped=True),
            ),
            Mistake(
                "multiplied by 10000^(2i/d) instead of divided",
                "The angle is pos / 10000^(2i/d_model), a frequency that falls with i; pos * 10000^(2i/d_model) "
                "turns faster and faster, and its high columns are noise. In the exp form the minus sign is "
                "easy to lose: exp(-log(10000) * 2i / d_model).",
                lambda max_len, d_model: _table(max_len, d_model, sign=1.0),
            ),
        ),
    ),
    Exercise(
        name="shift_sinusoids",
        chapter="02_positional_encodings",
        task="shift_sinusoids(pe, offset) -> the shape of pe (..., d), d even: each pair of columns (2i, 2i + 1), "
        "read as (sin a, cos a), turned into (sin(a + offset omega_i), cos(a + offset omega_i)) with omega_i = "
        "10000^(-2i/d), as a linear map of pe (a 2 x 2 rotation per pair): the table's rows offset positions "
        "later.",
        cases=_shift_cases,
        expected=_shift_expected,
        mistakes=(
            Mistake(
                "turned the wrong way",
                "sin(a + b) = sin a cos b + cos a sin b and cos(a + b) = cos a cos b - sin a sin b. The other "
                "signs (s cos b - c sin b, c cos b + s sin b) turn by -b: the rows offset positions *earlier*.",
                lambda pe, offset: _rotate(pe, offset, direction=-1.0),
            ),
            Mistake(
                "the other pairing (halves)",
                "In the paper's table, the sine and cosine of one angle sit side by side, in columns 2i and "
                "2i + 1; pairing column i with column i + d/2 (the 'rotate_half' layout of Llama's rotary "
                "embedding) turns two different angles' values together.",
                lambda pe, offset: _rotate(pe, offset, layout="halves"),
            ),
            Mistake(
                "the exponent i/d instead of 2i/d",
                "Pair i turns at omega_i = 10000^(-2i/d): the frequency of its sine column, 2i. With i/d the "
                "pairs after the first turn by the wrong angles.",
                lambda pe, offset: _rotate(pe, offset, pair_exponent=True),
            ),
        ),
    ),
]
