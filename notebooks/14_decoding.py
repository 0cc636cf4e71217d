# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 14. Decoding: greedy, beam and sampling, and the key/value cache
#
# A trained decoder gives, for every prefix, a distribution over the next token:
# $p(y_t \mid y_{<t}, x)$, where $x$ is the source sentence (a translator) or nothing at all
# (a language model, whose prompt is the start of $y$). Generating text is a loop: feed the
# tokens so far, read the last position's logits $z_t \in \mathbb{R}^V$, choose a token,
# append it, repeat until `<eos>` or a length limit. The *choice* is the search:
#
# - **greedy**: $y_t = \arg\max_v z_{t,v}$, one hypothesis, the locally best token each step;
# - **beam search**: keep the $k$ best partial hypotheses by their total log-probability
#   $\sum_t \log p(y_t \mid y_{<t}, x)$; each step extends every one by every token, keeps the
#   $k$ best of those $k V$ candidates, and finally picks the best finished hypothesis by
#   $\frac{1}{|y|^{\alpha}} \sum_t \log p(y_t \mid y_{<t}, x)$ (the length penalty $\alpha$; the
#   sum alone favours short outputs);
# - **sampling**: draw $y_t$ from $\mathrm{softmax}(z_t / \tau)$, the temperature $\tau$
#   sharpening ($\tau < 1$) or flattening ($\tau > 1$) it, often after keeping only the $k$ most
#   probable tokens (**top-k**) or the smallest set of most probable tokens whose probability
#   reaches $p$ (**top-p**, nucleus sampling).
#
# None of this depends on the framework: it is NumPy on `(N, V)` logits. So the project
# writes the search **once**, in `transformer_run.decoding`, and the three backends share it.
# A backend supplies only a *stepper*: `start` (encode the source, make an empty cache),
# `step` (the newest token of each running sequence in, next-token logits out) and `reorder`
# (beam search keeps some sequences twice and drops others). Here is greedy search, read
# from its file as this cell runs:

# %%
import os
import time

# NumPy's matrix products on one thread, as torch's (below): for models this small a second
# thread gains little, and on a busy machine each product waits for a processor to run it on,
# which is most of what the timings at the end of this chapter would measure. NumPy's BLAS
# library reads this once, when NumPy is first imported (a fresh kernel has not imported it).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import matplotlib.pyplot as plt
import numpy as np
import torch

from transformer_course import agreement, backends, check, each, show, show_shared
from transformer_run import TOY_TRANSLATION_MODEL, WordVocab, decoding
from transformer_run.data import BOS, EOS, TOY_TRANSLATION, pad
from transformer_spec import Config, init_params, load_params

torch.set_num_threads(1)  # models this small run faster on one thread


show_shared(decoding.greedy_decode)

# %% [markdown]
# `done` keeps a finished row (one that produced `<eos>`) producing padding while the others
# go on. Each backend's `greedy` checks its arguments and hands its stepper to this function;
# the stepper's `step` is where the backends differ:

# %%
show("generate.py", "CachedStepper.step")

# %% [markdown]
# JAX's step is compiled (`jax.jit`), so it checks the token ids and the position eagerly
# first: inside compiled code it could not look at their values.
#
# ## Three searches on a trained model, in the three backends
#
# The package ships a small encoder-decoder trained on the toy corpus of the PyTorch
# tutorials (six English sentences and their pretend-French translations), with the training
# loop of chapter 13. Its weights (float32) are loaded into each backend, which runs them in
# float64:

# %%
params, config = load_params(TOY_TRANSLATION_MODEL)
src_vocab = WordVocab.from_sentences([english for english, _ in TOY_TRANSLATION])
tgt_vocab = WordVocab.from_sentences([french for _, french in TOY_TRANSLATION])
print(f"{config.kind}: d_model {config.d_model}, {config.num_heads} heads, "
      f"{config.num_encoder_layers} + {config.num_decoder_layers} layers, max_len {config.max_len}")  # fmt: skip
print("target vocabulary:", tgt_vocab.itos)
models = each(lambda b: b.impl.build_model(config, params, dtype="float64"))

