"""``python -m bench.run [--quick] [--sections torch,jax,...]``: run the benchmark, write the report.

Writes bench/results/latest.md (also printed), latest.json and seq_sweep.png.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import platform
import time
import warnings
from typing import Any

from . import report, targets
from .timing import Budget

SECTIONS = (
    "torch", "jax", "numpy", "bert", "sweep", "memory", "compile", "training", "breakdown", "baseline", "smollm2",
)  # fmt: skip
RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")


class Plan:
    """What to run: the full benchmark, or ``--quick`` (tiny + base, short sweep, smaller memory run)."""

    def __init__(self, quick: bool):
        self.quick = quick
        self.sizes = ["tiny", "base"] if quick else ["tiny", "base", "bert-base"]
        self.budget = Budget(min_rounds=3, max_rounds=10, seconds=3.0) if quick else Budget(5, 30, 6.0)
        # The sweep: the paper's base encoder stack (6 layers, d_model 512), batch 2, so that
        # T = 1024 (2048 tokens, ~100 GFLOP per forward) still runs in about a second.
        self.sweep = ("base", 2, (64, 128, 256) if quick else (64, 128, 256, 512, 1024))
        self.sweep_budget = Budget(3, 3, 0.0) if quick else Budget(3, 5, 4.0)
        self.bert = ("tiny-bert", 8, 64) if quick else ("bert-base", 8, 128)
        self.memory = ("base", 8, 512) if quick else ("bert-base", 8, 512)
        self.compile = ("bert-base", 8, 128)
        self.training = [("tiny", 8, 16)]
        self.breakdown = ("base", 8, 128) if quick else ("bert-base", 8, 128)
        self.baseline = (self.sizes, 8, 128)  # ours now against ours at --baseline, in worker processes
        # SmolLM2-135M: 32-token prompts, 64 new tokens, batch 1 and 8; a round is a few seconds
        # to a minute (four whole generations), 4 rounds balance the order (Williams design)
        self.smollm2 = ((1, 8), Budget(4, 4, 0.0) if quick else Budget(4, 8, 90.0))

    def shapes(self, sections: list[str]) -> str:
        """The sizes of the sections that ran, in words (the report's and docs/performance.md's source line)."""
        parts = {
            ("torch", "jax", "numpy", "baseline", "compile", "breakdown"): f"{' / '.join(self.sizes)} at 8 x 128",
            ("bert",): f"BERT {self.bert[0]} at {self.bert[1]} x {self.bert[2]}",
            ("sweep",): f"sweep {self.sweep[0]} at batch {self.sweep[1]}",
            ("memory",): f"memory {self.memory[0]} at {self.memory[1]} x {self.memory[2]}",
            ("training",): f"training {self.training[0][0]} at {self.training[0][1]} x {self.training[0][2]}",
            ("smollm2",): "SmolLM2-135M: 32-token prompts + 64 new tokens at batch "
            + " and ".join(str(b) for b in self.smollm2[0]),
        }
        return "; ".join(text for names, text in parts.items() if set(names) & set(sections))


def _versions() -> str:
    found = []
    for name in ("numpy", "jax", "flax", "torch", "transformers"):
        try:
            found.append(f"{name} {importlib.import_module(name).__version__}")
        except ImportError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def _cpu_snapshot() -> tuple[float, float, float, float] | None:
    """(busy CPU-seconds of the whole machine, stolen CPU-seconds, this process's own CPU-seconds
    (children included), wall time), from /proc/stat and os.times(); None where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    own = os.times()
    own_s = own.user + own.system + own.children_user + own.children_system
    return (user + nice + system + irq + softirq) / tick, steal / tick, own_s, time.perf_counter()


def _others_share(start, end) -> dict[str, float] | None:
    """The share of the machine's CPUs that *other* processes used between two snapshots (and
    the share the hypervisor stole): the benchmark's ratios hold up to drift, but thread pools
    that wait on each other (OpenMP in torch, OpenBLAS) suffer most when a core is taken."""
    if start is None or end is None:
        return None
    capacity = (end[3] - start[3]) * (os.cpu_count() or 1)
    others = (end[0] - start[0]) - (end[2] - start[2])
    return {"others": max(0.0, others / capacity), "stolen": (end[1] - start[1]) / capacity}


def wait_for_idle(limit_s: float, threshold: float = 0.10) -> float | None:
    """Wait (up to ``limit_s``) until other processes use less than ``threshold`` of the CPUs,
    sampled over 2 s; -> their last measured share."""
    deadline = time.perf_counter() + limit_s
    while True:
        before = _cpu_snapshot()
        time.sleep(2.0)
        share = _others_share(before, _cpu_snapshot())
        if share is None or share["others"] < threshold or time.perf_counter() > deadline:
            return share["others"] if share else None
        print(f"[bench] other processes use {100 * share['others']:.0f}% of the CPUs: waiting", flush=True)


