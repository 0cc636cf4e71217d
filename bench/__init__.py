"""Benchmark: our three backends against each framework's own modules, measured side by side.

Run ``python -m bench.run`` (or ``nox -s bench``; ``--quick`` for tiny + base only,
``--sections torch,jax`` to pick sections). The report goes to stdout and to
``bench/results/latest.md``, the numbers to ``latest.json``, the sequence-length plot
to ``seq_sweep.png``.

What is compared (eval, float32, the same canonical weights loaded into both sides):

* torch: our ``Encoder`` against ``nn.TransformerEncoder``, our encoder + decoder stacks
  against ``nn.Transformer`` (weights converted by ``transformer_convert.torch_transformer``),
  both under ``torch.inference_mode()``, a padding mask on both. torch's own modules are
  timed twice: as torch runs them by default (its "fast path" may fuse whole encoder
  layers and pack a padded batch into nested tensors; the report says when it ran) and
  with that fast path switched off.
* JAX: our jitted ``Encoder`` against the same encoder assembled from Flax NNX's own
  layers (``bench/flax_encoder.py``), both through one ``jax.jit`` with the module as a
  pytree argument, as ``jax_impl.model`` does.
* NumPy: our NumPy encoder against our torch encoder.
* BERT: our ``TransformerEncoderModel`` (torch) against ``transformers.BertModel`` (random
  weights, converted by ``transformer_convert.hf_bert``), attention "eager" and "sdpa".
* Before and after (``bench/baseline.py``): ours now against ours at an older commit
  (``--baseline COMMIT``, default 350f1b0, before the backends were redesigned to read alike),
  each in its own worker process (``bench/worker.py``) from its own source tree, rounds interleaved.

Ours runs as users get it: with each backend's fused kernels (``kernels.py``).

How it is measured (``bench/timing.py``): the machine's speed drifts by ~3x over minutes,
so nothing is compared across time. Within one process the implementations run in
rounds, A B, B A, A B, ..., and each reported ratio is the median of the per-round
ratios ours/theirs, with the 25th-75th percentiles of those ratios. Each round also times
the backend's own 1024^3 float32 matmul, so "fraction of the matmul rate" compares our
achieved matmul FLOP/s (``bench/flops.py``: 2 m n k per product, attention included) with
what the same library reached at that same moment. Outputs are checked to agree at real
tokens before anything is timed. Peak memory and JAX's compile time are measured in fresh
processes (``bench/fresh_process.py``).
"""