sentences = [english for english, _ in TOY_TRANSLATION] + ["you hates fish", "she like meat"]
src = pad([src_vocab.encode(sentence, bos=False) for sentence in sentences])  # (8, 4): no <bos> on the source


def searches(b):
    model = models[b.name]
    return {
        "greedy": b.impl.greedy(model, src, BOS, EOS, max_len=6),
        "beam (k = 4)": b.impl.beam(model, src, BOS, EOS, max_len=6, beam_size=4).ids,
        "sample (tau = 1, seed 0)": b.impl.sample(model, src, BOS, EOS, max_len=6, temperature=1.0, seed=0),
    }


outputs = each(searches)
for name, found in outputs["numpy"].items():
    same = all(np.array_equal(found, outputs[b][name]) for b in outputs)
    print(f"\n{name}: the same tokens in {', '.join(outputs)}: {same}")
    for sentence, ids in zip(sentences, found, strict=True):
        print(f"  {sentence:16} -> {tgt_vocab.decode(ids)}")

# %% [markdown]
# The first six sentences are the training set: every search finds their translation. The
# last two were never seen. On *you hates fish* greedy and beam search disagree. Greedy
# chose each word by itself; beam search compared whole translations. The total
# log-probability of each (the logits of one forward pass over the whole translation, in every
# backend) shows which one the model prefers:

# %%
def log_probability(b, row, ids):
    """The model's total log p(ids[1:] | ids[:-1], source), and the logits of that forward pass."""
    ids = ids[: list(ids).index(EOS) + 1][None, :]  # (1, T): <bos> .. <eos>
    logits = b.call(models[b.name], src[row : row + 1], ids[:, :-1]).logits  # (1, T - 1, V)
    log_probs = decoding.log_softmax(logits)[0, np.arange(ids.shape[1] - 1), ids[0, 1:]]  # (T - 1,)
    return log_probs.sum(), logits


row = sentences.index("you hates fish")
for name in ("greedy", "beam (k = 4)"):
    ids = outputs["numpy"][name][row]
    totals = each(lambda b, ids=ids: log_probability(b, row, ids))
    scores = ", ".join(f"{b} {total:.6f}" for b, (total, _) in totals.items())
    print(f"{name:12} {tgt_vocab.decode(ids):18} total log p: {scores}")
agreement({b: logits for b, (_, logits) in totals.items()})

# %% [markdown]
# Beam search's translation is more probable, by a factor $e^{1.0786 - 0.7207} \approx 1.4$:
# its second word was not the most probable one after *tu*, but what followed fitted much
# better. The table is the logits of that forward pass in the three backends: equal to
# float64's last bits, which is why every search above picked the same tokens in all three.
#
# Neither is a good translation, though. In the corpus's pretend-French *you hates fish* is
# *tu deteste poisson*, three words the model knows; greedy's *tu mange viande* is the
# translation of *you eat meat*, a training sentence, and beam's *tu aime poisson* says *you
# like fish*. The model is tiny ($d_{\text{model}} = 36$) and was trained on six sentence
# pairs: it learned to give those six translations back, not which word translates which.
# *hates* was in one sentence only, *he hates meat*, and *deteste* only ever followed *il*;
# so for a sentence it never saw it puts together pieces of the ones it did (*she like
# meat* fails the same way: *like* was only ever in *i like fish*, and every search says
# *je aime viande*, "I like meat"). A better search finds what the model prefers, and beam
# search did: its answer is more probable *to this model*, not more correct. Only a better
# model (more data, more training) makes the most probable answer a good one.
#
# ## Sampling: temperature, top-k, top-p
#
# Sampling turns the logits into a distribution first; `filter_logits` is that part
# (temperature, then top-k, then top-p, renormalised), and `sample_decode` draws from it with
# one seeded NumPy generator, so the three backends draw the same numbers too:

# %%
show_shared(decoding.filter_logits)

# %% [markdown]
# *she like meat* (never seen) leaves the model unsure of its first word. The distribution of
# that first step as each filter leaves it:

