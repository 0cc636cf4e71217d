"""Where the test command's time goes, measured: ``docs/test-time.json``, and the tables made from it.

    python -m tools.suite_time --measure   # run the README's test command on a fresh clone, timed (~20 min)
    python -m tools.suite_time             # print the tables from docs/test-time.json

``--measure`` clones HEAD into a temporary folder, makes a fresh virtualenv there, installs nox and
runs the README's test command exactly as CI (``.ci/run``) does, with ``SUITE_TIMING_DIR`` set: the
noxfile then times each session's installs and passes ``--timing-json`` to its pytest run
(``shared_tests/timing.py``: every test's setup, call and teardown, its CPU, and JAX's tracing and
compiling apart from running). Beside the times it records the date, the machine's cores and its
memory read rate (a NumPy sum over 512 MB, the best of five), so that a time measured on another
machine can be read against it. ``python -m tools.readme_numbers`` writes the README's and
CONTRIBUTING's durations and docs/test-time.md's tables from the file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULT = ROOT / "docs" / "test-time.json"
SLOWEST = 30  # tests in the table of the slowest
# The quick run (CONTRIBUTING.md), in the suite session's environment; the nox session quick runs the same.
QUICK_COMMAND = ".nox/suite/bin/pytest shared_tests --quick --numprocesses=auto --maxprocesses=4 --dist=loadgroup -q"


# ----------------------------------------------------------------------------- measuring
def memory_read_rate(megabytes: int = 512, repeats: int = 5) -> float:
    """GB/s: a NumPy sum over ``megabytes`` of float32, the best of ``repeats``."""
    import numpy as np

    array = np.ones(megabytes * 2**20 // 4, np.float32)
    best = min(_timed(array.sum) for _ in range(repeats))
    return array.nbytes / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def readme_commands() -> tuple[str, str]:
    """The README's two commands for a fresh machine, as written: set up and run the main job; run
    the tests (shared_tests/repository/test_readme.py holds that CI runs the second)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Two commands for a fresh machine") :]
    commands = re.findall(r"```bash\n(python3 -m venv \.venv && [^\n]*)\n```", section)[:2]
    if len(commands) != 2 or "nox" not in commands[1]:
        raise SystemExit(f"README.md: expected the main command and the test command, found {commands}")
    return commands[0], commands[1]


def _run(command: str, cwd: pathlib.Path, env: dict[str, str]) -> tuple[float, str]:
    print(f"$ {command}", flush=True)
    start = time.monotonic()
    proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        print((proc.stdout + proc.stderr)[-5000:])
        raise SystemExit(f"the command failed (exit {proc.returncode}) after {wall:.0f} s: {command}")
    print(f"  {wall:.0f} s", flush=True)
    return wall, proc.stdout + proc.stderr


