"""``transformer-ref train``: train a toy task in one backend, then use the model.

Tasks (all shipped in the repository, nothing downloaded):
  copy       random 5-symbol sequences -> the same sequence (the classic sanity check)
  reverse    random 5-symbol sequences -> the sequence reversed
  translate  the tutorials' toy English -> "French" corpus (6 sentence pairs)
  next-word  the tutorials' next-word corpus, a decoder-only language model

Shows a progress bar (step, loss, target tokens per second), then greedy outputs of the
trained model: held-out sequences for copy/reverse, the corpus for translate, sentence
continuations for next-word. ``--save`` writes a canonical safetensors checkpoint that
every backend loads (``transformer-ref compare --weights FILE``).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from backend_adapters import get_backend
from transformer_spec import BACKENDS, Config, init_params, save_params
from transformer_spec.data import (
    BOS,
    EOS,
    NEXT_WORD,
    TOY_TRANSLATION,
    WordVocab,
    copy_task,
    next_word_batch,
    pad,
    translation_batch,
)
from transformer_spec.schedules import warmup_schedule

TASKS = ("copy", "reverse", "translate", "next-word")
DEFAULT_STEPS = {"copy": 600, "reverse": 600, "translate": 300, "next-word": 300}


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "train", help=__doc__.splitlines()[0], description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", default="copy", choices=TASKS)
    parser.add_argument("--backend", default="numpy", choices=BACKENDS)
    parser.add_argument("--steps", type=int, help="optimiser steps (default: 600 for copy/reverse, 300 otherwise)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    parser.add_argument("--warmup", type=int, default=200, help="warm-up steps of the paper's schedule")
    parser.add_argument("--label-smoothing", type=float, default=0.0)
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout rate while training (the paper: 0.1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", help="write the trained weights to this .safetensors file")
    parser.set_defaults(run=run)


def task_setup(task: str, seed: int):
    """-> (config, training batches, a function that shows what the trained model does)."""
    if task in ("copy", "reverse"):
        config = Config.preset("tiny", src_vocab_size=12, tgt_vocab_size=12, max_len=16, norm_first=True)
        batches = [copy_task(32, 5, 12, seed=seed + s, reverse=task == "reverse") for s in range(100)]
        return config, batches, lambda backend, model: show_copy(backend, model, task)
    if task == "translate":
        src_vocab = WordVocab.from_sentences([s for s, _ in TOY_TRANSLATION])
        tgt_vocab = WordVocab.from_sentences([t for _, t in TOY_TRANSLATION])
        config = Config.preset(
            "tiny", src_vocab_size=len(src_vocab), tgt_vocab_size=len(tgt_vocab), max_len=16, norm_first=True
        )
        batches = [translation_batch(TOY_TRANSLATION, src_vocab, tgt_vocab)]
        return config, batches, lambda backend, model: show_translation(backend, model, src_vocab, tgt_vocab)
    vocab = WordVocab.from_sentences(NEXT_WORD)
    config = Config.preset("tiny-lm", tgt_vocab_size=len(vocab), max_len=16)
    return config, [next_word_batch(NEXT_WORD, vocab)], lambda backend, model: show_generation(backend, model, vocab)


def run(args: argparse.Namespace) -> int:
    try:
        backend = get_backend(args.backend)
    except ImportError as error:
        raise SystemExit(
            f"backend {args.backend!r} is not installed ({error.name}): pip install -e '.[{args.backend}]'"
        ) from None
    config, batches, show = task_setup(args.task, args.seed)
    config = config.replace(dropout=args.dropout)
    steps = args.steps or DEFAULT_STEPS[args.task]
    model = backend.impl.build_model(config, init_params(config, seed=args.seed, dtype=args.dtype))
    schedule = warmup_schedule(config.d_model, args.warmup)
    tokens_per_step = [int((b.get("tgt_out", b.get("targets")) != config.pad_id).sum()) for b in batches]
    print(f"training {args.task} in {args.backend} ({args.dtype}): {config.kind}, d_model {config.d_model}, "
          f"{steps} steps, Adam with the paper's warm-up schedule ({args.warmup} steps)")  # fmt: skip
    progress = ProgressBar(steps, tokens_per_step)
    losses = backend.impl.train(
        model, batches, steps, schedule, args.label_smoothing, callback=progress, seed=args.seed
    )
    progress.close()
    print(f"loss: first {losses[0]:.4f}, last {losses[-1]:.4f}\n")
    show(backend, model)
    if args.save:
        save_params(args.save, backend.impl.to_params(model), config)
        print(f"\nsaved the weights to {args.save} (load them in any backend: <backend>_impl.load_model)")
    return 0


class ProgressBar:
    """``step/total [#####.....] loss  tokens/s`` on one line, redrawn in place."""

    def __init__(self, total: int, tokens_per_step: list[int], width: int = 30):
        self.total, self.tokens_per_step, self.width = total, tokens_per_step, width
        self.start, self.tokens = time.perf_counter(), 0

    def __call__(self, step: int, loss: float) -> None:
        self.tokens += self.tokens_per_step[(step - 1) % len(self.tokens_per_step)]
        if step % max(1, self.total // 200) and step != self.total:
            return  # redraw about 200 times in all
        done = int(self.width * step / self.total)
        rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
        bar = "#" * done + "." * (self.width - done)
        sys.stdout.write(f"\rstep {step:>5}/{self.total} [{bar}] loss {loss:8.4f}  {rate:9.0f} tokens/s")
        sys.stdout.flush()

    def close(self) -> None:
        sys.stdout.write(f"  ({time.perf_counter() - self.start:.1f} s)\n")


def show_copy(backend, model, task: str) -> None:
    held_out = copy_task(50, 5, 12, seed=12345, reverse=task == "reverse")
    out = backend.impl.greedy(model, held_out["src_ids"], BOS, EOS, max_len=6)  # (50, <= 7)
    want = held_out["tgt_out"][:, :5]
    exact = np.all(out[:, 1:6] == want, axis=1)
    print(f"greedy decoding of 50 held-out sequences: {int(exact.sum())}/50 exactly right")
    for row in range(5):
        print(f"  {held_out['src_ids'][row].tolist()} -> {out[row, 1:6].tolist()}  {'ok' if exact[row] else 'WRONG'}")


def show_translation(backend, model, src_vocab: WordVocab, tgt_vocab: WordVocab) -> None:
    src = pad([src_vocab.encode(s, bos=False) for s, _ in TOY_TRANSLATION])
    out = backend.impl.greedy(model, src, BOS, EOS, max_len=8)
    print("greedy translations:")
    for (english, french), ids in zip(TOY_TRANSLATION, out, strict=True):
        said = tgt_vocab.decode(ids)
        print(f"  {english:<16} -> {said:<20} {'ok' if said == french else '(reference: ' + french + ')'}")


def show_generation(backend, model, vocab: WordVocab) -> None:
    print("greedy continuations of each prompt:")
    for prompt in ("the cat", "the dog", "the girl", "the boy"):
        ids = vocab.encode(prompt, eos=False)  # <bos> the cat
        # a decoder-only stepper reads the prompt, then its "bos": here the prompt's last word
        out = backend.impl.greedy(model, np.array([ids[:-1]]), ids[-1], EOS, max_len=6)
        print(f"  {prompt!r:<12} -> {vocab.decode(ids[:-1] + out[0].tolist())!r}")