# %%
numpy_backend = backends()[0]  # NumPy, the reference
row = sentences.index("she like meat")
_, logits = log_probability(numpy_backend, row, outputs["numpy"]["greedy"][row])  # (1, T, V)
first_logits = logits[0, :1]  # (1, V): the step after <bos>
settings = {
    "softmax (tau = 1)": {},
    "tau = 3": {"temperature": 3.0},
    "tau = 0.5": {"temperature": 0.5},
    "top-k, k = 2": {"top_k": 2},
    "tau = 3, then top-p, p = 0.8": {"temperature": 3.0, "top_p": 0.8},
}
fig, axes = plt.subplots(1, len(settings), figsize=(13, 2.8), sharey=True)
for axis, (title, kwargs) in zip(axes, settings.items(), strict=True):
    probs = decoding.filter_logits(first_logits, **kwargs)[0]  # (V,)
    axis.bar(range(len(probs)), probs, color="C1")
    # a filtered token's bar has height 0 and draws nothing: a cross on the axis shows it is there
    filtered = np.flatnonzero(probs == 0)  # softmax alone never gives exactly 0; the filters do
    if len(filtered):
        axis.plot(filtered, np.zeros(len(filtered)), "x", color="C3", clip_on=False, label="filtered out (p = 0)")
        axis.legend(loc="upper left", fontsize=8, handlelength=1)
    axis.set_xticks(range(len(probs)), tgt_vocab.itos, rotation=90, fontsize=8)
    axis.set_title(title, fontsize=10)
axes[0].set_ylabel("probability of the first word")
fig.tight_layout()

# %% [markdown]
# The temperature reshapes the whole distribution; top-k and top-p cut its tail to exactly 0
# (the red crosses: those tokens are filtered out) and renormalise what is left, so a token
# the model thinks unlikely can never be drawn. Without a filter no token is at 0: the bars
# too short to see in the first three panels are small probabilities, and a draw can still
# land on one. Ten draws (ten seeds) in each backend:

# %%
one = src[row : row + 1]  # (1, 4)


def ten_samples(b):
    runs = [b.impl.sample(models[b.name], one, BOS, EOS, max_len=6, temperature=1.0, seed=seed) for seed in range(10)]
    return [tgt_vocab.decode(ids[0]) for ids in runs]


samples = each(ten_samples)
print("the same draws in every backend:", all(samples[b] == samples["numpy"] for b in samples))
for seed, text in enumerate(samples["numpy"]):
    print(f"  seed {seed}: {text}")

# %% [markdown]
# ## The key/value cache
#
# Without a cache, step $t$ runs the whole prefix of $t$ tokens through every layer again
# (the `UncachedStepper`): the work of step $t$ grows with $t$, and a sequence of $n$ tokens
# costs $O(n^2)$ token passes (and $O(n^3)$ attention scores). But in a causal decoder no
# position ever looks at a later one, so the keys and values of positions $0..t-1$ at step $t$
# are exactly those of the previous step. A **key/value cache** keeps them, per layer, already
# projected and split into heads: step $t$ projects only the new token, appends its key $k_t$
# and value $v_t$, and its query attends over everything cached:
#
# $$ K_{\le t} = [K_{<t};\, k_t], \quad V_{\le t} = [V_{<t};\, v_t], \qquad
#    o_t = \mathrm{softmax}\!\Big(\frac{q_t K_{\le t}^\top}{\sqrt{d_k}}\Big) V_{\le t}. $$
#
# No causal mask is needed for that one query: nothing after $t$ is in the cache yet. (The
# encoder-decoder's cross-attention caches too: the source's keys and values are projected
# once, before the first step, and never change.) The cache is one small class per backend:

# %%
show("attention.py", "KeyValueCache.update")

# %%
show("attention.py", "append_to_cache")

# %% [markdown]
# Here the backends differ on purpose. NumPy and torch **grow** the cache by concatenation:
# after step $t$ it holds exactly $t + 1$ positions. `jax.jit` compiles one program per input
# shape, and a cache whose shape changed every step would be compiled every step; so JAX's
# cache is a **fixed-size buffer** of `max_len` slots (zeros at first), and a step *writes*
# its key and value into slot $t$ with `dynamic_update_slice`. Its query then scores every
# slot, and a mask hides the slots not written yet (they all lie after the query: the causal
# mask already hides them). The attention layer takes the cache and the position as
# arguments:

# %%
show("attention.py", "MultiHeadAttention.key_value")