def measure() -> dict[str, Any]:
    """Each README command on its own fresh clone of HEAD, timed; the test command's sessions and tests."""
    main_command, test_command = readme_commands()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}  # as on a fresh machine
    with tempfile.TemporaryDirectory(prefix="suite-time-") as tmp:
        clones = {name: pathlib.Path(tmp) / name for name in ("main", "tests")}
        for clone in clones.values():
            subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
        main_wall, _ = _run(main_command, clones["main"], env)
        timing = pathlib.Path(tmp) / "timing"
        timing.mkdir()
        wall, log = _run(test_command, clones["tests"], dict(env, SUITE_TIMING_DIR=str(timing)))
        sessions = _sessions(log, timing)
        # the quick run, in the environment the suite session made (every extra), as CONTRIBUTING shows it
        quick_json = timing / "quick.json"
        offline = dict(env, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")  # as the noxfile's sessions set it
        quick_wall, _ = _run(f"{QUICK_COMMAND} --timing-json={quick_json}", clones["tests"], offline)
        quick = summary(json.loads(quick_json.read_text()))
    return {
        "command": test_command,
        "main_command_s": round(main_wall, 1),
        "commit": head,
        "date": datetime.datetime.now().strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "machine": f"{platform.machine()}, {platform.processor() or platform.platform()}",
        "memory_read_gb_s": round(memory_read_rate(), 1),
        "wall_s": round(wall, 1),
        "sessions": sessions,
        "quick_command": QUICK_COMMAND,
        "quick_s": round(quick_wall, 1),
        "quick": quick,
    }


def _sessions(log: str, timing: pathlib.Path) -> list[dict[str, Any]]:
    """Each nox session that ran, in order: its time after its virtualenv was made, its installs (the
    noxfile's records) and its pytest run's records."""
    sessions = []
    for name in re.findall(r"nox > Running session (\S+)", log):
        record: dict[str, Any] = {"session": name}
        for kind in ("session", "install"):
            path = timing / f"{name}.{kind}.json"
            if path.exists():
                record[f"{kind}_s"] = round(sum(json.loads(path.read_text())), 1)
        tests = timing / f"{name}.json"
        if tests.exists():
            record["pytest"] = summary(json.loads(tests.read_text()))
        sessions.append(record)
    return sessions


KEPT = 100  # the slowest tests kept whole in docs/test-time.json; the rest only in the totals


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """A pytest run's --timing-json records, kept small enough to commit: the run's wall time, its
    processes, every figure summed over all its tests, and the KEPT slowest tests."""
    tests = sorted(run["tests"], key=lambda t: -(t.get("setup_s", 0) + t.get("call_s", 0)))
    totals: dict[str, float] = {"tests": len(tests)}
    for test in tests:
        for key, value in test.items():
            if isinstance(value, (int, float)):
                totals[key] = totals.get(key, 0) + value
    return {"wall_s": run["wall_s"], "processes": run["processes"], "totals": totals, "tests": tests[:KEPT]}


# ----------------------------------------------------------------------------- the tables
def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def sessions_table(result: dict[str, Any]) -> str:
    lines = [f"The README's test command on a fresh clone of {result['commit']} ({headline(result)}):", "",
             "| session | whole | installs | pytest: workers' start and collection | pytest: tests | tests run |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for s in result["sessions"]:
        run = s.get("pytest")
        if run:
            starts = [p.get("startup_wall_s", 0.0) for p in run["processes"]]
            tests = f"{run['wall_s'] - max(starts):.0f} s"
            start = f"{max(starts):.0f} s"
            count = str(run["totals"]["tests"])
        else:
            tests = start = count = "-"
        install = f"{s['install_s']:.0f} s" if "install_s" in s else "-"
        lines.append(f"| `{s['session']}` | {s['session_s']:.0f} s | {install} | {start} | {tests} | {count} |")
    outside = result["wall_s"] - sum(s["session_s"] for s in result["sessions"])
    lines.append(f"| the rest: the virtualenvs, `pip install nox`, nox itself | {outside:.0f} s | | | | |")
    lines.append(f"| **the test command** | **{result['wall_s']:.0f} s** | | | | |")
    return "\n".join(lines)


def slowest_table(result: dict[str, Any], count: int = SLOWEST) -> str:
    tests = [t for s in result["sessions"] for t in s.get("pytest", {}).get("tests", [])]
    tests = sorted(tests, key=lambda t: -(t.get("setup_s", 0) + t.get("call_s", 0)))[:count]
    lines = ["| test | setup | call | of the call: JAX tracing + lowering | XLA compiling | the rest (running) |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for t in tests:
        jax_front = t.get("jax_trace_s", 0) + t.get("jax_lower_s", 0)
        compile_s = t.get("jax_compile_s", 0)
        rest = t.get("call_s", 0) - jax_front - compile_s
        file, test = t["test"].removeprefix("shared_tests/").split("::", 1)
        name = f"`{file}`: {test.removeprefix('test_').replace('_', ' ')}"  # words wrap in a narrow window
        lines.append(f"| {name} | {t.get('setup_s', 0):.1f} s | {t.get('call_s', 0):.1f} s | {jax_front:.1f} s | "
                     f"{compile_s:.1f} s | {max(rest, 0):.1f} s |")  # fmt: skip
    return "\n".join(lines)


def repeated_table(result: dict[str, Any]) -> str:
    """The same work done more than once: programs compiled again, frameworks imported again."""
    runs = [s["pytest"] for s in result["sessions"] if "pytest" in s]
    total = {key: sum(r["totals"].get(key, 0) for r in runs) for key in {k for r in runs for k in r["totals"]}}
    hits, misses = total.get("jax_cache_hits", 0), total.get("jax_cache_misses", 0)
    read = total.get("jax_cache_read_s", 0)
    compile_s = total.get("jax_compile_s", 0) - read
    front = total.get("jax_trace_s", 0) + total.get("jax_lower_s", 0)
    processes = [p for r in runs for p in r["processes"]]
    starts = sum(p.get("startup_cpu_s", 0) for p in processes)
    per_compile = compile_s / misses if misses else 0.0
    rows = [
        ("tests' time (setup + call, every worker)", f"{total.get('setup_s', 0) + total.get('call_s', 0):.0f} s"),
        ("of it, XLA compiling programs not compiled before in this run", f"{compile_s:.0f} s ({misses} programs)"),
        ("programs compiled before (another test or worker) and read back from the run's cache",
         f"{hits}, read in {read:.0f} s (compiled again: ~{hits * per_compile:.0f} s)"),
        ("JAX tracing and lowering (done again in each process, cached or not)", f"{front:.0f} s"),
        ("pytest processes, each importing the frameworks before its first test",
         f"{len(processes)} ({starts:.0f} s of CPU)"),
    ]  # fmt: skip
    return "\n".join(["| repeated work | measured |", "| --- | --- |", *(f"| {a} | {b} |" for a, b in rows)])


def headline(result: dict[str, Any]) -> str:
    """The machine and the day a measurement was made on."""
    return (f"{result['date']}, {result['cpus']} cores, memory read at {result['memory_read_gb_s']} GB/s; "
            f"`python -m tools.suite_time --measure`")  # fmt: skip


def quick_line(result: dict[str, Any]) -> str:
    """CONTRIBUTING's sentence: the quick run's time."""
    return (f"The quick run took {_minutes(result['quick_s'])} ({result['quick']['totals']['tests']} tests; "
            f"{headline(result)}).")  # fmt: skip


def commands_line(result: dict[str, Any]) -> str:
    """The README's sentence: the two commands' times on fresh clones."""
    return (f"On a fresh clone the first took {result['main_command_s']:.0f} s, the second "
            f"{_minutes(result['wall_s'])} ({headline(result)}); CI (`.ci/run`) runs the second.")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.suite_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true", help="run the README's test command on a fresh clone first")
    args = parser.parse_args(argv)
    if args.measure:
        result = measure()
        RESULT.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {RESULT.relative_to(ROOT)}")
    if not RESULT.exists():
        raise SystemExit(f"{RESULT.relative_to(ROOT)} is missing: run python -m tools.suite_time --measure")
    result = json.loads(RESULT.read_text(encoding="utf-8"))
    print(commands_line(result), sessions_table(result), slowest_table(result), repeated_table(result), sep="\n\n")
    print(f"\n(command: {shlex.join(['python', '-m', 'tools.suite_time', *(argv or sys.argv[1:])])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
