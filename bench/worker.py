"""One implementation served over stdin/stdout, so that two versions of our code -- today's
and an older commit's -- can be timed in the same rounds (``bench.baseline``).

``python bench/worker.py ROOT WHAT SIZE BATCH SEQ_LEN``: imports the model code from ROOT (a
checkout of this repository), builds WHAT (one of ``BUILDERS``) of the preset SIZE from
seeded weights, calls it twice (JAX compiles), saves the output to a .npy file and prints
``ready PATH SOURCE`` (SOURCE: the tree the model code was imported from). Then each line
``run`` on stdin runs one forward and prints its seconds; ``quit`` (or the end of stdin)
ends it.

The script imports NumPy and ROOT's model code only, nothing of ``bench``: both versions run
under the same harness, this file, and differ only in the code they time. The workload is
``bench.implementations.make_workload``'s, written again here for that reason.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np


def make_workload(config, batch: int, seq_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The same batch as ``bench.implementations.make_workload`` (same seed, same draws)."""
    rng = np.random.default_rng(seed)
    lengths = np.full(batch, seq_len)
    lengths[1:] = rng.integers(max(1, 3 * seq_len // 4), seq_len + 1, batch - 1)
    valid = np.arange(seq_len)[None, :] < lengths[:, None]  # (B, T)
    vocab = config.src_vocab_size if config.uses_encoder else config.tgt_vocab_size
    if vocab > 1:
        rng.integers(1, vocab, (batch, seq_len))  # the ids: not used here, drawn to keep the stream in step
    x, y = (rng.standard_normal((batch, seq_len, config.d_model)).astype(np.float32) for _ in range(2))
    causal = np.tril(np.ones((seq_len, seq_len), dtype=bool))  # (T, T)
    src_mask = valid[:, None, None, :]  # (B, 1, 1, T), True = may attend
    return {"x": x, "y": y, "src_mask": src_mask, "tgt_mask": src_mask & causal[None, None]}


def torch_forward(what: str, config, work):
    import torch

    import torch_impl
    from transformer_spec import init_params

    params = init_params(config, seed=0, dtype="float32", component="encoder", nonzero_biases=True)
    encoder = torch_impl.from_params(torch_impl.Encoder, config, params)
    x, y = torch.from_numpy(work["x"]), torch.from_numpy(work["y"])
    src_mask, tgt_mask = torch.from_numpy(work["src_mask"]), torch.from_numpy(work["tgt_mask"])
    if what == "torch-encoder":
        stack = lambda: encoder(x, src_mask)[0]  # (B, T, d_model)
    else:
        decoder_params = init_params(config, seed=1, dtype="float32", component="decoder", nonzero_biases=True)
        decoder = torch_impl.from_params(torch_impl.Decoder, config, decoder_params)
        stack = lambda: decoder(y, encoder(x, src_mask)[0], tgt_mask, src_mask)[0]  # (B, T_tgt, d_model)

    def forward():
        with torch.inference_mode():
            return stack()

    return forward, lambda output: output.numpy()


def jax_forward(what: str, config, work):
    import jax
    import jax.numpy as jnp

    import jax_impl
    from transformer_spec import init_params

    params = init_params(config, seed=0, dtype="float32", component="encoder", nonzero_biases=True)
    encoder = jax_impl.from_params(jax_impl.Encoder, config, params)
    x, mask = jnp.asarray(work["x"]), jnp.asarray(work["src_mask"])
    jitted = jax.jit(lambda encoder, x, mask: encoder(x, mask)[0])  # the module as an argument, as bench does
    return lambda: jitted(encoder, x, mask).block_until_ready(), np.asarray


BUILDERS = {"torch-encoder": torch_forward, "torch-encoder-decoder": torch_forward, "jax-encoder": jax_forward}


def main(root: str, what: str, size: str, batch: int, seq_len: int) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [root] + [p for p in sys.path if os.path.abspath(p or ".") != here]  # ROOT's code, not bench's
    from transformer_spec import Config

    config = Config.preset(size)
    if what == "torch-encoder-decoder":
        config = config.replace(encoder_final_norm=True, decoder_final_norm=True)  # as bench's torch section
    forward, to_numpy = BUILDERS[what](what, config, make_workload(config, batch, seq_len))
    output = to_numpy(forward())
    forward()
    path = os.path.join(tempfile.mkdtemp(prefix="bench-worker-"), "output.npy")
    np.save(path, output)
    package = sys.modules["jax_impl" if what.startswith("jax") else "torch_impl"]
    print(f"ready {path} {os.path.dirname(os.path.dirname(os.path.abspath(package.__file__)))}", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start = time.perf_counter()
        forward()
        print(f"{time.perf_counter() - start!r}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
