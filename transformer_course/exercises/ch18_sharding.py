"""Chapter 18, sharding: reduce-scatter, the collective FSDP's gradients go through, and the
tensor-parallel split of a grouped-query key (or value) projection.

torch's collectives run only between processes of a process group (one per rank), so the checker
cannot call torch's reduce_scatter on a list of arrays in one process: in torch the expected answer
is the collective's definition written with torch's own sum and chunk. NumPy's is the reference's
written-out collective; JAX's is ``jax.lax.psum_scatter``, the collective XLA runs between devices,
here over a vmapped axis of ranks (which needs one device only)."""

from __future__ import annotations

import numpy as np

from transformer_run.sharding import Plan, piece, placement
from transformer_spec import Config

from ..check import Exercise, Mistake


# ------------------------------------------------------------------ reduce_scatter
def _scatter_cases():
    rng = np.random.default_rng(18)
    return [
        ("4 ranks, each a buffer of 4 x 3 numbers", {"buffers": rng.standard_normal((4, 12))}),
        ("2 ranks, each a buffer of 2 x 5 numbers", {"buffers": rng.standard_normal((2, 10))}),
        ("8 ranks, each a buffer of 8 x 1 numbers", {"buffers": rng.standard_normal((8, 8))}),
        ("one rank: its slice is its whole buffer", {"buffers": rng.standard_normal((1, 6))}),
    ]


def _scatter_expected(b, x):
    buffers = x["buffers"]
    if b.name == "numpy":
        from numpy_impl.sharding import reduce_scatter

        return np.stack(reduce_scatter(list(buffers)))
    if b.name == "jax":
        import jax

        scatter = jax.vmap(lambda g: jax.lax.psum_scatter(g, "ranks", tiled=True), axis_name="ranks")
        return b.to_numpy(scatter(b.asarray(buffers)))
    total = b.asarray(buffers).sum(0)  # torch: the definition (its collective needs N processes)
    return b.to_numpy(b.torch.stack(b.torch.chunk(total, len(buffers))))


def _slices(buffers):
    n = len(buffers)
    return np.asarray(buffers).reshape(n, n, -1)  # [rank, slice, element]


# ------------------------------------------------------------------ tensor_parallel_kv
KV_NAME = "decoder.layers.0.self_attn.w_k.weight"


def _kv_config(num_heads: int, num_kv_heads: int, d_model: int) -> Config:
    return Config.preset("tiny-llama", num_heads=num_heads, num_kv_heads=num_kv_heads, d_model=d_model,
                         num_decoder_layers=1)  # fmt: skip


