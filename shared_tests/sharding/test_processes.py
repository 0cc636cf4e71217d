"""The sets of processes the sharded tests share across xdist workers (processes.py) never leave a
test waiting for processes nobody runs: when the worker that started a set dies (a crash), the
next test asking for it is told so at once, naming the worker, and every later one without waiting."""

from __future__ import annotations

import subprocess
import sys
import time

from .processes import Processes


def test_a_set_whose_starting_worker_died_is_reported_at_once(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "lost.started").write_text(gone.stdout.strip())  # started by a process that has ended
    processes = Processes(tmp_path, "lost", {"never": [sys.executable, "-c", "raise SystemExit(3)"]}, {})
    assert processes.processes == {}  # not started again here
    start = time.monotonic()
    ended = processes.wait()
    assert time.monotonic() - start < 10
    assert ended["all"]["returncode"] is None
    assert f"(pid {gone.stdout.strip()}) died first" in ended["all"]["stderr"]
    start = time.monotonic()
    assert processes.wait() is ended and time.monotonic() - start < 0.1


def test_a_set_started_here_records_how_each_process_ended(tmp_path):
    processes = Processes(tmp_path, "here", {"ok": [sys.executable, "-c", "print('hi')"],
                                             "bad": [sys.executable, "-c", "raise SystemExit(3)"]}, {})  # fmt: skip
    ended = processes.wait()
    assert (ended["ok"]["returncode"], ended["ok"]["stdout"]) == (0, "hi\n")
    assert ended["bad"]["returncode"] == 3
