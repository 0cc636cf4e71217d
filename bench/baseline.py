"""Before and after, in the same run: our code now against an older commit's (by default
350f1b0, the last commit before the backends were redesigned to read alike), same implementation,
same inputs.

"Nothing slower than before" is a ratio, and on this machine only ratios taken in the same
rounds mean anything (see timing.py). So the old code runs alongside the new one: ``git
worktree add`` checks the commit out into a temporary directory, and two worker processes
(``worker.py``), one per source tree, each build the same implementation from the same
seeded weights and batch; the rounds alternate between them in rotating order, as the
in-process comparisons do. Each worker measures its own call (no pipe in the timed region)
and imports the model code of its own tree only; the harness, worker.py, is the same file
for both. A worker idles on a blocking read while the other runs. Two pairs of workers per
comparison, started in alternate order (``PAIRS``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from .timing import Budget, Candidate, Ratio, interleaved

BASELINE_COMMIT = "350f1b0"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
SETTLE_BETWEEN_PROCESSES_S = 0.05  # let one worker's thread pool go idle before the other starts
# Two processes running the *same* compiled JAX program differ by up to ~7% (memory placement,
# which one started first), steadily for the life of the pair: so each comparison uses PAIRS
# pairs of fresh workers, started in alternate order, and pools their rounds.
PAIRS = 2
# what -> (framework, the comparison's name), as worker.py builds them
WHAT = {
    "torch-encoder": ("torch", "encoder stack"),
    "torch-encoder-decoder": ("torch", "encoder + decoder stacks"),
    "jax-encoder": ("jax", "encoder stack (jitted)"),
}


def checkout(commit: str) -> str:
    """A worktree of this repository at ``commit`` (made once, in the temp directory) -> its path."""
    path = os.path.join(tempfile.gettempdir(), f"bench-baseline-{commit}")
    if not os.path.isdir(path):
        subprocess.run(
            ["git", "worktree", "add", "--detach", path, commit], cwd=REPO, check=True, capture_output=True, text=True
        )
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, check=True, capture_output=True, text=True)
    if not head.stdout.strip().startswith(commit):
        raise RuntimeError(f"{path} is at {head.stdout.strip()}, not {commit}: remove it (git worktree remove)")
    return path


class Worker:
    """One ``worker.py`` process: ``run()`` -> the seconds of one forward, measured in the worker."""

    def __init__(self, root: str, what: str, size: str, batch: int, seq_len: int):
        self.log = tempfile.TemporaryFile(mode="w+")  # the worker's stderr, shown if it fails
        self.process = subprocess.Popen(
            [sys.executable, WORKER, root, what, size, str(batch), str(seq_len)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1,
        )  # fmt: skip
        ready = self.process.stdout.readline().split()
        if len(ready) != 3 or ready[0] != "ready":
            raise RuntimeError(f"worker for {root} ({what}, {size}) failed:\n{self._stderr()}")
        if os.path.realpath(ready[2]) != os.path.realpath(root):
            raise RuntimeError(f"the worker for {root} imported the model code from {ready[2]}")
        self.output = np.load(ready[1])
        os.remove(ready[1])
        os.rmdir(os.path.dirname(ready[1]))

    def run(self) -> float:
        self.process.stdin.write("run\n")
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker died:\n{self._stderr()}")
        return float(line)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
            self.process.wait(timeout=60)
        self.log.close()

    def _stderr(self) -> str:
        self.process.kill()
        self.log.seek(0)
        return self.log.read()[-4000:]


def _time_pair(roots, what, size, batch, seq_len, framework, budget, times) -> dict[str, np.ndarray]:
    """One pair of workers, started in the order of ``roots`` (label -> source tree), timed
    interleaved; their times are appended to ``times`` -> their outputs."""
    workers = {}
    try:
        for label, root in roots.items():
            workers[label] = Worker(root, what, size, batch, seq_len)
        candidates = [
            Candidate(label, framework, worker.run, self_timed=True, settle_s=SETTLE_BETWEEN_PROCESSES_S)
            for label, worker in workers.items()
        ]
        for label, values in interleaved(candidates, budget).items():
            times[label] += list(values)
        return {label: worker.output for label, worker in workers.items()}
    finally:
        for worker in workers.values():
            worker.close()


def baseline_section(
    sizes: Sequence[str], batch: int, seq_len: int, budget: Budget, commit: str = BASELINE_COMMIT
) -> dict[str, Any]:
    """Every (implementation, size): ours now against ours at ``commit``, interleaved."""
    try:
        before_root = checkout(commit)
    except (subprocess.CalledProcessError, RuntimeError, OSError) as error:  # no git, a shallow clone...
        detail = getattr(error, "stderr", "") or str(error)
        return {"commit": commit, "rows": [], "error": f"could not check out {commit}: {detail.strip()}"}
    rows = []
    for size in sizes:
        for what, (framework, comparison) in WHAT.items():
            if what == "torch-encoder-decoder" and size == "bert-base":
                continue  # BERT has no decoder
            row = {"what": what, "framework": framework, "comparison": comparison, "size": size,
                   "shape": f"{batch}x{seq_len}"}  # fmt: skip
            times: dict[str, list[float]] = {"now": [], "before": []}
            try:
                for pair in range(PAIRS):
                    roots = {"now": REPO, "before": before_root}
                    if pair % 2:  # the other start order: which process starts first is one more bias
                        roots = dict(reversed(roots.items()))
                    outputs = _time_pair(roots, what, size, batch, seq_len, framework, budget, times)
                row |= {
                    "now_ms": 1e3 * float(np.median(times["now"])),
                    "before_ms": 1e3 * float(np.median(times["before"])),
                    "ratio": Ratio.of(np.asarray(times["now"]), np.asarray(times["before"])).to_dict(),
                    "max_abs_diff": float(np.abs(outputs["now"] - outputs["before"]).max()),
                    "pairs": PAIRS,
                }
            except (RuntimeError, OSError, ValueError) as error:
                row["error"] = str(error)
            rows.append(row)
    return {"commit": commit, "rows": rows}
