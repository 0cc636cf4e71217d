"""Results -> a Markdown report, a JSON file and the sequence-length plot."""

from __future__ import annotations

import json
import os
from typing import Any


def write_latest(folder: str, results: dict[str, Any], text: str) -> None:
    """A benchmark's outputs: ``folder``/latest.json (its results, what ``tools.readme_numbers`` reads) and
    latest.md (``text``, its tables), and ``text`` printed."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "latest.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(folder, "latest.md"), "w") as f:
        f.write(text.rstrip("\n") + "\n")
    print(text.rstrip("\n"))


def _ratio(r: dict[str, float]) -> str:
    return f"{r['median']:.2f}x [{r['p25']:.2f}-{r['p75']:.2f}] n={r['rounds']}"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines + [""]


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    out = [
        "# Benchmark: ours against each framework's own modules",
        "",
        f"{meta['date']}, {meta['cpu']} ({meta['cores']} cores), {meta['versions']}; "
        f"mode: {meta['mode']}; total {meta['total_s']:.0f} s. Load average {meta['load_start']} at the start, "
        f"{meta['load_end']} at the end.",
        "",
        "Method: eval, float32, same weights, one process; the implementations run interleaved "
        "(rotating order) and each ratio is the median of the per-round ratios ours/theirs, with the "
        "25th-75th percentile of those ratios and the number of rounds. GFLOP/s counts matmul FLOPs only "
        "(2 m n k, attention's q k^T and weights @ v included, padding included); '% matmul' is that rate "
        "over the same backend's 1024^3 float32 matmul timed in the same rounds. Max |diff| is taken at "
        "real tokens. Batch x tokens: " + meta["shapes"] + ".",
        "",
    ]
    sections_run = meta.get("sections_run", {})
    if sections_run:
        out.append(
            "Seconds per section (and the share of the CPUs other processes used meanwhile, "
            "stolen by the hypervisor): "
            + ", ".join(f"{name} {r['seconds']:.0f} s{_share(r.get('cpu_share'))}" for name, r in sections_run.items())
            + "."
        )
        out.append("")
        busiest = max((r["cpu_share"]["others"] for r in sections_run.values() if r.get("cpu_share")), default=0.0)
        if busiest > 0.10:
            out += [
                f"**Warning: other processes used up to {100 * busiest:.0f}% of the CPUs during this run.** "
                "Interleaving protects the ratios from drift, not from this: torch's OpenMP pool and "
                "OpenBLAS wait at every parallel op for a thread whose core is taken, which slows "
                "many-small-op code (ours, and tiny sizes) far more than fused kernels or XLA. "
                "Rerun on a quiet machine (--wait-idle helps on a shared one).",
                "",
            ]
    for name, reason in results.get("skipped", {}).items():
        out.append(f"- **{name}** skipped: {reason}")
    if results.get("skipped"):
        out.append("")

    if results.get("rows"):
        out += ["## Forward pass, side by side", ""]
        out += _table(
            ["backend", "what", "size", "B x T", "ours", "theirs", "ours ms", "theirs ms", "ratio ours/theirs",
             "ours GFLOP/s", "% matmul", "max abs diff", "notes"],
            [
                [r["section"], r["comparison"], r["size"], r["shape"], r["ours"], r["theirs"], _ms(r["ours_ms"]),
                 _ms(r["theirs_ms"]), _ratio(r["ratio"]), f"{r['gflops']:.1f}", f"{100 * r['matmul_fraction']:.0f}%",
                 f"{r['max_abs_diff']:.1e}", _row_notes(r)]
                for r in results["rows"]
            ],
        )  # fmt: skip
        rates = {}
        for r in results["rows"]:
            rates.setdefault(r["section"] if r["section"] != "bert" else "torch", []).append(r["matmul_gflops"])
        out.append(
            "Large-matmul rate in the same rounds (median per section, GFLOP/s): "
            + ", ".join(f"{k} {sorted(v)[len(v) // 2]:.0f}" for k, v in rates.items())
            + "."
        )
        out.append("")

    if results.get("targets"):
        out += ["## Targets", ""]
        out += _table(
            ["target", "measured", "met?", "what limits it"],
            [
                [t["target"], t["measured"], {True: "met", False: "**not met**", None: "n/a"}[t["met"]],
                 t["limits"] if t["met"] is False else ""]
                for t in results["targets"]
            ],
        )  # fmt: skip

    out += _baseline_markdown(results.get("baseline"))
    out += _sweep_markdown(results.get("sweep"))
    out += _memory_markdown(results.get("memory"))
    out += _compile_markdown(results.get("compile"))
    out += _training_markdown(results.get("training"))
    out += _smollm2_markdown(results.get("smollm2"))
    if results.get("breakdown"):
        out += ["## Where the time goes: components, ours against the framework's own op", ""]
        out += _table(
            ["backend", "component", "size", "B x T", "ours", "theirs", "ours ms", "theirs ms", "ratio"],
            [
                [r["section"], r["component"], r["size"], r["shape"], r["ours"], r["theirs"], _ms(r["ours_ms"]),
                 _ms(r["theirs_ms"]), _ratio(r["ratio"])]
                for r in results["breakdown"]
            ],
        )  # fmt: skip
    return "\n".join(out)


def _share(share: dict[str, float] | None) -> str:
    return f" ({100 * share['others']:.0f}% others, {100 * share['stolen']:.0f}% stolen)" if share else ""


def _row_notes(row: dict[str, Any]) -> str:
    notes = [row["notes"]] if row.get("notes") else []
    if row.get("ours_compile_s") is not None:
        notes.append(f"compile: ours {row['ours_compile_s']:.2f} s, theirs {row['theirs_compile_s']:.2f} s")
    return "; ".join(notes)


def _baseline_markdown(baseline: dict[str, Any] | None) -> list[str]:
    if not baseline:
        return []
    out = [
        f"## Before and after the redesign: ours now against ours at {baseline['commit']}, same run",
        "",
        "Each version in its own worker process (bench/worker.py, the same harness for both), built from "
        "the same seeded weights and batch; the rounds alternate between the two, and each worker times "
        "its own call; two pairs of workers, started in alternate order, their rounds pooled (two processes "
        "running the same compiled JAX program differ by up to ~7% for their whole life). Ratio: the median "
        "of the per-round ratios now / before.",
        "",
    ]
    if baseline.get("error"):
        return [*out, "error: " + baseline["error"], ""]
    rows = []
    for r in baseline["rows"]:
        if "error" in r:
            rows.append(
                [r["framework"], r["comparison"], r["size"], r["shape"], "error: " + r["error"][-300:], "", "", ""]
            )
            continue
        rows.append([r["framework"], r["comparison"], r["size"], r["shape"], _ms(r["now_ms"]), _ms(r["before_ms"]),
                     _ratio(r["ratio"]), f"{r['max_abs_diff']:.1e}"])  # fmt: skip
    out += _table(["backend", "what", "size", "B x T", "now ms", "before ms", "ratio now/before", "max abs diff"], rows)
    return out


def _sweep_markdown(sweep: dict[str, Any] | None) -> list[str]:
    if not sweep:
        return []
    labels = list(sweep["points"][0]["ms"])
    ratio_names = list(sweep["points"][0]["ratios"])
    out = [
        f"## Sequence-length sweep ({sweep['size']} encoder stack, batch {sweep['batch']}), ms per forward",
        "",
    ]
    out += _table(
        ["T", *labels, *ratio_names],
        [
            [p["seq_len"], *(_ms(p["ms"][label]) for label in labels), *(_ratio(p["ratios"][n]) for n in ratio_names)]
            for p in sweep["points"]
        ],
    )
    return out


def _memory_markdown(memory: dict[str, Any] | None) -> list[str]:
    if not memory:
        return []
    out = [
        f"## Peak memory of one forward ({memory['preset']}, {memory['shape']}), fresh process each",
        "",
        "Peak RSS increase during one call (VmHWM after minus VmRSS before, the peak reset just before "
        "the call; glibc's mmap threshold fixed so freed memory is returned). Weights and inputs are "
        "not counted; the output is.",
        "",
    ]
    rows = []
    for name, r in memory["rows"].items():
        if "error" in r:
            rows.append([name, "error: " + r["error"], "", ""])
            continue
        extra = f"XLA temp buffers {r['xla_temp_mib']:.0f} MiB" if "xla_temp_mib" in r else ""
        if not r.get("peak_reset", True):
            extra += " (peak could not be reset: includes building the model)"
        rows.append([name, f"{r['peak_increase_mib']:.0f}", f"{r['seconds']:.1f}", extra])
    out += _table(["implementation", "peak increase MiB", "call s", "notes"], rows)
    return out


def _compile_markdown(compile_result: dict[str, Any] | None) -> list[str]:
    if not compile_result:
        return []
    if "error" in compile_result:
        return ["## JAX compile time", "", "error: " + compile_result["error"], ""]
    out = [
        f"## JAX compile time: our {compile_result['preset']} model, {compile_result['shape']}, fresh process",
        "",
        "compile = JAX's own monitoring events: jaxpr trace + lowering to MLIR + XLA backend compile.",
        "",
    ]
    rows = []
    for c in compile_result["models"]:
        events = ", ".join(f"{k} {v:.2f} s" for k, v in c["events"].items())
        rows.append([c["layers"], f"{c['compile_s']:.2f}", f"{c['first_call_s']:.2f}",
                     f"{c['later_call_s']:.2f}", events])  # fmt: skip
    out += _table(["layers", "compile s", "first call s", "later call s", "events"], rows)
    out += ["(The 1-layer model is compiled second, in the same process: a rough idea of how compile time "
            "grows with depth, since the layers are unrolled.)", ""]  # fmt: skip
    return out


def _training_markdown(training: dict[str, Any] | None) -> list[str]:
    if not training:
        return []
    if "skipped" in training:
        return ["## Training steps", "", training["skipped"], ""]
    out = [
        "## Training steps",
        "",
        "train_step: forward, loss, backward and the Adam update (JAX: one nnx.jit program); "
        "loss_and_grads: forward, loss and backward, gradients handed back as NumPy arrays.",
        "",
    ]
    rows = []
    for r in training["rows"]:
        for name in r["steps_per_s"]:
            step = ["-"] * 3
            if "train_steps_per_s" in r:
                step = [
                    f"{r['train_steps_per_s'][name]:.1f}",
                    _ms(r["ms_per_train_step"][name]),
                    _ratio(r["train_step_ratio_to_torch"][name]),
                ]
            grads = [f"{r['steps_per_s'][name]:.1f}", _ms(r["ms_per_step"][name]), _ratio(r["ratio_to_torch"][name])]
            rows.append([r["size"], r["shape"], name, *step, *grads, f"{r['loss'][name]:.6f}"])
    header = ["size", "B x T", "backend", "train_step /s", "ms", "/ torch's", "loss_and_grads /s", "ms", "/ torch's"]
    out += _table([*header, "loss"], rows)
    return out


def _of_limit(row: dict[str, Any]) -> str:
    """'62% / 71%' of the memory-read limit (median rounds / best rounds), or '' before it was measured."""
    if "fraction_of_limit" not in row:
        return ""
    return f"{100 * row['fraction_of_limit']:.0f}% / {100 * row['best_fraction_of_limit']:.0f}%"


def _smollm2_markdown(smollm2: dict[str, Any] | None) -> list[str]:
    if not smollm2:
        return []
    out = [
        f"## SmolLM2-135M generation: {smollm2['model']}, float32, same weights in all four",
        "",
        f"Cached greedy generation, {smollm2['prompt_len']}-token prompts + {smollm2['new_tokens']} new tokens; "
        "ours (greedy_decode over each backend's cached stepper) against transformers.LlamaForCausalLM.generate "
        "(sdpa), interleaved. prefill: the time to the first new token (the prompt through the model, "
        "filling the cache); tokens/s: the other new tokens * batch / their time; end to end: all new tokens * "
        "batch / the whole call. Ratios are medians of per-round ratios, ours/HF: tokens/s >= 1 and prefill "
        "<= 1 are faster than HF; 'best rounds': the fastest round of each against each other (on a busy "
        "machine, what each does when least disturbed). 'equal to HF': rows whose 64 tokens are HF's, and the "
        "first position where any row differs. torch (ours and HF) runs with torch's default threads "
        f"({smollm2.get('torch_threads', '?')}), and ours once more with one thread (on a busy machine, the "
        "threads of a parallel op wait for a core another process holds). Ours' prefill is two calls: the "
        "stepper's start (the prompt but its "
        "last token, filling the cache, no logits) and the first step (the prompt's last token).",
        "",
    ]
    rate = smollm2.get("read_rate_gb_s")
    if rate:
        ways = ", ".join(f"{way} {gb_s:.1f}" for way, gb_s in rate.items() if way != "best")
        out += [
            f"The limit: a step reads all {smollm2['weight_bytes'] / 1e6:.0f} MB of weights, so at the machine's "
            f"best memory-read rate measured in this run, **{rate['best']:.1f} GB/s** ({ways} GB/s; best of 5, "
            "before and after the rounds), a step that only read its weights would make read rate * batch / "
            "weight bytes tokens/s; '% of limit' is tokens/s against that (median rounds; best rounds after the "
            "slash).",
            "",
        ]
    rows = []
    for r in smollm2["rows"]:
        ours = r["implementation"].startswith("ours")
        agreement, first = r["agreement"], r["agreement"]["first_difference"]
        equal = f"{agreement['equal_rows']}/{agreement['rows']}" + (
            f", first difference at {first}" if first is not None else ""
        )
        rows.append([
            r["batch"], r["implementation"], f"{r['tokens_per_s']:.1f}",
            _ratio(r["tokens_per_s_ratio"]) if ours else "", f"{r['best_ratio']:.2f}x" if ours else "",
            f"{r['ms_per_token']:.1f}", f"{r['end_to_end_tokens_per_s']:.1f}",
            _ratio(r["end_to_end_ratio"]) if ours else "", f"{r['prefill_ms']:.0f}",
            _ratio(r["prefill_ratio"]) if ours else "", equal if ours else "", _of_limit(r),
        ])  # fmt: skip
    out += _table(["batch", "implementation", "tokens/s", "ours/HF", "best rounds ours/HF", "ms/token",
                   "end to end tokens/s", "ours/HF", "prefill ms", "ours/HF time", "equal to HF",
                   "% of limit"], rows)  # fmt: skip
    fresh = smollm2.get("fresh_process", {})
    if "error" in fresh:
        return [*out, "fresh process (memory, JAX compile): error: " + fresh["error"], ""]
    memory = fresh.get("memory")
    if memory:
        out += [
            "Memory of loading the model into all three backends in one fresh process (VmRSS after each step, "
            f"VmHWM = peak so far; glibc's mmap threshold fixed): start {memory['start_mib']:.0f} MiB, "
            f"peak **{memory['peak_mib']:.0f} MiB** ({memory['peak_mib'] / 1024:.2f} GiB).",
            "",
        ]
        steps = [[s["after"], f"{s['rss_mib']:.0f}", f"{s['peak_mib']:.0f}"] for s in memory["steps"]]
        out += _table(["after", "RSS MiB", "peak MiB"], steps)
    compiles = fresh.get("jax_compile")
    if compiles:
        out += [
            "JAX's compiles for cached decoding, in that process: the prefill compiles initial_cache and the "
            "prompt-shaped decode_step; the first one-token step compiles the step every later position reuses "
            "(the position is a traced value). compile = trace + lower + XLA (JAX's monitoring events).",
            "",
        ]
        out += _table(
            ["batch", "prefill s (CPU s)", "prefill compile s (XLA programs)", "first step s (CPU s)",
             "step compile s (XLA programs)", "compiles in steps 2-64", "later step ms"],
            [[c["batch"], f"{c['prefill']['seconds']:.2f} ({c['prefill'].get('cpu_s', float('nan')):.2f})",
              f"{c['prefill']['compile_s']:.2f} ({c['prefill']['xla_compiles']})",
              f"{c['first_step']['seconds']:.2f} ({c['first_step'].get('cpu_s', float('nan')):.2f})",
              f"{c['first_step']['compile_s']:.2f} ({c['first_step']['xla_compiles']})",
              f"{c['later_steps_xla_compiles']} ({c['later_steps_compile_s']:.2f} s)", f"{c['later_step_ms']:.1f}"]
             for c in compiles],
        )  # fmt: skip
        out += [
            "(Seconds are wall time, as JAX's events measure them; CPU s is this process's CPU time over the "
            "same call, all threads: on a busy machine the wall time grows, the CPU time much less.)",
            "",
        ]
    return out


def plot_sweep(sweep: dict[str, Any], path: str) -> str | None:
    """Time against sequence length, log-log, one line per implementation; a note if matplotlib is missing."""
    try:
        figure = sweep_figure(sweep)
    except ImportError:
        return "matplotlib is not installed: no plot (pip install -e '.[bench]')"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    figure.savefig(path, dpi=120)
    return None


def sweep_figure(sweep: dict[str, Any]):
    """The sweep's figure (no pyplot state): ours solid, the framework's own dashed, one colour per framework;
    the time axis labelled in plain milliseconds (20, 50, 100, ...), the legend outside the lines."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import LogLocator, StrMethodFormatter

    lengths = [p["seq_len"] for p in sweep["points"]]
    fig = Figure(figsize=(8, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = {"torch": "tab:red", "nn.": "tab:red", "jax": "tab:blue", "Flax": "tab:blue", "numpy": "tab:green"}
    for label in sweep["points"][0]["ms"]:
        color = next((c for key, c in colors.items() if key in label), None)
        style = "-" if label.startswith("ours") else "--"  # ours solid, the framework's own dashed
        ax.plot(lengths, [p["ms"][label] for p in sweep["points"]], style, color=color, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(t) for t in lengths])
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax.yaxis.set_minor_formatter(StrMethodFormatter(""))
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("ms per forward (median)")
    ax.set_title(f"{sweep['size']} encoder stack, batch {sweep['batch']}, float32, CPU")
    ax.grid(True, which="both", alpha=0.3)
    fig.legend(loc="outside right center", fontsize=9, frameon=False)
    return fig