def _keep_or_skip(results: dict[str, Any], name: str, section: dict[str, Any]) -> None:
    """A section that found something missing returns {"skipped": why}: the report lists it with the others."""
    if "skipped" in section:
        results["skipped"][name] = section["skipped"]
    else:
        results[name] = section


def run_sections(
    plan: Plan, sections: list[str], results: dict[str, Any], wait_idle_s: float = 0.0, baseline: str = ""
) -> None:
    from . import fresh_process
    from . import sections as timed
    from .baseline import BASELINE_COMMIT, baseline_section
    from .breakdown import breakdown_section
    from .smollm2 import smollm2_section

    memory_names = list(fresh_process.MEMORY_IMPLEMENTATIONS)
    if not plan.memory[0].startswith("bert") or importlib.util.find_spec("transformers") is None:
        memory_names = [name for name in memory_names if not name.startswith("bert:")]
    steps = {
        "torch": lambda: results["rows"].extend(timed.torch_section(plan.sizes, plan.budget)),
        "jax": lambda: results["rows"].extend(timed.jax_section(plan.sizes, plan.budget)),
        "numpy": lambda: results["rows"].extend(timed.numpy_section(plan.sizes, plan.budget)),
        "bert": lambda: results["rows"].extend(timed.bert_section(*plan.bert, plan.budget)),
        "sweep": lambda: results.__setitem__("sweep", timed.sweep_section(*plan.sweep, plan.sweep_budget)),
        "memory": lambda: results.__setitem__("memory", fresh_process.memory_section(*plan.memory, memory_names)),
        "compile": lambda: results.__setitem__("compile", fresh_process.compile_section(*plan.compile)),
        "training": lambda: results.__setitem__("training", timed.training_section(plan.training, plan.budget)),
        "breakdown": lambda: results.__setitem__("breakdown", breakdown_section(*plan.breakdown, plan.budget)),
        "baseline": lambda: results.__setitem__(
            "baseline", baseline_section(*plan.baseline, plan.budget, baseline or BASELINE_COMMIT)
        ),
        "smollm2": lambda: _keep_or_skip(results, "smollm2", smollm2_section(*plan.smollm2)),
    }
    for name in sections:
        if wait_idle_s > 0:
            wait_for_idle(wait_idle_s)
        start, cpu = time.perf_counter(), _cpu_snapshot()
        print(f"[bench] {name} ...", flush=True)
        try:
            steps[name]()
        except ImportError as error:  # a framework (or transformers, for "bert") is not installed
            missing = error.name or str(error)
            results["skipped"][name] = f"{missing} is not installed (pip install -e '.[all,bench]' transformers)"
        seconds, share = time.perf_counter() - start, _others_share(cpu, _cpu_snapshot())
        results["meta"].setdefault("sections_run", {})[name] = {"seconds": seconds, "cpu_share": share}
        busy = f", other processes used {100 * share['others']:.0f}% of the CPUs" if share else ""
        print(f"[bench] {name}: {seconds:.0f} s{busy}", flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny + base only, short sweep, memory at base size")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated, any of: {', '.join(SECTIONS)} (default: all)"
    )
    parser.add_argument("--out", default=RESULTS_DIR, help="directory for latest.md, latest.json, seq_sweep.png")
    parser.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each section, wait up to SECONDS for other processes to leave the CPUs (shared machines)",
    )
    parser.add_argument(
        "--baseline",
        default="",
        metavar="COMMIT",
        help="the commit the 'baseline' section times ours against (default: 350f1b0, before the read-alike redesign)",
    )
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {list(SECTIONS)}")

    # nn.TransformerEncoder explains why it does not use nested tensors (odd head count), and
    # warns that nested tensors are a prototype: both expected here.
    warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")

    plan = Plan(args.quick)
    start = time.perf_counter()
    results: dict[str, Any] = {"meta": {}, "rows": [], "skipped": {}}
    load_start = _load()
    run_sections(plan, sections, results, args.wait_idle, args.baseline)
    results["targets"] = targets.evaluate(results)
    results["meta"] |= {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "versions": _versions(),
        "mode": "quick" if args.quick else "full",
        "sections": sections,
        "shapes": plan.shapes(sections),
        "total_s": time.perf_counter() - start,
        "load_start": load_start,
        "load_end": _load(),
    }

    os.makedirs(args.out, exist_ok=True)
    if results.get("sweep"):
        problem = report.plot_sweep(results["sweep"], os.path.join(args.out, "seq_sweep.png"))
        if problem:
            results["skipped"]["plot"] = problem
    report.write_latest(args.out, results, report.markdown(results))
    return results


if __name__ == "__main__":
    main()