# %% [markdown]
# ### Cached equals uncached: one layer
#
# One self-attention layer of the `tiny-llama` preset (9 query heads sharing 3 key/value
# heads, rotary positions: the `position` argument decides each new key's rotation), with
# `max_len` cut to 10 so that JAX's buffer is small enough to look at. Seven tokens go
# through it twice: all at once with a causal mask, and one at a time with a cache. The mask
# of a step is "slot $\le t$", which hides JAX's unwritten slots and is all True for the
# growing caches.

# %%
layer_config = Config.preset("tiny-llama").replace(max_len=10)
layer_params = init_params(layer_config, seed=0, dtype="float64", component="attention")
T = 7
x = np.random.default_rng(0).standard_normal((1, T, layer_config.d_model))  # (B, T, d_model)
causal = np.tril(np.ones((T, T), dtype=bool))[None, None]  # (1, 1, T, T)


def cached_and_full(b):
    layer = b.build("MultiHeadAttention", layer_config, layer_params, "float64")
    full, _ = b.call(layer, x, x, x, causal)  # (1, T, d_model): all positions at once
    cache = layer.empty_cache(1)  # (1, H_kv, 0, d_k) in NumPy and torch, (1, H_kv, max_len, d_k) in JAX
    steps, weights, written = [], [], []
    for t in range(T):
        token = x[:, t : t + 1]  # (1, 1, d_model): the newest position only
        slots = max(b.to_numpy(cache.k).shape[2], t + 1)  # after this step's append
        mask = (np.arange(slots) <= t)[None, None, None, :]  # (1, 1, 1, slots)
        out, w = b.call(layer, token, token, token, mask, need_weights=True, cache=cache, position=t)
        steps.append(out)
        weights.append(w[0, 0, 0])  # head 0's weights over the cache's slots
        written.append(np.abs(b.to_numpy(cache.k)[0]).sum(axis=(0, 2)) > 0)  # (slots,): which hold a key
    return full, np.concatenate(steps, axis=1), weights, written


layer_runs = each(cached_and_full)
for name, (full, stepped, weights, _) in layer_runs.items():
    print(f"{name:6} cache holds {len(weights[-1]):2} slots at the end; "
          f"max |cached - all at once| = {np.abs(stepped - full).max():.1e}")  # fmt: skip
agreement({name: stepped for name, (_, stepped, _, _) in layer_runs.items()})

# %% [markdown]
# The cached outputs equal the all-at-once ones to rounding in every backend, and the three
# backends' cached outputs agree with each other (the table). The picture is the cache
# filling: JAX's buffer on the left (which slots hold a key after each step; the slot written
# by that step is outlined), and on the right what the step's query did with it, head 0's
# attention weights over the slots, in NumPy's growing cache and in JAX's buffer:

# %%
_, _, jax_weights, jax_written = layer_runs["jax"]
_, _, numpy_weights, _ = layer_runs["numpy"]
slots = layer_config.max_len
grown = np.full((T, slots), np.nan)  # NumPy's cache is t + 1 slots long at step t: the rest does not exist
for t, w in enumerate(numpy_weights):
    grown[t, : len(w)] = w
panels = {
    "JAX's buffer: slots holding a key": np.array(jax_written, float),
    "NumPy: weights over its growing cache": grown,
    "JAX: weights over every slot": np.array(jax_weights),
}
fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
for axis, (title, image) in zip(axes, panels.items(), strict=True):
    cmap = plt.get_cmap("Greens" if "holding" in title else "viridis").copy()
    cmap.set_bad("#dddddd")  # slots that do not exist
    shown = axis.imshow(np.ma.masked_invalid(image), cmap=cmap, vmin=0, vmax=1, aspect="auto")
    for t in range(T):
        axis.add_patch(plt.Rectangle((t - 0.5, t - 0.5), 1, 1, fill=False, edgecolor="C3", linewidth=1.5))
    axis.set_title(title, fontsize=10)
    axis.set_xlabel("cache slot (position)")
    axis.set_xticks(range(slots))
axes[0].set_ylabel("decoding step")
fig.colorbar(shown, ax=axes[1:], shrink=0.85, label="attention weight")
plt.show()

