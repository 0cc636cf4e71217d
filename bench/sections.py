"""The timed sections: each returns a list of result rows (plain dicts, ready for JSON)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from transformer_backends.names import BACKENDS, package
from transformer_spec import Config

from . import implementations as impl
from .compare import compare, warm_up
from .flops import bert_flops, encoder_decoder_flops, encoder_flops
from .timing import Budget, Ratio, interleaved

BATCH, SEQ_LEN = 8, 128


def torch_section(sizes: Sequence[str], budget: Budget) -> list[dict[str, Any]]:
    """Our torch stacks against nn.TransformerEncoder and nn.Transformer, same weights, same masks.

    Each torch module is timed twice in the same rounds: as torch runs it by default (its
    fast path may fuse the encoder layer and pack the padded batch into nested tensors)
    and with that fast path switched off (op by op, as ours).

    Nested tensors let nn.TransformerEncoder skip the padded positions (13.5% of this batch's
    tokens), whose outputs ours computes (they are defined, and held equal across backends):
    beyond tiny, the encoder is also timed on the same batch without padding, where both
    compute the same tokens.
    """
    rows = []
    for size in sizes:
        config = Config.preset(size)
        params = impl.encoder_params(config)
        for padded in (True, False) if size != "tiny" else (True,):
            work = impl.make_workload(config, BATCH, SEQ_LEN, padded=padded)
            rows += compare(
                "torch", "encoder stack" + ("" if padded else ", no padding"), size, work,
                impl.torch_ours_encoder(work, params),
                [impl.torch_nn_encoder(work, params), impl.torch_nn_encoder(work, params, fast_path=False)],
                encoder_flops(config, BATCH, SEQ_LEN), budget,
            )  # fmt: skip
        if config.kind != "encoder_decoder":
            continue  # BERT has no decoder
        config = config.replace(encoder_final_norm=True, decoder_final_norm=True)  # nn.Transformer always has both
        work = impl.make_workload(config, BATCH, SEQ_LEN)
        params, decoder_params = impl.encoder_params(config), impl.decoder_params(config)
        rows += compare(
            "torch", "encoder + decoder stacks", size, work,
            impl.torch_ours_encoder_decoder(work, params, decoder_params),
            [impl.torch_nn_transformer(work, params, decoder_params),
             impl.torch_nn_transformer(work, params, decoder_params, fast_path=False)],
            encoder_decoder_flops(config, BATCH, SEQ_LEN, SEQ_LEN), budget,
        )  # fmt: skip
    return rows


def jax_section(sizes: Sequence[str], budget: Budget) -> list[dict[str, Any]]:
    """Our jitted JAX encoder against the same encoder built from Flax NNX's own layers."""
    rows = []
    for size in sizes:
        config = Config.preset(size)
        work = impl.make_workload(config, BATCH, SEQ_LEN)
        params = impl.encoder_params(config)
        rows += compare(
            "jax", "encoder stack (jitted)", size, work, impl.jax_ours_encoder(work, params),
            [impl.jax_flax_encoder(work, params)], encoder_flops(config, BATCH, SEQ_LEN), budget,
        )  # fmt: skip
    return rows


def numpy_section(sizes: Sequence[str], budget: Budget) -> list[dict[str, Any]]:
    """Our NumPy encoder against our torch encoder (NumPy has no modules of its own)."""
    rows = []
    for size in sizes:
        config = Config.preset(size)
        work = impl.make_workload(config, BATCH, SEQ_LEN)
        params = impl.encoder_params(config)
        rows += compare(
            "numpy", "encoder stack", size, work, impl.numpy_ours_encoder(work, params),
            [impl.torch_ours_encoder(work, params)], encoder_flops(config, BATCH, SEQ_LEN), budget,
        )  # fmt: skip
    return rows


def bert_section(size: str, batch: int, seq_len: int, budget: Budget) -> list[dict[str, Any]]:
    """Our whole BERT model (torch) against transformers.BertModel, weights converted from it."""
    config = Config.preset(size)
    work = impl.make_workload(config, batch, seq_len)
    params, state_dict = impl.hf_bert_weights(config)
    theirs = [impl.hf_bert(work, state_dict, "eager"), impl.hf_bert(work, state_dict, "sdpa")]
    return compare(
        "bert", "whole model (embeddings, encoder, pooler)", size, work, impl.torch_ours_bert(work, params),
        theirs, bert_flops(config, batch, seq_len), budget,
    )  # fmt: skip