def _kv_cases():
    rng = np.random.default_rng(18)
    cases = []
    for description, (heads, kv_heads, d_model, k) in [
        ("8 query heads, 4 kv heads of d_k 4, over 2 model ranks", (8, 4, 32, 2)),
        ("8 query heads, 2 kv heads of d_k 8, over 2 model ranks: one kv head each", (8, 2, 64, 2)),
        ("4 query heads, 4 kv heads (no grouping) of d_k 4, over 4 model ranks", (4, 4, 16, 4)),
        ("6 query heads, 6 kv heads of d_k 2, over 3 model ranks", (6, 6, 12, 3)),
    ]:
        w_k = rng.standard_normal((d_model, kv_heads * d_model // heads))
        cases.append((description, {"w_k": w_k, "d_k": d_model // heads, "tensor_parallel": k,
                                    "num_heads": heads}))  # fmt: skip
    return cases


def _kv_expected(b, x):
    """Each backend's own tensor-parallel plan for the key projection of a decoder layer."""
    w_k, k = x["w_k"], x["tensor_parallel"]
    plan = Plan(tensor_parallel=k)
    if b.name == "numpy":  # the pieces the NumPy run gives its devices
        where = placement(KV_NAME, w_k.shape, plan)
        return np.stack([piece(w_k, where, plan, 0, t) for t in range(k)])
    if b.name == "jax":  # the PartitionSpec the weight is placed with on the mesh
        from jax_impl.sharding import weight_spec

        axis = list(weight_spec(KV_NAME, w_k.shape, plan)).index("model")
        return np.stack([b.to_numpy(p) for p in b.jnp.split(b.asarray(w_k), k, axis=axis)])
    from torch.distributed.tensor.parallel import ColwiseParallel

    from torch_impl.sharding import tensor_parallel_plan

    d_model = w_k.shape[0]
    config = _kv_config(x["num_heads"], w_k.shape[1] // x["d_k"], d_model)
    style = tensor_parallel_plan(config, plan)[KV_NAME.rsplit(".", 1)[0]]
    if not isinstance(style, ColwiseParallel):
        raise AssertionError(f"torch's plan splits {KV_NAME} as {style}, not by columns")
    weight = b.asarray(w_k).T  # a torch Linear's weight is (out, in); ColwiseParallel shards dim 0
    return np.stack([b.to_numpy(p.T) for p in b.torch.chunk(weight, k, dim=0)])


def _tiled(w_k, d_k, tensor_parallel, num_heads):
    heads = w_k.reshape(w_k.shape[0], -1, d_k)  # (d_model, H_kv, d_k)
    return np.stack([heads[:, t::tensor_parallel].reshape(w_k.shape[0], -1) for t in range(tensor_parallel)])


EXERCISES = [
    Exercise(
        name="reduce_scatter",
        chapter="18_sharding",
        task="reduce_scatter(buffers) -> (N, n): buffers (N, N n), row r rank r's whole gradient buffer; row r of "
        "the answer is what rank r keeps: its slice r (elements r n .. (r + 1) n) of the sum of all N buffers.",
        cases=_scatter_cases,
        expected=_scatter_expected,
        mistakes=(
            Mistake(
                "the all-reduce",
                "every rank getting the whole sum (N, N n) is all_reduce, what data parallel runs: it costs each "
                "device the whole gradient. FSDP keeps only its 1/N of each weight, so each rank needs only its "
                "slice of the sum: sum the buffers, then rank r keeps elements r n .. (r + 1) n.",
                lambda buffers: np.tile(np.asarray(buffers).sum(0), (len(buffers), 1)),
            ),
            Mistake(
                "the wrong rank's slice",
                "rank r must keep slice r, the slice of the weight it holds (the one its all-gather put in "
                "place r): slices in reverse order give each rank the gradient of another rank's weights.",
                lambda buffers: np.asarray(buffers).sum(0).reshape(len(buffers), -1)[::-1],
            ),
            Mistake(
                "the slices without the sum",
                "rank r's slice r of its own buffer is only its own rows' gradient: the reduce adds the N ranks' "
                "slices r together, one per rank (the gradient of the whole batch).",
                lambda buffers: np.stack([s[r] for r, s in enumerate(_slices(buffers))]),
            ),
        ),
    ),
    Exercise(
        name="tensor_parallel_kv",
        chapter="18_sharding",
        task="tensor_parallel_kv(w_k, d_k, tensor_parallel, num_heads) -> (K, d_model, H_kv / K d_k): w_k "
        "(d_model, H_kv d_k) the key (or value) projection, its columns H_kv heads of d_k; piece t is what "
        "model rank t holds: the columns of its H_kv / K kv heads, those its H / K query heads read.",
        cases=_kv_cases,
        expected=_kv_expected,
        tolerance=0.0,  # a split copies: exact or wrong
        mistakes=(
            Mistake(
                "the row split",
                "splitting w_k's rows (d_model) is the row-parallel split of w_o and w_2, whose input is already "
                "split: each rank would need the partial products summed before attention could run. The key "
                "projection is column-split: each rank computes whole keys for its own heads from the whole x.",
                lambda w_k, d_k, tensor_parallel, num_heads: np.stack(np.split(w_k, tensor_parallel, axis=0)),
            ),
            Mistake(
                "tiled instead of grouped heads",
                "rank t taking kv heads t, t + K, t + 2K, .. gives it kv heads its query heads do not read: query "
                "head h reads kv head h // (H / H_kv), and rank t holds query heads t H/K .. (t + 1) H/K - 1, so "
                "it needs the contiguous block of kv heads t H_kv/K .. (t + 1) H_kv/K - 1.",
                _tiled,
            ),
        ),
    ),
]