# %% [markdown]
# Step $t$ writes slot $t$ (outlined) and its query attends over slots $0..t$: a staircase,
# which is the causal mask, built one row per step. NumPy's cache has no slots beyond it
# (grey); JAX's has them, with zeros in them, and gives them weight exactly 0 because the
# mask hides them. Had the query attended over those zero keys, each would have scored 0 and
# taken a share of the softmax: the first exercise below is about that mistake.
#
# ### Cached equals uncached: whole models
#
# The same holds for whole models, with every layer's cache and the cross-attention's. The
# uncached stepper's step $t$ is the last position of a forward pass over the prefix
# $0..t$, and in a causal decoder that equals position $t$ of *one* forward pass over the
# whole sequence: so the cached steps are compared with one forward pass. (That is also
# cheaper to run in JAX: `jax.jit` compiles a program per input shape, and the uncached
# stepper's prefix has a new length at every step.) Two models: the toy translator, fed its
# greedy translations above, and a `tiny-llama` language model (random weights) on a 5-token
# prompt, whose `start` fills the cache with the whole prompt in one call, then 8 steps:

# %%
def step_logits(b, model, src_ids, tokens):
    """The logits (N, T, V) of a cached decoding that feeds ``tokens`` (N, T) one step at a time."""
    stepper = b.impl.make_stepper(model, cached=True)
    state = stepper.start(src_ids, tokens.shape[1])
    logits = []
    for position in range(tokens.shape[1]):
        step, state = stepper.step(state, tokens[:, position], position)  # (N, V)
        logits.append(step)
    return np.stack(logits, axis=1)


lm_config = Config.preset("tiny-llama")
lm_params = init_params(lm_config, seed=1, dtype="float64")
rng = np.random.default_rng(2)
prompt = rng.integers(1, lm_config.tgt_vocab_size, (2, 5))  # (2, P): two prompts of 5 tokens
continuation = rng.integers(1, lm_config.tgt_vocab_size, (2, 8))  # (2, 8): the tokens fed after them
translations = outputs["numpy"]["greedy"][:, :-1]  # (8, T): <bos> and the words fed back


def cached_and_one_pass(b):
    lm = b.impl.build_model(lm_config, lm_params, dtype="float64")
    whole = np.concatenate([prompt, continuation], axis=1)  # (2, P + 8)
    one_pass = {
        "toy translator": b.call(models[b.name], src, translations).logits,  # (8, T, V)
        "tiny-llama LM": b.call(lm, whole).logits[:, prompt.shape[1] :],  # (2, 8, V): after the prompt
    }
    cached = {
        "toy translator": step_logits(b, models[b.name], src, translations),
        "tiny-llama LM": step_logits(b, lm, prompt, continuation),
    }
    return cached, one_pass


runs = each(cached_and_one_pass)
for name, (cached, one_pass) in runs.items():
    gaps = {label: np.abs(cached[label] - one_pass[label]).max() / np.abs(one_pass[label]).max() for label in cached}
    print(f"{name:6} max |cached steps - one pass| / max |one pass|: "
          + ", ".join(f"{label} {gap:.1e}" for label, gap in gaps.items()))  # fmt: skip
agreement({name: cached["tiny-llama LM"] for name, (cached, _) in runs.items()})

# %% [markdown]
# Equal to rounding in each backend, and (the table: the language model's cached logits)
# across the three.
#
# What the cache buys: the time of each step, in NumPy, for a decoder-only model somewhat
# bigger than the toy (4 layers, $d_{\text{model}} = 128$), generating 200 tokens with and
# without the cache. A step takes milliseconds, and timed once it is mostly noise on a busy
# machine: whenever another program takes the processor, the steps timed then look slow. So
# the 200 tokens are generated five times over, and each step's time is its median over the
# five runs (a busy spell slows a step in one run, rarely in three); and NumPy runs on one
# thread (the first cell says why):

