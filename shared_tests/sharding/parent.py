"""A process that dies with its parent: the processes the sharding tests start import this (or run
``WITH_PARENT``), so none outlives the pytest worker or launcher that would read it. Nothing else is
imported here: the shim below runs it before it becomes the command."""

from __future__ import annotations

import sys


def die_with_parent() -> None:
    """This process killed when its parent dies (Linux: the parent-death signal): a rank left
    waiting in a collective would outlive its launcher, holding the test's pipes (its output) open."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


# A command run as ``[*WITH_PARENT, *command]`` dies with the process that started it: a small
# interpreter sets the parent-death signal (kept across exec) and becomes the command. Not Popen's
# preexec_fn: that runs Python in the forked child of a worker whose other threads (JAX's) may hold its locks.
WITH_PARENT = [sys.executable, "-c", "import os, sys\nfrom shared_tests.sharding.parent import die_with_parent\n"
               "die_with_parent()\nos.execv(sys.argv[1], sys.argv[1:])"]  # fmt: skip