def sweep_section(size: str, batch: int, lengths: Sequence[int], budget: Budget) -> dict[str, Any]:
    """Encoder-stack time against sequence length for every implementation, interleaved per length."""
    config = Config.preset(size)
    params = impl.encoder_params(config)
    points = []
    for seq_len in lengths:
        work = impl.make_workload(config, batch, seq_len)
        candidates = [
            impl.torch_ours_encoder(work, params),
            impl.torch_nn_encoder(work, params),
            impl.jax_ours_encoder(work, params),
            impl.jax_flax_encoder(work, params),
            impl.numpy_ours_encoder(work, params),
        ]
        for candidate in candidates:
            warm_up(candidate)
        times = interleaved(candidates, budget)
        ms = {label: 1e3 * float(np.median(t)) for label, t in times.items()}
        ratios = {
            "torch: ours / nn.TransformerEncoder": Ratio.of(times["ours (torch)"], times["nn.TransformerEncoder"]),
            "jax: ours / Flax NNX layers": Ratio.of(times["ours (jax)"], times["Flax NNX layers"]),
            "numpy: ours / ours (torch)": Ratio.of(times["ours (numpy)"], times["ours (torch)"]),
        }
        gflops = {label: encoder_flops(config, batch, seq_len) / (t / 1e3) / 1e9 for label, t in ms.items()}
        points.append(
            {
                "seq_len": seq_len,
                "ms": ms,
                "gflops": gflops,
                "ratios": {k: r.to_dict() for k, r in ratios.items()},
            }
        )
    return {"size": size, "batch": batch, "points": points}


def training_section(sizes: Sequence[tuple[str, int, int]], budget: Budget) -> dict[str, Any]:
    """Training speed in every backend, same model, same batch, interleaved: whole steps
    (``train_step``: forward, loss, backward and the Adam update; in JAX one ``nnx.jit``
    program) and ``loss_and_grads`` alone (the gradients handed back as NumPy arrays, as
    the parity tests compare them; in JAX ``jax.grad`` without a whole-step jit)."""
    import importlib

    backends = {}
    for name in BACKENDS:
        module = importlib.import_module(package(name))
        training = importlib.import_module(f"{package(name)}.training")
        if not hasattr(training, "loss_and_grads"):
            return {"skipped": f"{name}_impl/gradients.py has no loss_and_grads yet: training steps not measured"}
        backends[name] = module
    from transformer_run.data import copy_task
    from transformer_run.schedules import constant_schedule
    from transformer_spec import init_params

    from .flops import encoder_decoder_flops as forward_flops
    from .timing import Candidate

    results = []
    for size, batch, seq_len in sizes:
        config = Config.preset(size)
        params = init_params(config, seed=0, dtype="float32")
        data = copy_task(batch, seq_len, min(config.src_vocab_size, config.tgt_vocab_size), seed=0)
        candidates, step_candidates, losses = [], [], {}
        for name, module in backends.items():
            model = module.build_model(config, params)
            run = lambda module=module, model=model, data=data: module.loss_and_grads(model, data)
            candidates.append(Candidate(name, name, run))
            losses[name] = run()[0]  # warm (JAX compiles) and check the losses agree
            run()
            trained = module.build_model(config, params)
            optimizer = module.Adam(trained, constant_schedule(1e-4))
            step = lambda module=module, model=trained, optimizer=optimizer, data=data: module.train_step(
                model, optimizer, data
            )
            step_candidates.append(Candidate(name, name, step))
            step()  # warm (JAX compiles the whole step)
            step()
        times = interleaved(candidates, budget)
        step_times = interleaved(step_candidates, budget)
        t_tgt = data["tgt_in"].shape[1]
        # backward ~ 2x forward: a training step is ~3x the forward's matmul FLOPs
        forward = (
            forward_flops(config, batch, seq_len, t_tgt) + 2 * batch * t_tgt * config.d_model * config.tgt_vocab_size
        )
        results.append(
            {
                "size": size,
                "shape": f"{batch}x{seq_len}",
                "train_steps_per_s": {name: float(np.median(1.0 / t)) for name, t in step_times.items()},
                "ms_per_train_step": {name: 1e3 * float(np.median(t)) for name, t in step_times.items()},
                "train_step_ratio_to_torch": {
                    name: Ratio.of(t, step_times["torch"]).to_dict() for name, t in step_times.items()
                },
                "steps_per_s": {name: float(np.median(1.0 / t)) for name, t in times.items()},
                "ms_per_step": {name: 1e3 * float(np.median(t)) for name, t in times.items()},
                "gflops": {name: float(np.median(3 * forward / t)) / 1e9 for name, t in times.items()},
                "ratio_to_torch": {name: Ratio.of(t, times["torch"]).to_dict() for name, t in times.items()},
                "loss": losses,
            }
        )
    return {"rows": results}