# %%
big_config = Config.preset("tiny-lm").replace(
    d_model=128, num_heads=4, d_ff=256, num_decoder_layers=4, max_len=256, tgt_vocab_size=500
)
big_model = numpy_backend.impl.build_model(big_config, init_params(big_config, seed=0, dtype="float32"))
decodings = {"with the cache": [], "without": []}
# the repeats are whole decodings, not one step again at once: one busy spell would slow every
# repeat of the step it falls on, and their median with them
for _ in range(5):
    for label, cached in (("with the cache", True), ("without", False)):
        stepper = numpy_backend.impl.make_stepper(big_model, cached=cached)
        state, token, seconds = stepper.start(np.zeros((1, 0), np.int64), 200), np.array([BOS]), []
        for position in range(200):
            start = time.perf_counter()
            logits, state = stepper.step(state, token, position)
            seconds.append(time.perf_counter() - start)
            token = logits.argmax(axis=-1)
        decodings[label].append(seconds)
timings = {label: np.median(seconds, axis=0) for label, seconds in decodings.items()}  # (200,): each step's median
fig, axis = plt.subplots(figsize=(6, 3))
for label, seconds in timings.items():
    axis.plot(1e3 * seconds, label=f"{label}: {seconds.sum():.2f} s in all")
axis.set_xlabel("decoding step (tokens so far)")
axis.set_ylabel("ms per step (median of 5)")
axis.legend()
fig.tight_layout()

# %% [markdown]
# Without the cache the time of a step grows with the prefix; with it, it stays flat (here the
# attention over the cache is a small part of a step, which is mostly the layers' matrix
# products for one token). "In all" adds up the medians: the 200 steps of one run. The price
# is memory: two arrays of $(B, H_{kv}, T, d_k)$ per layer, which is why grouped-query
# attention (chapter 5, and the next chapter) shrinks $H_{kv}$.
#
# ## Exercises
#
# Write each function in NumPy and run `check` on it: it runs your function and every
# backend's own code on the same inputs (for the filters, `filter_logits`, the code all three
# backends sample with) and says what differs, and which classic mistake your answer matches
# when it matches one. The solutions are in `solutions/14_decoding.py`.
#
# ### Exercise 14.1: one step with a key/value cache
# `kv_cache_step(q, k_new, v_new, k_cache, v_cache, position)` → the new token's context
# `(B, H, 1, d_k)`. `q`, `k_new`, `v_new` are `(B, H, 1, d_k)`: the new token's query, key and
# value, already split into heads. `k_cache` and `v_cache` are JAX-style buffers
# `(B, H, max_len, d_k)`: slots `0 .. position - 1` hold the earlier tokens' keys and values,
# the later slots zeros. Write the new key and value into slot `position`, then attend the query
# over slots `0 .. position` (softmax of the scores divided by $\sqrt{d_k}$). The next step
# reads what this one wrote, so `check` compares the two buffers after your call as well as the
# context you return.

# %%
def kv_cache_step(q, k_new, v_new, k_cache, v_cache, position):
    raise NotImplementedError("your code here")


check(kv_cache_step)

# %% [markdown]
# ### Exercise 14.2: the top-k filter
# `top_k_filter(logits, k)` → probabilities `(N, V)`: for each row, the softmax over its `k`
# largest logits, 0 for every other token. A logit equal to the `k`-th largest stays too
# (the threshold is a value, as in `filter_logits`), so a tie can keep more than `k` tokens.

# %%
def top_k_filter(logits, k):
    raise NotImplementedError("your code here")


check(top_k_filter)

# %% [markdown]
# ### Exercise 14.3: the top-p (nucleus) filter
# `top_p_filter(logits, top_p)` → probabilities `(N, V)`: rank each row's tokens by
# probability (of equal probabilities, the lower id first), keep the smallest set of the most
# probable ones whose probability reaches `top_p` (so the token that crosses `top_p` is kept,
# and the most probable token always is), renormalise them to sum to 1, 0 for the rest.

# %%
def top_p_filter(logits, top_p):
    raise NotImplementedError("your code here")


check(top_p_filter)

# %% [markdown]
# What a wrong answer looks like: the cache step that attends over the whole buffer.

# %%
def kv_cache_step(q, k_new, v_new, k_cache, v_cache, position):
    k_cache[:, :, position], v_cache[:, :, position] = k_new[:, :, 0], v_new[:, :, 0]
    scores = q @ k_cache.swapaxes(-1, -2) / np.sqrt(q.shape[-1])  # every slot, written or not
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True) @ v_cache


check(kv_cache_step)
